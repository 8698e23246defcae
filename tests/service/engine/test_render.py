"""Items to provider messages (service/contextd/engine/render/openai.py and anthropic.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings

from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    Item,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.render.anthropic import render_anthropic
from contextd.engine.render.base import Rendered, ViewWarning, data_uri, to_json
from contextd.engine.render.converse import render_converse
from contextd.engine.render.openai import render_openai
from contextd.engine.render.responses import render_responses
from tests.helpers import make_item
from tests.service.engine.conversations import conversations

Renderer = Callable[[Sequence[Item]], Rendered]

PNG = b"\x89PNG\r\n\x1a\n\x00\x01"
PNG_B64 = "iVBORw0KGgoAAQ=="
PNG_URI = "data:image/png;base64," + PNG_B64
PDF = b"%PDF-1.7 body"
PDF_B64 = "JVBERi0xLjcgYm9keQ=="


def items(*specs: tuple[Role, tuple[Block, ...]] | tuple[Role, tuple[Block, ...], str]) -> list[Item]:
    """Items with seq 1..n from (role, blocks[, name])."""
    out = []
    for seq, spec in enumerate(specs, start=1):
        role, blocks = spec[0], spec[1]
        name = spec[2] if len(spec) == 3 else ""
        out.append(make_item(role, *blocks, seq=seq, name=name, token_count=0))
    return out


def text(value: str) -> TextBlock:
    return TextBlock(value)


def result(call_id: str, *parts: TextBlock | ImageBlock | DocumentBlock, is_error: bool = False) -> ToolResultBlock:
    return ToolResultBlock(call_id, parts, is_error=is_error, name="tool")


def test_data_uri() -> None:
    assert data_uri("image/png", PNG) == PNG_URI


# ==================================================================== OpenAI


def test_openai_single_text_is_a_string() -> None:
    rendered = render_openai(items((Role.SYSTEM, (text("Be brief."),)), (Role.USER, (text("héllo\n"),))))
    assert rendered.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "héllo\n"},
    ]
    assert rendered.system is None
    assert rendered.warnings == []
    assert rendered.omitted == set()
    assert rendered.message_index == {1: 0, 2: 1}


def test_openai_several_blocks_are_a_parts_list() -> None:
    blocks = (
        text("What is this?"),
        ImageBlock("image/png", data=PNG),
        ImageBlock("", uri="https://example.com/a.png", detail="high"),
        text("Thanks."),
    )
    assert render_openai(items((Role.USER, blocks))).messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": PNG_URI}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
                {"type": "text", "text": "Thanks."},
            ],
        }
    ]


def test_openai_a_lone_image_stays_a_list() -> None:
    assert render_openai(items((Role.USER, (ImageBlock("image/jpeg", data=b"\xff\xd8"),)))).messages == [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9g="}}]}
    ]


def test_openai_assistant_with_parallel_tool_calls() -> None:
    odd_spacing = '{ "path" :"a.py",\n "n": 1.50 }'  # kept byte for byte
    rendered = render_openai(
        items(
            (
                Role.ASSISTANT,
                (
                    text("Reading both."),
                    ToolUseBlock("call_1", "read_file", odd_spacing),
                    ToolUseBlock("call_2", "ls", "{}"),
                ),
            ),
        )
    )
    assert rendered.messages == [
        {
            "role": "assistant",
            "content": "Reading both.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": odd_spacing}},
                {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            ],
        }
    ]


def test_openai_assistant_without_text_has_null_content() -> None:
    rendered = render_openai(items((Role.ASSISTANT, (ToolUseBlock("c1", "ls", '{"a": 1}'),))))
    assert rendered.messages == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"a": 1}'}}],
        }
    ]


def test_openai_assistant_with_two_texts() -> None:
    assert render_openai(items((Role.ASSISTANT, (text("a"), text("b"))))).messages == [
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_openai_tool_messages() -> None:
    rendered = render_openai(
        items(
            (Role.TOOL, (result("c1", text("out\n")),)),
            (Role.TOOL, (result("c2"),)),
            (Role.TOOL, (result("c3", text("part 1"), text("part 2"), is_error=True),)),
        )
    )
    assert rendered.messages == [
        {"role": "tool", "tool_call_id": "c1", "content": "out\n"},
        {"role": "tool", "tool_call_id": "c2", "content": ""},
        {
            "role": "tool",
            "tool_call_id": "c3",
            "content": [{"type": "text", "text": "part 1"}, {"type": "text", "text": "part 2"}],
        },
    ]
    # The error flag of seq 3 has no Chat Completions field: it goes, with a warning.
    assert rendered.warnings == [
        ViewWarning("IS_ERROR_DROPPED", "seq 3: Chat Completions tool messages have no error flag; left out")
    ]


def test_openai_tool_result_images_are_dropped_with_a_warning() -> None:
    rendered = render_openai(
        items(
            (Role.USER, (text("shoot"),)),
            (Role.TOOL, (result("c1", text("screenshot:"), ImageBlock("image/png", data=PNG)),)),
            (Role.TOOL, (result("c2", ImageBlock("image/png", data=PNG)),)),
        )
    )
    assert rendered.messages[1:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "screenshot:"},
        {"role": "tool", "tool_call_id": "c2", "content": ""},
    ]
    assert rendered.warnings == [
        ViewWarning("TOOL_RESULT_MEDIA_DROPPED", "seq 2: Chat Completions tool messages carry text only"),
        ViewWarning("TOOL_RESULT_MEDIA_DROPPED", "seq 3: Chat Completions tool messages carry text only"),
    ]
    assert rendered.omitted == set()


def test_openai_reasoning_is_dropped_with_a_warning() -> None:
    rendered = render_openai(items((Role.ASSISTANT, (ReasoningBlock("hmm", "sig"), text("Done.")))))
    assert rendered.messages == [{"role": "assistant", "content": "Done."}]
    assert rendered.warnings == [
        ViewWarning("REASONING_DROPPED", "seq 1: Chat Completions has no field for reasoning; left out")
    ]
    assert rendered.omitted == set()


def test_openai_assistant_with_only_reasoning_is_omitted() -> None:
    rendered = render_openai(
        items(
            (Role.USER, (text("q"),)),
            (Role.ASSISTANT, (ReasoningBlock(redacted_data="opaque"),)),
            (Role.USER, (text("q2"),)),
        )
    )
    assert rendered.messages == [{"role": "user", "content": "q"}, {"role": "user", "content": "q2"}]
    assert rendered.message_index == {1: 0, 2: -1, 3: 1}
    assert rendered.omitted == {2}
    assert [w.code for w in rendered.warnings] == ["REASONING_DROPPED"]


def test_openai_names() -> None:
    rendered = render_openai(
        items(
            (Role.SYSTEM, (text("s"),), "ops"),
            (Role.USER, (text("u"),), "alice"),
            (Role.ASSISTANT, (ToolUseBlock("c1", "ls", "{}"),), "bot"),
            (Role.TOOL, (result("c1", text("out")),), "ignored"),
        )
    )
    assert rendered.messages == [
        {"role": "system", "content": "s", "name": "ops"},
        {"role": "user", "content": "u", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
            "name": "bot",
        },
        # Tool messages have no participant name.
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]


def test_openai_documents() -> None:
    rendered = render_openai(
        items(
            (
                Role.USER,
                (
                    DocumentBlock("text/plain", text="notes", title="ignored"),
                    DocumentBlock("application/pdf", data=PDF, title="spec.pdf"),
                    DocumentBlock("application/pdf", data=PDF),
                    DocumentBlock("application/pdf", uri="file-abc123"),
                    DocumentBlock("application/pdf", uri="https://example.com/spec.pdf"),
                ),
            ),
            (Role.USER, (DocumentBlock("application/pdf", uri="s3://bucket/a.pdf"),)),
        )
    )
    assert rendered.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "notes"},
                {
                    "type": "file",
                    "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64," + PDF_B64},
                },
                {"type": "file", "file": {"file_data": "data:application/pdf;base64," + PDF_B64}},
                {"type": "file", "file": {"file_id": "file-abc123"}},
            ],
        }
    ]
    assert rendered.warnings == [
        ViewWarning(
            "DOCUMENT_DROPPED",
            "seq 1: Chat Completions cannot reference a document by URL (https://example.com/spec.pdf)",
        ),
        ViewWarning(
            "DOCUMENT_DROPPED", "seq 2: Chat Completions cannot reference a document by URL (s3://bucket/a.pdf)"
        ),
    ]
    assert rendered.omitted == {2}
    assert rendered.message_index == {1: 0, 2: -1}


# ================================================================= Anthropic


def test_anthropic_one_leading_system_block_is_a_string() -> None:
    rendered = render_anthropic(items((Role.SYSTEM, (text("Be brief."),)), (Role.USER, (text("hi"),))))
    assert rendered.system == "Be brief."
    assert rendered.messages == [{"role": "user", "content": "hi"}]
    assert rendered.message_index == {1: -1, 2: 0}
    assert rendered.omitted == set()
    assert rendered.warnings == []


def test_anthropic_several_leading_system_blocks_are_a_list() -> None:
    rendered = render_anthropic(
        items(
            (Role.SYSTEM, (text("A"), text("B"))),
            (Role.SYSTEM, (text("C"),)),
            (Role.USER, (text("hi"),)),
        )
    )
    assert rendered.system == [
        {"type": "text", "text": "A"},
        {"type": "text", "text": "B"},
        {"type": "text", "text": "C"},
    ]
    assert rendered.message_index == {1: -1, 2: -1, 3: 0}


def test_anthropic_without_system() -> None:
    rendered = render_anthropic(items((Role.USER, (text("hi"),))))
    assert rendered.system is None


def test_anthropic_later_system_item_becomes_user_text() -> None:
    rendered = render_anthropic(
        items(
            (Role.SYSTEM, (text("Be brief."),)),
            (Role.USER, (text("hi"),)),
            (Role.ASSISTANT, (text("hello"),)),
            (Role.SYSTEM, (text("Reminder: tests must pass."),)),
            (Role.USER, (text("go"),)),
        )
    )
    assert rendered.system == "Be brief."
    assert rendered.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Reminder: tests must pass."},
        {"role": "user", "content": "go"},  # a string is never merged into (append-stability)
    ]
    assert rendered.warnings == [
        ViewWarning(
            "SYSTEM_AS_USER",
            "seq 4: the Messages API takes system text only before the first turn; sent as user text",
        )
    ]
    assert rendered.message_index == {1: -1, 2: 0, 3: 1, 4: 2, 5: 3}


def test_anthropic_tool_results_and_following_user_text_merge() -> None:
    rendered = render_anthropic(
        items(
            (Role.USER, (text("look"),)),
            (Role.ASSISTANT, (ToolUseBlock("c1", "read", '{"p": 1}'), ToolUseBlock("c2", "read", '{"p": 2}'))),
            (Role.TOOL, (result("c1", text("one")),)),
            (Role.TOOL, (result("c2", text("two"), is_error=True),)),
            (Role.USER, (text("thanks"),)),
            (Role.ASSISTANT, (text("done"),)),
        )
    )
    assert rendered.messages == [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c1", "name": "read", "input": {"p": 1}},
                {"type": "tool_use", "id": "c2", "name": "read", "input": {"p": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "two", "is_error": True},
                {"type": "text", "text": "thanks"},
            ],
        },
        {"role": "assistant", "content": "done"},
    ]
    assert rendered.message_index == {1: 0, 2: 1, 3: 2, 4: 2, 5: 2, 6: 3}
    assert "is_error" not in rendered.messages[2]["content"][0]


def test_anthropic_consecutive_assistant_items_merge_into_a_list_never_into_a_string() -> None:
    rendered = render_anthropic(
        items(
            (Role.ASSISTANT, (text("Let me check."), ToolUseBlock("c0", "ls", "{}"))),
            (Role.ASSISTANT, (ToolUseBlock("c1", "ls", "{}"),)),
            (Role.ASSISTANT, (text("Done."),)),
            (Role.ASSISTANT, (ToolUseBlock("c2", "ls", "{}"),)),
        )
    )
    assert rendered.messages == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "c0", "name": "ls", "input": {}},
                {"type": "tool_use", "id": "c1", "name": "ls", "input": {}},
                {"type": "text", "text": "Done."},
                {"type": "tool_use", "id": "c2", "name": "ls", "input": {}},
            ],
        },
    ]
    assert rendered.message_index == {1: 0, 2: 0, 3: 0, 4: 0}
    plain_first = render_anthropic(
        items((Role.ASSISTANT, (text("Hmm."),)), (Role.ASSISTANT, (ToolUseBlock("c1", "ls", "{}"),)))
    )
    assert plain_first.messages == [
        {"role": "assistant", "content": "Hmm."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ls", "input": {}}]},
    ]


def test_anthropic_tool_use_input_keeps_key_order() -> None:
    arguments = '{"z": 1, "a": {"y": [1, 2.5, null], "b": "é"}, "m": true}'
    rendered = render_anthropic(items((Role.ASSISTANT, (ToolUseBlock("c1", "f", arguments),))))
    tool_input = rendered.messages[0]["content"][0]["input"]
    assert tool_input == {"z": 1, "a": {"y": [1, 2.5, None], "b": "é"}, "m": True}
    assert list(tool_input) == ["z", "a", "m"]
    assert list(tool_input["a"]) == ["y", "b"]
    assert json.dumps(tool_input, ensure_ascii=False) == arguments


def test_anthropic_tool_result_contents() -> None:
    rendered = render_anthropic(
        items(
            (Role.TOOL, (result("c1"),)),
            (Role.TOOL, (result("c2", text("")),)),
            (
                Role.TOOL,
                (
                    result(
                        "c3",
                        text("see"),
                        ImageBlock("image/png", data=PNG),
                        DocumentBlock("text/plain", text="log", title="run.log"),
                    ),
                ),
            ),
        )
    )
    assert rendered.messages == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1"},
                {"type": "tool_result", "tool_use_id": "c2", "content": ""},
                {
                    "type": "tool_result",
                    "tool_use_id": "c3",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "log"},
                            "title": "run.log",
                        },
                    ],
                },
            ],
        }
    ]


def test_anthropic_thinking_and_redacted_thinking() -> None:
    rendered = render_anthropic(
        items(
            (
                Role.ASSISTANT,
                (
                    ReasoningBlock("Plan: read it.", signature="EqQBsig=="),
                    ReasoningBlock(redacted_data="b3BhcXVl"),
                    text("ok"),
                ),
            ),
        )
    )
    assert rendered.messages == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Plan: read it.", "signature": "EqQBsig=="},
                {"type": "redacted_thinking", "data": "b3BhcXVl"},
                {"type": "text", "text": "ok"},
            ],
        }
    ]
    assert rendered.warnings == []


def test_anthropic_drops_what_it_would_reject_and_says_so() -> None:
    rendered = render_anthropic(
        items(
            (Role.USER, (text("read this"), DocumentBlock("application/pdf", uri="file-abc123"))),
            (Role.ASSISTANT, (ReasoningBlock("unsigned, from another provider"), text("done"))),
            (Role.ASSISTANT, (ReasoningBlock("only unsigned reasoning"),)),
        )
    )
    assert rendered.messages == [
        {"role": "user", "content": "read this"},
        {"role": "assistant", "content": "done"},
    ]
    assert [w.code for w in rendered.warnings] == ["DOCUMENT_DROPPED", "REASONING_DROPPED", "REASONING_DROPPED"]
    assert "'file-abc123'" in rendered.warnings[0].message
    assert rendered.omitted == {3} and rendered.message_index == {1: 0, 2: 1, 3: -1}


def test_anthropic_puts_tool_results_first_in_a_user_turn() -> None:
    # A reminder injected between a call and its result must not precede the result.
    rendered = render_anthropic(
        items(
            (Role.USER, (text("go"),)),
            (Role.ASSISTANT, (ToolUseBlock("c1", "ls", "{}"),)),
            (Role.SYSTEM, (text("reminder: be brief"),)),
            (Role.TOOL, (result("c1", text("a.py")),)),
            (Role.USER, (text("next"),)),
        )
    )
    assert [b["type"] for b in rendered.messages[2]["content"]] == ["tool_result", "text", "text"]
    assert [b.get("text") for b in rendered.messages[2]["content"][1:]] == ["reminder: be brief", "next"]


def test_anthropic_images_and_documents() -> None:
    rendered = render_anthropic(
        items(
            (
                Role.USER,
                (
                    ImageBlock("image/png", data=PNG, detail="high"),
                    ImageBlock("", uri="https://example.com/a.png"),
                    DocumentBlock("application/pdf", data=PDF, title="spec.pdf"),
                    DocumentBlock("application/pdf", uri="https://example.com/spec.pdf"),
                    DocumentBlock("", text="plain"),
                    DocumentBlock("text/markdown", text="# md"),
                ),
            ),
        )
    )
    assert rendered.messages == [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64},
                    "title": "spec.pdf",
                },
                {"type": "document", "source": {"type": "url", "url": "https://example.com/spec.pdf"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/markdown", "data": "# md"}},
            ],
        }
    ]


def test_anthropic_lone_user_text_stays_a_string_and_is_never_rewritten() -> None:
    rendered = render_anthropic(items((Role.USER, (text("a"),)), (Role.USER, (text("b"),))))
    assert rendered.messages == [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]


@pytest.mark.parametrize("render", [render_openai, render_anthropic])
def test_no_items_render_nothing(render: object) -> None:
    rendered = render([])  # type: ignore[operator]
    assert rendered.messages == []
    assert rendered.system is None
    assert rendered.message_index == {}


@pytest.mark.parametrize("render", [render_openai, render_anthropic])
def test_rendering_does_not_depend_on_earlier_renders(render: object) -> None:
    conversation = items(
        (Role.SYSTEM, (text("s"),)),
        (Role.USER, (text("u"),)),
        (Role.ASSISTANT, (ToolUseBlock("c1", "ls", "{}"),)),
        (Role.TOOL, (result("c1", text("out")),)),
    )
    first = render(conversation)  # type: ignore[operator]
    second = render(conversation)  # type: ignore[operator]
    assert first == second


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_messages_are_serialized_as_the_whole_would_be(history: list[Item]) -> None:
    # Each message is serialized on its own (Anthropic's from its blocks' remembered
    # JSON); joined, they must be the bytes of the whole list serialized at once.
    for render in (render_openai, render_anthropic):
        rendered = render(history)
        assert "[" + ",".join(rendered.messages_json) + "]" == to_json(rendered.messages)


@pytest.mark.parametrize(
    "render",
    [render_openai, render_responses, render_anthropic, render_converse],
    ids=["openai_chat", "openai_responses", "anthropic_messages", "bedrock_converse"],
)
def test_what_a_format_left_out_of_an_item_is_said_again_when_the_item_is_rendered_again(render: Renderer) -> None:
    """An item's rendering is remembered with what the format could not carry of it (the
    warnings, the blocks left out): a later render of the same item hears the same, as its own."""
    dropped_pdf = DocumentBlock("application/pdf", uri="file-abc123")
    unsigned = ReasoningBlock("unsigned, from another provider")
    history = items(
        (Role.USER, (text("read this"), dropped_pdf)),
        (Role.ASSISTANT, (unsigned, text("done"))),
        (Role.ASSISTANT, (ReasoningBlock("only unsigned reasoning"),)),
        (Role.USER, (text("thanks"),), "ana"),
    )
    first, again = render(history), render(history)
    assert first.warnings and first.dropped  # every format leaves something of these out
    assert again.warnings == first.warnings and again.omitted == first.omitted
    assert again.dropped == first.dropped
    assert all(again.dropped[seq] is not blocks for seq, blocks in first.dropped.items())  # each render's own
    left_out = [b for blocks in first.dropped.values() for b in blocks]
    assert all(any(b is block for item in history for block in item.content) for b in left_out)
