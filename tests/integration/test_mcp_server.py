"""`contextd mcp`: the agent tools over the Model Context Protocol, spoken to with the MCP
SDK's own client, over stdio (the command as an MCP host spawns it) and streamable HTTP
(the session in a request header), in front of a real contextd. `contextd mcp` reaches it only
over gRPC, so the shared server on SQLite is enough (SQLITE_ONLY)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx2
import mcp_types as types
import pytest
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from contextd.agent_tools import PREFIX, TOOLS
from contextd.mcp_server import NO_SESSION, SESSION_HEADER, Connection, build_server, session_of
from contextd_client import AgentTools, Client, ViewFormat
from tests.conftest import SQLITE_ONLY, ServerThread, ServingCommand
from tests.service.api.test_recovery import MASK_OLD, pruned_handles

NAMES = [PREFIX + name for name, _, _ in TOOLS]
LOG_LINES = 1500


def big_log() -> str:
    lines = [f"{n:05d} test_case_{n} ... {'FAILED zanzibar' if n == 1234 else 'ok'}" for n in range(LOG_LINES)]
    return "\n".join(lines) + "\n"


def pruned_session(client: Client) -> tuple[str, dict[int, str]]:
    """A session whose render leaves its two tool outputs out (a big log at seq 4, a short one
    at seq 6), and seq -> handle of each."""
    session = client.create_session(f"mcp-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id

    def call(n: int) -> dict[str, object]:
        return {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}

    client.append_openai(
        session,
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find the failing test."},
            {"role": "assistant", "content": None, "tool_calls": [call(0)]},
            {"role": "tool", "tool_call_id": "c0", "content": big_log()},
            {"role": "assistant", "content": None, "tool_calls": [call(1)]},
            {"role": "tool", "tool_call_id": "c1", "content": "short output\n" * 20},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": "Done."},
        ],
    )
    handles = pruned_handles(client, session)
    assert sorted(handles) == [4, 6]
    return session, handles


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def mcp_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "contextd", "mcp", *args]


@SQLITE_ONLY
async def test_over_stdio_every_tool_answers_as_the_executor_does(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        executor = AgentTools(client, session, ViewFormat.ANTHROPIC_MESSAGES)
        direct = {
            name: executor.execute({"type": "tool_use", "id": "t", "name": PREFIX + name, "input": arguments})
            for name, arguments in [("retrieve", {"handle": handles[4]}), ("status", {})]
        }
    command, *args = mcp_command("--target", server.target, "--session", session, "--log-level", "warning")
    params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
    # The initialize handshake, as hosts that spawn a server speak it today (HTTP below takes the newer protocol).
    async with McpClient(params, read_timeout_seconds=30, mode="legacy") as mcp:
        listed = (await mcp.list_tools()).tools
        assert [t.name for t in listed] == NAMES
        assert [(t.description, t.input_schema) for t in listed] == [(text, schema) for _, text, schema in TOOLS]

        async def call(name: str, arguments: dict[str, object]) -> types.CallToolResult:
            return await mcp.call_tool(PREFIX + name, arguments)

        by_handle = await call("retrieve", {"handle": handles[4]})
        assert not by_handle.is_error and text_of(by_handle) == direct["retrieve"]["content"]
        header, _, page = text_of(by_handle).partition("\n")
        assert header.startswith(f"[seq 4, handle {handles[4]}: {LOG_LINES:,} lines, ")
        assert big_log().startswith(page) and len(page) < len(big_log())  # one bounded page of it

        by_seq = await call("retrieve", {"seq": 4, "page_unit": "lines", "grep": "FAILED"})
        assert text_of(by_seq).endswith("]\n1235:01234 test_case_1234 ... FAILED zanzibar\n")  # line 1235
        found = text_of(await call("search", {"query": "zanzibar"}))
        assert found.startswith(f"seq 4 (tool, bash), handle {handles[4]}: ") and "zanzibar" in found

        status = await call("status", {})
        assert text_of(status) == direct["status"]["content"]
        assert "seq 4: bash " in text_of(status) and handles[6] in text_of(status)
        assert text_of(await call("pin", {"seqs": [6]})) == "pinned: 6"
        assert text_of(await call("unpin", {"seqs": [6]})) == "unpinned: 6"
        proposed = text_of(await call("propose_prune", {"seqs": [1], "reason": "the prompt is done with"}))
        assert proposed.startswith("seq 1: refused")  # the system prompt is protected

        unknown = await call("retrieve", {"handle": "0123456789abcdef"})
        assert unknown.is_error and "names nothing" in text_of(unknown)
        bad = await call("retrieve", {"seq": "4"})
        assert bad.is_error and text_of(bad) == "bad arguments for contextd_retrieve: seq must be an item number"


def http_mcp_command(*args: str) -> ServingCommand:
    """`contextd mcp --transport streamable-http` on a free loopback port."""
    command = mcp_command("--transport", "streamable-http", "--listen", "127.0.0.1:0", *args)
    return ServingCommand(command, "contextd mcp")


@pytest.fixture
def http_mcp(server: ServerThread) -> Iterator[ServingCommand]:
    running = http_mcp_command("--target", server.target)
    try:
        yield running.wait_serving()
    finally:
        assert running.stop() == 0, "\n".join(running.log)


@asynccontextmanager
async def over_http(url: str, session: str | None, mode: str = "auto") -> AsyncIterator[McpClient]:
    """An MCP client of the server at `url`, naming `session` in each request's header (None: no header)."""
    headers = {SESSION_HEADER: session} if session else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        McpClient(streamable_http_client(url, http_client=http), read_timeout_seconds=30, mode=mode) as mcp,
    ):
        yield mcp


