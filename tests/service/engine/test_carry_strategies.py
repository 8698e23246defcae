"""The built-in strategies from the carry (stages/ledger.py): a render that asks each rule only
about what changed since the previous render proposes, decides and shows exactly what a
render from the state alone does, on generated shell sessions that give every strategy its
evidence (pages and whole reads of files, writes that move lines or not, test runs and
status commands repeated, identical outputs, failures and successes, failed calls with bulky
inputs, spans of work marked complete, a shell whose directory changes) and a focus that
moves with the latest turns."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial, reduce
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextd.engine import carry_pickle, pipeline
from contextd.engine import repair as repair_module
from contextd.engine import view as view_module
from contextd.engine.blocks import Blocks
from contextd.engine.carry_pickle import UnusableCarry, dump_carry, load_carry
from contextd.engine.changes import StateChange, advance, change_from_json, change_to_json
from contextd.engine.compress import code as code_module
from contextd.engine.compress.strategy import Compress
from contextd.engine.eligibility import Judge
from contextd.engine.memo import clear_memos, shared_prefix
from contextd.engine.model import Item, ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.observations import COMPLETES
from contextd.engine.pipeline import AgentProposal, Carry, RenderInput, RenderOutput, render
from contextd.engine.policy import default_policy_text, parse_policy
from contextd.engine.stages import ledger as ledger_module
from contextd.engine.stages import propose as propose_module
from contextd.engine.stages import show as show_module
from contextd.engine.stages.draft import Draft
from contextd.engine.stages.eligible import NOT_SMALLER, Eligible, still_eligible
from contextd.engine.stages.ledger import STALE_SLACK, Ledger, to_ask
from contextd.engine.stages.propose import Candidate, transform_context
from contextd.engine.state import AppliedEdit, ControlMode, ViewState, slot_of, state_from_json, state_to_json
from contextd.engine.strategies import Snapshots
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import CacheState, Concerned, FocusChange, Proposal, Remove, Reorder, Replace, target_of
from contextd.engine.view import ViewFormat, ViewRequest
from tests.helpers import counter, make_session, stored_items
from tests.service.engine.test_changes import assert_change_makes

REGISTRY = TransformRegistry.default()
COUNTER = counter()
PATHS = ("src/app.py", "/repo/src/util.py", "app.py")
CODE = "\n".join(f"def handler_{n}(request):\n    return parse_header(request, {n})  # value_{n}" for n in range(30))
SMALL = "\n".join(
    f'def handler_{n}(request):\n    """Handle {n}."""\n'
    + "".join(f"    value_{k} = request.get('field_{k}', {k})\n" for k in range(8))
    + "    return value_0\n"
    for n in range(3)
)
"""Compressed under a focus on one of its handlers, not on two (what is kept whole is too much)."""
FOCUS = ["handler_0", "handler_1", "handler_2", "value_12", "parse_header"]


def lines(first: int, last: int) -> str:
    return "\n".join(f"{n:>6}\tvalue_{n} = compute_{n % 7}(value_{n - 1})" for n in range(first, last + 1))


@st.composite
def command(draw: st.DrawFn) -> tuple[str, str, bool]:
    """(command, output, flagged failed) of one bash call."""
    path = draw(st.sampled_from(PATHS))
    first = draw(st.integers(1, 80))
    last = first + draw(st.sampled_from([5, 20, 40, 60]))
    kind = draw(st.integers(0, 14))
    if kind <= 2:
        return f"sed -n '{first},{last}p' {path}", lines(first, last), False
    if kind == 3:
        return f"nl -ba {path} | sed -n '{first},{last}p'", lines(first, last), False
    if kind == 4:
        return f"cat {path}", CODE if draw(st.booleans()) else f"cat: {path}: No such file or directory", False
    if kind == 5:
        return draw(st.sampled_from([f"sed -i 's/old/new/' {path}", f"sed -i '{first}d' {path}"])), "", False
    if kind == 6:
        passed = draw(st.booleans())
        tail = (
            "=== 12 passed in 0.52s ===" if passed else "FAILED tests/test_app.py::test_parse\n=== 1 failed in 0.4s ==="
        )
        return "pytest -q", lines(1, draw(st.sampled_from([3, 30]))) + "\n" + tail, not passed
    if kind == 7:
        return "git status", "On branch main\n" + "\n".join(f"\tmodified: src/mod_{n}.py" for n in range(20)), False
    if kind == 8:
        return "ls src", "\n".join(f"module_{n}.py" for n in range(40)), False
    if kind == 9:
        return "python3 fix.py", "Traceback (most recent call last):\nValueError: bad header\n" + lines(1, 30), True
    if kind == 10:
        return "cd src", "", False
    if kind == 11:
        return f"grep -n parse_header {path}", lines(first, first + 3), False
    if kind == 12:
        return f"tail -n 40 {path}", lines(40, 80), False
    if kind == 13:
        return "cat src/small.py", SMALL, False
    return "python3 -c 'print(1)'", "1", False


@st.composite
def sessions(draw: st.DrawFn) -> list[Item]:
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),)),
    ]
    for call in range(1, draw(st.integers(2, 22)) + 1):
        if draw(st.integers(0, 7)) == 0:
            said = draw(st.sampled_from(["Now look at handler_3.", "Check value_12 again.", "Go on."]))
            contents.append(ItemContent(role=Role.USER, content=(TextBlock(said),)))
        text, output, failed = draw(command())
        arguments = {"command": text}
        if draw(st.integers(0, 9)) == 0:  # a bulky input: a script written in a heredoc
            arguments = {"command": f"cat > fix.py <<'EOF'\n{CODE}\nEOF\npython3 fix.py"}
            output, failed = "Traceback (most recent call last):\nSyntaxError: invalid syntax", True
        looking = draw(st.sampled_from([f"value_{draw(st.integers(1, 60))}", *FOCUS]))
        said = (TextBlock(f"Looking at {looking}."),) if draw(st.booleans()) else ()
        use = ToolUseBlock(f"c{call}", "bash", json.dumps(arguments))
        contents.append(ItemContent(role=Role.ASSISTANT, content=(*said, use)))
        metadata = {}
        if draw(st.integers(0, 11)) == 0 and len(contents) > 4:
            first = draw(st.integers(3, len(contents) - 1))
            metadata = {COMPLETES: f"{first}-{len(contents)}"}  # the work since `first`, done
        result = ToolResultBlock(f"c{call}", (TextBlock(output or "(no output)"),), is_error=failed, name="bash")
        contents.append(ItemContent(role=Role.TOOL, content=(result,), metadata=metadata))
    return stored_items(contents)


POLICIES = [
    default_policy_text(),
    default_policy_text().replace("evidence: {max_level: 3}", "evidence: {max_level: 4}"),
    default_policy_text().replace("protection: {last_turns: 1}", "protection: {last_turns: 0}"),
    default_policy_text()
    + "  - {name: pressure, transform: mask, when: {roles: [tool], utilization: {min: 0.6}, age_turns: {max: 6}}}\n",
]


def follow(items: list[Item], policy: str, previous: RenderOutput | None, now: float, **given: object) -> RenderOutput:
    inp = RenderInput(
        session=make_session(len(items)),
        items=items,
        policy=parse_policy(policy, REGISTRY),
        request=ViewRequest(ViewFormat.OPENAI_CHAT, **given),  # type: ignore[arg-type]
        counter=counter(),
        registry=REGISTRY,
        state=previous.state if previous else ViewState(),
        now=now,
        carry=previous.carry if previous else None,
    )
    out = render(inp)
    assert out == render(replace(inp, carry=None))
    assert_change_makes(inp.state, out)
    if previous is not None and previous.carry is not None and out.carry is not None:
        assert_took_over_the_same_objects(previous.carry, out.carry)
    return out


def assert_took_over_the_same_objects(before: Carry, after: Carry) -> None:
    """What a render says it kept of the previous render's repaired entries and segments (and
    so did not compare) is the very objects that render gave."""
    run, assembly = after.repaired, after.assembly
    assert before.repaired.out is not None and run.out is not None
    assert all(a is b for a, b in zip(before.repaired.out[: run.kept], run.out[: run.kept], strict=True))
    kept = assembly.kept
    assert all(a is b for a, b in zip(before.assembly.shown[:kept], assembly.shown[:kept], strict=True))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from(POLICIES), st.data())
def test_the_strategies_from_the_carry_are_the_strategies_without_it(
    items: list[Item], policy: str, data: st.DataObject
) -> None:
    previous: RenderOutput | None = None
    now = 0.0
    cut = 2
    while cut < len(items):
        cut = min(len(items), cut + data.draw(st.integers(1, 5)))
        now += data.draw(st.sampled_from([1.0, 30.0, 400.0]))
        focus = tuple(data.draw(st.lists(st.sampled_from(FOCUS), max_size=2, unique=True)))
        budget = data.draw(st.sampled_from([0, 0, 3_000]))
        previous = follow(items[:cut], policy, previous, now, focus=focus, budget_tokens=budget)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from(POLICIES), st.data())
def test_a_replica_catches_up_by_the_changes_of_the_other_replicas_renders(
    items: list[Item], policy: str, data: st.DataObject
) -> None:
    """Two replicas render one session by turns of any length: each starts from its own last
    render's carry brought up to the state by the changes the other's renders stored (as
    JSON), and renders what a render from the state alone renders."""
    parsed = parse_policy(policy, REGISTRY)
    changes: list[StateChange] = []  # every render's, in order
    held: dict[str, tuple[ViewState, Carry | None, int]] = {}  # replica -> its last state, carry, changes seen
    state, now, cut = ViewState(), 0.0, 2
    while cut < len(items):
        cut = min(len(items), cut + data.draw(st.integers(1, 4)))
        now += data.draw(st.sampled_from([1.0, 30.0, 400.0]))
        replica = data.draw(st.sampled_from(["a", "b"]))
        budget = data.draw(st.sampled_from([0, 0, 3_000]))  # an offload takes over a compression's slot
        inp = RenderInput(
            make_session(cut),
            items[:cut],
            parsed,
            ViewRequest(ViewFormat.OPENAI_CHAT, budget),
            counter(),
            REGISTRY,
            state,
            now,
        )
        if replica in held:
            mine, carry, seen = held[replica]
            since = [change_from_json(change_to_json(c)) for c in changes[seen:]]
            caught_up = reduce(advance, since, mine)
            assert caught_up == state
            if carry is not None:
                carry = carry if not since else carry.advanced(since, state, inp.items)
                inp = replace(inp, carry=carry)
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        assert out.change is not None
        changes.append(out.change)
        state = out.state
        held[replica] = (state, out.carry, len(changes))


def test_a_carry_resumed_twice_renders_the_same_view_both_times() -> None:
    """A render resumes the last render's assembly in place, and only once: a second render
    from the same carry (a retry, a render whose result was not kept) renders its view
    whole, and renders the same. Neither touches what the state says of the last render."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, 13):
        use = ToolUseBlock(f"c{call}", "bash", json.dumps({"command": f"cat src/m{call}.py"}))
        output = "\n".join(f"value_{call}_{n} = compute({n})" for n in range(30))
        result = ToolResultBlock(f"c{call}", (TextBlock(output),), name="bash")
        contents += [ItemContent(role=Role.ASSISTANT, content=(use,)), ItemContent(role=Role.TOOL, content=(result,))]
    items = stored_items(contents)
    first = follow(items[:17], POLICIES[0], None, 1.0)
    known = dict(first.state.renders[ViewFormat.OPENAI_CHAT.value].offsets())
    inp = RenderInput(
        make_session(21),
        items[:21],
        parse_policy(POLICIES[0], REGISTRY),
        ViewRequest(ViewFormat.OPENAI_CHAT),
        counter(),
        REGISTRY,
        first.state,
        30.0,
        carry=first.carry,
    )
    resumed = render(inp)
    assert first.carry is not None and first.carry.assembly.taken and first.carry.repaired.taken
    assert first.carry.ledgers is not None and first.carry.ledgers.claim.taken  # the rules' pools too
    again, whole = render(inp), render(replace(inp, carry=None))
    assert resumed == again == whole
    # Another render from that carry, with fewer items appended: the pools it would resume
    # hold items this history does not have.
    fewer = replace(inp, session=make_session(19), items=items[:19])
    assert render(fewer) == render(replace(fewer, carry=None))
    assert resumed.carry is not None and whole.carry is not None
    assert resumed.carry.assembly.offsets == whole.carry.assembly.offsets
    # The state's record of the last render read the offsets its assembly counted; taken over,
    # they are the next render's, and the record counts its own from its segments, once.
    before = first.state.renders[ViewFormat.OPENAI_CHAT.value]
    assert first.carry.assembly.counted is not None and first.carry.assembly.counted.taken
    assert before.offsets() == known and before.offsets() is not resumed.carry.assembly.offsets
    assert before.offsets() is before.offsets()
    assert resumed.state.renders[ViewFormat.OPENAI_CHAT.value].offsets() is resumed.carry.assembly.offsets
    # What a render took over is its own carry's, which the next render resumes in turn.
    assert not resumed.carry.assembly.taken and not resumed.carry.repaired.taken
    third = render(replace(inp, session=make_session(23), items=items[:23], state=resumed.state, carry=resumed.carry))
    assert resumed.carry.assembly.taken and resumed.carry.repaired.taken
    assert third == render(replace(inp, session=make_session(23), items=items[:23], state=resumed.state, carry=None))


