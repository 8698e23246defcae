"""Timing, then apply (DESIGN section 4): each eligible edit is priced against the prompt
cache (timing.py) and applied now, or deferred to a cache-safe point. What applies now is
certified PRUNE (an edit that reduces an item) or APPLY; a DEFER is certified the first
time an edit waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.policy import Policy
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import Draft, reordered
from contextd.engine.stages.eligible import Eligible
from contextd.engine.state import AppliedEdit, ControlMode, PendingEdit, PreviousRender
from contextd.engine.timing import Costed, PromptCache, Timing, schedule, stake
from contextd.engine.types import Edit, Insert, Remove, Reorder, Replace, target_of


@dataclass(frozen=True, slots=True)
class Timed:
    eligible: Eligible
    position: int
    """Where it changes the previous render, in tokens from its start."""
    timing: Timing
    control: ControlMode
    """Who it is certified as decided by: the operator, for what a forced render applies."""


@dataclass(frozen=True, slots=True)
class Scheduled:
    timed: tuple[Timed, ...]
    """The eligible edits in their order, each with its timing."""
    certificates: tuple[CertificateBody, ...]
    staked: float = 0.0
    """What the rewrite applied now puts at risk of the session's bank (`timing.stake`): an
    early cache breakpoint may stake only the rest (breakpoint.py)."""


@dataclass(frozen=True, slots=True)
class Applied:
    now: tuple[AppliedEdit, ...]
    """Applied in this render, in force from now on in the view state."""
    pending: tuple[PendingEdit, ...]
    """Deferred: proposed again at the next render."""
    durable: tuple[AppliedEdit, ...]
    """Applied by rules in history mode: durable from now on (mutations in the history)."""


def time_edits(
    eligible: Sequence[Eligible], draft: Draft, cache: PromptCache, utilization: float, force: bool = False
) -> Scheduled:
    """Whether each eligible edit pays now (or is free, or rides on a paid invalidation), at
    the `utilization` of the budget the view was at before this render's edits; `force`
    (operator mode): every one applies."""
    previous = cache.previous
    if previous is None:
        positions = [0] * len(eligible)  # nothing sent, nothing cached
    else:
        offsets = previous.offsets()
        positions = [_position(e.edit, draft.order, previous, offsets) for e in eligible]
    timings = schedule(
        [Costed(p, e.saving) for p, e in zip(positions, eligible, strict=True)],
        cache.state,
        cache.pricing,
        utilization,
        force=force,
        bank=previous.banked if previous is not None else 0.0,
    )
    timed: list[Timed] = []
    certificates: list[CertificateBody] = []
    for e, position, timing in zip(eligible, positions, timings, strict=True):
        candidate, proposal = e.candidate, e.candidate.proposal
        seq = target_of(e.edit)
        entry = draft.entries.get(seq) if seq is not None else None
        decision = Decision.DEFER if not timing.apply else Decision.PRUNE if seq is not None else Decision.APPLY
        control = ControlMode.OPERATOR if force and timing.apply else candidate.control
        if timing.apply or not candidate.pending:  # a waiting edit's DEFER is certified once
            certificates.append(
                certificate(
                    entry,
                    decision,
                    candidate.rule,
                    proposal.reason,
                    timing.why,
                    proposal=proposal,
                    control=control,
                    new_tokens=e.tokens,
                    position=position,
                    radius=timing.radius,
                    value=timing.value,
                )
            )
        timed.append(Timed(e, position, timing, control))
    return Scheduled(tuple(timed), tuple(certificates), _staked(timed, cache))


def _staked(timed: Sequence[Timed], cache: PromptCache) -> float:
    """The stake of the rewrite the schedule applies: its edits' savings against what they make
    the next call write again (none when the cache is cold: nothing cached to lose)."""
    rewrites = [t for t in timed if t.timing.apply and t.timing.radius > 0]
    if not rewrites or cache.state.cold:
        return 0.0
    return stake(
        sum(max(0, t.eligible.saving) for t in rewrites), max(t.timing.radius for t in rewrites), cache.pricing
    )


def apply(timed: Sequence[Timed], draft: Draft, policy: Policy) -> Applied:
    """Apply to the draft, in order, the edits timed to apply now; the others wait."""
    history_rules = {r.name for r in policy.rules if r.history}
    now: list[AppliedEdit] = []
    pending: list[PendingEdit] = []
    durable: list[AppliedEdit] = []
    for t in timed:
        e = t.eligible
        candidate, proposal = e.candidate, e.candidate.proposal
        if not t.timing.apply:
            # (The proposal itself where its edit needs no normalizing, as a deferred edit's: what it
            # gives its target is remembered by the proposal's identity, stages/eligible.py.)
            waits = proposal if e.edit is proposal.edit else replace(proposal, edit=e.edit)
            pending.append(PendingEdit(waits, candidate.rule, candidate.control))
            continue
        done = AppliedEdit(
            e.edit, candidate.rule, proposal.reason, e.content, e.tokens, proposal.evidence_seqs, t.control
        )
        draft.apply(done)
        durable_now = candidate.control is ControlMode.RULE and candidate.rule in history_rules
        (durable if durable_now else now).append(done)
    return Applied(tuple(now), tuple(pending), tuple(durable))


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
            shown = iter([s for s in reordered(edit, order) if s in offsets])
            offset = 0
            for segment in segments:
                if segment.seq > 0 and segment.seq != next(shown, None):
                    return offset
                offset += segment.tokens
            return offset
    return previous.total_tokens  # a request patch changes no prompt bytes
