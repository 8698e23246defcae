"""The built-in strategies (service/contextd/engine/strategies.py) on small agent sessions
with ground truth, the traps included: each test says which items must go, and
which must stay whatever the rules would like."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from contextd.engine.asked import command_terms
from contextd.engine.certificates import Decision
from contextd.engine.errors import InvalidArgument
from contextd.engine.failures import exit_status, failure_residue, stopped_short, summary_line
from contextd.engine.model import Item, ItemContent, Representation, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.observations import parse_completion
from contextd.engine.pipeline import RenderInput, RenderOutput, render
from contextd.engine.placeholders import handle_of
from contextd.engine.policy import default_policy_text, parse_policy
from contextd.engine.shell_words import MAX_DIGITS, number
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from tests.helpers import counter, make_session, stored_items, to_item

REGISTRY = TransformRegistry.default()
BODY = "\n".join(f"    line {n} of the body, long enough to be worth a placeholder" for n in range(12))

POLICY = """
protection: {last_turns: 0, latest_error_per_tool: %s}
tools: {bash: {effect: shell}}
rules:
  - {name: %s, transform: %s, params: %s, when: {roles: [tool]}}
"""


def session(*calls: tuple[str, str] | tuple[str, str, bool]) -> list[Item]:
    """A bash agent's session: (command, output[, failed]) per call; call ids c1, c2 ..."""
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock("Fix the bug."),)),
    ]
    for n, call in enumerate(calls, start=1):
        command, output = call[0], call[1]
        failed = call[2] if len(call) == 3 else False
        use = ToolUseBlock(f"c{n}", "bash", json.dumps({"command": command}))
        contents.append(ItemContent(role=Role.ASSISTANT, content=(use,)))
        result = ToolResultBlock(f"c{n}", (TextBlock(output),), is_error=failed, name="bash")
        contents.append(ItemContent(role=Role.TOOL, content=(result,)))
    return stored_items(contents)


def seq_of(call: int) -> int:
    """The seq of the output of call `call` (1-based) in `session`."""
    return 2 + 2 * call


def run(items: list[Item], transform: str, params: str = "{}", latest_error: str = "false") -> RenderOutput:
    return run_policy(items, POLICY % (latest_error, transform, transform, params))


def run_policy(items: list[Item], document: str) -> RenderOutput:
    return render(policy_input(items, document))


def policy_input(
    items: list[Item],
    document: str,
    state: ViewState | None = None,
    now: float = 0.0,
    registry: TransformRegistry = REGISTRY,
) -> RenderInput:
    return RenderInput(
        make_session(len(items)),
        items,
        parse_policy(document, registry),
        ViewRequest(ViewFormat.OPENAI_CHAT),
        counter(),
        registry,
        state or ViewState(),
        now,
    )


def pruned(out: RenderOutput) -> dict[int, tuple[int, str]]:
    """seq -> (level, evidence) of what the render reduced."""
    return {c.seq: (c.level, c.evidence) for c in out.certificates if c.decision is Decision.PRUNE}


def shown(out: RenderOutput, seq: int) -> Representation:
    return next(i.representation for i in out.view.items if i.seq == seq)


# ------------------------------------------------------------------ dedupe


def test_an_identical_output_is_replaced_by_a_pointer_to_the_earlier_copy() -> None:
    items = session(("ls src", "a.py\nb.py\n" + BODY), ("ls ./src", "a.py\nb.py\n" + BODY))
    out = run(items, "dedupe")
    assert pruned(out) == {seq_of(2): (0, "identical to the output of call c1 (seq 4)")}
    assert shown(out, seq_of(1)) is Representation.FULL  # the older copy, in the cached prefix, stays
    assert "identical to the output of call c1 (seq 4)" in out.view.messages_json
    assert handle_of(items[seq_of(2) - 1]) in out.view.messages_json


COPIES = """
protection: {last_turns: 1}
tools: {bash: {effect: shell}}
rules: [{name: duplicates, transform: dedupe, params: {on_entry: %s}, when: {roles: [tool]}}]
"""


def test_a_copy_of_an_output_shown_whole_goes_when_it_enters_the_view_with_on_entry() -> None:
    items = session(("cat src/app.py", SOURCE), ("pytest -q", "1 passed\n" + BODY), ("cat src/app.py", SOURCE))
    copy = seq_of(3)  # the newest output, protected for the call that reads it
    entered = run_policy(items, COPIES % "true")
    assert pruned(entered) == {copy: (0, f"identical to the output of call c1 (seq {seq_of(1)})")}
    assert shown(entered, seq_of(1)) is Representation.FULL  # what the call reads: all of the copy
    assert entered.view.messages_json.count(json.dumps(SOURCE)[1:-1]) == 1
    # Without it, the copy stays whole for that call, and goes from the next on.
    assert pruned(run_policy(items, COPIES % "false")) == {}
    # A copy still passes no other protection: here its tool's latest error.
    failing = session(("make", "error: x\n" + BODY, True), ("make", "error: x\n" + BODY, True))
    assert pruned(run_policy(failing, COPIES % "true")) == {}


def test_on_entry_of_the_copy_rules_is_true_or_false() -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_policy(COPIES % "[log]", REGISTRY)
    assert "must be true or false" in str(raised.value.violations)


def test_the_same_command_with_another_output_is_never_deduped() -> None:
    items = session(("pytest tests", "1 failed\n" + BODY), ("pytest tests", "all passed\n" + BODY))
    assert pruned(run(items, "dedupe")) == {}


def test_a_small_duplicate_is_left_alone() -> None:
    items = session(("true", "ok"), ("true", "ok"))
    out = run(items, "dedupe")
    assert out.certificates == ()  # not even a refusal: nothing worth proposing


# --------------------------------------------------------------- supersede


def test_a_read_is_superseded_by_a_later_read_of_the_whole_file_whatever_happened_between() -> None:
    items = session(
        ("cat src/app.py", "old\n" + BODY),
        ("sed -i 's/old/new/' src/app.py", ""),
        ("python3 reproduce.py", "boom"),  # unknown: may have written anything
        ("cat src/app.py", "new\n" + BODY),
    )
    out = run(items, "supersede")
    assert pruned(out) == {seq_of(1): (2, "read again later by call c4 (seq 10)")}
    assert shown(out, seq_of(4)) is Representation.FULL


