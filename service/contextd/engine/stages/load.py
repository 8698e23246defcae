"""Load (DESIGN section 4): the history as the edits in force show it.

Edits made durable come first (history, whatever pins and policy say), then the view
state's edits in force: they stay, so the bytes a provider cached stay valid, except on
items protected since (pinned, or protected by a changed policy), which are shown in
full again (KEEP). A render that follows the previous one (only items appended since)
starts from that render's finished draft instead, taken over in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.eligibility import Protections
from contextd.engine.memo import Claim
from contextd.engine.model import Item
from contextd.engine.placeholders import turns_in
from contextd.engine.policy import Policy
from contextd.engine.retraction import retracted
from contextd.engine.stages.certify import certificate, refusal_key
from contextd.engine.stages.draft import Draft, is_compression
from contextd.engine.state import AppliedEdit, Slot, ViewState, slot_of
from contextd.engine.types import Remove, target_of


@dataclass(frozen=True, slots=True)
class Finished:
    """A render's draft with all its edits applied, and what they take and rest on: where
    the next render from its state starts, when only items were appended since (the carry)."""

    draft: Draft
    taken: set[Slot]
    compressed: set[Slot]
    """Those of `taken` a compression holds."""
    relied: dict[int, int]
    claim: Claim = field(default_factory=Claim)
    """The render that follows takes the draft over and appends to it in place: one may, and
    another from the same carry (after a dry run, or a render that failed half-way) starts
    from the state."""


@dataclass(frozen=True, slots=True)
class Loaded:
    draft: Draft
    """Every edit in force applied; the later stages apply this render's edits to it."""
    protected: Protections
    in_force: tuple[AppliedEdit, ...]
    """The view state's edits that stay in force (those made durable are history)."""
    taken: set[Slot]
    """The slots of every edit in force, durable ones included."""
    compressed: set[Slot]
    """Those held by a compression: it keeps an item's facts, and a prune its evidence
    allows later may still take its slot."""
    relied: dict[int, int]
    """What the edits in force rest on: evidence seq -> the seq whose reduction rests on it.

    These three grow with the session and are read, not copied, during the render; the carry
    it hands on takes its edits into them, in place, once it is done (`take`)."""
    certificates: tuple[CertificateBody, ...]
    """KEEP for each edit undone on an item protected since."""
    decided: frozenset[str]
    """The refusals certified so far (`ViewState.decided`, and those KEEPs)."""


def load(
    items: Sequence[Item],
    pins: frozenset[int],
    policy: Policy,
    state: ViewState,
    durable: tuple[AppliedEdit, ...],
    finished: Finished | None = None,
) -> Loaded:
    """The draft of `items` with the edits in force applied (`finished`: the previous render's,
    when this render differs from its input only by items appended: its edits stand as it left
    them)."""
    if finished is not None:
        draft = finished.draft
        draft.append(items, pins)
        return Loaded(
            draft,
            draft.protections(policy),
            state.applied,
            finished.taken,
            finished.compressed,
            finished.relied,
            (),
            state.decided,
        )
    withdrawn = retracted(durable)
    draft = Draft(items, pins, policy.tools, withdrawn)
    protected = draft.protections(policy)
    for edit in durable:
        draft.apply(edit)
    in_force, certificates, undone = _carry_over(draft, protected, policy, state, pins, durable, withdrawn)
    return Loaded(
        draft,
        protected,
        in_force,
        {slot_of(a.edit) for a in (*durable, *in_force)},
        {slot_of(a.edit) for a in in_force if is_compression(a)},
        relied_on([*durable, *in_force]),
        certificates,
        state.decided | undone,
    )


