"""The Amazon Bedrock Converse format through contextd and back
(contextd_client/formats/converse.py, engine/render/converse.py).

The pipeline of test_formats.py, without a server: Converse dicts -> the
thin client's converter -> api mapping -> append checks and tool-result
linking -> stored items -> a view -> (for the cross-format trips) another
converter. What the format cannot carry is written down where a test strips
or normalizes it before comparing.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.model import (
    DocumentBlock,
    ImageBlock,
    Item,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.pipeline import identity_view as build_view
from contextd.engine.render.converse import render_converse
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_client import View
from contextd_client import ViewFormat as ClientViewFormat
from contextd_client.formats import items_from_converse
from contextd_client.v1 import content_pb2 as pb
from tests.clients.test_formats import (
    OPENAI_CONVERSATION,
    PNG,
    PNG_B64,
    anthropic_view,
    openai_conversations,
)
from tests.helpers import (
    counter,
    items_from_anthropic_messages,
    items_from_converse_messages,
    items_from_openai_messages,
    make_item,
    make_session,
)
from tests.validators import check_converse

Message = dict[str, Any]

PDF = b"%PDF-1.4 a tiny document"
PDF_B64 = base64.b64encode(PDF).decode("ascii")
REDACTED_B64 = base64.b64encode(b"\x01\x02 opaque reasoning").decode("ascii")


# ----------------------------------------------------------------- pipeline


def converse_view(items: list[Item]) -> tuple[Any, list[Message]]:
    """(system, messages) of a Converse view of `items`, parsed from its JSON text."""
    view = build_view(make_session(len(items)), items, ViewRequest(ViewFormat.BEDROCK_CONVERSE), counter())
    system = json.loads(view.system_json) if view.system_json else None
    messages: list[Message] = json.loads(view.messages_json)
    assert view.messages_json == json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    return system, messages


def converse_round_trip(messages: list[Message], system: list[Message] | None = None) -> tuple[Any, list[Message]]:
    return converse_view(items_from_converse_messages(messages, system))


def converse_via_anthropic(messages: list[Message], system: list[Message] | None = None) -> tuple[Any, list[Message]]:
    """Converse messages -> items -> Anthropic view -> items -> Converse view."""
    anthropic_system, anthropic = anthropic_view(items_from_converse_messages(messages, system))
    return converse_view(items_from_anthropic_messages(anthropic, anthropic_system))


# ---------------------------------------------------- a Converse conversation

CONVERSE_SYSTEM: list[Message] = [{"text": "You are a careful coding agent."}, {"text": "Answer briefly."}]

CONVERSE_CONVERSATION: list[Message] = [
    {
        "role": "user",
        "content": [
            {"text": "Run the tests; the spec and the error are attached."},
            {"document": {"format": "pdf", "name": "spec (v2)", "source": {"bytes": PDF_B64}}},
            {"image": {"format": "png", "source": {"bytes": PNG_B64}}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "Run pytest first.", "signature": "EqQBCkYIBxgCKkBsig=="}}},
            {"text": "Running the tests and reading the config."},
            {"toolUse": {"toolUseId": "tooluse_01", "name": "bash", "input": {"command": "pytest -q", "timeout": 60}}},
            {"toolUse": {"toolUseId": "tooluse_02", "name": "read_file", "input": {"path": "setup.cfg"}}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "tooluse_01",
                    "content": [
                        {"text": "1 failed, 3 passed"},
                        {"image": {"format": "png", "source": {"bytes": PNG_B64}}},
                    ],
                    "status": "error",
                }
            },
            {"toolResult": {"toolUseId": "tooluse_02", "content": [{"text": "[tool:pytest]\naddopts = -q\n"}]}},
            {"text": "Fix it, please."},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"redactedContent": REDACTED_B64}},
            {
                "toolUse": {
                    "toolUseId": "tooluse_03",
                    "name": "edit",
                    "input": {"path": "a.py", "old": "x = 1", "new": "x = 2"},
                }
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "tooluse_03",
                    "content": [
                        {"document": {"format": "txt", "name": "diff", "source": {"text": "-x = 1\n+x = 2\n"}}},
                    ],
                }
            }
        ],
    },
    {"role": "assistant", "content": [{"text": "Fixed: x is now 2."}]},
]


def test_converse_conversation_is_stored_as_expected() -> None:
    items = items_from_converse_messages(CONVERSE_CONVERSATION, CONVERSE_SYSTEM)
    # Each toolResult becomes a tool item; the user text after them a user item of its own.
    assert [i.role for i in items] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.TOOL,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    results = [i.tool_result for i in items if i.tool_result is not None]
    assert [(r.tool_use_id, r.name, r.is_error) for r in results] == [
        ("tooluse_01", "bash", True),
        ("tooluse_02", "read_file", False),
        ("tooluse_03", "edit", False),
    ]
    assert items[1].content[1] == DocumentBlock("application/pdf", PDF, title="spec (v2)")
    assert items[6].content[0] == ReasoningBlock(redacted_data=REDACTED_B64)


def test_converse_conversation_round_trips() -> None:
    system, messages = converse_round_trip(CONVERSE_CONVERSATION, CONVERSE_SYSTEM)
    assert system == CONVERSE_SYSTEM
    assert messages == CONVERSE_CONVERSATION
    check_converse(system, messages)
    # Key order of tool inputs is kept too, not just dict equality.
    assert list(messages[3]["content"][1]["toolUse"]["input"]) == ["path", "old", "new"]


def test_converse_conversation_survives_a_trip_through_anthropic() -> None:
    # Signed and redacted reasoning, images, documents (title <-> name) and the error
    # status all have an Anthropic form; a text document goes as a text source.
    assert converse_via_anthropic(CONVERSE_CONVERSATION, CONVERSE_SYSTEM) == (CONVERSE_SYSTEM, CONVERSE_CONVERSATION)


def test_the_sdk_forms_of_bytes_are_taken_too() -> None:
    """boto3 and Strands hand bytes over as bytes; the JSON API as base64 text."""
    raw = copy.deepcopy(CONVERSE_CONVERSATION)
    raw[0]["content"][1]["document"]["source"]["bytes"] = PDF
    raw[0]["content"][2]["image"]["source"]["bytes"] = bytearray(PNG)
    raw[2]["content"][0]["toolResult"]["content"][1]["image"]["source"]["bytes"] = PNG
    raw[3]["content"][0]["reasoningContent"]["redactedContent"] = base64.b64decode(REDACTED_B64)
    assert items_from_converse(raw, CONVERSE_SYSTEM) == items_from_converse(CONVERSE_CONVERSATION, CONVERSE_SYSTEM)


def test_converse_kwargs_give_the_sdk_bytes() -> None:
    system, messages = converse_round_trip(CONVERSE_CONVERSATION, CONVERSE_SYSTEM)
    view = _client_view(system, messages)
    kwargs = view.converse_kwargs()
    assert kwargs["system"] == CONVERSE_SYSTEM
    sent = kwargs["messages"]
    assert sent[0]["content"][1]["document"]["source"] == {"bytes": PDF}
    assert sent[0]["content"][2]["image"]["source"] == {"bytes": PNG}
    assert sent[2]["content"][0]["toolResult"]["content"][1]["image"]["source"] == {"bytes": PNG}
    assert sent[3]["content"][0] == {"reasoningContent": {"redactedContent": base64.b64decode(REDACTED_B64)}}
    assert sent[4]["content"][0]["toolResult"]["content"][0]["document"]["source"] == {"text": "-x = 1\n+x = 2\n"}
    # A tool input's own "bytes" key is data, not a blob; and the view itself is left alone.
    assert view.messages == messages
    assert items_from_converse(sent, kwargs["system"]) == items_from_converse(messages, system)
    assert "system" not in _client_view(None, messages).converse_kwargs()


def _client_view(system: Any, messages: list[Message]) -> View:
    return View(
        session_id="s-1",
        version=len(messages),
        format=ClientViewFormat.BEDROCK_CONVERSE,
        encoding="cl100k_base",
        messages=messages,
        system=system,
        items=(),
        item_tokens=0,
        framing_tokens=0,
        total_tokens=0,
        budget_tokens=0,
        over_budget=False,
        warnings=(),
        messages_json=json.dumps(messages),
    )


def test_what_the_converse_trip_normalizes() -> None:
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                {"text": "look"},
                {"text": ""},  # an empty text: skipped
                {"cachePoint": {"type": "default"}},  # a request mark, not content: skipped
                {"image": {"format": "jpeg", "source": {"s3Location": {"uri": "s3://b/a.jpg", "bucketOwner": "1"}}}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "stat", "input": {"path": "é"}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "content": [{"json": {"size": 3, "name": "é"}}],  # a json result becomes its text
                        "status": "success",  # the default: not written back
                    }
                }
            ],
        },
        {"role": "assistant", "content": [{"text": ""}]},  # nothing left: no item
    ]
    system, rendered = converse_round_trip(messages, [{"text": "Be brief."}, {"cachePoint": {"type": "default"}}])
    assert system == [{"text": "Be brief."}]
    assert rendered == [
        {
            "role": "user",
            "content": [
                {"text": "look"},
                # The bucket owner has no field in contextd.
                {"image": {"format": "jpeg", "source": {"s3Location": {"uri": "s3://b/a.jpg"}}}},
            ],
        },
        messages[1],
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": '{"size": 3, "name": "é"}'}]}}],
        },
    ]
    check_converse(system, rendered)


# ----------------------------------------------------- other formats as Converse


def test_openai_conversation_as_converse() -> None:
    items = items_from_openai_messages(OPENAI_CONVERSATION)
    system, messages = converse_view(items)
    assert system == [{"text": "You are a careful coding agent."}]
    assert messages == [
        {
            "role": "user",
            "content": [
                {"text": "Here is the failing screen. Does a.py exist?"},
                {"image": {"format": "png", "source": {"bytes": PNG_B64}}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"toolUse": {"toolUseId": "call_1", "name": "read_file", "input": {"path": "a.py"}}},
                {
                    "toolUse": {
                        "toolUseId": "call_2",
                        "name": "list_dir",
                        "input": {"path": ".", "depth": 2, "hidden": False, "glob": "*.py", "ratio": 0.5},
                    }
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "call_1", "content": [{"text": "print('hi')\n"}]}},
                {
                    "toolResult": {
                        "toolUseId": "call_2",
                        "content": [{"text": "Permission denied: ."}],
                        "status": "error",
                    }
                },
            ],
        },
        {"role": "assistant", "content": [{"text": "a.py exists and prints hi; listing the directory failed."}]},
    ]
    check_converse(system, messages)
    assert render_converse(items).warnings == []


@settings(max_examples=100, deadline=None)
@given(openai_conversations())
def test_any_openai_conversation_gives_a_converse_view_bedrock_accepts(messages: list[Message]) -> None:
    # Blank texts, empty outputs and names are what Converse cannot take as they are.
    system, converse = converse_view(items_from_openai_messages(messages))
    check_converse(system, converse)


# ------------------------------------------------------ what the view leaves out


def test_the_converse_render_leaves_out_what_converse_refuses_and_says_so() -> None:
    items = [
        make_item(Role.SYSTEM, TextBlock("Be brief."), seq=1, name="ops"),
        make_item(Role.USER, TextBlock("  \n"), ImageBlock("", uri="https://x/a.png"), seq=2),
        make_item(
            Role.ASSISTANT,
            ReasoningBlock("why", item_id="rs_1", encrypted_content="gAAA"),  # OpenAI's: no signature
            ToolUseBlock("c1", "ls", "{}"),
            seq=3,
        ),
        make_item(Role.TOOL, ToolResultBlock("c1", (TextBlock(""), ImageBlock("image/bmp", b"BM"))), seq=4),
        make_item(Role.SYSTEM, TextBlock("Stop soon."), seq=5),
    ]
    rendered = render_converse(items)
    assert rendered.system == [{"text": "Be brief."}]
    assert rendered.messages == [
        {"role": "user", "content": [{"text": "(earlier messages left out)"}]},  # Converse opens with the user
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "ls", "input": {}}}]},
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "c1", "content": [{"text": "(no output)"}]}},
                {"text": "Stop soon."},
            ],
        },
    ]
    assert [w.code for w in rendered.warnings] == [
        "NAME_DROPPED",
        "BLANK_TEXT_DROPPED",
        "IMAGE_DROPPED",
        "REASONING_DROPPED",
        "IMAGE_DROPPED",
        "SYSTEM_AS_USER",
    ]
    assert rendered.omitted == {2}
    assert rendered.message_index == {1: -1, 2: -1, 3: 1, 4: 2, 5: 2}
    check_converse(rendered.system, rendered.messages)


def test_document_names_are_sanitized_and_never_repeat() -> None:
    items = [
        make_item(
            Role.USER,
            TextBlock("three files"),
            DocumentBlock("application/pdf", PDF, title="Report_2024.final.pdf"),
            DocumentBlock("text/markdown", text="# notes"),
            DocumentBlock("text/csv", uri="s3://bucket/table.csv"),
            seq=1,
        ),
        make_item(Role.ASSISTANT, TextBlock("and?"), seq=2),
        make_item(
            Role.USER,
            DocumentBlock("application/pdf", PDF, title="report 2024 FINAL pdf"),  # the same name, case aside
            DocumentBlock("application/zip", PDF, title="a.zip"),
            DocumentBlock("application/pdf", uri="https://x/a.pdf"),
            seq=3,
        ),
    ]
    rendered = render_converse(items)
    documents = [b["document"] for m in rendered.messages for b in m["content"] if "document" in b]
    assert [(d["format"], d["name"], next(iter(d["source"]))) for d in documents] == [
        ("pdf", "Report 2024 final pdf", "bytes"),
        ("md", "document", "text"),
        ("csv", "document (2)", "s3Location"),
        ("pdf", "report 2024 FINAL pdf (2)", "bytes"),
    ]
    # A document needs text beside it in its message.
    assert rendered.messages[2]["content"][-1] == {"text": "(document attached)"}
    assert [w.code for w in rendered.warnings] == ["DOCUMENT_DROPPED", "DOCUMENT_DROPPED"]
    check_converse(rendered.system, rendered.messages)


# ---------------------------------------------------------------- properties

_texts = st.text(min_size=1, max_size=20).filter(lambda t: t.strip())
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_b64 = st.binary(min_size=1, max_size=24).map(lambda data: base64.b64encode(data).decode("ascii"))
_images = st.builds(
    lambda fmt, source: {"image": {"format": fmt, "source": source}},
    st.sampled_from(["png", "jpeg", "gif", "webp"]),
    st.one_of(
        _b64.map(lambda data: {"bytes": data}),
        st.just({"s3Location": {"uri": "s3://bucket/key"}}),
    ),
)
_reasoning = st.one_of(
    st.builds(
        lambda text, signature: {"reasoningContent": {"reasoningText": {"text": text, "signature": signature}}},
        _texts,
        st.from_regex(r"[A-Za-z0-9+/]{4,16}", fullmatch=True),
    ),
    _b64.map(lambda data: {"reasoningContent": {"redactedContent": data}}),
)


@st.composite
def converse_conversations(draw: st.DrawFn) -> tuple[list[Message] | None, list[Message]]:
    """A well-formed request: [system] (user (assistant calls, user results [text])* assistant)+,
    documents named apart, each beside text."""
    documents = 0

    def document(kind: str) -> Message:
        nonlocal documents
        documents += 1
        name = f"doc {documents}"
        if kind == "text":
            return {"document": {"format": "md", "name": name, "source": {"text": draw(_texts)}}}
        return {"document": {"format": "pdf", "name": name, "source": {"bytes": draw(_b64)}}}

    def user_blocks() -> list[Message]:
        blocks: list[Message] = [{"text": draw(_texts)}]
        for kind in draw(st.lists(st.sampled_from(["text", "image", "bytes", "markdown"]), max_size=2)):
            if kind == "text":
                blocks.append({"text": draw(_texts)})
            elif kind == "image":
                blocks.append(draw(_images))
            else:
                blocks.append(document("text" if kind == "markdown" else "bytes"))
        return blocks

    system = draw(st.none() | st.lists(_texts.map(lambda t: {"text": t}), min_size=1, max_size=2))
    messages: list[Message] = []
    calls = 0
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": user_blocks()})
        for _ in range(draw(st.integers(0, 2))):
            content: list[Message] = []
            if draw(st.booleans()):
                content.append(draw(_reasoning))
            if draw(st.booleans()):
                content.append({"text": draw(_texts)})
            ids = []
            for _ in range(draw(st.integers(1, 3))):
                calls += 1
                ids.append(f"tooluse_{calls}")
                arguments = draw(st.dictionaries(st.text(max_size=8), _json_values, max_size=4))
                content.append({"toolUse": {"toolUseId": ids[-1], "name": "f", "input": arguments}})
            messages.append({"role": "assistant", "content": content})
            results: list[Message] = []
            for call in ids:
                parts: list[Message] = []
                for kind in draw(
                    st.lists(st.sampled_from(["text", "image", "bytes", "markdown"]), min_size=1, max_size=2)
                ):
                    if kind == "text":
                        parts.append({"text": draw(_texts)})
                    elif kind == "image":
                        parts.append(draw(_images))
                    else:
                        parts.append(document("text" if kind == "markdown" else "bytes"))
                result: Message = {"toolUseId": call, "content": parts}
                if draw(st.booleans()):
                    result["status"] = "error"
                results.append({"toolResult": result})
            if draw(st.booleans()):
                results.append({"text": draw(_texts)})
            messages.append({"role": "user", "content": results})
        messages.append({"role": "assistant", "content": [{"text": draw(_texts)}]})
    return system, messages


@settings(max_examples=150, deadline=None)
@given(converse_conversations())
def test_any_converse_conversation_round_trips_into_a_view_bedrock_accepts(
    conversation: tuple[list[Message] | None, list[Message]],
) -> None:
    system, messages = conversation
    check_converse(system, messages)  # the generator's own requests are valid
    original = copy.deepcopy(conversation)
    assert converse_round_trip(messages, system) == (system, messages)
    assert conversation == original  # the converter does not touch its input


# ------------------------------------------------------------ converter input


@pytest.mark.parametrize(
    ("messages", "system", "error"),
    [
        ([{"role": "system", "content": []}], None, "messages[0].role: unsupported role 'system' (user, assistant)"),
        ([{"role": "user", "content": "hi"}], None, "messages[0].content: expected a list of blocks, not str"),
        ([{"role": "user"}], None, "messages[0].content: expected a list of blocks, not NoneType"),
        (["hi"], None, "messages[0]: expected an object, not str"),
        (
            [{"role": "user", "content": [{"video": {"format": "mp4"}}]}],
            None,
            "messages[0].content[0]: unsupported block 'video'",
        ),
        (
            [{"role": "user", "content": [{"text": "a", "image": {}}]}],
            None,
            "messages[0].content[0]: a content block sets exactly one member, not ['image', 'text']",
        ),
        ([{"role": "user", "content": [{"text": 3}]}], None, "messages[0].content[0].text: expected a string, not int"),
        (
            [{"role": "user", "content": [{"text": "a"}, {"image": {"format": "bmp", "source": {"bytes": "AA=="}}}]}],
            None,
            "messages[0].content[1].image.format: unsupported format 'bmp' (png, jpeg, gif, webp)",
        ),
        (
            [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "@@@"}}}]}],
            None,
            "messages[0].content[0].image.source.bytes: bad base64 (Only base64 data is allowed)",
        ),
        (
            [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": 7}}}]}],
            None,
            "messages[0].content[0].image.source.bytes: expected bytes or base64 text, not int",
        ),
        (
            [{"role": "user", "content": [{"image": {"format": "png"}}]}],
            None,
            "messages[0].content[0].image.source: expected an object, not NoneType",
        ),
        (
            [{"role": "user", "content": [{"image": {"format": "png", "source": {"text": "x"}}}]}],
            None,
            "messages[0].content[0].image.source: unsupported source 'text'",
        ),
        (
            [{"role": "user", "content": [{"image": {"format": "png", "source": {"s3Location": {}}}}]}],
            None,
            "messages[0].content[0].image.source.s3Location.uri: missing",
        ),
        (
            [{"role": "user", "content": [{"document": {"format": "pdf", "source": {"bytes": "AA=="}}}]}],
            None,
            "messages[0].content[0].document.name: missing",
        ),
        (
            [{"role": "user", "content": [{"document": {"format": "pptx", "name": "d", "source": {"bytes": "AA=="}}}]}],
            None,
            "messages[0].content[0].document.format: unsupported format 'pptx' "
            "(pdf, csv, doc, docx, xls, xlsx, html, txt, md)",
        ),
        (
            [{"role": "user", "content": [{"document": {"format": "pdf", "name": "d", "source": {"content": []}}}]}],
            None,
            "messages[0].content[0].document.source: unsupported source 'content'",
        ),
        (
            [{"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "input": {}}}]}],
            None,
            "messages[0].content[0].toolUse.name: missing",
        ),
        (
            [{"role": "assistant", "content": [{"toolUse": {"toolUseId": 1, "name": "f"}}]}],
            None,
            "messages[0].content[0].toolUse.toolUseId: expected a string, not int",
        ),
        (
            [{"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {1j}}}]}],
            None,
            "messages[0].content[0].toolUse.input: not JSON (Object of type set is not JSON serializable)",
        ),
        (
            [{"role": "user", "content": [{"toolResult": {"content": []}}]}],
            None,
            "messages[0].content[0].toolResult.toolUseId: missing",
        ),
        (
            [{"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [], "status": "ok"}}]}],
            None,
            "messages[0].content[0].toolResult.status: unsupported status 'ok' (success, error)",
        ),
        (
            [{"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": "done"}}]}],
            None,
            "messages[0].content[0].toolResult.content: expected a list of blocks, not str",
        ),
        (
            [{"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"video": {}}]}}]}],
            None,
            "messages[0].content[0].toolResult.content[0]: unsupported block 'video'",
        ),
        (
            [{"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": None}]}}]}],
            None,
            "messages[0].content[0].toolResult.content[0].text: missing",
        ),
        (
            [{"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"signature": "s"}}}]}],
            None,
            "messages[0].content[0].reasoningContent.reasoningText.text: missing",
        ),
        (
            [{"role": "assistant", "content": [{"reasoningContent": {"redactedContent": "%%"}}]}],
            None,
            "messages[0].content[0].reasoningContent.redactedContent: bad base64 (Only base64 data is allowed)",
        ),
        (
            [{"role": "assistant", "content": [{"reasoningContent": {"summary": "x"}}]}],
            None,
            "messages[0].content[0].reasoningContent: unsupported reasoning 'summary'",
        ),
        ([], [{"guardContent": {"text": {"text": "x"}}}], "system[0]: unsupported block 'guardContent'"),
        ([], "Be brief.", "system: expected a list of blocks, not str"),
        ([], [{"text": 1}], "system[0].text: expected a string, not int"),
    ],
)
def test_converse_converter_errors_name_the_field(messages: list[Any], system: Any, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        items_from_converse(messages, system)


def test_the_converter_splits_user_messages_in_order() -> None:
    items = items_from_converse(
        [
            {
                "role": "user",
                "content": [
                    {"text": "a"},
                    {"toolResult": {"toolUseId": "t1", "content": []}},
                    {"text": "b"},
                    {"toolResult": {"toolUseId": "t2", "content": [{"text": "out"}], "status": "error"}},
                ],
            }
        ]
    )
    assert items == [
        pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="a"))]),
        pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=pb.ToolResultBlock(tool_use_id="t1"))]),
        pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="b"))]),
        pb.Item(
            role=pb.ROLE_TOOL,
            content=[
                pb.ContentBlock(
                    tool_result=pb.ToolResultBlock(
                        tool_use_id="t2", content=[pb.ContentBlock(text=pb.TextBlock(text="out"))], is_error=True
                    )
                )
            ],
        ),
    ]


def test_the_shapes_strands_keeps_are_taken() -> None:
    """Strands keeps an answer with citations as Bedrock streamed it (``citationsContent``) and an S3
    source in its own form (``{"location": {"type": "s3", ...}}``): the text and the uri are kept."""
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                {"text": "What does the spec say?"},
                {
                    "document": {
                        "format": "pdf",
                        "name": "spec",
                        "source": {"location": {"type": "s3", "uri": "s3://b/s.pdf"}},
                    }
                },
                {
                    "image": {
                        "format": "png",
                        "source": {"location": {"type": "s3", "uri": "s3://b/a.png", "bucketOwner": "1"}},
                    }
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "citationsContent": {
                        "citations": [
                            {
                                "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 12}},
                                "sourceContent": [{"text": "The answer: 42"}],
                                "title": "spec",
                            }
                        ],
                        "content": [{"text": "The spec says "}, {"text": "42."}],
                    }
                },
                {"citationsContent": {"citations": [], "content": []}},  # no text: nothing
            ],
        },
    ]
    system, rendered = converse_round_trip(messages)
    assert rendered == [
        {
            "role": "user",
            "content": [
                {"text": "What does the spec say?"},
                {"document": {"format": "pdf", "name": "spec", "source": {"s3Location": {"uri": "s3://b/s.pdf"}}}},
                {"image": {"format": "png", "source": {"s3Location": {"uri": "s3://b/a.png"}}}},
            ],
        },
        {"role": "assistant", "content": [{"text": "The spec says 42."}]},
    ]
    check_converse(system, rendered)
    for block, error in [
        (
            {"image": {"format": "png", "source": {"location": {"type": "url", "uri": "https://x/a.png"}}}},
            "messages[0].content[0].image.source.location.type: unsupported location 'url' (s3)",
        ),
        (
            {"citationsContent": {"content": [{"text": 1}]}},
            "messages[0].content[0].citationsContent.content[0].text: expected a string, not int",
        ),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
            items_from_converse([{"role": "user", "content": [block]}])
