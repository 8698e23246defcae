"""One render, start to finish (DESIGN section 4), as its stages (engine/stages/):

    load (the edits in force) -> propose -> eligible -> timing -> apply -> budget ->
    show (repair, render, count) -> record (certificates and the new state)

A pure function of its input: the same history, policy, state, request and
clock give the same view, byte for byte, and the same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any

from contextd.engine.certificates import CertificateBody
from contextd.engine.changes import StateChange
from contextd.engine.memo import shared_prefix, take_over
from contextd.engine.model import Item, Session
from contextd.engine.policy import Policy, default_policy
from contextd.engine.prefix import held
from contextd.engine.repair import RepairRun
from contextd.engine.stages.apply import Timed, apply, time_edits
from contextd.engine.stages.budget import fit_budget
from contextd.engine.stages.draft import Draft
from contextd.engine.stages.eligible import Eligible, judge, still_eligible
from contextd.engine.stages.ledger import Ledgers, let_go
from contextd.engine.stages.load import Finished, Loaded, load, take
from contextd.engine.stages.propose import AgentProposal, propose, transform_context
from contextd.engine.stages.record import record
from contextd.engine.stages.show import Shown, looks_ahead, show
from contextd.engine.state import AppliedEdit, ControlMode, ViewState, slot_of
from contextd.engine.timing import NO_USAGE, Usage, prompt_cache
from contextd.engine.tokens import TokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import CacheState, Reorder, target_of
from contextd.engine.view import Assembly, View, ViewItem, ViewRequest

__all__ = ["AgentProposal", "Carry", "RenderInput", "RenderOutput", "identity_view", "protection_map", "render"]


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
    change: StateChange | None = field(default=None, compare=False)
    """How `state` follows from the input's state: what is stored (changes.py)."""
    stages: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    """Seconds each stage took, in order (the service's metrics)."""


CARRY_BYTES_PER_ITEM = 1600
SETTLED_FROM = 64
"""A render that changed at least this many entries (one that derived the session whole, with
every output compressed on entry, say) asks the rules about them again itself, as it hands on its
carry (`_carry`): else the next render from it would ask about all of them (at 10,000 items of
bench/scale.py's session, 5,000 entries, 170-260 ms against 2-3 ms for a render after one
append), and so would the first render of each replica that reads that carry back. Below it
the next render asks about them, most of them of the latest turn, which it asks about anyway."""