def test_lines_read_again_supersede_only_when_nothing_may_have_moved_them() -> None:
    first = ("sed -n '10,20p' src/app.py", "lines 10-20\n" + BODY)
    again = ("nl -ba src/app.py | sed -n '1,50p'", "lines 1-50\n" + BODY)
    assert seq_of(1) in pruned(run(session(first, again), "supersede"))
    substituted = session(first, ("sed -i 's/parse/parse_header/g' src/app.py", ""), again)
    assert seq_of(1) in pruned(run(substituted, "supersede"))  # changed line for line: nothing moved
    lines_moved = session(first, ("sed -i '3d' src/app.py", ""), again)
    assert pruned(run(lines_moved, "supersede")) == {}
    by_another_path = session(first, ("cd /elsewhere && sed -i '/^$/d' app.py", ""), again)
    assert pruned(run(by_another_path, "supersede")) == {}  # a file of that name was written
    unknown = session(first, ("python3 fix.py", "done"), again)
    assert pruned(run(unknown, "supersede")) == {}


def test_a_write_between_two_reads_of_different_lines_supersedes_nothing() -> None:
    items = session(
        ("sed -n '1,50p' src/app.py", "lines 1-50\n" + BODY),
        ("sed -i '120d' src/app.py", ""),
        ("sed -n '100,150p' src/app.py", "lines 100-150\n" + BODY),
    )
    assert pruned(run(items, "supersede")) == {}


def test_an_unknown_command_never_licenses_a_supersession() -> None:
    items = session(("python3 dump.py src/app.py", "x\n" + BODY), ("cat src/app.py", "x\n" + BODY))
    assert pruned(run(items, "supersede")) == {}


def test_paths_resolve_through_cd() -> None:
    items = session(("cd /repo && sed -n '1,5p' src/app.py", "1-5\n" + BODY), ("cat /repo/src/app.py", "all\n" + BODY))
    assert pruned(run(items, "supersede")) == {seq_of(1): (2, "read again later by call c2 (seq 6)")}


def test_a_search_or_a_filtered_read_is_not_a_read_of_lines() -> None:
    items = session(("grep -n foo src/app.py", "3: foo\n" + BODY), ("cat src/app.py", "all\n" + BODY))
    assert pruned(run(items, "supersede")) == {}  # the grep's output is not the file's


# --------------------------------------------------------------- snapshots


def test_a_declared_snapshot_keeps_a_residue_of_the_older_run() -> None:
    first = (
        "<returncode>1</returncode>\n<output>\n"
        + BODY
        + "\nFAILED tests/test_app.py::test_parse\n1 failed, 3 passed\n</output>"
    )
    items = session(("pytest tests", first, True), ("pytest tests", "<returncode>0</returncode>\n4 passed\n" + BODY))
    out = run(items, "snapshots", '{commands: ["pytest*"]}')
    assert pruned(out) == {seq_of(1): (2, "the same command ran again at seq 6 (call c2)")}
    view = out.view.messages_json
    assert "`pytest tests`, exit 1; last line: '1 failed, 3 passed'" in view
    assert handle_of(items[seq_of(1) - 1]) in view
    assert pruned(run(items, "snapshots")) == {}  # not declared: nothing


@pytest.mark.parametrize(
    ("output", "summary"),
    [
        (  # an agent framework's own tags around a long output: never the summary
            "<returncode>1</returncode>\n<warning>\nThe output of your last command was too long.\n</warning>"
            "<output_head>\n" + BODY + "\n</output_head>\n<elided_chars>\n14356 characters elided\n"
            "</elided_chars>\n<output_tail>\nFAILED tests/test_app.py::test_parse\n"
            "=========== 1 failed, 40 passed in 3.02s ===========\n" + BODY + "\n</output_tail>",
            "=========== 1 failed, 40 passed in 3.02s ===========",
        ),
        (  # the runner's summary, not whatever came after it
            "Ran 12 tests in 0.031s\n\nFAILED (failures=2)\n" + BODY + "\n</output>",
            "FAILED (failures=2)",
        ),
        ("<returncode>0</returncode>\n<output>\nOn branch main\n" + BODY + "\n</output>", BODY.split("\n")[-1].strip()),
    ],
)
def test_a_snapshots_residue_reads_the_runs_summary_not_the_agents_wrapper(output: str, summary: str) -> None:
    items = session(("pytest tests", output, True), ("pytest tests", "<returncode>0</returncode>\n41 passed\n" + BODY))
    out = run(items, "snapshots", '{commands: ["pytest*"]}')
    assert seq_of(1) in pruned(out)
    view = json.loads(out.view.messages_json)[seq_of(1) - 1]["content"]
    assert f"last line: {summary!r}" in view, view
    assert "output_tail" not in view and "</output>" not in view


# ------------------------------------------------------------------ errors

TRACEBACK = """<returncode>1</returncode>
<output>
Traceback (most recent call last):
  File "/repo/reproduce.py", line 3, in <module>
    main()
  File "/repo/src/app.py", line 41, in parse_header
    key, value = line.split(':', 1)
ValueError: not enough values to unpack (expected 2, got 1)
</output>"""


def test_a_failed_output_keeps_its_failure_once_the_same_command_succeeded() -> None:
    noisy = TRACEBACK.replace("<output>\n", "<output>\n" + BODY + "\n")
    # The same command as the shell user means it: redirections, output filters and a
    # timeout wrapper do not change what it checks.
    items = session(
        ("python3 reproduce.py 2>&1 | tail -n 40", noisy, True),
        ("timeout 60 python reproduce.py", "ok\n" + BODY),
    )
    out = run(items, "errors", latest_error="true")
    assert pruned(out) == {seq_of(1): (2, "the same check succeeded later, at seq 6 (call c2)")}
    view = json.loads(out.view.messages_json)[seq_of(1) - 1]["content"]
    assert "`python3 reproduce.py 2>&1 | tail -n 40`, exit 1" in view
    assert "ValueError: not enough values to unpack (expected 2, got 1)" in view
    assert 'File "/repo/src/app.py", line 41, in parse_header' in view
    assert "line 3 of the body" not in view and handle_of(items[seq_of(1) - 1]) in view


def test_a_shell_agents_other_successes_are_no_evidence_about_a_failure() -> None:
    """For an agent whose only tool is a shell, "the tool succeeded since" is true at once."""
    noisy = TRACEBACK.replace("<output>\n", "<output>\n" + BODY + "\n")
    items = session(
        ("python3 reproduce.py", noisy, True),
        ("ls src", "app.py\nutil.py"),
        ("grep -n parse_header src/app.py", "41:def parse_header(line):"),
        ("python3 other.py", "ok\n" + BODY),
    )
    assert pruned(run(items, "errors", latest_error="true")) == {}
    assert pruned(run_inputs(session((SCRIPT, noisy, True), ("ls", "patch.py\nsrc"), ("git status", BODY)))) == {}


