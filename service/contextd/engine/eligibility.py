"""May this edit happen at all? Protection first, then the evidence ladder
(DESIGN section 5). What cannot be established is ABSTAIN, never a guess.
"""

from __future__ import annotations

import functools
import json
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ReasoningBlock,
    Representation,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.policy import Policy
from contextd.engine.state import ControlMode
from contextd.engine.types import Edit, Entry, Insert, Proposal, Reorder, Replace, target_of

LEVELS = {
    0: "identical copy",
    1: "same versioned source",
    2: "superseded observation",
    3: "completed work",
    4: "predicted irrelevant",
}


RECENT = "within the last"
"""How a protection for being among the latest turns begins (what `Proposal.on_entry` may pass)."""


class Protections:
    """Why each item is protected ("" when it is not), worked out on first asking:
    a render asks only about the items something proposes to change.

    It reads what edits never change (the item, its turn, its pin), so it may
    be asked while a render edits the entries."""

    def __init__(
        self,
        entries: Mapping[int, Entry],
        natural: Sequence[int],
        turns: int,
        policy: Policy,
        latest_results: Mapping[str, int],
    ) -> None:
        self._entries = entries
        self._natural = natural
        """The history's seqs in their natural order (inserted content is never protected)."""
        self._turns = turns
        self._policy = policy
        self._latest_results = latest_results
        """tool name -> seq of its latest result."""
        self._latest_errors: set[int] | None = None
        self._known: dict[int, str] = {}

    def _errors(self) -> set[int]:
        if self._latest_errors is None:
            results = [self._entries[seq].item.tool_result for seq in self._latest_results.values()]
            self._latest_errors = {
                seq for seq, r in zip(self._latest_results.values(), results, strict=True) if r and r.is_error
            }
        return self._latest_errors

    def of(self, seq: int) -> str:
        if seq not in self._known:
            entry = self._entries.get(seq) if seq > 0 else None
            self._known[seq] = _protection(entry, self._policy, self._turns, self._errors) if entry else ""
        return self._known[seq]

    def lapses(self, seq: int) -> bool:
        """Whether item `seq` is protected now and will not be one turn on. A guess: an error is
        taken to be its tool's latest no more by then, as agents call the tool again (most have
        one or two)."""
        entry = self._entries.get(seq) if seq > 0 else None
        if entry is None or not self.of(seq):
            return False
        return not _protection(entry, self._policy, self._turns + 1, set)

    def besides_recency(self, seq: int) -> str:
        """Why item `seq` would be protected were it not among the latest turns ("" when it would not)."""
        entry = self._entries.get(seq) if seq > 0 else None
        if entry is None:
            return ""
        return _protection(entry, self._policy, entry.turn + self._policy.protection.last_turns + 1, self._errors)

    def lasting(self, seq: int) -> bool:
        """Whether item `seq` is protected for as long as the session's pins and policy stand
        (pinned, a system or user item, a protected tool or source), not for its recency or as
        its tool's latest error."""
        entry = self._entries.get(seq) if seq > 0 else None
        if entry is None:
            return False
        return bool(_protection(entry, self._policy, entry.turn + self._policy.protection.last_turns + 1, set))

    def all(self) -> dict[int, str]:
        """seq -> reason, for every protected item."""
        return {seq: reason for seq in self._natural if (reason := self.of(seq))}


def _protection(entry: Entry, policy: Policy, turns: int, latest_errors: Callable[[], set[int]]) -> str:
    rules = policy.protection
    item = entry.item
    if entry.pinned:
        return "pinned"
    if item.role is Role.SYSTEM:
        return "system prompt"
    if item.role is Role.USER and rules.user_items:
        return "user instruction"
    if turns - entry.turn <= rules.last_turns:
        return f"{RECENT} {rules.last_turns} turns"
    if rules.latest_error_per_tool and entry.seq in latest_errors():
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


ELIGIBLE = Verdict(True, "", "")


def _abstain(why: str) -> Verdict:
    return Verdict(False, "ABSTAIN", why)


