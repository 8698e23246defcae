"""The model-backed summary plugin against a local stub of an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contextd.engine.certificates import Decision
from contextd.engine.errors import InvalidArgument
from contextd.engine.model import Item, ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.pipeline import RenderInput, RenderOutput, render
from contextd.engine.placeholders import handle_of
from contextd.engine.policy import default_policy, parse_policy
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd.plugins.model_summary import ModelSummary
from tests.helpers import counter, make_session, stored_items

OUTPUT = "\n".join(f"collected line {n}: nothing unusual here, just a long and quiet tool output" for n in range(80))


class Stub:
    """An OpenAI-compatible chat completions endpoint that answers with a fixed summary."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail = False
        self.answer: dict[str, Any] | None = None
        """What to answer instead of a summary (a malformed answer)."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, **body})
                stub.headers.append(dict(self.headers))
                if stub.fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                answer = stub.answer or {
                    "choices": [{"message": {"role": "assistant", "content": "80 lines collected; none failed."}}],
                    "usage": {"prompt_tokens": 1234, "completion_tokens": 9},
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def session() -> list[Item]:
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock("Collect the lines."),)),
        ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "collect", "{}"),)),
        ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock(OUTPUT),), name="collect"),)),
        ItemContent(role=Role.ASSISTANT, content=(TextBlock("Done."),)),
    ]
    return stored_items(contents)


def policy(url: str, max_level: int = 4, extra: str = "") -> str:
    return f"""
evidence: {{max_level: {max_level}}}
protection: {{last_turns: 0}}
rules:
  - name: summaries
    transform: model_summary
    params: {{endpoint: "{url}", model: stub-mini, api_key_env: CONTEXTD_TEST_SUMMARY_KEY{extra}}}
    when: {{roles: [tool]}}
"""


def run(registry: TransformRegistry, document: str, state: ViewState | None = None) -> RenderOutput:
    items = session()
    inp = RenderInput(
        make_session(len(items)),
        items,
        parse_policy(document, registry),
        ViewRequest(ViewFormat.OPENAI_CHAT),
        counter(),
        registry,
        state or ViewState(),
        now=1_000.0,
    )
    return render(inp)


def registry_with(plugin: ModelSummary) -> TransformRegistry:
    registry = TransformRegistry.default()
    registry.register(plugin)
    return registry


def test_a_summary_is_asked_for_in_the_background_then_proposed_with_its_cost(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTD_TEST_SUMMARY_KEY", "sk-test")
    plugin = ModelSummary()
    registry = registry_with(plugin)
    first = run(registry, policy(stub.url))
    assert first.certificates == ()  # the render did not wait for the model
    plugin.wait()
    [request] = stub.requests
    assert request["path"] == "/v1/chat/completions" and request["model"] == "stub-mini"
    assert request["messages"][1]["content"] == OUTPUT
    assert stub.headers[0]["Authorization"] == "Bearer sk-test"

    second = run(registry, policy(stub.url), first.state)
    [cert] = second.certificates
    assert (cert.seq, cert.decision, cert.level, cert.reason) == (4, Decision.PRUNE, 4, "model_summary")
    assert "it cost 1,234 input and 9 output tokens" in cert.evidence
    view = second.view.messages_json
    assert "80 lines collected; none failed." in view and "collected line 40" not in view
    assert handle_of(session()[3]) in view  # the whole output, one Retrieve away
    assert plugin.costs == {("stub-mini", "input"): 1234, ("stub-mini", "output"): 9}
    run(registry, policy(stub.url), second.state)
    assert len(stub.requests) == 1  # asked once, remembered


def test_a_summary_is_level_4_and_refused_below_it(stub: Stub) -> None:
    plugin = ModelSummary()
    registry = registry_with(plugin)
    run(registry, policy(stub.url, max_level=3))
    plugin.wait()
    [cert] = run(registry, policy(stub.url, max_level=3)).certificates
    assert cert.decision is Decision.ABSTAIN and "above the policy's maximum of 3" in cert.rationale


def test_a_failing_endpoint_never_breaks_a_render_and_is_not_hammered(stub: Stub) -> None:
    stub.fail = True
    plugin = ModelSummary()
    registry = registry_with(plugin)
    out = run(registry, policy(stub.url))
    plugin.wait()
    again = run(registry, policy(stub.url), out.state)
    plugin.wait()
    assert again.certificates == () and plugin.failures == 1 and len(stub.requests) == 1
    malformed = ModelSummary()
    stub.fail, stub.answer = False, {"choices": []}
    run(registry_with(malformed), policy(stub.url))
    malformed.wait()
    assert malformed.failures == 1 and not malformed._pending  # counted, and asked again after the pause
    unreachable = ModelSummary()
    run(registry_with(unreachable), policy("http://127.0.0.1:9/v1", extra=", timeout_seconds: 2"))
    unreachable.wait()
    assert unreachable.failures == 1


def test_it_is_off_by_default_and_its_params_are_checked() -> None:
    registry = TransformRegistry.default()
    assert "model_summary" in registry.names()  # installed, through the entry point
    assert all(r.transform != "model_summary" for r in default_policy().rules)
    with pytest.raises(InvalidArgument) as raised:
        parse_policy("rules: [{name: s, transform: model_summary, params: {endpoint: 'ftp://x', words: 0}}]", registry)
    fields = {v.field: v.description for v in raised.value.violations}
    assert fields == {
        "policy.rules[0].params.model": "required",
        "policy.rules[0].params.endpoint": "must be an http:// or https:// URL",
        "policy.rules[0].params.words": "must be a number of at least 10",
    }
