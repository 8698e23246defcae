"""The view engine end to end, without I/O: rules propose, protection and the
evidence ladder decide, the cache prices the timing, repair keeps the
providers' rules, certificates record every decision."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextd.engine import view as view_module
from contextd.engine.blocks import BLOCK
from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.model import (
    ImageBlock,
    Item,
    ItemContent,
    ReasoningBlock,
    Representation,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.pipeline import AgentProposal, RenderInput, RenderOutput, render
from contextd.engine.placeholders import PREFIX, handle_of, placeholder_blocks
from contextd.engine.policy import Policy, parse_policy
from contextd.engine.prefix import Prefix
from contextd.engine.stages import budget as budget_stage
from contextd.engine.stages import messages as messages_stage
from contextd.engine.state import (
    AppliedEdit,
    ControlMode,
    PreviousRender,
    Segment,
    ViewState,
    applied_to_json,
    first_divergence,
    state_from_json,
    state_to_json,
)
from contextd.engine.timing import Usage, priced, stake
from contextd.engine.types import Remove, Reorder
from contextd.engine.view import ViewFormat, ViewRequest
from tests.helpers import counter, make_session, stored_items, to_item
from tests.service.engine.conversations import conversations
from tests.service.engine.test_changes import assert_change_makes
from tests.service.engine.transforms_for_tests import registry
from tests.validators import check_anthropic, check_converse, check_openai, check_responses

REGISTRY = registry()
OPENAI, ANTHROPIC = ViewFormat.OPENAI_CHAT, ViewFormat.ANTHROPIC_MESSAGES
CONVERSE = ViewFormat.BEDROCK_CONVERSE
RESPONSES = ViewFormat.OPENAI_RESPONSES
FORMATS = [OPENAI, ANTHROPIC, CONVERSE, RESPONSES]


def run(
    items: Sequence[Item],
    policy: str = "",
    state: ViewState | None = None,
    now: float = 1_000.0,
    fmt: ViewFormat = OPENAI,
    pins: frozenset[int] = frozenset(),
    agent: Sequence[AgentProposal] = (),
    force: bool = False,
    budget: int = 0,
    durable: Sequence[AppliedEdit] = (),
    placed: bool = False,
) -> RenderOutput:
    return render(
        RenderInput(
            session=make_session(len(items)),
            items=items,
            policy=parse_policy(policy, REGISTRY),
            request=ViewRequest(fmt, budget, place_breakpoint=placed),
            counter=counter(),
            registry=REGISTRY,
            state=state or ViewState(),
            now=now,
            pins=pins,
            agent_proposals=agent,
            force=force,
            durable=tuple(durable),
        )
    )


FILLER = "\n" + "\n".join(f"detail line {n} of the output" for n in range(12))
"""Makes an output worth pruning: larger than the placeholder that would stand in for it."""


def tool_round(call_id: str, tool: str, output: str, is_error: bool = False) -> list[ItemContent]:
    text = TextBlock(output + FILLER)
    return [
        ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock(call_id, tool, json.dumps({"path": call_id})),)),
        ItemContent(role=Role.TOOL, content=(ToolResultBlock(call_id, (text,), is_error=is_error),)),
    ]


def sent(out: RenderOutput, fmt: ViewFormat = OPENAI) -> PreviousRender:
    """What a render sent, as the next render compares against."""
    return out.state.renders[fmt.value]


def history(*rounds: list[ItemContent], user: str = "Fix the parser.") -> list[Item]:
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock(user),)),
    ]
    for r in rounds:
        contents.extend(r)
    return stored_items(contents)


def by_decision(out: RenderOutput, decision: Decision) -> list[CertificateBody]:
    return [c for c in out.certificates if c.decision is decision]


DROP_TOOL_OUTPUTS = """
protection: {last_turns: 1}
rules:
  - name: drop-outputs
    transform: drop
    when: {roles: [tool]}
