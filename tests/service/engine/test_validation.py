"""Append checks: check_batch and link_tool_results (service/contextd/engine/validation.py)."""

from __future__ import annotations

import pytest

from contextd.engine.errors import FieldViolation, InvalidArgument, LimitExceeded
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
from contextd.engine.validation import Limits, ToolCall, check_batch, item_bytes, link_tool_results

LIMITS = Limits(max_batch_items=10, max_item_bytes=10_000)


def item(role: Role, *blocks: Block) -> ItemContent:
    return ItemContent(role=role, content=blocks)


def user(text: str = "hi") -> ItemContent:
    return item(Role.USER, TextBlock(text))


def call(call_id: str, name: str = "read_file", input_json: str = '{"path": "a.py"}') -> ToolUseBlock:
    return ToolUseBlock(call_id, name, input_json)


def result(call_id: str, text: str = "out", *, name: str = "", is_error: bool = False) -> ItemContent:
    return item(Role.TOOL, ToolResultBlock(call_id, (TextBlock(text),), is_error=is_error, name=name))


def violations_of(items: list[ItemContent], limits: Limits = LIMITS) -> tuple[FieldViolation, ...]:
    with pytest.raises(InvalidArgument) as caught:
        check_batch(items, limits)
    return caught.value.violations


def only_violation(*blocks: Block, role: Role = Role.USER) -> FieldViolation:
    found = violations_of([item(role, *blocks)])
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------- batch shape


def test_a_valid_batch_passes() -> None:
    batch = [
        item(Role.SYSTEM, TextBlock("be brief")),
        item(Role.USER, TextBlock("look"), ImageBlock("image/png", data=b"\x89PNG"), DocumentBlock("", text="")),
        item(Role.ASSISTANT, ReasoningBlock("hmm", "sig"), TextBlock("ok"), call("c1"), call("c2", "ls", "{}")),
        result("c1"),
        item(Role.TOOL, ToolResultBlock("c2")),  # an empty output is a real answer
    ]
    check_batch(batch, LIMITS)  # raises on any violation


def test_empty_batch() -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_batch([], LIMITS)
    assert type(caught.value) is InvalidArgument
    assert caught.value.violations == (FieldViolation("items", "the batch is empty: append at least one item"),)
    assert caught.value.reason == "INVALID_ARGUMENT"


def test_batch_over_the_item_limit() -> None:
    limits = Limits(max_batch_items=2, max_item_bytes=100)
    check_batch([user(), user()], limits)
    with pytest.raises(LimitExceeded) as caught:
        check_batch([user(), user(), user()], limits)
    assert caught.value.reason == "LIMIT_EXCEEDED"
    assert caught.value.violations == (
        FieldViolation("items", "3 items, over the limit of 2 per append (max_batch_items)"),
    )


def test_item_over_the_byte_limit_counts_utf8_bytes() -> None:
    limits = Limits(max_batch_items=10, max_item_bytes=1_000)
    check_batch([user("é" * 500)], limits)  # 1,000 bytes: at the limit
    with pytest.raises(LimitExceeded) as caught:
        check_batch([user(), user("é" * 501)], limits)
    assert caught.value.violations == (
        FieldViolation("items[1]", "1,002 bytes, over the limit of 1,000 bytes per item (max_item_bytes)"),
    )


@pytest.mark.parametrize(
    ("block", "size"),
    [
        (TextBlock("héllo"), 6),
        (ToolUseBlock("c1", "ls", "{}"), 6),
        (ToolResultBlock("c1", (TextBlock("ab"), ImageBlock("image/png", data=b"123"))), 7),
        (ImageBlock("image/png", data=b"1234"), 4),
        (ImageBlock("", uri="https://x/a.png"), 15),
        (DocumentBlock("text/plain", text="doc"), 3),
        (DocumentBlock("application/pdf", data=b"%PDF"), 4),
        (ReasoningBlock("ab", "cd", ""), 4),
        (ReasoningBlock("", "", "xyz"), 3),
    ],
)
def test_item_bytes_per_block(block: Block, size: int) -> None:
    assert item_bytes(item(Role.USER, block)) == size


