"""May this edit happen at all? Protection first, then the evidence ladder
(DESIGN section 5). What cannot be established is ABSTAIN, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from contextd.engine.model import Role
from contextd.engine.policy import Policy
from contextd.engine.state import ControlMode
from contextd.engine.transforms import Entry, Proposal, target_of

LEVELS = {
    0: "identical copy",
    1: "same versioned source",
    2: "superseded observation",
    3: "completed work",
    4: "predicted irrelevant",
}


def protections(entries: Sequence[Entry], policy: Policy) -> dict[int, str]:
    """seq -> why the item is protected, for every protected item."""
    turns = entries[-1].turn + 1 if entries else 0
    latest_result: dict[str, Entry] = {}
    for entry in entries:
        result = entry.item.tool_result
        if result is not None:
            latest_result[result.name] = entry
    latest_errors = {e.seq for e in latest_result.values() if e.item.tool_result and e.item.tool_result.is_error}
    found: dict[int, str] = {}
    for entry in entries:
        reason = _protection(entry, policy, turns, latest_errors)
        if reason:
            found[entry.seq] = reason
    return found


def _protection(entry: Entry, policy: Policy, turns: int, latest_errors: set[int]) -> str:
    rules = policy.protection
    item = entry.item
    if entry.pinned:
        return "pinned"
    if item.role is Role.SYSTEM:
        return "system prompt"
    if item.role is Role.USER and rules.user_items:
        return "user instruction"
    if turns - entry.turn <= rules.last_turns:
        return f"within the last {rules.last_turns} turns"
    if rules.latest_error_per_tool and entry.seq in latest_errors:
        return "the latest error of its tool, not yet followed by a success"
    tools = [item.tool_result.name] if item.tool_result else [u.name for u in item.tool_uses]
    for pattern in rules.tools:
        if any(fnmatchcase(t, pattern) for t in tools):
            return f"protected tool ({pattern})"
    if item.source is not None:
        for pattern in rules.sources:
            if fnmatchcase(item.source.uri, pattern):
                return f"protected source ({pattern})"
    return ""


@dataclass(frozen=True, slots=True)
class Verdict:
    eligible: bool
    decision: str
    """KEEP (protected), ABSTAIN (not established) or empty when eligible."""
    why: str
    protection: str = ""


def judge(
    proposal: Proposal,
    control: ControlMode,
    entries: Mapping[int, Entry],
    protected: Mapping[int, str],
    policy: Policy,
) -> Verdict:
    """The eligibility of one proposal; an ineligible one says KEEP or ABSTAIN and why."""
    seq = target_of(proposal.edit)
    if seq is not None:
        if seq not in entries:
            return Verdict(False, "ABSTAIN", f"item {seq} is not in the history")
        if seq in protected:
            return Verdict(False, "KEEP", f"protected: {protected[seq]}", protected[seq])
    if proposal.abstain:
        return Verdict(False, "ABSTAIN", proposal.evidence or "the transform could not establish that it is safe")
    if not 0 <= proposal.level <= 4:
        return Verdict(False, "ABSTAIN", f"level {proposal.level} is not on the evidence ladder (0-4)")
    if control is ControlMode.RULE and proposal.level > policy.max_level:
        return Verdict(
            False,
            "ABSTAIN",
            f"level {proposal.level} ({LEVELS[proposal.level]}) is above the policy's maximum of {policy.max_level}",
        )
    missing = [s for s in proposal.evidence_seqs if s not in entries]
    if missing:
        return Verdict(False, "ABSTAIN", f"the evidence names items not in the history: {missing}")
    if proposal.level == 0 and seq is not None:
        # An identical copy is checked, not taken on trust.
        target = entries[seq].item.content_hash
        if not proposal.evidence_seqs or any(entries[s].item.content_hash != target for s in proposal.evidence_seqs):
            return Verdict(False, "ABSTAIN", "claimed identical to items whose content differs (or none named)")
    return Verdict(True, "", "")
