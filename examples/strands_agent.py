"""A Strands Agents agent whose conversation lives in contextd.

`ContextdSessionManager` stores each message once, `ContextdConversationManager` gives the model
contextd's view before every call, a guardrail's redaction holds, and a new agent (as in another
process) picks the conversation up from contextd.

The model is a stand-in (`ScriptedModel`, a Strands `Model` streaming what Bedrock would), so this runs
offline; with a real one, pass e.g. ``BedrockModel(model_id=...)`` instead (marked below). It needs
Strands beside the client: ``pip install "contextd-client[strands]"``.

    python3 dev.py serve                              # in another terminal
    .venv/bin/python examples/strands_agent.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import uuid
from typing import Any

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # the stand-in needs no AWS: look nothing up

from strands import Agent, tool
from strands.models import Model
from strands.types.content import Message

from contextd_client import Client, ContextdError
from contextd_client.integrations.strands import ContextdConversationManager, ContextdSessionManager

BUDGET_TOKENS = 150
"""The view's budget, in tokens. The long test run is compressed for the call that reads it (the newest
output is never taken out); from the next call on it leaves the view, and the model gets what it needs
of it back by its handle."""

TEST_RUN = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)]
OUTPUTS = {  # what the commands print (a real agent runs them): a long test run, then a few lines of code
    "pytest -q": "\n".join([*TEST_RUN, "E   ValueError: month must be in 1..12 (src/parser.py:42)", "1 failed"]),
    "sed -n 40,42p src/parser.py": "def parse(text):\n    year, month, day = text.split('-')\n"
    "    return date(int(year), int(month) + 1, int(day))\n",
}


@tool
def run(command: str) -> str:
    """Run a shell command in the repository."""
    return OUTPUTS.get(command, f"{command}: not found")


class ScriptedModel(Model):
    """A stand-in model: its next reply chosen by the tool results it was given, streamed as Bedrock's
    Converse stream events. It prints what each call got (contextd's view) and what it answered; an input
    with a password in it is blocked as a Bedrock guardrail blocks it (``redactContent``)."""

    def __init__(self, views: ContextdConversationManager) -> None:
        self.views = views
        self.calls = 0

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: list[Message], tool_specs: Any = None, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        view = self.views.last_view  # the view these messages are, rendered just before this call
        assert view is not None
        taken_out = "".join(f", seq {i.seq} {i.representation}" for i in view.items if i.representation != "full")
        warnings = "".join(f" [{w.code}]" for w in view.warnings)
        size = f"{len(messages)} messages, {view.total_tokens} tokens"
        print(f"model call {self.calls}: view of {size}{taken_out}{warnings}")
        if self.calls == 1:
            print(f"  tools: {', '.join(spec['name'] for spec in tool_specs or [])}")
        results = _results(messages)
        if results and "toolResult" in json.dumps(messages[-1]):
            print(f"  latest result: {results[-1].splitlines()[0][:150]}")
        for event in self.reply(messages, results):
            yield event

    def reply(self, messages: list[Message], results: list[str]) -> list[dict[str, Any]]:
        asked = "".join(b.get("text", "") for b in messages[-1]["content"])
        if "password" in asked:
            print("  the guardrail blocks this input")
            return [
                *_text("Sorry, I cannot use credentials."),
                {"redactContent": {"redactUserContentMessage": "[User input redacted.]"}},
                {"messageStop": {"stopReason": "guardrail_intervened"}},
            ]
        if asked and results:  # a later question about the same bug
            return [
                *_text("Not until parse() stops adding 1 to the month."),
                {"messageStop": {"stopReason": "end_turn"}},
            ]
        if not results:
            return _call(1, "run", command="pytest -q")
        if len(results) == 1:
            return _call(2, "run", command="sed -n 40,42p src/parser.py")
        placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", results[0])
        if len(results) == 2 and placeholder:  # the test run has left the view: grep its original for the error
            return _call(3, "contextd_retrieve", handle=placeholder.group(1), grep="Error")
        error = next((line for line in results[-1].splitlines() if "Error" in line), "?")
        answer = f"parse() adds 1 to the month; the test run says: {error}"
        return [*_text(answer), {"messageStop": {"stopReason": "end_turn"}}]


def _results(messages: list[Message]) -> list[str]:
    return [
        part.get("text", "")
        for m in messages
        for b in m["content"]
        if "toolResult" in b
        for part in b["toolResult"]["content"]
    ]


def _text(text: str) -> list[dict[str, Any]]:
    return [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": text}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
    ]


def _call(n: int, name: str, **arguments: Any) -> list[dict[str, Any]]:
    print(f"  -> {name}({json.dumps(arguments)})")
    return [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": f"t{n}", "name": name}}}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": json.dumps(arguments)}}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "tool_use"}},
    ]


def make_agent(ctx: Client, session_id: str) -> Agent:
    """The agent as each process makes it: the session id names the conversation in contextd."""
    sessions = ContextdSessionManager(ctx, session_id)
    views = ContextdConversationManager(sessions, budget_tokens=BUDGET_TOKENS)
    agent = Agent(
        model=ScriptedModel(views),  # a real model instead: BedrockModel(model_id="...")
        tools=[run, *sessions.tools()],  # the agent's tools and contextd's
        system_prompt="You fix bugs.",
        session_manager=sessions,
        conversation_manager=views,
        callback_handler=None,
    )
    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        session = f"example-{uuid.uuid4().hex[:8]}"
        print(f"session {session}; budget {BUDGET_TOKENS} tokens")
        agent = make_agent(ctx, session)
        print(f"  answer: {agent('The test_parse test fails.')}".rstrip())
        placeholder = " (the test run as a placeholder)" if "retrieve with handle" in json.dumps(agent.messages) else ""
        whole = ctx.retrieve(session, seq=3).total_lines  # the test run, as contextd keeps it
        print(
            f"session: {ctx.get_session(session).version} items (each message once, the test run whole: "
            f"{whole} lines); agent.messages: the last view{placeholder}"
        )

        print(f"  answer: {agent('My password is hunter2, use it to deploy.')}".rstrip())
        [redacted] = [c for c in ctx.list_certificates(session) if c.reason == "redacted"]
        try:
            ctx.retrieve(session, seq=redacted.seq)
        except ContextdError as error:
            print(f"redacted: seq {redacted.seq} ({redacted.rule}, {redacted.control}); retrieve -> {error.reason}")

        # Another process: a new agent with the same session id continues from contextd.
        version = ctx.get_session(session).version
        later = make_agent(ctx, session)
        print(
            f"resumed: {len(later.messages)} messages from contextd, the password in none of them: "
            f"{'hunter2' not in json.dumps(later.messages)}"
        )
        print(f"  answer: {later('Is it fixed?')}".rstrip())
        print(f"next turn: the session went from {version} to {ctx.get_session(session).version} items")


if __name__ == "__main__":
    main()
