"""The LangChain v1 middleware end to end: `langchain.agents.create_agent` with `ContextdMiddleware`,
a real contextd (on SQLite: conftest.py), and LangChain's own fake chat model. None of langchain_core's fake
chat models implements `bind_tools` (BaseChatModel's raises NotImplementedError), and create_agent
binds the agent's tools, so `ScriptedModel` adds it to GenericFakeChatModel, and records what each
call was given."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.tools import ToolException, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from contextd_client import AsyncClient, Client
from contextd_client.integrations.langchain import ContextdMiddleware, SessionMismatch, session_for_thread
from contextd_client.v1 import content_pb2
from tests.conftest import ServerThread

SYSTEM = "You fix bugs."
BUDGET_TOKENS = 150
"""Small enough that the long test run leaves the view once a later turn has read it."""
TEST_RUN = "\n".join(
    [
        *(f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)),
        "E   ValueError: month must be in 1..12",
    ]
)


@tool
def run_tests() -> str:
    """Run the test suite."""
    return TEST_RUN


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return "def parse(text):\n    year, month, day = text.split('-')\n"


class ScriptedModel(GenericFakeChatModel):
    """GenericFakeChatModel, able to take tools; `calls` holds what each call got (messages, tool names)."""

    calls: list[tuple[list[BaseMessage], list[str]]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[t if isinstance(t, dict) else convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.calls.append((list(messages), [t["function"]["name"] for t in kwargs.get("tools", [])]))
        return super()._generate(messages, *args, **kwargs)


def call(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def fixing(model_calls: list[tuple[list[BaseMessage], list[str]]]) -> Iterator[AIMessage]:
    """The replies of a model fixing the bug, each chosen (lazily) from what its call was given."""
    yield call("run_tests", "call_1")
    yield call("read_file", "call_2", path="src/parser.py")
    seen = model_calls[-1][0]
    placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", str(seen[3].content))
    assert placeholder, "the test run should have left the view by the third call"
    yield call("contextd_retrieve", "call_3", handle=placeholder.group(1), grep="Error")
    error = next(line for line in str(model_calls[-1][0][-1].content).splitlines() if "Error" in line)
    yield AIMessage(f"parse() adds 1 to the month: {error.strip()}")


def model_for(replies: Any) -> ScriptedModel:
    model = ScriptedModel(messages=iter(()))
    model.messages = replies(model.calls) if callable(replies) else iter(replies)
    return model


def stored(client: Client, session_id: str) -> list[tuple[str, str]]:
    """Each item of the session as (role, the tool call ids it makes or answers), from the history
    (a view keeps the budget's offloads in force: whole turns may have left it)."""
    items = [client.explain_item(session_id, seq).item for seq in range(1, client.get_session(session_id).version + 1)]
    return [
        (
            content_pb2.Role.Name(item.role).removeprefix("ROLE_").lower(),
            " ".join(b.tool_use.id for b in item.content if b.HasField("tool_use"))
            or next((b.tool_result.tool_use_id for b in item.content if b.HasField("tool_result")), ""),
        )
        for item in items
    ]


def given(messages: Sequence[BaseMessage]) -> list[tuple[str, str]]:
    """The same of the system prompt and the graph's messages."""
    return pairs(convert_to_openai_messages([SystemMessage(SYSTEM), *messages]))


def pairs(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("tool_call_id") or " ".join(c["id"] for c in m.get("tool_calls", []))) for m in messages]


