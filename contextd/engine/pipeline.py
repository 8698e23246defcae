"""One render, start to finish (DESIGN section 4).

    edits in force (state) -> rules propose -> eligibility -> timing ->
    apply -> repair -> render -> count -> certificates and the new state

A pure function of its input: the same history, policy, state, request and
clock give the same view, byte for byte, and the same decisions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.codec import content_hash
from contextd.engine.eligibility import Protections, judge, protections
from contextd.engine.model import (
    Block,
    Item,
    Representation,
    Role,
    Session,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.placeholders import handle_of, placeholder_blocks, with_calls
from contextd.engine.policy import Policy, default_policy
from contextd.engine.repair import repair
from contextd.engine.rules import matches
from contextd.engine.state import AppliedEdit, ControlMode, PendingEdit, ViewState, first_divergence
from contextd.engine.timing import Costed, schedule
from contextd.engine.tokens import TokenCounter, block_tokens
from contextd.engine.transforms import (
    CacheState,
    Edit,
    Entry,
    Insert,
    PatchRequest,
    Proposal,
    Remove,
    Reorder,
    Replace,
    TransformContext,
    TransformRegistry,
    target_of,
)
from contextd.engine.view import View, ViewRequest, assemble_view

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{2,}")
MAX_FOCUS_TERMS = 32


@dataclass(frozen=True, slots=True)
class AgentProposal:
    """A prune the agent asked for (ProposePrune), waiting for a decision."""

    id: int
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class RenderInput:
    session: Session
    items: Sequence[Item]
    """The history up to `session.version`, in seq order."""
    policy: Policy
    request: ViewRequest
    counter: TokenCounter
    registry: TransformRegistry
    state: ViewState = field(default_factory=ViewState)
    now: float = 0.0
    """Seconds since the epoch, from the caller's clock (tests control it)."""
    pins: frozenset[int] = frozenset()
    agent_proposals: Sequence[AgentProposal] = ()
    force: bool = False
    """Operator mode: apply every eligible edit now, whatever the cache."""
    tools: tuple[Mapping[str, Any], ...] = ()
    durable: tuple[AppliedEdit, ...] = ()
    """Edits made durable in history mode (mutation events in the history): always in force."""


@dataclass(frozen=True, slots=True)
class RenderOutput:
    view: View
    certificates: tuple[CertificateBody, ...]
    """The decisions of this render, to be numbered, chained and stored."""
    state: ViewState
    decided_proposals: tuple[int, ...] = ()
    """Ids of agent proposals decided in this render (applied, kept or abstained)."""
    durable: tuple[AppliedEdit, ...] = field(default_factory=tuple)
    """Edits applied by rules in history mode: to be appended to the history as mutations."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    proposal: Proposal
    rule: str
    control: ControlMode
    agent_id: int | None = None
    pending: bool = False
    """Deferred in an earlier render (its DEFER is already certified)."""


def turn_indexes(items: Sequence[Item]) -> list[int]:
    """The turn of each item: a user item, or an assistant item with the tool results that follow it."""
    turns, current = [], -1
    for item in items:
        if item.role in (Role.USER, Role.ASSISTANT) or current < 0:
            current += 1
        turns.append(current)
    return turns


def focus_terms(items: Sequence[Item], given: Sequence[str]) -> tuple[str, ...]:
    """The request's focus, then identifiers from the latest user turn and the latest tool calls."""
    terms = list(dict.fromkeys(given))
    latest_user = next((i for i in reversed(items) if i.role is Role.USER), None)
    latest_calls = next((i for i in reversed(items) if i.role is Role.ASSISTANT and i.tool_uses), None)
    for item in (latest_user, latest_calls):
        if item is None:
            continue
        for block in item.content:
            text = (
                block.text
                if isinstance(block, TextBlock)
                else block.input_json
                if isinstance(block, ToolUseBlock)
                else ""
            )
            terms.extend(_IDENTIFIER.findall(text))
    return tuple(dict.fromkeys(terms))[:MAX_FOCUS_TERMS]


def _tokens(blocks: Iterable[Block], counter: TokenCounter) -> int:
    return sum(block_tokens(b, counter) for b in blocks)