"""

# ------------------------------------------------------------- prune + certify


def test_a_rule_prunes_to_placeholders_that_carry_identity_and_a_handle() -> None:
    items = history(
        tool_round("c1", "read_file", "line one\nsecret body of a.py"),
        tool_round("c2", "bash", "ran the tests: 3 passed"),
        tool_round("c3", "read_file", "the latest output"),
    )
    out = run(items, DROP_TOOL_OUTPUTS)
    pruned = by_decision(out, Decision.PRUNE)
    assert [c.seq for c in pruned] == [4, 6]  # seq 8 is in the last turn: protected
    for cert in pruned:
        item = items[cert.seq - 1]
        assert cert.handle == handle_of(item) and len(cert.handle) == 16
        assert cert.level == 2 and cert.rule == "drop-outputs" and cert.control is ControlMode.RULE
        assert cert.tokens_removed == item.token_count and cert.placeholder_tokens > 0
        assert cert.rationale == "the cache is cold: nothing cached to keep"
    messages = json.loads(out.view.messages_json)
    assert "secret body" not in out.view.messages_json
    placeholder = messages[3]["content"]
    assert placeholder.startswith(PREFIX) and handle_of(items[3]) in placeholder and "read_file" in placeholder
    assert messages[3]["tool_call_id"] == "c1"  # the pair stays a pair
    view_items = {v.seq: v for v in out.view.items}
    assert view_items[4].representation is Representation.PLACEHOLDER and view_items[4].handle == handle_of(items[3])
    assert view_items[4].tokens == pruned[0].placeholder_tokens  # the marker's tokens count against the saving
    assert view_items[8].representation is Representation.FULL and not view_items[8].handle
    check_openai(messages)


def test_edits_in_force_stay_in_force_and_are_certified_once() -> None:
    items = history(tool_round("c1", "bash", "old"), tool_round("c2", "bash", "new"))
    first = run(items, DROP_TOOL_OUTPUTS)
    second = run(items, DROP_TOOL_OUTPUTS, state=first.state, now=1_010)
    assert second.certificates == () and second.view.messages_json == first.view.messages_json
    assert second.view.stable_prefix_tokens == sent(first).total_tokens
    again = state_from_json(state_to_json(second.state))
    assert again == second.state


# ------------------------------------------------------------------ protection


PRUNE_EVERYTHING = """
evidence: {max_level: 4}
protection: {last_turns: 0}
rules: [{name: everything, transform: mask}]
"""


def test_protection_wins_over_any_rule_and_unpinning_restores_eligibility() -> None:
    items = history(
        tool_round("c1", "bash", "boom: failure", is_error=True),
        tool_round("c2", "read_file", "a.py contents"),
        tool_round("c3", "read_file", "b.py contents"),
    )
    out = run(items, PRUNE_EVERYTHING, pins=frozenset({6}))
    kept = {c.seq: c.protection for c in by_decision(out, Decision.KEEP)}
    assert kept == {
        1: "system prompt",
        2: "user instruction",
        4: "the latest error of its tool, not yet followed by a success",
        6: "pinned",
    }
    assert {c.seq for c in by_decision(out, Decision.PRUNE)} == {8}
    # The calls alone are smaller than a placeholder would be: nothing to gain.
    assert {c.seq: c.rationale for c in by_decision(out, Decision.ABSTAIN)} == dict.fromkeys(
        (3, 5, 7), "what would replace it is not smaller"
    )
    unpinned = run(items, PRUNE_EVERYTHING, state=out.state, now=1_000 + 3_600)
    assert [c.seq for c in by_decision(unpinned, Decision.PRUNE)] == [6]


def test_pinning_a_pruned_item_shows_it_in_full_again() -> None:
    items = history(tool_round("c1", "bash", "out 1"), tool_round("c2", "bash", "out 2"))
    pruned = run(items, DROP_TOOL_OUTPUTS)
    assert 4 in {c.seq for c in by_decision(pruned, Decision.PRUNE)}
    restored = run(items, DROP_TOOL_OUTPUTS, state=pruned.state, pins=frozenset({4}), now=1_010)
    assert [(c.seq, c.rationale) for c in by_decision(restored, Decision.KEEP)] == [
        (4, "protected: pinned; shown in full again")
    ]
    assert "out 1" in restored.view.messages_json


def test_a_later_success_lifts_the_latest_error_protection() -> None:
    failing = history(tool_round("c1", "bash", "E1", is_error=True), tool_round("c2", "grep", "x"))
    policy = (
        "evidence: {max_level: 4}\nprotection: {last_turns: 0, user_items: false}\n"
        "rules: [{name: m, transform: mask, when: {roles: [tool]}}]"
    )
    assert 4 not in {c.seq for c in by_decision(run(failing, policy), Decision.PRUNE)}
    fixed = history(
        tool_round("c1", "bash", "E1", is_error=True), tool_round("c2", "grep", "x"), tool_round("c3", "bash", "ok")
    )
    assert 4 in {c.seq for c in by_decision(run(fixed, policy), Decision.PRUNE)}


# ------------------------------------------------------------ evidence ladder


def test_heuristics_abstain_unless_the_policy_allows_level_4() -> None:
    items = history(tool_round("c1", "bash", "a"), tool_round("c2", "bash", "b"))
    policy = "protection: {last_turns: 0}\nrules: [{name: mask-all, transform: mask, when: {roles: [tool]}}]"
    out = run(items, policy)
    abstained = by_decision(out, Decision.ABSTAIN)
    assert [c.seq for c in abstained] == [4, 6] and not by_decision(out, Decision.PRUNE)
    assert "level 4 (predicted irrelevant) is above the policy's maximum of 3" in abstained[0].rationale
    assert run(items, policy, state=out.state, now=1_005).certificates == ()  # certified once, not every render


def test_an_identical_copy_is_checked_not_trusted() -> None:
    items = history(tool_round("c1", "read_file", "same bytes"), tool_round("c2", "read_file", "same bytes"))
    honest = run(
        items, "protection: {last_turns: 0}\nrules: [{name: d, transform: claim_copies, when: {roles: [tool]}}]"
    )
    [cert] = by_decision(honest, Decision.PRUNE)
    assert (cert.seq, cert.level, cert.evidence) == (6, 0, "identical to seq 4")
    liar = run(
        items,
        "protection: {last_turns: 0}\n"
        "rules: [{name: d, transform: claim_copies, params: {lie: true}, when: {roles: [tool]}}]",
    )
    assert [c.seq for c in by_decision(liar, Decision.ABSTAIN)] == [4]
    assert "claimed identical to items whose content differs" in by_decision(liar, Decision.ABSTAIN)[0].rationale


def test_what_a_transform_cannot_establish_is_recorded_as_abstain() -> None:
    items = history(tool_round("c1", "read_file", "x"), tool_round("c2", "bash", "y"))
    out = run(items, "protection: {last_turns: 0}\nrules: [{name: u, transform: unsure, when: {roles: [tool]}}]")
    assert [(c.seq, c.rationale) for c in by_decision(out, Decision.ABSTAIN)] == [
        (4, "could not tell which read is newer"),
        (6, "could not tell which read is newer"),
    ]


# --------------------------------------------------------- cache economics


def big_history(sizes: Sequence[int], marked: set[int]) -> list[Item]:
    """Tool rounds whose outputs have the given token counts; outputs of rounds in `marked` say PRUNE-ME."""
    rounds = [
        tool_round(f"c{n}", "read_file", f"out {n}" + (" PRUNE-ME" if n in marked else "")) for n in range(len(sizes))
    ]
    items = history(*rounds)
    sized = list(items)
    for n, tokens in enumerate(sizes):
        index = 2 + 2 * n + 1
        sized[index] = replace(items[index], token_count=tokens)
    return sized


PRUNE_MARKED = """
protection: {last_turns: 0}
cache: {expected_calls: 20}
rules: [{name: marked, transform: drop, when: {regex: PRUNE-ME}}]
"""


def test_a_prune_that_would_invalidate_a_large_cached_prefix_is_deferred_until_the_cache_is_cold() -> None:
    # A 2,000-token output early (seq 4, "position 5" of the view) ahead of ~100,000 cached tokens.
    sizes = [2_000] + [9_800] * 10
    items = big_history(sizes, marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)  # the previous render, now in the provider's cache
    assert sent(warm).total_tokens > 100_000

    deferred = run(items, PRUNE_MARKED, state=warm.state, now=60)
    [cert] = deferred.certificates
    assert (cert.decision, cert.seq) == (Decision.DEFER, 4)
    offset = sent(warm).offsets()[4]
    assert cert.first_divergence_tokens == offset
    # Anthropic (the default provider) reads only whole earlier prompts: here the one previous render.
    assert cert.mutation_radius_tokens == sent(warm).total_tokens
    assert cert.cost_effect < 0 and "more than it saves over 20 calls" in cert.rationale
    assert cert.handle == handle_of(items[3]) and cert.tokens_removed == 2_000
    assert deferred.view.messages_json == warm.view.messages_json  # the cached bytes are untouched
    assert [p.proposal.edit for p in deferred.state.pending] == [by_seq_edit(deferred, 4)]

    still_warm = run(items, PRUNE_MARKED, state=deferred.state, now=200)
    assert still_warm.certificates == ()  # deferred once, certified once
    # The same waiting edit, not a copy: what it gives its item is remembered by it (eligible.py).
    assert still_warm.state.pending[0].proposal is deferred.state.pending[0].proposal
    cold = run(items, PRUNE_MARKED, state=still_warm.state, now=200 + 301)  # past the 300 s TTL
    [applied] = cold.certificates
    assert (applied.decision, applied.seq) == (Decision.PRUNE, 4)
    assert applied.rationale == "the cache is cold: nothing cached to keep"
    assert cold.state.pending == () and "PRUNE-ME" not in cold.view.messages_json


def by_seq_edit(out: RenderOutput, seq: int) -> object:
    return next(p.proposal.edit for p in out.state.pending if getattr(p.proposal.edit, "seq", None) == seq)


def test_deferred_edits_are_applied_together_in_one_invalidation() -> None:
    sizes = [2_000, 9_800, 2_000, 9_800, 2_000] + [9_800] * 6
    items = big_history(sizes, marked={0, 2, 4})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    deferred = run(items, PRUNE_MARKED, state=warm.state, now=60)
    assert [c.decision for c in deferred.certificates] == [Decision.DEFER] * 3
    cold = run(items, PRUNE_MARKED, state=deferred.state, now=400)
    assert [(c.decision, c.seq) for c in cold.certificates] == [(Decision.PRUNE, s) for s in (4, 8, 12)]
    # One invalidation: the new view differs from the old from the first prune on, once.
    assert cold.view.stable_prefix_tokens == sent(warm).offsets()[4]


def test_a_batch_that_pays_for_one_invalidation_applies_while_the_cache_is_warm() -> None:
    # Three 2,000-token edits near the front of ~100,000 cached tokens: at 300
    # expected calls none pays for its own invalidation; together they do.
    items = big_history([2_000] * 3 + [9_800] * 10, marked={0, 1, 2})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    priced = PRUNE_MARKED.replace("20", "300, stakes: unlimited")  # the pricing alone: whatever it stakes
    alone = run(big_history([2_000] * 3 + [9_800] * 10, marked={0}), priced, state=warm.state, now=60)
    assert [c.decision for c in alone.certificates] == [Decision.DEFER]
    together = run(items, priced, state=warm.state, now=60)
    assert [c.decision for c in together.certificates] == [Decision.PRUNE] * 3
    assert "pay for one invalidation" in together.certificates[0].rationale
    # The cache is read up to the last earlier prompt before the first edit: none but the whole previous one.
    assert together.certificates[1].rationale == "rides on the rewrite from token 0"
    assert together.view.stable_prefix_tokens == sent(warm).offsets()[4]


def test_edits_to_the_uncached_tail_are_free() -> None:
    sizes = [9_800] * 10
    items = big_history(sizes, marked=set())
    warm = run(items, "protection: {last_turns: 0}", now=0)
    longer = stored_items(
        [ItemContent(role=i.role, content=i.content) for i in items]
        + tool_round("tail", "read_file", "fresh PRUNE-ME")
        + tool_round("tail2", "bash", "latest")
    )
    out = run(longer, PRUNE_MARKED, state=warm.state, now=30)
    [cert] = out.certificates
    assert (cert.decision, cert.mutation_radius_tokens) == (Decision.PRUNE, 0)
    assert cert.rationale == "it touches only the tail the cache has not seen"
    assert out.view.stable_prefix_tokens == sent(warm).total_tokens


def test_a_provider_that_caches_whole_prompts_is_read_back_to_the_last_earlier_prompt_before_a_change() -> None:
    items = big_history([2_000] + [9_800] * 10, marked={4})  # seq 12: a round after the first render's end
    quiet = "protection: {last_turns: 0}"
    first = run(items[:8], quiet, now=0)
    second = run(items[:14], quiet, state=first.state, now=10)
    third = run(items, quiet, state=second.state, now=20)
    end1, end2 = sent(first).total_tokens, sent(second).total_tokens
    # Each call read the one before it whole (refreshing it) and wrote its own end.
    assert sent(second).cached_ends == ((end1, 10),)
    assert sent(third).cached_ends == ((end1, 10), (end2, 20))
    assert state_from_json(state_to_json(third.state)) == third.state
    same = run(items, quiet, state=third.state, now=25)  # the same prompt again: read whole, its end its own
    assert sent(same).cached_ends == ((end1, 10), (end2, 20))

    total, position = sent(third).total_tokens, sent(third).offsets()[12]
    assert end1 < position < end2
    [deferred] = run(items, PRUNE_MARKED, state=third.state, now=30).certificates
    assert (deferred.decision, deferred.first_divergence_tokens) == (Decision.DEFER, position)
    assert deferred.mutation_radius_tokens == total - end1  # written again from the first call's end
    [prefix] = run(items, PRUNE_MARKED.replace("20}", "20, reads: prefix}"), state=third.state, now=30).certificates
    assert prefix.mutation_radius_tokens == total - position

    # A rewrite keeps the ends before it (the one read is refreshed); those after it are gone.
    forced = run(items, PRUNE_MARKED, state=third.state, now=30, force=True)
    assert sent(forced).cached_ends == ((end1, 30),)
    # Offloads to fit a budget are priced the same way.
    exact = "protection: {last_turns: 1}\ncache: {low_water: 1}"  # down to the budget, no further
    offloaded = run(items, exact, state=third.state, now=30, budget=total - 5_000)
    assert [c.mutation_radius_tokens for c in offloaded.certificates] == [total, total]  # the first two outputs
    # An end unused for longer than the cache's TTL is gone too.
    much_later = run(items, PRUNE_MARKED, state=third.state, now=10 + 301)
    [cert] = much_later.certificates
    assert cert.mutation_radius_tokens == total  # the first call's end (last used at 10) expired; the others follow


def test_a_prompt_too_short_to_cache_leaves_nothing_to_keep() -> None:
    items = big_history([300, 300], marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    assert sent(warm).total_tokens < 1_024  # below the providers' minimum: never cached
    [cert] = run(items, PRUNE_MARKED, state=warm.state, now=10).certificates
    assert (cert.decision, cert.rationale) == (Decision.PRUNE, "the cache is cold: nothing cached to keep")


def test_the_high_water_mark_applies_deferred_edits() -> None:
    sizes = [2_000] + [9_800] * 10
    items = big_history(sizes, marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    full = warm.view.total_tokens
    out = run(items, PRUNE_MARKED, state=warm.state, now=60, budget=int(full / 0.95))
    assert [c.decision for c in out.certificates] == [Decision.PRUNE]
    assert "high water" in out.certificates[0].rationale


# --------------------------------------------------------- prefix stability


def stream(out: RenderOutput) -> str:
    """A render's bytes as a provider reads them: system, then messages up to the last one's end."""
    return out.view.system_json + "\n" + out.view.messages_json.rstrip("]}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_renders_after_appends_keep_the_previous_bytes_as_an_exact_prefix(fmt: ViewFormat) -> None:
    contents: list[ItemContent] = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("system"),)),
        ItemContent(role=Role.USER, content=(TextBlock("task"),)),
    ]
    n = 0
    while len(contents) < 52:
        n += 1
        if n % 5 == 0:
            contents.append(ItemContent(role=Role.USER, content=(TextBlock(f"user note {n}"),)))
        elif n % 7 == 0:
            contents.append(ItemContent(role=Role.ASSISTANT, content=(TextBlock(f"thinking aloud {n}"),)))
        else:
            calls = [f"c{n}a", f"c{n}b"] if n % 3 == 0 else [f"c{n}"]
            uses = tuple(ToolUseBlock(c, "read_file", json.dumps({"path": c})) for c in calls)
            contents.append(ItemContent(role=Role.ASSISTANT, content=(TextBlock(f"step {n}"), *uses)))
            contents.extend(
                ItemContent(role=Role.TOOL, content=(ToolResultBlock(c, (TextBlock(f"output {c}"),)),)) for c in calls
            )
    items = stored_items(contents[:52])
    previous: RenderOutput | None = None
    for count in range(3, 53):
        prefix = items[:count]
        if prefix[-1].role is Role.ASSISTANT and prefix[-1].tool_uses:
            continue  # a call without its result is not a state an agent renders in
        out = run(prefix, "", state=previous.state if previous else None, fmt=fmt, now=float(count))
        if previous is not None:
            assert stream(out).startswith(stream(previous)), count
            assert out.view.stable_prefix_tokens == sent(previous, fmt).total_tokens
        previous = out


# ------------------------------------------------------------------ other edits


def test_inserts_patches_and_reorders_are_applied_certified_and_repaired() -> None:
    items = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"))
    annotated = run(
        items, "rules: [{name: note, transform: annotate, params: {note: 'remember X'}, when: {roles: [user]}}]"
    )
    assert {c.decision for c in annotated.certificates} == {Decision.APPLY}
    messages = json.loads(annotated.view.messages_json)
    assert messages[2] == {"role": "user", "content": "remember X"}
    assert json.loads(annotated.view.request_patch_json) == {"temperature": 0}
    reversed_view = run(items, "rules: [{name: r, transform: reverse}]")
    roles = [m["role"] for m in json.loads(reversed_view.view.messages_json)]
    check_openai(json.loads(reversed_view.view.messages_json))  # results still follow their calls
    assert roles[:2] == ["system", "user"]  # the system prompt and the opening turn keep their place
    calls = [m["tool_calls"][0]["id"] for m in json.loads(reversed_view.view.messages_json) if m.get("tool_calls")]
    assert calls == ["c2", "c1"]


def test_agent_proposals_are_decided_and_certified_as_the_agents() -> None:
    items = history(tool_round("c1", "bash", "noise"), tool_round("c2", "bash", "more"), tool_round("c3", "bash", "x"))
    out = run(
        items,
        "protection: {last_turns: 1}",
        agent=[AgentProposal(11, 4, "I have what I need from it"), AgentProposal(12, 2, "drop the task")],
    )
    pruned = by_decision(out, Decision.PRUNE)
    assert [(c.seq, c.control, c.reason, c.evidence) for c in pruned] == [
        (4, ControlMode.AGENT, "agent", "I have what I need from it")
    ]
    assert [(c.seq, c.protection) for c in by_decision(out, Decision.KEEP)] == [(2, "user instruction")]
    assert sorted(out.decided_proposals) == [11, 12]


def test_history_mode_rules_hand_back_their_edits_to_be_made_durable() -> None:
    items = history(tool_round("c1", "bash", "a"), tool_round("c2", "bash", "b"))
    out = run(items, DROP_TOOL_OUTPUTS.replace("when: {roles: [tool]}", "when: {roles: [tool]}\n    history: true"))
    assert [a.edit for a in out.durable] == [Remove(4)]  # seq 6 is in the last turn
    assert out.state.applied == ()  # durable from now on: history, not view state


# ------------------------------------------------------- one decision, kept


def test_inserts_and_patches_in_force_are_not_proposed_again() -> None:
    items = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"))
    policy = "rules: [{name: note, transform: annotate, params: {note: 'remember X'}, when: {roles: [user]}}]"
    first = run(items, policy)
    second = run(items, policy, state=first.state, now=1_010)
    assert second.certificates == () and len(second.state.applied) == 2
    assert second.view.messages_json == first.view.messages_json
    assert second.view.messages_json.count("remember X") == 1


def test_a_reorder_stays_in_force_after_appends_and_one_that_moves_the_system_prompt_abstains() -> None:
    rounds = [tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two")]
    items = history(*rounds)
    first = run(items, "rules: [{name: r, transform: reverse}]")
    assert [c.decision for c in first.certificates] == [Decision.APPLY]
    longer = history(*rounds, tool_round("c3", "bash", "three"))
    later = run(longer, "rules: [{name: r, transform: reverse}]", state=first.state, now=1_010)
    assert later.certificates == ()  # the order in force is kept, not decided again
    messages = json.loads(later.view.messages_json)
    assert stream(later).startswith(stream(first)) and messages[-2]["tool_calls"][0]["id"] == "c3"
    check_openai(messages)

    moved = run(items, "rules: [{name: r, transform: reverse, params: {keep: false}}]")
    assert [(c.decision, c.rationale) for c in moved.certificates] == [
        (Decision.ABSTAIN, "the new order moves a system prompt")
    ]


PREFIX_READS = "cache: {reads: prefix}\n"  # the cache read up to any shared prefix (OpenAI), however short


def test_inserts_and_reorders_are_priced_where_they_change_the_previous_render() -> None:
    items = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"))
    warm = run(items, PREFIX_READS, now=0)
    offsets = sent(warm).offsets()
    note = run(
        items,
        PREFIX_READS + "rules: [{name: n, transform: annotate, params: {after: 4}, when: {roles: [user]}}]",
        state=warm.state,
        now=10,
    )
    [insert] = [c for c in note.certificates if c.reason == "note"]
    assert (insert.decision, insert.first_divergence_tokens) == (Decision.DEFER, offsets[5])
    assert insert.mutation_radius_tokens == sent(warm).total_tokens - offsets[5]
    reordered = run(items, PREFIX_READS + "rules: [{name: r, transform: reverse}]", state=warm.state, now=10)
    [cert] = reordered.certificates
    assert cert.first_divergence_tokens == offsets[3]  # the first item that moves


AGED = """
protection: {last_turns: 1}
rules:
  - {name: r, transform: reverse}
  - {name: aged, transform: drop, when: {roles: [tool], age_turns: {min: 2}}}
