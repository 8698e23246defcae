"""When to apply an eligible edit: priced against the provider's prompt cache
(DESIGN section 6).

The provider caches a request's prefix. An edit at token offset p of the
previous render makes the next call stop reading the cache at or before p:
at p itself for a provider that reads any shared prefix (OpenAI, Gemini);
for one that reads only whole earlier prompts (Anthropic's breakpoints, one
at the end of each call) at the end of the last earlier prompt before p
that is still cached, which may be well before it. Everything after that
point (the mutation radius) is written to the cache again instead of read.
What the edit saves is its tokens on every later call. Over the expected
calls E, with read price r and write price w per token:

    value(apply now) = E * saving * r  -  (radius - saving) * (w - r)

A session's end is not known, so an edit that pays over E calls may still
lose if the session ends soon after. What a rewrite puts at risk (its stake:
what it costs if the session ends after the next call) is held to what the
session's calls have saved so far against sending the whole history, each
call caching its prompt (`banked`; the policy's `cache.stakes`): a session
that ends just after a rewrite then costs no more than that history would
have, whatever agent made it and however short it was.

An edit applies now when it only touches the tail the cache has not seen,
when the cache is cold anyway (the previous render is older than the
cache's TTL), or as part of the batch of edits whose single invalidation
pays best; when nothing pays and the view has reached the high-water mark
of its budget, all of them apply. Otherwise it is deferred and weighed
again at the next render, with the others: one invalidation for a whole
batch may pay where each edit alone does not.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from contextd.engine.policy import BANKED, BREAKPOINTS, CACHE_STEPS, MIN_CACHED_TOKENS, CachePolicy
from contextd.engine.state import PreviousRender
from contextd.engine.types import CacheState

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


@dataclass(frozen=True, slots=True)
class PromptCache:
    """The provider's prompt cache as a render finds it."""

    previous: PreviousRender | None
    """The session's latest render in the view's format: the prompt the provider may hold."""
    state: CacheState
    """What the provider holds of it now."""
    pricing: CachePolicy
    """The policy's cache pricing for the session so far (its expected calls may grow with it)."""


def prompt_cache(previous: PreviousRender | None, now: float, cache: CachePolicy, calls_so_far: int) -> PromptCache:
    """The cache a render finds `now`, after `previous`, in a session of `calls_so_far` calls."""
    return PromptCache(previous, cache_state(previous, now, cache), cache.for_session(calls_so_far))


def cache_state(previous: PreviousRender | None, now: float, cache: CachePolicy) -> CacheState:
    """What the provider holds of the previous render, `now`."""
    ttl = cache.prices.ttl_seconds
    if previous is None:
        return CacheState(0, None, ttl)
    breakpoints = None
    if cache.reads == BREAKPOINTS:
        breakpoints = tuple(offset for offset, _ in live_ends(previous, now, cache))
    return CacheState(previous.cached_tokens, now - previous.rendered_at, ttl, breakpoints)


def live_ends(previous: PreviousRender, now: float, cache: CachePolicy) -> list[tuple[int, float]]:
    """The previous render's cached prompt ends (its own included: at its breakpoint) still in the
    provider's cache `now`."""
    ends = (*previous.cached_ends, (previous.cached_tokens, previous.rendered_at))
    ttl = cache.prices.ttl_seconds
    return sorted((offset, used) for offset, used in ends if offset >= MIN_CACHED_TOKENS and now - used <= ttl)


def ends_after(
    previous: PreviousRender | None, divergence: int, total: int, now: float, cache: CachePolicy
) -> tuple[tuple[int, float], ...]:
    """The cached prompt ends of a render of `total` tokens that shares its first `divergence`
    with `previous`: those of `previous` within them, before its own end; the call reads the
    last, which keeps it alive."""
    if previous is None or cache.reads != BREAKPOINTS:
        return ()
    kept = [(offset, used) for offset, used in live_ends(previous, now, cache) if offset <= divergence]
    if kept:
        kept[-1] = (kept[-1][0], now)
    return tuple(end for end in kept if end[0] < total)  # the render's own end is its own


@dataclass(frozen=True, slots=True)
class Usage:
    """A call's input, in tokens, as its provider is expected to bill it (or did: ReportUsage)."""

    cache_read: int
    cache_write: int
    uncached: int


NO_USAGE = Usage(0, 0, 0)


def predicted_usage(
    state: CacheState,
    stable: int,
    cached: int | None,
    total: int,
    cache: CachePolicy,
    framed: Callable[[int], int] = int,
) -> Usage:
    """What the call made with a render of `total` tokens (as the view counts them, with its
    messages' framing) is expected to read from the provider's cache, write to it and send
    uncached. It reads what it shares with the previous render (`stable` tokens), as far as the
    provider reads it back (to the last cached end before, for one that caches at breakpoints);
    it caches its prompt up to `cached` tokens (its breakpoint; None: to its end), billed as a
    write where writing costs more than input. Offsets are the engine's (items' tokens):
    `framed` adds the framing of the messages before one."""
    read = 0 if state.cold else min(state.read_until(stable), state.previous_tokens)
    read = framed(read) if read >= MIN_CACHED_TOKENS else 0
    step = CACHE_STEPS.get(cache.provider, 1)
    if read and step > 1:
        read = MIN_CACHED_TOKENS + (read - MIN_CACHED_TOKENS) // step * step
    write = 0
    if cache.prices.cache_write > cache.prices.input and (cached is None or cached >= MIN_CACHED_TOKENS):
        write = max(0, (total if cached is None else min(framed(cached), total)) - read)
    return Usage(read, write, max(0, total - read - write))


