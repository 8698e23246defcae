"""Tools for the model: contextd's retrieve, search, pin, unpin, propose-prune and status,
handed to the model with the agent's own tools, and an executor that answers the calls
the model makes with them.

    tools = AgentTools(client, session_id, "openai_chat")
    response = model(messages, tools=[*my_tools, *tools.definitions()])
    for call in response_tool_calls:
        result = tools.execute(call) if tools.handles(call) else run_my_tool(call)   # the one line

`execute` takes the call as the provider gave it (Chat Completions: ``{"id", "type":
"function", "function": {"name", "arguments"}}``; Responses: ``{"type": "function_call",
"call_id", "name", "arguments"}``; Anthropic: ``{"type": "tool_use", "id", "name", "input"}``;
Converse: ``{"toolUse": {"toolUseId", "name", "input"}}``) and returns the tool result in the
same format (a ``tool`` message; a ``function_call_output`` item; a ``tool_result`` block; a
``toolResult`` block), never raising: a failed call is an error result the model
reads. Results are bounded (the server caps pages and hits; the status lists at most 50
items), so recovering context never floods it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextd_client._calls import Call, get_status, pin, propose_prune, retrieve, search
from contextd_client._errors import ContextdError
from contextd_client._types import PruneOutcome, Retrieved, SearchResults, Status, ViewFormat
from contextd_client.v1 import contextd_pb2 as api

if TYPE_CHECKING:
    from contextd_client._aio import AsyncClient
    from contextd_client._client import Client

PREFIX = "contextd_"
MAX_SEQS = 100
STATUS_ITEMS = 50
"""Items out of the view a status result lists (then their count)."""


@dataclass(frozen=True, slots=True)
class _Planned:
    call: Call[Any]
    say: Callable[[Any], str]


class _Tools:
    """What the sync and async executors share: reading the model's call, planning the RPC,
    writing its result."""

    def __init__(self, session_id: str, view_format: ViewFormat | str) -> None:
        self.session_id = session_id
        self.format = ViewFormat(view_format)
        self._definitions: list[dict[str, Any]] | None = None

    def handles(self, call: Any) -> bool:
        """Whether `call` is one of contextd's tools."""
        return _name_of(_as_mapping(call)).startswith(PREFIX)

    def _plan(self, name: str, arguments: Mapping[str, Any]) -> _Planned:
        session = self.session_id
        match name.removeprefix(PREFIX):
            case "retrieve":
                return _Planned(retrieve(session, **_target(_only(arguments, _RETRIEVE))), _say_retrieved)
            case "search":
                asked = _only(arguments, _SEARCH)
                return _Planned(search(session, **asked), lambda results: _say_found(results, asked))
            case "pin":
                return _Planned(pin(session, _seqs(arguments), True), lambda seqs: f"pinned: {_list(seqs)}")
            case "unpin":
                return _Planned(pin(session, _seqs(arguments), False), lambda seqs: f"unpinned: {_list(seqs)}")
            case "propose_prune":
                reason = str(arguments.get("reason", ""))
                return _Planned(propose_prune(session, _seqs(arguments), reason), _say_proposed)
            case "status":
                return _Planned(get_status(session), _say_status)
        raise ValueError(f"no contextd tool is called {name!r}")

    def _prepare(self, given: Any) -> tuple[str, _Planned | str]:
        """(the call's id, its plan, or why it cannot be made)."""
        call = _as_mapping(given)
        try:
            call_id, name, arguments = _read(call)
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            return str(call.get("id", "")), f"the tool call could not be read: {type(exc).__name__}: {exc}"
        try:
            return call_id, self._plan(name, arguments)
        except (TypeError, ValueError) as exc:
            return call_id, f"bad arguments for {name}: {exc}"

    def _result(self, call_id: str, text: str, is_error: bool) -> dict[str, Any]:
        match self.format:
            case ViewFormat.ANTHROPIC_MESSAGES:
                return {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}
            case ViewFormat.BEDROCK_CONVERSE:
                status = "error" if is_error else "success"
                return {"toolResult": {"toolUseId": call_id, "content": [{"text": text}], "status": status}}
            case ViewFormat.OPENAI_RESPONSES:
                output = f"error: {text}" if is_error else text
                return {"type": "function_call_output", "call_id": call_id, "output": output}
        return {"role": "tool", "tool_call_id": call_id, "content": f"error: {text}" if is_error else text}

    def _definitions_call(self) -> Call[list[dict[str, Any]]]:
        request = api.GetAgentToolsRequest(format=self.format.to_proto())
        return Call("GetAgentTools", request, lambda response: json.loads(response.tools_json))


