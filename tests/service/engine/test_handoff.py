"""Threads beside the event loop make way for it before brief calls that let the interpreter
lock go (contextd/engine/handoff.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from contextd import interpreter
from contextd.engine import handoff
from contextd.engine.patterns import compile_linear
from contextd.engine.tokens import TiktokenCounter


class Clock:
    """`perf_counter` for handoff.py: moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Clock, list[str]]]:
    """The clock handoff.py reads and the threads that paused (by name), the main thread
    named as the loop's."""
    clock, paused = Clock(), []
    monkeypatch.setattr(handoff, "perf_counter", clock)
    monkeypatch.setattr(handoff, "sleep", lambda _: paused.append(threading.current_thread().name))
    handoff.start(threading.get_ident())
    try:
        yield clock, paused
    finally:
        handoff.stop()


def on_a_thread(work: Callable[[], None], name: str = "render") -> None:
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def test_a_thread_beside_the_loop_makes_way_once_each_handoff_interval(pauses: tuple[Clock, list[str]]) -> None:
    clock, paused = pauses

    def work() -> None:
        handoff.make_way()  # never made way yet
        handoff.make_way()  # just did
        clock.now += handoff.HANDOFF_SECONDS / 2
        handoff.make_way()
        clock.now += handoff.HANDOFF_SECONDS
        handoff.make_way()

    on_a_thread(work)
    assert paused == ["render", "render"]


def test_the_loop_s_own_thread_never_pauses(pauses: tuple[Clock, list[str]]) -> None:
    clock, paused = pauses
    for _ in range(3):
        clock.now += 1
        handoff.make_way()
    assert paused == []


def test_nothing_pauses_until_a_loop_thread_is_named(pauses: tuple[Clock, list[str]]) -> None:
    _, paused = pauses
    handoff.stop()
    on_a_thread(handoff.make_way)
    assert paused == []


def test_each_thread_keeps_its_own_interval(pauses: tuple[Clock, list[str]]) -> None:
    _, paused = pauses
    on_a_thread(handoff.make_way, "first")
    on_a_thread(handoff.make_way, "second")  # the first's pause does not count for it
    assert paused == ["first", "second"]


def test_re2_matches_and_token_counts_make_way(pauses: tuple[Clock, list[str]]) -> None:
    """The calls that let the lock go: each RE2 search, substitution or match found, each
    tiktoken count."""
    clock, paused = pauses
    pattern, counter = compile_linear(r"\bexit code (\d+)"), TiktokenCounter()
    found: list[object] = []

    def work() -> None:
        for call in (
            lambda: pattern.search("done, exit code 3"),
            lambda: pattern.sub("", "exit code 1 then exit code 2"),
            lambda: [m.group(1) for m in pattern.finditer("exit code 1, exit code 2")],
            lambda: counter.count("some words to count"),
            lambda: counter.starts("some words"),
        ):
            clock.now += 1
            found.append(call())

    on_a_thread(work)
    assert paused == ["render"] * 5
    assert found[0] is not None and found[0].group(1) == "3"  # type: ignore[attr-defined]
    assert found[1:] == [" then ", ["1", "2"], 4, [0, 4]]


def test_tuning_the_interpreter_names_the_calling_thread_as_the_loop_s() -> None:
    interpreter.tune()
    try:
        assert handoff._loop_thread == threading.get_ident()
    finally:
        interpreter.untune()
    assert handoff._loop_thread is None
