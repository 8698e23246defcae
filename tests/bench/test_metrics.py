"""The lab's metrics on tiny cases computed by hand."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from contextd_lab.cache import Billed, Segment
from contextd_lab.metrics import percentile, quality, summarize
from contextd_lab.replay import Call, Run, _segments, _shared, answer_terms, used_and_hidden, view_text


def label(index: int, keep: str, needs: tuple[int, ...] = (), oracle: str | None = None) -> dict[str, Any]:
    return {"index": index, "category": f"c{index}", "keep": keep, "needs": list(needs), "oracle": oracle}


# Items (seq = index + 1): 1 needed whole; 2 and 3 copies of each other (the oracle prunes 3);
# 4 an error whose residue is enough (the oracle reduces it); 5 superseded by 6 (the oracle prunes 5).
LABELS = [
    label(0, "full"),
    label(1, "none", needs=(2,)),
    label(2, "none", needs=(1,), oracle="placeholder"),
    label(3, "residue", oracle="residue"),
    label(4, "none", needs=(5,), oracle="placeholder"),
    label(5, "full"),
]


def test_the_oracles_own_prunes_are_all_true_and_all_found() -> None:
    q = quality({3: "placeholder", 4: "reduced", 5: "placeholder"}, LABELS)
    assert (q.prunes, q.false_prunes, q.oracle, q.taken) == (3, (), 3, 3)
    assert (q.precision, q.recall) == (1.0, 1.0)


def test_the_other_copy_of_a_duplicate_counts_for_the_oracles() -> None:
    q = quality({2: "placeholder"}, LABELS)  # the older copy instead of the newer
    assert (q.false_prunes, q.taken, q.recall) == ((), 1, pytest.approx(1 / 3))


def test_false_prunes_whole_items_residues_behind_placeholders_and_both_copies() -> None:
    q = quality({1: "reduced", 2: "placeholder", 3: "placeholder", 4: "placeholder", 6: "placeholder"}, LABELS)
    # 1 is needed whole (even reduced is wrong); 2 and 3 both went in one render, each needing
    # the other: one copy could go, the later is the false prune; 4 needed its residue; 6 is
    # needed whole.
    assert q.false_prunes == (1, 3, 4, 6)
    assert q.precision == pytest.approx(1 / 5)
    assert q.taken == 1  # the pair's opportunity, through the copy rightly pruned
    assert q.by_category == {"c0": 1, "c1": 1, "c2": 1, "c3": 1, "c5": 1}


def test_a_prune_is_judged_at_the_render_that_made_it() -> None:
    shown = {seq: seq for seq in range(1, 7)}  # item k first in render k
    # 5 pruned once 6 (what carries it) is there: true; pruned a render before: false, whatever came later.
    assert quality({5: "placeholder"}, LABELS, {5: 6}, shown).false_prunes == ()
    assert quality({5: "placeholder"}, LABELS, {5: 5}, shown).false_prunes == (5,)
    # Copies pruned in different renders: the second, pruned while the first was already gone, is false.
    assert quality({2: "placeholder", 3: "placeholder"}, LABELS, {2: 8, 3: 7}, shown).false_prunes == (2,)
    # A carrier pruned wrongly in the same render takes the item down with it.
    assert quality({5: "placeholder", 6: "placeholder"}, LABELS, {5: 7, 6: 7}, shown).false_prunes == (5, 6)


def test_a_condition_that_prunes_nothing_is_precise_and_finds_nothing() -> None:
    q = quality({}, LABELS)
    assert (q.precision, q.recall) == (1.0, 0.0)
    assert quality({}, [label(0, "full")]).recall == 1.0  # nothing to find


def test_a_pruned_item_whose_needed_partner_stayed_is_true() -> None:
    q = quality({5: "placeholder"}, LABELS)
    assert (q.false_prunes, q.taken) == ((), 1)
    assert quality({5: "placeholder", 6: "placeholder"}, LABELS).false_prunes == (5, 6)


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def call(tokens: int, dollars: float, divergence: int | None = None, radius: int = 0, ms: float = 1.0) -> Call:
    billed = {p: Billed(tokens // 2, 0, tokens - tokens // 2, dollars) for p in ("anthropic", "openai")}
    return Call(tokens, ms, billed, (), divergence, radius)


def test_summary_of_a_run_against_the_raw_one() -> None:
    raw = Run("t", "A-raw", calls=[call(1000, 0.5), call(2000, 0.5)])
    run = Run("t", "X", calls=[call(800, 0.25, ms=2.0), call(1200, 0.5, divergence=300, radius=500, ms=4.0)])
    run.decisions = Counter(prune=2, abstain=1, no_gain=1)
    run.probes = ["visible", "recoverable", "visible"]
    run.needed = [None, "recoverable", "lost"]
    run.final = [(1, "full", 10, ""), (2, "placeholder", 5, "h2"), (3, "reduced", 4, "h3")]
    s = summarize(run, raw, user_seqs={1, 3})
    assert s.sent == 2000
    assert s.reduction == pytest.approx(1 - 2000 / 3000)
    assert s.cost["anthropic"] == pytest.approx(0.75)
    assert s.cache["openai"] == (400 + 600, 0, 400 + 600)
    assert (s.breaks, s.radius, s.first_divergence) == (1, 500, 300.0)
    assert (s.abstention, s.no_gain) == (0.25, 0.25)
    assert (s.render_p50, s.render_p99) == (2.0, 4.0)
    assert s.probes == {"visible": 2, "recoverable": 1}
    assert s.needed == {"recoverable": 1, "lost": 1}
    assert s.user_turns_reduced == 1  # user turn 3 shown reduced


class Shown:
    def __init__(self, message_index: int, tokens: int) -> None:
        self.message_index, self.tokens = message_index, tokens


def test_a_prompts_segments_are_its_messages_with_their_tokens() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    items = [Shown(0, 10), Shown(1, 7), Shown(1, 3)]  # two items in one message
    first = _segments(messages, items, framing=8)
    assert [s.tokens for s in first] == [14, 14]
    again = _segments([messages[0], {"role": "user", "content": "changed"}], items, framing=8)
    assert again[0] == first[0] and again[1] != first[1]
    assert _shared(first, again) == 1
    assert _shared(first, (*first, Segment("x", 1))) == 2


def test_an_identifier_the_answer_used_is_hidden_when_the_history_had_it_and_the_view_did_not() -> None:
    answer = {
        "role": "assistant",
        "content": "THOUGHT: `rel_obj_attr(rel_obj)` gets the key; see the loop.",
        "tool_calls": [{"id": "c9", "name": "bash", "arguments": {"command": "grep -n is_sliced query.py"}}],
    }
    terms = answer_terms(answer)
    assert set(terms) == {"rel_obj_attr", "rel_obj", "is_sliced", "query.py"}  # no prose, no JSON escapes
    history = "for rel_obj in queryset:\n    instance = instances_dict[rel_obj_attr(rel_obj)]\n... query.py"
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat query.py"}'}}
    view = view_text(
        [
            {"role": "system", "content": "agent"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "def get(self):\n    # [... lines 3-9 left out ...]"},
        ]
    )
    assert "cat query.py" in view  # a call's arguments, decoded from their JSON text
    # `is_sliced` was never in the history (the model's own guess): not counted.
    assert used_and_hidden(terms, history, view) == (3, ["rel_obj_attr", "rel_obj"])
    assert used_and_hidden(terms, history, view + "\nrel_obj_attr(rel_obj)") == (3, [])
    # Whole names: `rel_obj` is not shown by `rel_obj_attr`, nor `query.py` by `test_query.py`.
    assert used_and_hidden(["rel_obj", "query.py"], "rel_obj query.py", "rel_obj_attr test_query.py") == (
        2,
        ["rel_obj", "query.py"],
    )


def test_a_runs_hidden_identifiers_are_summarized() -> None:
    run = Run("t", "default", used=7, hidden=[(3, "rel_obj"), (5, "rel_obj_attr")])
    raw = Run("t", "A-raw")
    s = summarize(run, raw, set())
    assert (s.used, s.hidden) == (7, 2)
