"""Per-session serialization across replicas: three `contextd serve` processes
over one Postgres, thirty clients appending at once."""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from contextd_client import AppendResult, Client, RetryPolicy, ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_lab.service import ServerProcess
from contextd_storage import migrate
from tests import backends

REPLICAS = 3
CLIENTS = 30
SHARED_CLIENTS = 24  # the other 6 write to sessions of their own, two each
BATCHES = 8
RETRY = RetryPolicy(max_attempts=8, initial_backoff=0.02, max_backoff=0.5)


@pytest.fixture(scope="module")
def replicas(postgres_server_url: str) -> Iterator[list[ServerProcess]]:
    import asyncio

    url = backends.create_database(postgres_server_url, "contextd_replicas")
    asyncio.run(migrate.upgrade(url))
    args = ("--database-url", url, "--no-migrate-on-start", "--db-pool-size", "4", "--lock-timeout-ms", "10000")
    servers = [ServerProcess(*args) for _ in range(REPLICAS)]
    try:
        yield [s.wait_serving() for s in servers]
    finally:
        for server in servers:
            server.stop()
        backends.drop_database(postgres_server_url, url)


@dataclass
class Writer:
    number: int
    session_id: str
    acked: list[tuple[str, int]] = field(default_factory=list)
    """(text, seq) of every item the service acknowledged, in submission order."""


def _batch(writer: Writer, n: int) -> list[pb.Item]:
    size = 1 + (writer.number + n) % 3
    return [
        pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=f"w{writer.number}-b{n}-i{k}"))])
        for k in range(size)
    ]


def _record(writer: Writer, items: list[pb.Item], result: AppendResult) -> None:
    assert result.last_seq - result.first_seq + 1 == len(items)
    for offset, item in enumerate(items):
        writer.acked.append((item.content[0].text.text, result.first_seq + offset))


def _write(writer: Writer, targets: list[str], retried: bool) -> None:
    clients = [Client(t, retry=RETRY, timeout=30) for t in targets]
    try:
        for n in range(BATCHES):
            items = _batch(writer, n)
            key = f"{writer.session_id}-w{writer.number}-b{n}"
            home = clients[(writer.number + n) % len(clients)]
            if not retried:
                _record(writer, items, home.append_items(writer.session_id, items, idempotency_key=key))
                continue
            # The same append sent to two replicas at once, as a client that
            # timed out and retried elsewhere would: one writes, one replays.
            other = clients[(writer.number + n + 1) % len(clients)]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                sent = [
                    pool.submit(c.append_items, writer.session_id, items, idempotency_key=key) for c in (home, other)
                ]
                answers = [f.result() for f in sent]
            assert sorted(a.replayed for a in answers) == [False, True]
            assert answers[0].first_seq == answers[1].first_seq and answers[0].receipts == answers[1].receipts
            _record(writer, items, answers[0])
    finally:
        for client in clients:
            client.close()


def _check_session(target: str, session_id: str, writers: list[Writer]) -> int:
    with Client(target, timeout=30) as client:
        view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
        session = client.get_session(session_id)
    acked = [pair for w in writers for pair in w.acked]
    assert session.version == len(acked) == len(view.messages)
    assert [i.seq for i in view.items] == list(range(1, session.version + 1))  # dense: no gap, no duplicate
    stored = {i.seq: view.messages[i.message_index]["content"] for i in view.items}
    for text, seq in acked:  # every acknowledged item, exactly where the service said
        assert stored[seq] == text
    assert len(set(stored.values())) == len(stored)  # and exactly once
    for writer in writers:  # each writer's items in its own order
        seqs = [seq for _, seq in writer.acked]
        assert seqs == sorted(seqs)
    return session.version


