"""The fault suite (issue 16): three `contextd serve` replicas over a Postgres cluster
and a Redis that this test starts itself on spare ports, sixteen writers appending
with idempotency keys (eight to one shared session, eight to sessions of their own,
half of them rendering views and retrieving what the views left out), and, while
they write: SIGKILL of a replica and its restart on the same port, SIGKILL of the
Redis and its restart (empty), and a stop of the Postgres (`pg_ctl stop -m smart`,
so that it shuts down refusing new connections, then `-m fast`) and its start.

Afterwards, on the recovered services: every acknowledged append is stored exactly
once, where it was acknowledged; seqs are dense; every handle any view showed is
retrievable; the certificate chains verify; and no call was answered INTERNAL or
UNKNOWN. The run is bounded: every wait has a timeout, the whole module takes
about a minute, and every process it started is killed in a finally.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import random
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from contextd.api.auth import DEFAULT_TENANT
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.view_service import ViewService
from contextd_client import AppendResult, Certificate, Client, ContextdError, RetryPolicy, View, ViewFormat
from contextd_client.formats import items_from_openai
from contextd_client.v1 import content_pb2 as pb
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore
from tests.integration.clusters import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

T = TypeVar("T")

REPLICAS = 3
SHARED_WRITERS = 8
OWN_WRITERS = 8
RENDER_EVERY = 3
"""A rendering writer renders (and retrieves a handle) after every third batch."""
PAUSE = 0.1
"""Seconds a writer rests between batches."""

# Seconds of each phase of the run, in order.
WARM_UP = 4.0
REPLICA_DOWN = 2.0
REDIS_DOWN = 3.0
POSTGRES_SHUTTING_DOWN = 1.5
POSTGRES_DOWN = 5.0
COOL_DOWN = 4.0
PROGRESS_TIMEOUT = 45.0
"""Longest wait, after each recovery, for the writers to get appends acknowledged again."""
PROGRESS_BATCHES = 10

TRY_TIMEOUT = 8.0
"""Deadline of each try, in seconds (above the replicas' 3 s lock timeout)."""
RETRY = RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=1.0)
"""Each client rides out several seconds of its replica's outage (longer with the
server's retry-after hint) before the writer turns to the next replica."""
OPERATION_BUDGET = 45.0
"""Longest a writer keeps at one operation, across replicas, before it gives up."""
CHANNEL_OPTIONS = (
    # A restarted replica is found again within a second, not after gRPC's growing backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
RIDDEN_OUT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL", "UNKNOWN"})
"""Codes a writer answers by turning to the next replica. INTERNAL and UNKNOWN are among
them only so that the run goes on and measures everything else; the last test fails on them."""
FORBIDDEN = frozenset({"INTERNAL", "UNKNOWN"})


# ------------------------------------------------------------------ outcomes


class Outcomes:
    """Every call's outcome, by phase of the run, method and status code.

    A failed call counts once per error the client raised, that is after the
    client's own retries: those retry only codes of a call the service could
    not take (UNAVAILABLE, CANCELLED, and DEADLINE_EXCEEDED for writes), so
    every INTERNAL or UNKNOWN answer reaches this count. It is counted in the
    phase the client gave up in, a moment after its last try.
    """

    def __init__(self) -> None:
        self.phases = ["setup"]
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.samples: dict[tuple[str, str], list[str]] = {}
        self._lock = threading.Lock()

    @property
    def phase(self) -> str:
        return self.phases[-1]

    def enter(self, phase: str) -> None:
        self.phases.append(phase)

    def answered(self, method: str) -> None:
        with self._lock:
            self.counts[self.phase, method, "OK"] += 1

    def failed(self, method: str, code: str, message: str) -> None:
        with self._lock:
            self.counts[self.phase, method, code] += 1
            seen = self.samples.setdefault((code, method), [])
            if message not in seen and len(seen) < 5:
                seen.append(message)

    def codes(self) -> Counter[str]:
        totals: Counter[str] = Counter()
        for (_, _, code), n in self.counts.items():
            totals[code] += n
        return totals

    def table(self, codes: frozenset[str] | None = None) -> str:
        """One line per phase, method and code (in the run's order), then sample messages."""
        order = {phase: n for n, phase in enumerate(self.phases)}
        rows = sorted(
            ((k, n) for k, n in self.counts.items() if codes is None or k[2] in codes),
            key=lambda row: (order[row[0][0]], row[0][1], row[0][2]),
        )
        lines = [f"  {phase:<20} {method:<12} {code:<24} {n:>6}" for (phase, method, code), n in rows]
        for (code, method), messages in sorted(self.samples.items()):
            if codes is None or code in codes:
                lines += [f"  {code} {method}: {m}" for m in messages]
        return "\n".join(lines)


# ------------------------------------------------------------------- writers


@dataclass
class Batch:
    key: str
    """Its idempotency key; the text of its first item begins with it."""
    items: list[pb.Item]
    originals: list[str]
    """What Retrieve by seq must give back for each item."""
    acked: AppendResult | None = None


def _batch(session_id: str, writer: int, n: int) -> Batch:
    key = f"{session_id}-w{writer}-b{n}"
    if n % 2 == 0:  # a turn of talk: one or two user items
        texts = [f"{key}: go on"] + ([f"{key}: and carry on"] if n % 4 == 0 else [])
        return Batch(key, items_from_openai([{"role": "user", "content": t} for t in texts]), texts)
    # A tool call with a long log: the default policy compresses older ones and keeps
    # them by handle; every other one repeats the writer's last log byte for byte.
    log = "".join(f"INFO step {k} of writer {writer}: compiled module {k % 7} in 0.{k % 10}s\n" for k in range(60))
    output = f"build log {n if n % 4 == 1 else 'again'} of writer {writer}\n{log}WARNING nothing to do\n"
    arguments, call_id = json.dumps({"marker": key}), f"call_{key}"
    call = {"id": call_id, "type": "function", "function": {"name": "run_build", "arguments": arguments}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"{key}: build it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]
    return Batch(key, items_from_openai(messages), [f"{key}: build it", f"run_build {arguments}", output])


@dataclass
class Writer:
    number: int
    session_id: str
    renders: bool
    batches: list[Batch] = field(default_factory=list)
    handles: dict[str, int] = field(default_factory=dict)
    """Handle -> seq of every non-full item of every view this writer rendered."""
    certificates: dict[int, str] = field(default_factory=dict)
    """Number -> hash of every certificate those views carried."""
    failure: str = ""
    home: int = 0
    """The replica this writer calls now."""

    def call(self, clients: list[Client], outcomes: Outcomes, method: str, send: Callable[[Client], T]) -> T:
        """`send` to this writer's replica, turning to the next one on a failure a replica can cause."""
        deadline = time.monotonic() + OPERATION_BUDGET
        while True:
            try:
                answer = send(clients[self.home])
            except ContextdError as error:
                outcomes.failed(method, error.code, error.message)
                if error.code not in RIDDEN_OUT or time.monotonic() > deadline:
                    raise
                self.home = (self.home + 1) % len(clients)
                time.sleep(0.1)
            else:
                outcomes.answered(method)
                return answer

    def run(self, targets: list[str], outcomes: Outcomes, stop: threading.Event, acks: list[float]) -> None:
        self.home = self.number % len(targets)
        clients = [Client(t, timeout=TRY_TIMEOUT, retry=RETRY, options=CHANNEL_OPTIONS) for t in targets]
        try:
            for n in itertools.count():
                if stop.is_set():
                    return
                self._append(clients, outcomes, _batch(self.session_id, self.number, n))
                acks.append(time.monotonic())
                if self.renders and n % RENDER_EVERY == RENDER_EVERY - 1:
                    self._render_and_retrieve(clients, outcomes, n)
                stop.wait(PAUSE)
        except Exception as exc:
            self.failure = "".join(traceback.format_exception(exc))
            if not isinstance(exc, ContextdError):
                outcomes.failed("(client)", f"EXCEPTION {type(exc).__name__}", str(exc))
        finally:
            for client in clients:
                client.close()

    def _append(self, clients: list[Client], outcomes: Outcomes, batch: Batch) -> None:
        self.batches.append(batch)
        batch.acked = self.call(
            clients,
            outcomes,
            "AppendItems",
            lambda c: c.append_items(self.session_id, batch.items, idempotency_key=batch.key),
        )

    def _render_and_retrieve(self, clients: list[Client], outcomes: Outcomes, n: int) -> None:
        shared = self.session_id.startswith("shared")
        fmt = ViewFormat.OPENAI_CHAT if shared or n % 2 == 0 else ViewFormat.ANTHROPIC_MESSAGES
        view = self.call(clients, outcomes, "RenderView", lambda c: c.render_view(self.session_id, fmt))
        self.record(view)
        if self.handles:
            handle = random.choice(list(self.handles))
            self.call(clients, outcomes, "Retrieve", lambda c: c.retrieve(self.session_id, handle))

    def record(self, view: View) -> None:
        self.handles |= _handles(view)
        self.certificates |= {c.number: c.hash for c in view.certificates if c.number > 0}


# ----------------------------------------------------------------------- run


@dataclass
class FaultRun:
    cluster: Cluster
    writers: list[Writer]
    outcomes: Outcomes
    timeline: list[str]
    stuck: list[int]
    """Writers still in a call when the run had ended and waited for them."""

    @property
    def sessions(self) -> list[str]:
        return sorted({w.session_id for w in self.writers})

    def summary(self) -> str:
        return "timeline:\n" + "\n".join(self.timeline) + "\noutcomes:\n" + self.outcomes.table()


def _drive_faults(cluster: Cluster, outcomes: Outcomes, acks: list[float], timeline: list[str]) -> None:
    started = time.monotonic()

    def phase(name: str) -> None:
        outcomes.enter(name)
        timeline.append(f"  {time.monotonic() - started:6.1f}s  {name} ({len(acks)} batches acknowledged so far)")

    def progress(name: str) -> None:
        """Wait until appends are acknowledged again: the service has recovered."""
        before, deadline = len(acks), time.monotonic() + PROGRESS_TIMEOUT
        while len(acks) - before < PROGRESS_BATCHES:
            if time.monotonic() > deadline:
                timeline.append(
                    f"  !! {len(acks) - before} appends acknowledged in {PROGRESS_TIMEOUT:.0f} s after {name}"
                )
                return
            time.sleep(0.1)
        phase(f"recovered:{name}")

    phase("warm-up")
    time.sleep(WARM_UP)
    phase("replica-killed")
    cluster.kill_replica(1)
    time.sleep(REPLICA_DOWN)
    phase("replica-restarting")
    cluster.restart_replica(1)
    progress("replica")
    time.sleep(WARM_UP / 2)
    phase("redis-killed")
    cluster.redis.kill()
    time.sleep(REDIS_DOWN)
    phase("redis-restarted")
    cluster.redis.start()
    progress("redis")
    time.sleep(WARM_UP / 2)
    # First a smart stop, not waited for: the server refuses new connections as it shuts
    # down while the pools' open ones go on; then a fast stop ends them.
    phase("postgres-shutting-down")
    cluster.postgres.stop("smart", wait=False)
    time.sleep(POSTGRES_SHUTTING_DOWN)
    phase("postgres-down")
    cluster.postgres.stop("fast")
    time.sleep(POSTGRES_DOWN)
    phase("postgres-starting")
    cluster.postgres.start()
    phase("postgres-started")
    progress("postgres")
    time.sleep(COOL_DOWN)
    phase("writers-stopping")


@pytest.fixture(scope="module")
def run() -> Iterator[FaultRun]:
    cluster = Cluster(REPLICAS)
    outcomes = Outcomes()
    stop = threading.Event()
    try:
        cluster.start()
        tag = uuid.uuid4().hex[:6]
        writers = [Writer(n, f"shared-{tag}", renders=n % 2 == 0) for n in range(SHARED_WRITERS)]
        writers += [
            Writer(n, f"own-{tag}-{n}", renders=n % 2 == 0) for n in range(SHARED_WRITERS, SHARED_WRITERS + OWN_WRITERS)
        ]
        with Client(cluster.targets[0], timeout=TRY_TIMEOUT, retry=RETRY) as client:
            for session_id in sorted({w.session_id for w in writers}):
                client.create_session(session_id)
        acks: list[float] = []
        timeline: list[str] = []
        threads = [
            threading.Thread(target=w.run, args=(cluster.targets, outcomes, stop, acks), daemon=True) for w in writers
        ]
        for thread in threads:
            thread.start()
        try:
            _drive_faults(cluster, outcomes, acks, timeline)
        finally:
            stop.set()
            deadline = time.monotonic() + OPERATION_BUDGET + 15
            for thread in threads:
                thread.join(max(0.1, deadline - time.monotonic()))
        stuck = [w.number for w, t in zip(writers, threads, strict=True) if t.is_alive()]
        outcomes.enter("verification")
        timeline.append(f"  writers stopped; {len(acks)} batches acknowledged in all")
        yield FaultRun(cluster, writers, outcomes, timeline, stuck)
    finally:
        stop.set()
        cluster.stop()


# ------------------------------------------------------------------ read-back


@dataclass
class Stored:
    """A session as the recovered service holds it."""

    version: int
    view: View
    """A view rendered after the run (its handles and certificates are checked too)."""
    originals: dict[int, str]
    """Seq -> the whole original, from Retrieve by seq."""


def _checker(home: int = 0) -> Writer:
    """A writer that writes nothing: the checks' calls rotate over replicas and count like the writers'.
    `home`: the replica it calls first (the read-backs spread their calls over all of them, each
    answering from the shared Postgres, so that no single replica takes them all)."""
    checker = Writer(-1, "", renders=False)
    checker.home = home
    return checker


def _read_session(outcomes: Outcomes, clients: list[Client], session_id: str) -> Stored:
    checker = _checker()
    session = checker.call(clients, outcomes, "GetSession", lambda c: c.get_session(session_id))
    view = checker.call(clients, outcomes, "RenderView", lambda c: c.render_view(session_id, ViewFormat.OPENAI_CHAT))

    def original(seq: int) -> tuple[int, str]:
        reader = _checker(home=seq % len(clients))
        page = reader.call(clients, outcomes, "Retrieve", lambda c: c.retrieve(session_id, seq=seq))
        assert page.seq == seq and page.next_offset == page.total_tokens, f"{session_id} seq {seq}: not one page"
        return seq, page.content

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        originals = dict(pool.map(original, range(1, session.version + 1)))
    return Stored(session.version, view, originals)


@pytest.fixture(scope="module")
def stored(run: FaultRun) -> Iterator[dict[str, Stored]]:
    clients = [Client(t, timeout=TRY_TIMEOUT, retry=RETRY, options=CHANNEL_OPTIONS) for t in run.cluster.targets]
    try:
        yield {s: _read_session(run.outcomes, clients, s) for s in run.sessions}
    finally:
        for client in clients:
            client.close()


def _batches_stored(run: FaultRun, session_id: str, stored: Stored) -> tuple[list[tuple[int, Batch]], list[str]]:
    """The session's items as the batches that wrote them, (first seq, batch) in seq order,
    and every stretch of items that is not a whole batch some writer sent."""
    sent = {b.originals[0]: b for w in run.writers if w.session_id == session_id for b in w.batches}
    found: list[tuple[int, Batch]] = []
    problems: list[str] = []
    seq = 1
    while seq <= stored.version:
        batch = sent.get(stored.originals.get(seq, ""))
        if batch is None:
            problems.append(f"{session_id} seq {seq}: {stored.originals.get(seq, '')[:70]!r} begins no batch sent")
            seq += 1
            continue
        got = [stored.originals.get(seq + k) for k in range(len(batch.originals))]
        if got != batch.originals:
            problems.append(f"{session_id} seq {seq}: batch {batch.key} stored torn or altered")
        found.append((seq, batch))
        seq += len(batch.originals)
    return found, problems


# --------------------------------------------------------------------- tests


def test_the_faults_happened_and_every_writer_finished(run: FaultRun) -> None:
    print(run.summary())
    assert not [line for line in run.timeline if line.lstrip().startswith("!!")], run.summary()
    assert not run.stuck, f"writers {run.stuck} still in a call after the run had waited for them\n{run.summary()}"
    failed = {w.number: w.failure.strip().splitlines()[-1] for w in run.writers if w.failure}
    assert not failed, f"writers gave up: {failed}\n{run.summary()}"
    recovered = ["recovered:replica", "recovered:redis", "recovered:postgres", "writers-stopping"]
    assert [p for p in run.outcomes.phases if p in recovered] == recovered, run.summary()


def test_every_acknowledged_append_is_stored_exactly_once_where_it_was_acknowledged(
    run: FaultRun, stored: dict[str, Stored]
) -> None:
    problems: list[str] = []
    acknowledged = 0
    for session_id in run.sessions:
        found, torn = _batches_stored(run, session_id, stored[session_id])
        problems += torn
        where = Counter(batch.key for _, batch in found)
        problems += [f"{session_id}: batch {key} stored {n} times" for key, n in where.items() if n > 1]
        first_seq = {batch.key: seq for seq, batch in found}
        for writer in (w for w in run.writers if w.session_id == session_id):
            for batch in writer.batches:
                if batch.acked is None:
                    continue
                acknowledged += 1
                result = batch.acked
                if result.last_seq - result.first_seq + 1 != len(batch.items):
                    problems.append(f"{batch.key}: acknowledged as seqs {result.first_seq}..{result.last_seq}")
                if first_seq.get(batch.key) != result.first_seq:
                    problems.append(
                        f"{batch.key}: acknowledged at seq {result.first_seq}, stored at {first_seq.get(batch.key)}"
                    )
    print(f"{acknowledged} acknowledged appends, {sum(k.version for k in stored.values())} items, checked")
    assert acknowledged > 0
    listed = "\n".join(problems[:40])
    assert not problems, f"{len(problems)} problems in {acknowledged} acknowledged appends:\n{listed}"


def test_seqs_are_dense(run: FaultRun, stored: dict[str, Stored]) -> None:
    for session_id in run.sessions:
        session = stored[session_id]
        seqs = [i.seq for i in session.view.items]
        assert session.view.version == session.version, session_id
        assert seqs == list(range(1, session.version + 1)), f"{session_id}: the view's seqs are not 1..version"
        assert sorted(session.originals) == seqs, session_id
        acked = [
            seq
            for w in run.writers
            if w.session_id == session_id
            for b in w.batches
            if b.acked is not None
            for seq in range(b.acked.first_seq, b.acked.last_seq + 1)
        ]
        assert len(acked) == len(set(acked)), f"{session_id}: two appends acknowledged with the same seq"
        assert set(acked) <= set(seqs), f"{session_id}: acknowledged past the session's version"


def _handles(view: View) -> dict[str, int]:
    """Handle -> seq of every item the view shows by handle (not in full)."""
    return {i.handle: i.seq for i in view.items if i.handle and i.representation != "full"}


def test_every_handle_of_every_view_is_retrievable(run: FaultRun, stored: dict[str, Stored]) -> None:
    wanted = {(w.session_id, h, seq) for w in run.writers for h, seq in w.handles.items()}
    wanted |= {(s, h, seq) for s, kept in stored.items() for h, seq in _handles(kept.view).items()}
    per_session = Counter(s for s, _, _ in wanted)
    print(f"{len(wanted)} handles to retrieve, per session: {dict(per_session)}")
    assert set(per_session) == set(run.sessions), f"sessions whose views showed no handle: {per_session}"
    clients = [Client(t, timeout=TRY_TIMEOUT, retry=RETRY, options=CHANNEL_OPTIONS) for t in run.cluster.targets]

    def check(entry: tuple[str, str, int]) -> str:
        session_id, handle, seq = entry
        reader = _checker(home=seq % len(clients))
        try:
            page = reader.call(clients, run.outcomes, "Retrieve", lambda c: c.retrieve(session_id, handle))
        except ContextdError as error:
            return f"{session_id} handle {handle} (seq {seq}): {error}"
        if (page.seq, page.content) != (seq, stored[session_id].originals[seq]):
            return f"{session_id} handle {handle}: seq {page.seq}, {page.content[:60]!r}, not seq {seq}'s original"
        return ""

    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            problems = [p for p in pool.map(check, sorted(wanted)) if p]
    finally:
        for client in clients:
            client.close()
    assert not problems, f"{len(problems)} of {len(wanted)} handles not retrievable:\n" + "\n".join(problems[:40])


async def _verify_chains(url: str, sessions: list[str]) -> dict[str, tuple[int, int | None]]:
    """(certificates checked, the first broken or None) of each session, recomputed from the
    durable record as `contextd certificates verify` does."""
    db = Database(url, pool_size=2)
    service = ViewService(HistoryStore(db), TiktokenCounter(), TransformRegistry.default())
    try:
        return {s: await service.verify(DEFAULT_TENANT, s) for s in sessions}
    finally:
        await db.close()


def test_certificate_chains_verify(run: FaultRun, stored: dict[str, Stored]) -> None:
    chains = asyncio.run(_verify_chains(run.cluster.postgres.url, run.sessions))
    print(f"certificates per session: { {s: checked for s, (checked, _) in chains.items()} }")
    broken = {s: (checked, at) for s, (checked, at) in chains.items() if at is not None}
    assert not broken, f"chains broken (certificates checked, first broken): {broken}"
    assert sum(checked for checked, _ in chains.values()) > 0, "no certificate was written: nothing was checked"

    clients = [Client(t, timeout=TRY_TIMEOUT, retry=RETRY, options=CHANNEL_OPTIONS) for t in run.cluster.targets]
    checker = _checker()

    def certificates(session_id: str) -> list[Certificate]:
        return checker.call(clients, run.outcomes, "ListCertificates", lambda c: list(c.list_certificates(session_id)))

    try:
        for session_id in run.sessions:
            listed = certificates(session_id)
            assert [c.number for c in listed] == list(range(1, chains[session_id][0] + 1)), session_id
            for previous, cert in itertools.pairwise(listed):
                assert cert.previous_hash == previous.hash, f"{session_id}: certificate {cert.number} unlinked"
            # Every decision a view was answered with is in the log, as it was shown.
            logged = {c.number: c.hash for c in listed}
            carried = [w.certificates for w in run.writers if w.session_id == session_id]
            carried.append({c.number: c.hash for c in stored[session_id].view.certificates if c.number > 0})
            lost = {n: h for seen in carried for n, h in seen.items() if logged.get(n) != h}
            assert not lost, f"{session_id}: certificates views carried that the log does not hold: {lost}"
    finally:
        for client in clients:
            client.close()


def test_no_call_was_answered_internal_or_unknown(run: FaultRun) -> None:
    codes = run.outcomes.codes()
    forbidden = {code: n for code, n in codes.items() if code in FORBIDDEN or code.startswith("EXCEPTION")}
    logged = "\n".join(f"  {n:>5} x {line}" for line, n in run.cluster.logged_failures().most_common(20))
    assert not forbidden, (
        f"calls answered {forbidden} (every outcome: {dict(codes)}):\n"
        + run.outcomes.table(frozenset(forbidden))
        + f"\nwhat the replicas logged as failed:\n{logged}"
    )


def test_the_outages_were_logged_briefly_and_without_tracebacks(run: FaultRun) -> None:
    """Expected unavailability is logged once when it starts and then counted: no traceback,
    and a few kilobytes per replica for the whole run (not a line per failed call)."""
    for replica in run.cluster.started:
        text = "\n".join(replica.log)
        assert len(text.encode()) < 64 * 1024, f"{len(text.encode()):,} bytes logged:\n{text[-3000:]}"
        assert "Traceback" not in text, text[-3000:]
