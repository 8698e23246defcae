"""An agent loop in the Anthropic Messages format, with contextd holding the conversation.

The model is a stand-in (`fake_model`), so this runs offline; with a real one, replace its one
call (marked below) with ``client.messages.create(...)``. Everything else is what an agent
keeps: the view is the request's ``system`` and ``messages`` (with the prompt-cache breakpoint
contextd placed), each turn is appended, and contextd's tools sit beside the agent's own.

    python3 dev.py serve                           # in another terminal
    .venv/bin/python examples/anthropic_loop.py [--target HOST:PORT] [--api-key KEY]
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
        "name": "run",
        "description": "Run a shell command in the repository.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]
TEST_RUN = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)]
OUTPUTS = {  # what the commands print (a real agent runs them): a long test run, then a few lines of code
    "pytest -q": "\n".join([*TEST_RUN, "E   ValueError: month must be in 1..12 (src/parser.py:42)", "1 failed"]),
    "sed -n 40,42p src/parser.py": "def parse(text):\n    year, month, day = text.split('-')\n"
    "    return date(int(year), int(month) + 1, int(day))\n",
}


def run_tool(block: dict[str, Any]) -> dict[str, Any]:
    command = block["input"]["command"]
    return {"type": "tool_result", "tool_use_id": block["id"], "content": OUTPUTS.get(command, f"{command}: not found")}


def text_of(content: str | list[dict[str, Any]]) -> str:
    """The text of a block's content: a string, or a list of text blocks."""
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def fake_model(system: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A scripted model: the next assistant message (the response's ``role`` and ``content``), chosen by
    the latest call it made (the view always shows the latest turn; older ones may have left it)."""
    results = [
        text_of(block["content"])
        for message in messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    made = [
        block
        for message in messages
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    offered = {t["name"] for t in tools}

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        assert name in offered, f"{name} is not among the tools"
        number = int(made[-1]["id"].removeprefix("toolu_")) + 1 if made else 1
        block = {"type": "tool_use", "id": f"toolu_{number}", "name": name, "input": arguments}
        return {"role": "assistant", "content": [block]}

    latest = (made[-1]["name"], made[-1]["input"]) if made else None
    if latest is None:
        return call("run", command="pytest -q")
    if latest == ("run", {"command": "pytest -q"}):
        return call("run", command="sed -n 40,42p src/parser.py")
    placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", "\n".join(results))
    if latest[0] == "run" and placeholder:  # the test run has left the view: grep its original for the error
        return call("contextd_retrieve", handle=placeholder.group(1), grep="Error")
    error = next((line for line in results[-1].splitlines() if "Error" in line), "?")
    answer = f"parse() adds 1 to the month; the test run says: {error}"
    return {"role": "assistant", "content": [{"type": "text", "text": answer}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        session = ctx.create_session(metadata={"example": "anthropic_loop"}).id
        tools = AgentTools(ctx, session, "anthropic_messages")
        all_tools = [*TOOLS, *tools.definitions()]  # the agent's tools and contextd's
        print(f"session {session}; tools: {', '.join(t['name'] for t in all_tools)}")
        ctx.append_anthropic(
            session, [{"role": "user", "content": "The test_parse test fails."}], system="You fix bugs."
        )
        for turn in range(1, 11):
            view = ctx.render_view(
                session, "anthropic_messages", budget_tokens=BUDGET_TOKENS, place_cache_breakpoint=True
            )
            taken_out = "".join(f", seq {i.seq} {i.representation}" for i in view.items if i.representation != "full")
            warnings = "".join(f" [{w.code}]" for w in view.warnings)
            print(
                f"turn {turn}: view of {len(view.messages)} messages, {view.total_tokens:,} tokens{taken_out}{warnings}"
            )

            # The one line to replace with a real model (the view gives `system` and `messages`):
            #   response = client.messages.create(model=..., max_tokens=..., tools=all_tools, **view.anthropic_kwargs())
            #   message = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]}
            message = fake_model(view.system, view.messages, all_tools)

            calls = [block for block in message["content"] if block["type"] == "tool_use"]
            results = [tools.execute(call) if tools.handles(call) else run_tool(call) for call in calls]
            turn_messages = [message, {"role": "user", "content": results}] if results else [message]
            ctx.append_anthropic(session, turn_messages)  # the turn, as the agent would list.append it
            for call, result in zip(calls, results, strict=True):
                last_line = text_of(result["content"]).rstrip("\n").splitlines()[-1]
                print(f"  {call['name']}({json.dumps(call['input'])}) -> ... {last_line[:80]}")
            if not calls:
                print(f"  answer: {text_of(message['content'])}")
                break
        status = ctx.get_status(session)
        print(
            f"done: {status.version} items, {status.history_tokens:,} tokens of history, {status.view_tokens} in view"
        )


if __name__ == "__main__":
    main()
