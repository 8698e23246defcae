"""Domain items for tests, built the way an append builds them, without a server.

`stored_items` is the append pipeline in miniature: check the batch, link
tool results to their calls (which fills in tool names), then give each item
its seq, content hash and token count. `items_from_openai_messages`,
`items_from_anthropic_messages` and `items_from_converse_messages` put the
thin client's converters and the api mapping in front of it, so a test goes
from provider dicts to exactly what a render would load from storage.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from contextd.api.mapping import items_from_proto
from contextd.engine.codec import content_hash
from contextd.engine.errors import InvalidArgument
from contextd.engine.model import Block, Item, ItemContent, Role, Session
from contextd.engine.tokens import TiktokenCounter, item_tokens
from contextd.engine.validation import Limits, ToolCall, check_batch, link_tool_results
from contextd_client.formats import items_from_anthropic, items_from_converse, items_from_openai
from contextd_client.v1 import content_pb2 as pb

LIMITS = Limits(max_batch_items=1000, max_item_bytes=1_048_576)
"""The service's default limits."""

CREATED_AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@functools.cache
def counter() -> TiktokenCounter:
    """One shared counter: loading the BPE file takes a noticeable fraction of a second."""
    return TiktokenCounter()


def to_item(content: ItemContent, seq: int, *, token_count: int | None = None) -> Item:
    """`content` as stored at `seq`: hashed, and counted unless `token_count` is given."""
    return Item(
        role=content.role,
        content=content.content,
        source=content.source,
        tool_effect=content.tool_effect,
        name=content.name,
        metadata=content.metadata,
        seq=seq,
        content_hash=content_hash(content),
        token_count=item_tokens(content, counter()) if token_count is None else token_count,
        created_at=CREATED_AT,
    )


def make_item(role: Role, *blocks: Block, seq: int = 1, name: str = "", token_count: int | None = None) -> Item:
    """An item straight from blocks, not validated: for renderer tests."""
    return to_item(ItemContent(role=role, content=blocks, name=name), seq, token_count=token_count)


def stored_items(
    contents: Sequence[ItemContent], *, first_seq: int = 1, known: Mapping[str, ToolCall] | None = None
) -> list[Item]:
    """What one append of `contents` stores; raises InvalidArgument as the service would."""
    check_batch(contents, LIMITS)
    linked, violations = link_tool_results(contents, known or {})
    if violations:
        raise InvalidArgument(violations)
    return [to_item(content, first_seq + n) for n, content in enumerate(linked)]


def stored_from_proto(messages: Sequence[pb.Item]) -> list[Item]:
    return stored_items(items_from_proto(messages))


def items_from_openai_messages(messages: Iterable[Mapping[str, Any]]) -> list[Item]:
    """Chat Completions messages as the items an append of them stores (seq 1..n)."""
    return stored_from_proto(items_from_openai(messages))


def items_from_anthropic_messages(
    messages: Iterable[Mapping[str, Any]], system: str | Iterable[Mapping[str, Any]] | None = None
) -> list[Item]:
    """A Messages request's ``system`` and ``messages`` as the items an append of them stores (seq 1..n)."""
    return stored_from_proto(items_from_anthropic(messages, system))


def items_from_converse_messages(
    messages: Iterable[Mapping[str, Any]], system: Iterable[Mapping[str, Any]] | None = None
) -> list[Item]:
    """A Converse request's ``system`` and ``messages`` as the items an append of them stores (seq 1..n)."""
    return stored_from_proto(items_from_converse(messages, system))


def make_session(version: int, *, session_id: str = "s-1", policy_version: str = "") -> Session:
    return Session(
        id=session_id,
        tenant="t",
        version=version,
        token_count=0,
        created_at=CREATED_AT,
        updated_at=CREATED_AT,
        policy_version=policy_version,
    )
