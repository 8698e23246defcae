"""Retry policy: which failures are retried, how long to wait between tries, and
for how long a call keeps trying."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from contextd_client._errors import trailers

RETRY_AFTER_KEY = "contextd-retry-after-ms"
NOT_TAKEN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""Codes of a call the service could not take: retried for every call."""
MIN_TRY = 0.25
"""Seconds a retry must have left of the budget to be worth starting."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry with backoff when the service could not take the call: UNAVAILABLE
    (server down or restarting, session busy), CANCELLED sent by the server
    (a call caught by a server's shutdown before it ran), and RESOURCE_EXHAUSTED
    when the server says when to come back (a rate limit's retry-after hint;
    without one, as for a message too large, repeating would not help).

    Calls that are safe to repeat (reads, and mutations made safe by a key:
    appends reuse their idempotency key, sessions are created with a
    client-chosen id) keep trying until `budget` seconds have passed since
    their first try, long enough to ride out a replica's restart. Mutations
    are retried after DEADLINE_EXCEEDED as well, the usual face of a lost
    answer. A call that is not safe to repeat (a session created with an id
    the caller chose, a prune proposal) gets at most `unsafe_attempts` tries,
    only on the codes above.

    Between tries: exponential backoff with full jitter, from
    `initial_backoff` doubling up to `max_backoff` seconds, or longer when the
    server sent a retry-after hint (the ``contextd-retry-after-ms`` trailer,
    which contextd sends beside the standard RetryInfo, so the client needs no
    google.rpc messages).
    """

    max_attempts: int | None = None
    """Most tries of any call, if set; by default the budget alone decides."""
    initial_backoff: float = 0.1
    """Seconds before the first retry, at most; doubles each time up to `max_backoff`."""
    max_backoff: float = 2.0
    budget: float = 30.0
    """Seconds from a call's first try within which retries may run; the last try's
    deadline is cut to what is left. The first try always gets its whole timeout."""
    unsafe_attempts: int = 5
    """Most tries of a call that is not safe to repeat."""

    def delay(
        self, attempt: int, error: grpc.RpcError, elapsed: float, *, after_deadline: bool = False, safe: bool = True
    ) -> float | None:
        """Seconds to wait before try `attempt + 1`, or None to give up.

        `elapsed`: seconds since the first try started. `after_deadline`:
        retry DEADLINE_EXCEEDED too, for calls whose repeat is harmless and
        whose first try may have committed unseen. `safe`: the call may be
        repeated at all beyond a few tries.
        """
        cap = self.max_attempts
        if not safe:
            cap = self.unsafe_attempts if cap is None else min(cap, self.unsafe_attempts)
        if cap is not None and attempt >= cap:
            return None
        code = error.code()
        hint = retry_after(error)
        retryable = (
            code in NOT_TAKEN
            or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and hint is not None)
            or (code == grpc.StatusCode.DEADLINE_EXCEEDED and after_deadline and safe)
        )
        if not retryable:
            return None
        backoff = min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1))
        # Full jitter keeps many clients that failed together from retrying together.
        wait = max(hint or 0.0, random.uniform(0, backoff))
        if elapsed + wait + MIN_TRY > self.budget:
            return None  # the retry could not finish within the budget: say so now
        return wait

    def try_timeout(self, timeout: float, attempt: int, elapsed: float) -> float:
        """The deadline of try `attempt`, in seconds, started `elapsed` seconds after the
        first: `timeout`, cut for a retry to what is left of the budget."""
        if attempt <= 1:
            return timeout
        return min(timeout, max(self.budget - elapsed, MIN_TRY))


NO_RETRY = RetryPolicy(max_attempts=1)


def retry_after(error: grpc.RpcError) -> float | None:
    """The server's retry-after hint in seconds, or None when it sent none."""
    for key, value in trailers(error):
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return int(value) / 1000
    return None
