"""Views: a session's history rendered for one model call (DESIGN section 3).

The pipeline (pipeline.py) decides how each item appears; this module turns
the result into the provider's format and counts it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any, NamedTuple

from contextd.engine.blocks import Blocked, Blocks
from contextd.engine.codec import blocks_to_json, canonical_json
from contextd.engine.memo import IdentityMemo, shared_prefix, take_over
from contextd.engine.model import Block, Representation, Session
from contextd.engine.placeholders import handle_of
from contextd.engine.render.anthropic import AnthropicFolder
from contextd.engine.render.base import Folder, Rendered, ViewWarning, to_json
from contextd.engine.render.converse import ConverseFolder
from contextd.engine.render.openai import OpenAIFolder
from contextd.engine.render.responses import ResponsesFolder
from contextd.engine.state import Counted, Segment
from contextd.engine.tokens import TokenCounter, block_tokens
from contextd.engine.types import Entry

FRAMING_TOKENS_PER_MESSAGE = 3
"""Role and separator tokens a provider wraps each message in (OpenAI's
published figure for its chat models; used as the estimate for both)."""

REPLY_PRIMING_TOKENS = 3
"""Tokens that prime the assistant's reply, once per request."""


class ViewFormat(StrEnum):
    OPENAI_CHAT = "openai_chat"
    ANTHROPIC_MESSAGES = "anthropic_messages"
    OPENAI_RESPONSES = "openai_responses"
    BEDROCK_CONVERSE = "bedrock_converse"


@dataclass(frozen=True, slots=True)
class ViewRequest:
    format: ViewFormat
    budget_tokens: int = 0
    """0 means no budget."""
    focus: tuple[str, ...] = ()
    place_breakpoint: bool = False
    """The caller lets the view place the prompt-cache breakpoint (engine/breakpoint.py)."""


class ViewItem(NamedTuple):
    seq: int
    representation: Representation
    tokens: int
    message_index: int
    handle: str = ""


@dataclass(frozen=True, slots=True)
class View:
    session_id: str
    version: int
    format: ViewFormat
    encoding: str
    message_parts: Sequence[str]
    """Each message as JSON, in order: the view's messages are their join (`messages_json`),
    made only when asked for (the service sends the parts, encoded a block at a time). A
    sequence that never changes: `Blocks` of the list a later render resumes (blocks.py)."""
    system_json: str
    """The top-level ``system`` as JSON (Anthropic, Converse); empty when there is none."""
    items: Sequence[ViewItem]
    """In seq order (a sequence that never changes, as `message_parts`)."""
    item_tokens: int
    framing_tokens: int
    total_tokens: int
    budget_tokens: int
    over_budget: bool
    warnings: tuple[ViewWarning, ...]
    policy_version: str = ""
    request_patch_json: str = "{}"
    """Provider request fields the view asks the client to set."""
    view_version: int = 0
    stable_prefix_tokens: int = 0
    """Tokens at the start identical to the previous render's (what a prompt cache can reuse)."""
    cache_breakpoint_seq: int = 0
    """The last item the call should cache, when the view placed the breakpoint before the
    items after it; 0: at the end."""
    retracted_items: int = 0
    """How many of the session's items a client retracted (a retraction leaves `version`)."""

    @property
    def messages_json(self) -> str:
        """The view's messages as one JSON array (a copy as long as the view: on a long
        session, megabytes each time it is asked for)."""
        return "[" + ",".join(self.message_parts) + "]"


_FOLDERS: dict[ViewFormat, Callable[[Rendered], Folder]] = {
    ViewFormat.OPENAI_CHAT: OpenAIFolder,
    ViewFormat.ANTHROPIC_MESSAGES: AnthropicFolder,
    ViewFormat.OPENAI_RESPONSES: ResponsesFolder,
    ViewFormat.BEDROCK_CONVERSE: ConverseFolder,
}


_digests: IdentityMemo[str] = IdentityMemo(100_000)


def representation_digest(blocks: tuple[Block, ...]) -> str:
    """Identifies a representation; remembered, as edits in force come back on every render."""
    return _digests.get((blocks,), lambda: hashlib.sha256(canonical_json(blocks_to_json(blocks))).hexdigest()[:16])


class _Mark(NamedTuple):
    """An assembly's state before one entry, and whether that entry opened a message."""

    messages: int
    warnings: int
    items: int
    segments: int
    offset: int
    inserted: int
    item_tokens: int
    in_order: bool
    last: int
    folder: Hashable
    opens: bool


