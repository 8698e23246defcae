"""What a renderer returns, shared by the provider formats."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from contextd.engine.codec import b64_text
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
    """Anthropic's top-level ``system``; always None for OpenAI."""
    message_index: dict[int, int] = field(default_factory=dict)
    """seq -> index in ``messages``; -1 for the system field or a left-out item."""
    omitted: set[int] = field(default_factory=set)
    """Seqs of items the format could not carry at all (each has a warning)."""
    dropped: dict[int, list[Block]] = field(default_factory=dict)
    """seq -> blocks of that item the format could not carry (the rest of the item is in the view)."""
    warnings: list[ViewWarning] = field(default_factory=list)
    messages_json: list[str] | None = None
    """Each message already serialized, when the renderer had them (the view's JSON is their join)."""

    def warn(self, code: str, message: str) -> None:
        self.warnings.append(ViewWarning(code, message))

    def drop(self, seq: int, blocks: Sequence[Block], code: str, message: str) -> None:
        """Leave `blocks` of item `seq` out of the view, and say why."""
        self.dropped.setdefault(seq, []).extend(blocks)
        self.warn(code, message)


def to_json(value: Any) -> str:
    """The exact text a view carries: compact, key order as rendered, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64_text(data)}"
