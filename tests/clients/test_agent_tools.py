"""The agent tools: definitions the service publishes in both provider formats, and the
client's executor answering a model's tool calls (JSON in, a tool result out)."""

from __future__ import annotations

import json
import re
import uuid

import jsonschema
import pytest

from contextd_client import AgentTools, AsyncAgentTools, AsyncClient, Client, ViewFormat
from tests.conftest import ServerThread
from tests.service.api.test_recovery import MASK_OLD
from tests.service.api.test_search import tail_session
from tests.service.api.test_view_engine import conversation


def pruned_session(client: Client) -> tuple[str, dict[int, str]]:
    session = client.create_session(f"tools-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
    conversation(client, session, rounds=3)
    view = client.render_view(session, ViewFormat.OPENAI_CHAT)
    return session, {c.seq: c.handle for c in view.certificates if c.decision == "prune"}


def openai_call(name: str, arguments: dict[str, object], call_id: str = "call_1") -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def anthropic_call(name: str, arguments: dict[str, object], call_id: str = "toolu_1") -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def test_the_definitions_are_valid_tools_in_each_format(server: ServerThread) -> None:
    with Client(server.target) as client:
        session = client.create_session().id
        openai = AgentTools(client, session, "openai_chat").definitions()
        anthropic = AgentTools(client, session, "anthropic_messages").definitions()
    names = [
        "contextd_retrieve",
        "contextd_search",
        "contextd_pin",
        "contextd_unpin",
        "contextd_propose_prune",
        "contextd_status",
    ]
    assert [t["function"]["name"] for t in openai] == names and all(t["type"] == "function" for t in openai)
    assert [t["name"] for t in anthropic] == names
    for tool in anthropic:
        assert tool["input_schema"]["type"] == "object" and tool["description"]
    # As the providers take them: names of 1-64 letters, digits, _ or -; parameters a JSON Schema object.
    for name, schema in [(t["function"]["name"], t["function"]["parameters"]) for t in openai] + [
        (t["name"], t["input_schema"]) for t in anthropic
    ]:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object"


def test_a_model_call_in_openai_format_gets_an_openai_tool_message(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        tools = AgentTools(client, session, "openai_chat")
        call = openai_call("contextd_retrieve", {"handle": handles[4]})
        assert tools.handles(call) and not tools.handles(openai_call("bash", {}))
        result = tools.execute(call)
        assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
        assert result["content"].endswith("output number 0\n" * 20) and f"handle {handles[4]}" in result["content"]
        found = tools.execute(openai_call("contextd_search", {"query": "number 1", "mode": "substring"}))
        assert f"seq 6 (tool, bash), handle {handles[6]}" in found["content"]
        status = tools.execute(openai_call("contextd_status", {}))["content"]
        assert "seq 4: bash" in status and handles[4] in status
        assert tools.execute(openai_call("contextd_pin", {"seqs": [4]}))["content"] == "pinned: 4"
        proposed = tools.execute(openai_call("contextd_propose_prune", {"seqs": [1], "reason": "done"}))
        assert proposed["content"].startswith("seq 1: refused")  # the system prompt is protected
        assert tools.execute(openai_call("contextd_unpin", {"seqs": [4]}))["content"] == "unpinned: 4"


def test_a_model_call_in_anthropic_format_gets_a_tool_result_block(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        tools = AgentTools(client, session, "anthropic_messages")
        call = anthropic_call("contextd_retrieve", {"handle": handles[6], "page_unit": "lines", "line_end": 2})
        result = tools.execute(call)
        assert (result["type"], result["tool_use_id"], result["is_error"]) == ("tool_result", "toolu_1", False)
        assert result["content"].startswith(f"[seq 6, handle {handles[6]}: 2 lines, ")  # the selection's
        assert result["content"].endswith("]\noutput number 1\noutput number 1\n")


def test_responses_and_converse_calls_get_results_in_their_own_format(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        responses = AgentTools(client, session, "openai_responses")
        [definition] = [t for t in responses.definitions() if t["name"] == "contextd_status"]
        assert definition["type"] == "function" and definition["parameters"]["type"] == "object"
        call = {"type": "function_call", "call_id": "call_9", "name": "contextd_retrieve", "arguments": "{}"}
        refused = responses.execute(call)
        assert (refused["type"], refused["call_id"]) == ("function_call_output", "call_9")
        assert refused["output"].startswith("error: ") and "handle or seq" in refused["output"]
        arguments = json.dumps({"seq": 4})
        page = responses.execute({**call, "arguments": arguments})["output"]
        assert page.startswith(f"[seq 4, handle {handles[4]}")
        converse = AgentTools(client, session, "bedrock_converse")
        [spec] = [t["toolSpec"] for t in converse.definitions() if t["toolSpec"]["name"] == "contextd_pin"]
        assert spec["inputSchema"]["json"]["required"] == ["seqs"]
        use = {"toolUse": {"toolUseId": "tooluse_1", "name": "contextd_pin", "input": {"seqs": [4]}}}
        assert converse.handles(use)
        assert converse.execute(use) == {
            "toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "pinned: 4"}], "status": "success"}
        }
        bad = converse.execute({"toolUse": {**use["toolUse"], "input": {"seqs": "all"}}})["toolResult"]
        assert bad["status"] == "error" and "seqs must be a list" in bad["content"][0]["text"]


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (openai_call("contextd_retrieve", {"handle": "0123456789abcdef"}), "names nothing"),
        (openai_call("contextd_retrieve", {"handle": "x", "bogus": 1}), "unknown arguments bogus"),
        (openai_call("contextd_retrieve", {}), "exactly one of handle or seq"),
        (openai_call("contextd_retrieve", {"handle": "0123456789abcdef", "seq": 1}), "exactly one of handle or seq"),
        (openai_call("contextd_retrieve", {"seq": "4"}), "seq must be an item number"),
        (openai_call("contextd_retrieve", {"seq": True}), "seq must be an item number"),
        (openai_call("contextd_retrieve", {"seq": 99}), "names nothing"),
        (openai_call("contextd_pin", {"seqs": "all"}), "seqs must be a list"),
        (
            {"id": "c9", "type": "function", "function": {"name": "contextd_search", "arguments": "{not json"}},
            "could not be read",
        ),
        (openai_call("contextd_nothing", {}), "no contextd tool"),
    ],
)
def test_a_failed_call_is_an_error_result_never_an_exception(
    server: ServerThread, call: dict[str, object], said: str
) -> None:
    with Client(server.target) as client:
        tools = AgentTools(client, client.create_session().id, "anthropic_messages")
        result = tools.execute(call)
    assert result["is_error"] is True and said in result["content"]


async def test_the_asyncio_executor_answers_the_same(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
    async with AsyncClient(server.target) as client:
        tools = AsyncAgentTools(client, session, "openai_chat")
        assert len(await tools.definitions()) == 6
        result = await tools.execute(openai_call("contextd_retrieve", {"handle": handles[4]}))
        assert result["content"].endswith("output number 0\n" * 20)


class SdkCall:
    """Like a provider SDK's tool call object: a pydantic model with `model_dump`."""

    def __init__(self, data: dict[str, object]) -> None:
        self._data = data

    def model_dump(self) -> dict[str, object]:
        return self._data


def test_sdk_objects_and_hostile_arguments_are_answered(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        tools = AgentTools(client, session, "openai_chat")
        call = SdkCall(openai_call("contextd_retrieve", {"handle": handles[4]}))
        assert tools.handles(call) and tools.execute(call)["content"].endswith("output number 0\n" * 20)
        deep = {"id": "c", "type": "function", "function": {"name": "contextd_search", "arguments": "[" * 100_000}}
        assert tools.execute(deep)["content"].startswith("error: the tool call could not be read")
        assert not tools.handles(object())
        too_many = tools.execute(openai_call("contextd_pin", {"seqs": list(range(1, 200))}))
        assert "at most 100 seqs" in too_many["content"]
        assert "seqs must be" in tools.execute(openai_call("contextd_pin", {"seqs": [True]}))["content"]


def test_retrieve_takes_a_seq_as_the_status_lists_them(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
        tools = AgentTools(client, session, "anthropic_messages")
        schema = next(t for t in tools.definitions() if t["name"] == "contextd_retrieve")["input_schema"]
        assert schema["properties"]["seq"]["type"] == "integer" and schema["properties"]["seq"]["minimum"] == 1
        # Exactly one of handle and seq, in words: Anthropic refuses a oneOf at the top of a schema.
        assert "required" not in schema and not {"oneOf", "anyOf", "allOf"} & set(schema)
        assert "seq 4: bash" in tools.execute(anthropic_call("contextd_status", {}))["content"]
        by_seq = tools.execute(anthropic_call("contextd_retrieve", {"seq": 4}))
        assert by_seq["is_error"] is False and by_seq["content"].startswith(f"[seq 4, handle {handles[4]}: 20 lines")
        by_handle = tools.execute(anthropic_call("contextd_retrieve", {"handle": handles[4]}))
        assert by_seq["content"] == by_handle["content"]


async def test_the_asyncio_executor_retrieves_by_seq_too(server: ServerThread) -> None:
    with Client(server.target) as client:
        session, handles = pruned_session(client)
    async with AsyncClient(server.target) as client:
        tools = AsyncAgentTools(client, session, "openai_chat")
        result = await tools.execute(openai_call("contextd_retrieve", {"seq": 6, "page_unit": "lines", "line_end": 1}))
        assert result["content"].startswith(f"[seq 6, handle {handles[6]}: 1 lines, ")
        assert result["content"].endswith("this page ends at offset 1]\noutput number 1\n")
        both = await tools.execute(openai_call("contextd_retrieve", {"seq": 6, "handle": handles[6]}))
        assert both["content"] == "error: bad arguments for contextd_retrieve: give exactly one of handle or seq"


def test_search_finds_the_tail_of_a_long_output_and_says_what_it_searched(server: ServerThread) -> None:
    with Client(server.target, timeout=30) as client:
        session = tail_session(client)
        tools = AgentTools(client, session, "openai_chat")
        found = tools.execute(openai_call("contextd_search", {"query": "zanzibar"}))["content"]
        assert found.startswith("seq 3 (tool, pytest), handle ") and "«zanzibar»" in found
        said = {
            (mode, out): tools.execute(
                openai_call("contextd_search", {"query": "wombat", "mode": mode, "only_out_of_view": out})
            )["content"]
            for mode in ("full_text", "substring", "regex")
            for out in (False, True)
        }
        assert said[("full_text", False)] == (
            "no match: a full-text search (every word required) over the whole text of every item of this "
            "conversation found nothing"
        )
        assert said[("substring", True)] == (
            "no match: an exact substring search over the whole text of the items out of your context found nothing"
        )
        assert "a regular expression search" in said[("regex", False)]
        assert len(set(said.values())) == 6
