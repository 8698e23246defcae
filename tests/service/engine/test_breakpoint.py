"""The cache breakpoint the view places: where (on hand-computed cases), how the engine prices
the next render from it, and the mark in the Messages format."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from contextd.engine.breakpoint import Breakpoint, judged, paid_share, place
from contextd.engine.certificates import Decision
from contextd.engine.model import Item, ItemContent, ReasoningBlock, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.pipeline import RenderInput, RenderOutput, render
from contextd.engine.policy import PREFIX, PROVIDER_PRICES, CachePolicy, parse_policy
from contextd.engine.render.anthropic import CACHE_CONTROL, mark_breakpoint, render_anthropic
from contextd.engine.state import PreviousRender, Segment, ViewState, state_from_json, state_to_json
from contextd.engine.timing import Usage, cache_state, predicted_usage
from contextd.engine.types import CacheState
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_lab.cache import PromptCache
from contextd_lab.replay import _segments, cached_messages
from tests.helpers import counter, make_item, make_session
from tests.service.engine.test_pipeline import ANTHROPIC, OPENAI, REGISTRY, history, sent, tool_round
from tests.validators import check_anthropic

CACHE = CachePolicy()  # Anthropic: input $3, write $3.75, read $0.30 per M; 12 calls expected, 6 counted here


def segments(*sizes: tuple[int, int]) -> list[Segment]:
    return [Segment(seq, "", tokens) for seq, tokens in sizes]


def test_the_breakpoint_goes_before_an_output_the_next_render_reduces_when_that_pays() -> None:
    point = place(segments((1, 2_000), (2, 100), (3, 3_000)), {3: 300}, CACHE)
    # (3.75 + 0.30 - 3) x 3,000 - 3.75 x 300 + 5 x 0.30 x 2,700, per million
    assert point == Breakpoint(through=2, before=3, offset=2_100, value=pytest.approx(6_075 / 1e6))


def test_an_output_sent_uncached_and_not_reduced_costs_what_it_saves() -> None:
    # Item 4 follows: sent uncached now and written next call (-(3 - 0.30) x 5,000) outweighs item 3.
    assert place(segments((1, 2_000), (2, 100), (3, 3_000), (4, 5_000)), {3: 300}, CACHE) is None
    # A reduction that keeps most of the output does not pay either: 3,150 - 9,375 + 750.
    assert place(segments((1, 2_000), (2, 100), (3, 3_000)), {3: 2_500}, CACHE) is None


def test_the_breakpoint_goes_where_what_follows_is_worth_most() -> None:
    # From item 3 on: 3,150 - 375 + 4,350 = 7,125; from item 2 on it adds 3,150 - 10,875 + 150.
    point = place(segments((1, 2_000), (2, 3_000), (3, 3_000)), {2: 2_900, 3: 100}, CACHE)
    assert point is not None and (point.through, point.before, point.offset) == (2, 3, 5_000)


def test_no_breakpoint_where_the_provider_would_cache_nothing_or_after_inserted_content() -> None:
    assert place(segments((1, 500), (2, 3_000)), {2: 100}, CACHE) is None  # 500 tokens: under the minimum
    assert place(segments((1, 2_000), (-1, 50), (2, 3_000)), {2: 100}, CACHE) is None
    assert place(segments((1, 2_000), (2, 3_000)), {}, CACHE) is None
    # An item shown in pieces counts whole, from its first.
    assert place(segments((1, 2_000), (2, 1_500), (2, 1_500)), {2: 300}, CACHE) == place(
        segments((1, 2_000), (2, 3_000)), {2: 300}, CACHE
    )


def test_the_engine_prices_the_next_render_from_the_breakpoint() -> None:
    previous = PreviousRender(0.0, tuple(segments((1, 2_000), (2, 3_000))), cached_through=2_000)
    state = cache_state(previous, 30.0, CACHE)
    assert (state.previous_tokens, state.breakpoints) == (2_000, (2_000,))
    assert state.read_until(2_500) == 2_000  # an edit past it rewrites nothing the cache holds
    stored = ViewState(renders={"openai_chat": previous})
    assert state_from_json(state_to_json(stored)) == stored


# ------------------------------------------------------------------- the render

FIRST_LINE = """
protection: {last_turns: 1}
rules: [{name: first-line, transform: first_line, when: {roles: [tool]}}]
"""
PLACING = FIRST_LINE + "cache: {stakes: unlimited}\n"
"""The same, an early breakpoint staking any amount: where the guess alone puts it (the bound on
its stake, `stakes: banked`, is the last tests')."""
BODY = "\n".join(f"body line {n}: value {n * 7} of the long listing" for n in range(300))


def rounds(count: int) -> list[ItemContent]:
    return [c for n in range(count) for c in tool_round(f"c{n}", "read_file", f"head {n}\n{BODY}")]


def task(n: int) -> list[Item]:
    """A long task statement (which stays: enough for the provider to cache), and `n` tool rounds."""
    return history(*[rounds(n)], user="Fix the parser; the listing:\n" + BODY)


def go(n: int, state: ViewState, now: float, fmt: ViewFormat, placed: bool = True) -> RenderOutput:
    items = task(n)
    request = ViewRequest(fmt, place_breakpoint=placed)
    policy = parse_policy(PLACING, REGISTRY)
    return render(RenderInput(make_session(len(items)), items, policy, request, counter(), REGISTRY, state, now))


@pytest.mark.parametrize("fmt", [OPENAI, ANTHROPIC])
def test_a_render_caches_up_to_the_newest_output_and_the_next_reduces_it_for_free(fmt: ViewFormat) -> None:
    first = go(2, ViewState(), 0.0, fmt)
    items = task(2)
    newest, call = items[-1].seq, items[-2].seq
    assert first.view.cache_breakpoint_seq == call  # cached through the call, not its output
    assert sent(first, fmt).cached_through == sent(first, fmt).offsets()[newest]
    second = go(3, first.state, 30.0, fmt)
    [pruned] = [c for c in second.certificates if c.seq == newest]
    assert (pruned.decision, pruned.mutation_radius_tokens) == (Decision.PRUNE, 0)
    assert pruned.rationale == "it touches only the tail the cache has not seen"

    # With the caller's breakpoint at the end, the same edit would rewrite what the cache holds.
    end = go(2, ViewState(), 0.0, fmt, placed=False)
    assert end.view.cache_breakpoint_seq == 0 and sent(end, fmt).cached_through is None
    [priced] = [c for c in go(3, end.state, 30.0, fmt, placed=False).certificates if c.seq == newest]
    assert priced.mutation_radius_tokens > 0


def test_the_messages_view_carries_one_mark_where_the_breakpoint_is() -> None:
    first = go(2, ViewState(), 0.0, ANTHROPIC)
    messages = json.loads(first.view.messages_json)
    check_anthropic(json.loads(first.view.system_json), messages)
    marked = [(i, b) for i, m in enumerate(messages) if isinstance(m["content"], list) for b in m["content"]]
    marked = [(i, b) for i, b in marked if "cache_control" in b]
    assert [(b["type"], b["cache_control"]) for _, b in marked] == [("tool_use", CACHE_CONTROL)]
    assert marked[0][0] == len(messages) - 2  # the call's message: its output, last, is not cached
    # The mark is the view's only: what the state keeps (and the next render compares) is unmarked.
    assert "cache_control" not in json.dumps(list(first.state.renders[ANTHROPIC.value].segments))
    second = go(2, first.state, 10.0, ANTHROPIC)
    assert second.view.stable_prefix_tokens == sent(first, ANTHROPIC).total_tokens


def test_without_an_output_to_reduce_the_mark_goes_at_the_end() -> None:
    quiet = history(tool_round("c0", "read_file", "short"))
    policy = parse_policy(FIRST_LINE, REGISTRY)

    def view(request: ViewRequest) -> tuple[list[dict[str, object]], str]:
        out = render(RenderInput(make_session(len(quiet)), quiet, policy, request, counter(), REGISTRY))
        assert out.view.cache_breakpoint_seq == 0
        return json.loads(out.view.messages_json), out.view.messages_json + out.view.system_json

    messages, marked = view(ViewRequest(ANTHROPIC, place_breakpoint=True))
    assert messages[-1]["content"][-1]["cache_control"] == CACHE_CONTROL  # type: ignore[index]
    assert marked.count('"cache_control"') == 1
    assert view(ViewRequest(ANTHROPIC))[1].count('"cache_control"') == 0
    assert view(ViewRequest(OPENAI, place_breakpoint=True))[1].count('"cache_control"') == 0


def messages(parts: tuple[str, ...]) -> list[Any]:
    """The messages of a view's parts (each message's JSON)."""
    return [json.loads(part) for part in parts]


def test_the_mark_on_a_lone_text_a_system_prompt_and_past_thinking() -> None:
    system = make_item(Role.SYSTEM, TextBlock("You are terse."), seq=1)
    user = make_item(Role.USER, TextBlock("hello"), seq=2)
    thinking = ReasoningBlock("pondering", signature="sig")
    answer = make_item(Role.ASSISTANT, TextBlock("hi"), thinking, seq=3)
    rendered = render_anthropic([system, user, answer])
    parts, system_json = mark_breakpoint(rendered, user) or ((), "")
    [opening] = messages(parts)[0]["content"]
    assert opening == {"type": "text", "text": "hello", "cache_control": CACHE_CONTROL}
    assert json.loads(system_json) == "You are terse."
    _, on_system = mark_breakpoint(rendered, system) or ((), "")
    assert json.loads(on_system) == [{"type": "text", "text": "You are terse.", "cache_control": CACHE_CONTROL}]
    at_end, _ = mark_breakpoint(rendered) or ((), "")
    last = messages(at_end)[-1]["content"]
    assert [("cache_control" in b) for b in last] == [True, False]  # a thinking block takes no mark
    check_anthropic(json.loads(system_json), messages(at_end))


def test_between_items_of_one_message_only_tool_results_in_order_are_marked() -> None:
    opening = make_item(Role.USER, TextBlock("go"), seq=1)
    calls = make_item(Role.ASSISTANT, ToolUseBlock("t1", "bash", "{}"), ToolUseBlock("t2", "bash", "{}"), seq=2)
    note = make_item(Role.USER, TextBlock("while they run: also check b.py"), seq=3)
    first = make_item(Role.TOOL, ToolResultBlock("t1", (TextBlock("one"),)), seq=4)
    second = make_item(Role.TOOL, ToolResultBlock("t2", (TextBlock("two"),)), seq=5)
    # The results go first in the user turn, before the note: a mark after the note would cache them.
    mixed = render_anthropic([opening, calls, note, first, second])
    assert mark_breakpoint(mixed, note, shared=True) is None
    assert mark_breakpoint(mixed, calls) is not None  # the message before: nothing reordered
    results = render_anthropic([opening, calls, first, second])
    parts, _ = mark_breakpoint(results, first, shared=True) or ((), "")
    marks = ["cache_control" in b for b in messages(parts)[-1]["content"]]
    assert marks == [True, False]
    # Without items after it in its message, the message's last block takes the mark.
    parts, _ = mark_breakpoint(results, second) or ((), "")
    assert ["cache_control" in b for b in messages(parts)[-1]["content"]] == [False, True]


def test_an_empty_text_takes_no_mark() -> None:
    user = make_item(Role.USER, TextBlock("hello"), seq=1)
    silent = make_item(Role.ASSISTANT, TextBlock(""), seq=2)
    rendered = render_anthropic([user, silent])
    assert mark_breakpoint(rendered) is None
    assert mark_breakpoint(rendered, user) is not None


def test_the_breakpoint_never_leaves_out_what_the_call_reads_from_the_cache() -> None:
    assert place(segments((1, 2_000), (2, 3_000), (3, 100)), {2: 100}, CACHE, floor=5_000) is None
    assert place(segments((1, 2_000), (2, 3_000), (3, 100)), {2: 100}, CACHE, floor=2_000) is not None
    # Two turns protected: what lapses next is from the turn before last, which the previous
    # call cached; a breakpoint before it would make the call read nothing back.
    policy = parse_policy(FIRST_LINE.replace("last_turns: 1", "last_turns: 2"), REGISTRY)

    def bill(placed: bool) -> float:
        request = ViewRequest(OPENAI, place_breakpoint=placed)
        state, cache, dollars = ViewState(), PromptCache("anthropic"), 0.0
        for n in range(1, 9):
            # Long outputs and short ones in turn: a long one lapses when a short one is the newest.
            outputs = [f"head {k}\n{BODY}" if k % 2 == 0 else f"short {k}" for k in range(n)]
            rounds = [c for k, text in enumerate(outputs) for c in tool_round(f"c{k}", "read_file", text)]
            items, now = history(rounds, user="Fix the parser; the listing:\n" + BODY), n * 30.0
            out = render(RenderInput(make_session(len(items)), items, policy, request, counter(), REGISTRY, state, now))
            prompt = _segments(json.loads(out.view.messages_json), out.view.items, out.view.framing_tokens)
            dollars += cache.call(prompt, now, cached_messages(out.view)).dollars
            state = out.state
        return dollars

    assert bill(placed=True) <= bill(placed=False)


def test_for_a_provider_that_caches_any_prefix_the_mark_goes_at_the_end() -> None:
    items = task(2)
    policy = parse_policy(FIRST_LINE + "cache: {reads: prefix}\n", REGISTRY)
    request = ViewRequest(ANTHROPIC, place_breakpoint=True)
    out = render(RenderInput(make_session(len(items)), items, policy, request, counter(), REGISTRY))
    assert out.view.cache_breakpoint_seq == 0 and sent(out, ANTHROPIC).cached_through is None
    last = json.loads(out.view.messages_json)[-1]["content"][-1]
    assert last["type"] == "tool_result" and last["cache_control"] == CACHE_CONTROL


def test_the_usage_a_call_is_expected_to_be_billed() -> None:
    cold = CacheState(0, None, 300)
    assert predicted_usage(cold, 0, 5_000, 5_000, CACHE) == Usage(0, 5_000, 0)  # written whole
    warm = CacheState(5_000, 30.0, 300, (2_000, 5_000))
    assert predicted_usage(warm, 5_000, 6_000, 6_000, CACHE) == Usage(5_000, 1_000, 0)
    # A change at 3,000: read back to the last cached end before it, the rest written again.
    assert predicted_usage(warm, 3_000, 6_000, 6_000, CACHE) == Usage(2_000, 4_000, 0)
    # The view's breakpoint at 5,500: what follows goes uncached.
    assert predicted_usage(warm, 5_000, 5_500, 6_000, CACHE) == Usage(5_000, 500, 500)
    expired = CacheState(5_000, 301.0, 300, ())
    assert predicted_usage(expired, 5_000, 6_000, 6_000, CACHE) == Usage(0, 6_000, 0)
    # OpenAI reads any shared prefix of 1,024 tokens or more, in steps of 128 past them, and
    # writing costs nothing more.
    openai = CachePolicy(provider="openai", prices=PROVIDER_PRICES["openai"], reads=PREFIX)
    prefix = CacheState(5_000, 30.0, 300)
    assert predicted_usage(prefix, 3_000, 6_000, 6_000, openai) == Usage(2_944, 0, 3_056)  # 1,024 + 15 x 128
    assert predicted_usage(prefix, 800, 6_000, 6_000, openai) == Usage(0, 0, 6_000)


def test_each_render_says_how_its_call_is_expected_to_be_billed() -> None:
    first = go(2, ViewState(), 0.0, OPENAI)
    # Written up to the breakpoint, with the framing of the messages before it (3 tokens each).
    through = next(s.message_index for s in first.view.items if s.seq == first.view.cache_breakpoint_seq)
    written = sent(first).cached_tokens + 3 * (through + 1)
    assert first.predicted == Usage(0, written, first.view.total_tokens - written)
    second = go(3, first.state, 30.0, OPENAI)
    assert second.predicted.cache_read == written  # what the first call cached, read back whole
    assert sum((written, second.predicted.cache_write, second.predicted.uncached)) == second.view.total_tokens


def test_an_expected_reduction_that_may_not_come_is_priced_as_such() -> None:
    shape, shrinks = segments((1, 2_000), (2, 100), (3, 3_000)), {3: 300}
    assert place(shape, shrinks, CACHE, paid=1.0) == place(shape, shrinks, CACHE)
    # Half the time it comes: 0.5 x 6,075 - 0.5 x 2.70 x 3,000 < 0: at the end.
    assert place(shape, shrinks, CACHE, paid=0.5) is None
    assert place(shape, shrinks, CACHE, paid=0.8) is not None  # 4,860 - 1,620


def test_the_record_judges_each_early_breakpoint_by_the_render_after_it() -> None:
    previous = PreviousRender(0.0, tuple(segments((1, 2_000), (2, 3_000))), cached_through=2_000, early=(3.0, 2.0))
    # Each render weighs what came before by 0.9, then adds its judgement of the previous one.
    assert judged(previous, 2_000) == (3.7, 2.8)  # the item after the breakpoint changed: it paid
    assert judged(previous, 5_000) == (3.7, 1.8)  # nothing changed but what was appended: it did not
    assert judged(previous, 1_000) == (2.7, 1.8)  # an edit before it: nothing to judge
    assert judged(replace(previous, cached_through=None), 5_000) == (2.7, 1.8)  # at the end
    assert judged(None, 0) == (0.0, 0.0)
    assert (paid_share((0.0, 0.0)), paid_share((1.0, 0.0)), paid_share((4.0, 3.0))) == (1.0, 0.5, 0.8)
    stored = ViewState(renders={"anthropic_messages": previous})
    assert state_from_json(state_to_json(stored)) == stored


def test_a_session_whose_expected_reductions_never_come_stops_placing_the_breakpoint_early() -> None:
    """The agent pins each output after the call that reads it: the reduction the view placed its
    breakpoint for never comes, and each such breakpoint costs more than one at the end."""
    policy = parse_policy(PLACING, REGISTRY)
    state, placed = ViewState(), []
    for n in range(2, 14):
        items = task(n)
        newest = items[-1].seq
        pins = frozenset(i.seq for i in items if i.role is Role.TOOL and i.seq != newest)
        request = ViewRequest(ANTHROPIC, place_breakpoint=True)
        out = render(
            RenderInput(
                make_session(len(items)), items, policy, request, counter(), REGISTRY, state, 30.0 * n, pins=pins
            )
        )
        placed.append(out.view.cache_breakpoint_seq not in (0, items[-1].seq))
        state = out.state
    # Placed at first; after it did not pay, only again once that has faded, and seldom.
    assert placed[:2] == [True, False] and sum(placed) <= 3, placed
    count, paid = sent(out, ANTHROPIC).early
    assert paid == 0 and count > 0  # every one judged, none paid


@pytest.mark.parametrize("calls", [12, 38])
def test_a_session_whose_expected_reductions_never_come_costs_no_more_than_the_breakpoint_at_the_end(
    calls: int,
) -> None:
    """As above, priced as the provider bills it: each early breakpoint that does not pay is paid
    for out of what the session saved, never beyond it, so the session costs at most what the
    agent's own breakpoint at the end (here, raw's prompts) costs."""
    policy = parse_policy(FIRST_LINE, REGISTRY)

    def bill(placed: bool) -> tuple[float, int]:
        state, cache, dollars, early = ViewState(), PromptCache("anthropic"), 0.0, 0
        for n in range(2, calls + 2):
            items = task(n)
            newest = items[-1].seq
            pins = frozenset(i.seq for i in items if i.role is Role.TOOL and i.seq != newest)
            request = ViewRequest(OPENAI, place_breakpoint=placed)  # (the lab's digest of a message
            now = 30.0 * n  # counts a moved mark as a change; the provider does not)
            out = render(
                RenderInput(
                    make_session(len(items)), items, policy, request, counter(), REGISTRY, state, now, pins=pins
                )
            )
            early += out.view.cache_breakpoint_seq not in (0, newest)
            prompt = _segments(json.loads(out.view.messages_json), out.view.items, out.view.framing_tokens)
            dollars += cache.call(prompt, now, cached_messages(out.view)).dollars
            state = out.state
        return dollars, early

    (placed, early), (at_end, _) = bill(placed=True), bill(placed=False)
    assert placed <= at_end * (1 + 1e-9), (placed / at_end - 1, early)


def test_with_its_stake_bounded_the_breakpoint_still_goes_early_once_the_session_has_saved() -> None:
    policy = parse_policy(FIRST_LINE, REGISTRY)  # `stakes: banked`, the default
    state, cache, early, dollars = ViewState(), PromptCache("anthropic"), [], 0.0
    for n in range(2, 32):
        items = task(n)
        request, now = ViewRequest(OPENAI, place_breakpoint=True), 30.0 * n
        out = render(RenderInput(make_session(len(items)), items, policy, request, counter(), REGISTRY, state, now))
        early.append(out.view.cache_breakpoint_seq not in (0, items[-1].seq))
        prompt = _segments(json.loads(out.view.messages_json), out.view.items, out.view.framing_tokens)
        dollars += cache.call(prompt, now, cached_messages(out.view)).dollars
        state = out.state
    # Nothing saved at first: at the end, as the agent would put it, while each reduction is a
    # rewrite that stakes what was saved. Once the savings cover the stake, early every time.
    assert not early[0] and early[-10:] == [True] * 10, early
    assert state.renders[OPENAI.value].banked > 0