def _carry_over(
    draft: Draft,
    protected: Protections,
    policy: Policy,
    state: ViewState,
    pins: frozenset[int],
    durable: tuple[AppliedEdit, ...],
    withdrawn: frozenset[int] = frozenset(),
) -> tuple[tuple[AppliedEdit, ...], tuple[CertificateBody, ...], frozenset[str]]:
    """Apply the state's edits in force after the durable ones. Returns those that stay, the
    KEEPs of those undone, and the keys those KEEPs are certified under."""
    in_force: list[AppliedEdit] = []
    certificates: list[CertificateBody] = []
    undone: set[str] = set()
    durable_slots = {slot_of(a.edit) for a in durable}
    # Under the same policy only a pin can protect an item an edit reduced:
    # an item out of the last turns, or not the latest error, stays so.
    recheck = state.policy_version != policy.version
    back = _runs_back(state.applied, protected, pins, recheck)
    for applied in state.applied:
        if durable_slots and slot_of(applied.edit) in durable_slots:
            continue
        seq = target_of(applied.edit)
        protection = protected.of(seq) if seq is not None and (recheck or seq in pins) else ""
        gone = sorted(withdrawn.intersection(applied.evidence_seqs))
        run = next((r for r in back if seq in r.seqs and applied.rule == r.rule), None) if back else None
        if protection or gone or run is not None:
            entry = draft.entries[seq] if seq is not None else None
            if protection:
                why = f"protected: {protection}; shown in full again"
            elif gone:
                why = f"its evidence, item {gone[0]}, was retracted; shown in full again"
            else:
                assert run is not None
                why = (
                    f"left out with the whole turns of items {run.seqs.start} to {run.seqs.stop - 1}, of which"
                    f" item {run.held} is protected since; shown again"
                )
            certificates.append(
                certificate(entry, Decision.KEEP, applied.rule, applied.reason, why, protection=protection)
            )
            undone.add(refusal_key(Decision.KEEP, applied.edit, applied.rule, applied.reason))
            continue
        draft.apply(applied)
        in_force.append(applied)
    return tuple(in_force), tuple(certificates), frozenset(undone)


@dataclass(frozen=True, slots=True)
class _RunBack:
    seqs: range
    rule: str
    held: int
    """The item of the run protected since."""


def _runs_back(
    applied: Iterable[AppliedEdit], protected: Protections, pins: frozenset[int], recheck: bool
) -> list[_RunBack]:
    """The runs of whole turns left out together (stages/budget.py) that come back whole: one of
    their items is protected since (pinned; or by a changed policy, `recheck`), and shown alone it
    would lack its call or its results, and the items around it their marker."""
    back: list[_RunBack] = []
    if not (recheck or pins):
        return back  # (nothing can be protected since: no pass over the edits in force)
    for a in applied:
        edit = a.edit
        seqs = turns_in(edit.note) if isinstance(edit, Remove) and edit.placeholder else None
        if seqs is None:
            continue
        held = (
            next((s for s in seqs if protected.of(s)), None)
            if recheck
            else next((p for p in sorted(pins) if p in seqs), None)
        )
        if held is not None:
            back.append(_RunBack(seqs, a.rule, held))
    return back


def take(taken: set[Slot], compressed: set[Slot], relied: dict[int, int], applied: Iterable[AppliedEdit]) -> None:
    """Take the slots of `applied` (edits made after those `taken` holds, in order) into the
    three, in place: a later edit may take over the slot of a compression (the budget's offload
    of a compressed output), which then holds the output as that edit left it; the first edit
    to rely on an item is the one named."""
    applied = list(applied)
    for a in applied:
        slot = slot_of(a.edit)
        taken.add(slot)
        if is_compression(a):
            compressed.add(slot)
        else:
            compressed.discard(slot)
    for evidence, seq in relied_on(applied).items():
        relied.setdefault(evidence, seq)


def relied_on(in_force: Iterable[AppliedEdit]) -> dict[int, int]:
    """evidence seq -> the seq whose reduction rests on it (the first edit to rely on an item)."""
    relied: dict[int, int] = {}
    for applied in in_force:
        seq = target_of(applied.edit)
        for s in applied.evidence_seqs:
            if seq is not None:
                relied.setdefault(s, seq)
    return relied