# --------------------------------------------------------- roles and blocks


@pytest.mark.parametrize(
    ("role", "block", "description"),
    [
        (Role.SYSTEM, ImageBlock("image/png", data=b"x"), "a system item cannot hold an image block (allowed: text)"),
        (
            Role.SYSTEM,
            DocumentBlock("", text="d"),
            "a system item cannot hold a document block (allowed: text)",
        ),
        (
            Role.USER,
            call("c1"),
            "a user item cannot hold a tool_use block (allowed: text, image, document)",
        ),
        (
            Role.USER,
            ReasoningBlock("r"),
            "a user item cannot hold a reasoning block (allowed: text, image, document)",
        ),
        (
            Role.ASSISTANT,
            ImageBlock("image/png", data=b"x"),
            "an assistant item cannot hold an image block (allowed: text, tool_use, reasoning)",
        ),
        (
            Role.ASSISTANT,
            ToolResultBlock("c1"),
            "an assistant item cannot hold a tool_result block (allowed: text, tool_use, reasoning)",
        ),
        (Role.TOOL, TextBlock("out"), "a tool item cannot hold a text block (allowed: tool_result)"),
    ],
)
def test_block_not_allowed_for_role(role: Role, block: Block, description: str) -> None:
    batch = [user(), item(role, block)]
    assert violations_of(batch) == (FieldViolation("items[1].content[0]", description),)


def test_empty_item() -> None:
    assert violations_of([item(Role.USER)]) == (
        FieldViolation("items[0].content", "an item needs at least one content block"),
    )


def test_empty_text() -> None:
    assert only_violation(TextBlock("ok"), TextBlock("")) == FieldViolation(
        "items[0].content[1].text.text", "text is empty"
    )


def test_empty_tool_item_reports_both_rules() -> None:
    assert violations_of([item(Role.TOOL)]) == (
        FieldViolation("items[0].content", "an item needs at least one content block"),
        FieldViolation("items[0].content", "a tool item holds exactly one tool_result block"),
    )


def test_tool_item_with_two_results() -> None:
    two = item(Role.TOOL, ToolResultBlock("c1"), ToolResultBlock("c2"))
    assert violations_of([two]) == (
        FieldViolation("items[0].content", "a tool item holds exactly one tool_result block"),
    )


# ------------------------------------------------------------------ tool_use


def test_tool_use_without_id_or_name() -> None:
    assert violations_of([item(Role.ASSISTANT, ToolUseBlock("", "", "{}"))]) == (
        FieldViolation("items[0].content[0].tool_use.id", "id is empty"),
        FieldViolation("items[0].content[0].tool_use.name", "name is empty"),
    )


