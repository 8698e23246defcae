"""The in-process caches of view states and carries (storage/contextd_storage/views.py)."""

from __future__ import annotations

from contextd.engine.model import Role, TextBlock
from contextd.engine.pipeline import Carry, RenderInput, render
from contextd.engine.policy import default_policy
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_storage.views import StateCache
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


def test_carries_are_bounded_by_the_bytes_they_hold() -> None:
    made = {key: rendered(4) for key in (1, 2, 3)}
    assert made[1][1].footprint() > 4 * 320  # the entries, and the view's messages
    cache = StateCache(max_carry_bytes=made[1][1].footprint() * 2 + 1)
    for key, (state, carry) in made.items():
        cache.put(key, state, carry)
    assert cache.carry(1, made[1][0]) is None  # three would be over: the least recently rendered went
    assert cache.carry(2, made[2][0]) is made[2][1] and cache.carry(3, made[3][0]) is made[3][1]
    assert cache.get(1, made[1][0].view_version) is made[1][0]  # its state stays


def test_a_state_evicted_takes_its_carry_along() -> None:
    cache = StateCache(max_states=1)
    (first, carry), (second, _) = rendered(2), rendered(2)
    cache.put(1, first, carry)
    cache.put(2, second)
    assert cache.get(1, first.view_version) is None and cache.carry(1, first) is None