class _View:
    """The entries of one render as edits are applied to them."""

    def __init__(self, items: Sequence[Item], pins: frozenset[int]) -> None:
        turns = turn_indexes(items)
        self.entries: dict[int, Entry] = {
            item.seq: Entry(item, item.content, Representation.FULL, item.token_count, turn, item.seq in pins)
            for item, turn in zip(items, turns, strict=True)
        }
        self.order: list[int] = [item.seq for item in items]
        self.patches: dict[str, Any] = {}

    def apply(self, applied: AppliedEdit) -> None:
        edit = applied.edit
        match edit:
            case Replace(seq):
                self._set(seq, applied.content, Representation.REDUCED, applied.tokens)
            case Remove(seq, placeholder):
                kind = Representation.PLACEHOLDER if placeholder else Representation.OMITTED
                self._set(seq, applied.content, kind, applied.tokens)
            case Insert(after_seq, content):
                seq = -(sum(1 for s in self.order if s < 0) + 1)
                turn = self.entries[after_seq].turn if after_seq in self.entries else 0
                item = Item(
                    role=content.role,
                    content=content.content,
                    seq=seq,
                    content_hash=content_hash(content),
                    token_count=applied.tokens,
                    created_at=next(iter(self.entries.values())).item.created_at,
                )
                self.entries[seq] = Entry(item, content.content, Representation.FULL, applied.tokens, turn)
                at = self.order.index(after_seq) + 1 if after_seq in self.order else 0
                self.order.insert(at, seq)
            case Reorder(order):
                inserted = [s for s in self.order if s < 0]
                self.order = [s for s in order if s in self.entries] + inserted
            case PatchRequest(name, value):
                self.patches[name] = value

    def _set(self, seq: int, content: tuple[Block, ...], kind: Representation, tokens: int) -> None:
        old = self.entries[seq]
        self.entries[seq] = Entry(old.item, content, kind, tokens, old.turn, old.pinned)

    def ordered(self) -> list[Entry]:
        return [self.entries[s] for s in self.order]


def new_representation(entry: Entry, edit: Edit, reason: str) -> tuple[Block, ...]:
    """The blocks an edit gives its target, normalized so pairs and signed reasoning survive."""
    item = entry.item
    if isinstance(edit, Remove):
        return placeholder_blocks(item, reason) if edit.placeholder else ()
    assert isinstance(edit, Replace)
    result = item.tool_result
    if result is not None:
        # A tool item stays one tool_result for its call, whatever the transform returned.
        parts = tuple(
            p
            for b in edit.content
            for p in (b.content if isinstance(b, ToolResultBlock) else (b,))
            if isinstance(p, TextBlock)
        )
        return (ToolResultBlock(result.tool_use_id, parts, result.is_error, result.name),)
    if item.role is Role.ASSISTANT and item.tool_uses:
        # The transform may rewrite the text; the calls, and the signed
        # reasoning that led to them, are the originals.
        texts = tuple(b for b in edit.content if isinstance(b, TextBlock))
        return with_calls(texts, item.content)
    return edit.content


