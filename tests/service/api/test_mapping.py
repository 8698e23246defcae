"""Protobuf <-> domain mapping (service/contextd/api/mapping.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from contextd.api.mapping import FORMAT_TO_PROTO, item_to_proto, items_from_proto, timestamp, view_format
from contextd.engine.errors import FieldViolation, InvalidArgument
from contextd.engine.model import (
    DocumentBlock,
    ImageBlock,
    Item,
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
from contextd.engine.view import ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api


def text(value: str) -> pb.ContentBlock:
    return pb.ContentBlock(text=pb.TextBlock(text=value))


def test_every_unmappable_field_in_one_error() -> None:
    messages = [
        pb.Item(content=[text("no role")]),
        pb.Item(role=99, content=[text("future role")]),  # type: ignore[arg-type]
        pb.Item(role=pb.ROLE_USER, content=[text("ok"), pb.ContentBlock()]),
        pb.Item(role=pb.ROLE_TOOL, content=[text("x")], tool_effect=pb.ToolEffect(source_arg="path")),
        pb.Item(role=pb.ROLE_TOOL, content=[text("x")], tool_effect=pb.ToolEffect(kind=42)),  # type: ignore[arg-type]
        pb.Item(role=pb.ROLE_TOOL, content=[text("x")], source=pb.Source(version="v1")),
        pb.Item(
            role=pb.ROLE_TOOL,
            content=[
                pb.ContentBlock(
                    tool_result=pb.ToolResultBlock(
                        tool_use_id="c1",
                        content=[
                            text("fine"),
                            pb.ContentBlock(),
                            pb.ContentBlock(tool_use=pb.ToolUseBlock(id="c2", name="f", input_json="{}")),
                        ],
                    )
                )
            ],
        ),
        pb.Item(role=pb.ROLE_ASSISTANT, content=[text("this one is fine")]),
    ]
    with pytest.raises(InvalidArgument) as caught:
        items_from_proto(messages)
    assert caught.value.violations == (
        FieldViolation("items[0].role", "role is not set"),
        FieldViolation("items[1].role", "unknown role 99"),
        FieldViolation("items[2].content[1]", "the block has no kind set (text, tool_use, tool_result, ...)"),
        FieldViolation("items[3].tool_effect.kind", "unknown or unset kind 0"),
        FieldViolation("items[4].tool_effect.kind", "unknown or unset kind 42"),
        FieldViolation("items[5].source.uri", "a source needs a uri"),
        FieldViolation(
            "items[6].content[0].tool_result.content[1]", "the block has no kind set (text, tool_use, tool_result, ...)"
        ),
        FieldViolation(
            "items[6].content[0].tool_result.content[2]", "a tool result holds text, image or document blocks"
        ),
    )
    assert caught.value.message == "items[0].role: role is not set (and 7 more)"


def test_empty_request_maps_to_no_items() -> None:
    assert items_from_proto([]) == []


def test_each_block_kind_maps() -> None:
    observed = datetime(2025, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC)
    message = pb.Item(
        role=pb.ROLE_USER,
        content=[
            text("hi"),
            pb.ContentBlock(image=pb.ImageBlock(media_type="image/png", data=b"\x89PNG", detail="low")),
            pb.ContentBlock(image=pb.ImageBlock(uri="https://example.com/a.png")),
            pb.ContentBlock(image=pb.ImageBlock(media_type="image/png")),
            pb.ContentBlock(image=pb.ImageBlock(media_type="image/png", data=b"")),
            pb.ContentBlock(document=pb.DocumentBlock(media_type="application/pdf", data=b"%PDF", title="a.pdf")),
            pb.ContentBlock(document=pb.DocumentBlock(uri="file-1")),
            pb.ContentBlock(document=pb.DocumentBlock(text="")),
        ],
        name="alice",
        metadata={"k": "v"},
        source=pb.Source(uri="file:///a", version="v2", observed_at=timestamp(observed)),
        tool_effect=pb.ToolEffect(kind=pb.TOOL_EFFECT_KIND_READ, source_arg="path"),
    )
    (mapped,) = items_from_proto([message])
    assert mapped == ItemContent(
        role=Role.USER,
        content=(
            TextBlock("hi"),
            ImageBlock("image/png", data=b"\x89PNG", detail="low"),
            ImageBlock("", uri="https://example.com/a.png"),
            ImageBlock("image/png"),  # no source: validation reports it
            ImageBlock("image/png", data=b""),  # a set oneof with empty bytes is still data
            DocumentBlock("application/pdf", data=b"%PDF", title="a.pdf"),
            DocumentBlock("", uri="file-1"),
            DocumentBlock("", text=""),
        ),
        source=Source("file:///a", "v2", observed),
        tool_effect=ToolEffect(ToolEffectKind.READ, "path"),
        name="alice",
        metadata={"k": "v"},
    )
    assert mapped.source is not None and mapped.source.observed_at is not None
    assert mapped.source.observed_at.tzinfo is UTC


def test_assistant_and_tool_blocks_map() -> None:
    messages = [
        pb.Item(
            role=pb.ROLE_ASSISTANT,
            content=[
                pb.ContentBlock(reasoning=pb.ReasoningBlock(text="t", signature="s")),
                pb.ContentBlock(reasoning=pb.ReasoningBlock(redacted_data="r")),
                pb.ContentBlock(tool_use=pb.ToolUseBlock(id="c1", name="ls", input_json='{"a":  1}')),
            ],
        ),
        pb.Item(
            role=pb.ROLE_TOOL,
            content=[
                pb.ContentBlock(
                    tool_result=pb.ToolResultBlock(
                        tool_use_id="c1",
                        content=[text("out"), pb.ContentBlock(image=pb.ImageBlock(media_type="image/png", data=b"1"))],
                        is_error=True,
                        name="ls",
                    )
                )
            ],
            tool_effect=pb.ToolEffect(kind=pb.TOOL_EFFECT_KIND_VOLATILE),
        ),
    ]
    assert items_from_proto(messages) == [
        ItemContent(
            role=Role.ASSISTANT,
            content=(
                ReasoningBlock("t", "s"),
                ReasoningBlock(redacted_data="r"),
                ToolUseBlock("c1", "ls", '{"a":  1}'),
            ),
        ),
        ItemContent(
            role=Role.TOOL,
            content=(
                ToolResultBlock("c1", (TextBlock("out"), ImageBlock("image/png", data=b"1")), is_error=True, name="ls"),
            ),
            tool_effect=ToolEffect(ToolEffectKind.VOLATILE),
        ),
    ]


def test_items_without_source_or_effect_map_to_none() -> None:
    (mapped,) = items_from_proto([pb.Item(role=pb.ROLE_SYSTEM, content=[text("s")])])
    assert mapped.source is None
    assert mapped.tool_effect is None
    assert dict(mapped.metadata) == {}


def test_rich_item_round_trips_through_proto() -> None:
    item = Item(
        role=Role.TOOL,
        content=(
            ToolResultBlock(
                "call_1",
                (
                    TextBlock("contents ✓"),
                    ImageBlock("image/png", data=b"\x00\x01", detail="high"),
                    ImageBlock("", uri="https://example.com/a.png"),
                    DocumentBlock("application/pdf", data=b"%PDF", title="spec.pdf"),
                    DocumentBlock("", uri="file-abc"),
                    DocumentBlock("text/plain", text="notes"),
                ),
                is_error=True,
                name="read_file",
            ),
        ),
        source=Source("file:///repo/a.py", "abc123", datetime(2025, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)),
        tool_effect=ToolEffect(ToolEffectKind.WRITE, "path"),
        name="worker-1",
        metadata={"trace": "t-1", "step": "4"},
        seq=42,
        content_hash="ab" * 32,
        token_count=1234,
        author="agent-7",
        created_at=datetime(2025, 5, 6, 7, 8, 10, tzinfo=UTC),
    )
    message = item_to_proto(item)
    assert message.seq == 42
    assert message.role == pb.ROLE_TOOL
    assert message.content_hash == "ab" * 32
    assert message.token_count == 1234
    assert message.author == "agent-7"
    assert message.created_at.ToDatetime(tzinfo=UTC) == item.created_at
    assert message.tool_effect.kind == pb.TOOL_EFFECT_KIND_WRITE
    # Over the wire and back, then into the domain again.
    wire = pb.Item.FromString(message.SerializeToString())
    (mapped,) = items_from_proto([wire])
    assert mapped == ItemContent(
        role=item.role,
        content=item.content,
        source=item.source,
        tool_effect=item.tool_effect,
        name=item.name,
        metadata=item.metadata,
    )


def test_assistant_item_round_trips_through_proto() -> None:
    item = Item(
        role=Role.ASSISTANT,
        content=(
            ReasoningBlock("plan", "sig"),
            ReasoningBlock(redacted_data="opaque"),
            TextBlock("calling"),
            ToolUseBlock("c1", "f", '{"b": 1,  "a": 2}'),
        ),
        seq=1,
        content_hash="0" * 64,
        token_count=9,
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    message = item_to_proto(item)
    assert not message.HasField("source")
    assert not message.HasField("tool_effect")
    (mapped,) = items_from_proto([message])
    assert mapped.content == item.content
    assert mapped.source is None and mapped.tool_effect is None


def test_local_times_are_sent_in_utc() -> None:
    local = datetime(2025, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    item = Item(
        role=Role.USER,
        content=(TextBlock("x"),),
        seq=1,
        content_hash="",
        token_count=1,
        created_at=local,
    )
    assert item_to_proto(item).created_at.ToDatetime(tzinfo=UTC) == datetime(2025, 1, 1, 10, 0, tzinfo=UTC)


def test_view_format() -> None:
    assert view_format(api.VIEW_FORMAT_OPENAI_CHAT) is ViewFormat.OPENAI_CHAT
    assert view_format(api.VIEW_FORMAT_ANTHROPIC_MESSAGES) is ViewFormat.ANTHROPIC_MESSAGES
    assert view_format(api.VIEW_FORMAT_OPENAI_RESPONSES) is ViewFormat.OPENAI_RESPONSES
    assert view_format(api.VIEW_FORMAT_BEDROCK_CONVERSE) is ViewFormat.BEDROCK_CONVERSE
    with pytest.raises(InvalidArgument) as caught:
        view_format(0)
    assert caught.value.violations == (
        FieldViolation(
            "format",
            "set a view format: one of VIEW_FORMAT_OPENAI_CHAT, VIEW_FORMAT_ANTHROPIC_MESSAGES, "
            "VIEW_FORMAT_OPENAI_RESPONSES, VIEW_FORMAT_BEDROCK_CONVERSE",
        ),
    )


def test_every_view_format_is_in_the_api_the_client_and_the_operator_command() -> None:
    from contextd.cli import _parser
    from contextd_client import ViewFormat as ClientFormat

    assert set(FORMAT_TO_PROTO) == set(ViewFormat)
    assert {f.value for f in ClientFormat} == {f.value for f in ViewFormat}
    assert {ClientFormat(f.value).to_proto() for f in ViewFormat} == set(FORMAT_TO_PROTO.values())
    for fmt in ViewFormat:
        args = _parser().parse_args(["prune", "--session", "s", "--format", fmt.value])
        assert ViewFormat(args.format) is fmt
