"""Propose (DESIGN section 4): the candidate edits of one render, in the order they are
judged: the edits deferred earlier, then the agent's prunes (ProposePrune), then each rule's
proposals in policy order (the rules' edits of the latest turn's outputs that apply on entry
first, while a rewrite of the cached prompt costs something). A rule's `when` picks the
entries its transform sees;
an entry an edit in force holds (but for a compression) is not proposed for again. A render
that follows another asks each rule only about what that one did not settle (ledger.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from contextd.engine.asked import ranges_read, searched_terms
from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.compress.strategy import COMPRESSED, Compress
from contextd.engine.compress.text import MAX_FOCUS_TERMS, identifiers
from contextd.engine.memo import IdentityMemo, take_over
from contextd.engine.model import Item, Role
from contextd.engine.policy import Policy
from contextd.engine.rules import holds_for
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import Draft, reordered
from contextd.engine.stages.ledger import (
    Ledger,
    Ledgers,
    in_order,
    pick,
    reads_focus_terms,
    recorded,
    refreshed,
    to_ask,
    touched,
)
from contextd.engine.stages.load import Loaded
from contextd.engine.state import ControlMode, PendingEdit, Slot
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import (
    CacheState,
    Entry,
    FocusChange,
    Proposal,
    Remove,
    Reorder,
    Transform,
    TransformContext,
    target_of,
)
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


@dataclass(frozen=True, slots=True)
class Proposed:
    candidates: tuple[Candidate, ...]
    """Deferred edits, the agent's, then the rules' in policy order (`_entering_first`)."""
    ledgers: Ledgers
    """What each rule did: what the next render from this one's state may start from."""
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
        entries=draft.ordered(),
        budget_tokens=request.budget_tokens,
        view_tokens=draft.view_tokens,
        cache=cache,
        focus=focus_terms((draft.latest_calls, draft.latest_user), request.focus),
        requested_focus=tuple(request.focus),
        searched=searched_terms(draft.recent_calls, policy.tools),
        read_again=ranges_read(draft.recent_calls, draft.observations.answer),
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
    ledgers: Ledgers | None = None,
) -> Proposed:
    """The candidates, and what each rule did (`ledgers`: the rules' work in the render this one
    follows, when nothing is reordered: stages/ledger.py)."""
    draft = loaded.draft
    if draft.reordered:
        ledgers = None  # the pools are in view order, which is not the items' order
    elif ledgers is not None and not take_over(ledgers.claim):
        ledgers = None  # another render from the same carry updated them in place
    # What the edits in force hold but for a compression's slot (which an edit may take over).
    taken, compressed = loaded.taken, loaded.compressed
    if ledgers is None:
        proposed, done = _proposed(policy, registry, context, frozenset(taken - compressed))
    else:
        new = [draft.entries[s] for s in draft.natural[ledgers.items :]]
        changed = [draft.entries[s] for s in sorted(ledgers.changed) if s in draft.entries]
        held = frozenset(e.seq for e in (*changed, *new) if e.seq in taken and e.seq not in compressed)
        latest = []
        natural = draft.natural
        for at in range(ledgers.items - 1, -1, -1):  # (no copy of the order, as long as the session)
            seq = natural[at]
            if draft.entries[seq].turn < ledgers.turns - 1:
                break
            latest.append(seq)
        proposed, done = _proposed_since(policy, registry, context, held, ledgers, new, changed, latest)
    waiting, certificates = _waiting(draft, policy, pending, agent_proposals)
    focus = (context.requested_focus, context.searched, context.focus, context.read_again)
    made = Ledgers(tuple(done), len(draft.natural), focus, len(context.observations.completions), context.turns)
    prices = policy.cache.prices
    if not context.cache.cold and prices.cache_write > prices.cache_read:  # a rewrite costs
        proposed = _entering_first(proposed, draft, context.turns)
    return Proposed((*waiting, *proposed), made, certificates)


