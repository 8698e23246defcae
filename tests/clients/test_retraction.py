"""RetractItems through the service, on both backends: what a retracted or redacted item
looks like afterwards in views, certificates, Retrieve, Search, ExplainItem and the stash."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from contextd_client import Client, ContextdError
from contextd_client._calls import Call
from contextd_client.v1 import contextd_pb2 as api

SECRET = "AKIA-THE-LEAKED-KEY"

# Tool outputs a rule drops to placeholders, so the original goes to the stash first.
DROP = """
evidence: {max_level: 4}
protection: {last_turns: 1, user_items: false}
rules:
  - {name: mask-outputs, transform: mask, when: {roles: [tool]}}
"""

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Check the deploy config."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "env"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": f"HOME=/root\nAWS_KEY={SECRET}\n" + "PATH=/usr/bin\n" * 40},
    {"role": "assistant", "content": "The config sets an AWS key."},
    {"role": "user", "content": "Forget that, I pasted the wrong thing: look at staging."},
    {"role": "assistant", "content": "Looking at staging."},
]


def _fails(call: Any, code: grpc.StatusCode, reason: str) -> ContextdError:
    with pytest.raises(ContextdError) as caught:
        call()
    assert (caught.value.code, caught.value.reason) == (code.name, reason), caught.value
    return caught.value


def test_a_redacted_tool_output_is_never_read_again(client: Client) -> None:
    session = client.create_session(policy=DROP).id
    client.append_openai(session, CONVERSATION)
    before = client.render_view(session, "openai_chat")
    [handle] = [i.handle for i in before.items if i.seq == 4]
    assert SECRET in client.retrieve(session, handle).content  # pruned by the rule, stashed, recoverable

    done = client.retract(session, [4], reason="a credential leaked into the output", redact=True)
    assert done.seqs == [4]
    [cert] = done.certificates
    assert (cert.seq, cert.decision, cert.rule, cert.reason, cert.control, cert.handle, cert.view_format) == (
        4,
        "prune",
        "retraction",
        "redacted",
        "client",
        "",
        "",
    )
    assert cert.rationale == "a credential leaked into the output"

    view = client.render_view(session, "openai_chat")
    messages = view.messages
    assert SECRET not in str(messages)
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "[contextd: output of tool call c1 (bash) redacted by the client]",
    }
    assert handle not in str(messages)
    for ask in (lambda: client.retrieve(session, handle), lambda: client.retrieve(session, seq=4)):
        error = _fails(ask, grpc.StatusCode.NOT_FOUND, "ITEM_REDACTED")
        assert SECRET not in str(error)
    assert not client.search(session, SECRET, mode="substring").hits
    assert 4 not in [hit.seq for hit in client.search(session, "AWS_KEY").hits]
    explained = client._run(Call("ExplainItem", api.ExplainItemRequest(session_id=session, seq=4), lambda r: r))
    assert not explained.item.content and explained.item.content_hash  # identity, never content
    assert [c.rule for c in client.explain_item(session, 4).certificates][-1] == "retraction"
    [listed] = [o for o in client.get_status(session).offloaded if o.seq == 4]
    assert (listed.reason, listed.handle) == ("redacted", "")
    assert client.retract(session, [4], redact=True).seqs == []  # idempotent
    assert client.retract(session, [4]).seqs == []  # a redaction is not taken back by a retraction
    assert [c.rule for c in list(client.list_certificates(session, seq=4))][-1] == "retraction"


def test_a_retracted_turn_leaves_every_view_but_stays_recoverable(client: Client) -> None:
    session = client.create_session().id
    client.append_openai(session, CONVERSATION)
    client.render_view(session, "anthropic_messages")
    done = client.retract(session, [5, 6], reason="the user took it back")
    assert done.seqs == [5, 6] and all(c.handle for c in done.certificates)
    for fmt in ("openai_chat", "anthropic_messages", "openai_responses"):
        shown = str(client.render_view(session, fmt).messages)
        assert "The config sets an AWS key." not in shown and "wrong thing" not in shown
        assert "Looking at staging." in shown
    assert "wrong thing" in client.retrieve(session, seq=6).content  # retracted, not redacted
    assert not client.search(session, "wrong thing", mode="substring").hits  # no longer in the conversation
    view = client.render_view(session, "openai_chat")
    assert {i.seq: i.representation for i in view.items}[6] == "omitted"


def test_bad_retractions_change_nothing(client: Client) -> None:
    session = client.create_session().id
    client.append_openai(session, CONVERSATION[:2])
    _fails(lambda: client.retract(session, [3]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    _fails(lambda: client.retract(session, [0]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    _fails(lambda: client.retract(session, [1], reason="x" * 1001), grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDED")
    _fails(lambda: client.retract(session, [1], reason="a\x00b"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    _fails(lambda: client.retract("no-such-session", [1]), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert all(c.rule != "retraction" for c in list(client.list_certificates(session)))
    assert "Check the deploy config." in str(client.render_openai(session))


def test_the_history_as_stored_is_every_item_whole_but_the_retracted_and_records_nothing(client: Client) -> None:
    session = client.create_session(policy=DROP).id
    client.append_openai(session, CONVERSATION)
    modelled = client.render_view(session, "openai_chat")
    assert SECRET not in str(modelled.messages)  # the rule masked the output for the model
    client.retract(session, [6])
    calls = client.get_status(session).usage.renders
    stored = client.render_view(session, "openai_responses", as_stored=True)
    assert SECRET in str(stored.messages) and "wrong thing" not in str(stored.messages)
    assert {i.representation for i in stored.items if i.seq != 6} == {"full"}
    assert stored.certificates == () and stored.view_version == 0
    assert client.get_status(session).usage.renders == calls  # no model call counted
    assert client.render_view(session, "openai_chat").view_version == modelled.view_version + 1
    _fails(
        lambda: client.render_view(session, "openai_chat", as_stored=True, budget_tokens=100),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
