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

A view names its blocks by digests of their bytes (`View.view_token`). A caller that holds a
view sends its token back with the next render (`known_view_token`), and the response leaves
out the leading blocks the two views share: their messages' bytes and their items, which the
caller already holds (`View.shared_messages_bytes`, `View.shared_items`). The token names
content, not a render, so the server keeps nothing for it and any replica reads it; a block
of equal digest is a block of equal bytes (SHA-256, 16 bytes of it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
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
    held: int = 0
    """Bytes of the view left out, as the caller held them (`known_view_token`)."""


def passing_encoded(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """`serializer`, but for an `Encoded` response, which is its own bytes."""
    if serializer is None:
        return None
    encode = serializer

    def serialize(response: Any) -> bytes:
        return response.data if isinstance(response, Encoded) else encode(response)

    return serialize


def render_response(
    view: View, certificates: Sequence[Certificate], known: Known | None = None, *, named: bool = True
) -> Encoded:
    """`RenderViewResponse(view=view_to_proto(view, certificates))`, serialized, with the view's
    token (unless not `named`: a view as stored, which no render follows); with `known` (the
    caller's `known_view_token`, read), without what it shares with that view."""
    head = view_to_proto(replace(view, items=(), message_parts=()), certificates)
    head.messages_json = ""  # written below, from the parts
    texts, items = view.message_parts, view.items
    # The messages' JSON array, a block of messages at a time: encoded once, as the next
    # render resumes this one (the same strings at the same places but for the last few).
    # A slice of the engine's `Blocks` at a block's bounds is the tuple it holds: the object remembered.
    message_blocks = [_message_block(tuple(texts[start : start + BLOCK])) for start in range(0, len(texts), BLOCK)]
    item_blocks = [_block(tuple(items[start : start + BLOCK])) for start in range(0, len(items), BLOCK)]
    if named:
        head.view_token = _token(message_blocks, item_blocks)
    shared = _shared(known.messages, message_blocks) if known is not None else 0
    if shared:
        # "[", the shared blocks and the commas between them: the known view's first bytes.
        head.shared_messages_bytes = 1 + sum(len(data) for data, _ in message_blocks[:shared]) + shared - 1
        messages = [part for data, _ in message_blocks[shared:] for part in (b",", data)] + [b"]"]
    else:
        messages = [b"[", b",".join(data for data, _ in message_blocks), b"]"]
    shared_items = _shared(known.items, item_blocks) if known is not None else 0
    head.shared_items = shared_items * BLOCK if shared_items < len(item_blocks) else len(items)
    held = head.shared_messages_bytes + sum(len(data) for data, _ in item_blocks[:shared_items])
    parts = [
        head.SerializeToString(),
        MESSAGES_FIELD,
        _varint(sum(map(len, messages))),
        *messages,
        *(data for data, _ in item_blocks[shared_items:]),
    ]
    return Encoded(b"".join([VIEW_FIELD, _varint(sum(map(len, parts))), *parts]), held)


@dataclass(frozen=True, slots=True)
class Known:
    """A `view_token` a caller sent back: the digests of the blocks of the view it holds."""

    messages: tuple[bytes, ...]
    items: tuple[bytes, ...]


Block = tuple[bytes, bytes]
"""A block's bytes and their digest."""
DIGEST = 16
"""Bytes of SHA-256 kept a block."""
TOKEN_VERSION = 1


def known_view(token: bytes) -> Known | None:
    """The `Known` of a `known_view_token`; None for a token of another version of this code
    (written by a replica of another version in a rolling upgrade: it shares nothing);
    ValueError when it is no token at all."""
    if not token:
        raise ValueError("it is empty")
    if token[0] != TOKEN_VERSION:
        return None
    at, counts = 1, []
    for _ in range(2):
        count, at = _read_varint(token, at)
        counts.append(count)
    if len(token) - at != DIGEST * sum(counts):
        raise ValueError("its length does not match the blocks it names")
    digests = [token[start : start + DIGEST] for start in range(at, len(token), DIGEST)]
    return Known(tuple(digests[: counts[0]]), tuple(digests[counts[0] :]))


def _token(message_blocks: Sequence[Block], item_blocks: Sequence[Block]) -> bytes:
    """The view's token: a version, the count of each kind of block, and their digests."""
    digests = [digest for _, digest in (*message_blocks, *item_blocks)]
    return b"".join([bytes([TOKEN_VERSION]), _varint(len(message_blocks)), _varint(len(item_blocks)), *digests])


def _shared(known: Sequence[bytes], blocks: Sequence[Block]) -> int:
    """How many blocks, from the first, the view shares with the known one."""
    shared = 0
    for held, (_, digest) in zip(known, blocks, strict=False):
        if held != digest:
            break
        shared += 1
    return shared


def remember_view(items: Sequence[ViewItem], texts: Sequence[str]) -> None:
    """Encode the blocks of a view's items and serialized messages as `render_response` does, so
    that the response of a render that shows them again encodes only what changed: the view of
    a carry read back as the server starts (warm_start.py), whose next render resumes it."""
    for start in range(0, len(texts), BLOCK):
        _message_block(tuple(texts[start : start + BLOCK]))
    for start in range(0, len(items), BLOCK):
        _block(tuple(items[start : start + BLOCK]))


def _message_block(block: tuple[str, ...]) -> Block:
    """The block's messages joined and encoded, and their digest."""
    return _remembered(_message_blocks, block, lambda: ",".join(block).encode("utf-8"))


def _block(items: tuple[ViewItem, ...]) -> Block:
    """The block's items encoded, one after another, and their digest."""
    return _remembered(_blocks, items, lambda: b"".join([_item(v) for v in items]))


def _remembered(
    memo: IdentityMemo[list[tuple[tuple[Any, ...], Block]]], block: tuple[Any, ...], encode: Callable[[], bytes]
) -> Block:
    """A block's bytes and digest, remembered by its first element: a block is found again by
    comparing it with those held (a tuple's equality tests identity first: one pass at C speed,
    where a key of every element's identity would build one number per element)."""
    variants = memo.get((block[0],), list)
    for held, found in variants:
        if held == block:
            return found
    data = encode()
    found = data, hashlib.sha256(data).digest()[:DIGEST]
    change = _variant_bytes(block, found)
    if len(variants) >= BLOCK_VARIANTS:
        change -= _variant_bytes(*variants.pop(0))
    variants.append((block, found))
    memo.resized((block[0],), variants, change)
    return found


def _variant_bytes(block: tuple[Any, ...], found: Block) -> int:
    """What one block remembered adds to its memo: the block (a tuple of references) and its
    bytes. Its elements are the view's own (its items, its serialized messages), held by the
    session's carry while it shows them (as history items are not counted: `memo.weigh`): a
    variant an edit superseded may hold the last reference to a few, not counted. Weighing them
    (a variant is 256 view items, weighed again whole at every render that grew the last block)
    cost each render about a millisecond."""
    # Its pair and list slot, the tuple, the bytes, the pair of them and the digest.
    return 80 + 56 + 8 * len(block) + 33 + len(found[0]) + 56 + 33 + DIGEST


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
_blocks: IdentityMemo[list[tuple[tuple[ViewItem, ...], Block]]] = IdentityMemo(200_000 // BLOCK)
"""Blocks of items' bytes, joined, by their first item."""
_message_blocks: IdentityMemo[list[tuple[tuple[str, ...], Block]]] = IdentityMemo(200_000 // BLOCK)
"""Blocks of messages' JSON, joined and encoded, by their first message."""


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at` and where it ends; ValueError past the end of `data`."""
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a count in it is cut short")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint (the one length this module writes itself)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
