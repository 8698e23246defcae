"""WatchSession through the service: every kind of change reaches a watcher, in order,
with what it did; a watch resumes from any cursor with nothing lost or repeated; bad
cursors, unknown sessions and expired events are refused clearly; tenants see only
their own events; a slow watcher is cut off without slowing anyone; a heartbeat keeps
an idle watcher's cursor current."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest

from contextd import admin
from contextd_client import AsyncClient, Client, ContextdError, SessionEvent, Usage, ViewFormat, Watch
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for
from tests.service.api.test_recovery import MASK_OLD
from tests.service.api.test_view_engine import conversation

MakeServer = Callable[..., ServerThread]


class Collector:
    """A watch read on a thread of its own, its events in a queue."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.events: queue.Queue[SessionEvent | BaseException | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.watch:
                self.events.put(event)
            self.events.put(None)  # ended by the server
        except BaseException as exc:
            self.events.put(exc)

    def take(self, n: int, timeout: float = 20) -> list[SessionEvent]:
        taken: list[SessionEvent] = []
        deadline = time.monotonic() + timeout
        while len(taken) < n:
            got = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(got, BaseException):
                raise got
            assert got is not None, f"the watch ended after {[e.kind for e in taken]}"
            taken.append(got)
        return taken

    def until_end(self, timeout: float = 20) -> list[SessionEvent]:
        """Every event up to the end of the watch (the server ended it)."""
        taken: list[SessionEvent] = []
        deadline = time.monotonic() + timeout
        while (got := self.events.get(timeout=max(0.01, deadline - time.monotonic()))) is not None:
            if isinstance(got, BaseException):
                raise got
            taken.append(got)
        return taken

    def close(self) -> None:
        self.watch.close()
        self.thread.join(10)


@pytest.fixture
def collect() -> Iterator[Callable[[Watch], Collector]]:
    made: list[Collector] = []

    def make(watch: Watch) -> Collector:
        made.append(Collector(watch))
        return made[-1]

    yield make
    for collector in made:
        collector.close()


def started(client: Client, session_id: str = "", **options: object) -> Watch:
    """A watch that has joined the service (its opening heartbeat read), so nothing after this is missed."""
    watch = client.watch_session(session_id, heartbeats=True, **options)  # type: ignore[arg-type]
    opening = next(iter(watch))
    assert opening.kind == "heartbeat" and opening.cursor
    return watch


KINDS_IN_ORDER = [
    "items_appended",
    "view_rendered",
    "decisions_made",
    "handle_retrieved",
    "items_pinned",
    "items_unpinned",
    "prune_proposed",
    "items_retracted",
    "usage_reported",
    "policy_updated",
    "session_deleted",
]


def test_every_change_reaches_the_watcher_in_order_with_what_it_did(
    client: Client, collect: Callable[[Watch], Collector]
) -> None:
    session = client.create_session(f"watch-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
    stream = collect(started(client, session))
    conversation(client, session, rounds=3)
    view = client.render_view(session, ViewFormat.OPENAI_CHAT)
    pruned = [c for c in view.certificates if c.decision == "prune"]
    client.retrieve(session, pruned[0].handle)
    client.pin(session, [2])
    client.unpin(session, [2])
    outcomes = client.propose_prune(session, [3, 5], "the calls are known")
    client.retract(session, [8], reason="taken back", redact=True)
    client.report_usage(session, view.view_version, Usage("anthropic", "m", 100, 10, 50, 5))
    updated = client.update_session(session, policy="protection: {last_turns: 2}")
    client.delete_session(session)

    # A watch of one session ends with the session.
    seen = [e for e in stream.until_end() if e.kind != "heartbeat"]
    assert [e.kind for e in seen] == KINDS_IN_ORDER
    assert all(e.session_id == session for e in seen)
    assert len({e.cursor for e in seen}) == len(seen)
    got = {e.kind: e.details for e in seen}
    appended = got["items_appended"]
    assert (appended["first_seq"], appended["last_seq"], appended["author"]) == (1, 8, "")
    assert appended["tokens"] > 0 and appended["bytes"] > 0
    rendered = got["view_rendered"]
    assert (rendered["view_version"], rendered["format"], rendered["model_call"]) == (
        view.view_version,
        "openai_chat",
        True,
    )
    assert rendered["tokens_sent"] == view.total_tokens
    assert rendered["tokens_removed"] == sum(c.tokens_removed - c.placeholder_tokens for c in pruned) > 0
    decided = got["decisions_made"]
    assert decided["total"] == len(view.certificates)
    assert [(d["seq"], d["outcome"], d["reason"]) for d in decided["decisions"]] == [
        (c.seq, c.decision, c.reason) for c in view.certificates
    ]
    assert got["handle_retrieved"] == {"handle": pruned[0].handle, "seq": pruned[0].seq, "served_from": "stash"}
    assert got["items_pinned"] == {"seqs": [2]} == got["items_unpinned"]
    accepted = [o.seq for o in outcomes if o.accepted]
    assert accepted and got["prune_proposed"] == {"seqs": accepted, "reason": "the calls are known"}
    assert got["items_retracted"] == {"seqs": [8], "reason": "taken back", "redacted": True}
    assert got["usage_reported"] == {
        "view_version": view.view_version,
        "provider": "anthropic",
        "model": "m",
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_read_tokens": 50,
        "cache_write_tokens": 5,
    }
    assert got["policy_updated"] == {"policy_version": updated.policy_version}
    assert got["session_deleted"] == {"items_deleted": 8}


def _changes(client: Client, session: str, n: int) -> None:
    for k in range(n):
        client.append_items(
            session, [pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=f"m{k}"))])]
        )