@SQLITE_ONLY
async def test_over_http_the_session_comes_with_each_request(server: ServerThread, http_mcp: ServingCommand) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
    async with over_http(http_mcp.url, session) as mcp:
        assert mcp.protocol_version in MODERN_PROTOCOL_VERSIONS  # each request stands alone
        listed = (await mcp.list_tools()).tools
        assert [(t.name, t.input_schema) for t in listed] == [(PREFIX + n, schema) for n, _, schema in TOOLS]
        status = await mcp.call_tool(PREFIX + "status", {})
        assert not status.is_error and f"handle {handles[4]}" in text_of(status)
        page = text_of(await mcp.call_tool(PREFIX + "retrieve", {"seq": 6}))
        assert page.startswith(f"[seq 6, handle {handles[6]}: 20 lines, ") and page.endswith(
            "]\n" + "short output\n" * 20
        )
    async with over_http(http_mcp.url, session, mode="legacy") as legacy:  # the handshake most hosts speak today
        assert legacy.protocol_version not in MODERN_PROTOCOL_VERSIONS
        assert text_of(await legacy.call_tool(PREFIX + "status", {})) == text_of(status)
    async with over_http(http_mcp.url, None) as anonymous:  # no header, and the server has no --session
        refused = await anonymous.call_tool(PREFIX + "status", {})
        assert refused.is_error and text_of(refused) == NO_SESSION


def request_with(headers: dict[str, str]) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": raw})


def test_the_header_names_the_session_before_the_flag() -> None:
    assert session_of(request_with({SESSION_HEADER: "from-header"}), "from-flag") == "from-header"
    assert session_of(request_with({SESSION_HEADER: " "}), "from-flag") == "from-flag"
    assert session_of(request_with({}), None) is None
    assert session_of(None, "from-flag") == "from-flag"  # stdio: no request
    assert session_of(None, "") is None


async def test_contextd_unreachable_or_a_tool_never_listed_is_said_not_crashed() -> None:
    # Nothing listens on port 1: each call is refused within the timeout, as a result the model reads.
    client = Connection("127.0.0.1:1", timeout=0.5).client()
    async with client, McpClient(build_server(client, "any")) as mcp:
        down = await mcp.call_tool(PREFIX + "status", {})
        assert down.is_error and "Connection refused" in text_of(down)  # as the executor says it
        with pytest.raises(MCPError) as never:
            await mcp.call_tool("contextd_everything", {})
        assert never.value.code == types.INVALID_PARAMS and "unknown tool" in never.value.message
        assert (await mcp.call_tool(PREFIX + "status", {})).is_error  # and the server still answers
