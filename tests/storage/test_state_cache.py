"""The in-process caches of view states and carries (storage/contextd_storage/state_cache.py) and of
histories (history.ItemCache)."""

from __future__ import annotations

from contextd.engine.model import Role, TextBlock
from contextd.engine.pipeline import Carry, RenderInput, render
from contextd.engine.policy import default_policy
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_storage.history import ItemCache, item_bytes
from contextd_storage.state_cache import StateCache
from tests.helpers import counter, make_item, make_session


def rendered(n: int) -> tuple[ViewState, Carry]:
    items = [make_item(Role.USER, TextBlock(f"turn {s}"), seq=s) for s in range(1, n + 1)]
    inp = RenderInput(
        make_session(n),
        items,
        default_policy(),
        ViewRequest(ViewFormat.OPENAI_CHAT),
        counter(),
        TransformRegistry.default(),
    )
    out = render(inp)
    assert out.carry is not None
    return out.state, out.carry


def test_a_carry_is_given_only_for_the_state_it_was_made_with() -> None:
    cache = StateCache()
    state, carry = rendered(3)
    cache.put(1, state, carry)
    assert cache.get(1, state.view_version) is state
    assert cache.carry(1, state) is carry
    assert cache.carry(1, ViewState(view_version=state.view_version)) is None  # read back from the database
    assert cache.carry(2, state) is None
    newer, _ = rendered(4)
    cache.put(1, newer)  # a render that made no carry
    assert cache.carry(1, newer) is None and cache.carry(1, state) is None


def test_sessions_are_bounded_by_the_bytes_they_hold_the_least_recently_used_going_first() -> None:
    made = {key: rendered(4) for key in (1, 2, 3)}
    assert made[1][1].footprint() > 4 * 320  # the entries, and the view's messages
    one = made[1][1].footprint() + 1000
    cache = StateCache(max_bytes=2 * one + 1)
    for key, (state, carry) in made.items():
        cache.put(key, state, carry, state_bytes=1000)
    assert cache.latest(1) is None and cache.carry(1, made[1][0]) is None  # three would be over
    assert cache.carry(2, made[2][0]) is made[2][1] and cache.carry(3, made[3][0]) is made[3][1]
    assert cache.held_bytes == 2 * one
    cache.latest(2)  # used: session 3 is now the least recently used
    cache.put(1, *made[1], state_bytes=1000)
    assert cache.latest(3) is None and cache.latest(2) is made[2][0]


def test_a_state_put_again_replaces_its_weight() -> None:
    cache = StateCache()
    state, carry = rendered(2)
    cache.put(1, state, carry, state_bytes=5000)
    cache.put(1, state, None, state_bytes=700)
    assert cache.held_bytes == 700 and cache.carry(1, state) is None


def test_the_number_of_sessions_is_bounded_too() -> None:
    cache = StateCache(max_states=1)
    (first, carry), (second, _) = rendered(2), rendered(2)
    cache.put(1, first, carry)
    cache.put(2, second)
    assert cache.get(1, first.view_version) is None and cache.carry(1, first) is None


def test_histories_are_bounded_by_their_estimated_bytes() -> None:
    items = [make_item(Role.USER, TextBlock("x" * 400), seq=s) for s in range(1, 11)]
    each = item_bytes(items[0])
    cache = ItemCache(max_bytes=15 * each)
    cache.put(1, items[:5])
    cache.put(1, items[:8], items[5:8])  # three appended since
    assert cache.held_bytes == 8 * each
    cache.put(2, items[:5])  # 13: within
    cache.put(3, items[:5])  # 18: over, the least recently used session goes
    assert cache.get(1, []) == [] and cache.get(2, []) == items[:5] and cache.held_bytes == 10 * each
    cache.discard(2)
    assert cache.held_bytes == 5 * each
