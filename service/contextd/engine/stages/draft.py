"""The draft of one render: the history's entries as edits are applied to them, and what
an edit occupies and gives its target.

The draft is the one mutable value of a render, on purpose: a render applies its edits one
at a time to thousands of entries (load those in force, apply this render's, budget its
offloads, reading the view's tokens after each), and a copy per edit would cost the whole
history every time. The stages that apply edits change it; the others only read it. A
carry hands the finished draft to the next render, which appends to it in place (`append`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contextd.engine.asked import RECENT_CALLS
from contextd.engine.blocks import Blocked, Blocks
from contextd.engine.codec import content_hash
from contextd.engine.compress.strategy import COMPRESSED
from contextd.engine.eligibility import Protections
from contextd.engine.model import Block, Item, Representation, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.observations import ObservationIndex
from contextd.engine.placeholders import placeholder_blocks, turns_in, with_calls
from contextd.engine.policy import Policy, ToolDeclaration
from contextd.engine.state import AppliedEdit
from contextd.engine.types import Edit, Entry, Insert, PatchRequest, Remove, Reorder, Replace

_INSERTED_AT = datetime(1970, 1, 1, tzinfo=UTC)  # content a transform inserted has no time of its own


def turn_indexes(items: Sequence[Item]) -> list[int]:
    """The turn of each item: a user item, or an assistant item with the tool results that follow it."""
    turns, current = [], -1
    for item in items:
        if item.role in (Role.USER, Role.ASSISTANT) or current < 0:
            current += 1
        turns.append(current)
    return turns


BUDGET = "budget"
"""The rule and reason of what is offloaded to fit a view's token budget (stages/budget.py)."""


