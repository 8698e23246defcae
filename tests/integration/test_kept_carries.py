"""A session's carry kept in Redis: a replica started after the one that rendered the session
stopped resumes from what that one worked out, and renders what a replica that never stopped
renders."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from contextd import metrics
from contextd.api.auth import DEFAULT_TENANT
from contextd.config import Settings
from contextd.render_processes import route
from contextd.view_service import ViewService
from contextd_client import Client, ViewFormat
from contextd_lab.service import ServerProcess
from contextd_storage import kept_carries, migrate
from contextd_storage.kept_carries import KeptCarries, deployment_of
from tests import backends
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for
from tests.integration.test_metrics_scrape import METRICS, scrape, value
from tests.integration.test_replicas import _agent_turn

PROMPT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix test_parse."}]


def test_a_restarted_replica_resumes_a_session_from_its_kept_carry(postgres_server_url: str, redis_url: str) -> None:
    url = backends.create_database(postgres_server_url, "contextd_kept_carries")
    asyncio.run(migrate.upgrade(url))
    secret = uuid.uuid4().hex  # this test's deployment: no other's carries
    args = ("--database-url", url, "--no-migrate-on-start", "--redis-url", redis_url)
    kept = (*args, "--carry-secret", secret, "--metrics-listen", "127.0.0.1:0")
    steady = ServerProcess(*args).wait_serving()  # renders the twin session, never stops
    first = ServerProcess(*kept).wait_serving()
    later: ServerProcess | None = None
    try:
        with Client(steady.target, timeout=60) as on_steady:
            restarted, twin = (on_steady.create_session(metadata={"twin": n}).id for n in ("restarted", "twin"))
            for session in (restarted, twin):
                on_steady.append_openai(session, PROMPT)

            def turn(n: int, renderer: Client) -> None:
                _turn(n, on_steady, renderer, [(restarted, twin)])

            with Client(first.target, timeout=60) as on_first:
                for n in range(1, 16):
                    turn(n, on_first)
            first.terminate()
            assert first.wait() == 0
            assert any(
                re.search(r"kept in Redis the carries of 1 of the 1 sessions held", line) for line in first.log
            ), first.log
            keys = _kept(redis_url, secret)
            assert len(keys) == 1
            with redis.Redis.from_url(
                redis_url
            ) as client:  # (closed: a socket left to the collector fails a later test)
                stored = client.hget(keys[0], "c")
            assert stored.startswith(kept_carries.MAGIC)  # type: ignore[union-attr]

            later = ServerProcess(*kept).wait_serving()
            with Client(later.target, timeout=60) as on_later:
                for n in range(16, 22):
                    turn(n, on_later)
            metrics_url = next(m.group(1) for line in later.log if (m := METRICS.search(line)))
            samples = scrape(metrics_url)
            assert value(samples, "contextd_carries_total", contextd_carry_operation="loaded") == 1
            assert value(samples, "contextd_carries_total", contextd_carry_operation="resumed") == 1
            assert value(samples, "contextd_carries_total", contextd_carry_operation="refused") == 0
            with Client(later.target, timeout=60) as on_later:
                on_later.delete_session(restarted)
            assert _kept(redis_url, secret) == []  # what it showed goes with it
    finally:
        for server in (steady, first, later):
            if server is not None:
                server.stop()
        backends.drop_database(postgres_server_url, url)


def _turn(n: int, steady: Client, renderer: Client, pairs: Sequence[tuple[str, str]]) -> None:
    """Agent turn `n` appended to both sessions of each (restarted, twin) pair, the first rendered
    on `renderer`, its twin on `steady`: the same view, and the same decisions."""
    for restarted, twin in pairs:
        for session in (restarted, twin):
            steady.append_openai(session, _agent_turn(n))
        resumed = renderer.render_view(restarted, ViewFormat.OPENAI_CHAT)
        alone = steady.render_view(twin, ViewFormat.OPENAI_CHAT)
        assert resumed.messages_json == alone.messages_json, n
        assert (resumed.items, resumed.total_tokens) == (alone.items, alone.total_tokens), n
        assert [(c.seq, c.decision, c.rule, c.reason) for c in resumed.certificates] == [
            (c.seq, c.decision, c.rule, c.reason) for c in alone.certificates
        ], n


def _kept(redis_url: str, secret: str) -> list[bytes]:
    """The keys of the carries this deployment (its secret) keeps."""
    with redis.Redis.from_url(redis_url) as client:
        found = list(client.scan_iter(match=f"contextd:carry:{deployment_of(secret)}:*"))
    return [key for key in found if not key.endswith(b":floor") and b":recent:" not in key]


def test_a_session_let_go_of_to_stay_in_the_memory_budget_is_resumed_from_its_kept_carry(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose memory holds one session's carry renders two by turns: each render lets
    the other session's carry go, and keeps it in Redis; another replica (nothing of either in
    its memory) resumes each from there, and renders what a replica that never let go renders.
    Each render that looked for a kept carry says so in its reads (`contextd.render.reads`)."""
    reads: list[str] = []
    record = metrics.record_reads
    monkeypatch.setattr(metrics, "record_reads", lambda found: (reads.extend(r for r, _ in found), record(found)))
    database = f"sqlite+aiosqlite:///{tmp_path / 'kept.db'}"
    asyncio.run(migrate.upgrade(database))
    secret = uuid.uuid4().hex
    small = settings_for(database, redis_url=redis_url, carry_secret=secret, session_cache_bytes=2 * 60_000)
    roomy = replace(small, session_cache_bytes=1 << 28, carry_follow_seconds=0)  # (reads at its renders alone)
    tight, later = ServerThread(small).start(), ServerThread(roomy).start()
    plain = ServerThread(settings_for(database)).start()
    try:
        with Client(tight.target) as on_tight, Client(later.target) as on_later, Client(plain.target) as on_plain:
            ids = {name: on_plain.create_session(metadata={"twin": name}).id for name in ("a", "b", "a2", "b2")}
            for session in ids.values():
                on_plain.append_openai(session, PROMPT)
            carries = tight._running.carries  # type: ignore[union-attr]
            assert carries is not None
            for n in range(1, 13):
                for session in ids.values():
                    on_plain.append_openai(session, _agent_turn(n))
                for name in ("a", "b"):  # by turns on the tight replica: each render lets the other go
                    resumed = on_tight.render_view(ids[name], ViewFormat.OPENAI_CHAT)
                    alone = on_plain.render_view(ids[name + "2"], ViewFormat.OPENAI_CHAT)
                    assert resumed.messages_json == alone.messages_json, (n, name)
                    for _ in range(200):  # written off the loop: the next render resumes from it
                        if carries.idle:
                            break
                        time.sleep(0.02)
            # Once the sessions outgrow the budget, every render lets the other session go, and its
            # next render resumes from what was kept.
            assert carries.stats.resumed == carries.stats.loaded >= 15 and carries.stats.refused == 0
            for name in ("a", "b"):
                on_plain.append_openai(ids[name], _agent_turn(13))
                on_plain.append_openai(ids[name + "2"], _agent_turn(13))
                resumed = on_later.render_view(ids[name], ViewFormat.OPENAI_CHAT)
                alone = on_plain.render_view(ids[name + "2"], ViewFormat.OPENAI_CHAT)
                assert resumed.messages_json == alone.messages_json
                assert [(c.seq, c.decision, c.reason) for c in resumed.certificates] == [
                    (c.seq, c.decision, c.reason) for c in alone.certificates
                ]
        stats = later._running.carries.stats  # type: ignore[union-attr]
        assert (stats.loaded, stats.resumed, stats.refused) == (2, 2, 0)
        looked = [s.loaded + s.missed + s.refused for s in (carries.stats, stats)]
        renders = 12 * 4 + 2 * 2  # (each turn: two on the tight replica, two on the plain one; then two each)
        assert Counter(reads) == {"history": renders, "state": renders, "carry": sum(looked)}
    finally:
        for server in (tight, later, plain):
            server.stop()


