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
