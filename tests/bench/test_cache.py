"""The prompt cache model on tiny cases computed by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contextd.engine.policy import Prices
from contextd_lab.cache import RULES, Billed, PromptCache, Segment

PRICES = Prices(input=3.00, cache_write=3.75, cache_read=0.30, ttl_seconds=300)


def prompt(*tokens: int, edit: int | None = None) -> list[Segment]:
    """Segments m0, m1 ... of these sizes; `edit`: that one's bytes differ."""
    return [Segment(f"m{n}{'*' if n == edit else ''}", t) for n, t in enumerate(tokens)]


def test_anthropic_reads_a_whole_earlier_prompt_and_writes_the_rest() -> None:
    cache = PromptCache("anthropic", PRICES)
    first = cache.call(prompt(1500, 500), at=0)
    assert first == Billed(cache_read=0, cache_write=2000, uncached=0, dollars=2000 * 3.75 / 1e6)
    second = cache.call(prompt(1500, 500, 300), at=60)
    assert second == Billed(cache_read=2000, cache_write=300, uncached=0, dollars=(2000 * 0.30 + 300 * 3.75) / 1e6)


def test_anthropic_misses_when_the_middle_changed_or_the_entry_expired() -> None:
    cache = PromptCache("anthropic", PRICES)
    cache.call(prompt(1500, 500), at=0)
    edited = cache.call(prompt(1500, 500, 300, edit=1), at=10)  # m1 rewritten: the breakpoint at m1's end misses
    assert (edited.cache_read, edited.cache_write) == (0, 2300)
    again = cache.call(prompt(1500, 500, 300, edit=1), at=20)
    assert again.cache_read == 2300  # its own prompt, written at 10
    late = cache.call(prompt(1500, 500, 300, edit=1), at=20 + 301)  # past the TTL since its last use
    assert (late.cache_read, late.cache_write) == (0, 2300)


def test_with_a_breakpoint_before_every_change_anthropic_reads_up_to_the_change() -> None:
    anywhere = replace(RULES["anthropic"], breakpoints=False)  # what the report prices as the most breakpoints give
    cache = PromptCache("anthropic", PRICES, rules=anywhere)
    cache.call(prompt(1500, 500), at=0)
    edited = cache.call(prompt(1500, 500, 300, edit=1), at=10)
    assert edited == Billed(cache_read=1500, cache_write=800, uncached=0, dollars=(1500 * 0.30 + 800 * 3.75) / 1e6)
    # A breakpoint the view placed still bounds what a call writes.
    placed = cache.call(prompt(1500, 500, 300, 400, edit=1), at=20, through=3)
    assert placed == Billed(cache_read=2300, cache_write=0, uncached=400, dollars=(2300 * 0.30 + 400 * 3.00) / 1e6)


def test_a_breakpoint_placed_early_caches_up_to_it_and_sends_the_rest_uncached() -> None:
    cache = PromptCache("anthropic", PRICES)
    first = cache.call(prompt(1500, 500), at=0, through=1)
    assert first == Billed(cache_read=0, cache_write=1500, uncached=500, dollars=(1500 * 3.75 + 500 * 3.00) / 1e6)
    # The next call changed what came after the breakpoint: it reads all the cache holds.
    second = cache.call(prompt(1500, 200, 300, edit=1), at=10)
    assert second == Billed(cache_read=1500, cache_write=500, uncached=0, dollars=(1500 * 0.30 + 500 * 3.75) / 1e6)
    # OpenAI caches what it caches whatever the request marks.
    openai = [PromptCache("openai", PRICES).call(prompt(1500, 500), at=0, through=t) for t in (1, None)]
    assert openai[0] == openai[1]


def test_a_use_renews_the_entry() -> None:
    cache = PromptCache("anthropic", PRICES)
    cache.call(prompt(2000), at=0)
    assert cache.call(prompt(2000, 10), at=250).cache_read == 2000
    assert cache.call(prompt(2000, 10, 10), at=500).cache_read == 2010  # the entry written at 250


def test_nothing_under_the_minimum_is_cached() -> None:
    cache = PromptCache("anthropic", PRICES)
    small = cache.call(prompt(800), at=0)
    assert small == Billed(0, 0, 800, 800 * 3.00 / 1e6)
    assert cache.call(prompt(800, 100), at=1).cache_read == 0


def test_openai_reads_the_longest_shared_prefix_in_steps_and_writes_for_free() -> None:
    cache = PromptCache("openai", Prices(input=2.50, cache_write=2.50, cache_read=1.25, ttl_seconds=300))
    first = cache.call(prompt(1000, 500, 500), at=0)
    assert first == Billed(0, 0, 2000, 2000 * 2.50 / 1e6)
    # Shares m0 and m1 (1,500 tokens): 1,024 + 3 x 128 = 1,408 are read from the cache.
    second = cache.call(prompt(1000, 500, 700, edit=2), at=5)
    assert second == Billed(1408, 0, 2200 - 1408, (1408 * 1.25 + (2200 - 1408) * 2.50) / 1e6)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_every_token_is_billed_once(provider: str) -> None:
    cache = PromptCache(provider)
    for n, at in enumerate((0, 30, 60, 400, 410)):
        sizes = [900, *([300] * n)]
        billed = cache.call(prompt(*sizes, edit=1 if at == 60 else None), at=at)
        assert billed.tokens == sum(sizes)