def render(inp: RenderInput) -> RenderOutput:
    policy, counter, state = inp.policy, inp.counter, inp.state
    view = _View(inp.items, inp.pins)
    certificates: list[CertificateBody] = []
    decided = set(state.decided)

    # 1. Durable edits are part of the history; other edits in force stay in
    #    force, except on items pinned since.
    for applied in inp.durable:
        view.apply(applied)
    durable_targets = {target_of(a.edit) for a in inp.durable} - {None}
    in_force: list[AppliedEdit] = []
    for applied in state.applied:
        seq = target_of(applied.edit)
        if seq in durable_targets:
            continue
        if seq is not None and seq in inp.pins:
            certificates.append(
                _body(view.entries[seq], Decision.KEEP, applied.rule, applied.reason, "pinned: shown in full again")
            )
            decided.add(_key("KEEP", seq, applied.rule, applied.reason))  # the rule's next proposal is this one
            continue
        in_force.append(applied)
        view.apply(applied)
    taken = ({target_of(a.edit) for a in in_force} - {None}) | durable_targets

    context = TransformContext(
        entries=tuple(view.ordered()),
        budget_tokens=inp.request.budget_tokens,
        view_tokens=sum(e.tokens for e in view.entries.values()),
        cache=CacheState(
            previous_tokens=state.total_tokens,
            age_seconds=None if state.rendered_at is None else inp.now - state.rendered_at,
            ttl_seconds=policy.cache.prices.ttl_seconds,
        ),
        focus=focus_terms(inp.items, inp.request.focus),
        tools=inp.tools,
        tool_effects=policy.tools,
    )

    # 2. Proposals: deferred ones first, then the agent's, then each rule's in policy order.
    candidates = _candidates(inp, context, taken)
    decided_proposals: list[int] = []

    # 3. Eligibility.
    protected = Protections(context.entries, policy)
    eligible: list[tuple[_Candidate, tuple[Block, ...], int]] = []
    still_pending: list[PendingEdit] = []
    for candidate in candidates:
        proposal = candidate.proposal
        seq = target_of(proposal.edit)
        verdict = judge(proposal, candidate.control, view.entries, protected, policy)
        content: tuple[Block, ...] = ()
        tokens = 0
        if verdict.eligible:
            content = _content_of(proposal.edit, view.entries, proposal.reason)
            tokens = _tokens(content, counter)
            if seq is not None and tokens >= view.entries[seq].tokens and isinstance(proposal.edit, Replace):
                verdict = replace(verdict, eligible=False, decision="ABSTAIN", why="the replacement is not smaller")
        if candidate.agent_id is not None and not verdict.eligible:
            decided_proposals.append(candidate.agent_id)
        if not verdict.eligible:
            key = _key(verdict.decision, seq, candidate.rule, proposal.reason)
            if key not in decided:
                decided.add(key)
                entry = view.entries.get(seq) if seq is not None else None
                certificates.append(
                    _body(
                        entry,
                        Decision(verdict.decision.lower()),
                        candidate.rule,
                        proposal.reason,
                        verdict.why,
                        proposal=proposal,
                        control=candidate.control,
                        protection=verdict.protection,
                    )
                )
            continue
        eligible.append((candidate, content, tokens))

    # 4. Timing against the cache.
    offsets, previous_total = state.offsets(), state.total_tokens
    costed = [
        Costed(
            position=_position(c.proposal.edit, offsets, previous_total),
            saving=(view.entries[s].tokens - tokens) if (s := target_of(c.proposal.edit)) is not None else -tokens,
        )
        for c, _, tokens in eligible
    ]
    utilization = context.utilization
    timings = schedule(costed, context.cache, policy.cache, utilization, force=inp.force)
    durable: list[AppliedEdit] = []
    for (candidate, content, tokens), cost, timing in zip(eligible, costed, timings, strict=True):
        proposal = candidate.proposal
        seq = target_of(proposal.edit)
        entry = view.entries.get(seq) if seq is not None else None
        if not timing.apply:
            if not candidate.pending:
                certificates.append(
                    _body(
                        entry,
                        Decision.DEFER,
                        candidate.rule,
                        proposal.reason,
                        timing.why,
                        proposal=proposal,
                        control=candidate.control,
                        new_tokens=tokens,
                        position=cost.position,
                        radius=timing.radius,
                        value=timing.value,
                    )
                )
            still_pending.append(PendingEdit(proposal, candidate.rule, candidate.control, state.view_version + 1))
            if candidate.agent_id is not None:
                decided_proposals.append(candidate.agent_id)  # it waits in this view's state from now on
            continue
        applied = AppliedEdit(proposal.edit, candidate.rule, proposal.reason, content, tokens)
        in_force.append(applied)
        view.apply(applied)
        if candidate.agent_id is not None:
            decided_proposals.append(candidate.agent_id)
        if candidate.rule in {r.name for r in policy.rules if r.history}:
            durable.append(applied)
        certificates.append(
            _body(
                entry,
                Decision.PRUNE if seq is not None else Decision.APPLY,
                candidate.rule,
                proposal.reason,
                timing.why,
                proposal=proposal,
                control=ControlMode.OPERATOR if inp.force else candidate.control,
                new_tokens=tokens,
                position=cost.position,
                radius=timing.radius,
                value=timing.value,
            )
        )

    # 5. Repair, then render and count.
    ordered, repair_warnings = repair(view.ordered(), counter)
    view_out, segments = assemble_view(inp.session, ordered, inp.request, counter, repair_warnings, view.patches)
    stable = first_divergence(state.segments, segments) if state.segments else 0
    new_state = ViewState(
        view_version=state.view_version + 1,
        rendered_at=inp.now,
        segments=segments,
        applied=tuple(in_force),
        pending=tuple(still_pending),
        decided=frozenset(decided),
    )
    view_out = replace(
        view_out, view_version=new_state.view_version, stable_prefix_tokens=stable, policy_version=policy.version
    )
    return RenderOutput(view_out, tuple(certificates), new_state, tuple(decided_proposals), tuple(durable))


