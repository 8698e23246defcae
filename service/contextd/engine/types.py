"""The one transform primitive (DESIGN section 4): what a transform sees, and the edits it
proposes.

A transform sees the whole request (every item with its current
representation, the budget, the cache state, the focus, the policy) and
proposes edits. It decides nothing: each proposal states the evidence it
rests on, and the engine decides (eligibility, then timing) and writes the
decision down. Rules are sugar over this: a rule picks candidates with its
`when` predicates and hands them to one transform with its params. The
registry of transforms, built-in and installed, is transforms.py.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from contextd.engine.model import Block, Item, ItemContent, Representation, Role, ToolResultBlock, ToolUseBlock
from contextd.engine.observations import ObservationIndex
from contextd.engine.spans import Span

# ------------------------------------------------------------------ edits


@dataclass(frozen=True, slots=True)
class Replace:
    """Show `content` instead of the item (a reduced form); the original stays retrievable."""

    seq: int
    content: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class Remove:
    """Take the item out of the view, leaving a placeholder with its handle (or nothing at all)."""

    seq: int
    placeholder: bool = True
    note: str = ""
    """Said in the placeholder after the reason: where the content can still be seen
    (``identical to the output of call c3, seq 8``). Identity, never content."""


@dataclass(frozen=True, slots=True)
class Insert:
    """Add content that is not in the history, after item `after_seq`: the opening turn
    or a later item (nothing goes before the system prompt and the opening turn)."""

    after_seq: int
    content: ItemContent


@dataclass(frozen=True, slots=True)
class Reorder:
    """Show the items in this order of seqs (a permutation of those in the view)."""

    order: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PatchRequest:
    """Ask the client to set a field of its provider request (returned with the view)."""

    field: str
    value: Any


Edit = Replace | Remove | Insert | Reorder | PatchRequest


def target_of(edit: Edit) -> int | None:
    """The seq of the item an edit reduces, or None for edits that remove nothing."""
    return edit.seq if isinstance(edit, Replace | Remove) else None


@dataclass(frozen=True, slots=True)
class Proposal:
    """An edit and the claim that makes it safe."""

    edit: Edit
    level: int
    """Rung of the evidence ladder the claim is on (DESIGN section 5): 0 identical copy,
    1 same versioned source, 2 superseded, 3 completed work, 4 predicted irrelevant."""
    reason: str
    """A stable code, e.g. ``duplicate``, ``superseded``, ``errored_input``."""
    evidence: str = ""
    evidence_seqs: tuple[int, ...] = ()
    """Items the claim rests on (for level 0: items with the identical content)."""
    abstain: bool = False
    """The transform looked and could not establish safety: recorded as ABSTAIN."""
    compression: bool = False
    """A reduced form that keeps the item in the view (its fact lines verbatim, the rest
    said by line range, the handle named): allowed by the policy's `compression` switch
    rather than by its maximum level."""
    on_entry: bool = False
    """A compression the call that reads the output may read in its place: it applies while
    its target is protected only for being among the latest turns (the `compress` rule's
    `params.on_entry` kinds), before any cache holds the whole."""


# ---------------------------------------------------------- what it sees


class Entry(NamedTuple):
    """One history item as the view currently shows it.

    A NamedTuple rather than a frozen dataclass: every render builds one
    per item, and tuples are several times cheaper to make.
    """

    item: Item
    content: tuple[Block, ...]
    """The current representation (the original blocks when `representation` is full)."""
    representation: Representation
    tokens: int
    """Tokens of the current representation."""
    turn: int
    """Index of the turn the item belongs to (a user item, or an assistant item and its tool results)."""
    pinned: bool = False

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def role(self) -> Role:
        return self.item.role

    @property
    def name(self) -> str:
        return self.item.name

    @property
    def tool_result(self) -> ToolResultBlock | None:
        """The tool result as shown (for the original, see ``item.tool_result``)."""
        if self.item.role is Role.TOOL:
            for block in self.content:
                if isinstance(block, ToolResultBlock):
                    return block
        return None

    @property
    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolUseBlock))

    @property
    def tool_name(self) -> str:
        result = self.item.tool_result
        if result is not None:
            return result.name
        uses = self.item.tool_uses
        return uses[0].name if len(uses) == 1 else ""


@dataclass(frozen=True, slots=True)
class CacheState:
    """What the engine knows of the provider's prompt cache for this view."""

    previous_tokens: int
    """Tokens of the previous render the provider cached: all it sent, or those before the
    breakpoint the view placed in it (0: no previous render)."""
    age_seconds: float | None
    """Seconds since the previous render; None without one."""
    ttl_seconds: float
    breakpoints: tuple[int, ...] | None = None
    """Where the provider can read the previous render from when it reads only whole earlier
    prompts: their ends (token offsets in the previous render, ascending), still cached. None
    when it reads any prefix two prompts share."""

    @property
    def cold(self) -> bool:
        """Nothing cached to keep: no previous render, too old, or none of it cached."""
        return self.age_seconds is None or self.age_seconds > self.ttl_seconds or self.breakpoints == ()

    def read_until(self, position: int) -> int:
        """How far the next call reads the previous render from the cache when its prompt first
        differs from it at token `position`: what comes after is written again."""
        if self.breakpoints is None:
            return position
        at = bisect_right(self.breakpoints, position)
        return self.breakpoints[at - 1] if at else 0


ReadAgain = tuple[tuple[str, int, Span], ...]
"""Reads of line ranges: (path, the seq of the output, the lines read)."""


