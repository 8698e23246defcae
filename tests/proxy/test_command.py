"""`contextd proxy` as an operator runs it: a process in front of a contextd and a provider,
one SDK call through it, a clean stop."""

from __future__ import annotations

import subprocess
import sys
import uuid

import httpx2
import openai

from contextd.proxy.app import SESSION_HEADER, VIEW_VERSION_HEADER
from contextd_client import Client
from contextd_lab.stub_upstream import Upstream
from tests.conftest import ServerThread, ServingCommand
from tests.proxy.test_proxy import CHAT_TOOLS, TASK, settled


def test_the_command_serves_an_sdk_and_stops_cleanly(contextd: ServerThread, upstream: tuple[Upstream, str]) -> None:
    stub, url = upstream
    command = [sys.executable, "-m", "contextd", "proxy", "--listen", "127.0.0.1:0", "--target", contextd.target]
    proxy = ServingCommand([*command, "--openai-upstream", url, "--anthropic-upstream", url], "contextd proxy")
    try:
        proxy.wait_serving()
        assert httpx2.get(f"{proxy.url}/healthz").text == "ok\n"
        session = f"command-{uuid.uuid4().hex[:8]}"
        sdk = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", default_headers={SESSION_HEADER: session})
        messages = [{"role": "user", "content": TASK}]
        raw = sdk.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS)
        assert int(raw.headers[VIEW_VERSION_HEADER]) > 0 and raw.parse().choices[0].message.tool_calls
        assert stub.received[-1].body["messages"] == messages
        with Client(contextd.target) as client:
            settled(lambda: client.get_session(session).version == 2)  # the task and the answer
    finally:
        assert proxy.stop() == 0, "\n".join(proxy.log)


def test_the_command_says_what_it_cannot_read() -> None:
    command = [sys.executable, "-m", "contextd", "proxy", "--api-key-file", "/nonexistent"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot read /nonexistent" in done.stderr