class Draft:
    """The entries of one render as edits are applied to them."""

    def __init__(
        self,
        items: Sequence[Item],
        pins: frozenset[int],
        tools: Mapping[str, ToolDeclaration],
        retracted: frozenset[int] = frozenset(),
    ) -> None:
        turns = turn_indexes(items)
        self.retracted = retracted
        """Items the client retracted (engine/retraction.py): in the draft, but no evidence."""
        self.entries: dict[int, Entry] = {
            item.seq: Entry(item, item.content, Representation.FULL, item.token_count, turn, item.seq in pins)
            for item, turn in zip(items, turns, strict=True)
        }
        self.natural: list[int] = [item.seq for item in items]
        self.turns = turns[-1] + 1 if turns else 0
        self.order: list[int] = list(self.natural)
        """History items in the order shown."""
        self.reordered = False
        """Whether a reorder is in force (`order` is not `natural`, or was not at some point)."""
        self.inserted: list[tuple[int, int]] = []
        """(after_seq, seq) of inserted entries, in the order they were inserted."""
        self.patches: dict[str, Any] = {}
        self.view_tokens = sum(item.token_count for item in items)
        """Tokens of the entries shown (kept as edits are applied)."""
        self.history_tokens = self.view_tokens
        """Tokens of the history's items as they are, whatever is applied."""
        self.latest_results: dict[str, int] = {}
        """tool name -> seq of its latest result."""
        self.latest_user: Item | None = None
        self.latest_calls: Item | None = None
        """The latest assistant item that called tools."""
        self.recent_calls: tuple[Item, ...] = ()
        """The latest `asked.RECENT_CALLS` assistant items that called tools, oldest first."""
        self.observations = ObservationIndex(tools)
        self._note(items)
        self._ordered: list[Entry] | None = None
        """The entries in view order, changed in place as edits apply and items are appended
        (None: listed again when asked, after an insert or a reorder)."""
        self._blocked = Blocked()
        """`_ordered` as `ordered()` hands it out, told of what changed in place."""
        self._given: Blocks[Entry] | None = None
        """What `ordered()` handed out last, while `_ordered` is as it was then."""
        self.budget_walk: BudgetWalk | None = None
        """The turns the budget's last walk left unsettled (stages/budget.py), for the next render
        of a draft that follows this one to walk those alone."""
        self.touched: set[int] = set()
        """Seqs whose entries an edit changed since `budget_walk` was taken (none is kept
        without one)."""
        self.kept_turns: list[int] | None = None
        """The turns the budget's last walk of whole turns found kept for good, by their first
        seqs, in order: where the next walk resumes (stages/budget.py, `whole_turns`)."""
        self.message_count: MessageCount | None = None
        """The budget's last count of the messages the entries render to (stages/messages.py)."""
        self.offloaded: set[int] = set()
        """Items the budget left behind a placeholder each (stages/budget.py)."""
        self.runs: dict[int, tuple[int, int]] = {}
        """The runs of whole turns the budget left out behind one marker: the seq of the item
        holding the marker -> the run's first and last seqs."""
        self.run_starts: dict[int, int] = {}
        """A run's first seq -> its last."""
        self.run_ends: dict[int, int] = {}
        """A run's last seq -> its marker's."""

    def _note(self, items: Iterable[Item]) -> None:
        """Keep the latest result of each tool, the latest user item and the latest calls."""
        if self.retracted:
            items = [item for item in items if item.seq not in self.retracted]
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
                self.recent_calls = (*self.recent_calls, item)[-RECENT_CALLS:]

    def append(self, items: Sequence[Item], pins: frozenset[int]) -> None:
        """Append the items since (`items`: the whole history) to this finished draft, in place:
        what building a draft from `items` and applying this one's edits in the same order
        would give. The carry that held it is spent (`Finished.claim`, taken first)."""
        new = items[len(self.natural) :]
        turn = self.turns - 1
        entries = self.entries
        for item in new:
            if item.role in (Role.USER, Role.ASSISTANT) or turn < 0:
                turn += 1
            entries[item.seq] = Entry(item, item.content, Representation.FULL, item.token_count, turn, item.seq in pins)
            self.view_tokens += item.token_count
            self.history_tokens += item.token_count
        seqs = [item.seq for item in new]
        # (Listed before the order takes the new seqs; nothing is inserted after appended items.)
        self._listed().extend(entries[s] for s in seqs)
        self._given = None
        self.natural += seqs  # (in place: what held it during the render before let go of it)
        self.turns = turn + 1
        self.order += seqs  # appended items follow, whatever order is in force
        self._note(new)

    def protections(self, policy: Policy) -> Protections:
        """Why each of the draft's items is protected under `policy` (asked as needed)."""
        return Protections(self.entries, self.natural, self.turns, policy, self.latest_results)

    def apply(self, applied: AppliedEdit) -> None:
        edit = applied.edit
        match edit:
            case Replace(seq):
                self._set(seq, applied.content, Representation.REDUCED, applied.tokens)
                self._budget(seq, False, "")
            case Remove(seq, placeholder, note):
                kind = Representation.PLACEHOLDER if placeholder else Representation.OMITTED
                self._set(seq, applied.content, kind, applied.tokens)
                self._budget(seq, applied.rule == BUDGET and placeholder, note)
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
                self._ordered = self._given = None
            case Reorder():
                self.order = reordered(edit, self.order)
                self.reordered = True
                self._ordered = self._given = None
            case PatchRequest(name, value):
                self.patches[name] = value

    def _budget(self, seq: int, placeholder: bool, note: str) -> None:
        """Keep what the budget holds: `seq` behind its placeholder (`placeholder`, with `note`),
        or not (any other edit)."""
        if seq in self.runs:  # (a run that grew: its marker is said again, or moved on)
            first, last = self.runs.pop(seq)
            del self.run_starts[first], self.run_ends[last]
        run = turns_in(note) if placeholder else None
        if run is not None:
            self.runs[seq] = run[0], run[-1]
            self.run_starts[run[0]], self.run_ends[run[-1]] = run[-1], seq
            self.offloaded.discard(seq)
        elif placeholder:
            self.offloaded.add(seq)
        else:
            self.offloaded.discard(seq)

    def _set(self, seq: int, content: tuple[Block, ...], kind: Representation, tokens: int) -> None:
        old = self.entries[seq]
        if self.budget_walk is not None:  # (else the next walk goes through every turn)
            self.touched.add(seq)
        entry = self.entries[seq] = Entry(old.item, content, kind, tokens, old.turn, old.pinned)
        self.view_tokens += _shown_tokens(kind, tokens) - _shown_tokens(old.representation, old.tokens)
        if self._ordered is not None:
            self._place(seq, entry)

    def _place(self, seq: int, entry: Entry) -> None:
        """Put `entry` where `seq` stands in the entries in view order: while nothing is
        reordered or inserted, that is its place in history (bisected); else they are listed
        again when asked. What `ordered()` handed out stays as it was (blocks.py)."""
        ordered, natural = self._ordered, self.natural
        at = bisect_left(natural, seq)
        if ordered is None or self.reordered or self.inserted or at == len(natural) or natural[at] != seq:
            self._ordered = self._given = None
            return
        ordered[at] = entry
        self._blocked.changed(at)
        self._given = None

    def ordered(self) -> Blocks[Entry]:
        """The entries in view order, as blocks that never change (those of what it handed out
        before are shared where nothing changed since: compared block by block,
        `memo.shared_prefix` finds where they first differ without going through the rest)."""
        if self._given is None:
            listed = self._listed()  # (first: listing again starts its blocks afresh)
            self._given = self._blocked.blocks(listed)
        return self._given

    def _listed(self) -> list[Entry]:
        """`_ordered`, listed again if an edit left it unknown."""
        if self._ordered is None:
            self._ordered = self._in_view_order()
            self._blocked = Blocked()  # (another list: its blocks are made afresh)
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

    def leading_system(self) -> Iterator[Item]:
        """The system items the history opens with (the prompt a provider caches first)."""
        for seq in self.natural:
            item = self.entries[seq].item
            if item.role is not Role.SYSTEM:
                return
            yield item


