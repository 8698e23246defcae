"""Invariant repair, the last stage before rendering (DESIGN principle 6).

Whatever the edits did, the view keeps the providers' message rules:

* every tool result follows the turn that made its call, directly: results
  that history put after other items are moved up to their call;
* a result whose call is not in the view is left out; a call whose result
  was left out gets the result back as a placeholder (pairs go together);
* no entry is empty;
* the conversation opens with a user turn (the Messages API requires it):
  a user item that an edit left out before the first shown turn comes back
  as a placeholder.

Reasoning the provider needs back with a turn's calls is kept when edits
are applied (placeholders.with_calls), not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from contextd.engine.blocks import Blocked
from contextd.engine.memo import IdentityMemo, shared_prefix, take_over
from contextd.engine.model import Representation, Role, ToolUseBlock
from contextd.engine.placeholders import placeholder_blocks
from contextd.engine.render.base import ViewWarning
from contextd.engine.tokens import TokenCounter, block_tokens
from contextd.engine.types import Entry


@dataclass(slots=True, eq=False)
class RepairRun:
    """One repair, kept so that the next render's repair resumes it: for the entries
    both share (`shared_prefix`), only what a change can reach is done again."""

    counter: TokenCounter
    entries: Sequence[Entry]
    shown: list[Entry]
    """`entries`, empty ones left out, the opening restored."""
    opening: int
    """Index of the entry the conversation opens with (len(shown) if none): the
    opening repair depends on the entries up to it."""
    results: dict[str, Entry]
    """Each tool call's result entry, wherever history put it."""
    answer_at: dict[str, int]
    calls_at: dict[str, int]
    """tool_use id -> index of the entry that makes the call."""
    answers: set[int]
    """ids of the result entries (placed after their call, not where history put them): those
    of `results` (engine/carry_pickle.py builds it so for a run read back)."""
    repeated: bool
    """A tool_use id is called twice or has two results: resuming could place the wrong
    one, so it is not done (appends refuse such histories; the engine still takes them)."""
    ordered: list[Entry]
    warnings: list[ViewWarning]
    placed: set[int]
    marks: list[tuple[int, int]]
    """Before each entry of `shown`: len(ordered), len(warnings)."""
    taken: bool = False
    """A later render resumed this run: its lists, maps and sets are that render's now."""
    out: Sequence[Entry] | None = None
    """The entries it gave, repaired (never changed after: blocks of `ordered`)."""
    kept: int = 0
    """How many leading entries of `out` are those of the run it resumed (the same objects)."""
    ordered_blocks: Blocked = field(default_factory=Blocked)
    """`ordered` as handed out (`out`), told of its cuts."""


def repair(
    entries: Sequence[Entry], counter: TokenCounter, previous: RepairRun | None = None
) -> tuple[Sequence[Entry], list[ViewWarning], RepairRun]:
    """The entries in an order and form every provider accepts, and what was changed;
    `previous`: the repair of a previous render, to resume (where the entries it was given and
    `entries` first differ: `Blocks` of the draft's, compared block by block)."""
    run, start = _resumed(previous, entries, counter)
    shown, results, answers, placed = run.shown, run.results, run.answers, run.placed
    ordered, warnings, marks = run.ordered, run.warnings, run.marks
    for index in range(start, len(shown)):
        entry = shown[index]
        marks.append((len(ordered), len(warnings)))
        if id(entry) in answers:
            result = entry.item.tool_result
            if entry.representation is Representation.OMITTED and result and result.tool_use_id not in run.calls_at:
                # Left out with its call: in place, where a later render resumes after it (at the
                # end, every render would go through the results of the turns left out again).
                ordered.append(entry)
                placed.add(entry.seq)
            continue  # else placed right after its call, below
        ordered.append(entry)
        if entry.representation is Representation.OMITTED or entry.item.role is not Role.ASSISTANT:
            continue
        for call in [b for b in entry.content if isinstance(b, ToolUseBlock)]:
            answer = results.get(call.id)
            if answer is None:
                warnings.append(
                    ViewWarning("TOOL_CALL_UNANSWERED", f"seq {entry.seq}: call {call.id} has no result yet")
                )
                continue
            if answer.representation is Representation.OMITTED:
                answer = _as_placeholder(answer, "paired call kept", counter)
                warnings.append(
                    ViewWarning("REPAIR_RESULT_RESTORED", f"seq {answer.seq}: restored as a placeholder for its call")
                )
            ordered.append(answer)
            placed.add(answer.seq)
    out = run.ordered_blocks.blocks(ordered)
    notes = list(warnings)
    if len(placed) < len(answers):  # results whose call is not in the view
        dropped = []
        for entry in shown:
            if id(entry) in answers and entry.seq not in placed:
                if entry.representation is not Representation.OMITTED:
                    notes.append(ViewWarning("REPAIR_RESULT_DROPPED", f"seq {entry.seq}: its call is not in the view"))
                dropped.append(_omit(entry))
        out = out.extended(dropped)
    run.out = out
    return out, notes, run