FAILED_TEST = (
    "<returncode>1</returncode>\n<output>\nFAILED tests/test_app.py::test_parse - ValueError: empty header\n"
    + BODY
    + "\n1 failed, 12 passed in 0.41s\n</output>"
)


@pytest.mark.parametrize(
    ("later", "fixed"),
    [
        ("python -m pytest tests/test_app.py -q", True),  # the file the failed test is in
        ("pytest tests -x 2>&1 | tail -5", True),  # the directory holding it
        ("pytest", True),  # a test runner given no operands runs everything
        ("cd sub && pytest", False),  # in another directory
        ("pytest tests/test_util.py", False),  # another file's tests
        ("pytest tests/test_app.py::test_total", False),  # another test
        ("python -m mypy tests/test_app.py", False),  # another check of the same file
    ],
)
def test_a_newer_run_of_the_same_check_that_covers_the_failure_answers_it(later: str, fixed: bool) -> None:
    items = session(("pytest tests/test_app.py::test_parse", FAILED_TEST, True), (later, "13 passed\n" + BODY))
    assert bool(pruned(run(items, "errors", latest_error="true"))) is fixed


@pytest.mark.parametrize(
    "stopped",
    [
        "<returncode>124</returncode>\n<output>\n" + BODY + "\n</output>",
        "<returncode>137</returncode>\n<output>\nKilled\n" + BODY + "\n</output>",
        "The command timed out after 120 seconds.\n" + BODY,
    ],
)
def test_a_command_stopped_short_is_partial_output_not_a_failure_to_leave_behind(stopped: str) -> None:
    items = session(("pytest tests", stopped, True), ("pytest tests", "13 passed\n" + BODY))
    assert pruned(run(items, "errors", latest_error="true")) == {}
    script = session((SCRIPT, stopped, True), (SCRIPT, "ok\n" + BODY))
    assert pruned(run_inputs(script)) == {}


LONG_FAILURE = "\n".join(
    [
        "<returncode>1</returncode>",
        "<output>",
        "Collecting dependencies",
        *(f"  step {n}: resolved package-{n} 1.{n}.0" for n in range(20)),
        "Building wheel for app (pyproject.toml): started",
        "error: subprocess-exited-with-error",
        "  × Building wheel for app did not run successfully.",
        "  │ exit code: 1",
        *(f"  running build_ext step {n}" for n in range(20)),
        "Traceback (most recent call last):",
        '  File "/repo/setup_helpers.py", line 12, in <module>',
        "    build()",
        '  File "/repo/src/app/native.py", line 88, in build',
        "    compile_extension(spec)",
        '  File "/usr/lib/python3.11/site-packages/cffi/api.py", line 320, in compile_extension',
        "    raise VerificationError(msg)",
        "cffi.VerificationError: CompileError: command 'gcc' failed: No such file or directory",
        *(f"  cleanup {n}" for n in range(20)),
        "note: This error originates from a subprocess, and is likely not a problem with pip.",
        "</output>",
    ]
)


def test_a_failures_residue_is_its_own_evidence_with_a_marker_wherever_lines_went() -> None:
    residue = failure_residue(LONG_FAILURE)
    lines = residue.split("\n")
    # The first error with its context, the exception and the root cause's location in the
    # project's own code (with its source line), the frame it was raised in, how it ended.
    for expected in (
        "error: subprocess-exited-with-error",
        "  × Building wheel for app did not run successfully.",
        "  │ exit code: 1",
        "cffi.VerificationError: CompileError: command 'gcc' failed: No such file or directory",
        '  File "/repo/src/app/native.py", line 88, in build',
        "    compile_extension(spec)",
        '  File "/usr/lib/python3.11/site-packages/cffi/api.py", line 320, in compile_extension',
        "note: This error originates from a subprocess, and is likely not a problem with pip.",
    ):
        assert expected in lines, (expected, residue)
    assert "<returncode>1</returncode>" not in lines and "<output>" not in lines  # the framework's
    # Two fragments never read as one block: a marker wherever lines went.
    source = LONG_FAILURE.split("\n")
    for before, after in itertools.pairwise(lines):
        if not before.startswith("[…") and not after.startswith("[…"):
            assert source.index(after) == source.index(before) + 1, (before, after)
    assert "  running build_ext step 7" not in lines and len(lines) < 30


def test_a_failures_residue_is_not_the_last_lines_matching_an_error_pattern() -> None:
    lines = ["Error: config file app.toml: unknown key 'colour' at line 3", *(f"line {n}" for n in range(40))]
    lines += [f"warning: retrying failed download {n}" for n in range(20)]
    residue = failure_residue("\n".join(lines), limit=10).split("\n")
    assert residue[0] == "Error: config file app.toml: unknown key 'colour' at line 3"  # the first sign, first


SCRIPT = "cat <<'EOF' > patch.py\n" + "\n".join(f"lines[{n}] = lines[{n}].replace('a', 'b')" for n in range(40))
SCRIPT += "\nEOF\npython3 patch.py"
INPUTS = """
protection: {last_turns: 0, latest_error_per_tool: false}
tools: {bash: {effect: shell}}
rules: [{name: inputs, transform: errored_inputs, when: {roles: [assistant]}}]
"""


def run_inputs(items: list[Item]) -> RenderOutput:
    return run_policy(items, INPUTS)


def test_a_failed_calls_bulky_input_goes_once_the_same_check_succeeded() -> None:
    fixed = SCRIPT.replace("'b'", "'c'")  # the script written again, and run the same way
    items = session((SCRIPT, TRACEBACK, True), (fixed, "ok\n" + BODY))
    out = run_inputs(items)
    call_seq = seq_of(1) - 1
    assert pruned(out) == {call_seq: (2, "the same check succeeded later (seq 6)")}
    [turn] = [m for m in json.loads(out.view.messages_json) if m.get("tool_calls") and m["tool_calls"][0]["id"] == "c1"]
    [call] = turn["tool_calls"]
    stand_in = json.loads(call["function"]["arguments"])["contextd"]
    # The call keeps its id and name (its result still answers it); its input says what went and why.
    assert (call["id"], call["function"]["name"]) == ("c1", "bash")
    assert f"input left out ({len(json.dumps({'command': SCRIPT})):,} characters)" in stand_in
    assert "ValueError: not enough values to unpack (expected 2, got 1)" in stand_in
    assert "the same check succeeded later, at seq 6 (call c2)" in stand_in
    assert handle_of(items[call_seq - 1]) in stand_in
    assert "replace('a', 'b')" not in out.view.messages_json