@dataclass(slots=True, eq=False)
class Assembly:
    """A view rendered, counted and itemized entry by entry.

    A later render in the same format resumes it: everything up to the last
    entry that opened a message before the first entry that differs (entries
    of unchanged items are the same objects from render to render, compared at
    pointer speed: `shared_prefix`) is taken as it is (in place, once: `_resumed`), and only the rest is
    rendered again.
    """

    format: ViewFormat
    counter: TokenCounter
    entries: Sequence[Entry]
    rendered: Rendered
    items: list[ViewItem]
    """In view order."""
    segments: list[Segment]
    offsets: dict[int, int]
    """seq -> tokens before its segment (the first, for an item shown in pieces)."""
    marks: list[_Mark]
    offset: int = 0
    inserted: int = 0
    """Tokens of inserted content shown."""
    item_tokens: int = 0
    """The items' tokens, summed as they are itemized."""
    in_order: bool = True
    last: int = 0
    taken: bool = False
    """A later render resumed this assembly: its lists are that render's now."""
    kept: int = 0
    """How many leading segments are those of the assembly it resumed (the same objects)."""
    shown: Sequence[Segment] = ()
    """`segments` as the view's record holds them (stages/show.py), never changed."""
    counted: Counted | None = None
    """Its offsets, for the state's record of the render (`PreviousRender.counted`): marked
    taken with the assembly."""
    item_blocks: Blocked = field(default_factory=Blocked)
    """`items` as handed out (`View.items`), told of its cuts."""
    segment_blocks: Blocked = field(default_factory=Blocked)
    """`segments` as handed out (`shown`), told of its cuts."""


def assemble_view(
    session: Session,
    entries: Sequence[Entry],
    request: ViewRequest,
    counter: TokenCounter,
    warnings: Sequence[ViewWarning] = (),
    patches: Mapping[str, Any] | None = None,
    previous: Assembly | None = None,
    known: int = 0,
) -> tuple[View, Assembly]:
    """Render the entries (in view order) and count; the assembly holds the segments a
    later render compares against, and is what a later render resumes (`previous`; `known`:
    how many leading entries of `entries` are its entries', the same objects)."""
    asm, folder, start, redo = _resumed(previous, entries, request.format, counter, known)
    _fold(asm, folder, start, redo)
    asm.counted = Counted(asm.offsets)
    folder.finish()
    rendered = asm.rendered
    view_items = (
        asm.item_blocks.blocks(asm.items) if asm.in_order else Blocks.of(sorted(asm.items, key=attrgetter("seq")))
    )
    item_tokens = asm.item_tokens + asm.inserted
    frames = len(rendered.messages) + (1 if rendered.system is not None else 0)
    framing = frames * FRAMING_TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS if frames else 0
    total = item_tokens + framing
    notes = [*warnings, *rendered.warnings]
    over = request.budget_tokens > 0 and total > request.budget_tokens
    if over:
        notes.append(
            ViewWarning(
                "OVER_BUDGET",
                f"the view is {total:,} tokens, {total - request.budget_tokens:,} over the budget of "
                f"{request.budget_tokens:,}; the session's rules found nothing more they may remove",
            )
        )
    view = View(
        session_id=session.id,
        version=session.version,
        format=request.format,
        encoding=counter.encoding,
        message_parts=rendered.json_blocks.blocks(rendered.messages_json),
        system_json=to_json(rendered.system) if rendered.system is not None else "",
        items=view_items,
        item_tokens=item_tokens,
        framing_tokens=framing,
        total_tokens=total,
        budget_tokens=request.budget_tokens,
        over_budget=over,
        warnings=tuple(notes),
        policy_version=session.policy_version,
        request_patch_json=to_json(dict(patches or {})),
    )
    return view, asm


def _resumed(
    previous: Assembly | None, entries: Sequence[Entry], fmt: ViewFormat, counter: TokenCounter, known: int
) -> tuple[Assembly, Folder, int, set[int]]:
    """A new assembly of `entries`, with what `previous` already did for them; where to go on;
    and the seqs whose offsets the previous render counted and this one counts again (their
    first segment from there on).

    The new assembly takes the previous one's lists over, cut back to where it goes on (a
    cost in what changed, not in the view's length), and marks it taken: an assembly
    resumed once is not resumed again (another render from the same carry, or one after a
    render that failed half-way, renders its view whole)."""
    # A taken assembly is another render's (or was cut back by one that failed half-way): its
    # lists say nothing of this one's entries.
    if previous is not None and not previous.taken and previous.format is fmt and previous.counter is counter:
        same = shared_prefix(previous.entries, entries, known)
        # Resume at an entry both share that opened a message: the messages before it are final.
        start = next((i for i in range(same - 1, 0, -1) if previous.marks[i].opens), 0)
        if start and take_over(previous):
            if previous.counted is not None:
                previous.counted.taken = True
            mark, rendered = previous.marks[start], previous.rendered
            del rendered.messages[mark.messages :]
            del rendered.warnings[mark.warnings :]
            rendered.cut_json(mark.messages)
            redo = set()
            for entry in previous.entries[start:]:
                seq = entry.item.seq
                rendered.message_index.pop(seq, None)
                rendered.omitted.discard(seq)
                rendered.dropped.pop(seq, None)
                redo.add(seq)
            folder = _FOLDERS[fmt](rendered)
            folder.resume(mark.folder)
            items, segments, marks = previous.items, previous.segments, previous.marks
            previous.item_blocks.cut(items, mark.items)
            previous.segment_blocks.cut(segments, mark.segments)
            del marks[start:]
            # The offsets are taken over with the rest: the state's record of the previous
            # render reads them only until now (`PreviousRender.counted`, marked taken above),
            # and counts them from its segments after.
            asm = Assembly(
                fmt,
                counter,
                entries,
                rendered,
                items,
                segments,
                previous.offsets,
                marks,
                mark.offset,
                mark.inserted,
                mark.item_tokens,
                mark.in_order,
                mark.last,
                kept=mark.segments,
                item_blocks=previous.item_blocks,
                segment_blocks=previous.segment_blocks,
            )
            return asm, folder, start, redo
    rendered = Rendered()
    return Assembly(fmt, counter, entries, rendered, [], [], {}, []), _FOLDERS[fmt](rendered), 0, set()


