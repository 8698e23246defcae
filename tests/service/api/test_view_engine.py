"""The view engine through the service, on both backends: policies drive
renders, every decision is certified and listed, pins and the agent's
proposals are honoured, certificates are append-only and chained."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from contextd.view_service import MAX_TOOLS
from contextd_client import Client, InvalidArgument, ViewFormat, completes
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from contextd_storage.database import Database
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for

MakeServer = Callable[..., ServerThread]

# A cache that is always cold, so these tests see edits applied at once
# (the cache arithmetic is tested against a controlled clock in tests/service/engine).
COLD = "cache: {prices: {input: 3, cache_write: 3.75, cache_read: 0.3, ttl_seconds: 0.000001}}\n"
DROP_OLD_OUTPUTS = (
    COLD
    + """
protection: {last_turns: 1}
evidence: {max_level: 4}
rules: [{name: mask-old-outputs, transform: mask, when: {roles: [tool]}}]
"""
)


def conversation(client: Client, session_id: str, rounds: int = 4) -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the parser."},
    ]
    for n in range(rounds):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"output number {n}\n" * 20})
    client.append_openai(session_id, messages)


@pytest.fixture
def masked_session(client: Client) -> str:
    session = client.create_session(policy=DROP_OLD_OUTPUTS)
    conversation(client, session.id)
    return session.id


def test_a_render_prunes_by_policy_and_certifies_each_decision(client: Client, masked_session: str) -> None:
    view = client.render_view(masked_session, ViewFormat.OPENAI_CHAT)
    pruned = [c for c in view.certificates if c.decision == "prune"]
    assert [c.seq for c in pruned] == [4, 6, 8]  # the last turn's output (seq 10) is protected
    assert all(c.number > 0 and len(c.hash) == 64 and c.handle and c.rule == "mask-old-outputs" for c in pruned)
    assert pruned[1].previous_hash == pruned[0].hash  # chained
    by_seq = {i.seq: i for i in view.items}
    assert by_seq[4].representation == "placeholder" and by_seq[4].handle == pruned[0].handle
    assert "output number 0" not in view.messages_json and pruned[0].handle in view.messages_json
    assert view.view_version == 1 and view.total_tokens < view.item_tokens + view.framing_tokens + 1

    again = client.render_view(masked_session, ViewFormat.OPENAI_CHAT)
    assert again.certificates == () and again.view_version == 2
    assert again.messages_json == view.messages_json and again.stable_prefix_tokens > 0

    listed = list(client.list_certificates(masked_session, page_size=2))
    assert [c.number for c in listed] == list(range(1, len(listed) + 1))
    assert [c.seq for c in client.list_certificates(masked_session, decision="prune")] == [4, 6, 8]
    assert [c.seq for c in client.list_certificates(masked_session, seq=6)] == [6]
    assert {c.view_version for c in client.list_certificates(masked_session, view_version=1)} == {1}


def test_pins_protect_and_unpinning_restores_eligibility(client: Client) -> None:
    session = client.create_session(policy=DROP_OLD_OUTPUTS).id
    conversation(client, session)
    assert client.pin(session, [4]) == [4]
    first = client.render_view(session, ViewFormat.OPENAI_CHAT)
    assert {(c.seq, c.decision, c.protection) for c in first.certificates if c.seq == 4} == {(4, "keep", "pinned")}
    assert "output number 0" in first.messages_json
    assert client.explain_item(session, 4).pinned
    client.unpin(session, [4])
    second = client.render_view(session, ViewFormat.OPENAI_CHAT)
    assert [(c.seq, c.decision) for c in second.certificates] == [(4, "prune")]
    explained = client.explain_item(session, 4)
    assert (explained.representation, explained.pinned, explained.protection) == ("placeholder", False, "")
    assert [c.decision for c in explained.certificates] == ["keep", "prune"]


def test_the_agents_proposals_are_checked_queued_and_applied_as_the_agents(client: Client) -> None:
    session = client.create_session(policy=COLD + "protection: {last_turns: 1}").id
    conversation(client, session)
    outcomes = client.propose_prune(session, [4, 2], reason="I have read it")
    assert [(o.seq, o.accepted) for o in outcomes] == [(4, True), (2, False)]
    assert outcomes[1].reason == "protected: user instruction"
    view = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES)
    [cert] = [c for c in view.certificates if c.seq == 4]
    assert (cert.decision, cert.control, cert.evidence) == ("prune", "agent", "I have read it")
    assert client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES).certificates == ()  # decided once


def test_the_agent_cannot_queue_an_item_twice_or_one_already_pruned(client: Client, masked_session: str) -> None:
    client.render_view(masked_session, ViewFormat.OPENAI_CHAT)  # 4, 6 and 8 pruned by the policy
    first = client.propose_prune(masked_session, [4, 3], reason="done")
    assert [(o.seq, o.accepted, o.reason) for o in first] == [
        (4, False, "already pruned"),
        (3, True, "queued: decided at the next render, applied at a cache-safe point"),
    ]
    again = client.propose_prune(masked_session, [3])
    assert [(o.seq, o.accepted, o.reason) for o in again] == [(3, False, "already queued")]


def test_decisions_hold_in_every_format_and_list_by_format(client: Client, masked_session: str) -> None:
    openai = client.render_view(masked_session, ViewFormat.OPENAI_CHAT)
    anthropic = client.render_view(masked_session, ViewFormat.ANTHROPIC_MESSAGES)
    assert anthropic.certificates == () and anthropic.view_version == 2  # decided once, for the session
    assert "output number 0" not in anthropic.messages_json
    listed = list(client.list_certificates(masked_session, view_format=ViewFormat.OPENAI_CHAT))
    assert [c.number for c in listed] == [c.number for c in openai.certificates]
    assert {c.view_format for c in listed} == {"openai_chat"} and all(c.created_at for c in listed)
    assert list(client.list_certificates(masked_session, view_format=ViewFormat.ANTHROPIC_MESSAGES)) == []


def test_a_policy_change_reaches_the_next_decisions(client: Client, session_id: str) -> None:
    conversation(client, session_id)
    before = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    assert before.certificates == ()
    session = client.update_session(session_id, policy=DROP_OLD_OUTPUTS)
    after = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    assert after.policy_version == session.policy_version != before.policy_version
    assert {c.policy_version for c in after.certificates} == {session.policy_version}
    assert [c.seq for c in after.certificates if c.decision == "prune"] == [4, 6, 8]


def test_list_certificates_refuses_what_it_cannot_mean(server: ServerThread, masked_session: str) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        for request, field in [
            (api.ListCertificatesRequest(session_id=masked_session, decision=42), "decision"),  # type: ignore[arg-type]
            (api.ListCertificatesRequest(session_id=masked_session, seq=0), "seq"),
            (api.ListCertificatesRequest(session_id=masked_session, level=7), "level"),
            (api.ListCertificatesRequest(session_id=masked_session, format=9), "format"),  # type: ignore[arg-type]
        ]:
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListCertificates(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in refused.value.details()


def test_bad_control_requests_name_the_field(client: Client, session_id: str) -> None:
    conversation(client, session_id, rounds=1)
    with pytest.raises(InvalidArgument) as missing:
        client.pin(session_id, [99])
    assert (
        missing.value.field == "seqs[0]" and "no item 99 in this session (its items are 1-4)" in missing.value.message
    )
    with pytest.raises(InvalidArgument) as empty:
        client.propose_prune(session_id, [])
    assert empty.value.field == "seqs"
    with pytest.raises(InvalidArgument) as nul:
        client.propose_prune(session_id, [4], reason="a\x00b")
    assert nul.value.field == "reason" and client.propose_prune(session_id, [4])[0].reason != "already queued"
    with pytest.raises(InvalidArgument) as tools:
        client.render_view(session_id, ViewFormat.OPENAI_CHAT, tools=["not an object"])  # type: ignore[list-item]
    assert tools.value.field == "tools_json"
    with pytest.raises(InvalidArgument) as many:  # refused before the render reads them
        client.render_view(session_id, ViewFormat.OPENAI_CHAT, tools=[{}] * (MAX_TOOLS + 1))
    assert many.value.field == "tools_json" and many.value.reason == "LIMIT_EXCEEDED"
    assert f"over the maximum of {MAX_TOOLS:,}" in many.value.message
    assert client.render_view(session_id, ViewFormat.OPENAI_CHAT, tools=[{}] * MAX_TOOLS).version


def stored_content(database_url: str, session_id: str, seq: int) -> str:
    async def read() -> str:
        db = Database(database_url)
        try:
            async with db.read() as conn:
                query = text(
                    "SELECT i.content FROM items i JOIN sessions s ON s.key = i.session_key "
                    "WHERE s.id = :s AND i.seq = :q"
                )
                return str((await conn.execute(query, {"s": session_id, "q": seq})).scalar_one())
        finally:
            await db.close()

    return asyncio.run(read())


def test_history_mode_makes_an_edit_durable_without_touching_the_item(client: Client, database_url: str) -> None:
    policy = DROP_OLD_OUTPUTS.replace("when: {roles: [tool]}}", "when: {roles: [tool]}, history: true}")
    session = client.create_session(policy=policy).id
    conversation(client, session)
    client.render_view(session, ViewFormat.OPENAI_CHAT)
    # A fresh view (another format, no state of its own) shows the durable edit too.
    anthropic = client.render_view(session, ViewFormat.ANTHROPIC_MESSAGES)
    assert "output number 0" not in anthropic.messages_json
    assert not [c for c in anthropic.certificates if c.seq == 4]  # nothing left to decide
    assert client.explain_item(session, 4).representation == "placeholder"
    assert "output number 0" in stored_content(database_url, session, 4)  # the original, untouched
    client.pin(session, [4])  # history is history: a pin does not undo it
    assert "output number 0" not in client.render_view(session, ViewFormat.OPENAI_CHAT).messages_json
    assert client.explain_item(session, 4).representation == "placeholder"


def test_the_database_refuses_to_alter_certificates(database_url: str, client: Client, masked_session: str) -> None:
    client.render_view(masked_session, ViewFormat.OPENAI_CHAT)

    async def tamper(statement: str) -> None:
        db = Database(database_url)
        try:
            async with db.engine.begin() as conn:
                await conn.execute(text(statement))
        finally:
            await db.close()

    for statement in (
        "UPDATE certificates SET rationale = 'nothing to see'",
        "DELETE FROM certificates",
        "UPDATE mutations SET seq = 0",
        "DELETE FROM mutations",
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            asyncio.run(tamper(statement))


def contextd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "contextd", *args], capture_output=True, text=True, timeout=60)


def test_a_broken_chain_is_found_by_the_verify_command(make_server: MakeServer) -> None:
    server = make_server()
    url = server.settings.database_url
    with Client(server.target) as client:
        session = client.create_session(policy=DROP_OLD_OUTPUTS).id
        conversation(client, session)
        client.render_view(session, ViewFormat.OPENAI_CHAT)
    intact = contextd("certificates", "verify", "--session", session, "--database-url", url)
    assert intact.returncode == 0 and "4 certificates, chain intact" in intact.stdout

    conn = sqlite3.connect(url.removeprefix("sqlite+aiosqlite:///"))
    conn.execute("DROP TRIGGER certificates_no_update")  # what only someone holding the database file could do
    conn.execute("UPDATE certificates SET rationale = 'edited' WHERE number = 2")
    conn.commit()
    conn.close()
    broken = contextd("certificates", "verify", "--session", session, "--database-url", url)
    assert broken.returncode == 1 and "BROKEN at certificate 2" in broken.stdout


def test_the_operator_command_shows_what_waits_and_applies_it(make_server: MakeServer) -> None:
    server = make_server()
    url = server.settings.database_url
    with Client(server.target) as client:
        session = client.create_session().id
        conversation(client, session, rounds=8)
        # A long last turn: pruning the small outputs before it would make the
        # next call write all of it to the cache again.
        client.append_openai(session, [{"role": "user", "content": "context " * 20_000}])
        client.render_view(session, ViewFormat.OPENAI_CHAT)  # the provider now caches this
        policy = (
            "protection: {last_turns: 1}\nevidence: {max_level: 4}\n"
            "rules: [{name: m, transform: mask, when: {roles: [tool]}}]"
        )
        client.update_session(session, policy=policy)
        warm = client.render_view(session, ViewFormat.OPENAI_CHAT)
        deferred = [c.seq for c in warm.certificates if c.decision == "defer"]
        assert deferred  # early prunes would invalidate the cached prefix: they wait

    dry = contextd("prune", "--session", session, "--database-url", url)
    assert dry.returncode == 0 and "dry run" in dry.stdout
    assert dry.stdout.count(" prune ") == len(deferred)
    applied = contextd("prune", "--session", session, "--database-url", url, "--apply")
    assert applied.returncode == 0 and "applied and certified" in applied.stdout
    assert contextd("prune", "--session", session, "--database-url", url).stdout.count(" prune ") == 0
    with Client(server.target) as client:
        operator = [c for c in client.list_certificates(session, decision="prune") if c.control == "operator"]
        assert sorted(c.seq for c in operator) == sorted(deferred)

    missing = contextd("prune", "--session", "nope", "--database-url", url)
    assert missing.returncode == 1 and "session 'nope' not found" in missing.stderr


def more_rounds(client: Client, session_id: str, first: int, rounds: int) -> None:
    messages: list[dict[str, object]] = []
    for n in range(first, first + rounds):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"output number {n}\n" * 20})
    client.append_openai(session_id, messages)


@pytest.mark.parametrize("fmt", [ViewFormat.OPENAI_CHAT, ViewFormat.ANTHROPIC_MESSAGES])
def test_a_replica_that_did_not_make_the_previous_render_renders_the_same(
    server: ServerThread, database_url: str, fmt: ViewFormat
) -> None:
    # The replica that made a session's previous render resumes it (the engine's
    # carry); another replica starts from the stored state. Same view, same decisions.
    other = ServerThread(settings_for(database_url)).start()
    try:
        with Client(server.target) as here, Client(other.target) as there:
            kept, fresh = (here.create_session(policy=DROP_OLD_OUTPUTS).id for _ in range(2))
            for session in (kept, fresh):
                conversation(here, session, rounds=3)
                here.render_view(session, fmt)
            for first in (3, 5):
                for session in (kept, fresh):
                    more_rounds(here, session, first, rounds=2)
                resumed, started_over = here.render_view(kept, fmt), there.render_view(fresh, fmt)
                assert resumed.messages_json == started_over.messages_json
                assert resumed.system == started_over.system
                assert resumed.items == started_over.items
                assert [(c.seq, c.decision, c.rule) for c in resumed.certificates] == [
                    (c.seq, c.decision, c.rule) for c in started_over.certificates
                ]
                assert [c.decision for c in resumed.certificates].count("prune") == 2  # the newly old outputs
    finally:
        other.stop()


def test_work_the_client_marks_complete_leaves_the_view_and_a_bad_mark_is_refused(
    client: Client, session_id: str
) -> None:
    conversation(client, session_id, rounds=3)  # seqs 3-8: three calls and their outputs
    outcome = pb.Item(
        role=pb.ROLE_ASSISTANT,
        content=[pb.ContentBlock(text=pb.TextBlock(text="The three runs agree: the parser is fixed."))],
        metadata=completes(3, 8),
    )
    done = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="Thanks, go on."))])
    client.append_items(session_id, [outcome, done])
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    completed = [c for c in view.certificates if c.rule == "completed-work"]
    assert [(c.seq, c.decision, c.level) for c in completed] == [(4, "prune", 3), (6, "prune", 3), (8, "prune", 3)]
    assert "its outcome is recorded at seq 9" in view.messages_json

    bad = pb.Item(
        role=pb.ROLE_USER,
        content=[pb.ContentBlock(text=pb.TextBlock(text="x"))],
        metadata={"contextd.completes": "8-3"},
    )
    with pytest.raises(InvalidArgument) as refused:
        client.append_items(session_id, [bad])
    assert refused.value.field == "items[0].metadata[contextd.completes]"
    assert client.get_session(session_id).version == 10  # nothing appended