def test_a_failed_calls_input_stays_while_the_failure_is_the_latest_or_small() -> None:
    still_failing = session((SCRIPT, TRACEBACK, True), ("python3 reproduce.py", TRACEBACK, True))
    assert pruned(run_inputs(still_failing)) == {}
    small = session(("python3 -c 'import app'", TRACEBACK, True), ("python3 -c 'import app'", "ok"))
    assert pruned(run_inputs(small)) == {}
    succeeded = session((SCRIPT, "ok\n" + BODY), (SCRIPT, "ok"))
    assert pruned(run_inputs(succeeded)) == {}


def test_the_latest_failure_stays_whole_until_its_tool_succeeds() -> None:
    noisy = TRACEBACK.replace("<output>\n", "<output>\n" + BODY + "\n")
    items = session(("python3 reproduce.py", noisy, True), ("python3 reproduce.py", noisy, True))
    assert pruned(run(items, "errors")) == {}


WHOLE_READ = ("cat src/app.py", "the file\n" + BODY)


@pytest.mark.parametrize(
    "later",
    [
        # Found by a second reading: each later call looks like a read of the file, and is not one.
        ("cat src/app.py > /dev/null && echo ok", "ok"),
        ("cat src/app.py > /tmp/backup.py", ""),
        ("grep -q TODO src/app.py || cat src/app.py", ""),
        ("cat src/util.py  # compare with src/app.py", "util\n" + BODY),
        ("cat src/app.py", "cat: src/app.py: No such file or directory"),  # failed, not flagged
        ("sed -i '3d' src/app.py && sed -n '1,5p' src/app.py", "after the deletion\n" + BODY),
    ],
)
def test_a_later_call_that_does_not_show_the_file_supersedes_nothing(later: tuple[str, str]) -> None:
    assert pruned(run(session(WHOLE_READ, later), "supersede")) == {}


def test_a_directory_left_changed_between_two_reads_of_a_relative_path_supersedes_nothing() -> None:
    items = session(("cat app.py", "one file\n" + BODY), ("cd tests", ""), ("cat app.py", "another\n" + BODY))
    assert pruned(run(items, "supersede")) == {}


def test_an_output_that_shows_more_than_the_read_is_not_superseded() -> None:
    items = session(("grep -rn parse src/ && cat src/app.py", "src/util.py:7: parse(x)\n" + BODY), WHOLE_READ)
    assert pruned(run(items, "supersede")) == {}


SOURCE = "\n".join(
    f'def handler_{n}(request):\n    """Handle case {n}."""\n'
    + "".join(f"    value_{k} = request.get('field_{k}', {k})\n" for k in range(8))
    + "    return value_0\n"
    for n in range(6)
)
READ_THEN_COMPRESS = """
protection: {last_turns: 0}
tools: {bash: {effect: shell}}
rules:
  - {name: superseded-reads, transform: supersede, when: {roles: [tool]}}
  - {name: compress-outputs, transform: compress, when: {roles: [tool]}}
"""


def test_a_read_compressed_while_old_still_gives_way_to_a_later_whole_read() -> None:
    first = session(("cat src/app.py", SOURCE), ("ls", "src\ntests"))
    early = run_policy(first, READ_THEN_COMPRESS)
    assert [(c.seq, c.reason) for c in early.certificates] == [(seq_of(1), "compressed_code")]
    assert shown(early, seq_of(1)) is Representation.REDUCED

    later = [
        *first,
        *session(("cat src/app.py", SOURCE), ("ls", "src\ntests"), ("cat src/app.py", SOURCE))[len(first) :],
    ]
    inp = policy_input(later, READ_THEN_COMPRESS, early.state, now=1_000.0)  # the cache cold: what pays applies
    out = render(inp)
    assert pruned(out)[seq_of(1)] == (2, "read again later by call c3 (seq 8)")
    assert shown(out, seq_of(1)) is Representation.PLACEHOLDER  # no longer the compressed copy
    assert [a.reason for a in out.state.applied if getattr(a.edit, "seq", None) == seq_of(1)] == ["superseded"]
    # The same from what the first render carried (its entries pooled whole, compressed since).
    carried = render(replace(inp, carry=early.carry))
    assert early.carry is not None and early.carry.follows(inp)
    assert (carried.view, carried.certificates, carried.state) == (out.view, out.certificates, out.state)
    # Rendered again from the stored state (no carry), the view is the same.
    again = render(replace(inp, state=out.state, now=1_010.0, carry=None))
    assert again.view.messages_json == out.view.messages_json and not pruned(again)


def test_an_output_keeps_what_the_call_that_made_it_was_for() -> None:
    # The agent says why it reads the file; by the time the output is compressed it has moved
    # on (the latest call, `ls`, names nothing in it). The function it asked about stays whole.
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock("Fix the bug."),)),
    ]
    for n, (reason, command, output) in enumerate(
        [("Let's look at `handler_3`, where the error is raised.", "cat src/app.py", SOURCE), ("", "ls", "src\ntests")],
        start=1,
    ):
        said = (TextBlock(reason),) if reason else ()
        contents.append(
            ItemContent(
                role=Role.ASSISTANT, content=(*said, ToolUseBlock(f"c{n}", "bash", json.dumps({"command": command})))
            )
        )
        result = ToolResultBlock(f"c{n}", (TextBlock(output),), name="bash")
        contents.append(ItemContent(role=Role.TOOL, content=(result,)))
    out = run_policy(stored_items(contents), READ_THEN_COMPRESS)
    assert [(c.seq, c.reason) for c in out.certificates] == [(seq_of(1), "compressed_code")]
    view = out.view.messages_json
    assert "value_7 = request.get('field_7', 7)" in view  # handler_3's body, whole
    assert view.count("value_7 = request.get") == 1  # the other handlers' bodies left out


