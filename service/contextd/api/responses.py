"""RenderView's response, encoded from pieces each encoded once.

A view of a long session lists thousands of items (`View.items`), and most of them are the
previous render's, unchanged: the same `ViewItem` objects (view.py resumes the assembly).
Building a protobuf message per item on every render cost more than the render itself (a
third of the server's time at ten thousand items). Here each item is encoded once, as the
bytes of a `View` holding it alone (a tag, a length and the item: what the repeated field
looks like on the wire), and the response is the view's other fields encoded by protobuf,
then its messages and its items' bytes, and the response's own tag and length: a message
that parses as the one protobuf would make of the whole view (fields may come in any order
on the wire; tests/service/api/test_responses.py compares them), as `Encoded`, whose bytes
the server sends as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextd.api.mapping import REPRESENTATION_TO_PROTO, view_to_proto
from contextd.engine.blocks import BLOCK
from contextd.engine.certificates import Certificate
from contextd.engine.memo import IdentityMemo
from contextd.engine.view import View, ViewItem
from contextd_client.v1 import contextd_pb2 as api

VIEW_FIELD = b"\x0a"
"""RenderViewResponse.view: field 1, length-delimited."""
MESSAGES_FIELD = b"\x2a"
"""View.messages_json: field 5, length-delimited. Written here, not by protobuf, which
copied the view's megabytes twice more and checked them again (4 of a 10,000-item view's
6 ms, the interpreter lock held throughout); from the view's message parts, so the joined
string (megabytes more) is never made."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response message already serialized: sent as it is."""

    data: bytes


def passing_encoded(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """`serializer`, but for an `Encoded` response, which is its own bytes."""
    if serializer is None:
        return None
    encode = serializer

    def serialize(response: Any) -> bytes:
        return response.data if isinstance(response, Encoded) else encode(response)

    return serialize


def render_response(view: View, certificates: Sequence[Certificate]) -> Encoded:
    """`RenderViewResponse(view=view_to_proto(view, certificates))`, serialized."""
    head = view_to_proto(replace(view, items=(), message_parts=()), certificates)
    head.messages_json = ""  # written below, from the parts
    texts, items = view.message_parts, view.items
    # The messages' JSON array, a block of messages at a time: encoded once, as the next
    # render resumes this one (the same strings at the same places but for the last few).
    # A slice of the engine's `Blocks` at a block's bounds is the tuple it holds: the object remembered.
    blocks = (tuple(texts[start : start + BLOCK]) for start in range(0, len(texts), BLOCK))
    messages = [b"[", *_joined(blocks), b"]"]
    parts = [
        head.SerializeToString(),
        MESSAGES_FIELD,
        _varint(sum(map(len, messages))),
        *messages,
        *(_block(tuple(items[start : start + BLOCK])) for start in range(0, len(items), BLOCK)),
    ]
    return Encoded(b"".join([VIEW_FIELD, _varint(sum(map(len, parts))), *parts]))


def remember_view(items: Sequence[ViewItem], texts: Sequence[str]) -> None:
    """Encode the blocks of a view's items and serialized messages as `render_response` does, so
    that the response of a render that shows them again encodes only what changed: the view of
    a carry read back as the server starts (warm_start.py), whose next render resumes it."""
    for start in range(0, len(texts), BLOCK):
        _message_block(tuple(texts[start : start + BLOCK]))
    for start in range(0, len(items), BLOCK):
        _block(tuple(items[start : start + BLOCK]))


def _joined(blocks: Iterator[tuple[str, ...]]) -> Iterator[bytes]:
    """Each block of messages' bytes, a comma between blocks."""
    for n, block in enumerate(blocks):
        if n:
            yield b","
        yield _message_block(block)


def _message_block(block: tuple[str, ...]) -> bytes:
    """The block's messages joined and encoded."""
    return _remembered(_message_blocks, block, lambda: ",".join(block).encode("utf-8"))


def _block(items: tuple[ViewItem, ...]) -> bytes:
    """The block's items encoded, one after another."""
    return _remembered(_blocks, items, lambda: b"".join([_item(v) for v in items]))


def _remembered(
    memo: IdentityMemo[list[tuple[tuple[Any, ...], bytes]]], block: tuple[Any, ...], encode: Callable[[], bytes]
) -> bytes:
    """A block's bytes, remembered by its first element: a block is found again by comparing
    it with those held (a tuple's equality tests identity first: one pass at C speed, where
    a key of every element's identity would build one number per element)."""
    variants = memo.get((block[0],), list)
    for held, data in variants:
        if held == block:
            return data
    data = encode()
    change = _variant_bytes(block, data)
    if len(variants) >= BLOCK_VARIANTS:
        change -= _variant_bytes(*variants.pop(0))
    variants.append((block, data))
    memo.resized((block[0],), variants, change)
    return data


def _variant_bytes(block: tuple[Any, ...], data: bytes) -> int:
    """What one block remembered adds to its memo: the block (a tuple of references) and its
    bytes. Its elements are the view's own (its items, its serialized messages), held by the
    session's carry while it shows them (as history items are not counted: `memo.weigh`): a
    variant an edit superseded may hold the last reference to a few, not counted. Weighing them
    (a variant is 256 view items, weighed again whole at every render that grew the last block)
    cost each render about a millisecond."""
    return 80 + 56 + 8 * len(block) + 33 + len(data)  # its pair and list slot, the tuple, the bytes


BLOCK_VARIANTS = 4
"""Blocks remembered that open with the same element (the last block grows an element a
render; a cache breakpoint marks a message of the block before it; an edit changes an item)."""


def _item(item: ViewItem) -> bytes:
    return _items.get((item,), lambda: _encode(item))


def _encode(v: ViewItem) -> bytes:
    message = api.ViewItem(
        seq=v.seq,
        representation=REPRESENTATION_TO_PROTO[v.representation],
        tokens=v.tokens,
        message_index=v.message_index,
        handle=v.handle,
    )
    return api.View(items=[message]).SerializeToString()


_items: IdentityMemo[bytes] = IdentityMemo(200_000)
"""Each view item's bytes (a few dozen each), as the next render shows most of them again."""
_blocks: IdentityMemo[list[tuple[tuple[ViewItem, ...], bytes]]] = IdentityMemo(200_000 // BLOCK)
"""Blocks of items' bytes, joined, by their first item."""
_message_blocks: IdentityMemo[list[tuple[tuple[str, ...], bytes]]] = IdentityMemo(200_000 // BLOCK)
"""Blocks of messages' JSON, joined and encoded, by their first message."""


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint (the one length this module writes itself)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