class AgentTools(_Tools):
    """contextd's tools for a model, over the blocking client."""

    def __init__(self, client: Client, session_id: str, view_format: ViewFormat | str = ViewFormat.OPENAI_CHAT) -> None:
        super().__init__(session_id, view_format)
        self.client = client

    def definitions(self) -> list[dict[str, Any]]:
        """The tool definitions to add to the model's `tools` (asked of the service once)."""
        if self._definitions is None:
            self._definitions = self.client._run(self._definitions_call())
        return self._definitions

    def execute(self, call: Any) -> dict[str, Any]:
        """The tool result answering the model's `call` (an error result when it fails): a
        mapping as the provider's JSON has it, or the provider SDK's object for it."""
        call_id, planned = self._prepare(call)
        if isinstance(planned, str):
            return self._result(call_id, planned, True)
        try:
            return self._result(call_id, planned.say(self.client._run(planned.call)), False)
        except ContextdError as exc:
            return self._result(call_id, exc.message, True)


class AsyncAgentTools(_Tools):
    """contextd's tools for a model, over the asyncio client."""

    def __init__(
        self, client: AsyncClient, session_id: str, view_format: ViewFormat | str = ViewFormat.OPENAI_CHAT
    ) -> None:
        super().__init__(session_id, view_format)
        self.client = client

    async def definitions(self) -> list[dict[str, Any]]:
        if self._definitions is None:
            self._definitions = await self.client._run(self._definitions_call())
        return self._definitions

    async def execute(self, call: Any) -> dict[str, Any]:
        call_id, planned = self._prepare(call)
        if isinstance(planned, str):
            return self._result(call_id, planned, True)
        try:
            return self._result(call_id, planned.say(await self.client._run(planned.call)), False)
        except ContextdError as exc:
            return self._result(call_id, exc.message, True)


# ------------------------------------------------------------------ reading


