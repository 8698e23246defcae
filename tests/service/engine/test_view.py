"""Views: totals, framing, budget warning, determinism (service/contextd/engine/view.py)."""

from __future__ import annotations

import json
from dataclasses import replace

from contextd.engine.model import Item, ReasoningBlock, Representation, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.pipeline import RenderInput, render
from contextd.engine.pipeline import identity_view as build_view
from contextd.engine.placeholders import handle_of
from contextd.engine.policy import default_policy
from contextd.engine.render.base import ViewWarning
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import (
    FRAMING_TOKENS_PER_MESSAGE,
    REPLY_PRIMING_TOKENS,
    ViewFormat,
    ViewItem,
    ViewRequest,
    to_json,
)
from tests.helpers import counter, items_from_openai_messages, make_item, make_session

OPENAI = ViewRequest(ViewFormat.OPENAI_CHAT)
ANTHROPIC = ViewRequest(ViewFormat.ANTHROPIC_MESSAGES)


def conversation() -> list[Item]:
    """system 10 tokens, user 20, assistant call 30, tool result 40, user 50 (token counts given, not counted)."""
    return [
        make_item(Role.SYSTEM, TextBlock("Be brief."), seq=1, token_count=10),
        make_item(Role.USER, TextBlock("List the files."), seq=2, token_count=20),
        make_item(Role.ASSISTANT, ToolUseBlock("c1", "ls", '{"path": "."}'), seq=3, token_count=30),
        make_item(Role.TOOL, ToolResultBlock("c1", (TextBlock("a.py"),), name="ls"), seq=4, token_count=40),
        make_item(Role.USER, TextBlock("Thanks."), seq=5, token_count=50),
    ]


def test_framing_constants() -> None:
    assert FRAMING_TOKENS_PER_MESSAGE == 3
    assert REPLY_PRIMING_TOKENS == 3


def test_openai_totals() -> None:
    view = build_view(make_session(5, policy_version="p7"), conversation(), OPENAI, counter())
    assert view.item_tokens == 150
    assert view.framing_tokens == 5 * 3 + 3
    assert view.total_tokens == 168
    assert view.budget_tokens == 0
    assert view.over_budget is False
    assert view.warnings == ()
    assert view.session_id == "s-1"
    assert view.version == 5
    assert view.format is ViewFormat.OPENAI_CHAT
    assert view.encoding == "cl100k_base"
    assert view.policy_version == default_policy().version  # the policy the view was made with
    assert view.system_json == ""
    assert view.items == (
        ViewItem(1, Representation.FULL, 10, 0),
        ViewItem(2, Representation.FULL, 20, 1),
        ViewItem(3, Representation.FULL, 30, 2),
        ViewItem(4, Representation.FULL, 40, 3),
        ViewItem(5, Representation.FULL, 50, 4),
    )


def test_anthropic_totals_count_the_system_field_and_merged_messages() -> None:
    view = build_view(make_session(5), conversation(), ANTHROPIC, counter())
    # system field + user, assistant, user(tool_result + text) = 4 frames.
    assert view.item_tokens == 150
    assert view.framing_tokens == 4 * 3 + 3
    assert view.total_tokens == 165
    assert view.system_json == '"Be brief."'
    assert [(v.seq, v.message_index) for v in view.items] == [(1, -1), (2, 0), (3, 1), (4, 2), (5, 2)]
    assert all(v.representation is Representation.FULL for v in view.items)


def test_messages_json_is_compact_utf8_in_rendered_key_order() -> None:
    items = [
        make_item(Role.USER, TextBlock("héllo ✓"), seq=1, token_count=2),
        make_item(Role.ASSISTANT, ToolUseBlock("c1", "f", '{"b": 1, "a": 2}'), seq=2, token_count=5),
    ]
    openai = build_view(make_session(2), items, OPENAI, counter())
    assert openai.messages_json == (
        '[{"role":"user","content":"héllo ✓"},{"role":"assistant","content":null,"tool_calls":'
        '[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\\"b\\": 1, \\"a\\": 2}"}}]}]'
    )
    anthropic = build_view(make_session(2), items, ANTHROPIC, counter())
    assert anthropic.messages_json == (
        '[{"role":"user","content":"héllo ✓"},'
        '{"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"f","input":{"b":1,"a":2}}]}]'
    )
    assert anthropic.system_json == ""


def test_to_json() -> None:
    assert to_json({"b": [1, None], "a": "é"}) == '{"b":[1,null],"a":"é"}'


