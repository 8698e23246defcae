"""When to apply an eligible edit: priced against the provider's prompt cache
(DESIGN section 6).

The provider caches a request's prefix. An edit at token offset p of the
previous render rewrites everything after p (its mutation radius): the next
call pays the cache-write price for those tokens instead of the cache-read
price. What it saves is its tokens on every later call. Over the expected
calls E, with read price r and write price w per token:

    value(apply now) = E * saving * r  -  (radius - saving) * (w - r)

An edit applies now when it only touches the tail the cache has not seen,
when the cache is cold anyway (the previous render is older than the
cache's TTL), or as part of the batch of edits whose single invalidation
pays best; when nothing pays and the view has reached the high-water mark
of its budget, all of them apply. Otherwise it is deferred and weighed
again at the next render, with the others: one invalidation for a whole
batch may pay where each edit alone does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contextd.engine.policy import CachePolicy
from contextd.engine.transforms import CacheState

PER_TOKEN = 1_000_000  # prices are per million tokens


@dataclass(frozen=True, slots=True)
class Costed:
    """An eligible edit as the cache sees it."""

    position: int
    """Token offset of the change in the previous render (its end for a new item)."""
    saving: int
    """Tokens fewer on every call once applied (negative when it grows the view)."""


@dataclass(frozen=True, slots=True)
class Timing:
    apply: bool
    why: str
    radius: int
    """Previously sent tokens after the change: what the next call must write again."""
    value: float
    """Estimated dollars saved over the expected calls by applying now (negative: it costs)."""


def value_now(saving: int, radius: int, cache: CachePolicy) -> float:
    read = cache.prices.cache_read / PER_TOKEN
    write = cache.prices.cache_write / PER_TOKEN
    rewritten = max(0, radius - max(saving, 0))
    return cache.expected_calls * saving * read - rewritten * (write - read)


def schedule(
    edits: Sequence[Costed],
    state: CacheState,
    cache: CachePolicy,
    utilization: float,
    force: bool = False,
) -> list[Timing]:
    """Decide, for each edit, whether it applies in this render.

    One invalidation at offset p rewrites everything after p, so every edit
    at or after p can ride on it. Of the suffixes "all edits from p on", the
    one worth most (if any is worth anything) is applied. An edit that pays
    on its own is always in it: starting at that edit is worth at least its
    own value more than starting after it.
    """
    total = state.previous_tokens
    radii = [max(0, total - e.position) for e in edits]
    values = [value_now(e.saving, r, cache) for e, r in zip(edits, radii, strict=True)]
    if force or state.cold:
        why = "applied by the operator" if force else "the cache is cold: nothing cached to keep"
        return [Timing(True, why, r, v) for r, v in zip(radii, values, strict=True)]

    positions = sorted({e.position for e, r in zip(edits, radii, strict=True) if r > 0})
    best: int | None = None
    best_value = 0.0
    for p in positions:
        # What the rewrite from p saves: the reductions from p on. An edit that grows the
        # view (an insert) rides on the rewrite, but is no reason to make it; counting it
        # here could pass over an earlier start that pays for every reduction after it.
        saving = sum(max(0, e.saving) for e, r in zip(edits, radii, strict=True) if r > 0 and e.position >= p)
        worth = value_now(saving, total - p, cache)
        if worth > best_value:
            best, best_value = p, worth
    cause = (
        f"the edits from token {best} on pay for one invalidation (${best_value:.6f} over {cache.expected_calls} calls)"
    )
    if best is None and positions and utilization >= cache.high_water:
        best, cause = positions[0], f"the view is at {utilization:.0%} of its budget (high water)"

    timings = []
    for edit, radius, value in zip(edits, radii, values, strict=True):
        if radius == 0:
            timings.append(Timing(True, "it touches only the tail the cache has not seen", 0, value))
        elif best is not None and edit.position >= best:
            why = cause if edit.position == best else f"rides on the rewrite from token {best}"
            timings.append(Timing(True, why, radius, value))
        else:
            calls = cache.expected_calls
            cost = (
                f"applying now would cost ${-value:.6f} more than it saves over {calls} calls"
                if value < 0
                else f"applying now would save nothing over {calls} calls"
            )
            timings.append(Timing(False, cost, radius, value))
    return timings