@pytest.mark.parametrize(("keep_seconds", "writes"), [(0.0, (1, 0)), (0.001, (2, 2))], ids=["derived", "and-again"])
def test_a_render_that_derived_a_session_keeps_it_for_the_replicas_that_never_rendered_it(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, keep_seconds: float, writes: tuple[int, int]
) -> None:
    """The first replica to render a session derives it whole, and keeps what it worked out
    while it goes on holding it (its next render waits for the write, then resumes as before);
    a replica that never rendered the session resumes from what was kept. With
    `carry_keep_seconds`, each keeps it again once that long has passed since it last wrote or
    read it."""
    monkeypatch.setattr(kept_carries, "KEEP_FROM_ITEMS", 10)
    database = f"sqlite+aiosqlite:///{tmp_path / 'derived.db'}"
    asyncio.run(migrate.upgrade(database))
    kept = settings_for(database, redis_url=redis_url, carry_secret=uuid.uuid4().hex, carry_keep_seconds=keep_seconds)
    unfollowing = replace(kept, carry_follow_seconds=0)  # (its first render reads what was kept)
    first, other, plain = (ServerThread(s).start() for s in (kept, unfollowing, settings_for(database)))
    try:
        with Client(first.target) as on_first, Client(other.target) as on_other, Client(plain.target) as on_plain:
            ids = [on_plain.create_session().id for _ in range(2)]  # rendered with and without kept carries
            for session in ids:
                on_plain.append_openai(session, PROMPT + [m for n in range(1, 9) for m in _agent_turn(n)])
            for n, renderer in ((9, on_first), (10, on_first), (11, on_other), (12, on_other)):
                for session in ids:
                    on_plain.append_openai(session, _agent_turn(n))
                resumed = renderer.render_view(ids[0], ViewFormat.OPENAI_CHAT)
                alone = on_plain.render_view(ids[1], ViewFormat.OPENAI_CHAT)
                assert resumed.messages_json == alone.messages_json, n
        on_first_stats, on_other_stats = (_settled(server).stats for server in (first, other))
        assert on_first_stats.kept == writes[0]  # the derived render's; the next too if due
        assert (on_other_stats.loaded, on_other_stats.resumed, on_other_stats.kept) == (1, 1, writes[1])
    finally:
        for server in (first, other, plain):
            server.stop()