"""


def test_a_reorder_in_force_leaves_ages_alone_and_one_waiting_follows_appends() -> None:
    rounds = [tool_round(f"c{n}", "bash", f"out {n}") for n in range(5)]
    items = history(*rounds)
    plain = run(items, AGED.replace("- {name: r, transform: reverse}", ""))
    reordered = run(items, AGED)
    assert (
        [c.seq for c in by_decision(reordered, Decision.PRUNE)]
        == [c.seq for c in by_decision(plain, Decision.PRUNE)]
        == [4, 6, 8]
    )

    warm = run(items, PREFIX_READS, now=0)
    waiting = run(items, PREFIX_READS + "rules: [{name: r, transform: reverse}]", state=warm.state, now=10)
    assert [c.decision for c in waiting.certificates] == [Decision.DEFER]
    longer = history(*rounds, tool_round("c9", "bash", "new"))
    later = run(longer, PREFIX_READS + "rules: [{name: r, transform: reverse}]", state=waiting.state, now=20)
    assert later.certificates == ()  # still the one deferred reorder, now with the new items after it
    [pending] = later.state.pending
    assert pending.proposal.edit == Reorder((1, 2, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 13, 14))


def test_edits_that_would_break_the_view_abstain() -> None:
    items = history(tool_round("c1", "bash", "x"), tool_round("c2", "bash", "y"))
    cases = [
        ("{name: n, transform: annotate, params: {after: 1}, when: {roles: [user]}}", "before the opening turn"),
        ("{name: e, transform: replace_with, params: {text: ''}, when: {roles: [tool]}}", "holds an empty text"),
        ("{name: i, transform: replace_with, params: {image: true}, when: {roles: [tool]}}", "must hold text"),
        (
            "{name: a, transform: replace_with, params: {text: x, call: c9}, when: {roles: [assistant]}}",
            "holds tool calls other than the item's own",
        ),
        (
            "{name: b, transform: replace_with, params: {text: x, call: c1, input: '[1]'}, when: {roles: [assistant]}}",
            "neither its own nor a stand-in",
        ),
        (
            '{name: f, transform: replace_with, params: {text: x, call: c1, input: \'{"cmd": "rm -rf /"}\'}, '
            "when: {roles: [assistant]}}",
            "neither its own nor a stand-in",
        ),
        ("{name: o, transform: reverse, params: {identity: true}}", "the new order is the history's own"),
    ]
    for rule, why in cases:
        out = run(items, f"protection: {{last_turns: 1}}\nrules: [{rule}]")
        assert not [
            c for c in out.certificates if c.decision in (Decision.PRUNE, Decision.APPLY) and c.reason != "patch"
        ]
        assert any(why in c.rationale for c in by_decision(out, Decision.ABSTAIN)), (rule, out.certificates)
    # Only the built-in compressors' claim lets an edit past the policy's maximum level.
    claimed = "{name: c, transform: replace_with, params: {text: x, compression: true}, when: {roles: [tool]}}"
    out = run(items, f"protection: {{last_turns: 1}}\nevidence: {{max_level: 1}}\nrules: [{claimed}]")
    assert not by_decision(out, Decision.PRUNE)
    assert all("above the policy's maximum of 1" in c.rationale for c in by_decision(out, Decision.ABSTAIN))
    assert by_decision(out, Decision.ABSTAIN)


def test_the_agent_hears_back_each_time_it_asks() -> None:
    items = history(tool_round("c1", "bash", "alpha"), tool_round("c2", "bash", "beta"), tool_round("c3", "bash", "z"))
    policy = EVIDENCE % ([4], "beta", [], "nothing")
    cited = run(items, policy)  # 6 goes, resting on 4
    first = run(items, policy, state=cited.state, agent=[AgentProposal(1, 4, "done")], now=1_010)
    second = run(items, policy, state=first.state, agent=[AgentProposal(2, 4, "done")], now=1_020)
    for out in (first, second):
        [refused] = [c for c in out.certificates if c.control is ControlMode.AGENT]
        assert (refused.seq, refused.decision) == (4, Decision.ABSTAIN)


def test_inserted_content_is_compared_by_what_it_is() -> None:
    assert first_divergence((Segment(1, "", 7), Segment(-2, "d", 5)), (Segment(1, "", 7), Segment(-1, "d", 5))) == 12
    assert first_divergence((Segment(1, "", 7), Segment(-1, "d", 5)), (Segment(1, "", 7), Segment(-1, "e", 5))) == 7


@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12), st.booleans())
def test_where_two_renders_first_differ_counts_the_same_from_either_end(
    old: list[int], new: list[int], share: bool
) -> None:
    before = tuple(Segment(n % 3 + 1, str(n), n + 1) for n in old)
    after = tuple(Segment(n % 3 + 1, str(n), n + 1) for n in new)
    if share:  # a resumed render shares the previous render's first segments themselves
        after = before[: len(after)] + after[len(before) :]
    total = sum(s.tokens for s in before)
    assert first_divergence(before, after, total) == first_divergence(before, after)


def test_decisions_are_the_sessions_whatever_the_format() -> None:
    items = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"))
    openai = run(items, DROP_TOOL_OUTPUTS, fmt=OPENAI)
    anthropic = run(items, DROP_TOOL_OUTPUTS, state=openai.state, fmt=ANTHROPIC, now=1_010)
    assert anthropic.certificates == ()  # decided once, for the session
    assert handle_of(items[3]) in anthropic.view.messages_json and "one" not in anthropic.view.messages_json
    assert anthropic.state.view_version == 2 and set(anthropic.state.renders) == {OPENAI.value, ANTHROPIC.value}
    assert anthropic.view.stable_prefix_tokens == 0  # the first render in this format: nothing of its own cached


def test_every_agent_proposal_is_consumed_and_the_first_eligible_proposal_wins() -> None:
    items = history(tool_round("c1", "bash", "a"), tool_round("c2", "bash", "b"), tool_round("c3", "bash", "c"))
    policy = (
        "protection: {last_turns: 1}\n"
        "rules: [{name: heuristic, transform: mask, when: {roles: [tool]}},"
        " {name: drop, transform: drop, when: {roles: [tool]}}]"
    )
    out = run(items, policy, agent=[AgentProposal(1, 4, "done"), AgentProposal(2, 4, "done, again")])
    assert out.decided_proposals == (1, 2)
    assert [(c.seq, c.rule) for c in by_decision(out, Decision.PRUNE)] == [(4, "agent"), (6, "drop")]
    # The heuristic was refused for seq 6 (level 4); the next proposal for it was eligible.
    assert [(c.seq, c.rule) for c in by_decision(out, Decision.ABSTAIN)] == [(6, "heuristic")]


EVIDENCE = """
protection: {last_turns: 1}
rules:
  - {name: first, transform: drop, params: {evidence_seqs: %s}, when: {regex: "%s"}}
  - {name: second, transform: drop, params: {evidence_seqs: %s}, when: {regex: "%s"}}
