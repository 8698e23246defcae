"""contextd behind a LangChain v1 agent (``langchain.agents.create_agent``, a LangGraph graph): an
``AgentMiddleware`` that sends the model contextd's view instead of the agent's whole history.

    from contextd_client import Client
    from contextd_client.integrations.langchain import ContextdMiddleware

    contextd = ContextdMiddleware(Client("127.0.0.1:50051"), budget_tokens=100_000)
    agent = create_agent(model, tools, system_prompt="You fix bugs.", middleware=[contextd],
                         checkpointer=InMemorySaver())  # model, tools: the agent's own
    agent.invoke({"messages": [("user", "Fix test_parse.")]}, {"configurable": {"thread_id": "bug-42"}})

Before each model call (`wrap_model_call` / `awrap_model_call`) the middleware appends to the
thread's contextd session what the session has not seen yet of the call's system prompt and
messages, renders the view (OpenAI Chat format, within `budget_tokens`, converted back to LangChain
messages with langchain_core's own converters) and calls the model with it
(``handler(request.override(messages=...))``). The graph's state is not touched: it keeps every
message whole, and only the model call sees the view. What left the view is a placeholder naming a
handle; contextd's agent tools (`contextd_retrieve`, `contextd_search`, ...) are added to the call's
tools and their calls answered here (`wrap_tool_call`), so the model gets an original back itself.
Every decision has a certificate (``client.list_certificates(session_id)``), and the session lives
in contextd, where any process can read it, recover from it, or continue it.

What it replaces: LangChain's `SummarizationMiddleware` rewrites the state's history into a summary
once a token threshold passes (an extra model call; what it drops is gone), `ContextEditingMiddleware`
(`ClearToolUsesEdit`) replaces older tool outputs with "[cleared]" by an approximate count, and
`trim_messages` cuts the oldest. Use this instead of them, not with them: they rewrite the history
this middleware mirrors. Put it last in ``middleware=[...]``, so it sees the request as the model
would get it (the system prompt a `dynamic_prompt` set, the tools other middleware added).

Which session (first that applies): ``config["configurable"]["contextd_session_id"]`` of the
invocation; the `session_id` given to the middleware (every thread then shares it); the LangGraph
thread, ``config["configurable"]["thread_id"]``, as `session_for_thread` maps it (`session_prefix`
and the thread id, when that is a valid session id). A session that does not exist is created.

Appending exactly once: the session mirrors the call's system prompt followed by the agent's
messages, one item per message (a message with nothing in it gives none), so the session's version
says how many it already holds, and only the rest is appended, with ``expected_version`` (a
concurrent writer makes it re-count, never write twice) and an idempotency key made of the session,
the version and the items (a retry, by anyone, replays). A fresh process or a restart re-counts from
the session, so nothing is appended twice across restarts either. The system prompt is stored once,
first; the model gets the request's own in its place (a `dynamic_prompt`'s change takes effect, but
is not recorded). The model's response is appended once it is in the graph's state: at the next
model call, with the tool results that answer it, or after the run (`after_agent`) for the final
answer. So the session records what the state holds, after `HumanInTheLoopMiddleware` edited a tool
call or `PIIMiddleware` redacted a reply, and never a response that a retry or a fallback replaced.
A session holding more items than a call's messages give (a thread without a checkpointer, whose
messages start afresh each run; messages removed from the state) raises `SessionMismatch` rather
than guess.

Works with `Client` (``invoke``, ``stream``; under ``ainvoke`` its calls run in a worker thread)
and `AsyncClient` (``ainvoke``, ``astream``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import convert_to_messages
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from contextd_client import (
    AgentTools,
    AlreadyExists,
    AsyncAgentTools,
    AsyncClient,
    Client,
    ContextdError,
    NotFound,
    Usage,
    VersionConflict,
    View,
    ViewFormat,
)
from contextd_client.integrations._langchain_messages import (
    flat,
    items_each,
    items_of,
    mark_breakpoint,
    openai_call,
    openai_tools,
    tool_message,
    usage_of,
)
from contextd_client.v1 import content_pb2 as pb

__all__ = ["SESSION_KEY", "ContextdMiddleware", "SessionMismatch", "session_for_thread"]

SESSION_KEY = "contextd_session_id"
"""The ``config["configurable"]`` key naming an invocation's session; it wins over every other way."""

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # what the service accepts as a session id
_BATCH = 500  # items per append, under the service's default max_batch_items (1,000)
_ATTEMPTS = 5  # appends tried against writers racing this one, before giving up
_REMEMBERED = 4096  # sessions a middleware remembers the position of; forgetting one costs a GetSession
_DEFINITIONS = "agent_tool_definitions"  # a step asking for contextd's tool definitions

log = logging.getLogger(__name__)
T = TypeVar("T")


