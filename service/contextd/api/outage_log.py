"""The log of expected unavailability: the first failure of each kind, then a count.

During an outage (Postgres restarting, a session's lock contended) every call
fails the same way; a warning with a traceback for each would write megabytes
and bury the one line an operator needs. So each kind (the error's reason) is
logged once when it starts, without a traceback (it is no bug), and then at
most once per interval as a count with the latest message, until an interval
passes without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

Schedule = Callable[[float, Callable[[], None]], object]
"""Run a callback after a delay in seconds (the event loop's `call_later`)."""


@dataclass
class _Kind:
    quiet_until: float
    suppressed: int = 0
    latest: str = ""
    flush_pending: bool = False


class OutageLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule | None = None,
    ) -> None:
        self._log = logger
        self._interval = interval_seconds
        self._clock = clock
        self._schedule = schedule
        self._kinds: dict[str, _Kind] = {}

    def failed(self, kind: str, message: str) -> None:
        """One call failed with `kind` (a stable reason), for the reason `message` says."""
        now = self._clock()
        state = self._kinds.get(kind)
        if state is None or (now >= state.quiet_until and not state.flush_pending):
            self._log.warning("%s: %s (further ones are counted, every %.0f s)", kind, message, self._interval)
            self._kinds[kind] = _Kind(quiet_until=now + self._interval)
            return
        state.suppressed += 1
        state.latest = message
        if not state.flush_pending:
            state.flush_pending = True
            schedule = self._schedule or asyncio.get_running_loop().call_later
            schedule(max(0.0, state.quiet_until - now), lambda: self._flush(kind))

    def _flush(self, kind: str) -> None:
        state = self._kinds[kind]
        state.flush_pending = False
        if state.suppressed:
            self._log.warning(
                "%s: %d more in the last %.0f s (latest: %s)", kind, state.suppressed, self._interval, state.latest
            )
        state.suppressed = 0
        state.quiet_until = self._clock() + self._interval