def _shown_tokens(kind: Representation, tokens: int) -> int:
    return 0 if kind is Representation.OMITTED else tokens


def reordered(edit: Reorder, order: Sequence[int]) -> list[int]:
    """The history's seqs in `edit`'s order; those appended since it was decided follow, in `order`."""
    listed = list(edit.order)
    known = set(listed)
    return listed + [s for s in order if s not in known]


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


def is_compression(applied: AppliedEdit) -> bool:
    """Whether an edit in force is a built-in compression (it keeps the item's facts in the view)."""
    return isinstance(applied.edit, Replace) and applied.reason.startswith(COMPRESSED)


@dataclass(frozen=True, slots=True)
class BudgetWalk:
    """What a render's budget walk found (stages/budget.py): every turn of the history's seqs
    below `until` is settled but those that open at `unsettled`. A settled turn has nothing the
    budget may offload (each entry is left out already, reduced otherwise, or no larger than its
    placeholder) or one of its entries is protected for good (pinned, a system or user item, a
    protected tool or source) or the evidence of an edit in force (which stays in force while
    the draft is followed): as long as no edit changes one of its entries, no later walk
    offloads from it. Token figures are `counter`'s."""

    counter: object
    unsettled: tuple[int, ...]
    until: int


@dataclass(frozen=True, slots=True)
class MessageCount:
    """How many messages the entries `entries` (in view order) render to in `format`: the state of
    the count after each entry (its messages so far first), for a later count to go on from where
    its entries first differ (stages/messages.py)."""

    format: Any
    entries: Sequence[Entry]
    after: list[tuple[int, str | None, bool, bool]]

    def footprint(self) -> int:
        """About how many bytes it holds: a state an entry (a tuple of four, its count, its slot)."""
        return 112 * len(self.after)