def _fold(asm: Assembly, folder: Folder, start: int, redo: set[int]) -> None:
    """Render, count and itemize the entries from `start` on, marking the state before each.

    This runs over every new entry of every render (over all of them when
    nothing can be resumed): a plain loop, the common case (an item shown in
    full) first and inline.
    """
    out, counter = folder.out, asm.counter
    full, left_out = Representation.FULL, Representation.OMITTED
    omitted, index_of, dropped = out.omitted, out.message_index, out.dropped
    items, segments, offsets, marks = asm.items, asm.segments, asm.offsets, asm.marks
    offset, inserted, item_tokens, in_order, last = asm.offset, asm.inserted, asm.item_tokens, asm.in_order, asm.last
    entries = asm.entries
    for i in range(start, len(entries)):
        entry = entries[i]
        seq, kind, tokens = entry.item.seq, entry.representation, entry.tokens
        messages, warnings, state = len(out.messages), len(out.warnings), folder.state()
        opens = kind is not left_out and folder.feed(entry)
        marks.append(
            _Mark(
                messages,
                warnings,
                len(items),
                len(segments),
                offset,
                inserted,
                item_tokens,
                in_order,
                last,
                state,
                opens,
            )
        )
        if kind is full and seq > 0:
            if seq not in omitted:
                segments.append(Segment(seq, "", tokens))
                if seq in redo:
                    redo.discard(seq)
                    offsets[seq] = offset
                else:
                    offsets.setdefault(seq, offset)
                offset += tokens
            in_order, last = in_order and seq > last, seq
            index = index_of.get(seq, -1)
            if index >= 0 and seq not in dropped:
                items.append(ViewItem(seq, full, tokens, index))
                item_tokens += tokens
            else:
                items.append(_view_item(entry, out, counter))
                item_tokens += items[-1].tokens
            continue
        # Inserted content has no history of its own to compare: its digest tells it apart.
        shown = _shown.get((entry.item, entry.content), lambda entry=entry: _Shown(entry))  # type: ignore[misc]
        if kind is not left_out:
            inserted += tokens if seq < 0 else 0
            if seq not in omitted:
                segments.append(shown.segment)
                if seq in redo:
                    redo.discard(seq)
                    offsets[seq] = offset
                else:
                    offsets.setdefault(seq, offset)
                offset += tokens
        if seq <= 0:
            continue
        in_order, last = in_order and seq > last, seq
        items.append(_view_item(entry, out, counter, shown.handle))
        item_tokens += items[-1].tokens
    asm.offset, asm.inserted, asm.item_tokens, asm.in_order, asm.last = offset, inserted, item_tokens, in_order, last
    for seq in redo:  # no longer shown where the render resumed
        offsets.pop(seq, None)


class _Shown:
    """What an entry not shown as its original is compared and recovered by (all of
    it follows from the item and what stands in for it)."""

    __slots__ = ("handle", "segment")

    def __init__(self, entry: Entry) -> None:
        self.segment = Segment(entry.seq, representation_digest(entry.content), entry.tokens)
        self.handle = handle_of(entry.item) if entry.seq > 0 else ""


_shown: IdentityMemo[_Shown] = IdentityMemo(100_000)


def _view_item(entry: Entry, rendered: Rendered, counter: TokenCounter, handle: str | None = None) -> ViewItem:
    """How an item appears in the view, with the tokens of what the view actually carries."""
    index = rendered.message_index.get(entry.seq, -1)
    full = entry.representation is Representation.FULL
    handle = handle if handle is not None else handle_of(entry.item)
    if entry.representation is Representation.OMITTED or entry.seq in rendered.omitted:
        return ViewItem(entry.seq, Representation.OMITTED, 0, -1, handle)
    dropped = rendered.dropped.get(entry.seq)
    if not dropped:
        return ViewItem(entry.seq, entry.representation, entry.tokens, index, "" if full else handle)
    # Counting only what the format left out keeps the common, complete case free.
    tokens = max(0, entry.tokens - sum(block_tokens(b, counter) for b in dropped))
    kind = Representation.REDUCED if entry.representation is Representation.FULL else entry.representation
    return ViewItem(entry.seq, kind, tokens, index, handle)
