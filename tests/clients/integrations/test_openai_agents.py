"""The OpenAI Agents SDK on contextd, end to end (contextd_client/integrations/openai_agents.py):
the SDK's own `Runner`, `Agent` and function tools, its `ScriptedModel` (an implementation of
its `Model` interface that answers from a script: no network), against a real contextd (on
SQLite: conftest.py)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.items import TResponseInputItem
from agents.memory import Session
from agents.run_config import CallModelData, ModelInputData
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem

from contextd_client import NO_RETRY, AsyncClient, Unavailable, View
from contextd_client.integrations.openai_agents import POPPED, ContextdSession
from tests.clients.test_client import LoseAnswers
from tests.conftest import ServerThread

BUDGET = 300
"""Tokens: the build log is far over it, so every view sends it compressed, with its handle."""
LOG = "\n".join([*(f"step {n}: ok" for n in range(800)), "ERROR: month must be in 1..12", "1 failed"])
MIDDLE = "step 400: ok"
"""A line of the log that no compressed form of it keeps."""
ASK, AGAIN = "Why does the build fail?", "What is the error exactly?"


@function_tool
def read_log() -> str:
    """Read the build log."""
    return LOG


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # nothing is exported anywhere
    yield
    set_tracing_disabled(False)


@pytest.fixture
async def ctx(server: ServerThread) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target, timeout=15) as client:
        yield client


class Recorded:
    """A session whose input filter also keeps each view it sent."""

    def __init__(self, ctx: AsyncClient, **options: Any) -> None:
        self.session = ContextdSession(ctx, f"agents-{uuid.uuid4().hex[:12]}", **options)
        self.views: list[View] = []
        self.config = RunConfig(call_model_input_filter=self.filter)

    async def filter(self, data: CallModelData[Any]) -> ModelInputData:
        sent = await self.session.call_model_input_filter(data)
        assert self.session.last_view is not None
        self.views.append(self.session.last_view)
        return sent


def retrieve_the_error(call: ModelCall) -> list[Any]:
    """The model finds the log's handle in its view and asks contextd for the error lines."""
    handle = re.search(r"with handle ([0-9a-f]{16})", json.dumps(call.input))
    assert handle is not None, call.input
    return [function_call("contextd_retrieve", {"handle": handle.group(1), "grep": "ERROR"}, call_id="call_2")]


def texts(items: list[Any]) -> str:
    return json.dumps(items)


async def test_a_tool_round_trip_sends_contextds_view_and_stores_each_turn_once(ctx: AsyncClient) -> None:
    recorded = Recorded(ctx, budget_tokens=BUDGET)
    session = recorded.session
    model = ScriptedModel(
        [
            [function_call("read_log", {}, call_id="call_1")],
            [assistant_message("The log ends in an error.", item_id="msg_1")],
            ModelStep.respond(retrieve_the_error),
            [assistant_message("month must be in 1..12", item_id="msg_2")],
        ]
    )
    agent = Agent(name="fixer", instructions="Fix builds.", model=model, tools=[read_log, *await session.agent_tools()])

    first = await Runner.run(agent, ASK, session=session, run_config=recorded.config)
    assert first.final_output == "The log ends in an error."
    assert (await ctx.get_session(session.session_id)).version == 4  # user, call, output, answer
    second = await Runner.run(agent, AGAIN, session=session, run_config=recorded.config)
    assert second.final_output == "month must be in 1..12"

    # Each model call was sent contextd's view, within the budget: the log as a compressed
    # stand-in naming the handle that gets it back, never whole.
    assert [call.input for call in model.calls] == [view.messages for view in recorded.views]
    assert all(view.budget_tokens == BUDGET and not view.over_budget for view in recorded.views)
    [log] = [item for item in recorded.views[1].items if item.seq == 3]
    assert log.representation != "full" and log.handle
    for call in model.calls[1:]:
        assert f"handle {log.handle}" in texts(call.input) and MIDDLE not in texts(call.input)
        assert call.system_instructions == "Fix builds."
    assert (await ctx.retrieve(session.session_id, log.handle, page_unit="lines", grep="ERROR")).content == (
        "801:ERROR: month must be in 1..12\n"
    )
    # The second run saw the first through the session, and the model got the error back with
    # contextd_retrieve (an SDK function tool over AsyncAgentTools).
    assert model.calls[2].input[0] == {"role": "user", "content": ASK} and "msg_1" in texts(model.calls[2].input)
    retrieved = model.calls[3].input[-1]
    assert retrieved["type"] == "function_call_output" and "801:ERROR: month must be in 1..12" in retrieved["output"]

    # The session holds every turn once: the second run appended only its own.
    assert (await ctx.get_session(session.session_id)).version == 8
    history = await session.get_items()
    assert [item.get("role") or item["type"] for item in history] == [
        "user", "function_call", "function_call_output", "assistant",
        "user", "function_call", "function_call_output", "assistant",
    ]  # fmt: skip
    assert texts(history).count(ASK) == 1 and texts(history).count(AGAIN) == 1
    assert await session.get_items(limit=2) == history[-2:] and await session.get_items(limit=100) == history
    assert isinstance(session, Session)  # the SDK's protocol, as it checks it


