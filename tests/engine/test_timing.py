"""Cache-priced timing (contextd/engine/timing.py), on its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.policy import CachePolicy
from contextd.engine.timing import Costed, schedule, value_now
from contextd.engine.transforms import CacheState

WARM = CacheState(previous_tokens=10_000, age_seconds=10.0, ttl_seconds=300.0)
CACHE = CachePolicy()


def test_an_insert_after_a_reduction_that_pays_does_not_hold_the_reduction_back() -> None:
    reduction = Costed(position=9_000, saving=800)  # pays on its own: it rewrites 1,000 tokens
    insert = Costed(position=9_500, saving=-700)  # grows the view
    later = Costed(position=9_600, saving=300)
    assert value_now(800, 1_000, CACHE) > 0
    timings = schedule([reduction, insert, later], WARM, CACHE, utilization=0.0)
    assert [t.apply for t in timings] == [True, True, True]


@settings(max_examples=500)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-2_000, 2_000)), max_size=8))
def test_an_edit_that_pays_on_its_own_is_never_deferred(edits: list[tuple[int, int]]) -> None:
    costed = [Costed(position, saving) for position, saving in edits]
    for edit, timing in zip(costed, schedule(costed, WARM, CACHE, utilization=0.0), strict=True):
        if timing.value > 0:
            assert timing.apply, (edit, timing)
