"""A pydantic-ai agent with contextd holding its history (`ContextdHistory`, a capability).

The model is pydantic-ai's `FunctionModel` running a script (`fake_model`), so this runs offline;
with a real one, give the agent a model name instead (marked below). Everything else is what an
agent keeps: the capability appends each turn to the session and sends the model contextd's view,
the agent's own tool and contextd's tools sit side by side, and a second agent (another process,
say) continues the session from contextd alone.

    python3 dev.py serve                           # in another terminal
    .venv/bin/python examples/pydantic_ai_agent.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import re
import uuid

from pydantic_ai import (
    Agent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from contextd_client import Client
from contextd_client.integrations.pydantic_ai import ContextdHistory, load_history

BUDGET_TOKENS = 150
"""The view's budget, in tokens. The long test run is compressed for the call that reads it (the newest
turn is never taken out); from the next call on it leaves the view, as a
placeholder naming its handle, and the model gets it back with contextd_retrieve."""

TEST_RUN = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)]
OUTPUTS = {  # what the commands print (a real agent runs them): a long test run, then a few lines of code
    "pytest -q": "\n".join([*TEST_RUN, "E   ValueError: month must be in 1..12 (src/parser.py:42)", "1 failed"]),
    "sed -n 40,42p src/parser.py": "def parse(text):\n    year, month, day = text.split('-')\n"
    "    return date(int(year), int(month) + 1, int(day))\n",
}


def run(command: str) -> str:
    """Run a shell command in the repository."""
    return OUTPUTS.get(command, f"{command}: not found")


def tool_results(messages: list[ModelMessage]) -> dict[str, str]:
    """The tool results the model was sent, by call id."""
    parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
    return {p.tool_call_id: str(p.content) for p in parts if isinstance(p, ToolReturnPart)}


def shown(output: str) -> str:
    """How the view showed the test run."""
    handle = re.search(r"handle ([0-9a-f]+)", output)
    if output == OUTPUTS["pytest -q"]:
        return "whole"
    return f"{'compressed' if 'compressed' in output else 'a placeholder'}, handle {handle.group(1) if handle else '?'}"


class FakeModel:
    """A scripted model: the next response, chosen by the tool results it has seen; it says what it got."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            print(f"tools: {', '.join(t.name for t in info.function_tools)}")
        results = tool_results(messages)
        seen = f", the test run {shown(results['call_1'])}" if "call_1" in results else ""
        print(f"model call {self.calls}: {len(messages)} messages{seen}")
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        asked = next((p.content for p in last.parts if isinstance(p, UserPromptPart)), None)
        answered = {p.tool_call_id for p in last.parts if isinstance(p, ToolReturnPart)}
        if asked == "And the fix?":
            return self.say("Drop the + 1: date(int(year), int(month), int(day)).")
        if asked:
            return self.call("run", "call_1", command="pytest -q")
        if answered == {"call_1"}:
            return self.call("run", "call_2", command="sed -n 40,42p src/parser.py")
        placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", results["call_1"])
        if answered == {"call_2"} and placeholder:  # the test run has left the view: grep its original
            return self.call("contextd_retrieve", "call_3", handle=placeholder.group(1), grep="Error")
        error = next((line for line in results.get("call_3", "").splitlines() if "Error" in line), "?")
        return self.say(f"parse() adds 1 to the month; the test run says: {error}")

    def call(self, name: str, call_id: str, **arguments: object) -> ModelResponse:
        print(f"  calls {name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
        return ModelResponse(parts=[ToolCallPart(name, arguments, call_id)])

    def say(self, text: str) -> ModelResponse:
        print(f"  answer: {text}")
        return ModelResponse(parts=[TextPart(text)])


def make_agent(ctx: Client, model: FakeModel) -> Agent[None, str]:
    history = ContextdHistory(ctx, budget_tokens=BUDGET_TOKENS)  # the session: the run's conversation_id
    # With a real model, the one line to change: Agent("anthropic:claude-sonnet-4-5", capabilities=[history], ...)
    agent = Agent(FunctionModel(model), capabilities=[history], system_prompt="You fix bugs.")
    agent.tool_plain(run)
    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        session = f"pydantic-ai-example-{uuid.uuid4().hex[:8]}"
        print(f"session {session}")
        model = FakeModel()
        result = make_agent(ctx, model).run_sync("The test_parse test fails.", conversation_id=session)
        kept = tool_results(result.all_messages())["call_1"]
        print(
            f"run 1: {ctx.get_session(session).version} items in the session; "
            f"the agent's own history kept the test run {shown(kept)} ({len(kept.splitlines())} lines)"
        )

        # Another process, which kept nothing, continues from contextd: the session's view is its history.
        loaded = load_history(ctx, session)
        print(
            f"run 2 starts from contextd: {len(loaded)} messages, the test run {shown(tool_results(loaded)['call_1'])}"
        )
        second = make_agent(ctx, model).run_sync("And the fix?", message_history=loaded)
        status = ctx.get_status(session)
        print(
            f"done: {status.version} items ({second.conversation_id}), {status.history_tokens:,} tokens of history, "
            f"{status.view_tokens} in view"
        )


if __name__ == "__main__":
    main()
