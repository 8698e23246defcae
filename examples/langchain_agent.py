"""A LangChain v1 agent (`create_agent`, a LangGraph graph) whose model sees contextd's view of the
thread through `ContextdMiddleware`, while the graph's state keeps every message whole.

The model is a stand-in (`ScriptedModel`), so this runs offline; with a real one, give
`create_agent` e.g. ``init_chat_model("openai:gpt-4o")`` instead (marked below). It needs LangChain
beside the client: ``pip install "contextd-client[langchain]"``.

    python3 dev.py serve                               # in another terminal
    .venv/bin/python examples/langchain_agent.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

from contextd_client import Client
from contextd_client.integrations.langchain import ContextdMiddleware

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


class ScriptedModel(BaseChatModel):
    """A stand-in chat model: its next reply chosen by the tool results it was given. It prints what
    each call got: the messages of contextd's view, not the graph's state."""

    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[t if isinstance(t, dict) else convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls += 1
        offered = [t["function"]["name"] for t in kwargs.get("tools", [])]
        results = [m for m in messages if isinstance(m, ToolMessage)]
        print(f"model call {self.calls}: {len(messages)} messages, a {type(messages[0]).__name__} first")
        if self.calls == 1:
            print(f"  tools: {', '.join(offered)}")
        for result in results:
            print(f"  {result.tool_call_id}: {result.text.splitlines()[0][:160]}")
        reply = self.reply(messages, results, offered)
        for call in reply.tool_calls:
            print(f"  -> {call['name']}({json.dumps(call['args'])})")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def reply(self, messages: list[BaseMessage], results: list[ToolMessage], offered: list[str]) -> AIMessage:
        def call(name: str, **args: Any) -> AIMessage:
            assert name in offered, f"{name} is not among the tools"
            return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{len(results) + 1}"}])

        if isinstance(messages[-1], HumanMessage) and results:  # a later question about the same bug
            return AIMessage("Not until parse() stops adding 1 to the month.")
        if not results:
            return call("run", command="pytest -q")
        if len(results) == 1:
            return call("run", command="sed -n 40,42p src/parser.py")
        placeholder = re.search(r"retrieve with handle ([0-9a-f]+)", results[0].text)
        if len(results) == 2 and placeholder:  # the test run has left the view: grep its original for the error
            return call("contextd_retrieve", handle=placeholder.group(1), grep="Error")
        error = next((line for line in results[-1].text.splitlines() if "Error" in line), "?")
        return AIMessage(f"parse() adds 1 to the month; the test run says: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        contextd = ContextdMiddleware(ctx, budget_tokens=BUDGET_TOKENS)  # the one line that adopts contextd
        agent = create_agent(
            ScriptedModel(),  # a real model instead: init_chat_model("openai:gpt-4o")
            [run],
            system_prompt="You fix bugs.",
            middleware=[contextd],
            checkpointer=InMemorySaver(),  # keeps the thread; contextd's session mirrors it
        )
        thread = f"example-{uuid.uuid4().hex[:8]}"  # the thread id is the session id
        config: Any = {"configurable": {"thread_id": thread}}
        print(f"thread {thread}; budget {BUDGET_TOKENS} tokens")

        state = agent.invoke({"messages": [HumanMessage("The test_parse test fails.")]}, config)
        print(f"  answer: {state['messages'][-1].text}")

        test_run = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "call_1")
        version = ctx.get_session(thread).version
        print(
            f"state: {len(state['messages'])} messages, the test run whole ({len(test_run.text.splitlines())} lines); "
            f"session: {version} items (the system prompt and each message, once)"
        )
        for decided in ctx.list_certificates(thread, seq=4):  # what the view engine did with the test run, and why
            print(f"  certificate {decided.number}: seq 4 {decided.decision} ({decided.rule}: {decided.reason})")

        state = agent.invoke({"messages": [HumanMessage("Is it fixed?")]}, config)
        print(f"  answer: {state['messages'][-1].text}")
        print(f"next turn: the session went from {version} to {ctx.get_session(thread).version} items")


if __name__ == "__main__":
    main()
