"""The interpreter's tuning: survivors of every collection frozen, cycles freed in full later."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from contextd import interpreter


@pytest.fixture
def tuned() -> Iterator[None]:
    interpreter.tune()
    try:
        yield
    finally:
        interpreter.untune()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.mark.parametrize("generation", [0, 1, 2])
def test_survivors_of_every_collection_are_frozen(tuned: None, generation: int) -> None:
    assert sys.getswitchinterval() == pytest.approx(interpreter.SWITCH_INTERVAL_SECONDS)
    kept = [[n] for n in range(1000)]
    gc.collect(generation)
    assert gc.get_freeze_count() >= len(kept)  # no later collection scans them


def test_a_cycle_that_dies_young_is_freed_by_the_young_collection(tuned: None) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    del first, second  # garbage before any collection saw it
    assert gc.collect(0) >= 2


def test_cycles_among_frozen_objects_are_freed_by_the_full_collection(tuned: None) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first  # a cycle
    gc.collect()  # both survive, and are frozen
    del first, second  # garbage now, but only a collection of the frozen can see it
    assert gc.collect() == 0
    assert interpreter.collect_in_full() >= 2
    assert gc.get_freeze_count() > 0  # what survived the full collection is frozen again


def test_untune_leaves_the_defaults() -> None:
    interpreter.tune()
    interpreter.untune()
    assert sys.getswitchinterval() == 0.005 and gc.get_freeze_count() == 0
    assert gc.get_threshold()[0] == 700
    assert not any(getattr(cb, "__module__", "") == interpreter.__name__ for cb in gc.callbacks)


def test_young_containers_are_collected_less_often(tuned: None) -> None:
    """A render's containers, as long as they live, are not visited by a young collection."""
    gc.collect()
    collections = gc.get_stats()[0]["collections"]
    kept = [[n] for n in range(interpreter.YOUNG_THRESHOLD // 2)]  # 10,000 live containers
    assert gc.get_stats()[0]["collections"] == collections
    del kept


async def test_the_full_collection_waits_until_the_frozen_objects_grow(tuned: None) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    cycle = weakref.ref(first)
    gc.collect()  # frozen
    del first, second  # frozen garbage from now on
    maintaining = asyncio.create_task(interpreter.maintain(every_seconds=0.01))
    try:
        await asyncio.sleep(0.1)
        assert cycle() is not None  # the heap held steady: no full collection
        kept = [[n] for n in range(gc.get_freeze_count())]  # it doubles
        gc.collect(0)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if cycle() is None:
                break
        assert cycle() is None
        assert len(kept) > 0
    finally:
        maintaining.cancel()
