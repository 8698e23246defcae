"""Cache-priced timing (service/contextd/engine/timing.py), on its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.policy import UNLIMITED, CachePolicy
from contextd.engine.state import PreviousRender
from contextd.engine.timing import Costed, Usage, banked, priced, schedule, stake, value_now
from contextd.engine.types import CacheState

WARM = CacheState(previous_tokens=10_000, age_seconds=10.0, ttl_seconds=300.0)
CACHE = CachePolicy(stakes=UNLIMITED)
"""The pricing alone: whatever a rewrite stakes (the default holds it to what is banked)."""
BANKED = CachePolicy()


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


def test_a_rewrite_that_pays_waits_while_it_would_lose_more_than_the_session_has_saved() -> None:
    edit = Costed(position=9_000, saving=800)  # pays over 12 calls; loses if the session ends next
    at_risk = stake(800, 1_000, BANKED)
    assert at_risk > 0 and value_now(800, 1_000, BANKED) > 0
    [poor] = schedule([edit], WARM, BANKED, utilization=0.0, bank=at_risk * 0.99)
    [rich] = schedule([edit], WARM, BANKED, utilization=0.0, bank=at_risk)
    assert not poor.apply and "more than the session has saved so far" in poor.why
    assert rich.apply
    free = Costed(position=10_000, saving=800)  # the tail the cache has not seen: nothing at stake
    assert schedule([free], WARM, BANKED, utilization=0.0)[0].apply
    [full] = schedule([edit], WARM, BANKED, utilization=0.95)  # at the budget's high water
    assert full.apply


def test_of_the_rewrites_that_pay_the_best_within_the_bank_is_made() -> None:
    early = Costed(position=2_000, saving=6_000)  # rewrites 8,000 tokens: worth most, stakes most
    late = Costed(position=9_000, saving=800)  # rewrites 1,000
    assert value_now(6_800, 8_000, BANKED) > value_now(800, 1_000, BANKED) > 0
    bank = stake(800, 1_000, BANKED)
    assert stake(6_800, 8_000, BANKED) > bank
    timings = schedule([early, late], WARM, BANKED, utilization=0.0, bank=bank)
    assert [t.apply for t in timings] == [False, True]


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 2_000)), max_size=8),
    st.none() | st.lists(st.integers(1_024, 9_999), unique=True).map(sorted),
    st.floats(0.0, 0.05),
)
def test_what_a_render_applies_never_stakes_more_than_is_banked(
    edits: list[tuple[int, int]], ends: list[int] | None, bank: float
) -> None:
    costed = [Costed(position, saving) for position, saving in edits]
    cache = WARM if ends is None else at_breakpoints(*ends)
    timings = schedule(costed, cache, BANKED, utilization=0.0, bank=bank)
    applied = [(e, t) for e, t in zip(costed, timings, strict=True) if t.apply and t.radius > 0]
    if applied:
        radius = max(t.radius for _, t in applied)  # one rewrite, from the earliest read point
        assert stake(sum(e.saving for e, _ in applied), radius, BANKED) <= bank + 1e-12


def test_the_bank_is_what_each_call_saved_against_the_whole_history_sent_and_cached() -> None:
    warm = CacheState(20_000, 10.0, 300.0, breakpoints=(20_000,))
    previous = PreviousRender(0.0, (), history_tokens=30_000, banked=0.01)
    # The history grew by 2,000 tokens: sent whole, it reads 30,000 and writes 2,000.
    whole = priced(Usage(30_000, 2_000, 0), BANKED)
    view = Usage(20_000, 1_000, 0)  # the view reads what it shares with its own last call
    assert banked(previous, warm, 32_000, view, BANKED) == 0.01 + whole - priced(view, BANKED)
    # A call after the cache went cold writes the whole history again, as it writes the view.
    cold = CacheState(20_000, 400.0, 300.0, breakpoints=(20_000,))
    again = Usage(0, 21_000, 0)
    assert banked(previous, cold, 32_000, again, BANKED) == 0.01 + priced(Usage(0, 32_000, 0), BANKED) - priced(
        again, BANKED
    )
    assert banked(None, CacheState(0, None, 300.0), 5_000, Usage(0, 5_000, 0), BANKED) == 0.0


@settings(max_examples=500)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(-2_000, 2_000)), max_size=12),
    st.none() | st.lists(st.integers(1_024, 9_999), unique=True).map(sorted),
)
def test_the_rewrite_made_is_the_one_worth_most_of_those_from_where_the_cache_stops_reading(
    edits: list[tuple[int, int]], ends: list[int] | None
) -> None:
    """Against the schedule worked out by hand: each start where the cache stops reading for an
    edit, worth what the reductions from there on save over what they make the calls write
    again; the best one that is worth something is made, with every edit from it on."""
    costed = [Costed(position, saving) for position, saving in edits]
    cache = WARM if ends is None else at_breakpoints(*ends)
    total = cache.previous_tokens
    radii = [total - cache.read_until(e.position) for e in costed]
    best, best_value = None, 0.0
    for start in sorted({total - r for r in radii if r > 0}):
        saving = sum(max(0, e.saving) for e, r in zip(costed, radii, strict=True) if r > 0 and e.position >= start)
        if (worth := value_now(saving, total - start, CACHE)) > best_value:
            best, best_value = start, worth
    expected = [r == 0 or (best is not None and e.position >= best) for e, r in zip(costed, radii, strict=True)]
    assert [t.apply for t in schedule(costed, cache, CACHE, utilization=0.0)] == expected