"""


def test_the_evidence_for_a_decision_stays_in_full() -> None:
    items = history(tool_round("c1", "bash", "alpha"), tool_round("c2", "bash", "beta"), tool_round("c3", "bash", "z"))
    # 6 goes, citing 4; then 4 may not go: it is what 6's removal rests on.
    cited = run(items, EVIDENCE % ([4], "beta", [], "alpha"))
    assert [c.seq for c in by_decision(cited, Decision.PRUNE)] == [6]
    [refused] = by_decision(cited, Decision.ABSTAIN)
    assert (refused.seq, refused.rationale) == (4, "item 4 is the evidence for the reduction of item 6")
    later = run(items, EVIDENCE % ([4], "beta", [], "alpha"), state=cited.state, now=1_010)
    assert later.certificates == () and "alpha" in later.view.messages_json  # still relied on, certified once
    # 4 goes first; then it cannot be the evidence for 6.
    gone = run(items, EVIDENCE % ([], "alpha", [4], "beta"))
    assert [(c.seq, c.rationale) for c in by_decision(gone, Decision.ABSTAIN)] == [
        (6, "the evidence, item 4, is not shown in full")
    ]
    itself = run(items, EVIDENCE % ([4], "alpha", [], "nothing"))
    assert [c.rationale for c in by_decision(itself, Decision.ABSTAIN)] == [
        "an item cannot be the evidence for its own reduction"
    ]


def test_a_policy_change_restores_what_it_protects_and_drops_the_waiting_edits_of_removed_rules() -> None:
    items = history(tool_round("c1", "read_file", "a.py"), tool_round("c2", "bash", "x"))
    pruned = run(items, DROP_TOOL_OUTPUTS)
    assert [c.seq for c in by_decision(pruned, Decision.PRUNE)] == [4]
    protecting = DROP_TOOL_OUTPUTS.replace("{last_turns: 1}", "{last_turns: 1, tools: [read_file]}")
    restored = run(items, protecting, state=pruned.state, now=1_010)
    assert [(c.seq, c.rationale) for c in restored.certificates] == [
        (4, "protected: protected tool (read_file); shown in full again")
    ]
    assert "a.py" in restored.view.messages_json and restored.state.policy_version != pruned.state.policy_version

    items = big_history([2_000] + [9_800] * 10, marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    deferred = run(items, PRUNE_MARKED, state=warm.state, now=60)
    assert len(deferred.state.pending) == 1
    without = run(items, "protection: {last_turns: 0}", state=deferred.state, now=400)
    [dropped] = without.certificates
    assert dropped.decision is Decision.ABSTAIN and "its rule is not in the session's policy" in dropped.rationale
    assert without.state.pending == () and "PRUNE-ME" in without.view.messages_json


def test_certificates_count_what_stands_in_for_the_item() -> None:
    items = history(tool_round("c1", "bash", "first line"), tool_round("c2", "bash", "z"))
    shortened = run(
        items, "protection: {last_turns: 1}\nrules: [{name: s, transform: first_line, when: {roles: [tool]}}]"
    )
    [cert] = by_decision(shortened, Decision.PRUNE)
    shown = {v.seq: v for v in shortened.view.items}[4]
    assert (cert.tokens_removed, cert.placeholder_tokens) == (items[3].token_count, shown.tokens)
    assert shown.representation is Representation.REDUCED and 0 < shown.tokens < items[3].token_count
    # A tool result cannot vanish: its call needs an answer. The removal leaves a placeholder, and says so.
    dropped = run(
        items, DROP_TOOL_OUTPUTS.replace("transform: drop", "transform: drop\n    params: {placeholder: false}")
    )
    [removal] = by_decision(dropped, Decision.PRUNE)
    assert removal.placeholder_tokens == {v.seq: v for v in dropped.view.items}[4].tokens > 0


def test_a_transform_giving_the_compressors_reason_code_abstains() -> None:
    """A reason code starting with `compressed_` marks an edit in force as a compression (the
    budget may take its slot over): another transform's edit giving one would be held to the
    ladder when judged and taken for a compression once in force. It abstains, and says why."""
    items = history(tool_round("c1", "bash", "first line\nsecond line\nthird line"), tool_round("c2", "bash", "z"))
    rule = "{name: s, transform: first_line, params: {reason: compressed_text}, when: {roles: [tool]}}"
    out = run(items, f"protection: {{last_turns: 1}}\nrules: [{rule}]")
    [cert] = [c for c in out.certificates if c.seq == 4]
    assert cert.decision is Decision.ABSTAIN and "the built-in compressors' own" in cert.rationale
    assert out.state.applied == () and "second line" in out.view.messages_json
    shortened = run(items, f"protection: {{last_turns: 1}}\nrules: [{rule.replace('compressed_text', 'short')}]")
    assert [c.decision for c in shortened.certificates if c.seq == 4] == [Decision.PRUNE]


def test_a_prune_that_saves_nothing_and_an_insert_that_cannot_be_placed_abstain() -> None:
    items = history(tool_round("c1", "bash", "x"), tool_round("c2", "bash", "y"))
    small = [*items[:3], replace(items[3], token_count=5), *items[4:]]
    [cert] = run(small, DROP_TOOL_OUTPUTS).certificates[:1]
    assert (cert.seq, cert.decision, cert.rationale) == (4, Decision.ABSTAIN, "what would replace it is not smaller")
    for params, why in [
        ("{after: 99}", "inserts after item 99, which is not in the history"),
        ("{role: tool}", "inserts a tool item: only user and assistant content may be inserted"),
    ]:
        out = run(items, f"rules: [{{name: n, transform: annotate, params: {params}, when: {{roles: [user]}}}}]")
        assert [(c.decision, c.rationale) for c in out.certificates if c.reason == "note"] == [(Decision.ABSTAIN, why)]


def test_durable_edits_are_history_whatever_the_pins() -> None:
    items = history(tool_round("c1", "bash", "old"), tool_round("c2", "bash", "new"))
    edit = AppliedEdit(Remove(4), "compact", "superseded", placeholder_blocks(items[3], "superseded"), 40)
    out = run(items, DROP_TOOL_OUTPUTS, pins=frozenset({4}), durable=[edit])
    assert "old" not in out.view.messages_json and handle_of(items[3]) in out.view.messages_json
    assert [c.seq for c in out.certificates] == [6] and out.state.applied == ()  # 4 is not the rules' to decide


# ------------------------------------------------------------ property tests


SCRIPTED = """
evidence: {max_level: 4}
protection: {last_turns: 0, user_items: false, latest_error_per_tool: false}
rules:
  - {name: drop-some, transform: drop, params: {placeholder: %s}, when: {regex: "%s"}}
  - {name: shorten, transform: first_line, when: {regex: "%s"}}