def priced(usage: Usage, cache: CachePolicy) -> float:
    """Dollars a call billed `usage` costs at the policy's prices."""
    p = cache.prices
    return (usage.cache_read * p.cache_read + usage.cache_write * p.cache_write + usage.uncached * p.input) / PER_TOKEN


def banked(previous: PreviousRender | None, state: CacheState, history: int, usage: Usage, cache: CachePolicy) -> float:
    """What the session's calls have saved so far, with this one billed `usage`, against an
    agent sending its whole history (`history` tokens now; `previous.history_tokens` at the
    previous call), each call caching its prompt to its end, with the same cache's age."""
    before = previous.history_tokens if previous is not None else 0
    whole_state = CacheState(
        before if previous is not None else 0,
        state.age_seconds,
        state.ttl_seconds,
        None if state.breakpoints is None else (before,) if before >= MIN_CACHED_TOKENS else (),
    )
    whole = predicted_usage(whole_state, before, None, history, cache)
    return (previous.banked if previous is not None else 0.0) + priced(whole, cache) - priced(usage, cache)


def call_costs(
    previous: PreviousRender | None, current: PreviousRender, usage: Usage, cache: CachePolicy
) -> tuple[float, float]:
    """What the call made with the render `current` (billed `usage`) is expected to cost, and
    what the same call sending the whole history would (the bank's two sides), in dollars."""
    view = priced(usage, cache)
    return view, view + current.banked - (previous.banked if previous is not None else 0.0)


def value_now(saving: int, radius: int, cache: CachePolicy, calls: int | None = None) -> float:
    """What applying an edit now saves over `calls` (the policy's expected calls) later calls."""
    read = cache.prices.cache_read / PER_TOKEN
    write = cache.prices.cache_write / PER_TOKEN
    rewritten = max(0, radius - max(saving, 0))
    return (cache.expected_calls if calls is None else calls) * saving * read - rewritten * (write - read)


def stake(saving: int, radius: int, cache: CachePolicy) -> float:
    """What applying an edit now loses if the session ends after the next call (0: nothing)."""
    return max(0.0, -value_now(saving, radius, cache, calls=1))


def schedule(
    edits: Sequence[Costed],
    state: CacheState,
    cache: CachePolicy,
    utilization: float,
    force: bool = False,
    bank: float = 0.0,
) -> list[Timing]:
    """Decide, for each edit, whether it applies in this render.

    One invalidation read up to offset s rewrites everything after s, so
    every edit at or after s can ride on it. Of the suffixes "all edits from
    s on" (s where the cache stops reading for some edit), the one worth most
    (if any is worth anything) is applied. An edit that pays on its own is
    always in it: starting where the cache stops reading for that edit is
    worth more than starting at any later such point. Under `stakes: banked`
    only a rewrite whose stake is within what the session has saved so far
    (`bank`: `banked`) is considered.
    """
    total = state.previous_tokens
    radii = [max(0, total - state.read_until(e.position)) for e in edits]
    values = [value_now(e.saving, r, cache) for e, r in zip(edits, radii, strict=True)]
    if force or state.cold:
        why = "applied by the operator" if force else "the cache is cold: nothing cached to keep"
        return [Timing(True, why, r, v) for r, v in zip(radii, values, strict=True)]

    starts = sorted({total - r for r in radii if r > 0})
    # What the rewrite from a start saves: the reductions from there on (by their positions, with
    # what those from each on save: a bisect a start, where a sum each was quadratic in the
    # edits waiting). An edit that grows the view (an insert) rides on the rewrite, but is no
    # reason to make it; counting it here could pass over an earlier start that pays for every
    # reduction after it.
    reducing = sorted((e.position, max(0, e.saving)) for e, r in zip(edits, radii, strict=True) if r > 0)
    positions = [p for p, _ in reducing]
    from_each = [*reversed(list(accumulate(s for _, s in reversed(reducing)))), 0]
    limited = cache.stakes == BANKED
    best: int | None = None
    best_value = 0.0
    over_stake: tuple[float, int] | None = None  # the best start left out for its stake: (worth, start)
    for start in starts:
        saving = from_each[bisect_left(positions, start)]
        worth = value_now(saving, total - start, cache)
        if worth <= best_value:
            continue
        if limited and stake(saving, total - start, cache) > bank:
            if over_stake is None or worth > over_stake[0]:
                over_stake = (worth, start)
            continue
        best, best_value = start, worth
    cause = (
        f"the edits from token {best} on pay for one invalidation (${best_value:.6f} over {cache.expected_calls} calls)"
    )
    if best is None and starts and utilization >= cache.high_water:
        best, cause = starts[0], f"the view is at {utilization:.0%} of its budget (high water)"
    # The first edit of the rewrite is the one that makes it; the others ride on it.
    lead = min(
        (e.position for e, r in zip(edits, radii, strict=True) if r > 0 and e.position >= (best or 0)), default=0
    )

    timings = []
    for edit, radius, value in zip(edits, radii, values, strict=True):
        if radius == 0:
            timings.append(Timing(True, "it touches only the tail the cache has not seen", 0, value))
        elif best is not None and edit.position >= best:
            why = cause if edit.position == lead else f"rides on the rewrite from token {best}"
            timings.append(Timing(True, why, radius, value))
        else:
            calls = cache.expected_calls
            if over_stake is not None and edit.position >= over_stake[1]:
                cost = (
                    f"the rewrite from token {over_stake[1]} would pay (${over_stake[0]:.6f} over {calls} calls) but"
                    f" would lose more than the session has saved so far (${max(bank, 0.0):.6f}) if it ended next"
                )
            elif value < 0:
                cost = f"applying now would cost ${-value:.6f} more than it saves over {calls} calls"
            else:
                cost = f"applying now would save nothing over {calls} calls"
            timings.append(Timing(False, cost, radius, value))
    return timings