def test_the_replicas_left_read_back_what_another_keeps_before_they_render_its_sessions(
    postgres_server_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica follows what the others keep (`carry_follow_seconds`): a session another replica
    derived whole, and one it held as it stopped (a rolling restart). Each first render of them
    on the follower resumes from what it read ahead, with no read of its own, and renders what a
    replica that keeps nothing renders; a session it rendered since is its own, not read again."""
    monkeypatch.setattr(kept_carries, "KEEP_FROM_ITEMS", 10)
    url = backends.create_database(postgres_server_url, "contextd_follow")
    asyncio.run(migrate.upgrade(url))
    kept = settings_for(
        url, redis_url=redis_url, carry_secret=uuid.uuid4().hex, carry_keep_seconds=0, carry_follow_seconds=0.05
    )
    first, follower, plain = (ServerThread(s).start() for s in (kept, kept, settings_for(url)))
    stopped = False
    try:
        with Client(first.target) as on_first, Client(follower.target) as on_follower, Client(plain.target) as on_plain:
            derived, twin, held, held_twin = (on_plain.create_session().id for _ in range(4))
            for session in (derived, twin):
                on_plain.append_openai(session, PROMPT + [m for n in range(1, 9) for m in _agent_turn(n)])
            for session in (held, held_twin):
                on_plain.append_openai(session, PROMPT)
            _turn(9, on_plain, on_first, [(derived, twin), (held, held_twin)])  # `held` too short to keep
            followed = _following(follower)
            followed(1)  # what the first replica derived, and kept
            _turn(10, on_plain, on_follower, [(derived, twin)])
            for n in (10, 11):  # `held` grows past what is kept, and is held (nothing due on the clock)
                _turn(n, on_plain, on_first, [(held, held_twin)])
            assert _settled(first).stats.kept == 1
            first.stop(grace=10)  # keeps both sessions held: `held` for the first time
            stopped = True
            assert _settled(first).stats.kept == 3
            followed(2)  # `held`; not `derived`, which the follower renders
            _turn(12, on_plain, on_follower, [(held, held_twin), (derived, twin)])
        stats = follower._running.carries.stats  # type: ignore[union-attr]
        assert (stats.followed, stats.loaded, stats.resumed, stats.missed, stats.refused) == (2, 2, 2, 0, 0)
    finally:
        for server in (first, follower, plain) if not stopped else (follower, plain):
            server.stop()
        backends.drop_database(postgres_server_url, url)


def _following(server: ServerThread) -> Callable[[int], None]:
    """A wait until the server has read back `n` carries other replicas kept (`followed`)."""
    carries = server._running.carries  # type: ignore[union-attr]
    assert carries is not None

    def followed(n: int) -> None:
        for _ in range(500):
            if carries.stats.followed >= n:
                break
            time.sleep(0.02)
        assert carries.stats.followed == n

    return followed


def _settled(server: ServerThread) -> KeptCarries:
    """The server's kept carries, once nothing waits to be written (the writes are off the loop)."""
    carries = server._running.carries  # type: ignore[union-attr]
    assert carries is not None
    for _ in range(500):
        if carries.idle:
            break
        time.sleep(0.02)
    assert carries.idle
    return carries


@pytest.mark.parametrize("gone", ["redacted", "deleted"])
def test_what_a_redacted_or_deleted_session_showed_is_not_kept_again_as_the_replica_stops(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, gone: str
) -> None:
    """The replica holds the session's carry (the render derived it, and kept it) when items of
    it are redacted or it is deleted: the carry in Redis goes, and the one held is not written
    back as the replica stops, nor is anything that shows the redacted text."""
    monkeypatch.setattr(kept_carries, "KEEP_FROM_ITEMS", 10)
    database = f"sqlite+aiosqlite:///{tmp_path / 'gone.db'}"
    asyncio.run(migrate.upgrade(database))
    secret = uuid.uuid4().hex
    server = ServerThread(settings_for(database, redis_url=redis_url, carry_secret=secret)).start()
    stopped = False
    try:
        with Client(server.target) as client:
            session = client.create_session().id
            told = [{"role": "user", "content": "the password is hunter2-XYZZY"}]
            client.append_openai(session, PROMPT + told + [m for n in range(1, 9) for m in _agent_turn(n)])
            client.render_view(session, ViewFormat.OPENAI_CHAT)
            _settled(server)
            assert len(_kept(redis_url, secret)) == 1
            if gone == "redacted":
                client.retract(session, [3], reason="a secret", redact=True)
            else:
                client.delete_session(session)
            assert _kept(redis_url, secret) == []
        server.stop(grace=5)  # keeps what it holds, as a replica stopping does
        stopped = True
        kept = _settled(server).stats
        assert kept.kept == 1 and kept.dropped >= 1  # written once, before; refused since
        assert _kept(redis_url, secret) == []
    finally:
        if not stopped:
            server.stop()


@pytest.mark.parametrize("render_processes", [0, 2], ids=["threads", "render-processes"])
def test_a_replica_started_in_another_s_place_reads_back_its_carries_before_it_serves(
    postgres_server_url: str, redis_url: str, render_processes: int
) -> None:
    """A rolling restart: a replica stops, keeping the carries of the sessions it held; the one
    started in its place reads them back before it says it serves, and each session's first
    render on it resumes from what was read, with no read of its own (on render processes, each
    process reads the sessions routed to it), and renders what a replica that never stopped
    renders."""
    url = backends.create_database(postgres_server_url, f"contextd_warm_start_{render_processes}")
    asyncio.run(migrate.upgrade(url))
    args = ("--database-url", url, "--no-migrate-on-start", "--redis-url", redis_url)
    kept = (
        *args,
        *("--carry-secret", uuid.uuid4().hex, "--metrics-listen", "127.0.0.1:0"),
        *("--render-processes", str(render_processes)),
    )
    steady = ServerProcess(*args).wait_serving()
    first = ServerProcess(*kept).wait_serving()
    later: ServerProcess | None = None
    try:
        with Client(steady.target, timeout=60) as on_steady:
            pairs = [  # (restarted, twin); the restarted ones routed to each render process alike
                (on_steady.create_session(chosen).id, on_steady.create_session().id)
                for chosen in _spread(4, max(1, render_processes))
            ]
            for pair in pairs:
                for session in pair:
                    on_steady.append_openai(session, PROMPT)

            def turn(n: int, renderer: Client) -> None:
                _turn(n, on_steady, renderer, pairs)

            with Client(first.target, timeout=60) as on_first:
                for n in range(1, 9):
                    turn(n, on_first)
            first.terminate()
            assert first.wait() == 0

            later = ServerProcess(*kept).wait_serving()
            read_back = [m for line in later.log if (m := WARMED.search(line))]
            assert len(read_back) == max(1, render_processes), later.log  # one line from each process that renders
            assert sum(int(m.group(1)) for m in read_back) == len(pairs)
            with Client(later.target, timeout=60) as on_later:
                for n in range(9, 12):
                    turn(n, on_later)
            urls = [m.group(1) for line in later.log if (m := METRICS.search(line))]
            scraped = [scrape(u) for u in urls]

            def total(operation: str) -> float:
                return sum(value(s, "contextd_carries_total", contextd_carry_operation=operation) for s in scraped)

            assert (total("warmed"), total("loaded"), total("resumed"), total("missed")) == (4, 4, 4, 0)
    finally:
        for server in (steady, first, later):
            if server is not None:
                server.stop()
        backends.drop_database(postgres_server_url, url)


def _spread(count: int, processes: int) -> list[str]:
    """`count` session ids of the default tenant, as many routed to each of `processes` render
    processes."""
    chosen: list[str] = []
    while len(chosen) < count:
        candidate = f"warm-{uuid.uuid4().hex[:12]}"
        if sum(route(DEFAULT_TENANT, c, processes) == route(DEFAULT_TENANT, candidate, processes) for c in chosen) < (
            count // processes
        ):
            chosen.append(candidate)
    return chosen


WARMED = re.compile(r"read back the kept carries of (\d+) of the \d+ sessions used most recently")


def _three_kept(tmp_path: Path, redis_url: str) -> Settings:
    """The settings of a replica of a deployment where another kept the carries of three sessions
    as it stopped."""
    database = f"sqlite+aiosqlite:///{tmp_path / 'warm.db'}"
    asyncio.run(migrate.upgrade(database))
    kept = settings_for(database, redis_url=redis_url, carry_secret=uuid.uuid4().hex)
    first = ServerThread(kept).start()
    try:
        with Client(first.target) as on_first:
            for _ in range(3):
                session = on_first.create_session().id
                on_first.append_openai(session, PROMPT + [m for n in range(1, 13) for m in _agent_turn(n)])
                on_first.render_view(session, ViewFormat.OPENAI_CHAT)
    finally:
        first.stop(grace=30)
    assert first._running is not None and first._running.carries is not None
    assert first._running.carries.stats.kept == 3
    return kept


def test_a_starting_replica_reads_back_carries_within_half_its_memory_or_not_at_all(
    tmp_path: Path, redis_url: str
) -> None:
    """Reading back stops once half of the sessions' memory is taken (more would let go of what was
    read, each carry written back), and `carry_warm_seconds` 0 reads none."""
    kept = _three_kept(tmp_path, redis_url)
    for settings, warmed in (
        (kept, 3),
        (replace(kept, session_cache_bytes=2 * 60_000), 1),  # about one session's
        (replace(kept, carry_warm_seconds=0), 0),
    ):
        later = ServerThread(settings).start()
        try:
            stats = later._running.carries.stats  # type: ignore[union-attr]
            assert (stats.warmed, stats.loaded, stats.refused) == (warmed, warmed, 0), settings
        finally:
            later.stop()


def test_what_a_starting_replica_had_no_time_for_it_reads_once_it_serves(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read made slow, a replica's start has time for one session's carry at most; it reads
    the others once it serves, as it follows what other replicas keep."""
    kept = _three_kept(tmp_path, redis_url)
    warm = ViewService.warm

    async def slow(self: ViewService, *args: Any, **kwargs: Any) -> bool:
        await asyncio.sleep(0.4)
        return await warm(self, *args, **kwargs)

    monkeypatch.setattr(ViewService, "warm", slow)
    later = ServerThread(replace(kept, carry_warm_seconds=0.5, carry_follow_seconds=0.05)).start()
    try:
        stats = later._running.carries.stats  # type: ignore[union-attr]
        assert stats.warmed <= 1
        for _ in range(300):  # (a read is counted loaded, then read back once its view's bytes are made)
            if (stats.warmed + stats.followed, stats.loaded) == (3, 3):
                break
            time.sleep(0.02)
        assert (stats.warmed + stats.followed, stats.loaded, stats.refused) == (3, 3, 0)
    finally:
        later.stop()