@dataclass(frozen=True, slots=True)
class TransformContext:
    entries: Sequence[Entry]
    """The view's entries in view order, as the edits in force show them: a sequence that never
    changes (read as a tuple; its slices are tuples: engine/blocks.py)."""
    budget_tokens: int
    """0: no budget."""
    view_tokens: int
    """Tokens of the view as it stands before this transform."""
    cache: CacheState
    focus: tuple[str, ...]
    """Identifiers the next call is about: the request's, then those of the latest tool calls and
    user turn, the newer first (stages/propose.py, `focus_terms`)."""
    requested_focus: tuple[str, ...] = ()
    """The focus terms the client gave with the request (the first of `focus`)."""
    searched: tuple[str, ...] = ()
    """What the recent calls searched for or named, as a shell user means it (asked.py): taken
    as the agent's own focus, however plain the word."""
    read_again: ReadAgain = ()
    """The line ranges the recent calls read of files (asked.py, `ranges_read`): those lines,
    in another output of the same file, are what the agent looked at again."""
    tools: tuple[Mapping[str, Any], ...] = ()
    """The provider tool schemas sent with the request, when the client gave them."""
    tool_effects: Mapping[str, Any] = field(default_factory=dict)
    """The policy's tool declarations by tool name."""
    turns: int = 0
    """Turns in the history (whatever order the view shows them in): an entry is
    ``turns - 1 - entry.turn`` turns old."""
    observations: ObservationIndex = field(default_factory=lambda: ObservationIndex({}))
    """The session's tool calls with their results, as evidence (what each read and wrote)."""
    by_seq: Mapping[int, Entry] = field(default_factory=dict)
    """The entries by seq (history items and inserted content)."""

    @property
    def utilization(self) -> float:
        return self.view_tokens / self.budget_tokens if self.budget_tokens else 0.0


class Transform(Protocol):
    name: ClassVar[str]
    version: ClassVar[str]
    """Changes whenever the transform's output for the same input may change."""

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterable[Proposal]:
        """Edits for (some of) `candidates`, each with the claim that makes it safe."""
        ...


@runtime_checkable
class Incremental(Transform, Protocol):
    """A transform whose proposal for a candidate is about that candidate alone (made in the
    candidates' order), and rests on the entry as shown, on whether it is of the latest turn,
    and on what `keys` names: a render that follows another (the carry) asks it again only
    for the candidates whose keys something since touched, those of the latest turn then,
    and those new or shown otherwise since, and takes what it proposed for the others as it
    stands (stages/ledger.py). The keys:

    * ``("shown output", hash)``: whether the outputs equal to this one are shown in full;
    * ``("covered", seq)``: the reads of a path that cover what item `seq` read of it, earlier
      or later: appended since, or shown otherwise since;
    * ``("run", tool, command)``: a later run of the same command;
    * ``("fixed", family)``: a later call of a check of that family (checks.py) that did not fail;
    * ``("answer", call_id)``: the result of tool call `call_id`, once appended;
    * ``("completions",)``: the spans of work marked complete, and their outcomes as shown;
    * ``("focus",)``: the request's focus, what the recent calls searched for, and the
      identifiers of the latest turns.
    """

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> Iterable[Hashable]:
        """What the proposal for `entry` (as `propose` would make it now) rests on, beyond the entry."""
        ...


@dataclass(frozen=True, slots=True)
class FocusChange:
    """How the focus changed since the render a carry is of, by its parts: what changed of
    each may concern a few entries only (`ReadsFocusTerms`)."""

    given: frozenset[str]
    """The terms given (the request's focus, what the recent calls searched for) that one focus
    has and the other has not."""
    derived: frozenset[str]
    """Likewise of the render's focus (`TransformContext.focus`: the identifiers of the latest turns)."""
    paths: frozenset[str]
    """The files whose lines read again (`TransformContext.read_again`) changed."""


@runtime_checkable
class ReadsFocusTerms(Incremental, Protocol):
    """An `Incremental` transform whose proposal for an entry that rests on ``("focus",)`` may
    rest on a part of the focus only (the terms that can occur in the entry, the lines read
    again of the file it shows): a render that follows another asks it again only about the
    entries that `concerned` says so of."""

    def concerned(self, context: TransformContext, change: FocusChange) -> Concerned:
        """Of the entries whose proposal rests on the focus, which `change` may change it for."""
        ...


@dataclass(frozen=True, slots=True)
class Concerned:
    """Which entries resting on the focus a change to it may change the proposal for
    (`ReadsFocusTerms.concerned`): `test` says it of one; `reach`, when it can be said, where
    to look for them (a long session has hundreds of outputs resting on the focus, and most
    changes concern a few)."""

    test: Callable[[Entry], bool]
    reach: tuple[frozenset[Hashable], ...] | None = None
    """Only an entry whose `handles` hold all of one of these sets may be concerned; None:
    any entry may be."""
    handles: Callable[[Entry], frozenset[Hashable] | None] | None = None
    """What of a change may reach the proposal for an entry (the words of its output, the files
    it shows; None: any change may), whatever the change: the same for an entry from one render
    to the next (the ledger keeps the entries by them: stages/ledger.py, `Reach`). Without it
    (or without `reach`), every entry resting on the focus is tested."""


def prunable(entry: Entry) -> bool:
    """Whether a candidate entry may still be pruned: shown whole, or compressed (a candidate
    reduced is compressed, and a prune the policy allows may replace a compression)."""
    return entry.representation in (Representation.FULL, Representation.REDUCED)
