"""The OpenAI Responses format through contextd and back (contextd_client/formats/responses.py,
engine/render/responses.py): input items -> the thin client's converter -> stored items ->
a view in Responses (and the other formats) -> the converters again. What a trip cannot
carry is written down where a test strips it before comparing.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.model import (
    Block,
    Item,
    ItemContent,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.pipeline import identity_view as build_view
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_client import Client
from contextd_client.formats import items_from_responses
from tests.helpers import counter, items_from_openai_messages, make_session, stored_from_proto, stored_items
from tests.service.engine.test_pipeline import SCRIPTED, run
from tests.validators import Violation, check_anthropic, check_openai, check_responses

Message = dict[str, Any]

PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR").decode("ascii")


def items_of(input_items: list[Message]) -> list[Item]:
    return stored_from_proto(items_from_responses(input_items))


def view(items: list[Item], fmt: ViewFormat = ViewFormat.OPENAI_RESPONSES) -> tuple[Any, list[Message], list[str]]:
    """(system, messages, warning codes) of a view of `items`, parsed from its JSON text."""
    rendered = build_view(make_session(len(items)), items, ViewRequest(fmt), counter())
    system = json.loads(rendered.system_json) if rendered.system_json else None
    return system, json.loads(rendered.messages_json), [w.code for w in rendered.warnings]


def round_trip(input_items: list[Message]) -> list[Message]:
    return view(items_of(input_items))[1]


# What the OpenAI Agents SDK hands its session for a reasoning model's tool-calling turn:
# the items of `to_input_list()`, ids and encrypted reasoning included.
AGENT_TURNS: list[Message] = [
    {"role": "system", "content": "You are a careful coding agent. Ünïcode stays: ✓"},
    {"role": "user", "content": "Why does the build fail?"},
    {
        "type": "reasoning",
        "id": "rs_01",
        "summary": [{"type": "summary_text", "text": "**Looking at the build**"}],
        "encrypted_content": "gAAAAB-opaque-1",
    },
    {
        "type": "function_call",
        "id": "fc_01",
        "call_id": "call_a",
        "name": "bash",
        "arguments": '{"command": "pytest -x tests/test_app.py"}',
    },
    {
        "type": "function_call",
        "id": "fc_02",
        "call_id": "call_b",
        "name": "read_file",
        "arguments": '{"path": "src/app.py"}',
    },
    {"type": "function_call_output", "call_id": "call_a", "output": "E   ValueError: not enough values\n1 failed"},
    {"type": "function_call_output", "call_id": "call_b", "output": "def main():\n    return parse(argv)\n"},
    {"type": "reasoning", "id": "rs_02", "summary": [], "encrypted_content": "gAAAAB-opaque-2"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_01",
        "status": "completed",
        "content": [{"type": "output_text", "text": "The parser splits on ':' without a limit.", "annotations": []}],
    },
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "And this screenshot?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}", "detail": "high"},
            {"type": "input_file", "file_id": "file-abc"},
        ],
    },
    {"role": "assistant", "content": "It shows the same error."},
]


def test_an_agent_sdk_conversation_round_trips_ids_and_encrypted_reasoning_included() -> None:
    assert round_trip(AGENT_TURNS) == AGENT_TURNS
    check_responses(AGENT_TURNS)


def test_a_turn_is_one_assistant_item_with_its_ids() -> None:
    items = items_of(AGENT_TURNS)
    assert [item.role.value for item in items] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"
    ]  # fmt: skip
    first = items[2].content
    assert first[0] == ReasoningBlock("**Looking at the build**", item_id="rs_01", encrypted_content="gAAAAB-opaque-1")
    assert [(b.id, b.item_id) for b in first[1:] if isinstance(b, ToolUseBlock)] == [
        ("call_a", "fc_01"),
        ("call_b", "fc_02"),
    ]
    assert items[5].content[1] == TextBlock("The parser splits on ':' without a limit.", item_id="msg_01")


def test_the_same_conversation_in_the_other_formats_is_valid_and_leaves_encrypted_reasoning_out() -> None:
    items = items_of(AGENT_TURNS)
    _, chat, chat_warnings = view(items, ViewFormat.OPENAI_CHAT)
    check_openai(chat)
    assert chat[2]["tool_calls"][0] == {
        "id": "call_a",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "pytest -x tests/test_app.py"}'},
    }
    assert chat_warnings.count("REASONING_DROPPED") == 2
    system, messages, warnings = view(items, ViewFormat.ANTHROPIC_MESSAGES)
    check_anthropic(system, messages)
    assert "gAAAAB" not in json.dumps(messages)  # OpenAI's encrypted reasoning is no Anthropic thinking
    assert warnings.count("REASONING_DROPPED") == 2


def test_a_chat_conversation_as_responses_input() -> None:
    chat: list[Message] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py", "is_error": True},
        {"role": "assistant", "content": "Two files.", "name": "coder"},
    ]
    _, messages, warnings = view(items_from_openai_messages(chat))
    check_responses(messages)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py"},
        {"role": "assistant", "content": "Two files."},
    ]
    assert warnings == ["IS_ERROR_DROPPED", "NAME_DROPPED"]


def test_reasoning_is_sent_only_with_the_ids_it_pairs_with() -> None:
    """A stand-in for a turn's text has no id: the reasoning cannot be paired, so it and the
    ids it pairs with are left out; a turn whose reasoning came from another provider likewise."""
    reasoning = ReasoningBlock("plan", item_id="rs_1", encrypted_content="enc")
    call = ToolUseBlock("call_1", "bash", "{}", item_id="fc_1")
    text = TextBlock("done", item_id="msg_1")

    def turn(*blocks: Block) -> list[Message]:
        items = stored_items(
            [
                ItemContent(role=Role.USER, content=(TextBlock("go"),)),
                ItemContent(role=Role.ASSISTANT, content=blocks),
                ItemContent(role=Role.TOOL, content=(ToolResultBlock("call_1"),)),
            ]
        )
        _, messages, _ = view(items)
        check_responses(messages)
        return messages[1:-1]

    assert turn(reasoning, call) == [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
         "encrypted_content": "enc"},
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}", "id": "fc_1"},
    ]  # fmt: skip
    stand_in = TextBlock("[output left out]")
    assert turn(reasoning, stand_in, call) == [
        {"role": "assistant", "content": "[output left out]"},
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"},
    ]
    foreign = ReasoningBlock("thinking", signature="anthropic-signature")
    assert turn(foreign, call) == [{"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"}]
    # A turn that never had reasoning keeps its ids (a non-reasoning model's items).
    assert turn(call, text)[0]["id"] == "fc_1"


# A reasoning model's turn as the Agents SDK hands it over by default (responses stored, no
# `include=["reasoning.encrypted_content"]`): each reasoning item is only its id, a reference
# to what the API stored; output items carry `status` and `logprobs`.
ID_ONLY_REASONING: list[Message] = [
    {"role": "user", "content": "Run the tests."},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "bash", "arguments": "{}",
     "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "1 failed"},
    {"type": "reasoning", "id": "rs_2", "summary": []},
    {"type": "message", "role": "assistant", "id": "msg_2", "status": "completed",
     "content": [{"type": "output_text", "text": "One test fails.", "annotations": [], "logprobs": []}]},
    {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "bash", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_2", "output": ""},
    {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "enc"},
    {"type": "message", "role": "assistant", "id": "msg_3", "status": "completed",
     "content": [{"type": "output_text", "text": "Done.", "annotations": [], "logprobs": []}]},
]  # fmt: skip


def test_a_reasoning_item_that_is_only_an_id_is_left_out_with_the_ids_it_pairs_with() -> None:
    """The service refuses an empty reasoning block, and the API refuses an item whose id pairs
    with a reasoning item the input lacks: the reasoning goes, the items it led to lose their ids."""
    messages = round_trip(ID_ONLY_REASONING)
    assert messages == [
        {"role": "user", "content": "Run the tests."},
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "1 failed"},
        {"role": "assistant", "content": "One test fails."},
        {"type": "function_call", "call_id": "call_2", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": ""},
        {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "enc"},
        {"type": "message", "role": "assistant", "id": "msg_3", "status": "completed",
         "content": [{"type": "output_text", "text": "Done.", "annotations": []}]},
    ]  # fmt: skip
    check_responses(messages, pairs={"fc_1": "rs_1", "msg_2": "rs_2", "fc_2": "rs_2", "msg_3": "rs_3"})


@pytest.mark.parametrize(
    ("input_items", "error"),
    [
        ([{"type": "web_search_call", "id": "ws_1"}], r"input\[0\]\.type: unsupported item 'web_search_call'"),
        ([{"role": "tool", "content": "x"}], r"input\[0\]\.role: unsupported role 'tool'"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], r"input\[0\]\.call_id: missing"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}], r"input\[0\]\.arguments"),
        ([{"type": "function_call_output", "output": "x"}], r"input\[0\]\.call_id: missing"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], r"input\[0\]\.content\[0\]\.type: unsupported"),
        ([{"role": "user", "content": [{"type": "input_file"}]}], r"input_file needs file_data, file_id or file_url"),
        ([{"role": "user", "content": 5}], r"input\[0\]\.content: expected a string or a list of parts"),
        ([{"type": "reasoning", "id": "rs", "summary": "x"}], r"input\[0\]\.summary: expected a list"),
        (["hello"], r"input\[0\]: expected an object"),
        (
            [{"type": "message", "role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}],
            r"an assistant message carries text only",
        ),
    ],
)
def test_converter_errors_name_the_field(input_items: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        items_from_responses(input_items)


def test_a_string_input_is_one_user_message() -> None:
    assert round_trip("hello") == [{"role": "user", "content": "hello"}]  # type: ignore[arg-type]


def test_the_validator_refuses_what_the_api_refuses() -> None:
    orphan_call_id = [{"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c", "output": ""}]  # fmt: skip
    check_responses(orphan_call_id)  # a non-reasoning model's call
    with pytest.raises(Violation, match="without the reasoning it pairs with"):
        check_responses(orphan_call_id, pairs={"fc_1": "rs_1"})
    unpaired = [{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "assistant", "content": "hi"}]
    with pytest.raises(Violation, match="without an id"):
        check_responses(unpaired)
    with pytest.raises(Violation, match="never answered"):
        check_responses([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])


# ------------------------------------------------------------------ properties


def pairs_of(input_items: list[Message]) -> dict[str, str]:
    """Each id -> the reasoning it was produced after (in its turn)."""
    pairs, reasoning = {}, ""
    for item in input_items:
        if item.get("type") == "reasoning":
            reasoning = item["id"]
        elif item.get("role") in ("user", "system", "developer"):
            reasoning = ""
        elif "id" in item and reasoning:
            pairs[item["id"]] = reasoning
    return pairs


@st.composite
def responses_conversations(draw: st.DrawFn) -> list[Message]:
    words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
    out: list[Message] = [{"role": "user", "content": draw(words)}]
    call, ids = 0, 0
    for _ in range(draw(st.integers(1, 6))):
        reasoning = draw(st.booleans())
        if reasoning:
            ids += 1
            summary = [{"type": "summary_text", "text": draw(words)}] if draw(st.booleans()) else []
            out.append({"type": "reasoning", "id": f"rs_{ids}", "summary": summary, "encrypted_content": "e"})
        calls = []
        texted = draw(st.booleans()) or not reasoning
        if texted:
            ids += 1
            text = {"type": "output_text", "text": draw(words), "annotations": []}
            out.append({"type": "message", "role": "assistant", "id": f"msg_{ids}", "status": "completed",
                        "content": [text]})  # fmt: skip
        for _ in range(draw(st.integers(0 if texted else 1, 2))):
            call, ids = call + 1, ids + 1
            calls.append(f"call_{call}")
            arguments = json.dumps({"arg": draw(words)}, ensure_ascii=draw(st.booleans()))
            out.append({"type": "function_call", "id": f"fc_{ids}", "call_id": f"call_{call}", "name": "bash",
                        "arguments": arguments})  # fmt: skip
        for call_id in calls:
            out.append({"type": "function_call_output", "call_id": call_id, "output": draw(words)})
        if draw(st.booleans()):
            out.append({"role": "user", "content": draw(words)})
    return out


@settings(max_examples=120, deadline=None)
@given(responses_conversations())
def test_any_responses_conversation_round_trips_and_is_valid(input_items: list[Message]) -> None:
    check_responses(input_items, pairs_of(input_items))
    assert round_trip(copy.deepcopy(input_items)) == input_items


@pytest.mark.parametrize("placeholder", [True, False])
def test_edits_leave_responses_views_the_api_accepts(placeholder: bool) -> None:
    """The pipeline's scripted edits (drops, first lines) over a reasoning model's turns."""
    items = items_of(AGENT_TURNS)
    for drop, shorten in [("V", "d"), ("d", "V"), ("e", "T")]:
        out = run(items, SCRIPTED % ("true" if placeholder else "false", drop, shorten),
                  fmt=ViewFormat.OPENAI_RESPONSES, force=True)  # fmt: skip
        check_responses(json.loads(out.view.messages_json), pairs=pairs_of(AGENT_TURNS))


# ------------------------------------------------------------------ service


def test_responses_through_the_service(client: Client) -> None:
    session = client.create_session().id
    client.append_responses(session, AGENT_TURNS)
    assert client.render_responses(session) == AGENT_TURNS
    id_only = client.create_session().id
    client.append_responses(id_only, ID_ONLY_REASONING)  # the service takes what the converter keeps
    assert client.render_responses(id_only) == round_trip(ID_ONLY_REASONING)
    tools = client.render_view(session, "openai_responses", tools=[{"type": "function", "name": "bash"}])
    assert tools.messages == AGENT_TURNS
