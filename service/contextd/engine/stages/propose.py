"""Propose (DESIGN section 4): the candidate edits of one render, in the order they are
judged: the edits deferred earlier, then the agent's prunes (ProposePrune), then each
rule's proposals in policy order. A rule's `when` picks the entries its transform sees;
an entry an edit in force holds (but for a compression) is not proposed for again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.compress.strategy import Compress
from contextd.engine.compress.text import MAX_FOCUS_TERMS, identifiers
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, Role
from contextd.engine.policy import Policy
from contextd.engine.rules import changes_with_time, holds_for, holds_now
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import Draft, Slot, reordered
from contextd.engine.stages.load import Loaded
from contextd.engine.state import ControlMode, PendingEdit
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import CacheState, Entry, Proposal, Remove, Reorder, TransformContext, target_of
from contextd.engine.view import ViewRequest

AGENT_LEVEL = 3
"""The agent asking to prune an item is a claim of completed work (DESIGN section 5)."""


@dataclass(frozen=True, slots=True)
class AgentProposal:
    """A prune the agent asked for (ProposePrune), waiting for a decision."""

    id: int
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Candidate:
    proposal: Proposal
    rule: str
    control: ControlMode
    pending: bool = False
    """Deferred in an earlier render (its DEFER is already certified)."""


Pools = tuple[tuple[Entry, ...], ...]
"""Per rule, in policy order: the open entries its conditions on the entry alone hold for."""


@dataclass(frozen=True, slots=True)
class Pooled:
    """The pools of a render, for the next to start from when only items were appended since."""

    pools: Pools
    items: int
    """How many of the history's items they were matched over (those after are matched afresh)."""


@dataclass(frozen=True, slots=True)
class Proposed:
    candidates: tuple[Candidate, ...]
    """Deferred edits, the agent's, then the rules' in policy order."""
    pools: Pools
    """Each rule's pool, in view order: what the next render may start from."""
    certificates: tuple[CertificateBody, ...]
    """ABSTAIN for each deferred edit whose rule the policy no longer has."""


def focus_terms(latest: Iterable[Item | None], given: Sequence[str]) -> tuple[str, ...]:
    """The request's focus, then the identifiers of the `latest` items (the latest tool calls
    and the latest user turn), the newer first: the work at hand, so that a long task
    statement cannot crowd out the agent's latest calls, nor those a new request."""
    terms = list(dict.fromkeys(given))
    for item in sorted((i for i in latest if i is not None), key=lambda i: i.seq, reverse=True):
        terms.extend(_identifiers_of(item))
    return tuple(dict.fromkeys(terms))[:MAX_FOCUS_TERMS]


def _identifiers_of(item: Item) -> tuple[str, ...]:
    return _identifiers.get((item,), lambda: identifiers(item.written()))


_identifiers: IdentityMemo[tuple[str, ...]] = IdentityMemo(1_000)
"""Per item, its identifiers: the latest user turn and calls stay the latest for many renders."""


def transform_context(
    draft: Draft, request: ViewRequest, cache: CacheState, tools: tuple[Mapping[str, Any], ...], policy: Policy
) -> TransformContext:
    """What every transform sees: the view as the edits in force show it."""
    return TransformContext(
        entries=tuple(draft.ordered()),
        budget_tokens=request.budget_tokens,
        view_tokens=draft.view_tokens,
        cache=cache,
        focus=focus_terms((draft.latest_calls, draft.latest_user), request.focus),
        requested_focus=tuple(request.focus),
        tools=tools,
        tool_effects=policy.tools,
        turns=draft.turns,
        observations=draft.observations,
        by_seq=draft.entries,
    )


def propose(
    loaded: Loaded,
    context: TransformContext,
    policy: Policy,
    registry: TransformRegistry,
    pending: Sequence[PendingEdit],
    agent_proposals: Sequence[AgentProposal],
    pooled: Pooled | None = None,
) -> Proposed:
    """The candidates, and each rule's pool (`pooled`: those of the render this one follows)."""
    draft = loaded.draft
    carried = None if pooled is None else (pooled.pools, [draft.entries[s] for s in draft.natural[pooled.items :]])
    proposed, matched = _proposed(policy, registry, context, loaded.taken - loaded.compressed, carried)
    waiting, certificates = _waiting(draft, policy, pending, agent_proposals)
    return Proposed((*waiting, *proposed), matched, certificates)


def _waiting(
    draft: Draft, policy: Policy, pending: Sequence[PendingEdit], agent_proposals: Sequence[AgentProposal]
) -> tuple[list[Candidate], tuple[CertificateBody, ...]]:
    """Deferred edits, then the agent's proposals: they go before the rules' new proposals."""
    rules = {r.name for r in policy.rules}
    out: list[Candidate] = []
    certificates: list[CertificateBody] = []
    for p in pending:
        if isinstance(p.proposal.edit, Reorder):
            # Items appended since it was proposed follow it, as they would once it applies.
            p = replace(p, proposal=replace(p.proposal, edit=Reorder(tuple(reordered(p.proposal.edit, draft.natural)))))
        if p.control is ControlMode.RULE and p.rule not in rules:
            seq = target_of(p.proposal.edit)
            entry = draft.entries.get(seq) if seq is not None else None
            why = f"dropped: its rule is not in the session's policy (version {policy.version}) any more"
            certificates.append(
                certificate(entry, Decision.ABSTAIN, p.rule, p.proposal.reason, why, proposal=p.proposal)
            )
            continue
        out.append(Candidate(p.proposal, p.rule, p.control, pending=True))
    for proposal in agent_proposals:
        evidence = proposal.reason or "asked by the agent"
        out.append(
            Candidate(
                Proposal(Remove(proposal.seq), level=AGENT_LEVEL, reason="agent", evidence=evidence),
                "agent",
                ControlMode.AGENT,
            )
        )
    return out, tuple(certificates)


def _proposed(
    policy: Policy,
    registry: TransformRegistry,
    context: TransformContext,
    taken: frozenset[Slot],
    carried: tuple[Pools, Sequence[Entry]] | None,
) -> tuple[list[Candidate], Pools]:
    """Each rule's proposals, in policy order, and each rule's pool: the open entries its
    conditions on the entry alone hold for, in view order (`carried`: the pools of the
    render this one follows, and the entries appended since)."""
    out: list[Candidate] = []
    pools: list[tuple[Entry, ...]] = []
    # With pools carried, only the items appended since are matched afresh.
    open_entries = [e for e in context.entries if e.seq > 0 and e.seq not in taken] if carried is None else carried[1]
    by_role: dict[Role, list[Entry]] = {}  # in view order: most rules name one role
    for e in open_entries:
        by_role.setdefault(e.role, []).append(e)
    for index, rule in enumerate(policy.rules):
        transform = registry.get(rule.transform)
        when, roles = rule.when, rule.when.roles
        pool = by_role.get(next(iter(roles)), []) if roles is not None and len(roles) == 1 else open_entries
        matched = [e for e in pool if holds_for(when, e)]
        if carried is not None:
            matched = [e for e in carried[0][index] if e.seq not in taken] + matched
        pools.append(tuple(matched))
        picked = [e for e in matched if holds_now(when, e, context)] if changes_with_time(when) else matched
        proposals: Iterable[Proposal] = transform.propose(context, picked, rule.params)
        if not isinstance(transform, Compress):
            # Only the built-in compressors' claim is taken: another transform saying
            # `compression` is held to the ladder like any edit.
            proposals = (replace(p, compression=False) if p.compression else p for p in proposals)
        out.extend(Candidate(p, rule.name, ControlMode.RULE) for p in proposals)
    return out, tuple(pools)
