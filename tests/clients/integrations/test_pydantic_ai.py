"""The pydantic-ai capability, end to end: pydantic-ai's own agent loop with its `FunctionModel`
(no network) against a real contextd (on SQLite: conftest.py)."""

from __future__ import annotations

import re
import uuid

import pytest
from pydantic_ai import (
    Agent,
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import RetryInfo
from pydantic_ai.models.function import AgentInfo, FunctionModel

from contextd_client import AsyncClient, Client, VersionConflict, ViewFormat, items_from_openai
from contextd_client.integrations.pydantic_ai import (
    ContextdHistory,
    HistoryRewritten,
    from_openai_messages,
    load_history_async,
    to_openai_messages,
)
from tests.conftest import ServerThread

BUDGET = 150
"""Tokens: the long test run is compressed for the request that reads it (the newest turn is never taken out);
from the next one on it leaves the view as a placeholder."""
TEST_RUN = "\n".join(f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(400))
OUTPUTS = {
    "pytest -q": f"{TEST_RUN}\nE   ValueError: month must be in 1..12 (src/parser.py:42)\n1 failed",
    "sed -n 40,42p src/parser.py": "    return date(int(year), int(month) + 1, int(day))\n",
}
Seen = list[list[ModelMessage]]


def run(command: str) -> str:
    """Run a shell command in the repository."""
    return OUTPUTS.get(command, f"{command}: not found")


def returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    return {
        p.tool_call_id: p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }


def fixer(seen: Seen, *, retrieve: bool = False) -> FunctionModel:
    """A scripted model: runs the tests, reads the code, (gets the error back from contextd), answers."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        prompt = next((p.content for p in last.parts if isinstance(p, UserPromptPart)), None)
        answered = {p.tool_call_id for p in last.parts if isinstance(p, ToolReturnPart)}
        if prompt == "And the fix?":
            return ModelResponse(parts=[TextPart("Drop the + 1.")])
        if prompt is not None:
            return ModelResponse(parts=[ToolCallPart("run", {"command": "pytest -q"}, "call_1")])
        if answered == {"call_1"}:
            return ModelResponse(parts=[ToolCallPart("run", {"command": "sed -n 40,42p src/parser.py"}, "call_2")])
        if answered == {"call_2"} and retrieve:
            assert "contextd_retrieve" in {t.name for t in info.function_tools}
            handle = re.search(r"retrieve with handle ([0-9a-f]+)", str(returns(messages)["call_1"].content))
            assert handle, "the test run should have left the view"
            arguments = {"handle": handle.group(1), "grep": "Error"}
            return ModelResponse(parts=[ToolCallPart("contextd_retrieve", arguments, "call_3")])
        said = str(returns(messages)["call_3"].content) if retrieve else ""
        error = next((line for line in said.splitlines() if "Error" in line), "")
        return ModelResponse(parts=[TextPart(f"parse() adds 1 to the month. {error}".strip())])

    return FunctionModel(model)


def agent_for(model: FunctionModel, history: ContextdHistory[None]) -> Agent[None, str]:
    agent = Agent(model, capabilities=[history], system_prompt="You fix bugs.")
    agent.tool_plain(run)
    return agent


def roles(client: Client, session: str) -> list[str]:
    return [m["role"] for m in client.render_view(session, ViewFormat.OPENAI_CHAT).messages]


async def test_the_model_sees_the_view_while_the_run_keeps_everything(client: Client) -> None:
    session, seen = f"pyd-{uuid.uuid4().hex[:12]}", []
    agent = agent_for(fixer(seen), ContextdHistory(client, session, budget_tokens=BUDGET, tools=False))

    result = await agent.run("The test_parse test fails.")  # the blocking client's calls go to a worker thread

    assert result.output == "parse() adds 1 to the month."
    assert len(seen) == 3
    # The request right after the tool ran gets the output compressed (the newest turn is never taken out)...
    compressed = str(returns(seen[1])["call_1"].content)
    assert (
        compressed.startswith("[contextd: output of tool call call_1 (run) compressed") and TEST_RUN not in compressed
    )
    # ... the next one a placeholder naming the handle of the original, which contextd gives back.
    placeholder = str(returns(seen[2])["call_1"].content)
    handle = re.search(r"retrieve with handle ([0-9a-f]+)", placeholder)
    assert handle and TEST_RUN not in placeholder
    assert "month must be in 1..12" in client.retrieve(session, handle.group(1), grep="ValueError").content
    # What the view shows whole is the run's own part, not a copy.
    kept = returns(result.all_messages())
    assert returns(seen[2])["call_2"] is kept["call_2"]
    # The run's own history keeps the whole output; the session holds every turn, once.
    assert kept["call_1"].content == OUTPUTS["pytest -q"]
    assert client.get_session(session).version == len(to_openai_messages(result.all_messages())) == 7
    assert roles(client, session) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert client.get_status(session).usage.reported_calls == 3  # each response's usage, for its view

    # Another process (a new capability) continues with the history it kept: only the new turn is appended.
    again: Seen = []
    later = agent_for(fixer(again), ContextdHistory(client, session, budget_tokens=BUDGET, tools=False))
    second = await later.run("And the fix?", message_history=result.all_messages())
    assert second.output == "Drop the + 1."
    assert client.get_session(session).version == 9
    assert "retrieve with handle" in str(returns(again[0])["call_1"].content)  # contextd's view, not the history
    assert returns(second.all_messages())["call_1"].content == OUTPUTS["pytest -q"]


async def test_a_session_gets_the_history_it_lacks_once(client: Client) -> None:
    agent = agent_for(fixer([]), ContextdHistory(client, f"pyd-{uuid.uuid4().hex[:12]}", tools=False))
    history = (await agent.run("The test_parse test fails.")).all_messages()
    chat = to_openai_messages(history)
    # A session holding the start of that history (a run that stopped early, say), and one holding none of it.
    started = client.create_session(f"pyd-{uuid.uuid4().hex[:12]}").id
    client.append_openai(started, chat[:3])
    empty = f"pyd-{uuid.uuid4().hex[:12]}"
    for session in (started, empty):
        later = agent_for(fixer([]), ContextdHistory(client, session, tools=False))
        await later.run("And the fix?", message_history=history)
        assert client.get_session(session).version == len(chat) + 2
        assert roles(client, session) == [m["role"] for m in chat] + ["user", "assistant"]


async def test_the_model_takes_back_what_left_its_view_and_another_run_continues_from_contextd(
    server: ServerThread,
) -> None:
    conversation, seen = f"pyd-{uuid.uuid4().hex[:12]}", []
    async with AsyncClient(server.target) as ctx:
        agent = agent_for(fixer(seen, retrieve=True), ContextdHistory(ctx, budget_tokens=BUDGET))  # session: the run's

        result = await agent.run("The test_parse test fails.", conversation_id=conversation)

        assert (
            result.output
            == "parse() adds 1 to the month. 401:E   ValueError: month must be in 1..12 (src/parser.py:42)"
        )
        assert (await ctx.get_session(conversation)).version == 9
        # A process that kept nothing starts from the session: its view, as pydantic-ai messages.
        loaded = await load_history_async(ctx, conversation)
        assert [type(m).__name__ for m in loaded] == ["ModelRequest", "ModelResponse"] * 4
        assert "retrieve with handle" in str(returns(loaded)["call_1"].content)
        again: Seen = []
        later = agent_for(fixer(again, retrieve=True), ContextdHistory(ctx, budget_tokens=BUDGET))
        second = await later.run("And the fix?", message_history=loaded)
        assert second.output == "Drop the + 1." and second.conversation_id == conversation
        assert (await ctx.get_session(conversation)).version == 11
        # A run given no history continues the session as it is (its system prompt is the session's).
        fresh: Seen = []
        third = await agent_for(fixer(fresh), ContextdHistory(ctx)).run("And the fix?", conversation_id=conversation)
        assert third.output == "Drop the + 1." and len(third.all_messages()) == 2
        prompts = [
            p for m in fresh[0] if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, SystemPromptPart)
        ]
        assert [p.content for p in prompts] == ["You fix bugs."] and len(fresh[0]) == 11  # the session, whole
        assert (await ctx.get_session(conversation)).version == 13
        assert await load_history_async(ctx, "pyd-never-made") == []


async def test_a_validation_retry_is_stored_as_a_tool_error_in_the_session_of_the_deps(client: Client) -> None:
    session = f"pyd-{uuid.uuid4().hex[:12]}"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("run", {"cmd": "pytest"}, "call_1")])  # a wrong argument
        return ModelResponse(parts=[TextPart("Sorry.")])

    history: ContextdHistory[str] = ContextdHistory(client, lambda ctx: ctx.deps, tools=False)
    agent = Agent(FunctionModel(model), deps_type=str, capabilities=[history])
    agent.tool_plain(run)
    await agent.run("Run the tests.", deps=session)

    view = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES)
    blocks = [b for m in view.messages if m["role"] == "user" and isinstance(m["content"], list) for b in m["content"]]
    (retry,) = [b for b in blocks if b["type"] == "tool_result"]
    assert retry["tool_use_id"] == "call_1" and retry["is_error"] is True
    assert "command" in str(retry["content"])  # the validation error the model read


async def test_a_history_rewritten_under_it_is_an_error_not_a_duplicate(client: Client) -> None:
    session = f"pyd-{uuid.uuid4().hex[:12]}"
    history = ContextdHistory(client, session, tools=False)
    agent = Agent(fixer([]), capabilities=[history, ProcessHistory(lambda messages: messages[-1:])])
    agent.tool_plain(run)
    with pytest.raises(HistoryRewritten):
        await agent.run("The test_parse test fails.")


async def test_another_writer_in_between_is_a_version_conflict_for_the_caller(client: Client) -> None:
    """One writer per session: an append by someone else during the run is not interleaved with
    the run's turns; the run fails with VersionConflict, and the session holds what each wrote."""
    session, seen = f"pyd-{uuid.uuid4().hex[:12]}", []
    scripted = fixer(seen)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not seen:  # while the model thinks, another process appends to the same session
            client.append_openai(session, [{"role": "user", "content": "a note from another process"}])
        return scripted.function(messages, info)

    agent = agent_for(FunctionModel(model), ContextdHistory(client, session, tools=False))
    with pytest.raises(VersionConflict):
        await agent.run("The test_parse test fails.")
    # The run's system prompt and first request, then the other's note: nothing after it.
    assert roles(client, session) == ["system", "user", "user"]


def test_messages_round_trip_through_chat_completions() -> None:
    image = BinaryContent(b"\x89PNG\r\n\x1a\n", media_type="image/png")
    messages: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("You fix bugs."), UserPromptPart(["Look:", image])]),
        ModelResponse(parts=[ThinkingPart("Run it."), TextPart("Running."), ToolCallPart("run", '{"a": 1}', "c1")]),
        ModelRequest(parts=[ToolReturnPart("run", "boom", "c1", outcome="failed")]),
        ModelResponse(parts=[ToolCallPart("run", {"b": 2}, "c2")]),
        ModelRequest(
            parts=[
                ToolReturnPart("run", "ok", "c2"),
                RetryFeedbackPart("Answer in one line.", retry=RetryInfo(cause="model_retry")),
            ]
        ),
    ]
    chat = to_openai_messages(messages)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert chat[2]["reasoning"] == "Run it." and chat[3]["is_error"] is True and chat[3]["name"] == "run"
    items = items_from_openai(chat)
    assert len(items) == 7 and items[3].content[0].tool_result.is_error
    back = from_openai_messages(chat)
    assert [type(m).__name__ for m in back] == ["ModelRequest", "ModelResponse"] * 2 + ["ModelRequest"]
    calls = [p for m in back for p in m.parts if isinstance(p, ToolCallPart)]
    assert [(c.tool_call_id, c.tool_name, c.args) for c in calls] == [
        ("c1", "run", '{"a": 1}'),  # the arguments as the model wrote them
        ("c2", "run", '{"b":2}'),
    ]
    results = [p for m in back for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_call_id, r.tool_name, r.content) for r in results] == [("c1", "run", "boom"), ("c2", "run", "ok")]
    (prompt,) = [p for p in back[0].parts if isinstance(p, UserPromptPart)]
    text, picture = prompt.content
    assert text == "Look:" and isinstance(picture, BinaryContent)
    assert (picture.data, picture.media_type) == (image.data, image.media_type)
    assert to_openai_messages(back)[:3] == chat[:3]