@pytest.mark.parametrize("compressed_before", [True, False])
def test_over_its_budget_a_view_offloads_compressed_outputs_too(compressed_before: bool) -> None:
    items = session(("cat src/app.py", SOURCE), ("cat src/other.py", SOURCE.replace("handler", "worker")))
    compressed = run_policy(items, READ_THEN_COMPRESS)
    assert [c.reason for c in compressed.certificates] == ["compressed_code"] * 2
    inp = policy_input(items, READ_THEN_COMPRESS, compressed.state if compressed_before else None)
    tight = compressed.view.total_tokens - 50  # the compressed view does not fit
    out = render(replace(inp, request=ViewRequest(ViewFormat.OPENAI_CHAT, tight)))
    budget = [c.seq for c in out.certificates if c.rule == "budget"]
    assert seq_of(1) in budget and shown(out, seq_of(1)) is Representation.PLACEHOLDER
    assert out.view.total_tokens <= tight
    # One edit in force for the item: the offload (a compression, earlier or just now, gives way).
    assert [a.rule for a in out.state.applied if getattr(a.edit, "seq", None) == seq_of(1)] == ["budget"]


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_render_carried_on_matches_rules_on_entries_as_they_are_shown_now(bound: str) -> None:
    # A rule whose condition holds for the output whole but not compressed (min), or the reverse (max).
    first = session(("cat src/app.py", SOURCE), ("ls", "src\ntests"))
    compressed = run_policy(first, READ_THEN_COMPRESS).view.items[seq_of(1) - 1].tokens
    policy = READ_THEN_COMPRESS.replace(
        "transform: supersede, when: {roles: [tool]}",
        f"transform: supersede, when: {{roles: [tool], tokens: {{{bound}: {compressed + 50}}}}}",
    )
    early = run_policy(first, policy)
    assert shown(early, seq_of(1)) is Representation.REDUCED
    later = [
        *first,
        *session(("cat src/app.py", SOURCE), ("ls", "src\ntests"), ("cat src/app.py", SOURCE))[len(first) :],
    ]
    inp = policy_input(later, policy, early.state, now=1_000.0)
    rebuilt = render(inp)
    carried = render(replace(inp, carry=early.carry))
    assert early.carry is not None and early.carry.follows(inp)
    assert (carried.view, carried.certificates, carried.state) == (rebuilt.view, rebuilt.certificates, rebuilt.state)
    superseded = seq_of(1) in pruned(rebuilt)
    assert superseded is (bound == "max")  # the condition is read on the compressed output


def test_a_snapshot_is_not_replaced_by_a_run_that_failed() -> None:
    full = "FAILED tests/t.py::test_x - AssertionError: 3 != 4\n" + BODY + "\n1 failed, 3 passed"
    items = session(("pytest tests", full), ("pytest tests", "Command timed out after 60 seconds", True))
    assert pruned(run(items, "snapshots", '{commands: ["pytest*"]}')) == {}


def test_a_snapshot_is_replaced_by_a_later_run_whose_tests_failed_but_that_ran_to_its_end() -> None:
    # pytest exits 1 when tests fail: the run is whole, its summary line says it finished.
    def run_of(failed: int) -> str:
        summary = f"=========== {failed} failed, {10 - failed} passed in 0.52s ==========="
        return f"<returncode>1</returncode>\n<output>\n{BODY}\nFAILED tests/t.py::test_x\n{summary}\n</output>"

    items = session(("pytest tests", run_of(2), True), ("pytest tests", run_of(1), True))
    assert pruned(run(items, "snapshots", '{commands: ["pytest*"]}')) == {
        seq_of(1): (2, "the same command ran again at seq 6 (call c2)")
    }
    cut = run_of(1).replace("in 0.52s", "in progress")  # no summary: it may have stopped short
    stopped = session(("pytest tests", run_of(2), True), ("pytest tests", cut, True))
    assert pruned(run(stopped, "snapshots", '{commands: ["pytest*"]}')) == {}


@pytest.mark.parametrize(
    ("output", "kept"),
    [
        (
            "    def test_total():\n>       assert total([1, 2]) == 4\nE       assert 3 == 4\n"
            "E        +  where 3 = total([1, 2])\n\ntests/test_sum.py:9: AssertionError",
            ["E       assert 3 == 4", "E        +  where 3 = total([1, 2])", "tests/test_sum.py:9: AssertionError"],
        ),
        (
            "--- FAIL: TestSum (0.00s)\n    sum_test.go:8: Sum(1,2) = 3; want 4\nFAIL",
            ["    sum_test.go:8: Sum(1,2) = 3; want 4"],
        ),
        (
            "thread 'main' panicked at src/main.rs:4:5:\nassertion `left == right` failed\n  left: 4\n right: 5",
            ["  left: 4", " right: 5"],
        ),
        (
            'error[E0308]: mismatched types\n --> src/main.rs:4:18\n  |\n4 |     let x: i32 = "a";\n'
            "  |            ---   ^^^ expected `i32`, found `&str`",
            [" --> src/main.rs:4:18", "  |            ---   ^^^ expected `i32`, found `&str`"],
        ),
        (
            "npm ERR! code ERESOLVE\nnpm ERR! ERESOLVE unable to resolve dependency tree\nnpm ERR! Found: react@18.2.0",
            ["npm ERR! code ERESOLVE", "npm ERR! Found: react@18.2.0"],
        ),
        (
            "src/app.test.js\n  ● sums\n    expect(received).toBe(expected)\n    Expected: 4\n    Received: 3",
            ["    Expected: 4", "    Received: 3"],
        ),
    ],
)
def test_a_failures_residue_keeps_what_names_the_failure(output: str, kept: list[str]) -> None:
    lines = failure_residue(output, 12).split("\n")
    assert all(line in lines for line in kept), lines


# --------------------------------------------------------------- completed


def completed_session(mark: str) -> list[Item]:
    """Four calls of work, then the agent's note of what it came to, marked as their outcome."""
    items = session(*((f"python3 step{n}.py", f"step {n} output\n" + BODY) for n in range(1, 5)))
    note = ItemContent(
        role=Role.ASSISTANT,
        content=(TextBlock("Steps 1-4 done: the parser accepts empty headers now."),),
        metadata={"contextd.completes": mark},
    )
    return [*items, to_item(note, len(items) + 1)]


def test_a_span_marked_complete_goes_once_its_outcome_is_recorded() -> None:
    items = completed_session("3-10")  # the four calls and their outputs
    out = run(items, "completed")
    assert pruned(out) == {
        seq: (3, "completed work (items 3-10); its outcome is recorded at seq 11") for seq in (4, 6, 8, 10)
    }
    assert shown(out, 11) is Representation.FULL  # the outcome: the evidence, kept whole


