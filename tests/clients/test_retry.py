"""The retry budget, on a clock the tests move: how long a call keeps trying,
what it waits between tries, and which failures it never repeats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from contextd_client import NO_RETRY, ContextdError, DeadlineExceeded, RetryPolicy, Unavailable
from contextd_client._calls import (
    Call,
    Tries,
    append_items,
    create_session,
    get_session,
    propose_prune,
    render_view,
)
from contextd_client._retry import MIN_TRY, retry_after

Code = grpc.StatusCode


class FakeError(grpc.RpcError):
    def __init__(self, code: Code, trailers: Sequence[tuple[str, str | bytes]] = ()) -> None:
        self._code, self._trailers = code, tuple(trailers)

    def code(self) -> Code:
        return self._code

    def details(self) -> str:
        return "injected by the test"

    def trailing_metadata(self) -> Any:
        return self._trailers


def hint_ms(ms: int) -> tuple[str, str]:
    return ("contextd-retry-after-ms", str(ms))


@dataclass
class Run:
    """What a simulated call did: each try's start and deadline, the waits, and how it ended."""

    starts: list[float] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    ended: float = 0.0
    error: ContextdError | None = None
    settled: bool = False

    @property
    def tries(self) -> int:
        return len(self.starts)


def simulate(
    call: Call[Any], policy: RetryPolicy, errors: Sequence[FakeError], *, timeout: float = 10.0, takes: float = 0.01
) -> Run:
    """Drive `Tries` as the clients do, on a fake clock: each try fails with the next of
    `errors` (the last repeats) after `takes` seconds, or at its deadline after DEADLINE_EXCEEDED."""
    now = [0.0]
    tries = Tries(call, policy, timeout, clock=lambda: now[0])
    run = Run()
    while tries.attempt < 1000:
        deadline = tries.begin()
        run.starts.append(now[0])
        run.deadlines.append(deadline)
        error = errors[min(tries.attempt, len(errors)) - 1]
        now[0] += deadline if error.code() == Code.DEADLINE_EXCEEDED else min(takes, deadline)
        outcome = tries.failed(error)
        if outcome.delay is None:
            run.ended, run.error, run.settled = now[0], outcome.error, outcome.settled
            return run
        run.waits.append(outcome.delay)
        now[0] += outcome.delay
    raise AssertionError(f"still retrying {now[0]:.1f} s after the first try")


READ = get_session("s")
APPEND = append_items("s", [], None, None, "")
UNAVAILABLE = FakeError(Code.UNAVAILABLE)


def test_a_read_keeps_trying_while_the_service_is_down_until_the_budget_is_spent() -> None:
    run = simulate(READ, RetryPolicy(), [UNAVAILABLE])
    assert isinstance(run.error, Unavailable)
    # It gave up because the next retry could not have finished in 30 s, not before:
    # a wait is at most 2 s, so the last try started in the budget's last 2.25 s.
    assert 30 - 2 - MIN_TRY - 0.1 < run.ended <= 30
    assert run.tries >= 15  # one every 2 s at the slowest
    assert all(0 <= w <= 2.0 for w in run.waits)
    assert max(run.waits) > 0.8  # the backoff grew past the old default's last wait


def test_the_backoff_doubles_from_the_initial_wait_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=0.4, budget=3.0)
    for _ in range(20):  # full jitter: any wait from 0 up to the cap of its try
        run = simulate(READ, policy, [UNAVAILABLE])
        caps = [min(0.4, 0.1 * 2**n) for n in range(len(run.waits))]
        assert all(w <= cap for w, cap in zip(run.waits, caps, strict=True))
        assert run.ended <= 3.0


def test_max_attempts_still_caps_the_tries() -> None:
    assert simulate(READ, RetryPolicy(max_attempts=3), [UNAVAILABLE]).tries == 3
    assert simulate(APPEND, NO_RETRY, [UNAVAILABLE]).tries == 1
    assert simulate(READ, RetryPolicy(budget=0), [UNAVAILABLE]).tries == 1


def test_a_retry_deadline_is_cut_to_what_is_left_of_the_budget() -> None:
    # An append whose answers are all lost to the deadline: retried, as its key makes safe.
    run = simulate(APPEND, RetryPolicy(), [FakeError(Code.DEADLINE_EXCEEDED)], timeout=10)
    assert isinstance(run.error, DeadlineExceeded)
    assert run.tries == 3
    assert run.deadlines[:2] == [10, 10] and run.deadlines[2] < 10
    assert run.ended <= 30 + 1e-9  # the last try ends with the budget, not 10 s past it
    # The first try always gets its whole timeout, even over a shorter budget.
    assert simulate(APPEND, RetryPolicy(budget=5), [FakeError(Code.DEADLINE_EXCEEDED)]).deadlines == [10]