def test_over_budget_warning_names_the_overage() -> None:
    view = build_view(
        make_session(5), conversation(), ViewRequest(ViewFormat.OPENAI_CHAT, budget_tokens=160), counter()
    )
    assert view.total_tokens == 168
    assert view.over_budget is True
    assert view.budget_tokens == 160
    assert view.warnings == (
        ViewWarning(
            "OVER_BUDGET",
            "the view is 168 tokens, 8 over the budget of 160; the session's rules found nothing more they may remove",
        ),
    )


def test_over_budget_figures_use_thousands_separators() -> None:
    items = [make_item(Role.USER, TextBlock("big"), seq=1, token_count=1_234_567)]
    view = build_view(make_session(1), items, ViewRequest(ViewFormat.OPENAI_CHAT, budget_tokens=1_000_000), counter())
    assert view.total_tokens == 1_234_573
    assert view.warnings[0].message == (
        "the view is 1,234,573 tokens, 234,573 over the budget of 1,000,000; "
        "the session's rules found nothing more they may remove"
    )


def test_exactly_at_budget_is_not_over() -> None:
    view = build_view(
        make_session(5), conversation(), ViewRequest(ViewFormat.OPENAI_CHAT, budget_tokens=168), counter()
    )
    assert view.over_budget is False
    assert view.warnings == ()


def test_no_budget_means_no_warning() -> None:
    items = [make_item(Role.USER, TextBlock("big"), seq=1, token_count=10_000_000)]
    view = build_view(make_session(1), items, OPENAI, counter())
    assert view.over_budget is False
    assert view.warnings == ()


def test_omitted_items_are_not_counted() -> None:
    items = [
        make_item(Role.USER, TextBlock("q"), seq=1, token_count=5),
        make_item(Role.ASSISTANT, ReasoningBlock("long thoughts"), seq=2, token_count=500),
        make_item(Role.USER, TextBlock("q2"), seq=3, token_count=7),
    ]
    # The thoughts are in a protected turn: over the budget, nothing may be offloaded.
    policy = replace(default_policy(), rules=(), protection=replace(default_policy().protection, last_turns=2))
    request = ViewRequest(ViewFormat.OPENAI_CHAT, budget_tokens=10)
    view = render(RenderInput(make_session(3), items, policy, request, counter(), TransformRegistry())).view
    # Nothing of it is in the view; its handle still gets it back.
    assert view.items[1] == ViewItem(2, Representation.OMITTED, 0, -1, handle_of(items[1]))
    assert view.item_tokens == 12
    assert view.framing_tokens == 2 * 3 + 3
    assert view.total_tokens == 21
    # The renderer's warning comes first, then the budget's.
    assert [w.code for w in view.warnings] == ["REASONING_DROPPED", "OVER_BUDGET"]
    assert view.warnings[1].message.startswith("the view is 21 tokens, 11 over the budget of 10;")


def test_items_the_format_carries_only_in_part_are_reduced_and_counted_as_sent() -> None:
    thoughts = ReasoningBlock("long thoughts " * 300)
    items = [
        make_item(Role.USER, TextBlock("q"), seq=1),
        make_item(Role.ASSISTANT, thoughts, TextBlock("ok"), seq=2),
    ]
    openai = build_view(make_session(2), items, ViewRequest(ViewFormat.OPENAI_CHAT, budget_tokens=50), counter())
    assert openai.items[1].representation is Representation.REDUCED
    assert openai.items[1].tokens == items[1].token_count - counter().count(thoughts.text) == 1
    assert not openai.over_budget
    anthropic = build_view(make_session(2), items, ViewRequest(ViewFormat.ANTHROPIC_MESSAGES), counter())
    assert anthropic.items[1].representation is Representation.REDUCED  # unsigned reasoning cannot go back


def test_empty_history_has_no_framing() -> None:
    view = build_view(make_session(0), [], ViewRequest(ViewFormat.ANTHROPIC_MESSAGES, budget_tokens=1), counter())
    assert (view.messages_json, view.system_json, view.items) == ("[]", "", ())
    assert (view.item_tokens, view.framing_tokens, view.total_tokens, view.over_budget) == (0, 0, 0, False)


def test_views_are_deterministic() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "é"}, {"type": "text", "text": "✓"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"z": 1, "a": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]
    for request in (OPENAI, ANTHROPIC, ViewRequest(ViewFormat.ANTHROPIC_MESSAGES, budget_tokens=5)):
        # Two independently built histories, as two renders would load them.
        first = build_view(
            make_session(4), items_from_openai_messages(json.loads(json.dumps(messages))), request, counter()
        )
        second = build_view(
            make_session(4), items_from_openai_messages(json.loads(json.dumps(messages))), request, counter()
        )
        assert first.messages_json.encode() == second.messages_json.encode()
        assert first.system_json == second.system_json
        assert first == second
