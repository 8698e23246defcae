"""What a renderer returns, shared by the provider formats."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from contextd.engine.blocks import Blocked
from contextd.engine.codec import b64_text
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Block, Role, ToolResultBlock

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ViewWarning:
    code: str
    """Stable, e.g. ``REASONING_DROPPED``."""
    message: str


class Renderable(Protocol):
    """What a renderer reads: an Item, or an Entry (an item as a view shows it)."""

    @property
    def seq(self) -> int: ...
    @property
    def role(self) -> Role: ...
    @property
    def name(self) -> str: ...
    @property
    def content(self) -> tuple[Block, ...]: ...
    @property
    def tool_result(self) -> ToolResultBlock | None: ...


def sources(shown: Renderable) -> tuple[object, ...]:
    """The objects a rendering of `shown` is computed from (for IdentityMemo)."""
    return (getattr(shown, "item", shown), shown.content)


@dataclass(slots=True)
class Rendered:
    """Messages in a provider's format, and where each item landed."""

    messages: list[JsonObject] = field(default_factory=list)
    system: str | list[JsonObject] | None = None
    """The top-level ``system`` (Anthropic, Converse); always None for the OpenAI formats."""
    message_index: dict[int, int] = field(default_factory=dict)
    """seq -> index in ``messages``; -1 for the system field or a left-out item."""
    omitted: set[int] = field(default_factory=set)
    """Seqs of items the format could not carry at all (each has a warning)."""
    dropped: dict[int, list[Block]] = field(default_factory=dict)
    """seq -> blocks of that item the format could not carry (the rest of the item is in the view)."""
    warnings: list[ViewWarning] = field(default_factory=list)
    messages_json: list[str] = field(default_factory=list)
    """Each message serialized, once it is final (all of them after `Folder.finish`):
    the view's JSON is their join."""
    json_chars: int = 0
    """The characters of `messages_json`, kept as they are added (`add_json`) and cut."""
    json_blocks: Blocked = field(default_factory=Blocked, compare=False, repr=False)
    """`messages_json` as handed out (`View.message_parts`), told of its cuts."""

    def add_json(self, texts: Sequence[str]) -> None:
        self.messages_json.extend(texts)
        self.json_chars += sum(map(len, texts))

    def cut_json(self, messages: int) -> None:
        """Keep the first `messages` serialized messages."""
        self.json_chars -= sum(map(len, self.messages_json[messages:]))
        self.json_blocks.cut(self.messages_json, messages)

    def warn(self, code: str, message: str) -> None:
        self.warnings.append(ViewWarning(code, message))

    def drop(self, seq: int, blocks: Sequence[Block], code: str, message: str) -> None:
        """Leave `blocks` of item `seq` out of the view, and say why."""
        self.dropped.setdefault(seq, []).extend(blocks)
        self.warn(code, message)

    def take(self, notes: Notes) -> None:
        """Hear what the format could not carry of an item rendered apart."""
        if notes is NO_NOTES:
            return
        self.warnings.extend(notes.warnings)
        for seq, blocks in notes.dropped:
            self.dropped.setdefault(seq, []).extend(blocks)


@dataclass(frozen=True, slots=True)
class Notes:
    """What the format could not carry of one item, kept with the item's rendering (in a
    `Rendered` of its own that would be six containers an item, nearly always empty)."""

    warnings: tuple[ViewWarning, ...] = ()
    dropped: tuple[tuple[int, tuple[Block, ...]], ...] = ()
    """(seq, the blocks of that item left out), in the order they were."""

    @staticmethod
    def of(scratch: Rendered) -> Notes:
        """The notes an item's rendering into `scratch` made."""
        if not scratch.warnings and not scratch.dropped:
            return NO_NOTES
        return Notes(tuple(scratch.warnings), tuple((seq, tuple(blocks)) for seq, blocks in scratch.dropped.items()))


NO_NOTES = Notes()


class Folder(Protocol):
    """Renders items one at a time into `out`. What it carries from one item to the
    next is `state()`, so a later render can resume it at any item that opened a
    message, on a copy of `out` cut back to that point."""

    out: Rendered

    def feed(self, item: Renderable) -> bool:
        """Render one more item; True when it opened a new message."""
        ...

    def state(self) -> Hashable:
        """What the next item's rendering depends on, besides `out` (immutable)."""
        ...

    def resume(self, state: Hashable) -> None: ...

    def finish(self) -> None:
        """Make every message final (serialized into `out.messages_json`)."""
        ...


@dataclass(frozen=True, slots=True)
class Piece:
    """One item's messages in a format where each item renders apart (none: left out),
    serialized, with what the format could not carry."""

    messages: tuple[JsonObject, ...]
    texts: tuple[str, ...]
    notes: Notes


class ItemwiseFolder:
    """For the formats where an item's messages are its own (the OpenAI ones): final as soon
    as they are made, so nothing carries from one item to the next. Each item's piece is
    remembered in `pieces`, made by `make`."""

    def __init__(self, make: Callable[[Renderable], Piece], pieces: IdentityMemo[Piece], out: Rendered | None) -> None:
        self.make, self.pieces = make, pieces
        self.out = out if out is not None else Rendered()

    def feed(self, item: Renderable) -> bool:
        out = self.out
        piece = self.pieces.get(sources(item), lambda: self.make(item))
        out.take(piece.notes)
        if not piece.messages:
            out.message_index[item.seq] = -1
            out.omitted.add(item.seq)
            return False
        out.message_index[item.seq] = len(out.messages)
        out.messages.extend(piece.messages)
        out.add_json(piece.texts)
        return True

    def state(self) -> Hashable:
        return None

    def resume(self, state: Hashable) -> None:
        pass

    def finish(self) -> None:
        pass


def render_all(folder: Folder, items: Sequence[Renderable]) -> Rendered:
    for item in items:
        folder.feed(item)
    folder.finish()
    return folder.out


def to_json(value: Any) -> str:
    """The exact text a view carries: compact, key order as rendered, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64_text(data)}"