def test_a_server_hint_sets_the_least_wait() -> None:
    policy = RetryPolicy(initial_backoff=0.01, max_backoff=0.02)
    run = simulate(READ, policy, [FakeError(Code.UNAVAILABLE, [hint_ms(1500)]), FakeError(Code.NOT_FOUND)])
    assert run.waits == [1.5] and run.tries == 2


def test_a_hint_past_the_budget_gives_up_at_once() -> None:
    run = simulate(READ, RetryPolicy(budget=10), [FakeError(Code.UNAVAILABLE, [hint_ms(20_000)])])
    assert run.tries == 1 and run.waits == [] and isinstance(run.error, Unavailable)


def test_resource_exhausted_is_retried_only_with_a_hint() -> None:
    rate_limited = FakeError(Code.RESOURCE_EXHAUSTED, [("contextd-reason", "RATE_LIMITED"), hint_ms(700)])
    run = simulate(APPEND, RetryPolicy(), [rate_limited, rate_limited, FakeError(Code.NOT_FOUND)])
    assert run.tries == 3 and run.waits == [0.7, 0.7]
    # Kept being refused: retried until the budget, every wait the hint at least.
    run = simulate(READ, RetryPolicy(budget=5), [rate_limited])
    assert run.error is not None and run.error.code == "RESOURCE_EXHAUSTED" and run.error.reason == "RATE_LIMITED"
    assert run.tries > 3 and all(w >= 0.7 for w in run.waits) and run.ended <= 5
    # Too large a message is as large on the next try.
    too_large = FakeError(Code.RESOURCE_EXHAUSTED, [("contextd-reason", "VIEW_TOO_LARGE")])
    run = simulate(READ, RetryPolicy(), [too_large])
    assert run.tries == 1 and run.error is not None and run.error.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(
    "call", [create_session("chosen", None, ""), propose_prune("s", [1], "")], ids=lambda call: call.method
)
def test_a_call_not_safe_to_repeat_keeps_the_short_retry(call: Call[Any]) -> None:
    run = simulate(call, RetryPolicy(), [FakeError(Code.DEADLINE_EXCEEDED)])
    assert run.tries == 1 and isinstance(run.error, DeadlineExceeded)
    run = simulate(call, RetryPolicy(), [UNAVAILABLE])  # the server did not take it: a few tries
    assert run.tries == 5 and run.ended < 2
    assert simulate(call, RetryPolicy(max_attempts=2), [UNAVAILABLE]).tries == 2


def test_reads_are_not_repeated_after_their_deadline_and_writes_are() -> None:
    late = FakeError(Code.DEADLINE_EXCEEDED)
    assert simulate(READ, RetryPolicy(), [late]).tries == 1
    assert simulate(APPEND, RetryPolicy(), [late, FakeError(Code.NOT_FOUND)]).tries == 2
    # A render past its deadline is stored by the service, and the next resumes from it; the
    # history as stored is only read.
    assert simulate(render_view("s", "openai_chat", 0, (), None), RetryPolicy(), [late, late]).tries == 3
    assert simulate(render_view("s", "openai_chat", 0, (), None, as_stored=True), RetryPolicy(), [late]).tries == 1
    created = create_session(None, None, "")  # its id chosen here: safe
    run = simulate(created, RetryPolicy(), [late, FakeError(Code.ALREADY_EXISTS)])
    assert run.tries == 2 and run.settled


@pytest.mark.parametrize(
    "trailer",
    [
        ("contextd-retry-after-ms", "soon"),
        ("contextd-retry-after-ms", "-5"),
    ],
)
def test_a_malformed_hint_is_no_hint(trailer: tuple[str, str | bytes]) -> None:
    assert retry_after(FakeError(Code.UNAVAILABLE, [trailer])) is None


def test_a_retry_moves_to_the_next_channel_but_after_a_deadline_or_a_busy_session() -> None:
    busy = FakeError(Code.UNAVAILABLE, [("contextd-reason", "SESSION_BUSY"), hint_ms(100)])
    tries = Tries(render_view("s", "openai_chat", 0, (), None), RetryPolicy(), 10)
    channels = []
    for error in [UNAVAILABLE, FakeError(Code.DEADLINE_EXCEEDED), busy, UNAVAILABLE, busy]:
        tries.begin()
        channels.append(tries.channel(5, 3))
        assert tries.failed(error).delay is not None
    tries.begin()
    channels.append(tries.channel(5, 3))
    # The replica that may still be working on the call (a render it finishes, which the
    # next try resumes from) is tried again; one that could not take it is left.
    assert channels == [2, 0, 0, 0, 1, 1]
