"""The provider's prompt cache, modelled from what each call sends, and the price of each call.

A prompt is the sequence of segments a call sends (one per message, each
with a digest of its bytes and its tokens). The two providers cache
differently, and the model follows each:

* Anthropic caches a prompt up to an explicit breakpoint; an agent puts one
  at the end of each call (a view may place it earlier: `through`), so a
  later call reads from the cache the longest earlier prompt (up to its
  breakpoint) that is, whole, a prefix of its own (a change in the middle of
  the history misses it), and writes its own at the write price.
* OpenAI caches automatically the longest prefix a recent prompt shares
  with the new one, in steps of 128 tokens past the first 1,024; writing
  costs nothing more than the input.

Neither caches a prompt shorter than its minimum (1,024 tokens for the
models priced here), and an entry lives `ttl_seconds` after its last use.
Prices are the engine's provider tables (contextd.engine.policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contextd.engine.policy import PROVIDER_PRICES, Prices


@dataclass(frozen=True, slots=True)
class Segment:
    digest: str
    tokens: int


@dataclass(frozen=True, slots=True)
class CacheRules:
    min_tokens: int
    """The shortest prompt the provider caches."""
    step: int
    """Past `min_tokens`, cached lengths are multiples of this (1: any length)."""
    breakpoints: bool
    """Hits only on whole earlier prompts (explicit breakpoints), not on any shared prefix."""
    write_premium: bool
    """Caching a prompt is billed at the write price (else it costs what input costs)."""


RULES = {
    "anthropic": CacheRules(min_tokens=1024, step=1, breakpoints=True, write_premium=True),
    "openai": CacheRules(min_tokens=1024, step=128, breakpoints=False, write_premium=False),
}


@dataclass(frozen=True, slots=True)
class Billed:
    """One call's input, as the provider bills it."""

    cache_read: int
    cache_write: int
    uncached: int
    dollars: float

    @property
    def tokens(self) -> int:
        return self.cache_read + self.cache_write + self.uncached


@dataclass(slots=True)
class _Entry:
    digests: tuple[str, ...]
    ends: tuple[int, ...]
    """Tokens up to the end of each segment."""
    used_at: float


class PromptCache:
    def __init__(self, provider: str, prices: Prices | None = None, rules: CacheRules | None = None) -> None:
        self.rules = rules or RULES[provider]
        self.prices = prices or PROVIDER_PRICES[provider]
        self._entries: list[_Entry] = []

    def call(self, prompt: Sequence[Segment], at: float, through: int | None = None) -> Billed:
        """Send `prompt` at time `at` (seconds): what it reads from the cache, writes and pays.
        Where caching is paid for (explicit breakpoints), `through` puts the call's breakpoint after
        that many segments (None: at the end): the call reads and writes the cache up to it, and
        sends the rest uncached."""
        self._entries = [e for e in self._entries if at - e.used_at <= self.prices.ttl_seconds]
        head = prompt[:through] if through is not None and self.rules.write_premium else prompt
        digests = tuple(s.digest for s in head)
        ends: list[int] = []
        total = 0
        for segment in head:
            total += segment.tokens
            ends.append(total)
        hit, used = self._hit(digests, tuple(ends))
        if used is not None:
            used.used_at = at
        cached = self._cacheable(hit)
        written = 0
        if total >= self.rules.min_tokens:
            written = total - cached if self.rules.write_premium else 0
            self._entries.append(_Entry(digests, tuple(ends), at))
        uncached = total - cached - written + sum(s.tokens for s in prompt[len(head) :])
        p = self.prices
        dollars = (uncached * p.input + written * p.cache_write + cached * p.cache_read) / 1_000_000
        return Billed(cached, written, uncached, dollars)

    def _hit(self, digests: tuple[str, ...], ends: tuple[int, ...]) -> tuple[int, _Entry | None]:
        """Tokens of the longest cached prefix, and the entry holding it."""
        best, found = 0, None
        for entry in self._entries:
            shared = _shared(entry.digests, digests)
            if self.rules.breakpoints and shared < len(entry.digests):
                continue  # only a whole earlier prompt is a breakpoint
            tokens = ends[shared - 1] if shared else 0
            if tokens > best:
                best, found = tokens, entry
        return best, found

    def _cacheable(self, tokens: int) -> int:
        rules = self.rules
        if tokens < rules.min_tokens:
            return 0
        return rules.min_tokens + (tokens - rules.min_tokens) // rules.step * rules.step


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many segments two prompts share from their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