def test_a_mark_that_does_not_point_back_or_does_not_parse_completes_nothing() -> None:
    assert pruned(run(completed_session("3-12"), "completed")) == {}  # ends after its own record
    assert pruned(run(completed_session("ten-twelve"), "completed")) == {}


PLAIN_NAMES = ("validate", "normalize", "render", "submit", "cleanup", "persist")
PLAIN_SOURCE = "\n".join(
    f'def {name}(request):\n    """Step {n}."""\n'
    + "".join(f"    {name}_value_{k} = request.get('field_{k}', {k})\n" for k in range(8))
    + "    return request\n"
    for n, name in enumerate(PLAIN_NAMES)
)


def test_what_the_agent_grepped_for_stays_whole_in_the_file_it_read_next_however_plain_the_word() -> None:
    items = session(
        ("grep -n 'def validate(' src/forms.py", "1:def validate(request):"),
        ("cat src/forms.py", PLAIN_SOURCE),
        ("ls", "src\ntests"),
    )
    out = run_policy(items, READ_THEN_COMPRESS)
    assert (seq_of(2), "compressed_code") in [(c.seq, c.reason) for c in out.certificates]
    view = out.view.messages_json
    assert "validate_value_7 = request.get('field_7', 7)" in view  # the body searched for, whole
    assert "render_value_7" not in view  # the others' bodies left out


RANGE = "\n".join(PLAIN_SOURCE.split("\n")[27:31])  # lines 28-31: four lines of `render`'s body
HEAD = "\n".join(PLAIN_SOURCE.split("\n")[:31])


def _numbered(text: str) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.split("\n"), start=1))


def test_of_an_output_cut_to_its_head_and_tail_only_the_heads_lines_are_known() -> None:
    lines = PLAIN_SOURCE.split("\n")
    cut = (
        "<returncode>0</returncode>\n<output_head>\n" + "\n".join(lines[:24]) + "\n</output_head>\n"
        "<elided_chars>\n900 characters elided\n</elided_chars>\n<output_tail>\n"
        + "\n".join(lines[48:]) + "\n</output_tail>"
    )  # fmt: skip
    # Lines 16-18 are in the head; lines 41-46 were left out by the tool, not shown in the tail.
    for low, high, shown, kept in ((16, 18, "normalize_value_1", True), (41, 46, "persist_value_1", False)):
        read = (f"sed -n '{low},{high}p' src/forms.py", "\n".join(lines[low - 1 : high]))
        out = run_policy(session(("cat src/forms.py", cut), read, ("ls", "src\ntests")), READ_THEN_COMPRESS)
        text = message_of(out, seq_of(1))
        assert "compressed as code" in text and (shown in text) is kept, (low, text)


def message_of(out: RenderOutput, seq: int) -> str:
    """The text of the view's message showing `seq`."""
    index = next(i.message_index for i in out.view.items if i.seq == seq)
    return json.dumps(json.loads(out.view.messages_json)[index])


@pytest.mark.parametrize(
    ("calls", "kept"),
    [
        # The agent went back to some lines of a file it had read whole: they stay in that read.
        ((("cat src/forms.py", PLAIN_SOURCE), ("sed -n '28,31p' src/forms.py", RANGE)), True),
        ((("cat -n src/forms.py", _numbered(PLAIN_SOURCE)), ("sed -n 28,31p src/forms.py", RANGE)), True),
        ((("cat src/forms.py", PLAIN_SOURCE), ("head -n 31 src/forms.py", HEAD)), True),
        # A command whose effects are unknown, between the two, may have moved the file's lines;
        # so may a write in the range read's own command.
        ((("cat src/forms.py", PLAIN_SOURCE), ("python fix.py", "done"), ("sed -n '28,31p' src/forms.py", RANGE)),
         False),
        ((("cat src/forms.py", PLAIN_SOURCE), ("sed -i '1d' src/forms.py && sed -n '28,31p' src/forms.py", RANGE)),
         False),
        # sed prints in the file's order: a read of ranges out of order says nothing of its lines.
        ((("sed -n '40,72p;1,39p' src/forms.py", PLAIN_SOURCE), ("sed -n '28,31p' src/forms.py", RANGE)), False),
    ],
)  # fmt: skip
def test_the_lines_a_recent_call_read_by_range_stay_in_another_read_of_the_file(
    calls: tuple[tuple[str, str], ...], kept: bool
) -> None:
    out = run_policy(session(*calls, ("ls", "src\ntests")), READ_THEN_COMPRESS)
    assert (seq_of(1), "compressed_code") in [(c.seq, c.reason) for c in out.certificates]
    text = message_of(out, seq_of(1))
    assert ("render_value_1 = request.get('field_1', 1)" in text) is kept, text
    assert ("render_value_4 = request.get('field_4', 4)" in text) is kept
    for elsewhere in ("render_value_6", "submit_value_3", "persist_value_1"):  # the rest of the bodies: left out
        assert elsewhere not in text


@pytest.mark.parametrize(
    ("command", "terms"),
    [
        ("grep -n 'def validate(' src/forms.py", ["validate"]),
        ("rg -n 'class\\s+Order(Form|Model)\\b' src", ["Order", "Form", "Model"]),
        ("git grep -e get_total -e 'compute_tax\\(' -- '*.py'", ["get_total", "compute_tax"]),
        ("cd /repo && grep -rn --include='*.py' -A 3 normalize . | head -20", ["normalize"]),
        ("sed -n '120,160p' src/forms.py", ["src/forms.py"]),
        ("tail -n 40 Makefile.inc", ["Makefile.inc"]),
        ("python -c 'from app.forms import validate; print(validate({}))'", ["app.forms", "validate"]),
        ("pytest -x tests", []),
    ],
)
def test_the_terms_a_shell_user_means_by_a_command(command: str, terms: list[str]) -> None:
    assert command_terms(command) == terms


ON_ENTRY = """
protection: {last_turns: 1}
tools: {bash: {effect: shell}}
rules: [{name: compress-outputs, transform: compress, params: {on_entry: %s}, when: {roles: [tool]}}]
"""
RUN_LOG = "\n".join(f"2026-05-01 10:00:{n % 60:02d} INFO step {n} done" for n in range(200))
RUN_LOG += "\n2026-05-01 10:04:00 ERROR step 200 failed: disk quota exceeded"