async def test_a_streamed_run_has_its_new_input_in_the_first_view_and_stored_once(ctx: AsyncClient) -> None:
    # A streamed run adds its input to the session only after the first model call is
    # prepared: the filter stores it first, and the SDK's own add_items then skips it.
    recorded = Recorded(ctx, budget_tokens=BUDGET)
    session = recorded.session
    model = ScriptedModel(
        [[function_call("read_log", {}, call_id="call_1")], [assistant_message("Done.")], [assistant_message("Yes.")]]
    )
    agent = Agent(name="fixer", model=model, tools=[read_log])
    for prompt in (ASK, AGAIN):
        streamed = Runner.run_streamed(agent, prompt, session=session, run_config=recorded.config)
        async for _ in streamed.stream_events():
            pass
    assert model.calls[0].input == [{"role": "user", "content": ASK}]
    assert model.calls[2].input[-1] == {"role": "user", "content": AGAIN}
    history = await session.get_items()
    assert texts(history).count(ASK) == 1 and texts(history).count(AGAIN) == 1
    assert (await ctx.get_session(session.session_id)).version == 6


async def test_pop_item_takes_back_the_latest_item_from_every_later_view(ctx: AsyncClient) -> None:
    recorded = Recorded(ctx, budget_tokens=BUDGET)
    session = recorded.session
    sid = session.session_id
    # A reasoning model's turn as the SDK stores it by default: the reasoning is only its id.
    reasoning = ResponseReasoningItem(id="rs_1", type="reasoning", summary=[])
    looking = assistant_message("Let me look.", item_id="msg_a")
    model = ScriptedModel(
        [
            [reasoning, looking, function_call("read_log", {}, call_id="call_1")],
            [assistant_message("Found it: the month.", item_id="msg_b")],
        ]
    )
    agent = Agent(name="fixer", model=model, tools=[read_log])
    await Runner.run(agent, ASK, session=session, run_config=recorded.config)
    before = await session.get_items()
    assert [item.get("role") or item["type"] for item in before] == [
        "user", "assistant", "function_call", "function_call_output", "assistant"
    ]  # fmt: skip
    assert (await ctx.get_session(sid)).version == 4  # the turn [message, call] is one stored item

    async def shown() -> str:
        return texts((await ctx.render_view(sid, "openai_responses", budget_tokens=BUDGET)).messages)

    assert await session.pop_item() == before[-1]  # the answer
    assert await session.get_items() == before[:-1] and "Found it" not in await shown()
    assert await session.pop_item() == before[-2]  # the log: its call is answered by a marker
    assert await session.get_items() == before[:-2]
    view = await shown()
    assert "ERROR: month" not in view and "call_1" in view and "retracted by the client" in view
    assert await session.pop_item() == before[-3]  # the call: the rest of its turn is stored again
    assert await session.get_items() == before[:-3]
    view = await shown()
    assert "call_1" not in view and view.count("Let me look.") == 1
    assert (await ctx.get_session(sid)).version == 5

    # Append-only: each popped item is retracted with a certificate, and still retrievable.
    retracted = [c for c in [c async for c in ctx.list_certificates(sid)] if c.rule == "retraction"]
    assert sorted(c.seq for c in retracted) == [2, 3, 4] and all(POPPED in c.rationale for c in retracted)
    assert "Found it" in (await ctx.retrieve(sid, seq=4)).content

    # The conversation goes on without them.
    model.extend([[assistant_message("Ask me again.", item_id="msg_c")]])
    await Runner.run(agent, AGAIN, session=session, run_config=recorded.config)
    sent = texts(model.calls[-1].input)
    assert "Let me look." in sent and "call_1" not in sent and "Found it" not in sent
    assert [item.get("content") for item in (await session.get_items())[-2:]] == [
        AGAIN,
        [{"type": "output_text", "text": "Ask me again.", "annotations": []}],
    ]
    for _ in range(4):
        assert await session.pop_item() is not None
    assert await session.pop_item() is None and await session.get_items() == []


