"""An agent loop in the OpenAI Chat Completions format, with contextd holding the conversation.

The model is a stand-in (`fake_model`), so this runs offline; with a real one, replace its one
call (marked below) with ``client.chat.completions.create(...)``. Everything else is what an
agent keeps: the view is the messages, each turn is appended, and contextd's tools sit beside
the agent's own.

    python3 dev.py serve                           # in another terminal
    .venv/bin/python examples/openai_loop.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from contextd_client import AgentTools, Client

BUDGET_TOKENS = 150
"""The view's budget, in tokens. The long test run is compressed for the call that reads it (the newest
output is never taken out); from the next call on it leaves the view, and the model gets it back."""

TOOLS = [  # the agent's own tool, answered here by `run_tool`
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the repository.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
TEST_RUN = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)]
OUTPUTS = {  # what the commands print (a real agent runs them): a long test run, then a few lines of code
    "pytest -q": "\n".join([*TEST_RUN, "E   ValueError: month must be in 1..12 (src/parser.py:42)", "1 failed"]),
    "sed -n 40,42p src/parser.py": "def parse(text):\n    year, month, day = text.split('-')\n"
    "    return date(int(year), int(month) + 1, int(day))\n",
}


def run_tool(call: dict[str, Any]) -> dict[str, Any]:
    command = json.loads(call["function"]["arguments"])["command"]
    return {"role": "tool", "tool_call_id": call["id"], "content": OUTPUTS.get(command, f"{command}: not found")}


def fake_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A scripted model: the next assistant message (as the provider returns it), chosen by the
    latest call it made (the view always shows the latest turn; older ones may have left it)."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    offered = {t["function"]["name"] for t in tools}

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        assert name in offered, f"{name} is not among the tools"
        function = {"name": name, "arguments": json.dumps(arguments)}
        number = int(made[-1]["id"].removeprefix("call_")) + 1 if made else 1
        return {"role": "assistant", "tool_calls": [{"id": f"call_{number}", "type": "function", "function": function}]}

    latest = (made[-1]["function"]["name"], json.loads(made[-1]["function"]["arguments"])) if made else None
    if latest is None:
        return call("run", command="pytest -q")
    if latest == ("run", {"command": "pytest -q"}):
        return call("run", command="sed -n 40,42p src/parser.py")
    placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", "\n".join(results))
    if latest[0] == "run" and placeholder:  # the test run has left the view: grep its original for the error
        return call("contextd_retrieve", handle=placeholder.group(1), grep="Error")
    error = next((line for line in results[-1].splitlines() if "Error" in line), "?")
    return {"role": "assistant", "content": f"parse() adds 1 to the month; the test run says: {error}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        session = ctx.create_session(metadata={"example": "openai_loop"}).id
        tools = AgentTools(ctx, session, "openai_chat")
        all_tools = [*TOOLS, *tools.definitions()]  # the agent's tools and contextd's
        print(f"session {session}; tools: {', '.join(t['function']['name'] for t in all_tools)}")
        ctx.append_openai(
            session,
            [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "The test_parse test fails."}],
        )
        for turn in range(1, 11):
            view = ctx.render_view(session, "openai_chat", budget_tokens=BUDGET_TOKENS)
            taken_out = "".join(f", seq {i.seq} {i.representation}" for i in view.items if i.representation != "full")
            warnings = "".join(f" [{w.code}]" for w in view.warnings)
            print(
                f"turn {turn}: view of {len(view.messages)} messages, {view.total_tokens:,} tokens{taken_out}{warnings}"
            )

            # The one line to replace with a real model (view.messages are the messages to send):
            #   message = client.chat.completions.create(model=..., messages=view.messages, tools=all_tools)
            #       .choices[0].message.model_dump(exclude_none=True)
            message = fake_model(view.messages, all_tools)

            calls = message.get("tool_calls", [])
            results = [tools.execute(call) if tools.handles(call) else run_tool(call) for call in calls]
            ctx.append_openai(session, [message, *results])  # the turn, as the agent would list.append it
            for call, result in zip(calls, results, strict=True):
                last_line = result["content"].rstrip("\n").splitlines()[-1]
                print(f"  {call['function']['name']}({call['function']['arguments']}) -> ... {last_line[:80]}")
            if not calls:
                print(f"  answer: {message['content']}")
                break
        status = ctx.get_status(session)
        print(
            f"done: {status.version} items, {status.history_tokens:,} tokens of history, {status.view_tokens} in view"
        )


if __name__ == "__main__":
    main()