def _key(decision: str, seq: int | None, rule: str, reason: str) -> str:
    """Identifies a KEEP or ABSTAIN decision, so a rule proposing it on every render is certified once."""
    return f"{decision}:{seq}:{rule}:{reason}"


def _candidates(inp: RenderInput, context: TransformContext, taken: set[int | None]) -> list[_Candidate]:
    out: list[_Candidate] = [_Candidate(p.proposal, p.rule, p.control, pending=True) for p in inp.state.pending]
    for proposal in inp.agent_proposals:
        out.append(
            _Candidate(
                Proposal(
                    Remove(proposal.seq), level=3, reason="agent", evidence=proposal.reason or "asked by the agent"
                ),
                "agent",
                ControlMode.AGENT,
                agent_id=proposal.id,
            )
        )
    open_entries = [e for e in context.entries if e.seq not in taken]
    for rule in inp.policy.rules:
        transform = inp.registry.get(rule.transform)
        picked = [e for e in open_entries if matches(rule.when, e, context)]
        out.extend(_Candidate(p, rule.name, ControlMode.RULE) for p in transform.propose(context, picked, rule.params))
    # One decision per item: the first proposal for it wins (policy order).
    seen: set[int] = set()
    kept: list[_Candidate] = []
    for candidate in out:
        seq = target_of(candidate.proposal.edit)
        if seq is not None:
            if seq in seen or seq in taken:
                continue
            seen.add(seq)
        kept.append(candidate)
    return kept


def _content_of(edit: Edit, entries: Mapping[int, Entry], reason: str) -> tuple[Block, ...]:
    seq = target_of(edit)
    if seq is not None:
        return new_representation(entries[seq], edit, reason)
    if isinstance(edit, Insert):
        return edit.content.content
    return ()


def _position(edit: Edit, offsets: Mapping[int, int], previous_total: int) -> int:
    """Where an edit changes the previous render, in tokens from its start."""
    match edit:
        case Replace(seq) | Remove(seq):
            return offsets.get(seq, previous_total)
        case Insert(after_seq):
            later = [o for s, o in offsets.items() if s > after_seq]
            return min(later, default=previous_total)
        case Reorder(order):
            moved = [offsets[s] for s, o in zip(order, sorted(order), strict=False) if s != o and s in offsets]
            return min(moved, default=previous_total)
    return previous_total  # a request patch changes no prompt bytes


def _body(
    entry: Entry | None,
    decision: Decision,
    rule: str,
    reason: str,
    why: str,
    *,
    proposal: Proposal | None = None,
    control: ControlMode = ControlMode.RULE,
    protection: str = "",
    new_tokens: int = 0,
    position: int = 0,
    radius: int = 0,
    value: float = 0.0,
) -> CertificateBody:
    removes = decision in (Decision.PRUNE, Decision.DEFER) and entry is not None
    placeholder = isinstance(proposal.edit, Remove) and proposal.edit.placeholder if proposal else False
    return CertificateBody(
        seq=entry.seq if entry is not None else 0,
        decision=decision,
        level=proposal.level if proposal else 0,
        rule=rule,
        reason=reason,
        evidence=proposal.evidence if proposal else "",
        rationale=why,
        handle=handle_of(entry.item) if removes and entry is not None else "",
        protection=protection,
        tokens_removed=entry.tokens if removes and entry is not None else 0,
        placeholder_tokens=new_tokens if removes and placeholder else 0,
        first_divergence_tokens=position,
        mutation_radius_tokens=radius,
        cost_effect=round(value, 9),
        control=control,
    )


def protection_map(items: Sequence[Item], policy: Policy, pins: frozenset[int]) -> dict[int, str]:
    """seq -> why it is protected, for the protected items of a history."""
    return protections(_View(items, pins).ordered(), policy)


def identity_view(session: Session, items: Sequence[Item], request: ViewRequest, counter: TokenCounter) -> View:
    """The view with no rules and no previous render: every item in full."""
    return render(RenderInput(session, items, default_policy(), request, counter, TransformRegistry())).view