async def test_clear_session_starts_the_session_over(ctx: AsyncClient) -> None:
    recorded = Recorded(ctx, budget_tokens=BUDGET, policy="evidence: {max_level: 2}\n")
    session = recorded.session
    model = ScriptedModel([[assistant_message("Hello.")], [assistant_message("Hello again.")]])
    agent = Agent(name="greeter", model=model)
    await Runner.run(agent, "Hi.", session=session, run_config=recorded.config)
    assert len(await session.get_items()) == 2

    await session.clear_session()
    assert await session.get_items() == []
    cleared = await ctx.get_session(session.session_id)
    assert cleared.version == 0 and cleared.policy == "evidence: {max_level: 2}\n"
    assert not [c async for c in ctx.list_certificates(session.session_id)]
    await Runner.run(agent, "Hi again.", session=session, run_config=recorded.config)
    assert model.calls[-1].input == [{"role": "user", "content": "Hi again."}]
    assert [item.get("role") for item in await session.get_items()] == ["user", "assistant"]


async def test_add_items_retried_after_a_lost_answer_writes_once(make_server: Callable[..., ServerThread]) -> None:
    lossy = LoseAnswers({"AppendItems"}, times=1)
    server = make_server(interceptors=[lossy])
    items: list[TResponseInputItem] = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    async with AsyncClient(server.target, retry=NO_RETRY) as ctx:
        session = ContextdSession(ctx, "agents-lost-answer")
        with pytest.raises(Unavailable):
            await session.add_items(items)  # committed, but the answer was lost
        assert len(await session.get_items()) == 2  # (the session's version has moved on since)
        await session.add_items(items)  # the caller's retry: the same key, answered from the first
        assert (await ctx.get_session("agents-lost-answer")).version == 2
        with pytest.raises(Unavailable):
            await session.add_items(items)  # the same items again, later: a new append (its answer lost too)
        assert (await ctx.get_session("agents-lost-answer")).version == 4
    assert [count for (name, _), count in lossy.seen.items() if name == "AppendItems"] == [2, 1]


async def test_two_sessions_on_one_id_interleave_their_items_as_the_sdks_own_sessions_do(ctx: AsyncClient) -> None:
    """The SDK's Session holds no conversation of its own to protect: two processes adding to one
    session are stored in the order their items arrive, none refused and none lost."""
    session_id = f"agents-{uuid.uuid4().hex[:12]}"
    one, other = ContextdSession(ctx, session_id), ContextdSession(ctx, session_id)
    await one.add_items([{"role": "user", "content": "First, from one."}])
    await other.add_items([{"role": "user", "content": "Then, from the other."}])
    await one.add_items([{"role": "assistant", "content": "Last, from one."}])
    said = [item["content"] for item in await other.get_items()]  # type: ignore[typeddict-item]
    assert said == ["First, from one.", "Then, from the other.", "Last, from one."]
    assert (await ctx.get_session(session_id)).version == 3


async def test_the_input_filter_alone_keeps_the_session(ctx: AsyncClient) -> None:
    # Without `session=`, the application passes the whole conversation each run; the filter
    # stores what the session lacks and sends the view, from any process.
    sid = f"agents-{uuid.uuid4().hex[:12]}"
    model = ScriptedModel(
        [
            [function_call("read_log", {}, call_id="call_1")],
            [assistant_message("The log ends in an error.", item_id="msg_1")],
            [assistant_message("A bad month.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="fixer", model=model, tools=[read_log])
    first = ContextdSession(ctx, sid, budget_tokens=BUDGET)
    done = await Runner.run(agent, ASK, run_config=RunConfig(call_model_input_filter=first.call_model_input_filter))
    again = ContextdSession(ctx, sid, budget_tokens=BUDGET)  # another process, say
    conversation: list[TResponseInputItem] = [*done.to_input_list(), {"role": "user", "content": AGAIN}]
    await Runner.run(agent, conversation, run_config=RunConfig(call_model_input_filter=again.call_model_input_filter))
    assert MIDDLE in texts(conversation) and MIDDLE not in texts(model.calls[-1].input)
    assert [item.get("role") or item["type"] for item in await again.get_items()] == [
        "user", "function_call", "function_call_output", "assistant", "user"
    ]  # fmt: skip
