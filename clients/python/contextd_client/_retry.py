"""Retry policy: which failures are retried, and how long to wait between tries."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from contextd_client._errors import trailers

RETRY_AFTER_KEY = "contextd-retry-after-ms"
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry with backoff when the service could not take the call: UNAVAILABLE
    (server down or restarting, session busy) and CANCELLED sent by the server
    (a call caught by a server's shutdown before it ran).

    Retrying is safe because every mutating call carries a key that makes a
    repeat harmless (appends reuse their idempotency key, sessions are
    created with a client-chosen id): a retry after a lost answer never
    writes twice. For the same reason those calls are retried after
    DEADLINE_EXCEEDED as well, the usual face of a lost answer.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.1
    """Seconds before the first retry; doubles each time up to `max_backoff`."""
    max_backoff: float = 2.0

    def delay(self, attempt: int, error: grpc.RpcError, after_deadline: bool = False) -> float | None:
        """Seconds to wait before try `attempt + 1`, or None to give up.

        `after_deadline`: retry DEADLINE_EXCEEDED too, for calls whose
        repeat is harmless and whose first try may have committed unseen.
        """
        retryable = RETRYABLE | {grpc.StatusCode.DEADLINE_EXCEEDED} if after_deadline else RETRYABLE
        if attempt >= self.max_attempts or error.code() not in retryable:
            return None
        backoff = min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1))
        hinted = _retry_after(error)
        # Full jitter keeps many clients that failed together from retrying together.
        return max(hinted, random.uniform(0, backoff))


NO_RETRY = RetryPolicy(max_attempts=1)


def _retry_after(error: grpc.RpcError) -> float:
    for key, value in trailers(error):
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return int(value) / 1000
    return 0.0