def _resumed(previous: RepairRun | None, entries: Sequence[Entry], counter: TokenCounter) -> tuple[RepairRun, int]:
    """A run over `entries` with what `previous` did that still holds; and where to go on.

    The run takes the previous one's lists, maps and sets over, cut back to where it goes on
    (a cost in what changed, not in the view's length), and marks it taken: a run resumed
    once is not resumed again (another render from the same carry repairs from the start)."""
    if previous is not None and not previous.taken and previous.counter is counter and not previous.repeated:
        same = shared_prefix(previous.entries, entries)
        if same > previous.opening and take_over(previous):
            run = RepairRun(
                counter,
                entries,
                previous.shown,
                previous.opening,
                previous.results,
                previous.answer_at,
                previous.calls_at,
                previous.answers,
                False,
                previous.ordered,
                previous.warnings,
                previous.placed,
                previous.marks,
                ordered_blocks=previous.ordered_blocks,
            )
            start, gone = same, dict[str, tuple[Entry, int]]()
            for entry in run.shown[same:]:
                result = entry.item.tool_result
                if result is not None and run.results.get(result.tool_use_id) is entry:
                    gone[result.tool_use_id] = (entry, run.answer_at.pop(result.tool_use_id))
                    del run.results[result.tool_use_id]
                    run.answers.discard(id(entry))
                for call_id in _calls(entry):
                    run.calls_at.pop(call_id, None)
            del run.shown[same:]
            changed = _index(run, same)
            changed.update(i for i, (was, _) in gone.items() if run.results.get(i) is not was)
            for call_id in changed:
                # A call whose result changed is placed again, and so is everything after it.
                before = gone[call_id][1] if call_id in gone else start
                start = min(start, run.calls_at.get(call_id, start), before)
            if not run.repeated:
                ordered_len, warnings_len = (
                    run.marks[start]
                    if start < len(run.marks)
                    else (
                        len(run.ordered),
                        len(run.warnings),
                    )
                )
                run.placed.difference_update(e.seq for e in run.ordered[ordered_len:])
                run.kept = ordered_len  # (the previous run's `out` begins with its `ordered`)
                run.ordered_blocks.cut(run.ordered, ordered_len)
                del run.warnings[warnings_len:]
                del run.marks[start:]
                return run, start
    run = RepairRun(counter, entries, [], 0, {}, {}, {}, set(), False, [], [], set(), [])
    _index(run, 0)
    run.opening = _open_with_user(run.shown, run.warnings, counter)
    return run, 0


def _index(run: RepairRun, start: int) -> set[str]:
    """Add `run.entries[start:]` to the run's shown entries, results and calls; the
    tool_use ids whose result changed."""
    changed: set[str] = set()
    for index in range(start, len(run.entries)):
        entry = run.entries[index]
        if not entry.content and entry.role is not Role.TOOL:
            entry = _omit(entry)
        run.shown.append(entry)
        result = entry.item.tool_result
        if result is not None:
            if result.tool_use_id in run.results:
                run.repeated = True
            run.results[result.tool_use_id] = entry
            run.answer_at[result.tool_use_id] = index
            run.answers.add(id(entry))
            changed.add(result.tool_use_id)
        for call_id in _calls(entry):
            if call_id in run.calls_at:
                run.repeated = True
            run.calls_at[call_id] = index
    return changed


def _calls(entry: Entry) -> list[str]:
    if entry.item.role is not Role.ASSISTANT or entry.representation is Representation.OMITTED:
        return []
    return [b.id for b in entry.content if isinstance(b, ToolUseBlock)]


def _open_with_user(entries: list[Entry], warnings: list[ViewWarning], counter: TokenCounter) -> int:
    """Restore a user item left out before the first turn shown, if that turn is not a
    user's; returns the index of that first turn (len(entries) when there is none)."""
    for index, entry in enumerate(entries):
        if entry.role is Role.SYSTEM or entry.representation is Representation.OMITTED:
            continue
        if entry.role is Role.USER:
            return index
        for earlier in range(index - 1, -1, -1):
            left_out = entries[earlier]
            if left_out.role is Role.USER and left_out.representation is Representation.OMITTED:
                entries[earlier] = _as_placeholder(left_out, "opens the conversation", counter)
                warnings.append(
                    ViewWarning("REPAIR_OPENING_RESTORED", f"seq {left_out.seq}: restored as a placeholder")
                )
                break
        return index
    return len(entries)


# What repair puts in an entry's place is remembered per entry: an entry of an
# unchanged item is the same object from render to render, and so is what
# stands in for it, which lets a render resume the previous one's rendering.
_stand_ins: IdentityMemo[Entry] = IdentityMemo(100_000)


def _as_placeholder(entry: Entry, reason: str, counter: TokenCounter) -> Entry:
    def make() -> Entry:
        blocks = placeholder_blocks(entry.item, reason)
        tokens = sum(block_tokens(b, counter) for b in blocks)
        return entry._replace(content=blocks, representation=Representation.PLACEHOLDER, tokens=tokens)

    return _stand_ins.get((entry, reason, counter), make)


def _omit(entry: Entry) -> Entry:
    if entry.representation is Representation.OMITTED and not entry.content and not entry.tokens:
        return entry
    return _stand_ins.get((entry,), lambda: entry._replace(content=(), representation=Representation.OMITTED, tokens=0))