@pytest.mark.parametrize("fails", ["contextd.engine.view._fold", "contextd.engine.repair._index"])
@pytest.mark.parametrize("pins", [frozenset(), frozenset({21})])
def test_a_render_after_one_that_failed_half_way_renders_its_view_whole(
    fails: str, pins: frozenset[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A render that took the last render's assembly or repair over and failed while refilling
    them leaves them cut back: the next render from that state (the same again, or one that
    does not follow the carry, whose entries are equal all the same) renders its view whole."""
    items = file_reads(12)
    first = render(budgeted(items, 0, 17, ViewState(), None))
    second = budgeted(items, 0, 21, first.state, first.carry)

    def half_way(*args: object, **kwargs: object) -> None:
        raise RuntimeError("half-way")

    with monkeypatch.context() as patched:
        patched.setattr(fails, half_way)
        with pytest.raises(RuntimeError):
            render(second)
    then = replace(second, pins=pins)
    assert render(then) == render(replace(then, carry=None))


def file_reads(calls: int) -> list[Item]:
    """A task, then `calls` reads of files of 60 lines each (the default policy compresses each
    output once it is older than the last turn)."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, calls + 1):
        use = ToolUseBlock(f"c{call}", "bash", json.dumps({"command": f"sed -n '1,60p' src/m{call}.py"}))
        output = "\n".join(f"value_{call}_{n} = compute({n})" for n in range(60))
        result = ToolResultBlock(f"c{call}", (TextBlock(output),), name="bash")
        contents += [ItemContent(role=Role.ASSISTANT, content=(use,)), ItemContent(role=Role.TOOL, content=(result,))]
    return stored_items(contents)


def budgeted(
    items: list[Item],
    budget: int,
    n: int,
    state: ViewState,
    carry: Carry | None,
    low_water: float | None = None,
    **given: Any,
) -> RenderInput:
    """A render of `items[:n]` under the default policy and `budget`, a minute a call apart
    (`low_water`: the policy's, instead of the default's)."""
    view = ViewRequest(ViewFormat.OPENAI_CHAT, budget)
    text = default_policy_text()
    if low_water is not None:
        text = text.replace("cache: {", f"cache: {{low_water: {low_water}, ", 1)
    policy = parse_policy(text, REGISTRY)
    return RenderInput(
        make_session(n), items[:n], policy, view, counter(), REGISTRY, state, 60.0 * n, carry=carry, **given
    )


def test_a_replica_catches_up_by_an_offload_that_took_over_a_compressions_slot() -> None:
    """Under a token budget the default policy compresses old outputs, and the budget offloads
    the oldest of them: the offload takes the compression's slot, so the render's change both
    removes an edit and adds one. The other replica brings its carry up by that change (it
    started from the state alone before: the whole session derived again, 4.7 s at 50,000
    items) and renders what a render from the state alone renders."""
    items = file_reads(39)
    request = partial(budgeted, items, 6_000)

    # One item appended a render, as in a session: a render that offloads the oldest
    # compressed output (the other replica's, from the state alone: a render takes the carry
    # it follows over) follows this replica's last.
    mine = render(request(30, ViewState(), None))
    for n in range(31, len(items)):
        theirs = render(request(n, mine.state, None))
        assert theirs.change is not None
        if theirs.change.removed:
            break
        mine = render(request(n, mine.state, mine.carry))
    assert theirs.change.removed and theirs.change.removed <= {slot_of(a.edit) for a in theirs.change.added}
    assert mine.carry is not None
    caught_up = mine.carry.advanced([change_from_json(change_to_json(theirs.change))], theirs.state, items[: n + 1])
    assert caught_up is not None
    inp = request(n + 1, theirs.state, caught_up)
    assert render(inp) == render(replace(inp, carry=None))


def test_replicas_taking_turns_render_what_one_renders_while_whole_turns_leave_in_runs() -> None:
    """A long session over its budget: the placeholders are not enough, and the oldest turns
    leave whole behind a marker that moves with the run's end (its old item left out, the edit
    in force there giving way). Two replicas take the renders in turn, each bringing its carry
    up by the other's changes, as stored: each renders what a render from the state alone does."""
    items = file_reads(90)
    request = partial(budgeted, items, 2_500)
    outputs = [render(request(40, ViewState(), None))]
    carries = [outputs[0].carry, None]
    changes: list[list[StateChange]] = [[], []]
    followed = 0
    for k, n in enumerate(range(41, len(items) + 1)):
        mine = k % 2
        last = outputs[-1]
        carry = carries[mine]
        if carry is not None and changes[mine]:
            carry = carry.advanced(changes[mine], last.state, items[:n])
        followed += carry is not None
        inp = request(n, last.state, carry)
        out = render(inp)
        assert out == render(replace(inp, carry=None)), n
        assert out.change is not None
        stored = change_from_json(change_to_json(out.change))
        changes[mine], carries[mine] = [], out.carry
        changes[1 - mine].append(stored)
        outputs.append(out)
    last = outputs[-1].view
    assert not last.over_budget and "[contextd: items " in last.messages_json
    assert any(o.change is not None and o.change.removed for o in outputs)  # a marker moved on, or grew
    assert followed >= len(outputs) - 3, followed  # each replica resumed from its carry, brought up


def test_a_replica_catching_up_by_several_changes_knows_a_compression_taken_over_since() -> None:
    """The other replica compressed an output, then offloaded it (the offload took the
    compression's slot): a carry brought up by both changes holds the output as offloaded, not
    compressed, as loading the state does; an agent's proposal to drop it then finds its slot
    taken, with the carry or without."""
    items = file_reads(19)
    request = partial(budgeted, items, 600, low_water=1)  # offloads the turn before the last, at each render

    mine = render(request(27, ViewState(), None))  # this replica's last render
    theirs, changes, carry = mine, [], None  # the other's carry: its own, not this one's
    for n in (28, 29):  # the other's: item 27 compressed, then offloaded
        theirs = render(request(n, theirs.state, carry))
        carry = theirs.carry
        assert theirs.change is not None
        changes.append(change_from_json(change_to_json(theirs.change)))
    assert 27 in changes[1].removed
    assert mine.carry is not None
    caught_up = mine.carry.advanced(changes, theirs.state, items[:29])
    assert caught_up is not None and 27 not in caught_up.finished.compressed
    inp = request(30, theirs.state, caught_up, agent_proposals=[AgentProposal(1, 27, "done with it")])
    assert render(inp) == render(replace(inp, carry=None))


def test_a_key_every_compressed_output_rested_on_is_read_as_long_as_the_pool_not_the_session() -> None:
    """The compressor's proposals rest on the focus, which moves with every call: its key names
    every output proposed for since the session began, though the outputs compressed have left
    the rule's pool. A render asks about that key's entries in proportion to the pool (what
    has left it is dropped from the key), and renders from the carry what it renders without,
    an output that comes back to the pool (pinned, then not) included."""
    items = file_reads(140)
    policy = parse_policy(default_policy_text(), REGISTRY)
    slot = next(k for k, rule in enumerate(policy.rules) if rule.transform == "compress")

    def at(n: int, previous: RenderOutput, pins: frozenset[int] = frozenset()) -> RenderOutput:
        inp = budgeted(items, 0, n, previous.state, previous.carry, pins=pins)
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        return out

    out = render(budgeted(items, 0, 200, ViewState(), None))
    out = at(201, out)  # every output but the last turn's compressed: out of the rule's pool
    for n in range(202, 232):
        out = at(n, out, frozenset({3}) if n in (210, 211) else frozenset())  # seq 3 back, whole, for a while
        assert out.carry is not None and out.carry.ledgers is not None
        ledger = out.carry.ledgers.rules[slot]
        assert ledger.by_key is not None
        assert len(ledger.by_key[("focus",)]) <= 2 * len(ledger.pool) + STALE_SLACK
    compressing = policy.rules[slot].name  # seq 3 proposed again once unpinned (waiting for the cache)
    assert 3 in {target_of(p.proposal.edit) for p in out.state.pending if p.rule == compressing}


def test_a_proposal_refused_at_every_render_is_not_made_again_while_nothing_it_rests_on_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`git status` run again and again, its outputs two by turns: each repeat is removed as a
    copy of the first of its kind, and those two, the evidence of the removals, are refused
    the snapshots rule's proposal at every render. A render from the carry takes that proposal
    as it stands (the same command has not run since) rather than making it again, and renders
    what a render without the carry does."""
    statuses = ["On branch main\n" + "\n".join(f"\tmodified:   src/m{k}_{n}.py" for n in range(30)) for k in (0, 1)]
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, 61):
        command, output = ("git status", statuses[call % 2]) if call <= 8 else (f"ls src/d{call}", f"f{call}.py")
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    asked = snapshots_asked(monkeypatch)
    out = render(budgeted(items, 0, 20, ViewState(), None))
    refused = {c.seq for c in out.certificates if c.rule == "snapshots" and c.decision.value == "abstain"}
    assert refused == {3, 5}  # the first status of each kind: the evidence of the copies' removals
    out = render(budgeted(items, 0, 21, out.state, out.carry))  # the removals shown since: asked again
    for n in range(22, 121):
        inp = budgeted(items, 0, n, out.state, out.carry)
        asked.clear()
        out = render(inp)
        assert not {3, 5} & set(asked)  # taken as it stands
        assert out == render(replace(inp, carry=None))


def snapshots_asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the seqs the snapshots rule is asked about, in order."""
    asked: list[int] = []
    proposal = Snapshots.proposal

    def counted(self: Snapshots, context: Any, entry: Any, seen: Any, params: Any) -> Any:
        asked.append(entry.seq)
        return proposal(self, context, entry, seen, params)

    monkeypatch.setattr(Snapshots, "proposal", counted)
    return asked


def short_statuses(calls: int, runs: tuple[int, ...]) -> list[Item]:
    """A task, then `calls` calls: a short `git status` at the calls `runs` names (five files
    changed, six from the third call on), a listing of one file at the others."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, calls + 1):
        status = "On branch main\n" + "\n".join(f"\tmodified:   src/m{k}.py" for k in range(5 + (call > 2)))
        command, output = ("git status", status) if call in runs else (f"ls src/d{call}", f"f{call}.py")
        contents += bash_round(call, command, output)
    return stored_items(contents)


def files_read_three_times() -> list[Item]:
    """A task, then 120 reads of 30 lines of forty files in turn (each file read three times, its
    values changed each time)."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, 121):
        f = call % 40
        lines = "\n".join(f"value_{f}_{k} = compute({k}, {call // 40})" for k in range(30))
        contents += bash_round(call, f"sed -n '1,30p' src/m{f}.py", lines)
    return stored_items(contents)


def judged_targets(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """From now on, the targets of the proposals the judge judges (not those it passes over)."""
    judged: list[int | None] = []
    judge = Judge.judge

    def spied(self: Judge, proposal: Any, control: Any, protection: bool = True) -> Any:
        judged.append(target_of(proposal.edit))
        return judge(self, proposal, control, protection)

    monkeypatch.setattr(Judge, "judge", spied)
    return judged


def test_a_proposal_judged_no_smaller_than_its_entry_is_not_judged_again_while_nothing_it_rests_on_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A short `git status` run again: the snapshots rule would replace the first with a note
    longer than it, refused (ABSTAIN, not smaller) once and certified. A render from the carry
    lets that proposal go (its entry shown as it was, it would be refused again) rather than
    judging it at every render; the command run a third time, the rule is asked about the
    second run (the first has had its next run since: nothing changes for it). Every render is
    the render without the carry."""
    items = short_statuses(60, runs=(1, 3, 40))
    judged = judged_targets(monkeypatch)
    out = render(budgeted(items, 0, 10, ViewState(), None))
    assert [(c.seq, c.rationale) for c in out.certificates] == [(3, NOT_SMALLER)]
    counts = []
    for n in range(11, 121):
        inp = budgeted(items, 0, n, out.state, out.carry)
        judged.clear()
        out = render(inp)
        counts.append((judged.count(3), judged.count(7)))
        assert out == render(replace(inp, carry=None))
    # Never again the first; the second once, as the third run comes (its result: seq 81).
    assert {n: c for n, c in enumerate(counts, start=11) if c != (0, 0)} == {81: (0, 1)}


def test_edits_waiting_for_the_cache_are_not_judged_again_while_nothing_done_since_bears_on_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forty files read three times over: each earlier read superseded by the later one, deep in
    a cached prompt, waits for the cache, and a render applies something often (a read
    superseded as the next comes, about one render in two). A render from the carry takes the
    waiting edits as the render before judged them (nothing applied since bears on them) rather
    than judging them again, its rules do not propose them again beside them, and it renders what
    a render without the carry does."""
    items = files_read_three_times()
    judged = judged_targets(monkeypatch)
    candidates: list[Candidate] = []
    judge_all = pipeline.judge

    def offered(given: Sequence[Candidate], *args: Any, **kwargs: Any) -> Any:
        candidates.extend(given)
        return judge_all(given, *args, **kwargs)

    monkeypatch.setattr(pipeline, "judge", offered)
    out = render(budgeted(items, 0, 150, ViewState(), None))
    waited = applied = 0
    for n in range(151, 241):
        inp = budgeted(items, 0, n, out.state, out.carry)
        judged.clear()
        candidates.clear()
        out = render(inp)
        waiting = {target_of(p.proposal.edit) for p in inp.state.pending}
        assert not waiting & set(judged)
        # The rule's own proposal of what waits is not made a candidate again beside it (let go).
        assert not {id(p.proposal) for p in inp.state.pending} & {id(c.proposal) for c in candidates if not c.pending}
        assert out == render(replace(inp, carry=None))
        waited += len(waiting)
        applied += len(out.state.applied) > len(inp.state.applied)
    assert waited >= 400 and applied >= 30  # (504 waiting in all, 39 of the 90 renders applied something)


class Scaled(TiktokenCounter):
    """Counts `scale` times the tokens tiktoken counts (another tokenizer, as a render sees it)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def count(self, text: str) -> int:
        return int(self.scale * super().count(text))


def test_a_render_counting_with_another_counter_does_not_start_from_the_carry() -> None:
    """What a render from the carry takes as the render before worked it out rests on its
    tokens: the edits waiting for the cache taken as judged (what they give their items, how
    many tokens), a proposal let go as no smaller than its item. Counted with another counter,
    the cache gone cold (everything waiting applies), the render is the render without the carry."""
    items = files_read_three_times()
    out = render(budgeted(items, 0, 150, ViewState(), None))
    for n in range(151, 171):
        out = render(budgeted(items, 0, n, out.state, out.carry))
    assert out.carry is not None and out.carry.settled
    inp = replace(budgeted(items, 0, 171, out.state, out.carry), counter=Scaled(2), now=60 * 171 + 3600)
    assert render(inp) == render(replace(inp, carry=None))

    items = short_statuses(20, runs=(1, 3))
    out = render(budgeted(items, 0, 10, ViewState(), None))
    assert [(c.seq, c.rationale) for c in out.certificates] == [(3, NOT_SMALLER)]
    out = render(budgeted(items, 0, 11, out.state, out.carry))  # (let go)
    inp = replace(budgeted(items, 0, 12, out.state, out.carry), counter=Scaled(0.1))
    uncarried = render(replace(inp, carry=None))
    assert [(c.seq, c.decision.value) for c in uncarried.certificates] == [(3, "prune")]  # smaller, counted so
    assert render(inp) == uncarried


def test_of_the_edits_deferred_those_an_edit_applied_bears_on_are_judged_again() -> None:
    """`still_eligible`: a deferred edit is taken as judged unless an edit applied with it
    reduced its target or its evidence, or rests on its target; after a reorder, none is; nor is
    one normalized afresh (it waits as another proposal)."""

    def judged(edit: Remove, *evidence: int, normalized: Remove | None = None) -> Eligible:
        proposal = Proposal(edit, 2, "superseded", evidence_seqs=evidence)
        return Eligible(Candidate(proposal, "r", ControlMode.RULE), normalized or edit, (), 3, 40)

    waiting, other = judged(Remove(5), 9), judged(Remove(7), 11)
    deferred = (waiting, other, judged(Remove(13, False), normalized=Remove(13)))

    def applied(edit: Any, *evidence: int) -> AppliedEdit:
        return AppliedEdit(edit, "r", "why", (), 1, evidence)

    assert still_eligible(deferred, ()) == (waiting, other)
    assert still_eligible(deferred, (applied(Replace(20, ()), 21),)) == (waiting, other)
    assert still_eligible(deferred, (applied(Remove(9)),)) == (other,)  # its evidence reduced
    assert still_eligible(deferred, (applied(Replace(20, ()), 5),)) == (other,)  # its target rested on
    assert still_eligible(deferred, (applied(Replace(5, ())),)) == (other,)  # its target reduced
    assert still_eligible(deferred, (applied(Reorder((2, 1))),)) == ()


def test_an_output_of_a_command_run_again_is_not_asked_about_at_every_later_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`git status` every third call, its long outputs superseded each by the next run, and
    waiting for the cache deep in the prompt: the snapshots rule is asked about an output as it
    comes, in the render after (its turn the latest then), and when the command runs again (its
    proposal names that run), not at each later run; a render from the carry renders what a
    render without it does."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, 91):
        status = "On branch main\n" + "\n".join(f"\tmodified:   src/m{k}_{call}.py" for k in range(30))
        command, output = ("git status", status) if call % 3 == 0 else (f"ls src/d{call}", f"f{call}.py")
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    asked = snapshots_asked(monkeypatch)
    out = render(budgeted(items, 0, 20, ViewState(), None))
    carried: list[int] = []
    for n in range(21, 182):
        inp = budgeted(items, 0, n, out.state, out.carry)
        asked.clear()
        out = render(inp)
        carried += asked
        assert out == render(replace(inp, carry=None))
    assert out.state.pending  # (some wait for the cache)
    counts = {seq: carried.count(seq) for seq in set(carried)}
    assert len(counts) >= 25 and max(counts.values()) <= 3, counts  # (before: up to 10 times)


def test_a_whole_file_read_by_the_latest_call_is_asked_about_again_once_a_turn_follows() -> None:
    """Read whole by the latest call, a module's skeleton keeps what new code is written from
    (its short bodies of new shapes) and is over what a compression may keep on entry; once a
    turn follows, the plain skeleton is under what a later rewrite may keep, and is proposed.
    Nothing it rests on changed (the same words again: the same focus): it is asked about again
    as of the latest turn that was, whether or not it proposed then."""
    statements = ["x = y", "if x:\n        y = 1", "for a in b:\n        c(a)", "return x", "assert x"]
    shapes = [s for s in itertools.permutations(range(5), 4) if sum(statements[i].count("\n") for i in s) < 4]
    module = "\n".join(
        f"def f_{k}(x):\n" + "\n".join("    " + statements[i] for i in shape) + "\n"
        for k, shape in enumerate(shapes[:40])
    )
    again = ItemContent(role=Role.USER, content=(TextBlock("Please continue."),))
    use = ToolUseBlock("c1", "bash", json.dumps({"command": "cat src/m.py"}))
    result = ToolResultBlock("c1", (TextBlock(module),), name="bash")
    items = stored_items(
        [again, ItemContent(role=Role.ASSISTANT, content=(use,)), ItemContent(role=Role.TOOL, content=(result,)), again]
    )
    out = render(budgeted(items, 0, 3, ViewState(), None))
    assert not out.state.pending  # the skeleton with its examples keeps too much
    inp = budgeted(items, 0, 4, out.state, out.carry)
    out = render(inp)
    assert out == render(replace(inp, carry=None))
    assert [p.proposal.reason for p in out.state.pending] == ["compressed_code"]


def module_reads(calls: int, module: Callable[[int], int] = lambda call: call) -> list[Item]:
    """A task, then `calls` reads of whole modules of functions (call k reads `module(k)`): each is
    compressed on entry to a skeleton still long enough (200 tokens) to stay in the compressing
    rule's pool."""
    return stored_items(module_contents(calls, module))


def module_contents(calls: int, module: Callable[[int], int]) -> list[ItemContent]:
    task = ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))
    return [task, *(c for call in range(1, calls + 1) for c in module_read(call, module(call)))]


def module_read(call: int, module: int) -> tuple[ItemContent, ItemContent]:
    output = "\n".join(
        f'def step_{module}_{k}(x):\n    """Step {k}."""\n    a = x + {k}\n    b = a * 2\n    c = b - a\n'
        f"    d = c * c\n    return a + b + c + d\n"
        for k in range(12)
    )
    return bash_round(call, f"cat src/m{module}.py", output)


def bash_round(call: int, command: str, output: str) -> tuple[ItemContent, ItemContent]:
    """Call `call` of the bash tool running `command`, and its `output`."""
    use = ToolUseBlock(f"c{call}", "bash", json.dumps({"command": command}))
    result = ToolResultBlock(f"c{call}", (TextBlock(output),), name="bash")
    return ItemContent(role=Role.ASSISTANT, content=(use,)), ItemContent(role=Role.TOOL, content=(result,))


def compress_asked(patch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the seqs the compressing rule's transform is asked about, in order."""
    asked: list[int] = []
    compress = REGISTRY.get("compress")
    proposal = type(compress).proposal

    def asking(self: Any, context: Any, entry: Any, seen: Any, params: Any) -> Any:
        asked.append(entry.seq)
        return proposal(self, context, entry, seen, params)

    patch.setattr(type(compress), "proposal", asking)
    return asked


def renders_asking(items: list[Item], first: int) -> Iterator[tuple[int, RenderOutput, set[int]]]:
    """From the render of `items[:first]` on, a render of each call appended (two items): its
    length, its output (held to the render from the state alone) and the seqs the compressing
    rule's transform was asked about in it."""
    out = render(budgeted(items, 0, first, ViewState(), None))
    with pytest.MonkeyPatch.context() as patch:
        asked = compress_asked(patch)
        for n in range(first + 2, len(items) + 1, 2):
            inp = budgeted(items, 0, n, out.state, out.carry)
            asked.clear()
            out = render(inp)
            asked_now = set(asked)
            assert out == render(replace(inp, carry=None))
            yield n, out, asked_now


def test_outputs_compressed_but_still_in_the_pool_are_not_asked_again_at_every_call() -> None:
    """A skeleton stays in the compressing rule's pool (its conditions hold for it still), but its
    proposal no longer rests on the focus, which moves with every call: the render that asks it
    again names it under the focus no more, so a call asks about the outputs shown whole, not
    every output of the session."""
    items = module_reads(60)
    policy = parse_policy(default_policy_text(), REGISTRY)
    slot = next(k for k, rule in enumerate(policy.rules) if rule.transform == "compress")
    out = render(budgeted(items, 0, 81, ViewState(), None))
    for n in range(82, 122):
        inp = budgeted(items, 0, n, out.state, out.carry)
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        assert out.carry is not None and out.carry.ledgers is not None
        ledger = out.carry.ledgers.rules[slot]
        assert ledger.by_key is not None
        assert len(ledger.pool) >= n // 2 - 2  # the skeletons stay in the pool
        assert len(ledger.by_key.get(("focus",), ())) <= 2  # the latest output, at most, rests on it


def test_a_call_asks_about_the_outputs_shown_whole_that_its_focus_terms_may_occur_in() -> None:
    """Outputs shown whole rest on the focus, which moves with every call. A call's focus terms
    (the path it reads) occur in no module: a render asks the compressing rule about the outputs
    appended since, not about every output shown whole; a call that names a function of one
    module asks about that module's output shown whole again (its compression would keep the
    function whole now)."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    calls = [f"cat src/m{call // 2}.py" for call in range(2, 62)] + ["grep -n step_3_1 src/m3.py"]
    for call, command in enumerate(calls, start=1):
        module = call // 2 if call < len(calls) else 3  # (the grep shows a line of module 3)
        output = "\n".join(
            f'def step_{module}_{k}(x):\n    """Step {k}."""\n    a = x + {k}\n    b = a * 2\n    c = b - a\n'
            f"    d = c * c\n    return a + b + c + d\n"
            for k in range(12)
        )
        if call == len(calls):
            output = "7:def step_3_1(x):"
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    policy = parse_policy(default_policy_text(), REGISTRY)
    slot = next(k for k, rule in enumerate(policy.rules) if rule.transform == "compress")
    for n, out, asked_now in renders_asking(items, 41):
        assert out.carry is not None and out.carry.ledgers is not None
        by_key = out.carry.ledgers.rules[slot].by_key
        assert by_key is not None
        whole = by_key.get(("focus",), set())
        if n < len(items):
            assert asked_now <= set(range(n - 3, n + 1)), (n, sorted(asked_now))  # the latest turns
    assert len(whole) >= 15, sorted(whole)  # outputs shown whole, resting on the focus
    # The grep names step_3_1: the copy of module 3 shown whole is asked about again.
    copy = next(s for s in sorted(whole) if "step_3_1" in items[s - 1].content[0].content[0].text)  # type: ignore[union-attr]
    assert copy in asked_now and len(asked_now) <= 6, sorted(asked_now)


@pytest.mark.parametrize("per_render", [ledger_module.INDEXED_PER_RENDER, 1])
def test_a_focus_change_is_looked_for_in_the_outputs_holding_its_words_not_in_every_output_resting_on_it(
    monkeypatch: pytest.MonkeyPatch, per_render: int
) -> None:
    """Outputs shown whole rest on the focus, and each call changes it. The ledger keeps them by
    the words they hold and the files they show (`ledger.Reach`): a change is tested against
    the outputs holding all the words of one of its terms (or showing a file read again), a
    few, not against every output resting on the focus (hundreds in a long session). Those
    the index has not taken in yet (`per_render` a render) are tested one by one meanwhile."""
    monkeypatch.setattr(ledger_module, "INDEXED_PER_RENDER", per_render)
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call in range(1, 41):
        module = "\n".join(f"def step_{call}_{k}(x):\n    return helper_{call}(x, {k})\n" for k in range(30))
        contents += bash_round(call, f"cat src/m{call}.py", module)
    contents += bash_round(41, "grep -n helper_29 src/m29.py", "2:    return helper_29(x, 0)")
    items = stored_items(contents)
    tested: list[int] = []
    concerned = Compress.concerned

    def counting(self: Compress, context: Any, change: FocusChange) -> Any:
        found = concerned(self, context, change)
        return replace(found, test=lambda entry: tested.append(entry.seq) or found.test(entry))

    monkeypatch.setattr(Compress, "concerned", counting)
    out = render(budgeted(items, 0, 61, ViewState(), None))
    for n in range(63, len(items) + 1, 2):
        inp = budgeted(items, 0, n, out.state, out.carry)
        tested.clear()
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        assert out.carry is not None and out.carry.ledgers is not None
        resting = max(len(ledger.by_key.get(("focus",), ())) for ledger in out.carry.ledgers.rules if ledger.by_key)
        assert resting >= 20, resting
        # All indexed by then (at 64 a render, at once; at one a render, not in these renders):
        if n < len(items) and n > 61 + 2 * 40 // per_render:
            assert len(set(tested)) <= 2, sorted(tested)  # the path read: none holds ``m31`` and ``py``
    assert 59 in tested  # the grep for helper_29: module 29's output (seq 59) holds it


def judged_for(rule: str, monkeypatch: pytest.MonkeyPatch) -> list[set[int]]:
    """Per render from now on, the seqs the candidates of `rule` that the judge is given target."""
    judged: list[set[int]] = []
    judge = pipeline.judge

    def counted(candidates: Any, *args: Any, **kwargs: Any) -> Any:
        judged.append({s for c in candidates if c.rule == rule and (s := target_of(c.proposal.edit)) is not None})
        return judge(candidates, *args, **kwargs)

    monkeypatch.setattr(pipeline, "judge", counted)
    return judged


def test_the_evidence_of_an_edit_in_force_is_not_made_a_candidate_again_once_its_refusal_is_certified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each module read twice: the first copy is removed, the second is the evidence of the
    removal and stays whole as long as the removal is in force, so the compressing rule's
    proposal for it is refused (ABSTAIN) at every render, certified the first time. A render
    from the carry passes over it unjudged, and the rule's ledger lets it go: it is not a
    candidate again while nothing it rests on changes (the evidence was 243 of the 364
    candidates a render at 10,000 items of bench/scale.py's mixed workload). A render without
    the carry still judges it, and renders the same."""
    items = module_reads(60, module=lambda call: (call + 1) // 2)
    judged = judged_for("compress-outputs", monkeypatch)
    out = render(budgeted(items, 0, 61, ViewState(), None))
    assert out.carry is not None
    evidence = set(out.carry.finished.relied)
    assert len(evidence) >= 15 and evidence <= judged[-1]
    refused = {c.seq for c in out.certificates if c.rule == "compress-outputs" and c.decision.value == "abstain"}
    assert refused >= evidence
    for n in range(62, 102):
        inp = budgeted(items, 0, n, out.state, out.carry)
        judged.clear()
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        carried, uncarried = judged
        assert evidence <= uncarried
        if n > 62:  # (the first render from the carry passes over them, unjudged, and lets them go)
            assert not evidence & carried, sorted(evidence & carried)


def test_a_focus_change_concerns_the_outputs_its_terms_or_its_ranges_reach() -> None:
    """What `Compress.concerned` says of a change to the focus: an output holding every word of
    a changed term the compressors read (a given term, or a derived one that looks like an
    identifier), an output of a file whose ranges read again changed, and every output for a
    term of no word; not an output for a derived term the compressors ignore (a short or plain
    word), nor one of another file."""
    module = "\n".join(f"def handler_{k}(x):\n    return parse_header(x, {k})  # py\n" for k in range(30))
    calls = [("cat src/app.py", module), ("cat src/other.py", module.replace("handler", "worker"))]
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix it."),))]
    for call, (command, output) in enumerate(calls, start=1):
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    policy = parse_policy(default_policy_text(), REGISTRY)
    draft = Draft(items, frozenset(), policy.tools)
    context = transform_context(draft, ViewRequest(ViewFormat.OPENAI_CHAT), CacheState(0, None, 300.0), (), policy)
    app, other = draft.entries[3], draft.entries[5]
    compress = REGISTRY.get("compress")
    assert isinstance(compress, Compress)

    def concerned(
        given: frozenset[str] = frozenset(), derived: frozenset[str] = frozenset(), paths: frozenset[str] = frozenset()
    ) -> set[int]:
        change = FocusChange(given, derived, paths)
        return {e.seq for e in (app, other) if compress.concerned(context, change).test(e)}

    assert concerned(given=frozenset({"handler_3"})) == {3}
    assert concerned(derived=frozenset({"worker_3"})) == {5}
    assert concerned(derived=frozenset({"parse_header"})) == {3, 5}
    assert concerned(derived=frozenset({"py", "return"})) == set()  # words the compressors do not read as focus
    assert concerned(given=frozenset({"return"})) == {3, 5}  # a given term is read whatever it is
    assert concerned(given=frozenset({"parse"})) == set()  # (not a word of either: parse_header is)
    assert concerned(paths=frozenset({"src/other.py"})) == {5}
    assert concerned(given=frozenset({"()"})) == {3, 5}  # a term of no word is within every output


def test_a_sed_script_in_the_focus_concerns_the_code_that_defines_its_last_part_only() -> None:
    """``sed -i 's/a/b/' f`` gives the focus the term ``s/a/b``: of two modules holding the word
    ``b``, it concerns the one defining a function ``b`` (its skeleton keeps that body whole),
    not the one where ``b`` is a variable and no ``s`` occurs (nothing of its compression can
    change); a term occurring whole concerns both."""
    assigns = "\n".join(
        f"def f_{k}(x):\n    a = x + {k}\n    b = a * 2\n    c = b - a\n    return a + b + c\n" for k in range(6)
    )
    defines = assigns.replace("f_", "g_") + "\ndef b(x):\n    y = x * 2\n    z = y - x\n    w = z + y\n    return w\n"
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix it."),))]
    for call, (command, output) in enumerate([("cat src/a.py", assigns), ("cat src/b.py", defines)], start=1):
        contents += bash_round(call, command, output)
    policy = parse_policy(default_policy_text(), REGISTRY)
    draft = Draft(stored_items(contents), frozenset(), policy.tools)
    context = transform_context(draft, ViewRequest(ViewFormat.OPENAI_CHAT), CacheState(0, None, 300.0), (), policy)
    compress = REGISTRY.get("compress")
    assert isinstance(compress, Compress)

    def concerned(*derived: str) -> set[int]:
        change = FocusChange(frozenset(), frozenset(derived), frozenset())
        return {e.seq for e in (draft.entries[3], draft.entries[5]) if compress.concerned(context, change).test(e)}

    assert concerned("s/a/b") == {5}
    assert concerned("x.b") == {3, 5}  # (``x`` and ``b`` are words of both: it may occur whole)
    assert concerned("s/a/c") == set()


def test_the_index_of_outputs_resting_on_the_focus_finds_them_by_all_of_a_terms_words_and_lets_go_of_what_leaves() -> (
    None
):
    """`ledger.Reach`: an output is found by a set of words when it holds all of them, whether a
    word is its own alone (held without a set) or shared; one that leaves the focus, or is asked
    about anyway (indexed again as it is), is let go of whole; what it weighs goes with it, and a
    carry writes it as it is."""
    history = module_reads(3)
    draft = Draft(history, frozenset(), {})
    a, b, c = draft.entries[3], draft.entries[5], draft.entries[7]
    words = {a.seq: {"shared", "only_a"}, b.seq: {"shared", "only_b"}, c.seq: {"shared", "x", "y"}}
    pool = {e.seq: e for e in (a, b, c)}
    reach = ledger_module.Reach()

    def among(resting: set[int], *terms: set[str], asked: frozenset[int] = frozenset()) -> set[int]:
        wanted = tuple(frozenset(t) for t in terms)
        return reach.among(resting, pool, set(asked), lambda e: frozenset(words[e.seq]), wanted)

    everything = set(pool)
    assert among(everything, {"shared"}) == everything
    assert among(everything, {"only_a"}) == {a.seq}
    assert among(everything, {"x", "y"}, {"only_b"}) == {b.seq, c.seq}
    assert among(everything, {"x", "only_a"}) == set()
    written = io.BytesIO()  # as a carry writes it, with the entries it holds
    carry_pickle._Writer(written, COUNTER).dump((reach, pool))
    copy = carry_pickle._Reader(io.BytesIO(written.getvalue()), history, COUNTER).load()[0]
    assert reach.footprint() > 0 and copy.footprint() == reach.footprint()
    assert copy.among(everything, pool, set(), lambda e: frozenset(words[e.seq]), (frozenset({"only_a"}),)) == {a.seq}
    assert among({a.seq, c.seq}, {"shared"}) == {a.seq, c.seq}  # b left the focus
    assert among({a.seq, c.seq}, {"only_b"}) == set()
    assert among({a.seq, c.seq}, {"shared"}, asked=frozenset({a.seq})) == {a.seq, c.seq}
    assert among({c.seq}, {"only_a"}, {"shared"}) == {c.seq}
    assert among(set(), {"shared"}) == set() and reach.footprint() == 0


def test_an_output_resting_on_the_focus_met_out_of_the_pool_is_found_once_it_is_back() -> None:
    """The focus key names outputs that have left the rule's pool (until they outnumber it). The
    index meets one so at a focus change; it comes back (shown otherwise: asked about anyway) in a
    render whose focus did not change, when the index is not brought up to date; a later change
    that concerns it finds it, as the test of every output would."""
    draft = Draft(module_reads(2), frozenset(), {})
    first, second = draft.entries[3], draft.entries[5]
    words = {first.seq: frozenset({"alpha"}), second.seq: frozenset({"beta"})}

    def concerned(term: str) -> Concerned:
        return Concerned(lambda entry: term in words[entry.seq], (frozenset({term}),), lambda entry: words[entry.seq])

    ledger = Ledger({first.seq: first}, frozenset(), {}, {("focus",): {first.seq, second.seq}})
    asked, _ = to_ask(ledger, {first.seq: first}, [], {("focus",)}, concerned("alpha"))
    assert [e.seq for e in asked] == [first.seq]
    pool = {first.seq: first, second.seq: second}
    asked, _ = to_ask(ledger, pool, [second.seq], set(), None)  # back in the pool, the focus as it was
    assert [e.seq for e in asked] == [second.seq]
    asked, _ = to_ask(ledger, pool, [], {("focus",)}, concerned("beta"))
    assert [e.seq for e in asked] == [second.seq]


def test_a_reader_that_fails_on_an_output_while_its_names_are_read_leaves_the_render_to_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading which names of an output a focus term's last part may reach runs a compressor's
    parse outside the compression (whose failures leave the output whole): a failure there is
    logged and any word taken for a name, and the render is what it is without it."""
    module = "\n".join(
        f"def f_{k}(x):\n    a = x + {k}\n    b = a * 2\n    c = b - a\n    return a + b + c\n" for k in range(6)
    )
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix f_3 in src/app.py."),))]
    contents += bash_round(1, "cat src/app.py", module)
    contents += bash_round(2, "sed -i 's/a/b/' src/app.py", "")
    items = stored_items(contents)
    expected = render(budgeted(items, 0, len(items), ViewState(), None))
    clear_memos()

    def broken(*args: object, **kwargs: object) -> frozenset[str]:
        raise IndexError("a reader's bug")

    monkeypatch.setattr(code_module, "names", broken)
    assert render(budgeted(items, 0, len(items), ViewState(), None)) == expected


def test_a_refusal_for_a_protection_that_lapses_is_judged_again_until_it_lapses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A range of a file, then the whole file two turns later: the range is removed, the whole
    file is its evidence, and a rule masking every output proposes for it. Among the last two
    turns it is refused as protected (KEEP, certified once); that refusal does not stand (the
    protection lapses), so the proposal stays a candidate until the refusal becomes the one that
    does (ABSTAIN: the evidence of a removal in force), and only then leaves the candidates."""
    big = "\n".join(f"    value_{i} = parse(value_{i - 1})  # line {i}" for i in range(1, 121))
    calls = [("sed -n '1,40p' src/a.py", "\n".join(big.splitlines()[:40])), ("ls src/x", "x.py"), ("ls src/y", "y.py")]
    calls += [("cat src/a.py", big)] + [(f"ls src/d{k}", f"f{k}.py") for k in range(8)]
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    for call, (command, output) in enumerate(calls, start=1):
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    text = default_policy_text().replace("protection: {last_turns: 1}", "protection: {last_turns: 2}")
    text = text.replace("evidence: {max_level: 3}", "evidence: {max_level: 4}")
    policy = parse_policy(text + "  - {name: squeeze, transform: mask, when: {roles: [tool]}}\n", REGISTRY)
    view = ViewRequest(ViewFormat.OPENAI_CHAT, 0)

    def following(n: int, previous: RenderOutput | None) -> RenderInput:
        state, carry = (previous.state, previous.carry) if previous else (ViewState(), None)
        return RenderInput(make_session(n), items[:n], policy, view, counter(), REGISTRY, state, 60.0 * n, carry=carry)

    judged = judged_for("squeeze", monkeypatch)
    out = render(following(9, None))  # the whole file's output is item 9, the range's item 3
    assert ("prune", 3) in {(c.decision.value, c.seq) for c in out.certificates}
    assert ("keep", 9) in {(c.decision.value, c.seq) for c in out.certificates if c.rule == "squeeze"}
    for n in range(10, len(items) + 1):
        inp = following(n, out)
        judged.clear()
        out = render(inp)
        assert out == render(replace(inp, carry=None))
        refusals = {c.decision.value for c in out.certificates if c.rule == "squeeze" and c.seq == 9}
        assert refusals == ({"abstain"} if n == 12 else set()), n  # the protection lapses at 12
        assert (9 in judged[0]) == (n <= 13), n  # passed over at 13, unjudged, and let go


def test_a_call_reading_other_lines_of_a_file_asks_about_the_outputs_of_that_file_alone() -> None:
    """The focus holds the lines the recent calls read of a file (`sed -n` ranges), which a
    compression of another output of the file keeps whole. A call reading other lines of it
    changes the focus for the outputs of that file alone: a render asks the compressing rule
    about those and the latest turns, not about every output shown whole resting on the focus
    (it did at each such call: 266 outputs a render at 10,000 items of bench/scale.py's mixed
    workload)."""
    big = "\n".join(f"    value_{i} = parse(value_{i - 1})  # line {i}" for i in range(1, 301))
    contents = module_contents(40, lambda call: (call + 1) // 2)
    pages = [("cat src/big.py", big)] + [
        (f"sed -n '{k * 7},{k * 7 + 20}p' src/big.py", "\n".join(big.splitlines()[k * 7 - 1 : k * 7 + 20]))
        for k in range(1, 30)
    ]
    for call, (command, output) in enumerate(pages, start=41):
        contents += bash_round(call, command, output)
    items = stored_items(contents)
    policy = parse_policy(default_policy_text(), REGISTRY)
    slot = next(k for k, rule in enumerate(policy.rules) if rule.transform == "compress")
    file_outputs = {83, 85}  # the whole file, then a range of it
    for n, out, asked_now in renders_asking(items, 85):
        assert out.carry is not None and out.carry.ledgers is not None
        whole = out.carry.ledgers.rules[slot].by_key.get(("focus",), set())  # type: ignore[union-attr]
        assert asked_now <= file_outputs | set(range(n - 3, n + 1)), (n, sorted(asked_now - file_outputs))
        file_outputs.add(n)
    assert len(whole - file_outputs) >= 15, sorted(whole)  # outputs shown whole, of other files


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from(POLICIES), st.data())
def test_a_carry_written_and_read_back_renders_what_the_process_that_made_it_would(
    items: list[Item], policy: str, data: st.DataObject
) -> None:
    """Each render's carry is written as bytes and read back over the history as another
    process would read it (equal items, not the same objects): the render from it renders what
    a render from the state alone does, and takes it over as a render takes over its own."""
    parsed, state, carry, now, cut = parse_policy(policy, REGISTRY), ViewState(), None, 0.0, 2
    fmt = data.draw(st.sampled_from(list(ViewFormat)))
    while cut < len(items):
        cut = min(len(items), cut + data.draw(st.integers(1, 4)))
        now += data.draw(st.sampled_from([1.0, 30.0, 400.0]))
        budget = data.draw(st.sampled_from([0, 0, 3_000]))
        read = [replace(i) for i in items[:cut]]  # the history as a restarted process decodes it: equal items
        if carry is not None:
            written = dump_carry(carry, COUNTER)
            assert written is not None and dump_carry(carry, COUNTER) is None  # claimed as it was written
            carry = load_carry(written, read, COUNTER)
            state = carry.state
        inp = RenderInput(make_session(cut), read, parsed, ViewRequest(fmt, budget), COUNTER, REGISTRY, state, now)
        out = render(replace(inp, carry=carry))
        assert out == render(replace(inp, state=state_from_json(state_to_json(state))))  # as the database holds it
        if carry is not None:
            assert carry.finished.claim.taken  # resumed, not derived again
        state, carry = out.state, out.carry


def test_a_carry_is_read_back_only_over_the_history_it_was_written_from() -> None:
    items = file_reads(6)
    out = render(budgeted(items, 0, len(items), ViewState(), None))
    assert out.carry is not None
    written = dump_carry(out.carry, COUNTER)
    assert written is not None
    assert load_carry(written, items, COUNTER).state == out.state
    other = [*items[:-1], replace(items[-1], content_hash="another")]
    for history in (items[:-1], other):
        with pytest.raises(UnusableCarry, match=f"item {len(items)} is not in the history"):
            load_carry(written, history, COUNTER)


def test_a_carry_a_render_has_taken_over_is_not_written() -> None:
    items = file_reads(6)
    first = render(budgeted(items, 0, 9, ViewState(), None))
    render(budgeted(items, 0, len(items), first.state, first.carry))
    assert first.carry is not None and dump_carry(first.carry, COUNTER) is None


def test_a_carry_written_and_released_is_taken_over_by_the_next_render_as_before() -> None:
    items = file_reads(6)
    first = render(budgeted(items, 0, 9, ViewState(), None))
    assert first.carry is not None and dump_carry(first.carry, COUNTER, release=True) is not None
    after = render(budgeted(items, 0, len(items), first.state, first.carry))
    assert first.carry.finished.claim.taken and first.carry.assembly.taken  # resumed, not derived again
    assert after == render(budgeted(items, 0, len(items), first.state, None))


def test_a_carry_whose_assembly_a_render_holds_is_not_written_and_the_rest_stays_free() -> None:
    items = file_reads(6)
    first = render(budgeted(items, 0, 9, ViewState(), None))
    assert first.carry is not None
    first.carry.assembly.taken = True  # as a render resuming it would have
    assert dump_carry(first.carry, COUNTER) is None
    assert not first.carry.finished.claim.taken and not first.carry.repaired.taken


def test_a_carry_with_inserted_content_is_written_and_read_back() -> None:
    """Content a transform inserted is no item of the history: it is written whole (its
    metadata a read-only map), not as a reference."""
    from tests.service.engine.test_pipeline import history, tool_round
    from tests.service.engine.transforms_for_tests import registry

    annotating = registry()
    items = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"))
    policy = parse_policy(
        "rules: [{name: note, transform: annotate, params: {note: 'remember X'}, when: {roles: [user]}}]", annotating
    )
    request = ViewRequest(ViewFormat.OPENAI_CHAT)
    first = render(RenderInput(make_session(len(items)), items, policy, request, COUNTER, annotating, now=1000.0))
    assert first.carry is not None and first.state.applied  # the note is in force
    written = dump_carry(first.carry, COUNTER)
    assert written is not None
    more = history(tool_round("c1", "bash", "one"), tool_round("c2", "bash", "two"), tool_round("c3", "bash", "three"))
    back = load_carry(written, [replace(i) for i in more], COUNTER)
    inp = RenderInput(make_session(len(more)), more, policy, request, COUNTER, annotating, back.state, 1060.0)
    assert render(replace(inp, carry=back)) == render(inp)
    assert back.finished.claim.taken


def test_a_render_after_an_append_compares_the_view_from_where_the_last_one_changed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A render resumes the last render's repair, assembly and record of segments where they
    first differ; what each is given and what it resumes are blocks of one list (blocks.py),
    shared where no edit touched them since, so only the blocks after the change are compared,
    not the whole view at each render."""
    items = file_reads(490)  # (a view of 4 blocks)
    out = render(budgeted(items, 0, 940, ViewState(), None))
    compared: list[int] = []

    def comparing(previous: Sequence[Any], current: Sequence[Any], known: int = 0) -> int:
        assert isinstance(previous, Blocks) and isinstance(current, Blocks)
        shared = sum(
            1
            for _ in itertools.takewhile(
                lambda pair: pair[0] is pair[1], zip(previous.blocks, current.blocks, strict=False)
            )
        )
        compared.append(len(current.blocks) - shared)
        return shared_prefix(previous, current, known)

    for module in (repair_module, view_module, show_module):
        monkeypatch.setattr(module, "shared_prefix", comparing)
    for n in range(941, 951):
        compared.clear()
        inp = budgeted(items, 0, n, out.state, out.carry)
        out = render(inp)
        assert len(compared) == 3 and max(compared) <= 1, compared  # (of 4)
        assert out.carry is not None and out.carry.repaired.kept >= n - 12 and out.carry.assembly.kept >= n - 12
        assert out == render(replace(inp, carry=None))


def test_an_output_no_compressor_reads_is_not_asked_again_when_a_term_it_holds_comes_into_focus() -> None:
    """A `git status` lists the files being worked on, so the file every later call reads is
    named in each of them; no compressor reads a status whatever the focus (`router.unread`), so
    such outputs rest on nothing but themselves, and a call reading one of those files asks the
    compressing rule about what it appended, not again about every status that names the file."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix the parsers."),))]
    files = [f"src/pkg/parser_{k}.py" for k in range(40)]  # (a status of 200 tokens or more: in the pool)
    call = 0
    for round_ in range(12):
        call += 1
        status = "\n".join(["On branch main", *(f"\tmodified:   {path}" for path in files[: round_ % 5 + 36])])
        note = f"notes/round_{round_}.md"  # (the same command again would be a snapshot taken again)
        contents += bash_round(call, f"git status src {note}", f"{status}\n\tnew file:   {note}")
        call += 1
        module = "\n".join(f"def step_{round_}_{k}(x):\n    return x + {k}\n" for k in range(30))
        contents += bash_round(call, f"cat {files[round_ % 8]}", module)
    items = stored_items(contents)
    statuses = {s for s in range(1, len(items) + 1) if "On branch" in str(items[s - 1].content)}
    for n, _, asked_now in renders_asking(items, 21):
        assert not asked_now & statuses - {n - 2, n}, (n, sorted(asked_now))  # but the latest turns