def session_for_thread(thread_id: str, prefix: str = "") -> str:
    """The contextd session of a LangGraph thread: `prefix` and the thread id when that is a valid
    session id (1-128 characters of A-Z a-z 0-9 . _ : -), else `prefix`, ``thread-`` and the thread
    id's SHA-256 (hex)."""
    if _SESSION_ID.fullmatch(prefix + thread_id):
        return prefix + thread_id
    return f"{prefix}thread-{hashlib.sha256(thread_id.encode()).hexdigest()}"


class SessionMismatch(ValueError):
    """The session holds more items than the call's system prompt and messages give: they are not the
    history it mirrors (no checkpointer keeps the thread, messages were removed from the state, or
    something else appends to the session). contextd's history is append-only: give the thread a
    checkpointer, or the invocation another session."""

    def __init__(self, session_id: str, stored: int, given: int) -> None:
        super().__init__(
            f"session {session_id!r} holds {stored} items but this call's system prompt and messages give "
            f"{given}: the graph's messages are not the session's history (keep the thread with a checkpointer, "
            f"or name another session in config['configurable'][{SESSION_KEY!r}])"
        )
        self.session_id, self.stored, self.given = session_id, stored, given


class ContextdMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Sends the model contextd's view of the thread, and records the thread in contextd.

    `client`: a `Client` (sync and async runs) or an `AsyncClient` (async runs only).
    `session_id`: one session for every invocation (created if missing) instead of one per thread;
        it mirrors the graph's messages all the same, so the graph keeps them (a checkpointer).
    `session_prefix`: put before the thread id in the session's id, so that two agents on one thread
        (a supervisor and the sub-agent it calls, which inherits its config) keep apart sessions.
    `budget_tokens`: the view's budget, in tokens of the view's encoding (0: no budget). The system
        prompt counts toward it; the tool definitions go with each render (contextd warns when
        something in them would break the prompt cache) but do not.
    `agent_tools`: add contextd's tools to the model's tools and answer their calls (their definitions
        go with every call; False leaves them out, for a model without tool calling, say, and the
        model then cannot use the handles in placeholders).
    `place_cache_breakpoint`: mark where contextd places the prompt-cache breakpoint with Anthropic's
        ``cache_control`` on a content block, as ChatAnthropic reads it; for Anthropic models only.
    `report_usage`: report what the provider billed (the reply's ``usage_metadata``) for each view, so
        ``client.get_status(id).usage`` shows it beside contextd's prediction.
    `policy`: the policy document of the sessions this creates ("" for the default).
    `author`: kept with every item this appends.
    """

    def __init__(
        self,
        client: Client | AsyncClient,
        *,
        session_id: str | None = None,
        session_prefix: str = "",
        budget_tokens: int = 0,
        agent_tools: bool = True,
        place_cache_breakpoint: bool = False,
        report_usage: bool = True,
        policy: str = "",
        author: str = "langchain",
    ) -> None:
        super().__init__()
        self.client = client
        self.session_id = session_id
        self.session_prefix = session_prefix
        self.budget_tokens = budget_tokens
        self.agent_tools = agent_tools
        self.place_cache_breakpoint = place_cache_breakpoint
        self.report_usage = report_usage
        self.policy = policy
        self.author = author
        self._mirrors = _Mirrors()
        self._definitions: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------ hooks

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        client, where = self._blocking(), self._where(_current_config())
        prepared = _drive(client, self._prepare(where, request))
        response = handler(prepared.request)
        if self.report_usage and (usage := usage_of(response.result)) is not None:
            _drive(client, self._report(where, prepared.view_version, usage))
        return response

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> ModelResponse[Any]:
        where = self._where(_current_config())
        prepared = await self._arun(self._prepare(where, request))
        response = await handler(prepared.request)
        if self.report_usage and (usage := usage_of(response.result)) is not None:
            await self._arun(self._report(where, prepared.view_version, usage))
        return response

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        if not self._answers(request):
            return handler(request)
        tools = AgentTools(self._blocking(), self._where(_tool_config(request)).session_id)
        return tool_message(request.tool_call, tools.execute(openai_call(request.tool_call)))

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        if not self._answers(request):
            return await handler(request)
        session_id, call = self._where(_tool_config(request)).session_id, openai_call(request.tool_call)
        if isinstance(self.client, AsyncClient):
            result = await AsyncAgentTools(self.client, session_id).execute(call)
        else:
            result = await asyncio.to_thread(AgentTools(self.client, session_id).execute, call)
        return tool_message(request.tool_call, result)

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Appends the run's last messages (the final answer), which no model call followed."""
        steps = self._finish(state["messages"])
        if steps is not None:
            _drive(self._blocking(), steps)
        return None

    async def aafter_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        steps = self._finish(state["messages"])
        if steps is not None:
            await self._arun(steps)
        return None

    # ------------------------------------------------------------ steps

    def _prepare(self, where: _Where, request: ModelRequest[Any]) -> _Steps[_Prepared]:
        yield from self._record(where, request.system_message, request.messages)
        definitions: list[dict[str, Any]] = []
        if self.agent_tools:
            if self._definitions is None:
                self._definitions = yield _Call(_DEFINITIONS)
            definitions = self._definitions
        tools = [*request.tools, *definitions]
        view: View = yield _Call(
            "render_view",
            (where.session_id, ViewFormat.OPENAI_CHAT),
            {
                "budget_tokens": self.budget_tokens,
                "tools": openai_tools(tools) or None,
                "place_cache_breakpoint": self.place_cache_breakpoint,
            },
        )
        messages = [dict(m) for m in view.messages]
        if self.place_cache_breakpoint:
            mark_breakpoint(messages, view)
        shown = convert_to_messages(messages)
        system = request.system_message
        if shown and isinstance(shown[0], SystemMessage):
            # The stored system prompt; the request's own goes in its place (the same, unless a
            # dynamic prompt changed it since, and with its content blocks as the agent made them).
            first = shown.pop(0)
            system = system or cast(SystemMessage, first)
        overridden = request.override(messages=cast(list[AnyMessage], shown), system_message=system, tools=tools)
        return _Prepared(overridden, view.view_version)

    def _record(self, where: _Where, system: SystemMessage | None, messages: Sequence[BaseMessage]) -> _Steps[int]:
        """Appends what the session has not seen of `system` and `messages`; returns its version."""
        session_id = where.session_id
        mirror = self._mirrors.pop(session_id)  # remembered again only if this succeeds
        if mirror is not None and mirror.leads_to(messages):
            known, pending = mirror.version, flat(items_each(messages, mirror.messages))
        else:
            known = yield from self._open(where)
            pending = _pending(session_id, known, system, messages)
        failure: ContextdError | None = None
        for _ in range(_ATTEMPTS):
            try:
                for start in range(0, len(pending), _BATCH):
                    batch = pending[start : start + _BATCH]
                    key = _idempotency_key(session_id, known, self.author, batch)
                    kwargs = {"expected_version": known, "idempotency_key": key, "author": self.author}
                    known = (yield _Call("append_items", (session_id, batch), kwargs)).version
                break
            except VersionConflict as conflict:  # another writer got there first: count again
                failure, known = conflict, conflict.current_version
            except NotFound as gone:  # deleted since this process last saw it
                failure, known = gone, (yield from self._open(where))
            pending = _pending(session_id, known, system, messages)
        else:
            assert failure is not None
            raise failure
        last_id = messages[-1].id if messages else None
        self._mirrors.put(session_id, _Mirror(known, len(messages), last_id, system))
        return known

    def _open(self, where: _Where) -> _Steps[int]:
        """The session's version, creating the session when it does not exist."""
        try:
            return int((yield _Call("get_session", (where.session_id,))).version)
        except NotFound:
            pass
        metadata = {"framework": "langchain"}
        if where.thread_id is not None and len(where.thread_id) <= 256:
            metadata["langgraph_thread_id"] = where.thread_id
        try:
            created = yield _Call("create_session", (where.session_id,), {"metadata": metadata, "policy": self.policy})
            return int(created.version)
        except AlreadyExists:  # created meanwhile by another process (or by this try's lost answer)
            return int((yield _Call("get_session", (where.session_id,))).version)

    def _finish(self, messages: Sequence[BaseMessage]) -> _Steps[int] | None:
        """The steps appending the run's last messages, when this process made the run's model calls
        (it knows the system prompt the session starts with); the next model call does it otherwise."""
        try:
            where = self._where(_current_config())
        except ValueError:  # no session, so no model call either (something ended the run before one)
            return None
        mirror = self._mirrors.peek(where.session_id)
        if mirror is None or len(messages) <= mirror.messages:
            return None
        return self._record(where, mirror.system, messages)

    def _report(self, where: _Where, view_version: int, usage: Usage) -> _Steps[None]:
        try:
            yield _Call("report_usage", (where.session_id, view_version, usage))
        except ContextdError as error:  # the call succeeded; its bookkeeping must not fail the agent
            log.warning("contextd: usage of view %s not reported: %s", view_version, error)

    # ------------------------------------------------------------ plumbing

    def _where(self, config: Mapping[str, Any]) -> _Where:
        configurable = config.get("configurable") or {}
        thread = configurable.get("thread_id")
        thread_id = None if thread is None else str(thread)
        if explicit := configurable.get(SESSION_KEY):
            return _Where(str(explicit), thread_id)
        if self.session_id:
            return _Where(self.session_id, thread_id)
        if thread_id is not None:
            return _Where(session_for_thread(thread_id, self.session_prefix), thread_id)
        raise ValueError(
            "no contextd session for this call: invoke the agent with config={'configurable': {'thread_id': ...}}, "
            f"name one in config['configurable'][{SESSION_KEY!r}], or give ContextdMiddleware a session_id"
        )

    def _answers(self, request: ToolCallRequest) -> bool:
        """Whether the call is to one of contextd's tools (and no registered tool has its name)."""
        return self.agent_tools and request.tool is None and str(request.tool_call["name"]).startswith("contextd_")

    def _blocking(self) -> Client:
        if isinstance(self.client, AsyncClient):
            raise TypeError(
                "ContextdMiddleware has an AsyncClient: run the agent with ainvoke/astream, or give it a Client"
            )
        return self.client

    async def _arun(self, steps: _Steps[T]) -> T:
        if isinstance(self.client, AsyncClient):
            return await _adrive(self.client, steps)
        return await asyncio.to_thread(_drive, self.client, steps)


# ------------------------------------------------------------------ state


@dataclass(frozen=True, slots=True)
class _Where:
    session_id: str
    thread_id: str | None


@dataclass(frozen=True, slots=True)
class _Prepared:
    request: ModelRequest[Any]
    view_version: int


@dataclass(frozen=True, slots=True)
class _Mirror:
    """What this process knows of a session: its first `version` items are the system prompt's and
    those of the agent's first `messages` messages (the last of them with id `last_id`)."""

    version: int
    messages: int
    last_id: str | None
    system: SystemMessage | None

    def leads_to(self, messages: Sequence[BaseMessage]) -> bool:
        """Whether `messages` extend the ones this mirror covers (as far as ids tell)."""
        if len(messages) < self.messages:
            return False
        return self.messages == 0 or self.last_id is None or messages[self.messages - 1].id == self.last_id


class _Mirrors:
    """The position of the most recent sessions this process wrote to."""

    def __init__(self) -> None:
        self._known: OrderedDict[str, _Mirror] = OrderedDict()
        self._lock = threading.Lock()

    def pop(self, session_id: str) -> _Mirror | None:
        with self._lock:
            return self._known.pop(session_id, None)

    def peek(self, session_id: str) -> _Mirror | None:
        with self._lock:
            return self._known.get(session_id)

    def put(self, session_id: str, mirror: _Mirror) -> None:
        with self._lock:
            self._known[session_id] = mirror
            self._known.move_to_end(session_id)
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)


