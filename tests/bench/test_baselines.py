"""The known systems' rules, as the lab runs them: they prune what they say, traps included."""

from __future__ import annotations

from contextd.engine.certificates import Decision
from tests.service.engine.test_strategies import BODY, run_policy, seq_of, session

POLICY = """
evidence: {max_level: 4}
protection: {last_turns: 0, latest_error_per_tool: false}
tools: {bash: {effect: shell}}
rules: [{name: b, transform: %s, params: %s, when: {roles: [tool]}}]
"""


def pruned(document: str, *calls: tuple[str, str]) -> list[int]:
    out = run_policy(session(*calls), document)
    return sorted(c.seq for c in out.certificates if c.decision is Decision.PRUNE)


def test_latest_call_keeps_only_the_latest_output_of_the_same_call_trap_included() -> None:
    calls = (("pytest tests", "1 failed\n" + BODY), ("ls", "a.py\n" + BODY), ("pytest tests", "all passed\n" + BODY))
    # The older test run goes although its output differs: the trap the evidence-based rules avoid.
    assert pruned(POLICY % ("baseline_latest_call", "{}"), *calls) == [seq_of(1)]


def test_keep_last_keeps_the_last_outputs_only_once_past_its_trigger() -> None:
    calls = tuple((f"cat f{n}.py", f"file {n}\n" + BODY) for n in range(5))
    eager = "{keep: 3, trigger_tokens: 0}"
    assert pruned(POLICY % ("baseline_keep_last", eager), *calls) == [seq_of(1), seq_of(2)]
    everything = "{keep: 0, trigger_tokens: 0}"
    assert pruned(POLICY % ("baseline_keep_last", everything), *calls) == [seq_of(n) for n in range(1, 6)]
    # The published defaults: nothing until the view holds 100,000 tokens.
    assert pruned(POLICY % ("baseline_keep_last", "{keep: 3}"), *calls) == []
    # Not worth a cache rewrite: it would clear fewer tokens than asked for.
    assert pruned(POLICY % ("baseline_keep_last", "{trigger_tokens: 0, clear_at_least: 100000}"), *calls) == []


def test_the_baselines_are_level_4_and_refused_below_it() -> None:
    calls = (("pytest tests", "1 failed\n" + BODY), ("pytest tests", "all passed\n" + BODY))
    below = POLICY.replace("max_level: 4", "max_level: 3") % ("baseline_latest_call", "{}")
    assert pruned(below, *calls) == []
