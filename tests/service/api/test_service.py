"""The service over gRPC, on both backends: sessions, appends, views, and
every kind of bad input answered with the right status, a message naming
the problem, and nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2

from contextd.engine.policy import default_policy_text
from contextd_client import (
    AlreadyExists,
    Client,
    ContextdError,
    InvalidArgument,
    NotFound,
    Usage,
    VersionConflict,
    ViewFormat,
)
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from tests.conftest import ServerThread


def text(role: int, value: str) -> pb.Item:
    return pb.Item(role=role, content=[pb.ContentBlock(text=pb.TextBlock(text=value))])


def call(call_id: str, name: str, arguments: str) -> pb.ContentBlock:
    return pb.ContentBlock(tool_use=pb.ToolUseBlock(id=call_id, name=name, input_json=arguments))


def result(call_id: str, output: str, is_error: bool = False) -> pb.Item:
    block = pb.ToolResultBlock(
        tool_use_id=call_id, content=[pb.ContentBlock(text=pb.TextBlock(text=output))], is_error=is_error
    )
    return pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=block)])


def test_session_lifecycle(client: Client) -> None:
    created = client.create_session(metadata={"agent": "test"})
    assert len(created.id) == 32 and created.version == 0 and created.metadata == {"agent": "test"}
    assert client.get_session(created.id) == created
    assert created.id in {s.id for s in client.list_sessions(page_size=2)}
    client.append_items(created.id, [text(pb.ROLE_USER, "hi")])
    assert client.delete_session(created.id) == 1
    with pytest.raises(NotFound) as missing:
        client.get_session(created.id)
    assert missing.value.reason == "SESSION_NOT_FOUND"
    with pytest.raises(AlreadyExists):
        client.create_session(client.create_session("dup-" + created.id[:8]).id)


def test_append_then_render_in_both_formats(client: Client, session_id: str) -> None:
    assistant = pb.Item(
        role=pb.ROLE_ASSISTANT,
        content=[call("c1", "read_file", '{"path": "a.py"}'), call("c2", "read_file", '{"path": "b.py"}')],
    )
    appended = client.append_items(
        session_id,
        [text(pb.ROLE_SYSTEM, "You fix bugs."), text(pb.ROLE_USER, "Fix it."), assistant, result("c1", "x = 1")],
    )
    assert (appended.first_seq, appended.last_seq, appended.version) == (1, 4, 4)
    client.append_items(session_id, [result("c2", "boom", is_error=True)], expected_version=4)

    openai = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    assert openai.version == 5 and openai.encoding == "cl100k_base"
    assert [m["role"] for m in openai.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert openai.messages[2]["tool_calls"][1]["function"]["arguments"] == '{"path": "b.py"}'
    assert [i.tokens for i in openai.items] == [r.token_count for r in appended.receipts] + [openai.items[4].tokens]
    assert openai.total_tokens == openai.item_tokens + openai.framing_tokens

    anthropic = client.render_view(session_id, ViewFormat.ANTHROPIC_MESSAGES)
    assert anthropic.system == "You fix bugs."
    assert [m["role"] for m in anthropic.messages] == ["user", "assistant", "user"]
    results = anthropic.messages[2]["content"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [("c1", False), ("c2", True)]
    assert json.loads(anthropic.messages_json) == anthropic.messages


SOURCE = "\n".join(
    f"def handler_{n}(request):\n" + "".join(f"    value_{k} = request.get('field_{k}', {k})\n" for k in range(8))
    for n in range(6)
)


def test_the_view_places_the_cache_breakpoint_before_what_the_next_render_compresses(client: Client) -> None:
    task = "Fix the handlers. The report:\n" + "\n".join(f"case {n}: the answer came late" for n in range(300))

    def reads(session: str) -> list[pb.Item]:
        # Code shown another way than a read of its file (which the default compresses as it
        # enters): whole for the call that made it, compressed at the next.
        shown = "python -c 'import inspect, app; print(inspect.getsource(app))'"
        command = call("c1", "bash", json.dumps({"command": shown}))
        opening = [text(pb.ROLE_SYSTEM, "You fix bugs."), text(pb.ROLE_USER, task)]
        return [*opening, pb.Item(role=pb.ROLE_ASSISTANT, content=[command]), result("c1", SOURCE)]

    # The first call of a session has saved nothing an early breakpoint may stake (`stakes:
    # banked`, the engine's tests): here its stake is not bounded, to see where it goes.
    policy = yaml.safe_load(default_policy_text())
    policy["cache"]["stakes"] = "unlimited"
    session = client.create_session(policy=json.dumps(policy)).id
    client.append_items(session, reads(session))
    view = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES, place_cache_breakpoint=True)
    assert view.cache_breakpoint_seq == 3  # the call: its output, which the next render compresses, is not cached
    marked = [b for m in view.messages if isinstance(m["content"], list) for b in m["content"] if "cache_control" in b]
    assert marked == [{**view.messages[1]["content"][0], "cache_control": {"type": "ephemeral"}}]
    assert view.messages_json.count("cache_control") == 1

    listing = pb.Item(role=pb.ROLE_ASSISTANT, content=[call("c2", "bash", json.dumps({"command": "ls"}))])
    client.append_items(session, [listing, result("c2", "src\ntests")])
    later = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES, place_cache_breakpoint=True)
    [compressed] = [c for c in later.certificates if c.seq == 4 and c.decision == "prune"]
    assert compressed.rationale == "it touches only the tail the cache has not seen"
    assert compressed.mutation_radius_tokens == 0

    unasked = client.create_session().id
    client.append_items(unasked, reads(unasked))
    plain = client.render_view(unasked, ViewFormat.ANTHROPIC_MESSAGES)
    assert plain.cache_breakpoint_seq == 0 and "cache_control" not in plain.messages_json


def test_a_view_over_budget_says_so(client: Client, session_id: str) -> None:
    client.append_items(session_id, [text(pb.ROLE_USER, "word " * 200)])
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=50)
    assert view.over_budget and view.total_tokens > 50 and view.budget_tokens == 50
    warning = next(w for w in view.warnings if w.code == "OVER_BUDGET")
    assert f"{view.total_tokens - 50:,} over the budget of 50" in warning.message
    roomy = client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=10_000)
    assert not roomy.over_budget and not roomy.warnings


def test_a_retried_append_is_written_once(client: Client, session_id: str) -> None:
    items = [text(pb.ROLE_USER, "once"), text(pb.ROLE_ASSISTANT, "only once")]
    first = client.append_items(session_id, items, idempotency_key="retry-1")
    second = client.append_items(session_id, items, idempotency_key="retry-1")
    assert second.replayed and (second.first_seq, second.last_seq) == (first.first_seq, first.last_seq)
    assert client.get_session(session_id).version == 2
    with pytest.raises(AlreadyExists) as reused:
        client.append_items(session_id, [text(pb.ROLE_USER, "other")], idempotency_key="retry-1")
    assert reused.value.reason == "IDEMPOTENCY_KEY_REUSED"


def test_an_expected_version_mismatch_is_aborted_with_the_current_version(client: Client, session_id: str) -> None:
    client.append_items(session_id, [text(pb.ROLE_USER, "a")])
    with pytest.raises(VersionConflict) as conflict:
        client.append_items(session_id, [text(pb.ROLE_USER, "b")], expected_version=0)
    assert conflict.value.code == "ABORTED" and conflict.value.reason == "VERSION_CONFLICT"
    assert conflict.value.current_version == 1
    assert client.get_session(session_id).version == 1


def _bad_tool_result() -> list[pb.Item]:
    return [result("never-called", "output")]


def _malformed_arguments() -> list[pb.Item]:
    return [pb.Item(role=pb.ROLE_ASSISTANT, content=[call("c1", "bash", '{"command": "ls"')])]


BAD_INPUT = {
    "oversized item": (
        lambda: [text(pb.ROLE_USER, "x" * 1_100_000)],
        "LIMIT_EXCEEDED",
        "items[0]",
        "over the limit of 1,048,576 bytes per item",
    ),
    "empty batch": (list, "INVALID_ARGUMENT", "items", "the batch is empty"),
    "unknown role": (lambda: [text(9, "hi")], "INVALID_ARGUMENT", "items[0].role", "unknown role 9"),
    "unset role": (lambda: [text(0, "hi")], "INVALID_ARGUMENT", "items[0].role", "role is not set"),
    "tool_result without tool_use": (
        _bad_tool_result,
        "INVALID_ARGUMENT",
        "items[0].content[0].tool_result.tool_use_id",
        "no earlier tool_use has id 'never-called'",
    ),
    "malformed JSON arguments": (
        _malformed_arguments,
        "INVALID_ARGUMENT",
        "items[0].content[0].tool_use.input_json",
        "not valid JSON",
    ),
    "over-long tool call id": (
        lambda: [pb.Item(role=pb.ROLE_ASSISTANT, content=[call("c" * 300, "bash", "{}")])],
        "INVALID_ARGUMENT",
        "items[0].content[0].tool_use.id",
        "300 characters, over the maximum of 256",
    ),
    "NUL in a source uri": (
        lambda: [pb.Item(role=pb.ROLE_USER, content=[text(1, "x").content[0]], source=pb.Source(uri="file:///a\x00"))],
        "INVALID_ARGUMENT",
        "items[0].source.uri",
        "contains a NUL character",
    ),
    "time out of range": (
        lambda: [
            pb.Item(
                role=pb.ROLE_USER,
                content=[text(1, "x").content[0]],
                source=pb.Source(uri="file:///a", observed_at=Timestamp(seconds=-(10**12))),
            )
        ],
        "INVALID_ARGUMENT",
        "items[0].source.observed_at",
        "not a valid time",
    ),
    "non-finite JSON number": (
        lambda: [pb.Item(role=pb.ROLE_ASSISTANT, content=[call("c1", "calc", '{"x": 1e400}')])],
        "INVALID_ARGUMENT",
        "items[0].content[0].tool_use.input_json",
        "too large for a JSON number",
    ),
    "tool_use in a user item": (
        lambda: [pb.Item(role=pb.ROLE_USER, content=[call("c1", "bash", "{}")])],
        "INVALID_ARGUMENT",
        "items[0].content[0]",
        "a user item cannot hold a tool_use block",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_refused_with_the_field_named_and_nothing_written(
    client: Client, session_id: str, case: str
) -> None:
    make_items, reason, field, problem = BAD_INPUT[case]
    client.append_items(session_id, [text(pb.ROLE_USER, "before")])
    with pytest.raises(InvalidArgument) as refused:
        client.append_items(session_id, make_items())
    error = refused.value
    assert (error.code, error.reason, error.field) == ("INVALID_ARGUMENT", reason, field)
    assert field in error.message and problem in error.message
    assert client.get_session(session_id).version == 1
    assert len(client.render_openai(session_id)) == 1


def test_tool_output_with_nul_characters_is_kept_byte_for_byte(client: Client, session_id: str) -> None:
    output = "\x7fELF\x02\x01\x00\x00 binary junk \x00 end"
    client.append_items(session_id, [pb.Item(role=pb.ROLE_ASSISTANT, content=[call("c1", "cat", '{"f": "a.out"}')])])
    client.append_items(session_id, [result("c1", output)])
    assert client.render_openai(session_id)[1]["content"] == output


def test_a_reused_key_with_control_characters_still_gets_a_clean_error(client: Client, session_id: str) -> None:
    key = "line\nbreak\ttab-é"
    client.append_items(session_id, [text(pb.ROLE_USER, "a")], idempotency_key=key)
    with pytest.raises(AlreadyExists) as reused:
        client.append_items(session_id, [text(pb.ROLE_USER, "b")], idempotency_key=key)
    assert reused.value.reason == "IDEMPOTENCY_KEY_REUSED"
    assert reused.value.metadata["idempotency_key"] == "line\\nbreak\\ttab-\\xe9"


def test_unknown_session_is_not_found(client: Client) -> None:
    with pytest.raises(NotFound) as missing:
        client.append_items("no-such-session", [text(pb.ROLE_USER, "hi")])
    assert missing.value.reason == "SESSION_NOT_FOUND" and "'no-such-session'" in missing.value.message
    with pytest.raises(NotFound):
        client.render_view("no-such-session", ViewFormat.OPENAI_CHAT)


@pytest.mark.parametrize("bad_id", ["", "has space", "x" * 129, "slash/es"])
def test_malformed_session_ids_are_invalid(client: Client, bad_id: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        client.get_session(bad_id)
    assert refused.value.field == "session_id"


def test_render_needs_a_format(server: ServerThread, session_id: str) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RenderView(api.RenderViewRequest(session_id=session_id))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "format" in refused.value.details()


def test_errors_carry_standard_rich_details(server: ServerThread, session_id: str) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.AppendItems(api.AppendItemsRequest(session_id=session_id, items=[text(0, ""), text(9, "x")]))
    trailers = dict(refused.value.trailing_metadata())
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info, bad_request = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert status.details[0].Unpack(info) and status.details[1].Unpack(bad_request)
    assert (info.reason, info.domain) == ("INVALID_ARGUMENT", "contextd.v1")
    fields = [v.field for v in bad_request.field_violations]
    assert fields == ["items[0].role", "items[1].role"]


@pytest.fixture
def stub(server: ServerThread) -> Iterator[contextd_pb2_grpc.ContextServiceStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield contextd_pb2_grpc.ContextServiceStub(channel)


def test_reported_usage_is_kept_beside_the_prediction(client: Client) -> None:
    session = client.create_session().id
    client.append_items(session, [text(pb.ROLE_SYSTEM, "You fix bugs."), text(pb.ROLE_USER, "word " * 1500)])
    first = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES, place_cache_breakpoint=True)
    client.append_items(session, [text(pb.ROLE_ASSISTANT, "Looking."), text(pb.ROLE_USER, "go on")])
    second = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES, place_cache_breakpoint=True)
    assert (first.view_version, second.view_version) == (1, 2)

    before = client.get_status(session).usage
    assert before is not None and (before.renders, before.reported_calls) == (2, 0)
    # The first call writes its prompt to the cache; the second reads it back and writes the rest.
    written = Usage("anthropic", "claude-sonnet-4", input_tokens=3, output_tokens=20, cache_write_tokens=1600)
    assert client.report_usage(session, 1, written) is False
    assert client.report_usage(session, 1, written) is True  # the same again: a retry
    read = Usage("anthropic", "claude-sonnet-4", input_tokens=3, output_tokens=9, cache_read_tokens=1600)
    read = replace(read, cache_write_tokens=12)
    client.report_usage(session, 2, read)

    usage = client.get_status(session).usage
    assert usage is not None and (usage.renders, usage.reported_calls) == (2, 2)
    assert (usage.reported_cache_read_tokens, usage.reported_cache_write_tokens) == (1600, 1612)
    assert (usage.reported_input_tokens, usage.reported_output_tokens) == (6, 29)
    # Predicted: the first call wrote its whole prompt; the second read back its messages (the
    # reply's priming at its end is not part of them) and wrote the rest.
    read_back = usage.predicted_cache_read_tokens
    assert first.total_tokens - 10 <= read_back <= first.total_tokens
    assert usage.predicted_cache_write_tokens == first.total_tokens + second.total_tokens - read_back
    assert usage.predicted_uncached_tokens == 0
    share = read_back / (first.total_tokens + second.total_tokens)
    assert usage.predicted_cache_read_share == pytest.approx(share)
    assert usage.reported_cache_read_share == pytest.approx(1600 / (1600 + 1612 + 6))

    with pytest.raises(AlreadyExists) as other:
        client.report_usage(session, 2, replace(read, output_tokens=10))
    assert other.value.reason == "USAGE_ALREADY_REPORTED"
    with pytest.raises(NotFound) as unknown:
        client.report_usage(session, 3, read)  # no such render
    assert unknown.value.reason == "CALL_NOT_FOUND" and unknown.value.metadata["view_version"] == "3"
    for version, wrong, field in (
        (0, read, "view_version"),
        (2**63, read, "view_version"),
        (1, replace(read, provider=""), "provider"),
        (1, replace(read, cache_read_tokens=2**63), "cache_read_tokens"),
    ):
        with pytest.raises(InvalidArgument) as refused:
            client.report_usage(session, version, wrong)
        assert refused.value.field == field
    with pytest.raises(NotFound):
        client.report_usage("no-such-session", 1, read)
    assert client.get_status(session).usage == usage  # nothing refused changed anything
    assert client.delete_session(session) == 4  # its calls go with it


def test_sessions_carry_a_validated_versioned_policy(client: Client) -> None:
    policy = "protection: {last_turns: 4}\nrules: [{name: old, transform: mask, when: {age_turns: {min: 10}}}]\n"
    session = client.create_session(policy=policy)
    assert session.policy == policy and session.policy_version.startswith("sha256:")
    default = client.create_session()
    assert default.policy == "" and default.policy_version.startswith("sha256:")
    assert default.policy_version != session.policy_version

    updated = client.update_session(session.id, policy="evidence: {max_level: 1}")
    assert updated.policy_version not in (session.policy_version, default.policy_version)
    assert client.get_session(session.id).policy == "evidence: {max_level: 1}"
    assert client.update_session(session.id).policy_version == updated.policy_version  # nothing given, nothing changed
    assert client.update_session(session.id, policy="").policy_version == default.policy_version


def test_a_bad_policy_is_refused_naming_the_field_and_nothing_changes(client: Client) -> None:
    with pytest.raises(InvalidArgument) as refused:
        client.create_session("with-bad-policy", policy="rules: [{name: r, transform: shrink}]")
    assert refused.value.field == "policy.rules[0].transform" and "unknown transform 'shrink'" in refused.value.message
    with pytest.raises(NotFound):
        client.get_session("with-bad-policy")
    session = client.create_session(policy="evidence: {max_level: 2}")
    with pytest.raises(InvalidArgument) as again:
        client.update_session(session.id, policy="protection: {last_turns: many}")
    assert again.value.field == "policy.protection.last_turns"
    assert client.get_session(session.id).policy_version == session.policy_version


def test_client_errors_are_contextd_errors(client: Client) -> None:
    with pytest.raises(ContextdError) as err:
        client.get_session("missing-one")
    assert isinstance(err.value, NotFound) and err.value.metadata["session_id"] == "missing-one"


def test_reflection_lists_the_services(server: ServerThread) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(server.target) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {"contextd.v1.ContextService", "grpc.health.v1.Health"} <= services
