"""One render, start to finish (DESIGN section 4).

    edits in force (state) -> rules propose -> eligibility -> timing ->
    apply -> repair -> render -> count -> certificates and the new state

A pure function of its input: the same history, policy, state, request and
clock give the same view, byte for byte, and the same decisions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from itertools import takewhile
from operator import attrgetter, is_
from typing import Any

from contextd.engine import volatile
from contextd.engine.breakpoint import Breakpoint, place
from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.codec import content_hash
from contextd.engine.compress.text import MAX_FOCUS_TERMS, identifiers
from contextd.engine.eligibility import Judge, Protections
from contextd.engine.memo import IdentityMemo
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
from contextd.engine.observations import ObservationIndex
from contextd.engine.placeholders import handle_of, placeholder_blocks, with_calls
from contextd.engine.policy import BREAKPOINTS, CachePolicy, Policy, ToolDeclaration, default_policy
from contextd.engine.render.anthropic import mark_breakpoint
from contextd.engine.render.base import ViewWarning
from contextd.engine.repair import RepairRun, repair
from contextd.engine.rules import changes_with_time, holds_for, holds_now
from contextd.engine.state import (
    AppliedEdit,
    ControlMode,
    PendingEdit,
    PreviousRender,
    ViewState,
    edit_key,
    first_divergence,
)
from contextd.engine.strategies import COMPRESSED, Compress
from contextd.engine.timing import (
    NO_USAGE,
    Costed,
    Usage,
    cache_state,
    ends_after,
    predicted_usage,
    schedule,
    value_now,
)
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
from contextd.engine.view import (
    FRAMING_TOKENS_PER_MESSAGE,
    REPLY_PRIMING_TOKENS,
    Assembly,
    View,
    ViewFormat,
    ViewRequest,
    assemble_view,
)

AGENT_LEVEL = 3
"""The agent asking to prune an item is a claim of completed work (DESIGN section 5)."""
_INSERTED_AT = datetime(1970, 1, 1, tzinfo=UTC)  # content a transform inserted has no time of its own
NOT_SMALLER = "what would replace it is not smaller"
"""Why an edit that would not shrink its item is refused (ABSTAIN): no gain, not a doubt about safety."""


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
    carry: Carry | None = field(default=None, compare=False)
    """`RenderOutput.carry` of the render that produced `state`, when the caller kept it:
    the same output, sooner."""


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
    carry: Carry | None = field(default=None, compare=False)
    """For the next render from `state` (see RenderInput.carry)."""
    predicted: Usage = NO_USAGE
    """How the provider is expected to bill the call made with this view (its policy's provider)."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    proposal: Proposal
    rule: str
    control: ControlMode
    pending: bool = False
    """Deferred in an earlier render (its DEFER is already certified)."""


Pools = tuple[tuple[Entry, ...], ...]
"""Per rule, in policy order: the open entries its conditions on the entry alone hold for."""


@dataclass(frozen=True, slots=True, eq=False)
class Carry:
    """What a render worked out that the next render from its state can start from,
    in the same process (never stored). With it, a render after appends touches the
    items appended since and the edits it makes, not the whole history; its output
    is the same as without it."""

    state: ViewState
    """The state the render produced: the carry serves renders from this state only."""
    items: tuple[Item, ...]
    pins: frozenset[int]
    durable: tuple[AppliedEdit, ...]
    draft: _Draft
    """The render's entries with every edit in force applied."""
    taken: frozenset[Slot]
    """The slots of the edits in force."""
    relied: Mapping[int, int]
    """What the edits in force rest on: evidence seq -> the seq whose reduction rests on it."""
    pools: Pools | None
    """None when the render reordered the view (pools are in view order) or compressed an
    entry (what rules match on an entry depends on how it is shown)."""
    repaired: RepairRun
    assembly: Assembly
    """The view as rendered, for the next render in the same format to resume."""

    def footprint(self) -> int:
        """About how many bytes it holds: the entries and what is derived from them
        (~320 per item, measured), and the serialized messages of the view."""
        return 320 * len(self.items) + sum(map(len, self.assembly.rendered.messages_json))

    def follows(self, inp: RenderInput) -> bool:
        """Whether `inp` differs from the input that made this carry only by items appended."""
        return (
            self.state is inp.state
            and inp.policy.version == inp.state.policy_version
            and self.pins == inp.pins
            and self.durable == inp.durable
            and len(inp.items) >= len(self.items)
            and all(map(is_, self.items, inp.items))
        )


def turn_indexes(items: Sequence[Item]) -> list[int]:
    """The turn of each item: a user item, or an assistant item with the tool results that follow it."""
    turns, current = [], -1
    for item in items:
        if item.role in (Role.USER, Role.ASSISTANT) or current < 0:
            current += 1
        turns.append(current)
    return turns


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


def _tokens(blocks: Iterable[Block], counter: TokenCounter) -> int:
    return sum(block_tokens(b, counter) for b in blocks)


class _Draft:
    """The entries of one render as edits are applied to them."""

    def __init__(self, items: Sequence[Item], pins: frozenset[int], tools: Mapping[str, ToolDeclaration]) -> None:
        turns = turn_indexes(items)
        self.entries: dict[int, Entry] = {
            item.seq: Entry(item, item.content, Representation.FULL, item.token_count, turn, item.seq in pins)
            for item, turn in zip(items, turns, strict=True)
        }
        self.natural: tuple[int, ...] = tuple(item.seq for item in items)
        self.turns = turns[-1] + 1 if turns else 0
        self.order: list[int] = list(self.natural)
        """History items in the order shown."""
        self.inserted: list[tuple[int, int]] = []
        """(after_seq, seq) of inserted entries, in the order they were inserted."""
        self.patches: dict[str, Any] = {}
        self.view_tokens = sum(item.token_count for item in items)
        """Tokens of the entries shown (kept as edits are applied)."""
        self.latest_results: dict[str, int] = {}
        """tool name -> seq of its latest result."""
        self.latest_user: Item | None = None
        self.latest_calls: Item | None = None
        """The latest assistant item that called tools."""
        self.observations = ObservationIndex(tools)
        self._note(items)
        self._ordered: list[Entry] | None = None

    def _note(self, items: Iterable[Item]) -> None:
        """Keep the latest result of each tool, the latest user item and the latest calls."""
        self.observations.extend(items)
        for item in items:
            if item.role is Role.TOOL:
                result = item.tool_result
                if result is not None:
                    self.latest_results[result.name] = item.seq
            elif item.role is Role.USER:
                self.latest_user = item
            elif item.role is Role.ASSISTANT and item.tool_uses:
                self.latest_calls = item

    def following(self, items: Sequence[Item], pins: frozenset[int]) -> _Draft:
        """A copy of this (finished) draft with the items appended since: what building a
        draft from `items` and applying this one's edits in the same order would give."""
        draft = object.__new__(type(self))
        draft.entries = dict(self.entries)
        draft.inserted = list(self.inserted)
        draft.patches = dict(self.patches)
        draft.view_tokens = self.view_tokens
        draft.latest_results = dict(self.latest_results)
        draft.latest_user, draft.latest_calls = self.latest_user, self.latest_calls
        draft.observations = self.observations.copy()
        new = items[len(self.natural) :]
        turn = self.turns - 1
        for item in new:
            if item.role in (Role.USER, Role.ASSISTANT) or turn < 0:
                turn += 1
            draft.entries[item.seq] = Entry(
                item, item.content, Representation.FULL, item.token_count, turn, item.seq in pins
            )
            draft.view_tokens += item.token_count
        seqs = [item.seq for item in new]
        draft.natural = (*self.natural, *seqs)
        draft.turns = turn + 1
        draft.order = [*self.order, *seqs]  # appended items follow, whatever order is in force
        draft._note(new)
        draft._ordered = [*self.ordered(), *(draft.entries[s] for s in seqs)]  # nothing is inserted after them
        return draft

    def apply(self, applied: AppliedEdit) -> None:
        self._ordered = None
        edit = applied.edit
        match edit:
            case Replace(seq):
                self._set(seq, applied.content, Representation.REDUCED, applied.tokens)
            case Remove(seq, placeholder):
                kind = Representation.PLACEHOLDER if placeholder else Representation.OMITTED
                self._set(seq, applied.content, kind, applied.tokens)
            case Insert(after_seq, content):
                seq = -(len(self.inserted) + 1)
                anchor = self.entries.get(after_seq)
                item = Item(
                    role=content.role,
                    content=content.content,
                    seq=seq,
                    content_hash=content_hash(content),
                    token_count=applied.tokens,
                    created_at=_INSERTED_AT,
                )
                self.entries[seq] = Entry(
                    item, content.content, Representation.FULL, applied.tokens, anchor.turn if anchor else 0
                )
                self.inserted.append((after_seq, seq))
                self.view_tokens += applied.tokens
            case Reorder():
                self.order = _reordered(edit, self.order)
            case PatchRequest(name, value):
                self.patches[name] = value

    def _set(self, seq: int, content: tuple[Block, ...], kind: Representation, tokens: int) -> None:
        old = self.entries[seq]
        self.entries[seq] = Entry(old.item, content, kind, tokens, old.turn, old.pinned)
        self.view_tokens += _shown_tokens(kind, tokens) - _shown_tokens(old.representation, old.tokens)

    def ordered(self) -> list[Entry]:
        """The entries in view order (the same list until an edit is applied: not to be changed)."""
        if self._ordered is None:
            self._ordered = self._in_view_order()
        return self._ordered

    def _in_view_order(self) -> list[Entry]:
        entries = self.entries
        if not self.inserted:
            return [entries[s] for s in self.order]
        after: dict[int, list[int]] = {}
        for anchor, seq in self.inserted:
            after.setdefault(anchor, []).append(seq)
        out = []
        for s in self.order:
            out.append(entries[s])
            out.extend(entries[i] for i in after.get(s, ()))
        return out


def _shown_tokens(kind: Representation, tokens: int) -> int:
    return 0 if kind is Representation.OMITTED else tokens


def new_representation(entry: Entry, edit: Edit, reason: str) -> tuple[Block, ...]:
    """The blocks an edit gives its target, normalized so pairs and signed reasoning survive."""
    item = entry.item
    if isinstance(edit, Remove):
        return placeholder_blocks(item, reason, edit.note) if edit.placeholder else ()
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
        # The transform may rewrite the text, and stand in for the calls' inputs (the same
        # calls, checked by eligibility); the calls, and the signed reasoning that led to
        # them, are otherwise the originals.
        texts = tuple(b for b in edit.content if isinstance(b, TextBlock))
        calls = tuple(b for b in edit.content if isinstance(b, ToolUseBlock))
        return with_calls(texts, item.content, calls)
    return edit.content


def _normalized(edit: Edit, entries: Mapping[int, Entry]) -> Edit:
    """A removal that must leave something behind says so: a tool call and its result
    always go as a pair of placeholders (repair would put one back anyway)."""
    if isinstance(edit, Remove) and not edit.placeholder and edit.seq in entries:
        item = entries[edit.seq].item
        if item.role is Role.TOOL or item.tool_uses:
            return Remove(edit.seq, True, edit.note)
    return edit


Slot = int | str
"""What an edit occupies: an item (its seq), or a string naming something else."""


def slot_of(edit: Edit) -> Slot:
    """At most one edit per item, one reorder, one patch per request field; inserts are
    told apart by what they insert."""
    match edit:
        case Replace(seq) | Remove(seq):
            return seq
        case Reorder():
            return "reorder"
        case PatchRequest(name):
            return f"patch:{name}"
    return edit_key(edit)


class _Log:
    """The certificates of one render, and the KEEP and ABSTAIN decisions certified so far."""

    def __init__(self, decided: frozenset[str]) -> None:
        self.certificates: list[CertificateBody] = []
        self.decided = set(decided)

    def add(self, body: CertificateBody) -> None:
        self.certificates.append(body)

    def once(self, edit: Edit | None, rule: str, reason: str, body: CertificateBody) -> None:
        """Certify a refusal the first time it is made (a rule proposes the same thing on every render)."""
        key = _decided_key(body.decision.value, edit, rule, reason)
        if key not in self.decided:
            self.decided.add(key)
            self.certificates.append(body)

    def mark(self, decision: Decision, edit: Edit, rule: str, reason: str) -> None:
        """Count a refusal as certified already (its certificate was written another way)."""
        self.decided.add(_decided_key(decision.value, edit, rule, reason))


def _decided_key(decision: str, edit: Edit | None, rule: str, reason: str) -> str:
    slot = slot_of(edit) if edit is not None else ""
    return f"{decision}:{f'item:{slot}' if isinstance(slot, int) else slot}:{rule}:{reason}"


@dataclass(slots=True)
class _Eligible:
    candidate: _Candidate
    edit: Edit
    content: tuple[Block, ...]
    tokens: int
    saving: int


def render(inp: RenderInput) -> RenderOutput:
    policy, state = inp.policy, inp.state
    previous = state.renders.get(inp.request.format.value)
    log = _Log(state.decided)
    carry = inp.carry if inp.carry is not None and inp.carry.follows(inp) else None
    if carry is not None:
        # Nothing changed but the items appended since: the edits in force stand as the
        # previous render left them (pins, policy and durable edits are the same).
        draft = carry.draft.following(inp.items, inp.pins)
        protected = Protections(draft.entries, draft.natural, draft.turns, policy, draft.latest_results)
        in_force = list(state.applied)
        taken = set(carry.taken)
        relied = carry.relied
    else:
        draft = _Draft(inp.items, inp.pins, policy.tools)
        protected = Protections(draft.entries, draft.natural, draft.turns, policy, draft.latest_results)
        for edit in inp.durable:
            draft.apply(edit)
        in_force = _carry_over(inp, draft, protected, log)
        taken = {slot_of(a.edit) for a in (*inp.durable, *in_force)}
        relied = _relied_on([*inp.durable, *in_force])
    context = _context(inp, draft, previous)
    judge = Judge(draft.entries, draft.natural, protected, policy, relied)
    before = frozenset(taken)
    # A compression in force keeps an item's facts; a prune its evidence allows later may still take its slot.
    compressed = {slot_of(a.edit) for a in in_force if _is_compression(a)}
    carried = None
    if carry is not None and carry.pools is not None:
        carried = carry.pools, [draft.entries[s] for s in draft.natural[len(carry.items) :]]
    proposed, pools = _proposed(inp, context, taken - compressed, carried)
    candidates = [*_waiting(inp, draft, log), *proposed]
    # What the next render expects to reduce, when this one may place the cache breakpoint before it.
    shrinks: dict[int, int] | None = {} if _looks_ahead(inp) else None
    eligible = _eligible(candidates, draft, judge, taken, set(compressed), inp.counter, log, shrinks)
    applied_now, pending, durable = _time(eligible, inp, context, previous, draft, log)
    # Over its budget, the view may offload what is compressed, in force or just now.
    compressed_now = compressed | {slot_of(a.edit) for a in applied_now if _is_compression(a)}
    offloaded, budget_warnings = _fit_budget(inp, draft, protected, judge, previous, context.cache, compressed_now, log)
    if offloaded:
        gone = {slot_of(a.edit) for a in offloaded}
        applied_now = [a for a in applied_now if slot_of(a.edit) not in gone]  # (a compression just made)
        applied_now.extend(offloaded)
    superseded = compressed & {slot_of(a.edit) for a in (*applied_now, *durable)}
    if superseded:
        in_force = [a for a in in_force if slot_of(a.edit) not in superseded]

    # Repair and rendering resume the previous render's where the entries are the same.
    last = inp.carry if inp.carry is not None and inp.carry.state is state else None
    ordered, repair_warnings, repaired = repair(draft.ordered(), inp.counter, last.repaired if last else None)
    view, assembly = assemble_view(
        inp.session,
        ordered,
        inp.request,
        inp.counter,
        [*volatile.warnings_for(_leading_system(draft), inp.tools), *budget_warnings, *repair_warnings],
        draft.patches,
        last.assembly if last else None,
    )
    segments = tuple(assembly.segments)
    stable = first_divergence(previous.segments, segments) if previous else 0
    point = None
    if inp.request.place_breakpoint:
        read = context.cache.read_until(stable) if previous is not None else 0
        point = place(segments, shrinks, _pricing(inp), read, assembly.offset) if shrinks else None
        view, point = _with_breakpoint(view, assembly, draft, point)
    new_state = ViewState(
        view_version=state.view_version + 1,
        policy_version=policy.version,
        renders={
            **state.renders,
            inp.request.format.value: PreviousRender(
                inp.now,
                segments,
                view.total_tokens,
                inp.request.budget_tokens,
                ends_after(previous, stable, point.offset if point else assembly.offset, inp.now, policy.cache),
                point.offset if point is not None else None,
                known_offsets=assembly.offsets,
                known_total=assembly.offset,
            ),
        },
        applied=(*in_force, *applied_now),
        pending=tuple(pending),
        decided=frozenset(log.decided),
    )
    view = replace(
        view,
        view_version=new_state.view_version,
        stable_prefix_tokens=stable,
        policy_version=policy.version,
        cache_breakpoint_seq=point.through if point is not None else 0,
    )
    cached = point.offset if point is not None else None
    predicted = predicted_usage(context.cache, stable, cached, view.total_tokens, _pricing(inp), _framing(assembly))
    agent_ids = tuple(p.id for p in inp.agent_proposals)  # every one is decided now, or waits in the state
    next_carry = None
    if not durable:  # (edits made durable come back as history, which a carry does not follow)
        # Pools hold what rules matched on entries as shown: an entry compressed now stays
        # open but is shown otherwise, so the next render matches every entry afresh.
        reshown = any(isinstance(a.edit, Reorder) or _is_compression(a) for a in applied_now)
        next_carry = Carry(
            state=new_state,
            items=tuple(inp.items),
            pins=inp.pins,
            durable=inp.durable,
            draft=draft,
            taken=before | {slot_of(a.edit) for a in applied_now},
            relied={**_relied_on(applied_now), **relied},  # the first edit to rely on an item is named
            pools=None if reshown else pools,
            repaired=repaired,
            assembly=assembly,
        )
    return RenderOutput(view, tuple(log.certificates), new_state, agent_ids, tuple(durable), next_carry, predicted)


def _carry_over(inp: RenderInput, draft: _Draft, protected: Protections, log: _Log) -> list[AppliedEdit]:
    """Apply the edits in force after the durable ones (history, whatever pins and policy
    say). They stay, except on items protected since (pinned, or protected by a changed
    policy): those are shown in full again."""
    in_force: list[AppliedEdit] = []
    durable_slots = {slot_of(a.edit) for a in inp.durable}
    # Under the same policy only a pin can protect an item an edit reduced:
    # an item out of the last turns, or not the latest error, stays so.
    recheck = inp.state.policy_version != inp.policy.version
    for applied in inp.state.applied:
        if durable_slots and slot_of(applied.edit) in durable_slots:
            continue
        seq = target_of(applied.edit)
        protection = protected.of(seq) if seq is not None and (recheck or seq in inp.pins) else ""
        if protection:
            entry = draft.entries[seq] if seq is not None else None
            why = f"protected: {protection}; shown in full again"
            log.add(_body(entry, Decision.KEEP, applied.rule, applied.reason, why, protection=protection))
            log.mark(Decision.KEEP, applied.edit, applied.rule, applied.reason)
            continue
        draft.apply(applied)
        in_force.append(applied)
    return in_force


def _is_compression(applied: AppliedEdit) -> bool:
    return isinstance(applied.edit, Replace) and applied.reason.startswith(COMPRESSED)


def _relied_on(in_force: Iterable[AppliedEdit]) -> dict[int, int]:
    relied: dict[int, int] = {}
    for applied in in_force:
        seq = target_of(applied.edit)
        for s in applied.evidence_seqs:
            if seq is not None:
                relied.setdefault(s, seq)
    return relied


def _context(inp: RenderInput, draft: _Draft, previous: PreviousRender | None) -> TransformContext:
    return TransformContext(
        entries=tuple(draft.ordered()),
        budget_tokens=inp.request.budget_tokens,
        view_tokens=draft.view_tokens,
        cache=cache_state(previous, inp.now, inp.policy.cache),
        focus=focus_terms((draft.latest_calls, draft.latest_user), inp.request.focus),
        requested_focus=tuple(inp.request.focus),
        tools=inp.tools,
        tool_effects=inp.policy.tools,
        turns=draft.turns,
        observations=draft.observations,
        by_seq=draft.entries,
    )


def _waiting(inp: RenderInput, draft: _Draft, log: _Log) -> list[_Candidate]:
    """Deferred edits, then the agent's proposals: they go before the rules' new proposals."""
    rules = {r.name for r in inp.policy.rules}
    out: list[_Candidate] = []
    for p in inp.state.pending:
        if isinstance(p.proposal.edit, Reorder):
            # Items appended since it was proposed follow it, as they would once it applies.
            p = replace(
                p, proposal=replace(p.proposal, edit=Reorder(tuple(_reordered(p.proposal.edit, draft.natural))))
            )
        if p.control is ControlMode.RULE and p.rule not in rules:
            seq = target_of(p.proposal.edit)
            entry = draft.entries.get(seq) if seq is not None else None
            why = f"dropped: its rule is not in the session's policy (version {inp.policy.version}) any more"
            log.add(_body(entry, Decision.ABSTAIN, p.rule, p.proposal.reason, why, proposal=p.proposal))
            continue
        out.append(_Candidate(p.proposal, p.rule, p.control, pending=True))
    for proposal in inp.agent_proposals:
        evidence = proposal.reason or "asked by the agent"
        out.append(
            _Candidate(
                Proposal(Remove(proposal.seq), level=AGENT_LEVEL, reason="agent", evidence=evidence),
                "agent",
                ControlMode.AGENT,
            )
        )
    return out


def _proposed(
    inp: RenderInput, context: TransformContext, taken: set[Slot], carried: tuple[Pools, Sequence[Entry]] | None
) -> tuple[list[_Candidate], Pools]:
    """Each rule's proposals, in policy order, and each rule's pool: the open entries its
    conditions on the entry alone hold for, in view order (`carried`: the pools of the
    render this one follows, and the entries appended since)."""
    out: list[_Candidate] = []
    pools: list[tuple[Entry, ...]] = []
    # With pools carried, only the items appended since are matched afresh.
    open_entries = [e for e in context.entries if e.seq > 0 and e.seq not in taken] if carried is None else carried[1]
    by_role: dict[Role, list[Entry]] = {}  # in view order: most rules name one role
    for e in open_entries:
        by_role.setdefault(e.role, []).append(e)
    for index, rule in enumerate(inp.policy.rules):
        transform = inp.registry.get(rule.transform)
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
        out.extend(_Candidate(p, rule.name, ControlMode.RULE) for p in proposals)
    return out, tuple(pools)


def _eligible(
    candidates: Sequence[_Candidate],
    draft: _Draft,
    judge: Judge,
    taken: set[Slot],
    compressed: set[Slot],
    counter: TokenCounter,
    log: _Log,
    shrinks: dict[int, int] | None = None,
) -> list[_Eligible]:
    """The candidates that may happen, at most one per slot: the first eligible one wins.
    Refusals are certified (once); proposals for a taken slot are dropped unseen, but for
    a slot held by a compression (`compressed`), which any edit but another compression
    may take over. Into `shrinks` (when given) go the items protected only until the next
    render that a rule's edit would reduce, with their tokens once reduced."""
    out: list[_Eligible] = []
    for candidate in candidates:
        proposal = candidate.proposal
        edit = _normalized(proposal.edit, draft.entries)
        slot = slot_of(edit)
        if slot in taken and (slot not in compressed or proposal.compression):
            continue
        seq = target_of(edit)
        entry = draft.entries.get(seq) if seq is not None else None
        verdict = judge.judge(proposal, candidate.control)
        content: tuple[Block, ...] = ()
        tokens = saving = 0
        if verdict.eligible:
            content, tokens = _represent(proposal, edit, entry, draft, counter)
            saving = entry.tokens - tokens if entry is not None else -tokens if isinstance(edit, Insert) else 0
            if entry is not None and saving <= 0:
                verdict = replace(verdict, eligible=False, decision="ABSTAIN", why=NOT_SMALLER)
        elif (
            shrinks is not None
            and entry is not None
            and candidate.control is ControlMode.RULE
            and judge.lapses(entry.seq)
            and judge.judge(proposal, candidate.control, protection=False).eligible
        ):
            after = _represent(proposal, edit, entry, draft, counter)[1]
            if entry.seq not in shrinks and after < entry.tokens:  # the first eligible is what would apply
                shrinks[entry.seq] = after
        if not verdict.eligible:
            body = _body(
                entry,
                Decision(verdict.decision.lower()),
                candidate.rule,
                proposal.reason,
                verdict.why,
                proposal=proposal,
                control=candidate.control,
                protection=verdict.protection,
            )
            if candidate.control is ControlMode.AGENT:
                log.add(body)  # the agent asked: it hears back every time
            else:
                log.once(edit, candidate.rule, proposal.reason, body)
            continue
        taken.add(slot)
        compressed.discard(slot)
        judge.accept(proposal)
        out.append(_Eligible(candidate, edit, content, tokens, saving))
    return out


def _represent(
    proposal: Proposal, edit: Edit, entry: Entry | None, draft: _Draft, counter: TokenCounter
) -> tuple[tuple[Block, ...], int]:
    """What `edit` gives its target, and its tokens."""
    if edit is not proposal.edit:  # normalized afresh each render: nothing to remember it by
        return _counted(edit, draft.entries, proposal.reason, counter)
    # A deferred edit is proposed again at every render, often as the same object.
    sources = (proposal, edit, counter) if entry is None else (proposal, edit, counter, entry.item)
    return _represented.get(sources, partial(_counted, edit, draft.entries, proposal.reason, counter))


def _framing(assembly: Assembly) -> Callable[[int], int]:
    """The view's tokens up to an offset of its items' tokens (an item's start): with the
    framing of each message that ends before it, and of Anthropic's system field. Read off the
    marks the assembly keeps before each entry: no pass over the view."""
    marks, rendered = assembly.marks, assembly.rendered
    system = 1 if rendered.system is not None else 0

    def framed(tokens: int) -> int:
        at = bisect_left(marks, tokens, key=attrgetter("offset"))
        if at == len(marks):
            closed = len(rendered.messages)
        else:  # the messages before the entry there, less the one it joins
            closed = marks[at].messages - (0 if marks[at].opens or not marks[at].messages else 1)
        return tokens + FRAMING_TOKENS_PER_MESSAGE * (closed + (system if tokens else 0))

    return framed


def _looks_ahead(inp: RenderInput) -> bool:
    """Whether this render may end the cache entry before what the next one reduces: the caller
    lets the view place the breakpoint, for a provider that caches at breakpoints (one that
    caches any prefix caches it all: the breakpoint, if the format has one, goes at the end)."""
    return inp.request.place_breakpoint and inp.policy.cache.reads == BREAKPOINTS


def _with_breakpoint(
    view: View, assembly: Assembly, draft: _Draft, point: Breakpoint | None
) -> tuple[View, Breakpoint | None]:
    """The view with its cache breakpoint marked where `point` says (None: at its end), in
    the Messages format's JSON; and the point, None when the format cannot mark it there."""
    if view.format is not ViewFormat.ANTHROPIC_MESSAGES:
        return view, point
    rendered = assembly.rendered
    marked = None
    if point is not None:
        through = point.through
        index = rendered.message_index.get(through)
        after = takewhile(lambda seq: seq != through, (s.seq for s in reversed(assembly.segments)))
        shared = index is not None and index >= 0 and any(rendered.message_index.get(s) == index for s in after)
        marked = mark_breakpoint(rendered, draft.entries[through], shared)
    if marked is None:
        point, marked = None, mark_breakpoint(rendered)
    if marked is None:
        return view, point
    messages_json, system_json = marked
    return replace(view, messages_json=messages_json, system_json=system_json), point


def _time(
    eligible: Sequence[_Eligible],
    inp: RenderInput,
    context: TransformContext,
    previous: PreviousRender | None,
    draft: _Draft,
    log: _Log,
) -> tuple[list[AppliedEdit], list[PendingEdit], list[AppliedEdit]]:
    """Apply what pays now (or is free, or rides on a paid invalidation); defer the rest.
    Returns (applied, still pending, applied in history mode: durable from now on)."""
    history_rules = {r.name for r in inp.policy.rules if r.history}
    if previous is None:
        costed = [Costed(0, e.saving) for e in eligible]  # nothing sent, nothing cached
    else:
        offsets = previous.offsets()
        costed = [Costed(_position(e.edit, draft.order, previous, offsets), e.saving) for e in eligible]
    timings = schedule(
        costed,
        context.cache,
        _pricing(inp),
        context.utilization,
        force=inp.force,
    )
    applied: list[AppliedEdit] = []
    pending: list[PendingEdit] = []
    durable: list[AppliedEdit] = []
    for e, cost, timing in zip(eligible, costed, timings, strict=True):
        candidate, proposal = e.candidate, e.candidate.proposal
        seq = target_of(e.edit)
        entry = draft.entries.get(seq) if seq is not None else None
        decision = Decision.DEFER if not timing.apply else Decision.PRUNE if seq is not None else Decision.APPLY
        control = ControlMode.OPERATOR if inp.force and timing.apply else candidate.control
        if timing.apply or not candidate.pending:  # a waiting edit's DEFER is certified once
            log.add(
                _body(
                    entry,
                    decision,
                    candidate.rule,
                    proposal.reason,
                    timing.why,
                    proposal=proposal,
                    control=control,
                    new_tokens=e.tokens,
                    position=cost.position,
                    radius=timing.radius,
                    value=timing.value,
                )
            )
        if not timing.apply:
            pending.append(PendingEdit(replace(proposal, edit=e.edit), candidate.rule, candidate.control))
            continue
        done = AppliedEdit(
            e.edit, candidate.rule, proposal.reason, e.content, e.tokens, proposal.evidence_seqs, control
        )
        draft.apply(done)
        durable_now = candidate.control is ControlMode.RULE and candidate.rule in history_rules
        (durable if durable_now else applied).append(done)
    return applied, pending, durable


def _leading_system(draft: _Draft) -> Iterator[Item]:
    """The system items the history opens with (the prompt a provider caches first)."""
    for seq in draft.natural:
        item = draft.entries[seq].item
        if item.role is not Role.SYSTEM:
            return
        yield item


BUDGET = "budget"
"""The rule and reason of what is offloaded to fit a view's token budget."""


def _fit_budget(
    inp: RenderInput,
    draft: _Draft,
    protected: Protections,
    judge: Judge,
    previous: PreviousRender | None,
    cache: CacheState,
    compressed: set[Slot],
    log: _Log,
) -> tuple[list[AppliedEdit], list[ViewWarning]]:
    """When the view is still over its budget after every other step, offload the oldest
    unprotected whole turns to placeholders (a call and its results go together), until
    it fits; and say so in the view. What cannot be offloaded stays, and the view says
    it is over (OVER_BUDGET). An item shown whole or compressed (`compressed`: the slots
    held by a compression) is offloaded; one reduced otherwise stays as it is."""

    def offloadable(entry: Entry) -> bool:
        shown = entry.representation
        return shown is Representation.FULL or (shown is Representation.REDUCED and entry.seq in compressed)

    budget = inp.request.budget_tokens
    # At most a message per entry: a view under that bound fits without counting messages.
    if (
        budget <= 0
        or draft.view_tokens + FRAMING_TOKENS_PER_MESSAGE * len(draft.entries) + REPLY_PRIMING_TOKENS <= budget
    ):
        return [], []
    # Offloading leaves a placeholder in each place: the messages, and their framing, stay.
    framing = FRAMING_TOKENS_PER_MESSAGE * _messages(draft.ordered(), inp.request.format) + REPLY_PRIMING_TOKENS

    def estimate() -> int:
        return draft.view_tokens + framing

    if estimate() <= budget:
        return [], []
    start = estimate()
    turns: dict[int, list[int]] = {}
    for seq in draft.natural:
        turns.setdefault(draft.entries[seq].turn, []).append(seq)
    offsets = previous.offsets() if previous is not None else {}
    total = cache.previous_tokens
    why = (
        f"the view was {start:,} tokens, over its budget of {budget:,}, after every other step: "
        "the oldest unprotected turns go first"
    )
    applied: list[AppliedEdit] = []
    offloaded_turns = 0
    for seqs in turns.values():
        if estimate() <= budget:
            break
        if not any(offloadable(draft.entries[s]) for s in seqs) or any(
            protected.of(s) or judge.relied_upon(s) for s in seqs
        ):
            continue  # nothing left to offload in it, or it must stay
        offloaded_turns += 1
        for seq in seqs:
            entry = draft.entries[seq]
            if not offloadable(entry):
                continue  # reduced otherwise (its slot is taken) or out
            edit = Remove(seq, True, _OFFLOADED)
            content, tokens = _offloaded.get(
                (entry.item, inp.counter), partial(_placeholder_of, entry, edit, inp.counter)
            )
            if tokens >= entry.tokens:
                continue  # (an item the size of its placeholder: asked again on every render, so remembered)
            position = offsets.get(seq, total)
            radius = max(0, total - cache.read_until(position))
            log.add(
                _body(
                    entry,
                    Decision.PRUNE,
                    BUDGET,
                    BUDGET,
                    why,
                    proposal=Proposal(edit, 4, BUDGET, why),
                    new_tokens=tokens,
                    position=position,
                    radius=radius,
                    value=value_now(entry.tokens - tokens, radius, _pricing(inp)),
                )
            )
            done = AppliedEdit(edit, BUDGET, BUDGET, content, tokens, (), ControlMode.RULE)
            draft.apply(done)
            applied.append(done)
    if not applied:
        return [], []
    saved = start - estimate()
    note = (
        f"{len(applied)} items of {offloaded_turns} turns ({saved:,} tokens) offloaded to placeholders to fit "
        f"the budget of {budget:,} tokens; their handles retrieve them"
    )
    return applied, [ViewWarning("BUDGET_OFFLOADED", note)]


_OFFLOADED = "offloaded to fit the view's token budget"
_offloaded: IdentityMemo[tuple[tuple[Block, ...], int]] = IdentityMemo(100_000)


def _placeholder_of(entry: Entry, edit: Remove, counter: TokenCounter) -> tuple[tuple[Block, ...], int]:
    content = new_representation(entry, edit, BUDGET)
    return content, _tokens(content, counter)


def _messages(entries: Sequence[Entry], fmt: ViewFormat) -> int:
    """How many messages (with the system field) the entries render to, for their framing:
    one per entry for Chat Completions; for Messages, the leading system items make one
    field and consecutive items of one side merge (a lone text never takes more)."""
    shown = [e for e in entries if e.representation is not Representation.OMITTED]
    if fmt is not ViewFormat.ANTHROPIC_MESSAGES:
        return len(shown)
    count, side, closed, leading = 0, None, True, True
    for entry in shown:
        if entry.role is Role.SYSTEM and leading:
            count += 1 if side != "system" else 0
            side = "system"
            continue
        leading = False
        this = "assistant" if entry.role is Role.ASSISTANT else "user"
        if this != side or closed:
            count += 1
        side = this
        closed = len(entry.content) == 1 and isinstance(entry.content[0], TextBlock)
    return count


_represented: IdentityMemo[tuple[tuple[Block, ...], int]] = IdentityMemo(50_000)
"""What an edit gives its target, and its tokens, per proposal, edit and item."""


def _counted(
    edit: Edit, entries: Mapping[int, Entry], reason: str, counter: TokenCounter
) -> tuple[tuple[Block, ...], int]:
    content = _content_of(edit, entries, reason)
    return content, _tokens(content, counter)


def _content_of(edit: Edit, entries: Mapping[int, Entry], reason: str) -> tuple[Block, ...]:
    seq = target_of(edit)
    if seq is not None:
        return new_representation(entries[seq], edit, reason)
    if isinstance(edit, Insert):
        return edit.content.content
    return ()


def _position(edit: Edit, order: Sequence[int], previous: PreviousRender, offsets: Mapping[int, int]) -> int:
    """Where an edit changes the previous render, in tokens from its start (`offsets`: where
    each item started in it; `order`: the history's seqs as shown before the edit)."""
    segments = previous.segments
    match edit:
        case Replace(seq) | Remove(seq):
            return offsets.get(seq, previous.total_tokens)
        case Insert(after_seq):
            # Before the next history item shown after the anchor (after what was inserted there before).
            following = order[order.index(after_seq) + 1 :] if after_seq in order else ()
            return min((offsets[s] for s in following if s in offsets), default=previous.total_tokens)
        case Reorder():
            shown = iter([s for s in _reordered(edit, order) if s in offsets])
            offset = 0
            for segment in segments:
                if segment.seq > 0 and segment.seq != next(shown, None):
                    return offset
                offset += segment.tokens
            return offset
    return previous.total_tokens  # a request patch changes no prompt bytes


def _pricing(inp: RenderInput) -> CachePolicy:
    """The policy's cache pricing for this session so far (its expected calls may grow with it)."""
    return inp.policy.cache.for_session(inp.state.view_version)


def _reordered(edit: Reorder, order: Sequence[int]) -> list[int]:
    """The history's seqs in `edit`'s order; those appended since it was decided follow, in `order`."""
    listed = list(edit.order)
    known = set(listed)
    return listed + [s for s in order if s not in known]


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
    reduces = decision in (Decision.PRUNE, Decision.DEFER) and entry is not None
    return CertificateBody(
        seq=entry.seq if entry is not None else 0,
        decision=decision,
        level=proposal.level if proposal else 0,
        rule=rule,
        reason=reason,
        evidence=proposal.evidence if proposal else "",
        rationale=why,
        handle=handle_of(entry.item) if reduces and entry is not None else "",
        protection=protection,
        tokens_removed=entry.tokens if reduces and entry is not None else 0,
        placeholder_tokens=new_tokens if reduces else 0,
        first_divergence_tokens=position,
        mutation_radius_tokens=radius,
        cost_effect=round(value, 9),
        control=control,
    )


def protection_map(items: Sequence[Item], policy: Policy, pins: frozenset[int]) -> dict[int, str]:
    """seq -> why it is protected, for the protected items of a history."""
    draft = _Draft(items, pins, policy.tools)
    return Protections(draft.entries, draft.natural, draft.turns, policy, draft.latest_results).all()


def identity_view(session: Session, items: Sequence[Item], request: ViewRequest, counter: TokenCounter) -> View:
    """The view with no rules and no previous render: every item in full."""
    no_rules = replace(default_policy(), rules=())
    return render(RenderInput(session, items, no_rules, request, counter, TransformRegistry())).view
