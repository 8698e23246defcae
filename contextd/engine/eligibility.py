"""May this edit happen at all? Protection first, then the evidence ladder
(DESIGN section 5). What cannot be established is ABSTAIN, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


class Protections:
    """Why each item is protected ("" when it is not), worked out on first asking:
    a render asks only about the items something proposes to change."""

    def __init__(self, entries: Sequence[Entry], policy: Policy) -> None:
        self._entries = {e.seq: e for e in entries}
        self._policy = policy
        self._turns = entries[-1].turn + 1 if entries else 0
        latest_result: dict[str, Entry] = {}
        for entry in entries:
            result = entry.item.tool_result
            if result is not None:
                latest_result[result.name] = entry
        self._latest_errors = {
            e.seq for e in latest_result.values() if e.item.tool_result and e.item.tool_result.is_error
        }
        self._known: dict[int, str] = {}

    def of(self, seq: int) -> str:
        if seq not in self._known:
            entry = self._entries.get(seq)
            self._known[seq] = _protection(entry, self._policy, self._turns, self._latest_errors) if entry else ""
        return self._known[seq]

    def all(self) -> dict[int, str]:
        """seq -> reason, for every protected item."""
        return {seq: reason for seq in self._entries if (reason := self.of(seq))}


def protections(entries: Sequence[Entry], policy: Policy) -> dict[int, str]:
    """seq -> why the item is protected, for every protected item."""
    return Protections(entries, policy).all()


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
    if rules.tools:
        for tool in [item.tool_result.name] if item.tool_result else [u.name for u in item.tool_uses]:
            pattern = rules.tools.match(tool)
            if pattern:
                return f"protected tool ({pattern})"
    if item.source is not None and rules.sources:
        pattern = rules.sources.match(item.source.uri)
        if pattern:
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
    protected: Protections,
    policy: Policy,
) -> Verdict:
    """The eligibility of one proposal; an ineligible one says KEEP or ABSTAIN and why."""
    seq = target_of(proposal.edit)
    if seq is not None:
        if seq not in entries:
            return Verdict(False, "ABSTAIN", f"item {seq} is not in the history")
        reason = protected.of(seq)
        if reason:
            return Verdict(False, "KEEP", f"protected: {reason}", reason)
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
