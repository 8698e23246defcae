"""Volatile content in the system prompt and tool schemas (service/contextd/engine/volatile.py)."""

from __future__ import annotations

import json

from contextd.engine.model import ItemContent, Role, TextBlock
from contextd.engine.pipeline import RenderInput, render
from contextd.engine.policy import default_policy
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd.engine.volatile import Finding, findings
from tests.helpers import counter, make_session, stored_items


def test_dates_times_uuids_and_request_ids_are_found_by_parsing_them() -> None:
    text = (
        "Today is 2026-11-30. Started 2026-11-30T09:15:02Z at 09:15:02. Session "
        "3f2b8c1e-9a4d-4e5f-8b6a-1c2d3e4f5a6b, request_id=abc123def4567 (also req_0123456789abcdef)."
    )
    assert findings([text]) == (
        Finding("date", "2026-11-30"),
        Finding("datetime", "2026-11-30T09:15:02Z"),
        Finding("time", "09:15:02"),
        Finding("uuid", "3f2b8c1e-9a4d-4e5f-8b6a-1c2d3e4f5a6b"),
        Finding("request id", "abc123def4567"),
    )


def test_an_id_in_hex_without_dashes_after_its_name_is_reported() -> None:
    assert findings(["trace_id: 0af7651916cd43dd8448eb211c80319c"]) == (
        Finding("request id", "0af7651916cd43dd8448eb211c80319c"),
    )


def test_what_only_looks_volatile_is_not_reported() -> None:
    text = (
        "Version 1.2.3, release 2026-13-45 (not a date), commit 3f2b8c1e9a4d4e5f, "
        "range 10-20-30, ratio 12:34, build 2024-02-30, id 3f2b8c1e-9a4d-4e5f-8b6a-1c2d3e4f5a6 (one short)."
    )
    assert findings([text]) == ()


def test_the_view_warns_about_the_hot_zone_and_leaves_it_as_it_is() -> None:
    system = "You are an agent. Current date: 2026-11-30."
    items = stored_items(
        [
            ItemContent(role=Role.SYSTEM, content=(TextBlock(system),)),
            ItemContent(role=Role.USER, content=(TextBlock("Today is 2026-11-30, fix it."),)),  # not the hot zone
        ]
    )
    tools = ({"name": "run", "description": "trace 3f2b8c1e-9a4d-4e5f-8b6a-1c2d3e4f5a6b"},)
    out = render(
        RenderInput(
            make_session(2),
            items,
            default_policy(),
            ViewRequest(ViewFormat.OPENAI_CHAT),
            counter(),
            TransformRegistry.default(),
            tools=tools,
        )
    )
    warnings = [w for w in out.view.warnings if w.code == "VOLATILE_CONTENT"]
    assert [w.message.split(" holds")[0] for w in warnings] == ["the system prompt (seq 1)", "the tool schemas"]
    assert "date '2026-11-30'" in warnings[0].message and "uuid '3f2b8c1e" in warnings[1].message
    assert json.loads(out.view.messages_json)[0]["content"] == system  # never rewritten