def _as_mapping(call: Any) -> Mapping[str, Any]:
    """The call as a mapping: as given, or an SDK object's dump (pydantic's `model_dump`)."""
    if isinstance(call, Mapping):
        return call
    dump = getattr(call, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dumped
    return {}


def _unwrapped(call: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Converse ``{"toolUse": {...}}`` block's call; any other call as it is."""
    inner = call.get("toolUse")
    return inner if isinstance(inner, Mapping) else call


def _name_of(call: Mapping[str, Any]) -> str:
    call = _unwrapped(call)
    function = call.get("function")
    return str(function.get("name", "")) if isinstance(function, Mapping) else str(call.get("name", ""))


def _read(call: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(id, name, arguments) of a call in any provider's format."""
    call = _unwrapped(call)
    function = call.get("function")
    if isinstance(function, Mapping):  # Chat Completions: arguments are a JSON string
        raw, name, call_id = function.get("arguments") or "{}", function["name"], call["id"]
    elif call.get("type") == "function_call":  # Responses: likewise, at the top
        raw, name, call_id = call.get("arguments") or "{}", call["name"], call["call_id"]
    else:  # Anthropic and Converse: input is an object
        raw, name, call_id = call.get("input") or {}, call["name"], call.get("toolUseId", call.get("id"))
    arguments = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(arguments, Mapping):
        raise ValueError("the arguments are not a JSON object")
    if call_id is None:
        raise KeyError("id")
    return str(call_id), str(name), arguments


_RETRIEVE = ("handle", "seq", "offset", "page_unit", "line_start", "line_end", "grep", "context_lines")
_SEARCH = ("query", "mode", "only_out_of_view", "page_token")
_SEARCHED = {
    "full_text": "a full-text search (every word required)",
    "substring": "an exact substring search",
    "regex": "a regular expression search",
}


def _only(arguments: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(arguments) - set(names))
    if unknown:
        raise ValueError(f"unknown arguments {', '.join(unknown)}")
    return dict(arguments)


def _target(arguments: dict[str, Any]) -> dict[str, Any]:
    """Retrieve's arguments, naming exactly one item: by handle or by seq."""
    handle, seq = arguments.get("handle"), arguments.get("seq")
    if (handle is None) == (seq is None):
        raise ValueError("give exactly one of handle or seq")
    if handle is not None and (not isinstance(handle, str) or not handle):
        raise ValueError("handle must be a handle from your context")
    if seq is not None and (type(seq) is not int or seq < 1):
        raise ValueError("seq must be an item number")
    return arguments


def _seqs(arguments: Mapping[str, Any]) -> list[int]:
    seqs = arguments.get("seqs")
    if not isinstance(seqs, list) or not seqs or not all(type(s) is int and s > 0 for s in seqs):
        raise ValueError("seqs must be a list of item numbers")
    if len(seqs) > MAX_SEQS:
        raise ValueError(f"at most {MAX_SEQS} seqs at once")
    return seqs


# ------------------------------------------------------------------ writing


def _list(seqs: list[int]) -> str:
    return ", ".join(str(s) for s in seqs) or "nothing"


def _say_retrieved(page: Retrieved) -> str:
    header = (
        f"[seq {page.seq}, handle {page.handle}: {page.total_lines:,} lines, {page.total_tokens:,} tokens; "
        f"this page ends at offset {page.next_offset:,}]"
    )
    return f"{header}\n{page.content}"


def _say_found(results: SearchResults, asked: Mapping[str, Any]) -> str:
    if not results.hits:
        # What was searched, so "nothing" is not read as "not looked at": every item, whole.
        what = _SEARCHED[str(asked.get("mode", "full_text"))]
        among = "the items out of your context" if asked.get("only_out_of_view") else "every item of this conversation"
        found = "no further match" if asked.get("page_token") else "no match"
        return f"{found}: {what} over the whole text of {among} found nothing"
    lines = [
        f"seq {h.seq} ({h.role}{', ' + h.tool_name if h.tool_name else ''}), handle {h.handle}: {h.snippet}"
        for h in results.hits
    ]
    if results.next_page_token:
        lines.append(f"[more: search again with page_token {results.next_page_token!r}]")
    return "\n".join(lines)


def _say_proposed(outcomes: list[PruneOutcome]) -> str:
    return "\n".join(
        f"seq {o.seq}: {'accepted' if o.accepted else 'refused'}{' (' + o.reason + ')' if o.reason else ''}"
        for o in outcomes
    )


def _say_status(status: Status) -> str:
    budget = f" (budget {status.budget_tokens:,})" if status.budget_tokens else ""
    lines = [
        f"context: {status.view_tokens:,} tokens shown{budget} of {status.history_tokens:,} in the conversation "
        f"({status.version:,} items); {len(status.offloaded):,} out of it:"
    ]
    for o in status.offloaded[:STATUS_ITEMS]:
        tool = f"{o.tool_name} " if o.tool_name else ""
        lines.append(f"seq {o.seq}: {tool}{o.tokens:,} tokens, {o.reason}; handle {o.handle}")
    if len(status.offloaded) > STATUS_ITEMS:
        lines.append(f"[… {len(status.offloaded) - STATUS_ITEMS:,} more]")
    return "\n".join(lines)