@dataclass(frozen=True, slots=True, eq=False)
class Carry:
    """What a render worked out that the next render from its state can start from,
    in the same process (never stored). With it, a render after appends touches the
    items appended since and the edits it makes, not the whole history; its output
    is the same as without it."""

    state: ViewState
    """The state the render produced: the carry serves renders from this state only."""
    items: Sequence[Item]
    """The history it was rendered from, as it stays (`prefix.held`): the same prefix of
    storage's list of the session's items the render was given, else a list of its own.
    `follows` compares the next render's with it: two prefixes of one list by their lengths,
    two lists at pointer speed, a list and a tuple not."""
    pins: frozenset[int]
    durable: tuple[AppliedEdit, ...]
    counter: TokenCounter
    """What the render counted tokens with: what it worked out (an edit's tokens, whether it is
    smaller than its item: `settled`, the proposals let go) holds for the same counter only (a
    carry read back counts with the reader's: carry_pickle.py)."""
    finished: Finished
    """The render's draft with every edit in force applied, the slots those edits take
    and what they rest on (where load resumes)."""
    ledgers: Ledgers | None
    """What each rule did (stages/ledger.py); None when the render reordered the view (the
    rules' pools are in the items' order)."""
    repaired: RepairRun
    assembly: Assembly
    """The view as rendered, for the next render in the same format to resume."""
    settled: tuple[Eligible, ...] = ()
    """The edits the render deferred that the next render takes as judged (`still_eligible`)."""

    def footprint(self) -> int:
        """About how many bytes it holds: per item its entry and what the stages derived (the
        rules' ledgers, the observation index, the assembly: about 1.6 KB, tracemalloc on
        bench/scale.py's sessions at 2,000 items, both formats), the view's serialized messages,
        under a budget the count of its messages (stages/budget.py), and the outputs resting on
        the focus by their words (`ledger.Reach`: up to 5% more on the mixed workload)."""
        counted = self.finished.draft.message_count
        return (
            CARRY_BYTES_PER_ITEM * len(self.items)
            + self.assembly.rendered.json_chars
            + (counted.footprint() if counted is not None else 0)
            + (sum(ledger.reach.footprint() for ledger in self.ledgers.rules) if self.ledgers is not None else 0)
        )

    def shown(self) -> tuple[Sequence[ViewItem], Sequence[str]]:
        """The items and serialized messages of the view as rendered (a render resuming this
        carry shows the same objects, but for what changed)."""
        return self.assembly.items, self.assembly.rendered.messages_json

    def advanced(self, changes: Sequence[StateChange], state: ViewState, items: Sequence[Item]) -> Carry | None:
        """This carry brought up to `state`, which other renders (another replica's) made from
        this carry's state by `changes`: their edits applied to the finished draft, as
        loading `state` would apply them, and as a render's own carry takes them (`_carry`): an
        edit that takes over the slot of one in force (the budget's offload of a compressed
        output) replaces it. None when they did more than add edits or replace some (undo one,
        reorder the view, change the policy): the render then starts from the state alone."""
        if not changes or changes[-1].view_version != state.view_version:
            return None
        if any(
            c.policy_version != self.state.policy_version or not c.removed <= {slot_of(a.edit) for a in c.added}
            for c in changes
        ):
            return None
        edits = [a for c in changes for a in c.added]
        seen = changes[-1].items
        if any(isinstance(a.edit, Reorder) for a in edits) or not len(self.items) <= seen <= len(items):
            return None
        if not take_over(self.finished.claim):
            return None
        draft = self.finished.draft
        draft.append(held(items, seen), self.pins)
        for applied in edits:
            draft.apply(applied)
        was = self.finished
        take(was.taken, was.compressed, was.relied, edits)  # in order: later changes take over slots
        finished = Finished(draft, was.taken, was.compressed, was.relied)
        changed = frozenset(s for s in map(target_of, (a.edit for a in edits)) if s is not None and s > 0)
        ledgers = None if self.ledgers is None else replace(self.ledgers, changed=self.ledgers.changed | changed)
        return replace(self, state=state, items=held(items, seen), finished=finished, ledgers=ledgers, settled=())

    def follows(self, inp: RenderInput) -> bool:
        """Whether `inp` differs from the input that made this carry only by items appended (its
        tokens counted by the same counter)."""
        return (
            self.state is inp.state
            and self.counter is inp.counter
            and inp.policy.version == inp.state.policy_version
            and self.pins == inp.pins
            and self.durable == inp.durable
            and len(inp.items) >= len(self.items)
            and shared_prefix(self.items, inp.items) == len(self.items)
        )


def render(inp: RenderInput) -> RenderOutput:
    """The view of `inp.items` under the session's policy and view state, the certificates
    of its decisions, and the state the next render starts from."""
    policy, state, request, counter = inp.policy, inp.state, inp.request, inp.counter
    carry = inp.carry if inp.carry is not None and inp.carry.follows(inp) else None
    if carry is not None and not take_over(carry.finished.claim):
        carry = None  # another render from it appended to its draft (a dry run, a render that failed)
    cache = prompt_cache(state.renders.get(request.format.value), inp.now, policy.cache, state.view_version)

    lap = Laps()
    loaded = load(inp.items, inp.pins, policy, state, inp.durable, carry.finished if carry else None)
    draft = loaded.draft  # the one mutable value: apply and the budget go on applying edits to it
    lap("load")
    context = transform_context(draft, request, cache.state, inp.tools, policy)
    proposed = propose(
        loaded, context, policy, inp.registry, state.pending, inp.agent_proposals, carry.ledgers if carry else None
    )
    lap("propose")
    judged = judge(
        proposed.candidates,
        loaded,
        policy,
        counter,
        look_ahead=looks_ahead(request, policy),
        settled=carry.settled if carry else (),
    )
    lap("judge")
    timed = time_edits(judged.eligible, draft, cache, context.utilization, inp.force)
    applied = apply(timed.timed, draft, policy)
    # The rules let go of what they proposed that stands refused, and of what waits for the
    # cache: it comes back as a deferred edit, first, and a rule's copy after it would be passed
    # over for the slot it holds (or refused as it is, once it no longer waits).
    waiting = [(t.eligible.candidate.rule, t.eligible.candidate.proposal) for t in timed.timed if _waits(t)]
    if judged.standing or waiting:
        let_go(proposed.ledgers, [r.name for r in policy.rules], (*judged.standing, *waiting))
    lap("apply")
    fitted = fit_budget(
        draft, applied.now, loaded.compressed, request, counter, loaded.protected, judged.relied, cache, loaded.relied
    )
    lap("budget")
    # Repair and rendering resume the previous render's where the entries are the same.
    last = inp.carry if inp.carry is not None and inp.carry.state is state else None
    shown = show(
        inp.session,
        draft,
        request,
        counter,
        inp.tools,
        fitted.warnings,
        cache,
        judged.shrinks,
        repaired=last.repaired if last else None,
        assembled=last.assembly if last else None,
        staked=timed.staked,
    )
    lap("show")
    recorded = record(
        shown,
        state,
        policy,
        request,
        inp.now,
        cache,
        in_force=loaded.in_force,
        compressed=loaded.compressed | fitted.remarked if fitted.remarked else loaded.compressed,
        applied=fitted.applied,
        durable=applied.durable,
        pending=applied.pending,
        decided=judged.decided,
        items=len(inp.items),
        history_tokens=draft.history_tokens,
    )
    lap("record")
    certificates = (
        *loaded.certificates,
        *proposed.certificates,
        *judged.certificates,
        *timed.certificates,
        *fitted.certificates,
    )
    # Edits made durable come back as history, which a carry does not follow.
    carried = None
    if not applied.durable:
        deferred = [t.eligible for t in timed.timed if not t.timing.apply]
        carried = _carry(inp, recorded.state, loaded, proposed.ledgers, fitted.applied, shown, deferred, cache.state)
        lap("carry")  # (after a render that changed many entries, the rules asked again: `_carry`)
    agent_ids = tuple(p.id for p in inp.agent_proposals)  # every one is decided now, or waits in the state
    return RenderOutput(
        recorded.view,
        certificates,
        recorded.state,
        agent_ids,
        applied.durable,
        carried,
        recorded.predicted,
        recorded.change,
        lap.stages,
    )


