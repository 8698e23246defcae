"""The certificate of each decision a render makes (DESIGN principle 3), as the stages
write it, and the key under which a refusal is certified only once."""

from __future__ import annotations

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.placeholders import handle_of
from contextd.engine.state import ControlMode, slot_of
from contextd.engine.types import Edit, Entry, Proposal


def certificate(
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
    """The body of the certificate for one decision on `entry` (None: an edit that targets no
    item). `new_tokens`: tokens of what replaces the item; `position` and `radius`: tokens of
    the previous render (where the edit changes it, and what the next call writes again)."""
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


def refusal_key(decision: Decision, edit: Edit | None, rule: str, reason: str) -> str:
    """What a KEEP or ABSTAIN is remembered by in the view state (`ViewState.decided`): a rule
    proposes the same thing on every render, and its refusal is certified the first time."""
    slot = slot_of(edit) if edit is not None else ""
    return f"{decision.value}:{f'item:{slot}' if isinstance(slot, int) else slot}:{rule}:{reason}"