def test_the_model_gets_the_view_while_the_state_keeps_every_message(client: Client) -> None:
    thread = f"lc-{uuid.uuid4().hex[:12]}"
    config: Any = {"configurable": {"thread_id": thread}}
    saver = InMemorySaver()
    model = model_for(fixing)
    middleware = ContextdMiddleware(client, budget_tokens=BUDGET_TOKENS)
    agent = create_agent(
        model, [run_tests, read_file], system_prompt=SYSTEM, middleware=[middleware], checkpointer=saver
    )

    state = agent.invoke({"messages": [HumanMessage("test_parse fails")]}, config)

    # The model got contextd's view: the system prompt first, and by the third call the long test
    # run as a placeholder with a handle, which it used to get the error line back.
    assert all(isinstance(got[0], SystemMessage) and got[0].content == SYSTEM for got, _ in model.calls)
    assert all(
        {"run_tests", "read_file", "contextd_retrieve", "contextd_search"} <= set(tools) for _, tools in model.calls
    )
    third = model.calls[2][0]
    assert "retrieve with handle" in str(third[3].content) and len(str(third[3].content)) < 500
    assert state["messages"][-1].content == "parse() adds 1 to the month: 601:E   ValueError: month must be in 1..12"
    # The graph's state is untouched: every message whole, the test run's 601 lines included.
    run = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "call_1")
    assert run.content == TEST_RUN
    retrieved = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "call_3")
    assert (
        retrieved.name == "contextd_retrieve" and retrieved.status == "success" and "month must be" in retrieved.content
    )
    # The session holds the system prompt and each message once, in order, the final answer too
    # (appended after the run), and the decision to take the test run out has its certificate.
    assert stored(client, thread) == given(state["messages"])
    assert client.get_session(thread).version == 1 + len(state["messages"]) == 9
    assert any(c.seq == 4 for c in client.list_certificates(thread))

    # The next invoke on the thread appends only its own turn.
    model.messages = iter([AIMessage("It is fixed now.")])
    state = agent.invoke({"messages": [HumanMessage("And now?")]}, config)
    assert client.get_session(thread).version == 11
    assert stored(client, thread) == given(state["messages"])

    # So does a fresh middleware (another process, or this one restarted) on the same thread.
    model.messages = iter([AIMessage("Still fixed.")])
    restarted = ContextdMiddleware(client, budget_tokens=BUDGET_TOKENS)
    agent = create_agent(
        model, [run_tests, read_file], system_prompt=SYSTEM, middleware=[restarted], checkpointer=saver
    )
    state = agent.invoke({"messages": [HumanMessage("Sure?")]}, config)
    assert client.get_session(thread).version == 13
    assert stored(client, thread) == given(state["messages"])


@pytest.mark.parametrize("asyncio_client", [True, False], ids=["AsyncClient", "Client in a thread"])
async def test_ainvoke_works_the_same(server: ServerThread, asyncio_client: bool) -> None:
    thread = f"lc-{uuid.uuid4().hex[:12]}"
    replies = [
        call("run_tests", "call_1"),
        call("contextd_search", "call_2", query="month must be"),
        AIMessage("Found it."),
    ]
    model = model_for(replies)
    with Client(server.target) as blocking:
        async with AsyncClient(server.target) as asynchronous:
            middleware = ContextdMiddleware(asynchronous if asyncio_client else blocking, budget_tokens=BUDGET_TOKENS)
            agent = create_agent(model, [run_tests], system_prompt=SYSTEM, middleware=[middleware])
            state = await agent.ainvoke(
                {"messages": [HumanMessage("test_parse fails")]}, {"configurable": {"thread_id": thread}}
            )

        # The model's last call got the view (the test run out of it), the state keeps the test run whole.
        seen = model.calls[-1][0]
        assert [type(m).__name__ for m in seen] == ["SystemMessage", "HumanMessage", *["AIMessage", "ToolMessage"] * 2]
        assert len(str(seen[3].content)) < 1000 and state["messages"][2].content == TEST_RUN
        found = state["messages"][-2]
        assert found.name == "contextd_search" and "seq 4 (tool, run_tests)" in found.content
        assert stored(blocking, thread) == given(state["messages"])
        assert blocking.get_session(thread).version == 7


def test_which_session_an_invocation_uses(client: Client) -> None:
    suffix = uuid.uuid4().hex[:12]
    fixed, explicit, odd_thread = f"fixed-{suffix}", f"explicit-{suffix}", f"user 7/{suffix}"

    def answer(middleware: ContextdMiddleware, config: Any) -> None:
        agent = create_agent(model_for([AIMessage("Hi.")]), [], system_prompt=SYSTEM, middleware=[middleware])
        agent.invoke({"messages": [HumanMessage("Hello")]}, config)

    # The thread, as a session id when it is one, else hashed into one.
    answer(ContextdMiddleware(client), {"configurable": {"thread_id": odd_thread}})
    assert session_for_thread(odd_thread).startswith("thread-") and session_for_thread(fixed) == fixed
    assert client.get_session(session_for_thread(odd_thread)).metadata["langgraph_thread_id"] == odd_thread
    # The middleware's own session beats the thread; the invocation's beats both.
    answer(ContextdMiddleware(client, session_id=fixed), {"configurable": {"thread_id": f"t-{suffix}"}})
    config = {"configurable": {"thread_id": f"u-{suffix}", "contextd_session_id": explicit}}
    answer(ContextdMiddleware(client, session_id=fixed), config)
    assert [client.get_session(s).version for s in (fixed, explicit)] == [3, 3]
    # A prefix keeps two agents on one thread (a supervisor and its sub-agent) apart.
    answer(ContextdMiddleware(client, session_prefix="helper:"), {"configurable": {"thread_id": fixed}})
    assert client.get_session(f"helper:{fixed}").version == 3 and client.get_session(fixed).version == 3
    with pytest.raises(ValueError, match="no contextd session for this call"):
        answer(ContextdMiddleware(client), {})


