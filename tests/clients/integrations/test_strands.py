"""The Strands Agents integration (contextd_client/integrations/strands.py) with the real framework:
`strands.Agent` with a scripted model (a `strands.models.Model` streaming the events Strands expects),
its tools, and a real contextd (on SQLite: conftest.py). Nothing reaches AWS or the network."""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import botocore.session
import grpc
import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models import Model
from strands.types.content import Message
from strands.types.exceptions import ContextWindowOverflowException, SessionException

from contextd_client import Client, ContextdError, NotFound, Unavailable
from contextd_client.integrations.strands import ContextdConversationManager, ContextdSessionManager
from tests.conftest import ServerThread

Blocks = list[dict[str, Any]]
Script = Callable[[list[Message]], Blocks]

TEST_RUN = "\n".join(
    [
        *(f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(600)),
        "E   ValueError: month must be in 1..12",
    ]
)
SECRET = "AKIA-THE-LEAKED-KEY"


@tool
def run(command: str) -> str:
    """Run a shell command in the repository."""
    if command == "pytest -q":
        return TEST_RUN
    if command == "env":
        return f"HOME=/root\nAWS_KEY={SECRET}\n"
    return "def parse(text):\n    return date(int(year), int(month) + 1, int(day))\n"


class ScriptedModel(Model):
    """A stand-in for a model: `script` gives the next assistant content for the messages it is sent
    (a ``redactContent`` entry is sent as Bedrock's guardrail sends it). Every call's messages are kept."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[list[Message]] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: list[Message], *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.seen.append(copy.deepcopy(messages))
        blocks = self.script(messages)
        yield {"messageStart": {"role": "assistant"}}
        for i, block in enumerate(b for b in blocks if "redactContent" not in b):
            if "toolUse" in block:
                use = block["toolUse"]
                start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                yield {"contentBlockStart": {"contentBlockIndex": i, "start": start}}
                yield {
                    "contentBlockDelta": {
                        "contentBlockIndex": i,
                        "delta": {"toolUse": {"input": json.dumps(use["input"])}},
                    }
                }
            else:
                yield {"contentBlockDelta": {"contentBlockIndex": i, "delta": {"text": block["text"]}}}
            yield {"contentBlockStop": {"contentBlockIndex": i}}
        for block in blocks:
            if "redactContent" in block:
                yield block
        stop = "tool_use" if any("toolUse" in b for b in blocks) else "end_turn"
        yield {"messageStop": {"stopReason": stop}}
        yield {
            "metadata": {"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}, "metrics": {"latencyMs": 1}}
        }


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS: no credentials lookup, no client made (one would fail the test); no telemetry export."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)

    def no_aws(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"an AWS client was made: {args}")

    monkeypatch.setattr(botocore.session.Session, "create_client", no_aws)


def new_session_id() -> str:
    return f"strands-{uuid.uuid4().hex[:12]}"


def make_agent(
    client: Client, session_id: str, script: Script, budget_tokens: int = 0, **options: Any
) -> tuple[Agent, ScriptedModel, ContextdSessionManager, ContextdConversationManager]:
    """An agent as a process would make it: its own session manager and conversation manager."""
    sessions = ContextdSessionManager(client, session_id)
    manager = ContextdConversationManager(sessions, budget_tokens=budget_tokens)
    model = ScriptedModel(script)
    agent = Agent(
        model=model,
        tools=[run, *sessions.tools()],
        session_manager=sessions,
        conversation_manager=manager,
        callback_handler=None,
        **options,
    )
    return agent, model, sessions, manager


def results(messages: list[Message]) -> list[str]:
    """The texts of the tool results in `messages`, in order."""
    return [
        part.get("text", "")
        for m in messages
        for b in m["content"]
        if "toolResult" in b
        for part in b["toolResult"]["content"]
    ]


def call(tool_use_id: str, name: str, **arguments: Any) -> Blocks:
    return [{"toolUse": {"toolUseId": tool_use_id, "name": name, "input": arguments}}]


def fixer(messages: list[Message]) -> Blocks:
    """Run the tests, read the code, get the test run back by its handle once it has left the view."""
    seen = results(messages)
    if not seen:
        return call("t1", "run", command="pytest -q")
    if len(seen) == 1:
        return call("t2", "run", command="sed -n 40,42p src/parser.py")
    placeholder = re.search(r"retrieve with handle ([0-9a-f]{16})", seen[0])
    if len(seen) == 2 and placeholder:
        return call("t3", "contextd_retrieve", handle=placeholder.group(1), grep="Error")
    error = next((line for line in seen[-1].splitlines() if "Error" in line), "?")
    return [{"text": f"parse() adds 1 to the month: {error}"}]


def converse_messages(client: Client, session_id: str) -> list[dict[str, Any]]:
    """The whole conversation contextd holds, as Converse messages (no budget)."""
    return client.render_view(session_id, "bedrock_converse").messages


# ------------------------------------------------------------------ the loop


def test_the_model_sees_contextds_view_and_another_process_continues(client: Client) -> None:
    session_id = new_session_id()
    agent, model, _, manager = make_agent(client, session_id, fixer, budget_tokens=150)
    answer = str(agent("The test_parse test fails.")).strip()
    assert answer == "parse() adds 1 to the month: 601:E   ValueError: month must be in 1..12"

    # The third call got contextd's view: the test run had left it, a placeholder naming its handle.
    assert len(model.seen) == 4
    [first_result, _] = results(model.seen[2])
    handle = re.search(r"retrieve with handle ([0-9a-f]{16})", first_result)
    assert handle and TEST_RUN not in json.dumps(model.seen[2])
    assert manager.last_view is not None
    assert {(i.seq, i.representation, i.handle) for i in manager.last_view.items} >= {(3, "placeholder", handle[1])}
    # ... and so do agent.messages: the last view and the answer, never the test run.
    assert TEST_RUN not in json.dumps(agent.messages) and handle[1] in json.dumps(agent.messages)

    # contextd holds every turn once, the test run whole.
    assert client.get_session(session_id).version == 8
    history = converse_messages(client, session_id)
    assert [m["role"] for m in history] == ["user", "assistant"] * 4
    uses = [b["toolUse"]["toolUseId"] for m in history for b in m["content"] if "toolUse" in b]
    answered = [b["toolResult"]["toolUseId"] for m in history for b in m["content"] if "toolResult" in b]
    assert uses == answered == ["t1", "t2", "t3"]
    assert history[-1]["content"] == [{"text": answer}]
    hits = client.search(session_id, "test_case_599", mode="substring").hits
    assert [h.seq for h in hits] == [3] and client.retrieve(session_id, seq=3).total_lines == 601

    # Another process: a new agent with the same session id starts from what contextd holds.
    later, model2, _, _ = make_agent(client, session_id, lambda m: [{"text": "Fixed it."}], budget_tokens=150)
    assert later.messages[0]["content"] == [{"text": "The test_parse test fails."}]
    assert later.messages[-1]["content"] == [{"text": answer}]
    assert str(later("Now fix it.")).strip() == "Fixed it."
    [sent] = model2.seen
    assert sent[0]["content"] == [{"text": "The test_parse test fails."}]
    assert [b.get("text") for b in sent[-2]["content"]] == [answer] and sent[-1]["content"] == [{"text": "Now fix it."}]
    assert client.get_session(session_id).version == 10


def test_a_second_writer_is_refused_and_a_retried_append_is_written_once(server: ServerThread) -> None:
    session_id = new_session_id()
    with Client(server.target, timeout=15) as client:
        first, _, _, _ = make_agent(client, session_id, lambda m: [{"text": "Deploying."}])
        second, _, _, _ = make_agent(client, session_id, lambda m: [{"text": "Deploying too."}])
        # A request delivered twice: both processes run the same prompt (the caller's tracking id).
        prompt = {"role": "user", "content": [{"text": "Deploy staging."}], "tracking_id": str(uuid.uuid4())}
        first([copy.deepcopy(prompt)])
        # The prompt is the one stored; its answer comes second: refused (Strands wraps what fails in its loop).
        with pytest.raises(Exception, match=r"refused the append \(VERSION_CONFLICT\): another writer") as caught:
            second([copy.deepcopy(prompt)])
        assert isinstance(caught.value.__cause__ or caught.value, SessionException)
        assert client.get_session(session_id).version == 2
        assert converse_messages(client, session_id) == [
            {"role": "user", "content": [{"text": "Deploy staging."}]},
            {"role": "assistant", "content": [{"text": "Deploying."}]},
        ]

    # The answer to an append is lost and the client gives up: the message is re-sent, with its key, next time.
    class LosesAnswers(Client):
        lose = 0

        def append_items(self, *args: Any, **kwargs: Any) -> Any:
            done = super().append_items(*args, **kwargs)
            if self.lose:
                self.lose -= 1
                raise Unavailable("UNAVAILABLE", "the answer was lost")
            return done

    with LosesAnswers(server.target, timeout=15) as flaky:
        agent, model, _, _ = make_agent(flaky, session_id, lambda m: [{"text": "Staging is up."}])
        flaky.lose = 1
        with pytest.raises(SessionException, match="the answer was lost"):
            agent("Is staging up?")
        assert flaky.get_session(session_id).version == 3  # written, though the agent never heard so
        assert str(agent("Well?")).strip() == "Staging is up."
        assert flaky.get_session(session_id).version == 5
        texts = [b["text"] for m in converse_messages(flaky, session_id) for b in m["content"]]
        assert texts == ["Deploy staging.", "Deploying.", "Is staging up?", "Well?", "Staging is up."]
        assert model.seen[0][-1]["content"] == [{"text": "Is staging up?"}, {"text": "Well?"}]


def test_only_what_strands_adds_is_appended(client: Client) -> None:
    session_id = new_session_id()
    agent, _, sessions, _ = make_agent(client, session_id, lambda m: [{"text": "Reading it."}])
    agent("Read the config.")
    view = sessions.show_view(agent)
    assert client.get_session(session_id).version == 2
    for message in list(agent.messages):  # the view's messages, added again: contextd holds them
        sessions.append_message(message, agent)
    assert client.get_session(session_id).version == 2
    # Strands merges input that continues the turn into the last message (a copy keeping its
    # tracking id): only the new block is appended.
    last = agent.messages[-1]
    merged: Message = {**last, "content": [*last["content"], {"text": "And the logs."}]}
    agent.messages[-1] = merged
    sessions.append_message(merged, agent)
    assert client.get_session(session_id).version == 3
    assert converse_messages(client, session_id)[-1] == {
        "role": "assistant",
        "content": [{"text": "Reading it."}, {"text": "And the logs."}],
    }
    assert view.version == 2


# ---------------------------------------------------------------- redaction


def guarded(messages: list[Message]) -> Blocks:
    """A model behind a guardrail that blocks any input showing the secret."""
    if SECRET in json.dumps(messages[-1]):
        return [
            {"text": "Sorry, I cannot help with that."},
            {"redactContent": {"redactUserContentMessage": "[redacted]"}},
        ]
    if not results(messages):
        return call("t1", "run", command="env")
    return [{"text": "Done."}]


def test_a_redacted_message_never_comes_back(client: Client) -> None:
    session_id = new_session_id()
    agent, model, _, _ = make_agent(client, session_id, guarded)
    agent(f"My key is {SECRET}, deploy with it.")
    assert client.get_session(session_id).version == 3  # the prompt, its replacement, the answer
    assert converse_messages(client, session_id) == [
        {"role": "user", "content": [{"text": "[redacted]"}]},
        {"role": "assistant", "content": [{"text": "Sorry, I cannot help with that."}]},
    ]
    with pytest.raises(ContextdError) as caught:
        client.retrieve(session_id, seq=1)
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.NOT_FOUND.name, "ITEM_REDACTED")
    assert not client.search(session_id, SECRET, mode="substring").hits
    [certificate] = [c for c in client.list_certificates(session_id) if c.rule == "retraction"]
    assert (certificate.seq, certificate.reason, certificate.control) == (1, "redacted", "client")

    # A tool output that shows it: redacted too, the call answered by contextd's marker.
    agent("Check the environment.")
    assert SECRET in json.dumps(model.seen[-1])  # the call the guardrail blocked
    history = converse_messages(client, session_id)
    assert SECRET not in json.dumps(history)
    assert results(history) == ["[contextd: output of tool call t1 (run) redacted by the client]"]
    assert [c.seq for c in client.list_certificates(session_id) if c.rule == "retraction"] == [1, 6]
    with pytest.raises(ContextdError, match="ITEM_REDACTED"):
        client.retrieve(session_id, seq=6)

    agent("Deploy, then.")
    assert SECRET not in json.dumps(model.seen[-1])
    resumed, _, _, _ = make_agent(client, session_id, guarded)
    assert SECRET not in json.dumps(resumed.messages)


# ----------------------------------------------------------------- overflow


def test_an_overflow_halves_the_budget_until_the_view_cannot_shrink(client: Client) -> None:
    def limited(characters: int) -> Script:
        """A model with a small window: the test run (compressed by contextd's rules while it is the
        newest output) fits in it, the test run beside the next output does not."""

        def script(messages: list[Message]) -> Blocks:
            if len(json.dumps(messages)) > characters:
                raise ContextWindowOverflowException("input is too long for the model")
            seen = results(messages)
            if len(seen) < 2:
                return call(f"t{len(seen) + 1}", "run", command=["pytest -q", "cat src/parser.py"][len(seen)])
            return [{"text": "Read them."}]

        return script

    agent, model, _, manager = make_agent(client, new_session_id(), limited(1_000))
    assert str(agent("Run the tests, then read the parser.")).strip() == "Read them."
    sizes = [len(json.dumps(m)) for m in model.seen]
    assert len(sizes) == 4 and sizes[2] > 1_000 >= sizes[3]  # overflowed, then a view half as big
    assert manager.last_view is not None and "retrieve with handle" in json.dumps(model.seen[3])
    view = manager.last_view
    assert view.budget_tokens == manager.budget_tokens > 0  # rendered under the budget it lowered to,
    assert view.total_tokens <= view.budget_tokens or view.over_budget  # within it, or saying it is not

    # What overflows is the newest output itself, which contextd keeps for the call that reads it.
    agent, model, _, _ = make_agent(client, new_session_id(), limited(100))
    with pytest.raises(ContextWindowOverflowException, match="cannot get smaller"):
        agent("Run the tests.")


# ------------------------------------------------------------ what it keeps


def test_each_agent_has_its_session_and_what_contextd_cannot_store_is_refused_by_name(client: Client) -> None:
    def reviewer(messages: list[Message]) -> Blocks:
        return call("s1", "contextd_status") if not results(messages) else [{"text": "Seen."}]

    session_id = new_session_id()
    agent, model, sessions, _ = make_agent(client, session_id, reviewer, agent_id="reviewer")
    assert sessions.contextd_session_id("reviewer") == f"{session_id}:reviewer"
    image = {"image": {"format": "png", "source": {"location": {"type": "s3", "uri": "s3://bucket/screen.png"}}}}
    agent([{"role": "user", "content": [{"text": "Look at this."}, image]}])
    assert client.get_session(f"{session_id}:reviewer").metadata["strands_agent_id"] == "reviewer"
    [status] = results(model.seen[-1])  # contextd's tool answered for the reviewer's session: its 2 items
    assert status.startswith("context: ") and "in the conversation (2 items)" in status
    with pytest.raises(NotFound):
        client.get_session(session_id)  # the default agent's session: no such agent here
    video = {"video": {"format": "mp4", "source": {"bytes": b"\x00\x01"}}}
    with pytest.raises(SessionException, match=r"messages\[0\]\.content\[0\]: unsupported block 'video'"):
        agent([{"role": "user", "content": [video]}])
    orphan = {"toolResult": {"toolUseId": "no-such-call", "content": [{"text": "ok"}], "status": "success"}}
    with pytest.raises(SessionException, match="refused the append: INVALID_ARGUMENT"):
        agent([{"role": "user", "content": [orphan]}])
    agent("Then look again.")  # what was refused is not re-sent: it blocks nothing
    assert converse_messages(client, f"{session_id}:reviewer")[-2:] == [
        {"role": "user", "content": [{"text": "Then look again."}]},
        {"role": "assistant", "content": [{"text": "Seen."}]},
    ]
    # Strands' form of an S3 source comes back as it went in.
    resumed, _, _, _ = make_agent(client, session_id, reviewer, agent_id="reviewer")
    assert resumed.messages[0]["content"] == [{"text": "Look at this."}, image]


def test_the_session_manager_serves_under_strands_own_conversation_manager(client: Client) -> None:
    session_id = new_session_id()
    sessions = ContextdSessionManager(client, session_id)
    model = ScriptedModel(lambda m: [{"text": f"Answer {len(m)}."}])
    window = SlidingWindowConversationManager(window_size=2)
    agent = Agent(model=model, session_manager=sessions, conversation_manager=window, callback_handler=None)
    for question in ("One?", "Two?", "Three?"):
        agent(question)
    assert len(agent.messages) == 2  # Strands' window trimmed its list ...
    assert client.get_session(session_id).version == 6  # ... contextd kept every message, once
    resumed = Agent(model=model, session_manager=ContextdSessionManager(client, session_id), callback_handler=None)
    assert [m["content"][0]["text"] for m in resumed.messages] == [
        "One?",
        "Answer 1.",
        "Two?",
        "Answer 3.",  # the model saw the window: the last question and answer, and this one
        "Three?",
        "Answer 3.",
    ]


def test_agents_start_new_sessions_with_their_messages(client: Client) -> None:
    session_id = new_session_id()
    opening: list[Message] = [
        {"role": "user", "content": [{"text": "You review pull requests."}]},
        {"role": "assistant", "content": [{"text": "Ready."}]},
    ]
    make_agent(client, session_id, lambda m: [{"text": "ok"}], messages=copy.deepcopy(opening))
    assert converse_messages(client, session_id) == opening
    again, _, _, _ = make_agent(client, session_id, lambda m: [{"text": "ok"}], messages=copy.deepcopy(opening))
    assert client.get_session(session_id).version == 2  # the session holds them: loaded, not written again
    assert [m["content"] for m in again.messages] == [m["content"] for m in opening]
