"""An OpenAI Agents SDK agent whose session is contextd: the SDK's own Runner, Agent and tools.

`ContextdSession` is the SDK session (each turn is stored in contextd, once), and its
`call_model_input_filter` sends the model contextd's view within a budget instead of the
whole history. The model is a stand-in (`fake_model`, run by the SDK's `ScriptedModel`), so
this runs offline; with a real one, give the agent ``model="gpt-5"`` (marked below).

    pip install openai-agents                      # the SDK; the client itself does not need it
    python3 dev.py serve                           # in another terminal
    .venv/bin/python examples/openai_agents_session.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import uuid
from typing import Any

from agents import Agent, RunConfig, RunContextWrapper, RunHooks, Runner, Tool, function_tool, set_tracing_disabled
from agents.run_config import CallModelData, ModelInputData
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from contextd_client import AsyncClient
from contextd_client.integrations.openai_agents import ContextdSession

BUDGET_TOKENS = 150
"""The view's budget, in tokens: the long test run never fits; the model sees it compressed, with
the handle that gets the whole back."""
TEST_RUN = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)]
OUTPUTS = {  # what the commands print (a real agent runs them): a long test run, then a few lines of code
    "pytest -q": "\n".join([*TEST_RUN, "E   ValueError: month must be in 1..12 (src/parser.py:42)", "1 failed"]),
    "sed -n 40,42p src/parser.py": "def parse(text):\n    year, month, day = text.split('-')\n"
    "    return date(int(year), int(month) + 1, int(day))\n",
}


@function_tool
def run(command: str) -> str:
    """Run a shell command in the repository."""
    return OUTPUTS.get(command, f"{command}: not found")


def fake_model(call: ModelCall) -> list[Any]:
    """A scripted model: its next output items, chosen by what its input (contextd's view) holds."""
    sent = call.input if isinstance(call.input, list) else []
    outputs = [item.get("output", "") for item in sent if item.get("type") == "function_call_output"]
    asked = next(item["content"] for item in reversed(sent) if item.get("role") == "user")
    n = len(outputs) + 1

    def use(name: str, **arguments: Any) -> list[Any]:
        assert name in {tool.name for tool in call.tools}, f"{name} is not among the tools"
        return [function_call(name, arguments, call_id=f"call_{n}", item_id=f"fc_{n}")]

    if asked.startswith("The test_parse"):
        if not outputs:
            return use("run", command="pytest -q")
        if len(outputs) == 1:
            return use("run", command="sed -n 40,42p src/parser.py")
        return [assistant_message("parse() adds 1 to the month.", item_id=f"msg_{n}")]
    handle = re.search(r"with handle ([0-9a-f]{16})", outputs[0])
    if len(outputs) == 2 and handle:  # the test run has left the view: grep its original
        return use("contextd_retrieve", handle=handle.group(1), grep="Error")
    error = next((line for line in outputs[-1].splitlines() if "Error" in line), "?")
    return [assistant_message(f"The test run says: {error}", item_id=f"msg_{n}")]


class Trace(RunHooks[Any]):
    """Prints each tool call as it is answered, with the last line of its output."""

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object) -> None:
        arguments = context.tool_arguments if isinstance(context, ToolContext) else ""
        print(f"  {tool.name}({arguments}) -> ... {str(result).rstrip().splitlines()[-1][:70]}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI

    async with AsyncClient(args.target, api_key=args.api_key) as ctx:
        session = ContextdSession(ctx, f"agents-example-{uuid.uuid4().hex[:8]}", budget_tokens=BUDGET_TOKENS)

        async def show_view(data: CallModelData[Any]) -> ModelInputData:
            sent = await session.call_model_input_filter(data)  # the one line a real agent needs here
            view = session.last_view
            assert view is not None
            out = "".join(f", seq {i.seq} {i.representation}" for i in view.items if i.representation != "full")
            print(f"  model call: view of {len(view.messages)} items, {view.total_tokens:,} tokens{out}")
            return sent

        # The one line to replace for a real model: model="gpt-5" (and OPENAI_API_KEY set).
        model = ScriptedModel([ModelStep.respond(fake_model) for _ in range(10)])
        agent = Agent(
            name="fixer", instructions="You fix bugs.", model=model, tools=[run, *await session.agent_tools()]
        )
        print(f"session {session.session_id}; tools: {', '.join(tool.name for tool in agent.tools)}")
        config = RunConfig(call_model_input_filter=show_view)

        for question in ("The test_parse test fails.", "Which line of the test run says why?"):
            print(f"run: {question}")
            result = await Runner.run(agent, question, session=session, run_config=config, hooks=Trace())
            print(f"  answer: {result.final_output}")

        items = await session.get_items()
        stored = (await ctx.get_session(session.session_id)).version
        print(f"session: {len(items)} SDK items, stored as {stored} contextd items, each once")
        popped = await session.pop_item()
        print(f"pop_item: {json.dumps(popped)[:70]}...; {len(await session.get_items())} SDK items left")


if __name__ == "__main__":
    asyncio.run(main())