def test_an_output_of_a_kind_compressed_on_entry_is_read_compressed_by_the_call_that_made_it() -> None:
    items = session(("python run.py", RUN_LOG), ("cat src/app.py", SOURCE))
    log, code = seq_of(1), seq_of(2)
    entered = run_policy(items[:log], ON_ENTRY % "[log]")  # the log is the newest output
    assert [(c.seq, c.reason) for c in entered.certificates] == [(log, "compressed_log")]
    assert "disk quota exceeded" in entered.view.messages_json and "step 17 done" not in entered.view.messages_json
    # Code is read whole by the call that made it, whatever the kinds named.
    later = run_policy(items, ON_ENTRY % "[log]")
    assert shown(later, code) is Representation.FULL
    # Without the kind named, the newest output is protected as before.
    assert pruned(run_policy(items[:log], ON_ENTRY % "[]")) == {}
    # A read of a file is what the call works from, whatever its lines read as.
    read = session(("cat logs/run.log", RUN_LOG))
    assert pruned(run_policy(read, ON_ENTRY % "[log, text]")) == {}


def test_a_compression_on_entry_never_passes_another_protection() -> None:
    items = session(("python run.py", RUN_LOG, True))  # the latest failure of its tool
    out = run_policy(items, ON_ENTRY % "[log]")
    assert pruned(out) == {} and "step 17 done" in out.view.messages_json


def test_the_kinds_compressed_on_entry_are_checked() -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_policy(ON_ENTRY % "[logs]", REGISTRY)
    assert "unknown kinds ['logs']" in str(raised.value.violations)


ON_ENTRY_READS = """
protection: {last_turns: 1}
tools: {bash: {effect: shell}}
rules:
  - {name: superseded-reads, transform: supersede, when: {roles: [tool]}}
  - {name: compress-outputs, transform: compress, params: {on_entry_reads: %s}, when: {roles: [tool]}}
"""
# Three short handlers alike but for their names, and a long one.
HANDLERS = "\n".join(
    [
        *(
            f"def handler_{n}(request):\n"
            + "".join(f"    value_{k} = request.get('field_{n}_{k}', {k})\n" for k in range(5))
            + "    return value_0\n"
            for n in range(3)
        ),
        "def dispatch(request):\n" + "".join(f"    route_{k} = request.route('step_{k}')\n" for k in range(12)),
    ]
)


def test_a_read_of_a_whole_file_of_code_is_read_as_a_skeleton_by_the_call_that_made_it() -> None:
    read = seq_of(1)
    out = run_policy(session(("cat src/handlers.py", HANDLERS)), ON_ENTRY_READS % "[code]")
    assert [(c.seq, c.reason) for c in out.certificates] == [(read, "compressed_code")]
    view = out.view.messages_json
    assert "field_0_4" in view  # a short body: one use, shown as the example
    assert "field_1_4" not in view and "field_2_4" not in view  # alike the one shown
    assert "step_11" not in view  # a long body
    # Without the kind named, a read of a file is read whole by the call that made it.
    assert pruned(run_policy(session(("cat src/handlers.py", HANDLERS)), ON_ENTRY_READS % "[]")) == {}
    # So is a read of a range of lines: what the agent asked to see.
    ranged = session(("sed -n 1,40p src/handlers.py", HANDLERS))
    assert pruned(run_policy(ranged, ON_ENTRY_READS % "[code]")) == {}
    # The default policy compresses a whole file on entry.
    out = run_policy(session(("cat src/handlers.py", HANDLERS)), default_policy_text())
    assert (read, "compressed_code") in [(c.seq, c.reason) for c in out.certificates]


@pytest.mark.parametrize("warm", [True, False], ids=["cache warm", "cache cold"])
def test_a_compression_on_entry_goes_before_an_edit_that_would_rest_on_its_output(warm: bool) -> None:
    head = "\n".join(SOURCE.split("\n")[:20])
    items = session(("sed -n 1,20p src/app.py", head), ("cat src/app.py", SOURCE))
    part, whole = seq_of(1), seq_of(2)
    # A system prompt long enough for the provider to cache the call that read the part.
    rules = "\n".join(f"Rule {n}: keep the change to what rule {n} of the task asks." for n in range(120))
    system = ItemContent(role=Role.SYSTEM, content=(TextBlock(rules),))
    items = stored_items([system, *(ItemContent(role=i.role, content=i.content) for i in items[1:])])

    def rendered(policy: str) -> RenderOutput:
        early = run_policy(items[:part], policy)  # the call that read the part
        return render(policy_input(items, policy, early.state, now=10.0 if warm else 1_000.0))

    # Without the compression on entry, the whole read is the evidence the part read is superseded
    # (a rewrite of the cached prompt, when the cache is warm: it waits).
    out = rendered(ON_ENTRY_READS % "[]")
    assert shown(out, whole) is Representation.FULL
    assert [c.decision for c in out.certificates if c.seq == part] == [Decision.DEFER if warm else Decision.PRUNE]
    out = rendered(ON_ENTRY_READS % "[code]")
    if warm:
        # With it, the whole read goes compressed as it enters, at no cost to the cache; the
        # supersede would rest on an output no longer shown whole, and the part read stays.
        assert reasons(out) == {whole: "compressed_code"} and shown(out, part) is Representation.FULL
    else:
        # The cache cold, the rewrite costs nothing: the supersede applies, as the policy orders.
        assert reasons(out) == {part: "superseded"} and shown(out, whole) is Representation.FULL


def reasons(out: RenderOutput) -> dict[int, str]:
    return {c.seq: c.reason for c in out.certificates if c.decision is Decision.PRUNE}


def test_the_kinds_a_read_of_a_whole_file_is_compressed_as_on_entry_are_checked() -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_policy(ON_ENTRY_READS % "[python]", REGISTRY)
    assert "unknown kinds ['python']" in str(raised.value.violations)


# Twenty small directories listed whole, three of fifteen names folded: the folded form keeps
# about 0.83 of the characters, more than a later rewrite's 0.7.
TREE = "\n\n".join(
    [".:\ndocs\nsrc\nsetup.py"]
    + [f"./src/part{d}:\n" + "\n".join(f"mod{d}_{k}.py" for k in range(3)) for d in range(20)]
    + [f"./docs/guide{d}:\n" + "\n".join(f"chapter{d}_{k}.rst" for k in range(15)) for d in range(3)]
)
ENTRY_RATIO = ON_ENTRY.replace("params: {on_entry: %s}", "params: {on_entry: [listing], on_entry_max_ratio: %s}")