"""


# Examples are sized so each property takes seconds even on a busy machine (CI runs them
# derandomized: the same examples every run); here, a hundred for each format.
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from("abcdefghij"), st.sampled_from("klmnop"), st.booleans())
def test_any_edits_leave_views_the_providers_accept(
    fmt: ViewFormat, items: list[Item], drop: str, shorten: str, placeholder: bool
) -> None:
    policy = SCRIPTED % ("true" if placeholder else "false", drop, shorten)
    check_view(run(items, policy, fmt=fmt, force=True), fmt, items)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from("abcdefghij"), st.floats(0, 10_000), st.sampled_from(FORMATS))
def test_the_same_inputs_give_byte_identical_views(
    items: list[Item], marker: str, clock: float, fmt: ViewFormat
) -> None:
    policy = SCRIPTED % ("true", marker, "k")
    first = run(items, policy, fmt=fmt, now=0)
    again = [run(items, policy, state=first.state, fmt=fmt, now=clock) for _ in range(2)]
    assert again[0] == again[1]
    replayed = run(items, policy, state=state_from_json(state_to_json(first.state)), fmt=fmt, now=clock)
    assert replayed == again[0]


def check_view(out: RenderOutput, fmt: ViewFormat, items: Sequence[Item] = ()) -> None:
    """`out`'s view is one its provider accepts; `items` (the history) tell the Responses
    API's pairs: each id and the reasoning it was produced after."""
    messages = json.loads(out.view.messages_json)
    if fmt is OPENAI:
        check_openai(messages)
    elif fmt is RESPONSES:
        check_responses(messages, _pairs(items))
    elif fmt is CONVERSE:
        check_converse(json.loads(out.view.system_json) if out.view.system_json else None, messages)
    else:
        check_anthropic(json.loads(out.view.system_json) if out.view.system_json else None, messages)


def _pairs(items: Sequence[Item]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        reasoning = ""
        for block in item.content:
            if isinstance(block, ReasoningBlock):
                reasoning = block.item_id
            elif reasoning and isinstance(block, TextBlock | ToolUseBlock) and block.item_id:
                pairs[block.item_id] = reasoning
    return pairs


def complete_prefixes(items: Sequence[Item]) -> list[int]:
    """Lengths of the prefixes an agent renders: every call in them has its result."""
    lengths, open_calls = [], set[str]()
    for n, item in enumerate(items, start=1):
        open_calls.update(u.id for u in item.tool_uses)
        if item.tool_result is not None:
            open_calls.discard(item.tool_result.tool_use_id)
        if n >= 2 and not open_calls:
            lengths.append(n)
    return lengths


CARRIED = """
evidence: {max_level: 4}
protection: {last_turns: %d, user_items: false, latest_error_per_tool: false}
rules:
  - {name: drop-some, transform: drop, params: {placeholder: %s}, when: {regex: "%s"}}
  - {name: shorten, transform: first_line, when: {regex: "%s"}}
  - {name: note, transform: annotate, when: {regex: "%s"}}
"""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.data())
def test_edits_in_force_across_appends_leave_views_the_providers_accept(items: list[Item], data: st.DataObject) -> None:
    fmt = data.draw(st.sampled_from(FORMATS))
    markers = [data.draw(st.sampled_from("abcdefghijklmnop")) for _ in range(3)]
    policy = CARRIED % (data.draw(st.integers(0, 2)), data.draw(st.sampled_from(["true", "false"])), *markers)
    if data.draw(st.booleans()):
        policy += "  - {name: backwards, transform: reverse}\n"
    cut = data.draw(st.sampled_from(complete_prefixes(items)))
    asks = data.draw(st.lists(st.integers(1, cut), max_size=3))
    agent = [AgentProposal(n, seq, "done with it") for n, seq in enumerate(asks, start=1)]
    placed, force = data.draw(st.booleans()), data.draw(st.booleans())  # (placed: the view places the breakpoint)
    first = run(items[:cut], policy, fmt=fmt, agent=agent, force=force, now=0, placed=placed)
    check_view(first, fmt)
    later = data.draw(st.floats(0, 1_000))
    second = run(items, policy, state=first.state, fmt=fmt, now=later, placed=placed)
    check_view(second, fmt)
    stored = state_from_json(state_to_json(first.state))
    assert run(items, policy, state=stored, fmt=fmt, now=later, placed=placed) == second
    if placed and fmt is ANTHROPIC:  # one mark, and nothing else differs from the unmarked view
        unmarked = run(items[:cut], policy, fmt=fmt, agent=agent, force=force, now=0)
        assert first.view.messages_json.count('"cache_control"') + first.view.system_json.count('"cache_control"') <= 1
        assert _without_marks(first.view.messages_json) == _without_marks(unmarked.view.messages_json)
    for cert in (*first.certificates, *second.certificates):
        assert_complete(cert)


def _without_marks(messages_json: str) -> list[dict[str, object]]:
    """The messages with cache marks taken out, a lone text block read as the string it was."""
    messages: list[dict[str, object]] = json.loads(messages_json)
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            for block in content:
                block.pop("cache_control", None)
            if len(content) == 1 and content[0]["type"] == "text" and set(content[0]) == {"type", "text"}:
                message["content"] = content[0]["text"]
    return messages


def assert_complete(cert: CertificateBody) -> None:
    """What every decision must say about itself (DESIGN principle 3)."""
    assert cert.rule and cert.reason and cert.rationale, cert
    assert 0 <= cert.level <= 4
    if cert.decision is Decision.PRUNE or (cert.decision is Decision.DEFER and cert.seq > 0):
        assert cert.seq > 0 and len(cert.handle) == 16 and cert.tokens_removed > 0, cert
        assert cert.first_divergence_tokens >= 0 and cert.mutation_radius_tokens >= 0
    if cert.decision is Decision.DEFER:
        # Deferred: applying it alone would not pay (a suffix holding it would be worth more),
        # or it would, but would lose more than the session has saved should it end next.
        assert cert.mutation_radius_tokens > 0, cert
        assert cert.cost_effect <= 0 or "more than the session has saved so far" in cert.rationale, cert
    if cert.decision is Decision.KEEP:
        assert cert.protection or cert.rationale.startswith("pinned"), cert
    if cert.decision is Decision.ABSTAIN:
        assert not cert.handle and cert.tokens_removed == 0, cert
    if cert.decision is Decision.APPLY or (cert.decision is Decision.DEFER and cert.seq == 0):
        assert cert.seq == 0 and not cert.handle and cert.tokens_removed == 0, cert


COMPLETENESS = """
evidence: {max_level: %d}
protection: {last_turns: %d}
rules:
  - {name: drop-some, transform: drop, params: {level: %d}, when: {regex: "%s"}}
  - {name: unsure, transform: unsure, when: {regex: "%s"}}
  - {name: mask-all, transform: mask, when: {roles: [tool]}}
  - {name: shorten, transform: first_line, when: {roles: [assistant]}}
  - {name: note, transform: annotate, when: {roles: [user]}}
"""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    st.integers(0, 4),
    st.integers(0, 3),
    st.integers(0, 4),
    st.sampled_from("abcdefghij"),
    st.sampled_from("klmnop"),
    st.floats(0, 600),
)
def test_every_decision_has_a_complete_certificate(
    items: list[Item], max_level: int, last_turns: int, level: int, drop: str, unsure: str, later: float
) -> None:
    first = run(items, COMPLETENESS % (max_level, last_turns, level, drop, unsure), now=0)
    # Later, with new rules proposing on a warm cache: deferrals, prunes, refusals.
    policy = COMPLETENESS % (4, last_turns, level, unsure, drop)
    second = run(items, policy, state=first.state, now=later, pins=frozenset({items[-1].seq}))
    for cert in (*first.certificates, *second.certificates):
        assert_complete(cert)


# ------------------------------------------------------------------ the carry

