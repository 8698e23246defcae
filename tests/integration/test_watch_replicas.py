"""WatchSession across replicas, on real Postgres and Redis: a watcher on one replica sees
what writers do on another; its replica is killed mid-stream and the client resumes on
the other from its cursor; every event arrives once, in the log's order."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from contextd_client import Client, RetryPolicy, SessionEvent, ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_lab.service import ServerProcess
from contextd_storage import migrate
from tests import backends

BATCHES = 40
RENDER_EVERY = 5


@pytest.fixture
def replicas(postgres_server_url: str, redis_url: str) -> Iterator[list[ServerProcess]]:
    url = backends.create_database(postgres_server_url, "contextd_watch")
    asyncio.run(migrate.upgrade(url))
    args = ("--database-url", url, "--redis-url", redis_url, "--no-migrate-on-start", "--watch-poll-ms", "100")
    servers = [ServerProcess(*args) for _ in range(2)]
    try:
        yield [s.wait_serving() for s in servers]
    finally:
        for server in servers:
            server.stop()
        backends.drop_database(postgres_server_url, url)


def _write(target: str, session: str, killed_midway: threading.Event, kill: threading.Event) -> None:
    with Client(target, timeout=30) as client:
        for n in range(BATCHES):
            item = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=f"turn {n} " * 50))])
            client.append_items(session, [item, item], author=f"writer-{n % 3}")
            if n % RENDER_EVERY == RENDER_EVERY - 1:
                client.render_view(session, ViewFormat.OPENAI_CHAT)
            if n == BATCHES // 2:
                kill.set()
                killed_midway.wait(30)
        client.delete_session(session)


def test_a_watcher_killed_mid_stream_resumes_on_another_replica_with_nothing_lost_or_repeated(
    replicas: list[ServerProcess],
) -> None:
    watched, writer = replicas
    session = f"watched-{uuid.uuid4().hex[:10]}"
    retry = RetryPolicy(initial_backoff=0.05, max_backoff=0.5, budget=60)
    # The watcher knows both replicas; it is on the first until that one dies.
    with Client(writer.target) as creator:
        creator.create_session(session)
    # By name, not address: a channel per replica (addresses would share one, balanced), so the
    # watch, the client's first call, is on `watched` and its reconnections go to the next.
    targets = [f"localhost:{watched.port}", f"localhost:{writer.port}"]
    with Client(targets, retry=retry) as client:
        watch = client.watch_session(session, cursor="0-0")
        kill, killed = threading.Event(), threading.Event()
        writing = threading.Thread(target=_write, args=(writer.target, session, killed, kill))
        seen: list[SessionEvent] = []
        writing.start()
        for event in watch:  # ends with the session's deletion
            seen.append(event)
            if kill.is_set() and not killed.is_set():
                watched.process.kill()  # the connection dies mid-stream
                watched.wait()
                killed.set()
        writing.join(60)
        assert killed.is_set() and watch.resumed >= 1

        kinds = [e.kind for e in seen]
        appended = [(e.details["first_seq"], e.details["last_seq"]) for e in seen if e.kind == "items_appended"]
        assert appended == [(1 + 2 * n, 2 + 2 * n) for n in range(BATCHES)]  # each once, in order
        assert kinds.count("view_rendered") == BATCHES // RENDER_EVERY
        assert kinds[0] == "session_created" and kinds[-1] == "session_deleted"
        authors = [e.details["author"] for e in seen if e.kind == "items_appended"]
        assert authors == [f"writer-{n % 3}" for n in range(BATCHES)]
        # The same events, cursors and all, as a replay of the log from the start.
        replay = list(client.watch_session(session, cursor="0-0"))
        assert [(e.cursor, e.kind) for e in replay] == [(e.cursor, e.kind) for e in seen]
