"""Retraction in the engine (engine/retraction.py): a durable edit no view gets past, pairs
repaired, no evidence for any rule."""

from __future__ import annotations

import json

import pytest

from contextd.engine.blocks import BLOCK, Blocks
from contextd.engine.certificates import Decision
from contextd.engine.model import ItemContent, Representation, Role, TextBlock
from contextd.engine.retraction import REDACTED, RETRACTED, certificate_of, retracted, retraction
from contextd.engine.state import ControlMode
from contextd.engine.view import ViewFormat
from tests.helpers import counter, stored_items
from tests.service.engine.test_pipeline import ANTHROPIC, OPENAI, by_decision, check_view, history, run, tool_round

COPIES = "protection: {last_turns: 0}\nrules: [{name: d, transform: claim_copies, when: {roles: [tool]}}]"


def _shown(out: object, seq: int) -> Representation:
    return next(i.representation for i in out.view.items if i.seq == seq)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", [OPENAI, ANTHROPIC, ViewFormat.OPENAI_RESPONSES])
def test_a_retracted_result_leaves_its_call_answered_by_a_marker_without_a_handle(fmt: ViewFormat) -> None:
    items = history(tool_round("c1", "bash", "the password is hunter2"), tool_round("c2", "bash", "ok"))
    edit = retraction(items[3], True, counter())
    out = run(items, fmt=fmt, durable=[edit])
    check_view(out, fmt)
    text = out.view.messages_json
    assert "hunter2" not in text and "output of tool call c1 (bash) redacted by the client" in text
    assert "retrieve with handle" not in text
    assert _shown(out, 4) is Representation.PLACEHOLDER and _shown(out, 6) is Representation.FULL


@pytest.mark.parametrize("fmt", [OPENAI, ANTHROPIC, ViewFormat.OPENAI_RESPONSES])
def test_a_retracted_turn_takes_its_results_with_it(fmt: ViewFormat) -> None:
    items = history(tool_round("c1", "bash", "first"), tool_round("c2", "bash", "second"))
    out = run(items, fmt=fmt, durable=[retraction(items[2], False, counter())])
    check_view(out, fmt)
    assert "first" not in out.view.messages_json and "c1" not in out.view.messages_json
    assert _shown(out, 3) is Representation.OMITTED and _shown(out, 4) is Representation.OMITTED
    assert "REPAIR_RESULT_DROPPED" in [w.code for w in out.view.warnings]


def test_a_retraction_is_in_force_whatever_the_pins_and_its_certificate_says_who_and_why() -> None:
    items = history(tool_round("c1", "bash", "x"))
    user = items[1]
    edit = retraction(user, False, counter())
    out = run(items, pins=frozenset({2}), durable=[edit])
    assert "Fix the parser." not in out.view.messages_json
    cert = certificate_of(user, edit, "the user took it back")
    assert (cert.decision, cert.rule, cert.reason, cert.control) == (
        Decision.PRUNE,
        "retraction",
        RETRACTED,
        ControlMode.CLIENT,
    )
    assert cert.handle and cert.rationale == "the user took it back" and cert.tokens_removed == user.token_count
    redacted = certificate_of(user, retraction(user, True, counter()), "")
    assert (redacted.reason, redacted.handle) == (REDACTED, "")  # nothing gets a redacted original back
    assert retracted([edit]) == frozenset({2})


def test_a_retracted_item_is_no_evidence_and_an_edit_resting_on_it_is_undone() -> None:
    items = history(tool_round("c1", "read_file", "same bytes"), tool_round("c2", "read_file", "same bytes"))
    first = run(items, COPIES)
    [pruned] = by_decision(first, Decision.PRUNE)
    assert (pruned.seq, pruned.evidence) == (6, "identical to seq 4")
    after = run(items, COPIES, state=first.state, durable=[retraction(items[3], False, counter())])
    [kept] = by_decision(after, Decision.KEEP)
    assert kept.seq == 6 and "its evidence, item 4, was retracted" in kept.rationale
    assert _shown(after, 6) is Representation.FULL
    assert [c.seq for c in by_decision(after, Decision.ABSTAIN)] == [6]  # proposed again: 4 is not shown


def test_a_retracted_user_item_opening_the_conversation_stays_out_when_another_opens_it() -> None:
    more = stored_items(
        [
            ItemContent(role=Role.SYSTEM, content=(TextBlock("sys"),)),
            ItemContent(role=Role.USER, content=(TextBlock("first ask"),)),
            ItemContent(role=Role.USER, content=(TextBlock("second ask"),)),
        ]
    )
    out = run(more, fmt=ANTHROPIC, durable=[retraction(more[1], False, counter())])
    check_view(out, ANTHROPIC)
    assert json.loads(out.view.messages_json) == [{"role": "user", "content": "second ask"}]


def test_a_long_view_with_an_early_turn_retracted_resumes_its_repair_and_shares_its_blocks() -> None:
    # The retracted turn's result is placed by repair after the rest (its call is gone): the
    # entries repair hands out keep the whole blocks they share with the last render's.
    from tests.service.engine.test_pipeline import follow

    items = history(*(tool_round(f"c{n}", "bash", f"output {n}") for n in range(3 * BLOCK // 2)))
    durable = (retraction(items[2], False, counter()),)
    policy = "rules: []"
    first, _ = follow(items[:-4], policy, None, 0.0, durable=durable)
    second, followed = follow(items[:-2], policy, first, 10.0, durable=durable)
    assert followed and "REPAIR_RESULT_DROPPED" in [w.code for w in second.view.warnings]
    assert first.carry is not None and second.carry is not None
    before, after = first.carry.repaired.out, second.carry.repaired.out
    assert isinstance(before, Blocks) and isinstance(after, Blocks) and after[-1].seq == 4  # (placed last)
    assert all(a is b for a, b in zip(before.blocks[:2], after.blocks[:2], strict=True))