def _stand_in(text: str) -> bool:
    """Whether a call's input is a stand-in for the original (an object holding only a
    ``contextd`` note): never another command the model would read as its own."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and list(value) == ["contextd"] and isinstance(value["contextd"], str)


_INSERTABLE = (TextBlock, ImageBlock, DocumentBlock)


class Judge:
    """Decides the eligibility of the proposals of one render, in order.

    Evidence is kept whole: an item a decision rests on (in force, or
    accepted earlier in this render) is not itself reduced, and evidence
    must be an item shown in full that this render does not reduce.
    """

    def __init__(
        self,
        entries: Mapping[int, Entry],
        order: Sequence[int],
        protected: Protections,
        policy: Policy,
        relied_on: Mapping[int, int],
    ) -> None:
        self._entries = entries
        self._order = order
        """The history's seqs in their natural order (read, not copied: it is as long as the
        session, and stays as it is while the render judges)."""
        self._protected = protected
        self._policy = policy
        self._accepted: dict[int, int] = {}
        """evidence seq -> the seq whose reduction rests on it, of what this render accepts."""
        self._in_force = relied_on
        """Likewise of the edits in force (which grows with the session: read, not copied, and
        asked directly: a ChainMap's membership test runs a generator, at every candidate)."""
        # (A ChainMap writes to its first map only: the one below it is never changed.)
        self._relied_on: ChainMap[int, int] = ChainMap(self._accepted, relied_on)  # type: ignore[arg-type]
        self._reduced: set[int] = set()

    @functools.cached_property
    def _first_anchor(self) -> int:
        """Inserts go after the opening turn (or a later item): never among the system prompts."""
        systems = [s for s in self._order if self._entries[s].role is Role.SYSTEM]
        opening = next((s for s in self._order if self._entries[s].role is not Role.SYSTEM), None)
        return opening if opening is not None else max(systems, default=0) + 1

    @property
    def relied_on(self) -> Mapping[int, int]:
        """What the reductions in force and those accepted so far rest on: evidence seq ->
        the seq whose reduction rests on it (a read-only view, kept up to date)."""
        return MappingProxyType(self._relied_on)

    def lapses(self, seq: int) -> bool:
        """Whether item `seq` is protected only until the next turn (`Protections.lapses`)."""
        return self._protected.lapses(seq)

    def accept(self, proposal: Proposal) -> None:
        """Record an eligible proposal: its target and its evidence are spoken for."""
        seq = target_of(proposal.edit)
        if seq is not None:
            self._reduced.add(seq)
            for s in proposal.evidence_seqs:
                if s not in self._accepted and s not in self._in_force:
                    self._accepted[s] = seq

    def refused(self, proposal: Proposal) -> str:
        """KEEP or ABSTAIN when `judge` refuses `proposal` whatever else it reads (its target is
        the evidence for another reduction), as `judge` decides it; "" when that takes judging.
        Cheaper than judging, for the proposals refused at every render that go uncertified
        after the first (an edit's evidence stays whole for as long as the edit is in force)."""
        seq = target_of(proposal.edit)
        if seq is None or (seq not in self._accepted and seq not in self._in_force):
            return ""
        if seq not in self._entries or seq <= 0:
            return ""
        reason = self._protected.of(seq)
        if reason and proposal.on_entry and reason.startswith(RECENT):
            reason = self._protected.besides_recency(seq)
        return "KEEP" if reason else "ABSTAIN"

    def stands(self, proposal: Proposal, refused: str) -> bool:
        """Whether `refused` (what `refused` said of `proposal`) stands for as long as the edits in
        force do: its target is the evidence of one of them (not only of an edit this render
        accepts), and is not protected (protection does not begin while the pins and policy
        stand) or is protected for good."""
        seq = target_of(proposal.edit)
        if seq is None or seq not in self._in_force:
            return False
        return refused == "ABSTAIN" or self._protected.lasting(seq)

    def judge(self, proposal: Proposal, control: ControlMode, protection: bool = True) -> Verdict:
        """The eligibility of one proposal; an ineligible one says KEEP or ABSTAIN and why.
        Without `protection`: what it would be if its target were not protected."""
        edit = proposal.edit
        seq = target_of(edit)
        if seq is not None:
            if seq not in self._entries or seq <= 0:
                return _abstain(f"item {seq} is not in the history")
            reason = self._protected.of(seq) if protection else ""
            if reason and proposal.on_entry and reason.startswith(RECENT):
                reason = self._protected.besides_recency(seq)
            if reason:
                return Verdict(False, "KEEP", f"protected: {reason}", reason)
        if proposal.abstain:
            return _abstain(proposal.evidence or "the transform could not establish that it is safe")
        if not 0 <= proposal.level <= 4:
            return _abstain(f"level {proposal.level} is not on the evidence ladder (0-4)")
        allowed = proposal.compression and isinstance(proposal.edit, Replace) and self._policy.compression
        if control is ControlMode.RULE and proposal.level > self._policy.max_level and not allowed:
            return _abstain(
                f"level {proposal.level} ({LEVELS[proposal.level]}) is above the policy's maximum "
                f"of {self._policy.max_level}"
            )
        malformed = self._malformed(edit)
        if malformed:
            return _abstain(malformed)
        return self._evidence(proposal, seq)

    def _evidence(self, proposal: Proposal, seq: int | None) -> Verdict:
        if seq is not None and (seq in self._accepted or seq in self._in_force):
            return _abstain(f"item {seq} is the evidence for the reduction of item {self._relied_on[seq]}")
        for s in proposal.evidence_seqs:
            entry = self._entries.get(s)
            if s <= 0 or entry is None:
                return _abstain(f"the evidence names item {s}, which is not in the history")
            if s == seq:
                return _abstain("an item cannot be the evidence for its own reduction")
            if entry.representation is not Representation.FULL or s in self._reduced:
                return _abstain(f"the evidence, item {s}, is not shown in full")
        if proposal.level == 0 and seq is not None:
            # An identical copy is checked, not taken on trust.
            target = self._entries[seq].item.content_hash
            named = proposal.evidence_seqs
            if not named or any(self._entries[s].item.content_hash != target for s in named):
                return _abstain("claimed identical to items whose content differs (or none named)")
        return ELIGIBLE

    def _malformed(self, edit: Edit) -> str:
        """Why the edit cannot be applied as it stands ("" when it can)."""
        match edit:
            case Replace(seq, content):
                return _bad_replacement(self._entries[seq], content)
            case Insert(after_seq, content):
                if after_seq <= 0 or after_seq not in self._entries:
                    return f"inserts after item {after_seq}, which is not in the history"
                if after_seq < self._first_anchor:
                    return f"inserts after item {after_seq}, before the opening turn"
                if content.role not in (Role.USER, Role.ASSISTANT):
                    return f"inserts a {content.role.value} item: only user and assistant content may be inserted"
                if not content.content or not all(isinstance(b, _INSERTABLE) for b in content.content):
                    return "inserted content must be text, images or documents, and not empty"
            case Reorder(order):
                if sorted(order) != sorted(self._order) or len(set(order)) != len(order):
                    return "the new order is not a permutation of the history's items"
                moved = [
                    s
                    for s, o in zip(order, self._order, strict=True)
                    if s != o and self._entries[o].role is Role.SYSTEM
                ]
                if moved:
                    return "the new order moves a system prompt"
                opening = next((s for s in self._order if self._entries[s].role is not Role.SYSTEM), None)
                if opening is not None and opening != next(
                    s for s in order if self._entries[s].role is not Role.SYSTEM
                ):
                    return "the new order moves the opening turn (a conversation starts where it started)"
                if list(order) == list(self._order):
                    return "the new order is the history's own"
        return ""


def _bad_replacement(entry: Entry, content: tuple[Block, ...]) -> str:
    """Why `content` cannot stand in for the entry's item ("" when it can): no empty text,
    nothing forged (reasoning, calls other than the item's own: their inputs may be stood in
    for by a JSON object), and a tool output keeps some text to answer its call."""
    role = entry.role
    parts = [p for b in content for p in (b.content if isinstance(b, ToolResultBlock) else (b,))]
    bad = [
        type(b).__name__
        for b in content
        if isinstance(b, ReasoningBlock) or (isinstance(b, ToolResultBlock) and role is not Role.TOOL)
    ]
    if bad:
        return f"the replacement for a {role.value} item holds {', '.join(bad)}"
    calls = [b for b in content if isinstance(b, ToolUseBlock)]
    originals = entry.item.tool_uses
    if calls and [(c.id, c.name) for c in calls] != [(c.id, c.name) for c in originals]:
        # Without calls, the item's own are kept; with calls, they must be those, in order.
        return f"the replacement for a {role.value} item holds tool calls other than the item's own"
    for call, original in zip(calls, originals, strict=False):
        if call.input_json != original.input_json and not _stand_in(call.input_json):
            return 'a tool call\'s input in the replacement is neither its own nor a stand-in ({"contextd": TEXT})'
    if not parts or any(isinstance(p, TextBlock) and not p.text for p in parts):
        return f"the replacement for a {role.value} item is empty, or holds an empty text"
    if role is Role.TOOL and not any(isinstance(p, TextBlock) for p in parts):
        return "the replacement for a tool output must hold text (the rest of a tool result is not kept)"
    return ""