def test_a_watch_resumed_from_any_cursor_gets_every_later_event_once(client: Client) -> None:
    session = client.create_session(f"resume-{uuid.uuid4().hex[:10]}").id
    _changes(client, session, 6)
    client.pin(session, [1, 2])
    client.delete_session(session)
    everything = list(client.watch_session(session, cursor="0-0"))  # the oldest retained on
    assert [e.kind for e in everything] == ["session_created"] + ["items_appended"] * 6 + [
        "items_pinned",
        "session_deleted",
    ]
    assert [e.details["first_seq"] for e in everything[1:7]] == [1, 2, 3, 4, 5, 6]
    for n, event in enumerate(everything[:-1]):
        rest = list(client.watch_session(session, cursor=event.cursor))
        assert [e.cursor for e in rest] == [e.cursor for e in everything[n + 1 :]]
    with pytest.raises(ContextdError) as gone:  # past its deletion, the session is simply not there
        next(iter(client.watch_session(session, cursor=everything[-1].cursor)))
    assert gone.value.code == "NOT_FOUND"


def test_bad_cursors_and_unknown_sessions_are_refused_before_anything_streams(client: Client) -> None:
    for cursor in ("x", "1-", "-1-2", "1-2-3", "99999999999999999999-1", "1 -2"):
        with pytest.raises(ContextdError) as bad:
            next(iter(client.watch_session("", cursor=cursor)))
        assert (bad.value.code, bad.value.reason, bad.value.metadata.get("field")) == (
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT",
            "cursor",
        ), cursor
    with pytest.raises(ContextdError) as missing:
        next(iter(client.watch_session("no-such-session")))
    assert (missing.value.code, missing.value.reason) == ("NOT_FOUND", "SESSION_NOT_FOUND")
    with pytest.raises(ContextdError) as malformed:
        next(iter(client.watch_session("bad id!")))
    assert malformed.value.code == "INVALID_ARGUMENT"


def test_events_past_retention_are_refused_naming_where_the_kept_ones_begin(make_server: MakeServer) -> None:
    server = make_server(watch_retention_seconds=1)
    with Client(server.target) as client:
        session = client.create_session().id
        _changes(client, session, 2)
        first = next(iter(client.watch_session(session, cursor="0-0")))
        time.sleep(1.2)  # past the window; the server prunes every tenth of it
        _changes(client, session, 1)
        deadline = time.monotonic() + 20
        refused: ContextdError | None = None
        while refused is None:
            try:
                next(iter(client.watch_session(session, cursor=first.cursor)))
            except ContextdError as expired:
                refused = expired
                break
            assert time.monotonic() < deadline, "the events past the window were never pruned"
            time.sleep(0.1)
        assert (refused.code, refused.reason) == ("OUT_OF_RANGE", "EVENTS_EXPIRED")
        oldest = refused.metadata["oldest_cursor"]
        assert oldest in str(refused)
        kept = next(iter(client.watch_session(session, cursor=oldest)))
        assert (kept.kind, kept.details["first_seq"]) == ("items_appended", 3)


def test_a_tenant_sees_only_its_own_events(make_server: MakeServer, collect: Callable[[Watch], Collector]) -> None:
    server = make_server(api_keys="a:key-a,b:key-b")
    with Client(server.target, api_key="key-a") as a, Client(server.target, api_key="key-b") as b:
        theirs = a.create_session().id
        with pytest.raises(ContextdError) as hidden:
            next(iter(b.watch_session(theirs)))
        assert hidden.value.code == "NOT_FOUND"
        everything_of_b = collect(started(b))
        _changes(a, theirs, 3)
        mine = b.create_session().id
        _changes(b, mine, 1)
        seen = everything_of_b.take(2)
        assert [(e.kind, e.session_id) for e in seen] == [("session_created", mine), ("items_appended", mine)]