def entries_asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the seqs every rule's transform is asked about, in order, rule after rule."""
    asked: list[int] = []
    proposals = propose_module._proposals

    def counted(transform: Any, context: Any, picked: Sequence[Any], params: Any) -> Any:
        asked.extend(e.seq for e in picked)
        return proposals(transform, context, picked, params)

    monkeypatch.setattr(propose_module, "_proposals", counted)
    return asked


@pytest.mark.parametrize("read_back", [False, True], ids=["held", "read-back"])
def test_after_a_render_that_changed_many_entries_the_next_asks_about_what_follows(
    monkeypatch: pytest.MonkeyPatch, read_back: bool
) -> None:
    """A first render compresses every output older than the last turn (the default policy):
    it asks the rules about them again as it leaves them, so that the render after one append,
    from its carry held or read back (a replica that follows another), asks about what changed
    since, not about every output again; and renders what a render without the carry does."""
    items = file_reads(150)
    n = len(items) - 2
    first = render(budgeted(items, 0, n, ViewState(), None))
    compressed = [a for a in first.state.applied if a.rule == "compress-outputs"]
    assert len(compressed) >= pipeline.SETTLED_FROM  # (what the next render would else ask about)
    carry = first.carry
    assert carry is not None
    if read_back:
        written = dump_carry(carry, COUNTER)
        assert written is not None
        carry = load_carry(written, items[:n], COUNTER)
    asked = entries_asked(monkeypatch)
    inp = budgeted(items, 0, n + 1, carry.state, carry)  # (read back, its state is the carry's)
    out = render(inp)
    assert 0 < len(asked) <= 20, len(asked)  # (before: the 150 outputs, for each rule that reads them)
    assert out == render(replace(inp, carry=None))


