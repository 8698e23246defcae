"""The known systems' rules, as the lab runs them: they prune what they say, traps included."""

from __future__ import annotations

from contextd.engine.certificates import Decision
from contextd.engine.pipeline import render
from tests.service.engine.test_strategies import BODY, policy_input, run_policy, seq_of, session

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


def test_context_editing_clears_all_but_the_last_tool_uses_once_past_its_trigger() -> None:
    calls = tuple((f"cat f{n}.py", f"file {n}\n" + BODY) for n in range(5))
    clear = "baseline_clear_tool_uses"
    assert pruned(POLICY % (clear, "{keep: 3, trigger_tokens: 0}"), *calls) == [seq_of(1), seq_of(2)]
    assert pruned(POLICY % (clear, "{keep: 0, trigger_tokens: 0}"), *calls) == [seq_of(n) for n in range(1, 6)]
    # The published defaults: nothing until the request holds 100,000 input tokens.
    assert pruned(POLICY % (clear, "{}"), *calls) == []
    # Not worth a cache rewrite: it would clear fewer tokens than asked for.
    assert pruned(POLICY % (clear, "{trigger_tokens: 0, clear_at_least: 100000}"), *calls) == []
    # A tool it is told to leave alone.
    assert pruned(POLICY % (clear, "{keep: 0, trigger_tokens: 0, exclude_tools: [bash]}"), *calls) == []


def test_context_editing_can_clear_the_calls_inputs_too() -> None:
    calls = tuple((f"cat f{n}.py  # {'x' * 200}", f"file {n}\n" + BODY) for n in range(4))
    document = POLICY.replace("roles: [tool]", "roles: [tool, assistant]")
    out = run_policy(
        session(*calls),
        document % ("baseline_clear_tool_uses", "{keep: 3, trigger_tokens: 0, clear_tool_inputs: true}"),
    )
    changed = {c.seq: c.reason for c in out.certificates if c.decision is Decision.PRUNE}
    assert changed == {seq_of(1) - 1: "cleared_input", seq_of(1): "cleared"}
    assert "x" * 200 in out.view.messages_json  # the inputs of the calls kept are whole


def test_context_editing_triggers_on_the_request_as_sent_not_on_what_it_cleared() -> None:
    """The API edits each request afresh: past the trigger, every later one clears too, though
    what it cleared before brought the view under the trigger."""
    calls = [(f"cat f{n}.py", f"file {n}\n" + BODY) for n in range(4)]
    three = session(*calls[:3])
    trigger = sum(item.token_count for item in three) - 1
    document = POLICY % ("baseline_clear_tool_uses", f"{{keep: 1, trigger_tokens: {trigger}}}")
    first = render(policy_input(three, document))
    assert first.view.total_tokens < trigger
    assert sorted(c.seq for c in first.certificates if c.decision is Decision.PRUNE) == [seq_of(1), seq_of(2)]
    second = render(policy_input(session(*calls), document, first.state, 30.0))
    assert [c.seq for c in second.certificates if c.decision is Decision.PRUNE] == [seq_of(3)]


def test_the_baselines_are_level_4_and_refused_below_it() -> None:
    calls = (("pytest tests", "1 failed\n" + BODY), ("pytest tests", "all passed\n" + BODY))
    below = POLICY.replace("max_level: 4", "max_level: 3") % ("baseline_latest_call", "{}")
    assert pruned(below, *calls) == []