def test_a_compression_on_entry_may_keep_more_than_a_later_rewrite() -> None:
    items = session(("ls -R", TREE))
    listing = seq_of(1)
    # Read compressed by the call that made it: the whole is never cached, any saving pays.
    out = run_policy(items, ENTRY_RATIO % "0.9")
    assert [(c.seq, c.reason) for c in out.certificates] == [(listing, "compressed_listing")]
    assert "mod19_2.py" in out.view.messages_json and "chapter0_14.rst" not in out.view.messages_json
    # Without the share named, 0.7 at most, as for a later rewrite: the listing stays whole.
    assert pruned(run_policy(items, ON_ENTRY % "[listing]")) == {}
    # The default policy does so too.
    out = run_policy(items, default_policy_text())
    assert (listing, "compressed_listing") in [(c.seq, c.reason) for c in out.certificates]
    # From the next call on it would be a rewrite of the cached prompt: held to 0.7, it is not proposed.
    later = run_policy(session(("ls -R", TREE), ("pwd", "/repo")), ENTRY_RATIO % "0.9")
    assert [c for c in later.certificates if c.seq == listing] == []


@pytest.mark.parametrize("ratio", ["0", "1.5", "true", "'high'"])
def test_the_share_a_compression_on_entry_may_keep_is_checked(ratio: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_policy(ENTRY_RATIO % ratio, REGISTRY)
    assert "on_entry_max_ratio" in str(raised.value.violations)


WRITES = """
protection: {last_turns: 0, latest_error_per_tool: false}
tools: {write_file: {effect: write, source_arg: path}, bash: {effect: shell}}
rules: [{name: inputs, transform: errored_inputs, when: {roles: [assistant]}}]
"""


def tool_session(*calls: tuple[str, dict[str, str], str, bool]) -> list[Item]:
    """(tool, arguments, output, failed) per call; call ids c1, c2 ..."""
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Write the module."),))]
    for n, (tool, arguments, output, failed) in enumerate(calls, start=1):
        use = ToolUseBlock(f"c{n}", tool, json.dumps(arguments))
        contents.append(ItemContent(role=Role.ASSISTANT, content=(use,)))
        result = ToolResultBlock(f"c{n}", (TextBlock(output),), is_error=failed, name=tool)
        contents.append(ItemContent(role=Role.TOOL, content=(result,)))
    return stored_items(contents)


@pytest.mark.parametrize(
    ("later", "fixed"),
    [
        (("write_file", {"path": "gen/mod.py", "content": "# v2\n" + SOURCE}), True),  # the same target
        (("write_file", {"path": "build/mod.py", "content": SOURCE}), False),  # another file
        (("bash", {"command": "ls gen"}), False),  # another tool
    ],
)
def test_a_tool_that_is_not_a_shell_is_answered_by_a_later_success_on_the_same_target(
    later: tuple[str, dict[str, str]], fixed: bool
) -> None:
    denied = ("write_file", {"path": "gen/mod.py", "content": SOURCE}, "PermissionError: [Errno 13] gen/mod.py", True)
    items = tool_session(denied, (*later, "done", False))
    assert bool(pruned(run_policy(items, WRITES))) is fixed


@pytest.mark.parametrize(
    "hostile",
    [
        "\n \n" * 200_000,  # every line start once ran `^\s*Killed` across all the blank lines after it
        "<warning>x" * 100_000,  # every unclosed tag once scanned to the end for its `</warning>`
        ("exit code " + " " * 20) * 20_000,
    ],
    ids=["blank lines", "unclosed warnings", "statuses without a number"],
)
def test_reading_a_failure_takes_time_linear_in_the_output(hostile: str) -> None:
    """The fuzzer's find: an output of blank lines held a render thread for minutes (quadratic
    patterns over the whole text). At these sizes a quadratic reading takes many minutes, far
    past the test's timeout; a linear one, milliseconds."""
    assert not stopped_short(hostile)
    assert exit_status(hostile) is None
    failure_residue(hostile)
    summary_line(hostile)


BEYOND_INT = "9" * 5_000
"""More digits than `int()` reads (4,300): no line number, count or exit status."""
CODE_LINES = "\n".join(f"value_{n} = compute({n})" for n in range(40))


@pytest.mark.parametrize(
    ("command", "output"),
    [
        (f"head -n {BEYOND_INT} src/a.py", CODE_LINES),
        (f"head -{BEYOND_INT} src/a.py", CODE_LINES),
        (f"sed -n '1,{BEYOND_INT}p' src/a.py", CODE_LINES),
        (f"nl -ba src/a.py | sed -n '{BEYOND_INT},{BEYOND_INT}p'", CODE_LINES),
        ("head -n \u00b2 src/a.py", CODE_LINES),  # a digit to `isdigit`, not one `int()` reads
        ("make", f"make: *** [all] Error 1\nexit code {BEYOND_INT}\n" + BODY),
        ("make", "make: *** [all] Error 1\nexit code \u0663\n" + BODY),  # an Arabic-Indic 3
    ],
    ids=["head -n", "head -N", "sed -n", "nl | sed -n", "superscript", "exit status", "exit status, Indic digit"],
)
def test_a_number_past_what_int_reads_leaves_the_session_renderable(command: str, output: str) -> None:
    """A command or an output in the history once failed every render of its session:
    `int()` raised on its number, at every render, whatever the client did next."""
    items = session((command, output, True), (command, output), ("pytest tests", "13 passed\n" + BODY))
    for state in (None, ViewState()):
        out = render(replace(policy_input(items, default_policy_text()), state=state or ViewState()))
        assert [i.seq for i in out.view.items] == [i.seq for i in items]
    assert exit_status(output) in (None, 3)


def test_a_number_is_read_only_as_long_as_a_count_can_be() -> None:
    assert [number(t) for t in ("30", "0030", "-15", "+7", "\u0663", "1" * MAX_DIGITS)] == [
        30,
        30,
        -15,
        7,
        3,
        int("1" * MAX_DIGITS),
    ]
    assert [number(t) for t in ("", "-", "1" * (MAX_DIGITS + 1), "0" * 5_000 + "1", "\u00b2", " 5", "5 ", "1_000")] == [
        None
    ] * 8
    assert parse_completion(f"1-{BEYOND_INT}") is None
    assert parse_completion("3-9") == (3, 9)