@pytest.mark.parametrize(
    ("input_json", "description"),
    [
        ("", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
        ('{"path": "a.py"', "not valid JSON: Expecting ',' delimiter: line 1 column 16 (char 15)"),
        (
            "{'path': 'a.py'}",
            "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        ('{"a": NaN}', "not valid JSON: NaN is not a JSON value"),
        ('{"a": Infinity}', "not valid JSON: Infinity is not a JSON value"),
        ('{"a": [-Infinity]}', "not valid JSON: -Infinity is not a JSON value"),
        (
            '{"a": "\\ud800"}',
            "not valid JSON: a \\u escape encodes a lone surrogate, which UTF-8 cannot carry",
        ),
        ('{"n": 1e400}', "not valid JSON: '1e400' is too large for a JSON number"),
        ('{"a": ' + "[" * 64 + "]" * 64 + "}", "not valid JSON: nested deeper than 64 levels"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"a.py"', "must be a JSON object, not str"),
        ("3", "must be a JSON object, not int"),
        ("null", "must be a JSON object, not NoneType"),
    ],
)
def test_tool_use_arguments_must_be_a_json_object(input_json: str, description: str) -> None:
    assert only_violation(TextBlock("calling"), call("c1", input_json=input_json), role=Role.ASSISTANT) == (
        FieldViolation("items[0].content[1].tool_use.input_json", description)
    )


def test_deeply_nested_arguments_are_a_violation_not_a_crash() -> None:
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(InvalidArgument) as caught:
        check_batch([item(Role.ASSISTANT, call("c1", input_json=deep))], Limits(1, 1_000_000))
    (found,) = caught.value.violations
    assert found.field == "items[0].content[0].tool_use.input_json"
    assert found.description == "not valid JSON: nested deeper than 64 levels"


@pytest.mark.parametrize(
    "input_json",
    ["{}", '{"emoji": "\\ud83d\\ude00"}', '{"n": 1e300}', '{"a":1,"b":[true,null,{"c":"é"}]}'],
)
def test_tool_use_arguments_accepted(input_json: str) -> None:
    check_batch([item(Role.ASSISTANT, call("c1", input_json=input_json))], LIMITS)


def test_duplicate_tool_use_id_in_one_item_and_across_items() -> None:
    batch = [
        item(Role.ASSISTANT, call("c1"), call("c1")),
        result("c1"),
        item(Role.ASSISTANT, call("c2"), call("c1")),
    ]
    assert violations_of(batch) == (
        FieldViolation("items[0].content[1].tool_use.id", "tool_use id 'c1' repeats"),
        FieldViolation("items[2].content[1].tool_use.id", "tool_use id 'c1' repeats"),
    )


# --------------------------------------------------------------- tool_result


def test_tool_result_without_call_id() -> None:
    assert violations_of([item(Role.TOOL, ToolResultBlock(""))]) == (
        FieldViolation("items[0].content[0].tool_result.tool_use_id", "tool_use_id is empty"),
    )


def test_tool_result_parts_are_checked_with_nested_paths() -> None:
    parts = (TextBlock(""), ImageBlock("image/png"), DocumentBlock("", data=b"x"), ImageBlock("image/png", data=b"1"))
    assert violations_of([item(Role.TOOL, ToolResultBlock("c1", parts))]) == (
        # The empty text is a valid (empty) output and is not reported.
        FieldViolation("items[0].content[0].tool_result.content[1].image", "an image needs data or a uri"),
        FieldViolation(
            "items[0].content[0].tool_result.content[2].document.media_type", "media_type is required with data"
        ),
    )


def test_tool_result_cannot_nest_other_blocks() -> None:
    nested = ToolResultBlock("c1", (ToolUseBlock("x", "f", "{}"),))  # type: ignore[arg-type]
    assert violations_of([item(Role.TOOL, nested)]) == (
        FieldViolation(
            "items[0].content[0].tool_result.content[0]", "a tool result holds text, image or document blocks"
        ),
    )


# ------------------------------------------------- image, document, reasoning


@pytest.mark.parametrize(
    ("block", "violation"),
    [
        (ImageBlock("image/png"), FieldViolation("items[0].content[0].image", "an image needs data or a uri")),
        (
            ImageBlock("image/png", data=b""),
            FieldViolation("items[0].content[0].image", "an image needs data or a uri"),
        ),
        (ImageBlock("", uri=""), FieldViolation("items[0].content[0].image", "an image needs data or a uri")),
        (
            ImageBlock("text/plain", data=b"x"),
            FieldViolation("items[0].content[0].image.media_type", "'text/plain' is not an image media type"),
        ),
        (
            ImageBlock("", data=b"x"),
            FieldViolation("items[0].content[0].image.media_type", "'' is not an image media type"),
        ),
        (
            DocumentBlock("application/pdf"),
            FieldViolation("items[0].content[0].document", "a document needs data, a uri or text"),
        ),
        (
            DocumentBlock("application/pdf", data=b""),
            FieldViolation("items[0].content[0].document", "a document needs data, a uri or text"),
        ),
        (
            DocumentBlock("", data=b"%PDF"),
            FieldViolation("items[0].content[0].document.media_type", "media_type is required with data"),
        ),
    ],
)
def test_image_and_document_sources(block: Block, violation: FieldViolation) -> None:
    assert only_violation(block) == violation


@pytest.mark.parametrize(
    "block",
    [
        ImageBlock("", uri="https://example.com/a.png"),  # media type optional with a uri
        ImageBlock("image/webp", data=b"RIFF"),
        DocumentBlock("", uri="file-abc"),
        DocumentBlock("", text=""),
        DocumentBlock("application/pdf", data=b"%PDF"),
    ],
)
def test_image_and_document_sources_accepted(block: Block) -> None:
    check_batch([item(Role.USER, block)], LIMITS)


def test_reasoning_needs_text_or_redacted_data() -> None:
    check_batch([item(Role.ASSISTANT, ReasoningBlock("think"))], LIMITS)
    check_batch([item(Role.ASSISTANT, ReasoningBlock(redacted_data="opaque"))], LIMITS)
    assert only_violation(ReasoningBlock(signature="sig"), role=Role.ASSISTANT) == FieldViolation(
        "items[0].content[0].reasoning", "reasoning needs text, redacted_data or encrypted_content"
    )


def test_every_problem_of_a_batch_is_reported_at_once() -> None:
    batch = [
        user(""),
        item(Role.ASSISTANT, call("c1", input_json="[]"), ImageBlock("image/png", data=b"x")),
        item(Role.TOOL, ToolResultBlock("")),
        item(Role.USER, ImageBlock("image/png")),
        user("fine"),
    ]
    with pytest.raises(InvalidArgument) as caught:
        check_batch(batch, LIMITS)
    error = caught.value
    assert error.violations == (
        FieldViolation("items[0].content[0].text.text", "text is empty"),
        FieldViolation("items[1].content[0].tool_use.input_json", "must be a JSON object, not list"),
        FieldViolation(
            "items[1].content[1]", "an assistant item cannot hold an image block (allowed: text, tool_use, reasoning)"
        ),
        FieldViolation("items[2].content[0].tool_result.tool_use_id", "tool_use_id is empty"),
        FieldViolation("items[3].content[0].image", "an image needs data or a uri"),
    )
    assert error.message == "items[0].content[0].text.text: text is empty (and 4 more)"
    assert error.metadata == {"field": "items[0].content[0].text.text"}


# ------------------------------------------------------------ linking results


def test_link_fills_in_the_tool_name_and_keeps_the_rest() -> None:
    question = user()
    assistant = item(Role.ASSISTANT, TextBlock("reading"), call("c1", "read_file"))
    answer = result("c1", "contents", is_error=True)
    linked, violations = link_tool_results([question, assistant, answer], {})
    assert violations == []
    assert len(linked) == 3
    assert linked[0] is question and linked[1] is assistant  # items without a result pass through as they are
    assert linked[2] == item(
        Role.TOOL, ToolResultBlock("c1", (TextBlock("contents"),), is_error=True, name="read_file")
    )
    assert answer.tool_result == ToolResultBlock("c1", (TextBlock("contents"),), is_error=True)  # input untouched


def test_link_accepts_a_matching_name() -> None:
    linked, violations = link_tool_results([item(Role.ASSISTANT, call("c1", "ls")), result("c1", name="ls")], {})
    assert violations == []
    assert linked[1].tool_result is not None and linked[1].tool_result.name == "ls"


def test_link_uses_calls_from_earlier_appends() -> None:
    linked, violations = link_tool_results([result("c7")], {"c7": ToolCall("grep", answered=False)})
    assert violations == []
    assert linked[0].tool_result == ToolResultBlock("c7", (TextBlock("out"),), name="grep")


def test_result_without_a_call() -> None:
    _, violations = link_tool_results([user(), result("c9")], {"c1": ToolCall("ls", answered=False)})
    assert violations == [
        FieldViolation("items[1].content[0].tool_result.tool_use_id", "no earlier tool_use has id 'c9'")
    ]


def test_result_before_its_call_in_the_same_batch() -> None:
    _, violations = link_tool_results([result("c1"), item(Role.ASSISTANT, call("c1"))], {})
    assert violations == [
        FieldViolation("items[0].content[0].tool_result.tool_use_id", "no earlier tool_use has id 'c1'")
    ]


def test_call_answered_twice_in_one_batch() -> None:
    _, violations = link_tool_results([item(Role.ASSISTANT, call("c1")), result("c1"), result("c1", "again")], {})
    assert violations == [
        FieldViolation("items[2].content[0].tool_result.tool_use_id", "tool_use 'c1' already has a result")
    ]


def test_call_answered_in_an_earlier_append() -> None:
    _, violations = link_tool_results([result("c1")], {"c1": ToolCall("ls", answered=True)})
    assert violations == [
        FieldViolation("items[0].content[0].tool_result.tool_use_id", "tool_use 'c1' already has a result")
    ]


def test_result_name_contradicting_the_call() -> None:
    linked, violations = link_tool_results([item(Role.ASSISTANT, call("c1", "read")), result("c1", name="write")], {})
    assert violations == [
        FieldViolation("items[1].content[0].tool_result.name", "'write' does not match the call's tool 'read'")
    ]
    assert linked[1] == result("c1", name="write")  # left as given


def test_call_id_reused_across_batches() -> None:
    batch = [item(Role.ASSISTANT, TextBlock("again"), call("c1"), call("c2"))]
    _, violations = link_tool_results(batch, {"c2": ToolCall("read_file", answered=True)})
    assert violations == [
        FieldViolation("items[0].content[2].tool_use.id", "tool_use id 'c2' is already used in this session")
    ]


def test_link_reports_every_problem_in_order() -> None:
    batch = [
        result("ghost"),
        item(Role.ASSISTANT, call("c1", "ls")),
        result("c1", name="cat"),
        result("old"),
    ]
    _, violations = link_tool_results(batch, {"old": ToolCall("ls", answered=True)})
    assert violations == [
        FieldViolation("items[0].content[0].tool_result.tool_use_id", "no earlier tool_use has id 'ghost'"),
        FieldViolation("items[2].content[0].tool_result.name", "'cat' does not match the call's tool 'ls'"),
        FieldViolation("items[3].content[0].tool_result.tool_use_id", "tool_use 'old' already has a result"),
    ]


# ------------------------------------------------ ids, names and NUL characters


LONG = "x" * 257


@pytest.mark.parametrize(
    ("batch_item", "field", "description"),
    [
        (
            item(Role.ASSISTANT, call(LONG)),
            "items[0].content[0].tool_use.id",
            "257 characters, over the maximum of 256",
        ),
        (item(Role.ASSISTANT, call("c1", name=LONG)), "items[0].content[0].tool_use.name", "257 characters"),
        (item(Role.ASSISTANT, call("c\x001")), "items[0].content[0].tool_use.id", "contains a NUL character"),
        (result(LONG), "items[0].content[0].tool_result.tool_use_id", "257 characters"),
        (ItemContent(role=Role.USER, content=(TextBlock("hi"),), name="al\x00ice"), "items[0].name", "NUL"),
        (
            ItemContent(role=Role.USER, content=(TextBlock("hi"),), source=Source("file:///a\x00b")),
            "items[0].source.uri",
            "contains a NUL character",
        ),
        (
            ItemContent(role=Role.USER, content=(TextBlock("hi"),), tool_effect=ToolEffect(ToolEffectKind.READ, LONG)),
            "items[0].tool_effect.source_arg",
            "257 characters",
        ),
    ],
)
def test_bounded_fields_are_checked_before_storage(batch_item: ItemContent, field: str, description: str) -> None:
    found = violations_of([batch_item])
    assert found[0].field == field and description in found[0].description


def test_nul_characters_in_content_are_fine() -> None:
    check_batch(
        [user("binary \x00\x01 output"), item(Role.ASSISTANT, call("c1", input_json='{"a": "\\u0000"}'))], LIMITS
    )


def test_echoed_values_are_cut_short() -> None:
    found = violations_of([item(Role.ASSISTANT, call("c" * 200), call("c" * 200))])
    assert len(found[0].description) < 150
    assert "... (200 characters)" in found[0].description
