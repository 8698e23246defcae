"""contextd as the history of a pydantic-ai agent (pydantic-ai 2.x, its capabilities).

`ContextdHistory` is a capability: before each model request it appends to a contextd
session the turns the session does not hold yet and sends the model the session's view,
as pydantic-ai messages; `result.all_messages()` keeps every message whole, and what left
the view stays retrievable by its handle. Adopting it:

    from pydantic_ai import Agent
    from contextd_client import AsyncClient
    from contextd_client.integrations.pydantic_ai import ContextdHistory

    history = ContextdHistory(AsyncClient("127.0.0.1:50051"), budget_tokens=100_000)
    agent = Agent("anthropic:claude-sonnet-4-5", capabilities=[history])
    result = await agent.run("Fix the failing test.", conversation_id="fixer-1")  # the session

What it replaces: pydantic-ai bounds a context with `ProcessHistory` (V1's
`history_processors=`), a function that trims or summarizes the messages before each request
and makes its result the run's history: what it dropped is gone, and nothing says why. Here
nothing is dropped: the view is contextd's (a placeholder naming a handle, a certificate per
decision), the model has contextd's tools to take back what left it (`ContextdToolset`;
`tools=False` leaves them out), and the run's history is untouched. It hooks
`before_model_request` itself because a `ProcessHistory` processor's result replaces the
run's history; this one changes the request only. Don't add a processor that rewrites the
history beside it (`HistoryRewritten`): contextd decides what the model sees.

Sessions: `session=` is an id, a function of the `RunContext` (``lambda ctx:
ctx.deps.session_id``), or None (the default): the run's `conversation_id`, which
pydantic-ai takes from ``agent.run(..., conversation_id=...)``, inherits from
`message_history` or makes anew; one conversation, one session. A missing session is
created. `Client` works as `AsyncClient` does (its calls run on a worker thread).

Appended once: at a run's start the session's version (its item count) is set against the
items the run's `message_history` converts to. As many: the history is the session's. More:
the session lacks the history's tail (a run stopped before its end), which is appended.
Fewer: the history is a view of the session (`load_history`) or none, and the run's messages
go after the session's, which the model sees through the view (with no history at all, the
run's opening system prompt is taken to be the session's, not appended again). Then, before
each request, what the history holds beyond that; after the run, its last response. An
append expects the session's version (one writer per session: another's append in between
is `VersionConflict`), and its key is that version and the batch's digest, so the same batch
sent twice (two processes on one history, a retry after a lost answer) is stored once.

Conversion, through Chat Completions messages (`to_openai_messages`): system prompts (not a
request-scoped one, which is its request's alone); user prompts (text, images, documents;
other media as a one-line stand-in); tool returns with `name`, and `is_error` when failed or
retried, so a validation retry is a tool error; retry feedback (and a deprecated
`RetryPromptPart` naming no tool) as user text; a response as one assistant message: text,
tool calls with their ids, thinking as the item's reasoning (its text: the signature stays
on the part), provider-run tools' calls and results as text. The request is the view,
message for message: an item shown whole and unchanged is the run's own part or message
(thinking signatures, files, provider details intact), an item the view changed comes from
it (a tool output that left the view is a `ToolReturnPart` holding the placeholder).
Instructions (`instructions=`) are not history: pydantic-ai sends them with every request,
outside the view and its budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import anyio.to_thread
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelRequestPart, ModelResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from contextd_client._agent import AgentTools, AsyncAgentTools
from contextd_client._aio import AsyncClient
from contextd_client._client import Client
from contextd_client._errors import AlreadyExists, NotFound
from contextd_client._types import Session, Usage, View, ViewFormat, ViewItem
from contextd_client.formats import items_from_openai
from contextd_client.integrations._pydantic_ai_chat import (
    ChatMessage,
    chat_of,
    from_openai_messages,
    from_request_part,
    request_part,
    response_of,
    to_openai_messages,
    tool_names,
)
from contextd_client.v1 import content_pb2 as pb

__all__ = [
    "ContextdHistory",
    "ContextdToolset",
    "HistoryRewritten",
    "SessionSource",
    "from_openai_messages",
    "load_history",
    "load_history_async",
    "to_openai_messages",
]

T = TypeVar("T")
SessionSource = str | Callable[[RunContext[AgentDepsT]], str] | None
"""A session id, a function of the run's context giving one, or None: the run's conversation_id."""

AUTHOR = "pydantic-ai"
_METADATA = {"framework": "pydantic-ai"}


class HistoryRewritten(Exception):
    """The run's history no longer starts with what was appended from it (something rewrote it)."""


