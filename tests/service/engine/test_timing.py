"""Cache-priced timing (service/contextd/engine/timing.py), on its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.policy import CachePolicy
from contextd.engine.timing import Costed, schedule, value_now
from contextd.engine.types import CacheState

WARM = CacheState(previous_tokens=10_000, age_seconds=10.0, ttl_seconds=300.0)
CACHE = CachePolicy()


def at_breakpoints(*ends: int) -> CacheState:
    """The warm cache of a provider that reads only whole earlier prompts, these ends among them."""
    return CacheState(10_000, 10.0, 300.0, breakpoints=(*ends, 10_000))


def test_whole_prompts_are_read_back_to_the_last_end_before_the_change() -> None:
    cache = at_breakpoints(5_000, 8_500)
    assert [cache.read_until(p) for p in (0, 4_999, 5_000, 9_000, 10_000)] == [0, 0, 5_000, 8_500, 10_000]
    assert WARM.read_until(9_000) == 9_000  # any shared prefix is read
    assert CacheState(10_000, 10.0, 300.0, breakpoints=()).cold  # nothing of it cached


def test_an_edit_is_priced_from_where_the_cache_stops_reading() -> None:
    edit = Costed(position=9_000, saving=800)
    [prefix] = schedule([edit], WARM, CACHE, utilization=0.0)
    [near] = schedule([edit], at_breakpoints(8_500), CACHE, utilization=0.0)
    [far] = schedule([edit], at_breakpoints(5_000), CACHE, utilization=0.0)
    assert (prefix.radius, near.radius, far.radius) == (1_000, 1_500, 5_000)
    assert prefix.apply and near.apply and not far.apply  # 4,200 tokens written again do not pay for 800


def test_edits_between_the_read_point_and_the_paying_edit_ride_on_its_rewrite() -> None:
    small = Costed(position=8_600, saving=100)  # alone: 1,400 tokens written again for 100
    paying = Costed(position=9_000, saving=800)
    timings = schedule([small, paying], at_breakpoints(8_500), CACHE, utilization=0.0)
    assert [t.apply for t in timings] == [True, True]
    assert "pay for one invalidation" in timings[0].why  # the first edit of the rewrite makes it
    assert timings[1].why == "rides on the rewrite from token 8500"


def test_an_insert_after_a_reduction_that_pays_does_not_hold_the_reduction_back() -> None:
    reduction = Costed(position=9_000, saving=800)  # pays on its own: it rewrites 1,000 tokens
    insert = Costed(position=9_500, saving=-700)  # grows the view
    later = Costed(position=9_600, saving=300)
    assert value_now(800, 1_000, CACHE) > 0
    timings = schedule([reduction, insert, later], WARM, CACHE, utilization=0.0)
    assert [t.apply for t in timings] == [True, True, True]


@settings(max_examples=500)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(-2_000, 2_000)), max_size=8),
    st.none() | st.lists(st.integers(1_024, 9_999), unique=True).map(sorted),
)
def test_an_edit_that_pays_on_its_own_is_never_deferred(edits: list[tuple[int, int]], ends: list[int] | None) -> None:
    costed = [Costed(position, saving) for position, saving in edits]
    cache = WARM if ends is None else at_breakpoints(*ends)
    for edit, timing in zip(costed, schedule(costed, cache, CACHE, utilization=0.0), strict=True):
        if timing.value > 0:
            assert timing.apply, (edit, timing)
