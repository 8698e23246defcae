"""contextd's agent tools over the Model Context Protocol (`contextd mcp`): the same six
tools (`agent_tools.TOOLS`, names, descriptions and input schemas as they are) for an MCP
host, over stdio or streamable HTTP.

The server holds no storage: each call is answered by the thin client's executor
(`contextd_client.AsyncAgentTools`) over gRPC to a running contextd, so its results are the
text that executor gives a model, bounded as it bounds them. A call that fails (bad
arguments, an unknown handle, contextd unreachable, no session) is a tool result with
`isError` set, which the model reads; only a tool name that was never listed is a protocol
error, as the MCP specification has it.

The session a call acts on: over stdio, `--session`; over HTTP, the request's
`x-contextd-session` header, or `--session` when the request has none, so one HTTP server
serves many agents, each naming its own session.

Imported only by the `mcp` command: `contextd serve` never loads the MCP SDK.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from contextd import __version__
from contextd.agent_tools import PREFIX, TOOLS
from contextd.remote import Connection, serve_asgi, url_of
from contextd_client import AsyncAgentTools, AsyncClient, ViewFormat

log = logging.getLogger(__name__)

SESSION_HEADER = "x-contextd-session"
"""The HTTP request header naming the contextd session a call acts on (before `--session`)."""
PATH = "/mcp"
"""Where the streamable HTTP transport answers."""
INSTRUCTIONS = (
    "contextd keeps this conversation's whole history. What left your context comes back with "
    "contextd_retrieve (by the handle a placeholder names, or by seq) and contextd_search; "
    "contextd_status says what is out of your context; pin, unpin and propose_prune steer it."
)
NO_SESSION = (
    "no contextd session for this call: start `contextd mcp` with --session ID, or (over HTTP) "
    f"send the session id in the {SESSION_HEADER} header"
)


def tool_list() -> list[types.Tool]:
    """The agent tools as MCP tools: `agent_tools.TOOLS`, with its schemas unchanged."""
    return [types.Tool(name=PREFIX + name, description=text, input_schema=schema) for name, text, schema in TOOLS]


def session_of(request: object, default: str | None) -> str | None:
    """The session a call acts on: the HTTP request's header first, then `default` (`--session`)."""
    if isinstance(request, Request):
        named = request.headers.get(SESSION_HEADER, "").strip()
        if named:
            return named
    return default or None


def build_server(client: AsyncClient, session: str | None) -> Server[Any]:
    """The low-level MCP server answering tools/list and tools/call through `client`;
    `session` is the one given by `--session` (None: each call must name its own)."""
    tools = tool_list()
    listed = frozenset(tool.name for tool in tools)

    # Also run before each tools/call with arguments over the 2026-07-28 HTTP transport: there
    # the SDK (2.1.1) finds the tool's schema to check the call's parameter headers against.
    # A fixed list, so cheap.
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in listed:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        acting_on = session_of(ctx.request, session)
        if acting_on is None:
            return _result(NO_SESSION, is_error=True)
        # The executor's own reading of a call: an Anthropic tool_use block, whose result
        # carries the text and the error flag apart (the OpenAI form folds the flag into the text).
        call = {"type": "tool_use", "id": str(ctx.request_id or ""), "name": params.name, "input": params.arguments}
        executor = AsyncAgentTools(client, acting_on, ViewFormat.ANTHROPIC_MESSAGES)
        try:
            answer = await executor.execute(call)
        except Exception:
            # The executor answers every failure of contextd's; anything else is ours, and the
            # model still gets a result it can read rather than a broken connection.
            log.exception("%s failed", params.name)
            return _result(f"{params.name} failed inside contextd's MCP server; see its log", is_error=True)
        return _result(str(answer["content"]), is_error=bool(answer["is_error"]))

    return Server(
        "contextd",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _result(text: str, *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error)


async def serve_stdio(connection: Connection, session: str | None) -> None:
    """Answer one MCP host over this process's stdin and stdout until it closes stdin."""
    async with connection.client() as client:
        server = build_server(client, session)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(connection: Connection, session: str | None, listening: socket.socket) -> None:
    """Answer MCP hosts over streamable HTTP on `listening` (at `PATH`) until SIGINT or SIGTERM."""
    host = listening.getsockname()[0]
    async with connection.client() as client:
        server = build_server(client, session)
        # Stateless: every request stands alone (the session comes with it), so the
        # server keeps nothing between requests and any number of agents share it.
        # On a loopback address the SDK also refuses other Host and Origin headers.
        app = server.streamable_http_app(streamable_http_path=PATH, stateless_http=True, host=host)
        log.info("contextd mcp serving on %s%s (contextd at %s)", url_of(listening), PATH, connection.target)
        await serve_asgi(app, listening)