FOLLOWED = """
evidence: {max_level: 4}
protection: {last_turns: %d, user_items: false, latest_error_per_tool: %s}
rules:
  - {name: drop-old, transform: drop, params: {placeholder: %s}, when: {regex: "%s", age_turns: {min: 1}}}
  - {name: shorten, transform: first_line, history: %s, when: {roles: [tool], tokens: {min: 20}}}
  - {name: note, transform: annotate, when: {regex: "%s"}}
  - {name: pressure, transform: drop, when: {roles: [tool], utilization: {min: 0.5}}}
"""


def follow(
    items: Sequence[Item], policy: str, previous: RenderOutput | None, now: float, **given: object
) -> tuple[RenderOutput, bool]:
    """Render `items` from the previous render's state, with its carry and without;
    the two must agree. Returns the render, and whether the carry was followed."""
    inp = RenderInput(
        session=make_session(len(items)),
        items=items,
        policy=parse_policy(policy, REGISTRY),
        request=ViewRequest(given.pop("fmt", OPENAI), given.pop("budget", 0)),  # type: ignore[arg-type]
        counter=counter(),
        registry=REGISTRY,
        state=previous.state if previous else ViewState(),
        now=now,
        carry=previous.carry if previous else None,
        **given,  # type: ignore[arg-type]
    )
    out = render(inp)
    assert out == render(replace(inp, carry=None))
    assert_change_makes(inp.state, out)
    if out.carry is not None:  # the characters the carry counts it holds, kept as the view is resumed
        rendered = out.carry.assembly.rendered
        assert rendered.json_chars == sum(map(len, rendered.messages_json))
    return out, inp.carry is not None and inp.carry.follows(inp)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.data())
def test_a_render_from_the_carry_is_the_render_without_it(items: list[Item], data: st.DataObject) -> None:
    markers = [data.draw(st.sampled_from("abcdefghijklmnop")) for _ in range(2)]
    flags = [data.draw(st.sampled_from(["true", "false"])) for _ in range(3)]
    policy = FOLLOWED % (data.draw(st.integers(0, 2)), flags[0], flags[1], markers[0], flags[2], markers[1])
    if data.draw(st.booleans()):
        policy += "  - {name: backwards, transform: reverse}\n"
    cuts = sorted(set(data.draw(st.lists(st.integers(2, len(items)), min_size=2, max_size=6))))
    previous: RenderOutput | None = None
    pins: frozenset[int] = frozenset()
    durable: tuple[AppliedEdit, ...] = ()
    now = 0.0
    for cut in cuts:
        now += data.draw(st.sampled_from([1.0, 30.0, 400.0]))  # warm, warm, past the cache's TTL
        if data.draw(st.integers(0, 3)) == 0:
            pins = frozenset(data.draw(st.lists(st.integers(1, cut), max_size=2)))
        asks = data.draw(st.lists(st.integers(1, cut), max_size=2))
        previous, _ = follow(
            Prefix(items, cut) if data.draw(st.booleans()) else items[:cut],  # (as storage gives it, or a list)
            policy,
            previous,
            now,
            fmt=data.draw(st.sampled_from(FORMATS)),
            budget=data.draw(st.sampled_from([0, 200, 5_000])),
            pins=pins,
            durable=durable,
            agent_proposals=[AgentProposal(n, seq, "done") for n, seq in enumerate(asks, start=1)],
            force=data.draw(st.integers(0, 4)) == 0,
        )
        durable = (*durable, *previous.durable)  # made durable: history from now on


def test_a_render_after_appends_follows_the_carry_and_one_after_a_change_does_not() -> None:
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(6)))
    policy = FOLLOWED % (1, "true", "true", "o", "false", "zzz")
    first, followed = follow(items[:6], policy, None, 0.0)
    assert not followed and first.carry is not None and first.carry.state is first.state
    second, followed = follow(items[:10], policy, first, 10.0)
    assert followed  # only items appended
    _, followed = follow(items[:12], policy, second, 20.0, pins=frozenset({3}))
    assert not followed  # a pin changes what is protected
    _, followed = follow(items, policy.replace("min: 1", "min: 2"), second, 20.0)
    assert not followed  # another policy
    _, followed = follow(items[:9], policy, second, 20.0)
    assert not followed  # not the history the carry was made from
    shorten_in_history = FOLLOWED % (1, "true", "true", "zzz", "true", "zzz")
    made_durable, _ = follow(items, shorten_in_history, None, 0.0)
    assert made_durable.durable and made_durable.carry is None  # history changed under it


def test_a_render_given_a_longer_prefix_of_the_same_list_follows_the_carry_without_a_copy_of_it() -> None:
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(6)))
    policy = FOLLOWED % (1, "true", "true", "o", "false", "zzz")
    first, _ = follow(Prefix(items, 6), policy, None, 0.0)
    assert first.carry is not None and _a_prefix(first.carry.items, of=items, n=6)
    second, followed = follow(Prefix(items, 10), policy, first, 10.0)
    assert followed and second.carry is not None and _a_prefix(second.carry.items, of=items, n=10)
    # A prefix of another list is compared, as a list is.
    _, followed = follow(Prefix(list(items), 12), policy, second, 20.0)
    assert followed
    other = [*items[:9], replace(items[9], content_hash="another"), *items[10:]]
    _, followed = follow(Prefix(other, 12), policy, second, 20.0)
    assert not followed  # not the history the carry was made from
    shorter, followed = follow(Prefix(items, 8), policy, second, 20.0)
    assert not followed and shorter.carry is not None and _a_prefix(shorter.carry.items, of=items, n=8)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_long_view_changed_near_its_start_from_the_carry_is_the_view_without_it(fmt: ViewFormat) -> None:
    # Views longer than a few of the blocks they are handed out in (blocks.py): the render
    # from the carry cuts the lists it resumes back to the change, in their first block.
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(3 * BLOCK // 2)))
    policy = "evidence: {max_level: 4}\nprotection: {last_turns: 1, user_items: false}\nrules: []"
    first, _ = follow(items[:-4], policy, None, 0.0, fmt=fmt)
    for n, (cut, seq) in enumerate([(-2, 4), (len(items), 2 * BLOCK + 6)], start=1):
        previous = first
        first, followed = follow(
            items[:cut],
            policy,
            previous,
            10.0 * n,
            fmt=fmt,
            agent_proposals=[AgentProposal(n, seq, "done")],
            force=True,
        )
        assert followed and [c.seq for c in first.certificates if c.rule == "agent"] == [seq]
        assert len(first.view.items) == len(items[:cut]) and len(previous.view.items) < len(first.view.items)
        assert previous.view.items[seq - 1].representation is Representation.FULL  # (as it was handed out)


def _a_prefix(items: Sequence[Item], of: list[Item], n: int) -> bool:
    """Whether `items` is the first `n` of the list `of` itself (not of a copy)."""
    return isinstance(items, Prefix) and items.base is of and items.n == n


# ------------------------------------------------------------------ budget


def test_over_its_budget_a_view_offloads_its_oldest_unprotected_turns_and_says_so() -> None:
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(8)))
    full = run(items, "rules: []")
    budget = full.view.total_tokens * 2 // 3
    exact = "protection: {last_turns: 2}\nrules: []\ncache: {low_water: 1}"  # down to the budget, no further
    out = run(items, exact, budget=budget)
    assert out.view.total_tokens <= budget and not out.view.over_budget
    offloaded = [c for c in out.certificates if c.rule == "budget"]
    assert offloaded and all(c.decision is Decision.PRUNE and c.reason == "budget" and c.level == 4 for c in offloaded)
    # Oldest first, a placeholder each: each output (its call, smaller than a placeholder, stays).
    seqs = [c.seq for c in offloaded]
    assert seqs == list(range(4, 4 + 2 * len(seqs), 2))
    [warning] = [w for w in out.view.warnings if w.code == "BUDGET_OFFLOADED"]
    assert f"the budget of {budget:,} tokens" in warning.message and "run" not in warning.message
    check_view(out, OPENAI)
    for cert in offloaded:
        assert_complete(cert)
    # In force from then on: the next render keeps them out, certifies nothing new.
    again = run(items, exact, state=out.state, budget=budget)
    assert again.certificates == () and again.view.messages_json == out.view.messages_json


def following(items: list[Item], policy: Policy, request: ViewRequest, previous: RenderOutput | None) -> RenderInput:
    """A render of `items` from `previous` (its state and carry), at 1,000 s plus a second an item."""
    return RenderInput(
        make_session(len(items)),
        items,
        policy,
        request,
        counter(),
        REGISTRY,
        previous.state if previous else ViewState(),
        1_000.0 + len(items),
        carry=previous.carry if previous else None,
    )


