"""Canonical block JSON and the content hash (service/contextd/engine/codec.py)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextd.engine import codec
from contextd.engine.codec import (
    block_from_json,
    block_to_json,
    blocks_from_json,
    blocks_to_json,
    canonical_json,
    compact_json,
    content_hash,
    item_to_json,
)
from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    Role,
    Source,
    TextBlock,
    ToolEffect,
    ToolEffectKind,
    ToolResultBlock,
    ToolUseBlock,
)

PNG = b"\x89PNG\r\n\x1a\n\x00\xff\x10"

# Every block kind, each source variant, and the defaults left out or set.
BLOCKS_AND_JSON: list[tuple[Block, dict[str, Any]]] = [
    (TextBlock("héllo ✓\n"), {"type": "text", "text": "héllo ✓\n"}),
    (
        ToolUseBlock("call_1", "read_file", '{"path":  "a.py"}'),
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input_json": '{"path":  "a.py"}'},
    ),
    (ToolResultBlock("call_1"), {"type": "tool_result", "tool_use_id": "call_1", "content": []}),
    (
        ToolResultBlock(
            "call_2",
            (TextBlock("screenshot:"), ImageBlock("image/png", data=PNG), DocumentBlock("text/plain", text="log")),
            is_error=True,
            name="screenshot",
        ),
        {
            "type": "tool_result",
            "tool_use_id": "call_2",
            "content": [
                {"type": "text", "text": "screenshot:"},
                {"type": "image", "media_type": "image/png", "data_b64": "iVBORw0KGgoA/xA="},
                {"type": "document", "media_type": "text/plain", "text": "log"},
            ],
            "is_error": True,
            "name": "screenshot",
        },
    ),
    (
        ImageBlock("image/png", data=PNG),
        {"type": "image", "media_type": "image/png", "data_b64": "iVBORw0KGgoA/xA="},
    ),
    (ImageBlock("image/jpeg", data=b""), {"type": "image", "media_type": "image/jpeg", "data_b64": ""}),
    (
        ImageBlock("", uri="https://example.com/a.png", detail="high"),
        {"type": "image", "media_type": "", "uri": "https://example.com/a.png", "detail": "high"},
    ),
    (
        DocumentBlock("application/pdf", data=b"%PDF-1.7\x00", title="spec.pdf"),
        {"type": "document", "media_type": "application/pdf", "data_b64": "JVBERi0xLjcA", "title": "spec.pdf"},
    ),
    (
        DocumentBlock("application/pdf", uri="file-abc123"),
        {"type": "document", "media_type": "application/pdf", "uri": "file-abc123"},
    ),
    (DocumentBlock("text/plain", text=""), {"type": "document", "media_type": "text/plain", "text": ""}),
    (
        ReasoningBlock("think", signature="sig=="),
        {"type": "reasoning", "text": "think", "signature": "sig=="},
    ),
    (ReasoningBlock(redacted_data="b3BhcXVl"), {"type": "reasoning", "text": "", "redacted_data": "b3BhcXVl"}),
]


@pytest.mark.parametrize(("block", "expected"), BLOCKS_AND_JSON)
def test_block_to_json_is_exact(block: Block, expected: dict[str, Any]) -> None:
    assert block_to_json(block) == expected


@pytest.mark.parametrize(("block", "expected"), BLOCKS_AND_JSON)
def test_block_round_trips_through_json_text(block: Block, expected: dict[str, Any]) -> None:
    # Through the bytes storage keeps, not just the dict: bytes data must survive as base64.
    stored = json.loads(canonical_json(block_to_json(block)))
    assert block_from_json(stored) == block


def test_blocks_to_json_and_back_keep_order() -> None:
    blocks = tuple(b for b, _ in BLOCKS_AND_JSON)
    assert blocks_from_json(blocks_to_json(blocks)) == blocks


def test_block_from_json_fills_defaults() -> None:
    assert block_from_json({"type": "tool_result", "tool_use_id": "c"}) == ToolResultBlock("c", (), False, "")
    assert block_from_json({"type": "reasoning"}) == ReasoningBlock("", "", "")
    assert block_from_json({"type": "image", "media_type": "image/png"}) == ImageBlock("image/png")


def test_block_from_json_rejects_unknown_type() -> None:
    with pytest.raises(ValueError, match=r"^unknown block type 'video'$"):
        block_from_json({"type": "video"})


def test_block_from_json_rejects_tool_use_inside_tool_result() -> None:
    bad = {"type": "tool_result", "tool_use_id": "c", "content": [block_to_json(ToolUseBlock("x", "f", "{}"))]}
    with pytest.raises(ValueError, match=r"^a tool result cannot hold a 'tool_use' block$"):
        block_from_json(bad)


def test_block_to_json_rejects_non_block() -> None:
    with pytest.raises(TypeError, match="not a content block"):
        block_to_json("text")  # type: ignore[arg-type]


def test_canonical_json_sorts_keys_and_keeps_utf8() -> None:
    assert canonical_json({"b": [1, {"d": 2, "c": None}], "a": "é✓"}) == '{"a":"é✓","b":[1,{"c":null,"d":2}]}'.encode()
    assert canonical_json({"x": 1, "y": 2}) == canonical_json({"y": 2, "x": 1})


# ------------------------------------------------------------------ content hash


def _text_item(text: str, role: Role = Role.USER, name: str = "") -> ItemContent:
    return ItemContent(role=role, content=(TextBlock(text),), name=name)


def _tool_item(call_id: str, text: str, *, is_error: bool = False, name: str = "") -> ItemContent:
    return ItemContent(
        role=Role.TOOL, content=(ToolResultBlock(call_id, (TextBlock(text),), is_error=is_error, name=name),)
    )


def test_content_hash_is_sha256_of_the_canonical_form() -> None:
    # Written out by hand so a change to the canonical form (which would orphan
    # every stored hash) fails here.
    expected = hashlib.sha256(b'{"blocks":[{"text":"hi","type":"text"}],"name":"","role":"user"}').hexdigest()
    assert content_hash(_text_item("hi")) == expected


def test_content_hash_of_a_tool_result_leaves_out_call_id_and_tool_name() -> None:
    item = _tool_item("call_1", "out", is_error=True, name="read_file")
    hashed = b'{"blocks":[{"content":[{"text":"out","type":"text"}],"is_error":true,"type":"tool_result"}],'
    expected = hashlib.sha256(hashed + b'"name":"","role":"tool"}').hexdigest()
    assert content_hash(item) == expected


def test_content_hash_of_a_tool_use_leaves_out_the_call_id_only() -> None:
    item = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("call_1", "ls", '{"path": "."}'),))
    hashed = b'{"blocks":[{"input_json":"{\\"path\\": \\".\\"}","name":"ls","type":"tool_use"}],'
    expected = hashlib.sha256(hashed + b'"name":"","role":"assistant"}').hexdigest()
    assert content_hash(item) == expected


def test_content_hash_is_stable_across_equal_items() -> None:
    a = ItemContent(role=Role.ASSISTANT, content=(TextBlock("x"), ToolUseBlock("c1", "f", '{"a": 1}')))
    b = ItemContent(role=Role.ASSISTANT, content=(TextBlock("x"), ToolUseBlock("c1", "f", '{"a": 1}')))
    assert content_hash(a) == content_hash(b)
    assert len(content_hash(a)) == 64


def test_content_hash_is_independent_of_stored_key_order() -> None:
    # A database may hand the JSON back with its keys in any order.
    item = ItemContent(
        role=Role.TOOL,
        content=(ToolResultBlock("c1", (TextBlock("out"), ImageBlock("image/png", data=PNG)), is_error=True),),
    )
    stored = json.loads(json.dumps(blocks_to_json(item.content)))
    reordered = [_reverse_keys(b) for b in stored]
    assert [list(b) for b in reordered] != [list(b) for b in stored]
    rebuilt = ItemContent(role=Role.TOOL, content=blocks_from_json(reordered))
    assert rebuilt == item
    assert content_hash(rebuilt) == content_hash(item)


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


def test_identical_outputs_of_different_calls_share_a_hash() -> None:
    assert content_hash(_tool_item("call_1", "same output")) == content_hash(_tool_item("call_2", "same output"))


def test_identical_calls_with_different_ids_share_a_hash() -> None:
    first = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("call_1", "ls", '{"path": "."}'),))
    second = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("call_9", "ls", '{"path": "."}'),))
    assert content_hash(first) == content_hash(second)


def test_tool_result_name_filled_in_at_append_does_not_change_the_hash() -> None:
    # The service hashes a batch before it links results to calls (which fills
    # the name in), so the hash must not depend on whether the client sent it.
    assert content_hash(_tool_item("call_1", "out")) == content_hash(_tool_item("call_1", "out", name="read_file"))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(_text_item("hi"), _text_item("hi "), id="text"),
        pytest.param(_text_item("hi"), _text_item("hi", role=Role.SYSTEM), id="role"),
        pytest.param(_text_item("hi"), _text_item("hi", name="alice"), id="item-name"),
        pytest.param(_tool_item("c", "out"), _tool_item("c", "out", is_error=True), id="is_error"),
        pytest.param(_tool_item("c", "out"), _tool_item("c", "Out"), id="result-content"),
        pytest.param(
            ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c", "ls", "{}"),)),
            ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c", "dir", "{}"),)),
            id="tool-name",
        ),
        pytest.param(
            # Arguments are kept byte for byte, and a different text renders differently.
            ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c", "f", '{"a":1,"b":2}'),)),
            ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c", "f", '{"b":2,"a":1}'),)),
            id="argument-text",
        ),
        pytest.param(
            ItemContent(role=Role.USER, content=(TextBlock("a"), TextBlock("b"))),
            ItemContent(role=Role.USER, content=(TextBlock("b"), TextBlock("a"))),
            id="block-order",
        ),
        pytest.param(
            ItemContent(role=Role.USER, content=(ImageBlock("image/png", data=b"\x00"),)),
            ItemContent(role=Role.USER, content=(ImageBlock("image/png", data=b"\x01"),)),
            id="image-bytes",
        ),
        pytest.param(
            ItemContent(role=Role.ASSISTANT, content=(ReasoningBlock("t", signature="s1"),)),
            ItemContent(role=Role.ASSISTANT, content=(ReasoningBlock("t", signature="s2"),)),
            id="signature",
        ),
    ],
)
def test_content_hash_changes_with_content(a: ItemContent, b: ItemContent) -> None:
    assert content_hash(a) != content_hash(b)


def test_content_hash_ignores_metadata() -> None:
    tagged = ItemContent(role=Role.USER, content=(TextBlock("hi"),), metadata={"trace": "abc"})
    assert content_hash(tagged) == content_hash(_text_item("hi"))


def test_item_to_json_is_exact() -> None:
    item = ItemContent(
        role=Role.TOOL,
        content=(ToolResultBlock("c1", (TextBlock("v2"),)),),
        source=Source("file:///repo/a.py", "abc123", datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)),
        tool_effect=ToolEffect(ToolEffectKind.READ, "path"),
        name="reader",
        metadata={"k": "v"},
    )
    assert item_to_json(item) == {
        "role": "tool",
        "blocks": [{"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "v2"}]}],
        "name": "reader",
        "source": {"uri": "file:///repo/a.py", "version": "abc123", "observed_at": "2025-05-06T07:08:09+00:00"},
        "tool_effect": {"kind": "read", "source_arg": "path"},
        "metadata": {"k": "v"},
    }
    assert item_to_json(_text_item("hi")) == {"role": "user", "blocks": [{"type": "text", "text": "hi"}]}


# ---------------------------------------------------------------- properties

_text = st.text(max_size=40)
_media = st.sampled_from(["image/png", "image/jpeg", "application/pdf", "text/plain", ""])
_images = st.one_of(
    st.builds(ImageBlock, _media, data=st.binary(max_size=40), detail=st.sampled_from(["", "low", "high"])),
    st.builds(ImageBlock, _media, uri=_text, detail=st.sampled_from(["", "auto"])),
    st.builds(ImageBlock, _media),
)
_documents = st.one_of(
    st.builds(DocumentBlock, _media, data=st.binary(max_size=40), title=_text),
    st.builds(DocumentBlock, _media, uri=_text, title=_text),
    st.builds(DocumentBlock, _media, text=_text, title=_text),
)
_parts = st.one_of(st.builds(TextBlock, _text), _images, _documents)
_blocks = st.one_of(
    _parts,
    st.builds(ToolUseBlock, _text, _text, _text),
    st.builds(ToolResultBlock, _text, st.lists(_parts, max_size=3).map(tuple), st.booleans(), _text),
    st.builds(ReasoningBlock, _text, _text, _text),
)


@given(st.lists(_blocks, max_size=5).map(tuple))
def test_any_blocks_round_trip_through_canonical_json(blocks: tuple[Block, ...]) -> None:
    assert blocks_from_json(json.loads(canonical_json(blocks_to_json(blocks)))) == blocks


@given(st.lists(_blocks, min_size=1, max_size=5).map(tuple), st.sampled_from(list(Role)))
def test_hash_survives_a_storage_round_trip(blocks: tuple[Block, ...], role: Role) -> None:
    item = ItemContent(role=role, content=blocks)
    rebuilt = ItemContent(role=role, content=blocks_from_json(json.loads(canonical_json(blocks_to_json(blocks)))))
    assert content_hash(rebuilt) == content_hash(item)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=12)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=6)
        | st.dictionaries(st.integers(), inner, max_size=3)
    ),  # (keys json.dumps makes strings of)
    max_leaves=60,
)


@given(json_values)
def test_compact_json_writes_in_parts_what_json_dumps_writes_whole(value: Any) -> None:
    with mock.patch.object(codec, "JSON_PART", 3):  # long lists at 4 elements here
        assert compact_json(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert compact_json([list(range(2500)), {"a": ["é"] * 3000}]) == json.dumps(
        [list(range(2500)), {"a": ["é"] * 3000}], separators=(",", ":"), ensure_ascii=False
    )
