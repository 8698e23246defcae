"""The domain model: sessions, items and their content blocks (DESIGN section 3).

Plain frozen values. The api layer maps protobuf messages to these, storage
persists them, and the engine computes views from them; none of the three
knows the others' types.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Representation(StrEnum):
    """How an item appears in a view."""

    FULL = "full"
    REDUCED = "reduced"
    """A smaller form; the original is recoverable."""
    PLACEHOLDER = "placeholder"
    """A marker with the item's identity and a handle, no content."""
    OMITTED = "omitted"


class ToolEffectKind(StrEnum):
    READ = "read"
    WRITE = "write"
    PURE = "pure"
    VOLATILE = "volatile"
    SHELL = "shell"
    """Policies only: the tool runs shell commands, whose effects are read from the command."""


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    item_id: str = ""
    """The provider's id of the output message it came from (OpenAI Responses ``msg_…``)."""


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    id: str
    name: str
    input_json: str
    """The arguments as JSON object text, kept byte-for-byte."""
    item_id: str = ""
    """The provider's id of the call as an output item (OpenAI Responses ``fc_…``); ``id`` is its call id."""

    def argument_text(self) -> str:
        """The string arguments, decoded (a command as the agent typed it, not as JSON escapes it)."""
        try:
            return "\n".join(strings_in(json.loads(self.input_json)))
        except ValueError:
            return self.input_json


@dataclass(frozen=True, slots=True)
class ImageBlock:
    media_type: str
    data: bytes | None = None
    uri: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DocumentBlock:
    media_type: str
    data: bytes | None = None
    uri: str | None = None
    text: str | None = None
    title: str = ""


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    text: str = ""
    """The reasoning, or (OpenAI Responses) its summary."""
    signature: str = ""
    """Anthropic's signature of ``text``."""
    redacted_data: str = ""
    """Anthropic's redacted reasoning."""
    item_id: str = ""
    """OpenAI Responses: the reasoning item's id (``rs_…``)."""
    encrypted_content: str = ""
    """OpenAI Responses: the reasoning, encrypted; sent back unchanged."""

    @property
    def opaque(self) -> bool:
        """Whether a provider needs it back unchanged (signed, redacted or encrypted)."""
        return bool(self.signature or self.redacted_data or self.encrypted_content)


ResultPart = TextBlock | ImageBlock | DocumentBlock
"""What a tool result may contain."""


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    tool_use_id: str
    content: tuple[ResultPart, ...] = ()
    is_error: bool = False
    name: str = ""
    """The tool's name; filled from the matching tool_use at append."""


Block = TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock | DocumentBlock | ReasoningBlock

BLOCK_KINDS: Mapping[type, str] = {
    TextBlock: "text",
    ToolUseBlock: "tool_use",
    ToolResultBlock: "tool_result",
    ImageBlock: "image",
    DocumentBlock: "document",
    ReasoningBlock: "reasoning",
}
"""Each block type's name, as the API, policies and error messages spell it."""


@dataclass(frozen=True, slots=True)
class Source:
    """What an observation was of."""

    uri: str
    version: str = ""
    observed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ToolEffect:
    kind: ToolEffectKind
    source_arg: str = ""


def _no_metadata() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemContent:
    """An item as a client submits it: everything but what the service assigns."""

    role: Role
    content: tuple[Block, ...]
    source: Source | None = None
    tool_effect: ToolEffect | None = None
    name: str = ""
    metadata: Mapping[str, str] = field(default_factory=_no_metadata)

    @property
    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolUseBlock))

    def written(self) -> str:
        """What the item's author wrote in words: its text, and the string arguments of its tool
        calls (decoded: a command as the agent typed it, not as JSON escapes it)."""
        parts = [b.text for b in self.content if isinstance(b, TextBlock)]
        return "\n".join([*parts, *(call.argument_text() for call in self.tool_uses)])

    @property
    def tool_result(self) -> ToolResultBlock | None:
        """The tool result of a TOOL item (which holds exactly one, validated at append)."""
        if self.role is Role.TOOL:
            for block in self.content:
                if isinstance(block, ToolResultBlock):
                    return block
        return None


def strings_in(value: Any) -> Iterator[str]:
    """The strings of a decoded JSON value, in order (its objects' values, not their keys)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class Item(ItemContent):
    """One L0 event: immutable once appended."""

    seq: int
    content_hash: str
    token_count: int
    """Tokens of the content, counted once at append."""
    author: str = ""
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    tenant: str
    version: int
    """Items appended so far; the seq of the last one."""
    token_count: int
    """Tokens of all items in the history."""
    created_at: datetime
    updated_at: datetime
    metadata: Mapping[str, str] = field(default_factory=_no_metadata)
    policy: str = ""
    policy_version: str = ""


@dataclass(frozen=True, slots=True)
class ItemReceipt:
    seq: int
    content_hash: str
    token_count: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_seq: int
    last_seq: int
    version: int
    receipts: tuple[ItemReceipt, ...]
    replayed: bool = False
