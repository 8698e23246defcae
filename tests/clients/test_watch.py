"""The client's watch, pure: its cursor follows every answer, heartbeats stay out unless
asked for, a lagging or lost stream is resumed, and what resuming cannot fix is raised."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from contextd_client import ContextdError, RetryPolicy
from contextd_client._watch import Watch, WatchProgress, event_from_proto
from contextd_client.v1 import contextd_pb2 as api
from tests.clients.test_retry import FakeError

Code = grpc.StatusCode


def progress(heartbeats: bool = False, budget: float = 30.0) -> tuple[WatchProgress, list[float]]:
    now = [0.0]
    return WatchProgress("s", "", RetryPolicy(budget=budget), heartbeats, lambda: now[0]), now


def rendered(cursor: str) -> api.WatchSessionResponse:
    return api.WatchSessionResponse(
        cursor=cursor,
        session_id="s",
        time=Timestamp(seconds=1_800_000_000),
        view_rendered=api.ViewRendered(view_version=3, format=api.VIEW_FORMAT_ANTHROPIC_MESSAGES, tokens_sent=120),
    )


def test_the_cursor_follows_every_answer_and_heartbeats_stay_out_unless_asked() -> None:
    watching, _ = progress()
    assert watching.received(api.WatchSessionResponse(cursor="5-1", heartbeat=api.Heartbeat())) is None
    assert watching.request().cursor == "5-1"
    event = watching.received(rendered("6-2"))
    assert event is not None and watching.cursor == "6-2"
    assert (event.kind, event.session_id, event.time.year) == ("view_rendered", "s", 2027)
    assert event.details["format"] == "anthropic_messages" and event.details["tokens_sent"] == 120
    assert event.details["over_budget"] is False  # every field, defaults included
    beats, _ = progress(heartbeats=True)
    beat = beats.received(api.WatchSessionResponse(cursor="7-0", heartbeat=api.Heartbeat()))
    assert beat is not None and (beat.kind, beat.details) == ("heartbeat", {})


def test_decisions_read_as_lists_of_plain_values() -> None:
    response = api.WatchSessionResponse(
        cursor="1-1",
        decisions_made=api.DecisionsMade(
            view_version=2, total=1, decisions=[api.DecisionMade(seq=4, outcome=api.DECISION_PRUNE, reason="dup")]
        ),
    )
    details = event_from_proto(response).details
    assert details["decisions"] == [
        {"certificate": 0, "seq": 4, "outcome": "prune", "reason": "dup", "level": 0, "rule": ""}
    ]


def test_a_lagging_watch_resumes_at_once_and_a_lost_one_after_a_backoff() -> None:
    watching, _ = progress()
    lagging = FakeError(Code.ABORTED, [("contextd-reason", "WATCH_LAGGING")])
    assert watching.reconnect_after(lagging) == 0.0
    assert 0 <= watching.reconnect_after(FakeError(Code.UNAVAILABLE)) <= 2.0


def test_what_resuming_cannot_fix_is_raised() -> None:
    for code, reason in ((Code.OUT_OF_RANGE, "EVENTS_EXPIRED"), (Code.INVALID_ARGUMENT, "INVALID_ARGUMENT")):
        watching, _ = progress()
        with pytest.raises(ContextdError) as raised:
            watching.reconnect_after(FakeError(code, [("contextd-reason", reason)]))
        assert raised.value.reason == reason


def test_a_watch_gives_up_when_the_budget_passes_without_an_answer_and_counts_afresh_after_one() -> None:
    watching, now = progress(budget=5.0)
    watching.reconnect_after(FakeError(Code.UNAVAILABLE))
    now[0] = 4.9
    with pytest.raises(ContextdError):
        watching.reconnect_after(FakeError(Code.UNAVAILABLE))
    watching.received(rendered("9-9"))  # an answer: the next outage has a whole budget again
    now[0] = 100.0
    assert watching.reconnect_after(FakeError(Code.UNAVAILABLE)) is not None


class Stream:
    """A stream that yields its answers, then fails with `error` (or ends)."""

    def __init__(self, answers: list[api.WatchSessionResponse], error: grpc.RpcError | None = None) -> None:
        self.answers, self.error, self.cancelled = answers, error, False

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.answers
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self.cancelled = True


def test_a_watch_reopens_from_its_last_cursor_after_a_failure() -> None:
    asked: list[str] = []
    streams = [
        Stream([rendered("1-1"), rendered("1-2")], FakeError(Code.ABORTED, [("contextd-reason", "WATCH_LAGGING")])),
        Stream([rendered("1-3")]),
    ]

    def open_stream(request: api.WatchSessionRequest) -> Stream:
        asked.append(request.cursor)
        return streams.pop(0)

    watching, _ = progress()
    assert [e.cursor for e in Watch(open_stream, watching)] == ["1-1", "1-2", "1-3"]
    assert asked == ["", "1-2"]