@pytest.mark.parametrize("fmt", [OPENAI, ANTHROPIC])
def test_a_budget_walk_after_appends_weighs_the_turns_it_left_unsettled_not_the_session(
    monkeypatch: pytest.MonkeyPatch, fmt: ViewFormat
) -> None:
    """Over its budget, a session appended a round at a time offloads its oldest turn at each
    render; a render from the carry walks the turns the last walk left unsettled (the recent,
    protected ones) and those appended, not the turns offloaded before or a user's turn
    (protected for good), counts the view's messages on from the first entry that changed, and
    renders what the render from the state alone renders."""
    rounds = [tool_round(f"c{n}", "bash", f"output {n}") for n in range(40)]
    rounds.insert(5, [ItemContent(role=Role.USER, content=(TextBlock("Now the lexer too."),))])
    items = history(*rounds)
    policy = parse_policy("protection: {last_turns: 2}\nrules: []\ncache: {low_water: 1}", REGISTRY)
    walked = []
    visited = budget_stage._Walk.visited

    def counting(walk: budget_stage._Walk, seqs: list[int], settled: bool) -> None:
        walked.append(seqs[0])
        visited(walk, seqs, settled)

    monkeypatch.setattr(budget_stage._Walk, "visited", counting)
    folded = []
    fold = messages_stage._fold_chat if fmt is OPENAI else messages_stage._fold_merged

    def folding(*args: Any, **kwargs: Any) -> Any:
        folded.append(1)
        return fold(*args, **kwargs)

    monkeypatch.setattr(messages_stage, "_fold_chat" if fmt is OPENAI else "_fold_merged", folding)
    previous: RenderOutput | None = None
    offloaded, turns_walked, turns_walked_whole, counted, counted_whole = 0, [], [], [], []
    began: list[bool] = []
    shown: list[int] = []
    for cut in range(30, len(items) + 1, 2):
        inp = following(items[:cut], policy, ViewRequest(fmt, 1_500), previous)
        walked.clear()
        folded.clear()
        last = previous.carry.finished.draft.message_count if previous and previous.carry else None
        out = render(inp)
        if last is not None:  # (the count goes on in the list of the one before, cut back: no copy)
            assert out.carry is not None and out.carry.finished.draft.message_count is not None
            assert out.carry.finished.draft.message_count.after is last.after
        turns_walked.append(len(walked))
        counted.append(len(folded))
        walked.clear()
        folded.clear()
        assert out == render(replace(inp, carry=None))
        turns_walked_whole.append(len(walked))
        counted_whole.append(len(folded))
        offloaded += sum(c.rule == "budget" for c in out.certificates)
        began.append(previous is not None and RUN in out.view.messages_json and RUN not in previous.view.messages_json)
        shown.append(sum(i.representation is not Representation.OMITTED for i in out.view.items))
        previous = out
    assert offloaded > len(turns_walked)  # each render offloaded what was appended since
    # From the state alone, the walk goes through every turn offloaded before: the session.
    assert turns_walked_whole[-1] > 20
    assert max(turns_walked[1:]) <= 4, turns_walked
    # The messages counted on from the first entry offloaded last time: at most the entries the
    # view shows and the few it just left out (once the placeholders themselves outgrew the
    # budget and the oldest turns began to leave whole, the run they leave in grows at each
    # render, from its end on), where the count from the state alone goes through the session.
    assert sum(began) == 1
    passes = 2 if fmt is ANTHROPIC else 1  # (counted again once the walk is done, where merged)
    assert all(c <= passes * (n + 4) for c, n in zip(counted[1:], shown[1:], strict=True)), (counted, shown)
    assert max(counted[1:]) < counted_whole[-1] * 3 / 4, (counted, counted_whole)


LONG = "protection: {last_turns: 2}\nrules: []"
RUN = "[contextd: items "


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_long_session_fits_its_budget_its_old_turns_leaving_together_behind_one_marker(fmt: ViewFormat) -> None:
    """A placeholder per output keeps its call (pairs go together), so a long session's calls
    alone outweigh a budget however much is offloaded: over budget at every call. Once the
    placeholders are not enough, the oldest turns leave whole instead, calls and results,
    behind one marker that names their seqs."""
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(300)))
    calls = sum(i.token_count for i in items if i.role is Role.ASSISTANT)
    budget = calls // 2
    out = run(items, LONG, fmt=fmt, budget=budget)
    assert not out.view.over_budget and out.view.total_tokens <= budget
    check_view(out, fmt, items)
    [(first, last, turns)] = re.findall(
        r"\[contextd: items (\d+) to (\d+) \((\d+) turns\) removed \(budget: ", out.view.messages_json
    )
    first, last = int(first), int(last)
    assert (first, int(turns)) == (3, (last - 2) // 2)  # the oldest turns, every item of each
    assert out.view.messages_json.count(RUN) == 1
    # The marker stands on the last turn's call, right before the turns still shown.
    shown = {i.seq: i.representation for i in out.view.items}
    assert shown[last - 1] is Representation.PLACEHOLDER
    assert {shown[s] for s in range(first, last + 1) if s != last - 1} == {Representation.OMITTED}
    assert all(shown[s] is not Representation.OMITTED for s in range(last + 1, len(items) + 1))
    # Each item offloaded is certified, with the handle the stash keeps it under.
    offloaded = [c for c in out.certificates if c.rule == "budget"]
    assert {c.seq for c in offloaded} >= set(range(first, last + 1))
    for cert in offloaded:
        assert cert.decision is Decision.PRUNE and cert.handle == handle_of(items[cert.seq - 1])
    again = run(items, LONG, state=out.state, fmt=fmt, budget=budget, now=1_010.0)
    assert again.certificates == () and again.view.messages_json == out.view.messages_json


def test_a_render_after_turns_left_out_whole_renders_what_was_appended_not_the_turns_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The results of a run's turns are left out with their calls, in place: the assembly of the
    next render resumes after them. (At the end of the view, where repair put results whose
    call is not shown, every render went through all of them again: 15 ms a render at 10,000
    items.)"""
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(320)))
    folded: list[int] = []
    fold = view_module._fold

    def counting(asm: Any, folder: Any, start: int, redo: set[int]) -> None:
        folded.append(len(asm.entries) - start)
        fold(asm, folder, start, redo)

    monkeypatch.setattr(view_module, "_fold", counting)
    policy = parse_policy(LONG, REGISTRY)
    calls = sum(i.token_count for i in items if i.role is Role.ASSISTANT)
    out = None
    for n in range(600, len(items) + 1, 2):
        inp = RenderInput(
            make_session(n),
            items[:n],
            policy,
            ViewRequest(OPENAI, calls // 2),
            counter(),
            REGISTRY,
            out.state if out else ViewState(),
            1_000.0 + n,
            carry=out.carry if out else None,
        )
        out = render(inp)
    assert out is not None and RUN in out.view.messages_json
    assert [i.seq for i in out.view.items] == list(range(1, len(items) + 1))  # in order, the left out among them
    later = sorted(folded[1:])
    assert later[len(later) // 2] <= 6, folded  # the new round and the one before it, at most


def test_an_offload_leaves_room_so_that_the_calls_after_it_read_the_prompt_from_the_cache() -> None:
    """Offloading just down to the budget rewrites the cached prompt, from the oldest turn the
    offload takes on, at every call that goes over it; down to the low water (0.8 of the budget)
    it is rewritten once for the several calls that fill the room again, each of which reads
    the last one's prompt whole. The renders from the carry are those from the state alone."""
    rounds = [tool_round(f"c{n}", "bash", f"output {n}") for n in range(120)]
    items = history(*rounds)

    def session(low_water: float) -> tuple[int, int, int]:
        """Renders that offloaded; that reused less than half of the last prompt; tokens sent
        past what they reused (written to the cache again, or uncached)."""
        policy = f"{LONG}\ncache: {{low_water: {low_water}}}"
        out, offloads, rewrites, written = None, 0, 0, 0
        for n in range(60, len(items) + 1, 2):  # a round appended a call
            state = out.state if out else ViewState()
            inp = RenderInput(
                make_session(n),
                items[:n],
                parse_policy(policy, REGISTRY),
                ViewRequest(OPENAI, 2_500),
                counter(),
                REGISTRY,
                state,
                1_000.0 + n,
                carry=out.carry if out else None,
            )
            new = render(inp)
            assert new == render(replace(inp, carry=None))
            assert not new.view.over_budget and new.view.messages_json.count(RUN) <= 1
            if out is not None:
                offloads += any(c.rule == "budget" for c in new.certificates)
                rewrites += new.view.stable_prefix_tokens < out.view.total_tokens / 2
                written += new.view.total_tokens - new.view.stable_prefix_tokens
            out = new
        return offloads, rewrites, written

    calls = len(range(62, len(items) + 1, 2))
    exact, low = session(1), session(0.8)
    assert exact[0] > calls * 3 // 4 and exact[1] > calls * 3 // 4  # a rewrite at nearly every call
    assert 0 < low[1] < calls // 4 and low[1] <= low[0] and low[2] < exact[2] / 2, (low, exact)


def test_a_pin_among_turns_left_out_together_brings_them_back_and_the_budget_offloads_around_it() -> None:
    """A pinned item shows in full; in a run of whole turns it would lack its call, and the
    items after it their marker. The run comes back whole (KEEP each), and the budget leaves out
    the turns around the pinned one anew."""
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(120)))
    budget = 2_500
    out = run(items, LONG, budget=budget)
    [(first, last)] = re.findall(r"\[contextd: items (\d+) to (\d+) ", out.view.messages_json)
    first, last = int(first), int(last)
    pinned = (first + last) // 2 // 2 * 2  # an output in the middle of the run (outputs have even seqs)
    again = run(items, LONG, state=out.state, pins=frozenset({pinned}), budget=budget, now=1_010.0)
    kept = [c for c in again.certificates if c.decision is Decision.KEEP]
    assert sorted(c.seq for c in kept) == list(range(first, last + 1))
    assert all(f"item {pinned} is protected since" in c.rationale for c in kept if c.seq != pinned)
    shown = {i.seq: i.representation for i in again.view.items}
    assert shown[pinned] is Representation.FULL and shown[pinned - 1] is Representation.FULL  # with its call
    assert not any(w.code.startswith("REPAIR") for w in again.view.warnings)
    assert again.view.total_tokens <= budget and again.view.messages_json.count(RUN) == 2
    check_view(again, OPENAI)


def test_what_cannot_be_offloaded_leaves_the_view_over_budget_and_it_says_so() -> None:
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(3)))
    out = run(items, "protection: {last_turns: 10}\nrules: []", budget=50)
    assert out.view.over_budget and [c for c in out.certificates if c.rule == "budget"] == []
    assert [w.code for w in out.view.warnings] == ["OVER_BUDGET"]