def _entering_first(candidates: Sequence[Candidate], draft: Draft, turns: int) -> list[Candidate]:
    """The rules' edits of the latest turn's outputs that may apply on entry (`Proposal.on_entry`),
    before the rules' others, each group in policy order; for a render whose rewrites of the
    cached prompt cost something (the cache warm, writes dearer than reads). Such an edit costs
    the cache nothing: the output is in no cache yet. Judged after the others, it would lose to
    any that rests on the output as its evidence (a supersede of the part of a file an earlier
    read showed, by a read of the whole file), and that one, a rewrite of what the cache holds,
    mostly waits: then neither applies, and the output is written to the cache whole. Judged
    first, it applies; the other abstains, its evidence no longer shown whole, and what it would
    have removed stays. Where a rewrite costs nothing, the other applies as well: the policy's
    order stands."""
    entering: list[Candidate] = []
    others: list[Candidate] = []
    for candidate in candidates:
        seq = target_of(candidate.proposal.edit) if candidate.proposal.on_entry else None
        entry = draft.entries.get(seq) if seq is not None else None
        (entering if entry is not None and turns - 1 - entry.turn <= 0 else others).append(candidate)
    return [*entering, *others] if entering else list(candidates)


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
    policy: Policy, registry: TransformRegistry, context: TransformContext, taken: frozenset[Slot]
) -> tuple[list[Candidate], list[Ledger]]:
    """Each rule's proposals, in policy order, over every open entry its conditions hold for."""
    out: list[Candidate] = []
    ledgers: list[Ledger] = []
    open_entries = [e for e in context.entries if e.seq > 0 and e.seq not in taken]
    by_role: dict[Role, list[Entry]] = {}  # in view order: most rules name one role
    for e in open_entries:
        by_role.setdefault(e.role, []).append(e)
    for rule in policy.rules:
        transform = registry.get(rule.transform)
        when, roles = rule.when, rule.when.roles
        pool = by_role.get(next(iter(roles)), []) if roles is not None and len(roles) == 1 else open_entries
        matched = [e for e in pool if holds_for(when, e)]
        picked, waiting = pick(when, matched, context)
        proposals = _proposals(transform, context, picked, rule.params)
        out.extend(Candidate(p, rule.name, ControlMode.RULE) for p in proposals)
        ledgers.append(
            recorded(transform, context, rule.params, {e.seq: e for e in matched}, picked, waiting, proposals)
        )
    return out, ledgers


def _proposed_since(
    policy: Policy,
    registry: TransformRegistry,
    context: TransformContext,
    taken: frozenset[Slot],
    ledgers: Ledgers,
    new: Sequence[Entry],
    changed: Sequence[Entry],
    latest: Sequence[int],
) -> tuple[list[Candidate], list[Ledger]]:
    """The same proposals as `_proposed`, each rule asked again only about what the render
    its ledger is of did not settle (stages/ledger.py); `latest`: the seqs of that render's
    latest turn (a proposal may rest on being of it)."""
    out: list[Candidate] = []
    done: list[Ledger] = []
    keys = touched(context, ledgers, new, changed)
    change = next((k for k in keys if isinstance(k, FocusChange)), None)
    for rule, ledger in zip(policy.rules, ledgers.rules, strict=True):
        transform = registry.get(rule.transform)
        pool, fresh = refreshed(ledger, rule.when, (*changed, *new), taken)
        concerned = None
        if change is not None and reads_focus_terms(transform):
            concerned = transform.concerned(context, change)
        candidates, kept = to_ask(ledger, pool, (*fresh, *latest), keys, concerned)
        if kept:
            candidates = sorted((*candidates, *(pool[s] for s in kept)), key=attrgetter("seq"))
        picked, waiting = pick(rule.when, candidates, context)
        asked = [e for e in picked if e.seq not in kept] if kept else picked
        made = _proposals(transform, context, asked, rule.params)
        proposals = in_order(picked, made, kept) if kept else made
        if proposals is None:  # a proposal about another entry than the one asked about: all asked
            asked = picked
            proposals = _proposals(transform, context, picked, rule.params)
        out.extend(Candidate(p, rule.name, ControlMode.RULE) for p in proposals)
        done.append(recorded(transform, context, rule.params, pool, asked, waiting, proposals, ledger, keys))
    return out, done


def _proposals(
    transform: Transform, context: TransformContext, picked: Sequence[Entry], params: Mapping[str, Any]
) -> list[Proposal]:
    proposals = list(transform.propose(context, picked, params))
    if isinstance(transform, Compress):
        return proposals
    # Only the built-in compressors' claim is taken: another transform saying `compression`
    # is held to the ladder like any edit, and one giving their reason code abstains (the code
    # marks an edit in force as a compression, whose slot the budget may take over:
    # stages/draft.py, `is_compression`).
    return [_held_to_the_ladder(p) for p in proposals]


def _held_to_the_ladder(proposal: Proposal) -> Proposal:
    if proposal.reason.startswith(COMPRESSED):
        return replace(proposal, compression=False, abstain=True, evidence=RESERVED_REASON)
    return replace(proposal, compression=False) if proposal.compression else proposal


RESERVED_REASON = f"reason codes starting with {COMPRESSED!r} are the built-in compressors' own"
"""Why a proposal of another transform giving one abstains."""
