"""An outage is logged once when it starts, then as a count per interval, never per call."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from contextd.api.outage_log import OutageLog


class Timers:
    """A stand-in for the event loop's `call_later`, run by hand."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self.pending.append((self.clock[0] + delay, callback))

    def advance(self, seconds: float) -> None:
        self.clock[0] += seconds
        due = [p for p in self.pending if p[0] <= self.clock[0]]
        self.pending = [p for p in self.pending if p[0] > self.clock[0]]
        for _, callback in due:
            callback()


def test_a_burst_of_failures_is_one_line_then_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    timers = Timers(clock)
    outages = OutageLog(logging.getLogger("test.outages"), 10.0, clock=lambda: clock[0], schedule=timers.schedule)
    with caplog.at_level(logging.WARNING, "test.outages"):
        for n in range(500):
            outages.failed("DATABASE_UNAVAILABLE", f"AppendItems: the database is unavailable (call {n})")
        assert len(caplog.records) == 1 and "call 0" in caplog.records[0].getMessage()
        assert caplog.records[0].exc_info is None  # expected unavailability: no traceback
        timers.advance(10)
        assert len(caplog.records) == 2
        assert "499 more in the last 10 s (latest: AppendItems: the database is unavailable (call 499))" in (
            caplog.records[1].getMessage()
        )
        # Still failing: a count per interval.
        outages.failed("DATABASE_UNAVAILABLE", "again")
        timers.advance(10)
        assert len(caplog.records) == 3 and "1 more" in caplog.records[2].getMessage()
        # A quiet interval ends the outage: the next failure is logged as a new one, at once.
        timers.advance(30)
        outages.failed("DATABASE_UNAVAILABLE", "a new outage")
        assert len(caplog.records) == 4 and "a new outage" in caplog.records[3].getMessage()
        # Kinds are counted apart.
        outages.failed("SESSION_BUSY", "busy")
        assert len(caplog.records) == 5 and caplog.records[4].getMessage().startswith("SESSION_BUSY")