class Laps:
    """The seconds since the previous lap (or `restart`), by stage: the engine's stages, and a
    render's reads before them (view_service.py)."""

    __slots__ = ("last", "stages")

    def __init__(self) -> None:
        self.stages: tuple[tuple[str, float], ...] = ()
        self.last = perf_counter()

    def restart(self) -> None:
        """Count the next lap from now (what came between is no stage)."""
        self.last = perf_counter()

    def __call__(self, stage: str) -> None:
        now = perf_counter()
        self.stages += ((stage, now - self.last),)
        self.last = now


def _carry(
    inp: RenderInput,
    state: ViewState,
    loaded: Loaded,
    ledgers: Ledgers,
    applied: Sequence[AppliedEdit],
    shown: Shown,
    deferred: Sequence[Eligible],
    cache: CacheState,
) -> Carry:
    """What the next render from `state` may start from, after a render that applied `applied`
    and deferred `deferred`."""
    # An edit of this render may have taken over a compression's slot (record.py).
    take(loaded.taken, loaded.compressed, loaded.relied, applied)
    finished = Finished(loaded.draft, loaded.taken, loaded.compressed, loaded.relied)
    # The rules proposed for entries as shown before this render's edits: the next render
    # matches those it changed afresh.
    changed = frozenset(s for s in map(target_of, (a.edit for a in applied)) if s is not None and s > 0)
    reordered = any(isinstance(a.edit, Reorder) for a in applied)
    carried: Ledgers | None = None if reordered else replace(ledgers, changed=changed)
    if carried is not None and not loaded.draft.reordered and len(changed) >= SETTLED_FROM:
        # Asked now about the entries as this render left them, as the next render would ask.
        context = transform_context(loaded.draft, inp.request, cache, inp.tools, inp.policy)
        carried = propose(loaded, context, inp.policy, inp.registry, (), (), carried).ledgers
    return Carry(
        state=state,
        items=held(inp.items),
        pins=inp.pins,
        durable=inp.durable,
        counter=inp.counter,
        finished=finished,
        ledgers=carried,
        repaired=shown.repaired,
        assembly=shown.assembly,
        settled=still_eligible(deferred, applied),
    )


def _waits(timed: Timed) -> bool:
    """Whether a rule's proposal was deferred in this render (not one deferred before)."""
    candidate = timed.eligible.candidate
    return not timed.timing.apply and candidate.control is ControlMode.RULE and not candidate.pending


def protection_map(items: Sequence[Item], policy: Policy, pins: frozenset[int]) -> dict[int, str]:
    """seq -> why it is protected, for the protected items of a history."""
    return Draft(items, pins, policy.tools).protections(policy).all()


def identity_view(
    session: Session,
    items: Sequence[Item],
    request: ViewRequest,
    counter: TokenCounter,
    durable: tuple[AppliedEdit, ...] = (),
) -> View:
    """The view with no rules and no previous render: every item in full, but for `durable`
    (history mode's edits and retractions: the history as stored)."""
    no_rules = replace(default_policy(), rules=())
    return render(RenderInput(session, items, no_rules, request, counter, TransformRegistry(), durable=durable)).view