def test_a_thread_that_lost_its_messages_is_refused_not_duplicated(client: Client) -> None:
    thread = f"lc-{uuid.uuid4().hex[:12]}"
    config: Any = {"configurable": {"thread_id": thread}}
    middleware = ContextdMiddleware(client)
    # No checkpointer: the second run's messages start afresh, and are not the session's history.
    agent = create_agent(model_for([AIMessage("Hi.")] * 2), [], system_prompt=SYSTEM, middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("Hello")]}, config)
    with pytest.raises(SessionMismatch, match="holds 3 items but this call's system prompt and messages give 2"):
        agent.invoke({"messages": [HumanMessage("Hello again")]}, config)
    assert client.get_session(thread).version == 3


def test_cache_breakpoint_and_reported_usage(client: Client) -> None:
    thread = f"lc-{uuid.uuid4().hex[:12]}"
    reply = AIMessage(
        "Hi.",
        usage_metadata={
            "input_tokens": 120,
            "output_tokens": 5,
            "total_tokens": 125,
            "input_token_details": {"cache_read": 100},
        },
        response_metadata={"model_provider": "anthropic", "model_name": "claude-test"},
    )
    model = model_for([reply])
    middleware = ContextdMiddleware(client, place_cache_breakpoint=True, agent_tools=False)
    agent = create_agent(model, [], system_prompt=SYSTEM, middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("Hello")]}, {"configurable": {"thread_id": thread}})

    (messages, tools), *_ = model.calls
    assert tools == []  # agent_tools=False: contextd's tools are not offered
    marked = [b for m in messages if isinstance(m.content, list) for b in m.content if "cache_control" in b]
    assert marked == [{"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}}]
    usage = client.get_status(thread).usage
    assert usage is not None
    assert (usage.reported_calls, usage.reported_input_tokens, usage.reported_cache_read_tokens) == (1, 20, 100)


def test_tool_calls_keep_their_ids_and_a_failed_tool_its_error(client: Client) -> None:
    thread = f"lc-{uuid.uuid4().hex[:12]}"

    @tool
    def read(path: str) -> str:
        """Read a file."""
        raise ToolException(f"{path}: no such file")

    read.handle_tool_error = True  # the tool's failure is a ToolMessage with status "error"
    replies = [call("read", "call_x", path="a.py"), AIMessage("It is not there.")]
    agent = create_agent(model_for(replies), [read], system_prompt=SYSTEM, middleware=[ContextdMiddleware(client)])
    agent.invoke({"messages": [HumanMessage("Read a.py")]}, {"configurable": {"thread_id": thread}})

    messages = client.render_view(thread, "anthropic_messages").messages
    assert messages[1]["content"] == [{"type": "tool_use", "id": "call_x", "name": "read", "input": {"path": "a.py"}}]
    (result,) = messages[2]["content"]
    assert (result["tool_use_id"], result["is_error"], result["content"]) == ("call_x", True, "a.py: no such file")


def test_two_processes_on_one_thread_write_each_turn_once(client: Client) -> None:
    """Two middlewares (two processes) take turns on one thread; each one's memory of where the
    session stood goes stale, and the append it tries on it is refused and re-counted."""
    thread = f"lc-{uuid.uuid4().hex[:12]}"
    config: Any = {"configurable": {"thread_id": thread}}
    saver = InMemorySaver()
    agents = [
        create_agent(
            model_for([AIMessage(f"Answer {n}.") for n in range(3)]),
            [],
            system_prompt=SYSTEM,
            middleware=[ContextdMiddleware(client)],
            checkpointer=saver,
        )
        for _ in range(2)
    ]
    for turn, agent in enumerate([*agents, *agents]):
        state = agent.invoke({"messages": [HumanMessage(f"Question {turn}")]}, config)
        assert client.get_session(thread).version == 1 + 2 * (turn + 1)
    assert stored(client, thread) == given(state["messages"])
    # Deleted meanwhile: the next turn starts it again, with the whole thread.
    client.delete_session(thread)
    state = agents[0].invoke({"messages": [HumanMessage("Once more")]}, config)
    assert stored(client, thread) == given(state["messages"]) and client.get_session(thread).version == 11
