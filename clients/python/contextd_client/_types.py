"""Plain result types. Protobuf messages stay inside the client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from contextd_client.v1 import contextd_pb2 as api


class ViewFormat(StrEnum):
    OPENAI_CHAT = "openai_chat"
    ANTHROPIC_MESSAGES = "anthropic_messages"

    def to_proto(self) -> api.ViewFormat.ValueType:
        if self is ViewFormat.OPENAI_CHAT:
            return api.VIEW_FORMAT_OPENAI_CHAT
        return api.VIEW_FORMAT_ANTHROPIC_MESSAGES


def _time(ts: Any) -> datetime:
    dt: datetime = ts.ToDatetime(tzinfo=UTC)
    return dt


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    tenant: str
    version: int
    """Items appended so far; the seq of the last one."""
    token_count: int
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, str]
    policy_version: str
    policy: str
    """The policy document; empty for the default policy."""

    @classmethod
    def from_proto(cls, message: api.Session) -> Session:
        return cls(
            id=message.id,
            tenant=message.tenant,
            version=message.version,
            token_count=message.token_count,
            created_at=_time(message.created_at),
            updated_at=_time(message.updated_at),
            metadata=dict(message.metadata),
            policy_version=message.policy_version,
            policy=message.policy,
        )


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
    replayed: bool
    """True when the service returned the stored result of an earlier try."""

    @classmethod
    def from_proto(cls, message: api.AppendItemsResponse) -> AppendResult:
        return cls(
            first_seq=message.first_seq,
            last_seq=message.last_seq,
            version=message.version,
            receipts=tuple(ItemReceipt(r.seq, r.content_hash, r.token_count) for r in message.receipts),
            replayed=message.replayed,
        )


@dataclass(frozen=True, slots=True)
class ViewItem:
    seq: int
    representation: str
    """"full", "reduced", "placeholder" or "omitted"."""
    tokens: int
    message_index: int
    handle: str


@dataclass(frozen=True, slots=True)
class ViewWarning:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class View:
    """A rendered view: pass `messages` (and `system`) to the provider as they are."""

    session_id: str
    version: int
    format: ViewFormat
    encoding: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None
    """Anthropic's top-level ``system``; None when absent (and always for OpenAI)."""
    items: tuple[ViewItem, ...]
    item_tokens: int
    framing_tokens: int
    total_tokens: int
    budget_tokens: int
    over_budget: bool
    warnings: tuple[ViewWarning, ...]
    messages_json: str
    """The exact bytes the service rendered, for callers that forward JSON untouched."""

    def anthropic_kwargs(self) -> dict[str, Any]:
        """``messages`` and, when present, ``system``, to splat into ``messages.create``."""
        kwargs: dict[str, Any] = {"messages": self.messages}
        if self.system is not None:
            kwargs["system"] = self.system
        return kwargs

    @classmethod
    def from_proto(cls, message: api.View) -> View:
        fmt = ViewFormat.OPENAI_CHAT if message.format == api.VIEW_FORMAT_OPENAI_CHAT else ViewFormat.ANTHROPIC_MESSAGES
        return cls(
            session_id=message.session_id,
            version=message.version,
            format=fmt,
            encoding=message.encoding,
            messages=json.loads(message.messages_json),
            system=json.loads(message.system_json) if message.system_json else None,
            items=tuple(
                ViewItem(
                    seq=i.seq,
                    representation=api.Representation.Name(i.representation).removeprefix("REPRESENTATION_").lower(),
                    tokens=i.tokens,
                    message_index=i.message_index,
                    handle=i.handle,
                )
                for i in message.items
            ),
            item_tokens=message.item_tokens,
            framing_tokens=message.framing_tokens,
            total_tokens=message.total_tokens,
            budget_tokens=message.budget_tokens,
            over_budget=message.over_budget,
            warnings=tuple(ViewWarning(w.code, w.message) for w in message.warnings),
            messages_json=message.messages_json,
        )