# ------------------------------------------------------------------ calls


@dataclass(frozen=True, slots=True)
class _Call:
    """One client call a step needs: a method `Client` and `AsyncClient` share, and its arguments."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


_Steps = Generator[_Call, Any, T]
"""Steps yield the calls they need and get their results (or their `ContextdError`s) back, so the
one logic runs over the blocking client and over the asyncio one."""


def _drive(client: Client, steps: _Steps[T]) -> T:
    result: Any = None
    error: ContextdError | None = None
    while True:
        try:
            step = steps.send(result) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        result, error = None, None
        try:
            if step.method == _DEFINITIONS:
                result = AgentTools(client, "").definitions()
            else:
                result = getattr(client, step.method)(*step.args, **step.kwargs)
        except ContextdError as failed:
            error = failed


async def _adrive(client: AsyncClient, steps: _Steps[T]) -> T:
    result: Any = None
    error: ContextdError | None = None
    while True:
        try:
            step = steps.send(result) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        result, error = None, None
        try:
            if step.method == _DEFINITIONS:
                result = await AsyncAgentTools(client, "").definitions()
            else:
                result = await getattr(client, step.method)(*step.args, **step.kwargs)
        except ContextdError as failed:
            error = failed


def _current_config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # outside a graph run: no thread, no configurable
        return {}


def _tool_config(request: ToolCallRequest) -> Mapping[str, Any]:
    runtime = request.runtime
    return runtime.config if runtime is not None else _current_config()


# ------------------------------------------------------------------ appends


def _pending(
    session_id: str, stored: int, system: SystemMessage | None, messages: Sequence[BaseMessage]
) -> list[pb.Item]:
    """The items of `system` and `messages` past the session's first `stored`."""
    head = items_of(system, "the system prompt") if system is not None else []
    given = head + flat(items_each(messages))
    if len(given) < stored:
        raise SessionMismatch(session_id, stored, len(given))
    return given[stored:]


def _idempotency_key(session_id: str, version: int, author: str, items: Sequence[pb.Item]) -> str:
    """The same for the same items appended after the same version: a retry, by anyone, replays."""
    digest = hashlib.sha256(f"{session_id}\0{version}\0{author}\0".encode())
    for item in items:
        digest.update(item.SerializeToString(deterministic=True))
    return f"langchain:{digest.hexdigest()}"
