"""Where the view asks the provider to end a call's cache entry (DESIGN section 6).

A provider that caches at explicit breakpoints (Anthropic) writes a call's
prompt to its cache up to the breakpoint, at the write price, and a later
call reads back only whole cached prompts. Agents put the breakpoint at the
end of each call. An output the next call compresses is then written to the
cache whole, then written again compressed; the compression must pay for
that rewrite, and often waits for it or never applies.

When the caller lets the view place the breakpoint (`ViewRequest.
place_breakpoint`), the view ends the cache entry before the newest outputs
the next render expects to reduce: those protected now, for the call that
reads them, on which a rule's edit is eligible from the next call on. This
call sends them uncached, at the input price; the next call writes them in
their new form, which costs no rewrite. Per item after the breakpoint, with
input, write and read prices i, w and r, and E expected calls, against a
breakpoint at the end (the item written now and read back next call):

    expected to shrink from T to T' tokens:  (w + r - i) T - w T' + (E/2 - 1) r (T - T')
    any other item:                          -(i - r) T

(the second: sent uncached now and written next call, instead of written now
and read). E here is half the policy's `cache.expected_calls`: the guess rests
on the agent's next turn, which may keep more of the output than this one
would, and a session may end.

The expected reduction may not come at all (the agent's next turn makes the
output matter again, a pin, a rule whose evidence lapses): the item then
costs what any other item does. So an expected item counts as
p × (its value if reduced) + (1 - p) × (its value if not), with p the
session's own record in this format (`judged`): of the early breakpoints the
next render could judge, the share that paid, the next render having changed
what followed the breakpoint. The record starts at one placement that paid
(a first breakpoint is placed as before), every one that did not lowers it,
and every render forgets a share of it (`FORGET`): a session whose
reductions do not come stops placing early, and tries again once the
failures have faded (a session's work moves on: what did not pay while the
agent was editing one file may pay while it reads logs). The breakpoint goes before the expected item
where the sum of what follows is largest, when it is positive, what it caches
is long enough for the provider to cache at all, and it leaves out nothing
the call reads from the cache; else at the end, as an agent puts it.

A guess is still a guess, and the record starts with one that paid. Under
`cache.stakes: banked` an early breakpoint also stakes no more than the
session has saved so far against sending its history whole (timing.py,
`banked`), as a rewrite of the cache does, less what a rewrite applied in the
same render stakes (both can fail at the next call). What it stakes is what
it loses when no expected reduction comes, (i - r) T over every item after
it: a session whose reductions never come pays for its guesses out of what
its other edits saved, never beyond, and costs no more than the agent's own
breakpoint at the end would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contextd.engine.policy import MIN_CACHED_TOKENS, CachePolicy
from contextd.engine.state import PreviousRender, Segment

PER_TOKEN = 1_000_000  # prices are per million tokens


@dataclass(frozen=True, slots=True)
class Breakpoint:
    through: int
    """The seq of the last item the call caches."""
    before: int
    """The seq of the first item after it: the first the next render expects to reduce."""
    offset: int
    """Tokens the call caches (those before `before`)."""
    value: float
    """Dollars it is expected to save over a breakpoint at the end."""


FORGET = 0.9
"""The weight a render leaves the record of the renders before it."""


def judged(previous: PreviousRender | None, stable: int) -> tuple[float, float]:
    """The record of early breakpoints (placements judged, placements that paid, each weighed
    by `FORGET` once per render since) once this render, sharing `stable` tokens with
    `previous`, has judged the previous render's."""
    if previous is None:
        return (0.0, 0.0)
    count, paid = (FORGET * n for n in previous.early)
    if previous.cached_through is not None and stable >= previous.cached_through:
        # (an edit before the breakpoint decided the cache itself: nothing to judge)
        count, paid = count + 1, paid + (stable < previous.total_tokens)
    return round(count, 6), round(paid, 6)  # stored as JSON: the same figures on every replica


def paid_share(record: tuple[float, float]) -> float:
    """The chance an expected reduction comes, from the record (one placement that paid before any)."""
    count, paid = record
    return (paid + 1) / (count + 1)


def place(
    segments: Sequence[Segment],
    shrinks: Mapping[int, int],
    cache: CachePolicy,
    floor: int = 0,
    total: int | None = None,
    paid: float = 1.0,
    stake: float | None = None,
) -> Breakpoint | None:
    """Where to end the cache entry of a render of `segments` (in view order; `total`: their
    tokens, when known), given the items the next render expects to reduce (`shrinks`: seq ->
    its tokens then); None: at the end. Never before `floor`, the tokens this call reads from
    the cache: a provider reads no entry that ends past the call's breakpoint. `paid`: the chance
    an expected reduction comes (`paid_share`); `stake`: the most the breakpoint may lose if none
    comes (None: no bound). Read from the end: what lapses is the newest outputs, so a render
    looks at its tail only."""
    if not shrinks:
        return None
    prices = cache.prices
    i, w, r = prices.input / PER_TOKEN, prices.cache_write / PER_TOKEN, prices.cache_read / PER_TOKEN
    later = max(1, cache.expected_calls // 2) - 1
    bound = max(floor, MIN_CACHED_TOKENS)
    best: Breakpoint | None = None
    following = 0.0  # the value of the items after the one looked at
    lost = 0.0  # what they lose if no reduction comes
    end = sum(s.tokens for s in segments) if total is None else total
    index = len(segments) - 1
    while index > 0:
        seq, tokens = segments[index].seq, segments[index].tokens
        while index > 0 and segments[index - 1].seq == seq:  # an item shown in pieces counts whole
            index -= 1
            tokens += segments[index].tokens
        start = end - tokens
        if index == 0 or start < bound:
            break  # no breakpoint before it
        if seq in shrinks:
            after = min(shrinks[seq], tokens)
            reduced = (w + r - i) * tokens - w * after + later * r * (tokens - after)
            following += paid * reduced - (1 - paid) * (i - r) * tokens
            lost += (i - r) * tokens
            if stake is not None and lost > stake:
                break  # and earlier only stakes more
            through = segments[index - 1].seq
            if through > 0 and following > (best.value if best else 0.0):
                best = Breakpoint(through, seq, start, following)
        else:
            following -= (i - r) * tokens
            lost += (i - r) * tokens
        end, index = start, index - 1
    return best