def resting_on_the_focus(out: RenderOutput, slot: int) -> set[int]:
    """The seqs of rule `slot`'s pool that its ledger in the carry of `out` names as resting on
    the focus."""
    assert out.carry is not None and out.carry.ledgers is not None
    ledger = out.carry.ledgers.rules[slot]
    assert ledger.by_key is not None
    return ledger.by_key.get(("focus",), set()) & ledger.pool.keys()


def test_a_render_that_changed_many_entries_hands_on_only_those_resting_on_the_focus_as_it_left_them() -> None:
    """A first render reduces the 149 whole modules read before the last turn (the default
    policy), then asks the rules about them again as it leaves them (`pipeline.SETTLED_FROM`).
    Shown whole, each rested on the focus; reduced, none does: the ledger it hands on names
    under the focus what a render from its state alone names, not every output it reduced,
    which each later call's focus change would look at one by one (at 10,000 items of
    bench/scale.py's modules workload, the renders after an append cost 9 ms, not 3)."""
    items = module_reads(150)
    policy = parse_policy(default_policy_text(), REGISTRY)
    slot = next(k for k, rule in enumerate(policy.rules) if rule.transform == "compress")
    n = len(items) - 2
    first = render(budgeted(items, 0, n, ViewState(), None))
    assert len(first.state.applied) >= pipeline.SETTLED_FROM  # (the render asks the rules again)
    alone = render(budgeted(items, 0, n, first.state, None))
    assert resting_on_the_focus(first, slot) == resting_on_the_focus(alone, slot)
    assert len(resting_on_the_focus(first, slot)) <= 2, sorted(resting_on_the_focus(first, slot))
    inp = budgeted(items, 0, n + 2, first.state, first.carry)
    out = render(inp)
    assert out == render(replace(inp, carry=None))
    assert resting_on_the_focus(out, slot) == resting_on_the_focus(render(replace(inp, carry=None)), slot)