@pytest.mark.parametrize("retried", [False, True], ids=["plain", "retried-on-two-replicas"])
def test_thirty_clients_on_three_replicas_never_lose_or_interleave(
    replicas: list[ServerProcess], retried: bool
) -> None:
    targets = [r.target for r in replicas]
    run = uuid.uuid4().hex[:8]
    shared = f"shared-{run}"
    private = [f"private-{run}-{n}" for n in range(3)]
    with Client(targets[0]) as client:
        for session_id in (shared, *private):
            client.create_session(session_id)
    writers = [
        Writer(n, shared if n < SHARED_CLIENTS else private[(n - SHARED_CLIENTS) % len(private)])
        for n in range(CLIENTS)
    ]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        for future in [pool.submit(_write, w, targets, retried) for w in writers]:
            future.result()

    total = _check_session(targets[1], shared, [w for w in writers if w.session_id == shared])
    assert total == sum(len(_batch(w, n)) for w in writers[:SHARED_CLIENTS] for n in range(BATCHES))
    for session_id in private:
        _check_session(targets[2], session_id, [w for w in writers if w.session_id == session_id])


def _agent_turn(n: int) -> list[dict[str, object]]:
    """A bash agent's call and its output: reads of a few files again and again, test runs, a
    failure now and then; enough for the default policy to prune and compress."""
    path = f"src/mod_{n % 4}.py"
    command = ("pytest -q" if n % 5 == 0 else f"sed -n '{1 + n % 3},{40 + n % 3}p' {path}") if n % 7 else f"cat {path}"
    body = "".join(f"    value_{k} = compute_{n % 4}(value_{k - 1})  # {path}:{k}\n" for k in range(1, 61))
    if n % 5 == 0:
        body += (
            "FAILED tests/test_mod.py::test_parse\n=== 1 failed in 0.4s ===\n"
            if n % 10
            else "=== 9 passed in 0.3s ===\n"
        )
    call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": body},
    ]


@pytest.mark.parametrize("fmt", [ViewFormat.OPENAI_CHAT, ViewFormat.ANTHROPIC_MESSAGES])
def test_renders_alternating_between_two_replicas_are_the_renders_of_one(
    postgres_server_url: str, redis_url: str, fmt: ViewFormat
) -> None:
    """Two replicas over one Postgres and one Redis render a session by turns of one to three
    renders (each catching up by the other's stored changes, engine/changes.py); one replica
    renders a twin session alone. Every view and every decision are the same."""
    import asyncio
    import random

    url = backends.create_database(postgres_server_url, "contextd_alternating")
    asyncio.run(migrate.upgrade(url))
    args = ("--database-url", url, "--no-migrate-on-start", "--redis-url", redis_url)
    servers = [ServerProcess(*args) for _ in range(2)]
    try:
        a, b = (s.wait_serving() for s in servers)
        with Client(a.target, timeout=60) as on_a, Client(b.target, timeout=60) as on_b:
            prompt = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix test_parse."}]
            alternating, alone = (on_a.create_session(metadata={"twin": name}).id for name in ("alternating", "alone"))
            for session in (alternating, alone):
                on_a.append_openai(session, prompt)
            turns = random.Random(18)
            replica, left = on_a, 0
            for n in range(1, 41):
                for session in (alternating, alone):
                    on_a.append_openai(session, _agent_turn(n))
                if left == 0:  # the other replica's turn, for one to three renders
                    replica, left = (on_b if replica is on_a else on_a), turns.randint(1, 3)
                left -= 1
                shared = replica.render_view(alternating, fmt)
                single = on_a.render_view(alone, fmt)
                assert shared.messages_json == single.messages_json, n
                assert (shared.system, shared.items, shared.total_tokens) == (
                    single.system,
                    single.items,
                    single.total_tokens,
                )
                assert [(c.seq, c.decision, c.rule, c.level, c.reason) for c in shared.certificates] == [
                    (c.seq, c.decision, c.rule, c.level, c.reason) for c in single.certificates
                ], n
            decided = [c.decision for c in on_b.list_certificates(alternating)]
            assert decided.count("prune") > 10  # the default policy took things out, on both replicas
    finally:
        for server in servers:
            server.stop()
        backends.drop_database(postgres_server_url, url)