def test_an_idle_watch_gets_heartbeats_whose_cursor_resumes_after_what_it_saw(make_server: MakeServer) -> None:
    server = make_server(watch_heartbeat_seconds=0.3)
    with Client(server.target) as client:
        session = client.create_session().id
        watch = client.watch_session(session, heartbeats=True)
        answers = iter(watch)
        assert next(answers).kind == "heartbeat"
        _changes(client, session, 1)
        assert next(e for e in answers if e.kind != "heartbeat").kind == "items_appended"
        beat = next(answers)  # nothing else happens: the next answer is a heartbeat
        assert beat.kind == "heartbeat" and beat.session_id == ""
        watch.close()
        _changes(client, session, 1)
        client.delete_session(session)
        after = list(client.watch_session(session, cursor=beat.cursor))
        assert [(e.kind, e.details.get("first_seq")) for e in after] == [
            ("items_appended", 2),
            ("session_deleted", None),
        ]


def test_a_tenant_has_at_most_its_number_of_watches(make_server: MakeServer) -> None:
    server = make_server(watch_max_per_tenant=1)
    with Client(server.target) as client:
        first = started(client)
        with pytest.raises(ContextdError) as refused:
            next(iter(client.watch_session("")))
        assert (refused.value.code, refused.value.reason) == ("RESOURCE_EXHAUSTED", "TOO_MANY_WATCHES")
        first.close()
        deadline = time.monotonic() + 20
        while True:  # the slot is free again, once the server has seen the stream go
            try:
                started(client).close()
                break
            except ContextdError:
                assert time.monotonic() < deadline
                time.sleep(0.1)


def test_a_stopping_server_ends_its_watches_at_once_for_them_to_resume_elsewhere(sqlite_url: str) -> None:
    server = ServerThread(settings_for(sqlite_url)).start()
    with grpc.insecure_channel(server.target) as channel:
        stream = contextd_pb2_grpc.ContextServiceStub(channel).WatchSession(api.WatchSessionRequest())
        assert next(stream).HasField("heartbeat")
        began = time.monotonic()
        server.stop(grace=10)
        assert time.monotonic() - began < 5  # not held for the grace period
        with pytest.raises(grpc.RpcError) as ended:
            next(stream)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(ended.value.trailing_metadata() or ())["contextd-reason"] == "SERVER_STOPPING"


def test_the_asyncio_client_watches_too(server: ServerThread) -> None:
    async def run() -> list[str]:
        async with AsyncClient(server.target) as client:
            session = (await client.create_session()).id
            watch = client.watch_session(session, heartbeats=True)
            seen: list[str] = []
            watching = asyncio.Event()

            async def read() -> None:
                async for event in watch:
                    if event.kind == "heartbeat":  # the first answer: the watch stands from now on
                        watching.set()
                    else:
                        seen.append(event.kind)

            reading = asyncio.create_task(read())
            await asyncio.wait_for(watching.wait(), 20)
            await client.append_items(
                session, [pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="hi"))])]
            )
            await client.delete_session(session)
            await asyncio.wait_for(reading, 20)
            return seen

    assert asyncio.run(run()) == ["items_appended", "session_deleted"]


def test_a_render_that_applies_deferred_edits_says_which(make_server: MakeServer) -> None:
    server = make_server()
    with Client(server.target) as client:
        session = client.create_session().id
        conversation(client, session, rounds=8)
        client.append_openai(session, [{"role": "user", "content": "context " * 20_000}])
        client.render_view(session, ViewFormat.OPENAI_CHAT)  # cached now: early prunes would cost
        policy = (
            "protection: {last_turns: 1}\nevidence: {max_level: 4}\n"
            "rules: [{name: m, transform: mask, when: {roles: [tool]}}]"
        )
        client.update_session(session, policy=policy)
        warm = client.render_view(session, ViewFormat.OPENAI_CHAT)
        deferred = sorted(c.seq for c in warm.certificates if c.decision == "defer")
        assert deferred
        watch = started(client, session)
        # The operator applies what waits (from its own process: the event reaches the server's watchers).
        assert admin.prune(server.settings, "default", session, "openai_chat", 0, apply=True) == 0
        seen = [e for e in _until(watch, "deferred_applied") if e.kind != "heartbeat"]
        assert [e.kind for e in seen] == ["view_rendered", "decisions_made", "deferred_applied"]
        assert seen[0].details["model_call"] is False
        assert seen[2].details["seqs"] == deferred
        watch.close()


def _until(watch: Watch, kind: str) -> list[SessionEvent]:
    seen: list[SessionEvent] = []
    for event in watch:
        seen.append(event)
        if event.kind == kind:
            return seen
    raise AssertionError(f"the watch ended before {kind}: {[e.kind for e in seen]}")


def test_a_server_with_events_off_records_none_and_refuses_watches(make_server: MakeServer) -> None:
    import sqlite3

    server = make_server(watch_events=False)
    with Client(server.target) as client:
        session = client.create_session().id
        _changes(client, session, 3)
        client.render_view(session, ViewFormat.OPENAI_CHAT)
        with pytest.raises(ContextdError) as refused:
            next(iter(client.watch_session(session)))
        assert (refused.value.code, refused.value.reason) == ("FAILED_PRECONDITION", "EVENTS_OFF")
    with sqlite3.connect(server.settings.database_url.removeprefix("sqlite+aiosqlite:///")) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM items").fetchone() == (3,)