# ------------------------------------------------------------------ the capability


@dataclass(kw_only=True)
class _Progress:
    """Where a run stands with its session: its first `stored` items are the session's."""

    session_id: str
    stored: int
    version: int
    first_known: int
    """The first item whose seq is known: item k is seq ``k + 1 + version - stored`` from here."""
    view_version: int = 0
    """The view of the request being made, until its usage is reported."""
    continuing: bool = False
    """The run started without history on a session that has some: its opening system prompt is the session's."""
    appended: list[bytes] = field(default_factory=list[bytes])
    """The digests of the items this run appended, to notice a history rewritten under it."""


@dataclass
class ContextdHistory(AbstractCapability[AgentDepsT]):
    """Keep the agent's history in contextd and send the model contextd's view of it.

    `budget_tokens` bounds each view (tokens of the view's encoding, history only; 0: none).
    `tools` adds contextd's agent tools (`ContextdToolset`), so the model can take back
    what left its view. `report_usage` reports each response's usage (as pydantic-ai has it)
    for the view it was made with, so ``client.get_status(id).usage`` sets what the provider
    billed beside what contextd predicted. `author` is kept with every item appended.
    """

    client: Client | AsyncClient
    session: SessionSource[AgentDepsT] = None
    budget_tokens: int = 0
    tools: bool = True
    report_usage: bool = True
    author: str = AUTHOR
    _progress: _Progress | None = field(default=None, init=False, repr=False)
    _toolset: ContextdToolset[AgentDepsT] | None = field(default=None, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a client

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> ContextdHistory[AgentDepsT]:
        run = replace(self)  # a run's progress is its own
        run._toolset = self._toolset  # and the tool definitions, once asked, everyone's
        return run

    def get_toolset(self) -> ContextdToolset[AgentDepsT] | None:
        if self.tools and self._toolset is None:
            self._toolset = ContextdToolset(self.client, self.session)
        return self._toolset

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        await self._start(ctx, ctx.messages)

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        history = ctx.messages
        if not history or not isinstance(history[-1], ModelRequest):
            return request_context  # continuing a suspended response: nothing new to show
        progress = self._progress or await self._start(ctx, [m for m in history if m.run_id != ctx.run_id])
        origins = await self._append(progress, history)
        view = await _call(
            self.client,
            lambda c: c.render_view(progress.session_id, ViewFormat.OPENAI_CHAT, budget_tokens=self.budget_tokens),
            lambda c: c.render_view(progress.session_id, ViewFormat.OPENAI_CHAT, budget_tokens=self.budget_tokens),
        )
        request_context.messages = _request_messages(view, history, origins, progress)  # the request's alone
        progress.view_version = view.view_version
        return request_context

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        progress, usage = self._progress, _usage_of(response)
        if self.report_usage and progress is not None and progress.view_version and usage is not None:
            session_id, view_version, progress.view_version = progress.session_id, progress.view_version, 0
            with contextlib.suppress(AlreadyExists):  # reported before with other figures: the first stands
                await _call(
                    self.client,
                    lambda c: c.report_usage(session_id, view_version, usage),
                    lambda c: c.report_usage(session_id, view_version, usage),
                )
        return response

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        if self._progress is not None:
            await self._append(self._progress, result.all_messages())  # the last response
        return result

    async def _start(self, ctx: RunContext[AgentDepsT], prior: Sequence[ModelMessage]) -> _Progress:
        session_id = _session_of(self.session, ctx)
        session = await _call(self.client, lambda c: _ensure(c, session_id), lambda c: _ensure_async(c, session_id))
        held, known = session.version, len(_items(prior)[0])
        continuing = held > 0 and not prior
        first_known = 0 if known >= held else known  # the history is the session's from its start, or a view of it
        self._progress = _Progress(
            session_id=session_id, stored=min(held, known), version=held, first_known=first_known, continuing=continuing
        )
        return self._progress

    async def _append(self, progress: _Progress, history: Sequence[ModelMessage]) -> list[_Origin]:
        items, origins = _items(history, continuing=progress.continuing)
        done = len(progress.appended)
        digests = [
            hashlib.sha256(i.SerializeToString(deterministic=True)).digest() for i in items[progress.stored - done :]
        ]
        if len(items) < progress.stored or digests[:done] != progress.appended:
            raise HistoryRewritten(
                f"session {progress.session_id}: the run's history no longer holds the {progress.stored} items "
                "appended from it; a history processor rewrote it? (contextd decides what the model sees)"
            )
        new = items[progress.stored :]
        if new:
            # The key names the batch and where it goes, so the same append again is answered by the first.
            batch = hashlib.sha256(b"".join(digests[done:])).hexdigest()[:32]
            options: dict[str, Any] = {
                "idempotency_key": f"{self.author}:{progress.version}:{batch}",
                "expected_version": progress.version,
                "author": self.author,
            }
            result = await _call(
                self.client,
                lambda c: c.append_items(progress.session_id, new, **options),
                lambda c: c.append_items(progress.session_id, new, **options),
            )
            progress.appended.extend(digests[done:])
            progress.stored, progress.version = len(items), result.version
        return origins


def _session_of(source: SessionSource[AgentDepsT], ctx: RunContext[AgentDepsT]) -> str:
    if isinstance(source, str):
        return source
    if source is not None:
        return source(ctx)
    if not ctx.conversation_id:
        raise ValueError("no contextd session: give ContextdHistory a session, or run with conversation_id=")
    return ctx.conversation_id


def _usage_of(response: ModelResponse) -> Usage | None:
    """A response's usage as contextd takes it: pydantic-ai's input counts the cached tokens, read and
    written; contextd's is the rest. None when the model reported none."""
    usage = response.usage
    if not usage.input_tokens and not usage.output_tokens:
        return None
    return Usage(
        provider=response.provider_name or AUTHOR,
        model=response.model_name or "",
        input_tokens=max(0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens),
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )


def _ensure(client: Client, session_id: str) -> Session:
    try:
        return client.get_session(session_id)
    except NotFound:
        pass
    try:
        return client.create_session(session_id, metadata=_METADATA)
    except AlreadyExists:  # created in between, or our own try whose answer was lost
        return client.get_session(session_id)


async def _ensure_async(client: AsyncClient, session_id: str) -> Session:
    try:
        return await client.get_session(session_id)
    except NotFound:
        pass
    try:
        return await client.create_session(session_id, metadata=_METADATA)
    except AlreadyExists:
        return await client.get_session(session_id)


async def _call(
    client: Client | AsyncClient, sync: Callable[[Client], T], aio: Callable[[AsyncClient], Awaitable[T]]
) -> T:
    """One operation on either client; the blocking one's on a worker thread, off the event loop."""
    if isinstance(client, AsyncClient):
        return await aio(client)
    return await anyio.to_thread.run_sync(sync, client)


# ------------------------------------------------------------------ the request from the view


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where an item of the run's history comes from: message, part (-1: the whole response)."""

    message: int
    part: int
    chat: ChatMessage


def _items(history: Sequence[ModelMessage], *, continuing: bool = False) -> tuple[list[pb.Item], list[_Origin]]:
    """The items the history converts to, and where each comes from (without the opening system
    prompt when `continuing` a session, which has its own)."""
    origins = [
        _Origin(m, p, chat)
        for m, message in enumerate(history)
        for p, chat in chat_of(message)
        if not (continuing and m == 0 and chat["role"] == "system")
    ]
    items = [items_from_openai([o.chat]) for o in origins]
    kept = [(item[0], o) for item, o in zip(items, origins, strict=True) if item]  # an empty message has no item
    return [item for item, _ in kept], [o for _, o in kept]


def _request_messages(
    view: View, history: Sequence[ModelMessage], origins: Sequence[_Origin], progress: _Progress
) -> list[ModelMessage]:
    """The view as pydantic-ai messages, an item shown whole and unchanged as the history's own part."""
    seq_at = {i.message_index: i for i in view.items if i.message_index >= 0}
    names = tool_names(view.messages)
    out: list[ModelMessage] = []
    group: list[tuple[_Origin | None, ModelRequestPart]] = []
    for index, chat in enumerate(view.messages):
        origin = _original(seq_at.get(index), chat, origins, progress)
        if chat.get("role") == "assistant":
            _close(group, history, out)
            out.append(history[origin.message] if origin else response_of(chat))
        elif origin is not None:
            request = history[origin.message]
            assert isinstance(request, ModelRequest)
            group.append((origin, request.parts[origin.part]))
        else:
            group.append((None, request_part(chat, names)))
    _close(group, history, out)
    if not out or not isinstance(out[-1], ModelRequest):  # the request being made is the history's last
        out.append(history[-1])
    return out


def _original(
    item: ViewItem | None, chat: ChatMessage, origins: Sequence[_Origin], progress: _Progress
) -> _Origin | None:
    """The history's own item behind a view message, when the view shows it whole and unchanged."""
    if item is None or item.representation != "full":
        return None
    k = item.seq - 1 - (progress.version - progress.stored)
    if not progress.first_known <= k < len(origins):
        return None
    origin = origins[k]
    return origin if _shown(origin.chat) == _shown(chat) else None


def _close(
    group: list[tuple[_Origin | None, ModelRequestPart]], history: Sequence[ModelMessage], out: list[ModelMessage]
) -> None:
    """End a run of request parts: the original request when they are all of one, in order (with its
    parts that carry no item: instructions, request-scoped prompts), else a new request."""
    if not group:
        return
    sources = {o.message if o else None for o, _ in group}
    chosen = [o.part for o, _ in group if o]
    source = next(iter(sources))
    if len(sources) == 1 and source is not None and chosen == sorted(chosen):
        request = history[source]
        assert isinstance(request, ModelRequest)
        parts = [p for i, p in enumerate(request.parts) if i in chosen or from_request_part(p) is None]
        out.append(request if len(parts) == len(request.parts) else replace(request, parts=parts))
    else:
        out.append(ModelRequest(parts=[part for _, part in group]))
    group.clear()


def _shown(chat: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a Chat Completions view shows of a message (it leaves out reasoning, is_error, a tool's name)."""
    content = chat.get("content")
    if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        content = content[0]["text"]
    calls = tuple((c["id"], c["function"]["name"], c["function"]["arguments"]) for c in chat.get("tool_calls") or ())
    return chat.get("role"), json.dumps(content or "", sort_keys=True), chat.get("tool_call_id"), calls


# ------------------------------------------------------------------ contextd as the source


def load_history(client: Client, session_id: str, *, budget_tokens: int = 0) -> list[ModelMessage]:
    """The session's view as pydantic-ai messages, to continue it elsewhere:
    ``agent.run(prompt, message_history=load_history(ctx, id))``. What left the view is its
    placeholder (contextd keeps the original); [] for a session that does not exist yet. The
    messages carry the session's id as their conversation_id, which the run inherits."""
    try:
        view = client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=budget_tokens)
    except NotFound:
        return []
    return from_openai_messages(view.messages, conversation_id=session_id)


async def load_history_async(client: AsyncClient, session_id: str, *, budget_tokens: int = 0) -> list[ModelMessage]:
    """`load_history` over the asyncio client."""
    try:
        view = await client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=budget_tokens)
    except NotFound:
        return []
    return from_openai_messages(view.messages, conversation_id=session_id)


# ------------------------------------------------------------------ contextd's tools


_ARGUMENTS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


class ContextdToolset(AbstractToolset[AgentDepsT]):
    """contextd's agent tools (`contextd_retrieve`, `contextd_search`, `contextd_pin`,
    `contextd_unpin`, `contextd_propose_prune`, `contextd_status`) as a pydantic-ai toolset,
    acting on the run's session (`session` as for `ContextdHistory`). A failed call is a
    failed tool result the model reads (`ToolFailed`); results are bounded by the server."""

    def __init__(self, client: Client | AsyncClient, session: SessionSource[AgentDepsT] = None) -> None:
        self.client = client
        self.session = session
        self._definitions: dict[str, ToolDefinition] | None = None

    @property
    def id(self) -> str | None:
        return "contextd"

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        if self._definitions is None:  # asked of the service once
            fmt = ViewFormat.ANTHROPIC_MESSAGES
            found = await _call(
                self.client,
                lambda c: AgentTools(c, "", fmt).definitions(),
                lambda c: AsyncAgentTools(c, "", fmt).definitions(),
            )
            self._definitions = {
                d["name"]: ToolDefinition(
                    name=d["name"], parameters_json_schema=d["input_schema"], description=d.get("description")
                )
                for d in found
            }
        return {
            name: ToolsetTool(toolset=self, tool_def=definition, max_retries=1, args_validator=_ARGUMENTS)
            for name, definition in self._definitions.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]
    ) -> str:
        session_id, fmt = _session_of(self.session, ctx), ViewFormat.ANTHROPIC_MESSAGES
        call = {"type": "tool_use", "id": ctx.tool_call_id or name, "name": name, "input": tool_args}
        result = await _call(
            self.client,
            lambda c: AgentTools(c, session_id, fmt).execute(call),
            lambda c: AsyncAgentTools(c, session_id, fmt).execute(call),
        )
        if result.get("is_error"):
            raise ToolFailed(str(result["content"]))
        return str(result["content"])