def test_without_a_budget_nothing_is_offloaded() -> None:
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(8)))
    assert [c for c in run(items, "rules: []").certificates if c.rule == "budget"] == []


def test_a_carry_used_twice_renders_the_same_twice_and_repeated_call_ids_start_over() -> None:
    """A render takes the parts of the carry it resumes over (once): a second render from the
    same carry starts over, and renders the same."""

    # Histories appends would refuse (a call id used twice), which the engine still takes.
    def call(call_id: str) -> ItemContent:
        return ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock(call_id, "bash", "{}"),))

    def user(text: str) -> ItemContent:
        return ItemContent(role=Role.USER, content=(TextBlock(text),))

    def result(call_id: str, *parts: TextBlock | ImageBlock) -> ItemContent:
        return ItemContent(role=Role.TOOL, content=(ToolResultBlock(call_id, parts),))

    image = ImageBlock("image/png", uri="https://example.com/a.png")  # Chat Completions leaves it out
    answered_twice = [user("hi"), call("x"), result("x", TextBlock("word " * 300), image), user("next"), call("x")]
    called_twice = [user("hi"), call("c0"), call("c0"), user("more"), result("c0", TextBlock("out"))]
    for contents, cut in ((answered_twice, 4), (called_twice, 3)):
        items = [to_item(c, seq) for seq, c in enumerate(contents, start=1)]
        first, _ = follow(items[:cut], "rules: []", None, 0.0)
        again, _ = follow(items, "rules: []", first, 10.0)  # and equal to the render without the carry
        twice, _ = follow(items, "rules: []", first, 10.0)
        assert again == twice


def test_the_stored_state_is_the_plain_serialization_of_the_state() -> None:
    # Written from pieces remembered per object: the bytes must be those of the whole at once.
    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(6)))
    first = run(items[:8], DROP_TOOL_OUTPUTS, fmt=ANTHROPIC, agent=[AgentProposal(1, 3, "done")])
    second = run(items, DROP_TOOL_OUTPUTS, state=first.state, now=2_000.0)
    for state in (first.state, second.state):
        assert state.applied and not state.pending
        plain = {
            "view_version": state.view_version,
            "policy_version": state.policy_version,
            "renders": {
                name: {
                    "rendered_at": r.rendered_at,
                    "segments": [[s.seq, s.digest, s.tokens] for s in r.segments],
                    "view_tokens": r.view_tokens,
                    "budget_tokens": r.budget_tokens,
                    "history_tokens": r.history_tokens,
                    **({"banked": r.banked} if r.banked else {}),
                }
                for name, r in sorted(state.renders.items())
            },
            "applied": [applied_to_json(a) for a in state.applied],
            "pending": [],
            "decided": sorted(state.decided),
        }
        assert state_to_json(state) == json.dumps(plain, separators=(",", ":"), ensure_ascii=False)
        assert state_from_json(state_to_json(state)) == state


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_view_that_fits_its_budget_exactly_offloads_nothing(fmt: ViewFormat) -> None:
    # Parallel calls: the Messages format merges their results into one message.
    rounds = []
    for n in range(6):
        uses = tuple(ToolUseBlock(f"c{n}{k}", "bash", json.dumps({"path": f"{n}{k}"})) for k in range(3))
        results = [
            ItemContent(
                role=Role.TOOL, content=(ToolResultBlock(f"c{n}{k}", (TextBlock(f"out {n}{k} " + "word " * 60),)),)
            )
            for k in range(3)
        ]
        rounds.append([ItemContent(role=Role.ASSISTANT, content=uses), *results])
    items = history(*rounds)
    budget = run(items, "rules: []", fmt=fmt).view.total_tokens
    out = run(items, "protection: {last_turns: 1}\nrules: []", fmt=fmt, budget=budget)
    assert [c for c in out.certificates if c.rule == "budget"] == [] and not out.view.over_budget
    tighter = run(items, "protection: {last_turns: 1}\nrules: []", fmt=fmt, budget=budget - 200)
    assert [c for c in tighter.certificates if c.rule == "budget"] and not tighter.view.over_budget


def test_a_session_with_many_calls_behind_it_expects_more_of_them_when_told_to() -> None:
    # The same prune, priced over 20 further calls and over as many as the session has made.
    sizes = [2_000] + [1_500] * 10
    items = big_history(sizes, marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    long_session = replace(warm.state, view_version=400)  # 400 renders so far
    priced = PRUNE_MARKED.replace("expected_calls: 20", "expected_calls: 20, stakes: unlimited")
    fixed = run(items, priced, state=long_session, now=60)
    auto = run(items, priced.replace("expected_calls: 20", 'expected_calls: "auto"'), state=long_session, now=60)
    assert [c.decision for c in fixed.certificates] == [Decision.DEFER]
    [applied] = auto.certificates
    assert applied.decision is Decision.PRUNE and "over 400 calls" in applied.rationale


def test_a_rewrite_that_pays_waits_until_the_session_has_saved_what_it_would_lose_if_it_ended_next() -> None:
    sizes = [2_000] + [1_500] * 10
    items = big_history(sizes, marked={0})
    warm = run(items, "protection: {last_turns: 0}", now=0)
    [(fmt, render)] = warm.state.renders.items()
    assert render.banked == 0.0  # the first call sent what the whole history would have
    auto = PRUNE_MARKED.replace("expected_calls: 20", 'expected_calls: "auto"')
    long_session = replace(warm.state, view_version=400)  # pays over the 400 calls expected
    [waits] = run(items, auto, state=long_session, now=60).certificates
    assert waits.decision is Decision.DEFER and "more than the session has saved so far" in waits.rationale
    saving = waits.tokens_removed - waits.placeholder_tokens
    at_risk = stake(saving, waits.mutation_radius_tokens, parse_policy(auto, REGISTRY).cache)
    assert at_risk > 0
    for bank, decision in ((at_risk * 0.9, Decision.DEFER), (at_risk * 1.1, Decision.PRUNE)):
        saved = replace(long_session, renders={fmt: replace(render, banked=bank)})
        [certificate] = run(items, auto, state=saved, now=60).certificates
        assert certificate.decision is decision, bank


def test_what_a_session_banks_is_what_its_calls_saved_against_its_whole_history() -> None:
    # An edit of the tail the cache has not seen is free, and saves its tokens on this call and the next.
    items = big_history([9_800] * 10 + [3_000], marked={10})
    first = run(items[:-2], "protection: {last_turns: 0}", now=0)
    second = run(items, PRUNE_MARKED, state=first.state, now=30)
    [cert] = second.certificates
    assert (cert.decision, cert.mutation_radius_tokens) == (Decision.PRUNE, 0)
    grew = sent(second).history_tokens - sent(first).history_tokens
    cache = parse_policy(PRUNE_MARKED, REGISTRY).cache
    whole = priced(Usage(sent(first).history_tokens, grew, 0), cache)
    assert sent(second).banked == pytest.approx(whole - priced(second.predicted, cache))
    assert sent(second).banked > 0
    stored = state_from_json(state_to_json(second.state))  # it is kept with the state
    assert stored.renders[OPENAI.value].banked == sent(second).banked


def test_a_budget_walk_after_appends_passes_over_the_turns_kept_for_good_the_walk_before_found() -> None:
    """Each output read twice, the first copy goes (a duplicate) and the second stays whole as
    the evidence of its removal, for as long as the session goes: its turn is kept for good, and
    every turn is too few between two such to leave out whole. A render from the carry walks the
    turns after the last one kept for good that the walk before found (each item, whole turns),
    not the session; and renders what the render from the state alone renders (its walks go
    through the session)."""
    rounds = [tool_round(f"c{n}", "bash", f"file {n // 2} " + f"line {n // 2}\n" * 40) for n in range(60)]
    items = history(*rounds)
    policy = parse_policy(
        "protection: {last_turns: 2}\nrules:\n"
        "  - {name: duplicates, transform: dedupe, params: {on_entry: true}, when: {roles: [tool]}}\n"
        "cache: {low_water: 1}",
        REGISTRY,
    )
    counts = {"whole": 0, "each": 0}
    leave_out, visited = budget_stage._Offload.leave_out, budget_stage._Walk.visited

    def leaving(walk: budget_stage._Offload, seqs: list[int]) -> bool:
        counts["whole"] += 1
        return leave_out(walk, seqs)

    def visiting(walk: budget_stage._Walk, seqs: list[int], settled: bool) -> None:
        counts["each"] += 1
        visited(walk, seqs, settled)

    previous: RenderOutput | None = None
    walked: list[tuple[int, int]] = []
    walked_whole: list[tuple[int, int]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(budget_stage._Offload, "leave_out", leaving)
        patch.setattr(budget_stage._Walk, "visited", visiting)
        for cut in range(80, len(items) + 1, 2):
            inp = following(items[:cut], policy, ViewRequest(OPENAI, 1_000), previous)
            counts.update(whole=0, each=0)
            out = render(inp)
            walked.append((counts["each"], counts["whole"]))
            counts.update(whole=0, each=0)
            assert out == render(replace(inp, carry=None))
            walked_whole.append((counts["each"], counts["whole"]))
            previous = out
    assert out.view.over_budget and sum(c.reason == "duplicate" for c in out.certificates) <= 1
    each_whole, whole_whole = walked_whole[-1]
    assert each_whole > 20 and whole_whole > 20, walked_whole  # from the state alone: the session
    # (The render after the first finds the turns kept for good: the first had no edit in force.)
    assert max(each for each, _ in walked[2:]) <= 6, walked
    assert max(whole for _, whole in walked[2:]) <= 6, walked
