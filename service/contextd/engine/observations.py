"""The session's tool observations, as evidence for the strategies.

Each tool result with its call becomes an Observation: which tool, what it
read (a source, whole or by line ranges), what it wrote, whether its
effects are unknown (it may have written anything), whether it failed.
Effects come from the result item's own declaration, else the policy's
declaration for the tool, else, for a shell tool, the conservative reading
of its command (shell.py); an undeclared tool has unknown effects.

The index grows as items are appended and is kept from render to render
(a render's draft copies it and notes the new items), so a strategy looks
up the observations it needs instead of scanning the history.
"""

from __future__ import annotations

import bisect
import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from contextd.engine.checks import Check, covers, shell_check, tool_check
from contextd.engine.failures import stopped_short
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, Role, TextBlock, ToolEffectKind, ToolUseBlock
from contextd.engine.shell import UNKNOWN, WHOLE, Effects, Read, effects
from contextd.engine.shell_words import number
from contextd.engine.spans import ReadSpans, Span

LAST_SEQ = 2**63 - 1
"""Seqs are int64."""


@dataclass(frozen=True, slots=True)
class Observation:
    seq: int
    """The result item."""
    call_seq: int
    tool: str
    call_id: str
    command: str
    """What was run, as the agent wrote it: a shell command, or the tool with its arguments."""
    reads: tuple[Read, ...]
    writes: tuple[str, ...]
    moves_lines: tuple[str, ...]
    """Those of `writes` that may have added or removed lines (not changed line for line)."""
    unknown: bool
    """Its effects are not known: it may have read or written anything."""
    listing: bool
    """Its output shows more than its reads (a listing, a search, a message)."""
    failed: bool
    """It failed: flagged so, or its output says so (a missing file, a nonzero exit)."""
    stopped: bool
    """It was stopped before its end (a timeout, a kill): its output is partial, not a failure's."""
    check: Check | None
    """What it checked, for a later call to be known to have run it again (checks.py)."""
    shell_state: bool
    """It may have changed the shell's directory or variables for later commands
    (a shell builtin; or a tool that is not a shell, whose effects are not known)."""
    version: str
    """The version of what it read, when the client declared one (item.source)."""
    is_error: bool
    output_hash: str
    """What it returned (tool call ids left out: identical outputs share it)."""


COMPLETES = "contextd.completes"
"""Item metadata: ``FIRST-LAST``, the seqs of a span of work this item records the outcome of."""


@dataclass(frozen=True, slots=True)
class Completion:
    first: int
    last: int
    outcome: int
    """The item that records what the span of work came to."""


def parse_completion(value: str) -> tuple[int, int] | None:
    """``FIRST-LAST`` as two seqs (FIRST ≤ LAST, both from 1); None when it is not that."""
    first, dash, last = value.partition("-")
    if not dash or not first.isdigit() or not last.isdigit():
        return None
    span = number(first), number(last)
    if span[0] is None or span[1] is None:
        return None
    return (span[0], span[1]) if 1 <= span[0] <= span[1] else None


class Declared(Protocol):
    """A tool's declaration in the policy (policy.ToolDeclaration)."""

    @property
    def effect(self) -> str: ...
    @property
    def source_arg(self) -> str: ...
    @property
    def command_arg(self) -> str: ...


_observations: IdentityMemo[Observation] = IdentityMemo(100_000)


class ObservationIndex:
    def __init__(self, tools: Mapping[str, Declared]) -> None:
        self._tools = tools
        self._calls: dict[str, tuple[int, ToolUseBlock]] = {}
        self.by_seq: dict[int, Observation] = {}
        self._answers: dict[str, int] = {}
        """tool call id -> seq of its result."""
        self.completions: tuple[Completion, ...] = ()
        """Spans of work the client marked complete, in the order of the items that record them."""
        self._by_name: dict[str, tuple[int, ...]] = {}
        """file name (the last part of a path) -> seqs of the observations that wrote it
        in a way that may have moved its lines."""
        self._by_output: dict[str, tuple[int, ...]] = {}
        self._by_command: dict[tuple[str, str], tuple[int, ...]] = {}
        self._successes: dict[tuple[str, ...], tuple[int, ...]] = {}
        """check family (checks.py) -> seqs of its calls that did not fail (by flag or by what they say)."""
        self._unknown: list[int] = []
        """Seqs of the observations with unknown effects, in order."""
        self._shell_state: list[int] = []
        """Seqs of the observations that may have changed the shell (its directory ...)."""
        self._unlined: dict[str, tuple[int, ...]] = {}
        """path -> seqs of the observations that read some of it, not by line numbers."""
        self._spans: dict[str, tuple[ReadSpans, int]] = {}
        """path -> the line spans read of it (spans.py), and how many of them this index sees
        (a copy shares them)."""

    def copy(self) -> ObservationIndex:
        other = object.__new__(ObservationIndex)
        other._tools = self._tools
        other._calls = dict(self._calls)
        other.by_seq = dict(self.by_seq)
        other._answers = dict(self._answers)
        other.completions = self.completions
        other._by_name = dict(self._by_name)
        other._by_output = dict(self._by_output)
        other._by_command = dict(self._by_command)
        other._successes = dict(self._successes)
        other._unknown = list(self._unknown)
        other._shell_state = list(self._shell_state)
        other._unlined = dict(self._unlined)
        other._spans = dict(self._spans)
        return other

    def extend(self, items: Iterable[Item]) -> None:
        """Add items appended to the history (in seq order)."""
        # Gathered in lists and joined once: a tuple grown item by item would cost
        # quadratic time for a tool called a thousand times.
        grown: dict[str, dict[Any, list[int]]] = {"name": {}, "output": {}, "command": {}, "success": {}, "unlined": {}}
        for item in items:
            span = parse_completion(item.metadata.get(COMPLETES, "")) if item.metadata else None
            if span is not None:
                self.completions = (*self.completions, Completion(span[0], span[1], item.seq))
            if item.role is Role.ASSISTANT:
                for call in item.tool_uses:
                    self._calls[call.id] = (item.seq, call)
                continue
            result = item.tool_result
            if result is None or result.tool_use_id not in self._calls:
                continue
            call_seq, call = self._calls[result.tool_use_id]
            seen = _observations.get((item, call, self._tools), partial(self._observe, item, call_seq, call))
            self.by_seq[item.seq] = seen
            self._answers[result.tool_use_id] = item.seq
            for read in seen.reads:
                if read.span is not None:
                    self._read_spans(read.path).add(item.seq, read.span)
                else:
                    grown["unlined"].setdefault(read.path, []).append(item.seq)
            for path in seen.moves_lines:
                grown["name"].setdefault(posixpath.basename(path.rstrip("/")), []).append(item.seq)
            grown["output"].setdefault(seen.output_hash, []).append(item.seq)
            grown["command"].setdefault((seen.tool, seen.command.strip()), []).append(item.seq)
            if not seen.failed and seen.check is not None:
                grown["success"].setdefault(seen.check.family, []).append(item.seq)
            if seen.unknown:
                self._unknown.append(item.seq)
            if seen.shell_state:
                self._shell_state.append(item.seq)
        for index, kind in (
            (self._by_name, "name"),
            (self._by_output, "output"),
            (self._by_command, "command"),
            (self._successes, "success"),
            (self._unlined, "unlined"),
        ):
            for key, seqs in grown[kind].items():
                index[key] = (*index.get(key, ()), *seqs)

    def _read_spans(self, path: str) -> ReadSpans:
        """The spans read of `path`, to add one to: shared with another index only while
        this one sees them all (a copy that went another way gets its own)."""
        spans, count = self._spans.get(path, (None, 0))
        if spans is None or len(spans) != count:
            spans = ReadSpans() if spans is None else spans.copy(count)
        self._spans[path] = (spans, count + 1)
        return spans

    def _observe(self, item: Item, call_seq: int, call: ToolUseBlock) -> Observation:
        result = item.tool_result
        assert result is not None
        found = self._effects_of(item, call)
        text = "\n".join(p.text for p in result.content if isinstance(p, TextBlock))
        return Observation(
            seq=item.seq,
            call_seq=call_seq,
            tool=call.name,
            call_id=call.id,
            command=found.command or f"{call.name}({call.input_json})",
            reads=found.reads,
            writes=found.writes,
            moves_lines=tuple(w for w in found.writes if w not in found.in_place),
            unknown=found.unknown,
            listing=found.listing,
            shell_state=found.shell_state or (found.unknown and not self._is_shell(call)),
            failed=result.is_error or _FAILURE.search(text) is not None,
            stopped=stopped_short(text),
            check=self._check_of(item, call),
            version=item.source.version if item.source is not None else "",
            is_error=result.is_error,
            output_hash=item.content_hash,
        )

    def _check_of(self, item: Item, call: ToolUseBlock) -> Check | None:
        spec = self._tools.get(call.name)
        arguments = _arguments(call)
        if self._is_shell(call) and spec is not None:
            command = arguments.get(spec.command_arg) if arguments else None
            return shell_check(command) if isinstance(command, str) else None
        declared = item.tool_effect.source_arg if item.tool_effect is not None else ""
        return tool_check(call.name, arguments, declared or (spec.source_arg if spec is not None else ""))

    def _effects_of(self, item: Item, call: ToolUseBlock) -> Effects:
        declared, spec = item.tool_effect, self._tools.get(call.name)
        kind = declared.kind.value if declared is not None else spec.effect if spec is not None else None
        arg = declared.source_arg if declared is not None else spec.source_arg if spec is not None else ""
        arguments = _arguments(call)
        if kind == ToolEffectKind.SHELL.value and spec is not None:
            command = arguments.get(spec.command_arg) if arguments else None
            if not isinstance(command, str):
                return UNKNOWN
            return replace(effects(command), command=command)  # unknown effects, a known command
        if kind == ToolEffectKind.PURE.value:
            return Effects(command=_call_text(call))
        if kind in (ToolEffectKind.READ.value, ToolEffectKind.WRITE.value):
            source = item.source.uri if item.source is not None else arguments.get(arg) if arguments else None
            if not isinstance(source, str) or not source:
                return UNKNOWN
            if kind == ToolEffectKind.READ.value:
                return Effects(reads=(Read(source, WHOLE),), command=_call_text(call))
            return Effects(writes=(source,), command=_call_text(call))
        return Effects(unknown=True, command=_call_text(call))  # volatile or undeclared

    # ---------------------------------------------------------- questions

    def same_output(self, output_hash: str) -> tuple[int, ...]:
        """Seqs of the observations that returned exactly this, in order."""
        return self._by_output.get(output_hash, ())

    def reads_covering(self, path: str, span: Span, after: int, until: int) -> Iterator[Observation]:
        """The observations in seqs (`after`, `until`], in order, that may have read the lines
        `span` of `path` (WHOLE: the whole file) again: every one that read them (by a read
        whose span covers them), and some that did not (spans.py), each once."""
        spans, count = self._spans.get(path, (None, 0))
        if spans is None:
            return
        last = 0
        for seq in spans.covering(count, after, until, span):
            if seq != last:  # one observation may read the path twice
                last = seq
                yield self.by_seq[seq]

    def reads_within(self, path: str, span: Span) -> Iterator[int]:
        """Seqs of the observations, in order, that may have read no more of `path` than the
        lines `span` (WHOLE: the whole file): every one whose read `span` covers, and some
        it does not (spans.py); one may come twice."""
        spans, count = self._spans.get(path, (None, 0))
        return iter(()) if spans is None else spans.covered_by(count, span)

    def unlined(self, path: str) -> tuple[int, ...]:
        """Seqs of the observations that read some of `path`, not by line numbers (a search, a
        tail), in order: only a read of the whole file shows what they showed again."""
        return self._unlined.get(path, ())

    def shell_unchanged_until(self, after: int) -> int:
        """The last seq up to which nothing after seq `after` may have changed the shell's
        directory or variables (the first call that may have; the last seq there can be)."""
        i = bisect.bisect_right(self._shell_state, after)
        return self._shell_state[i] if i < len(self._shell_state) else LAST_SEQ

    def next_run(self, seen: Observation) -> Observation | None:
        """The next call of the same tool with the same command (or arguments)."""
        return self._next(self._by_command.get((seen.tool, seen.command.strip()), ()), seen.seq)

    def answer(self, call_id: str) -> Observation | None:
        """The observation answering tool call `call_id` (None before its result is appended)."""
        seq = self._answers.get(call_id)
        return self.by_seq[seq] if seq is not None else None

    def next_fix(self, failed: Observation) -> Observation | None:
        """The first later call that ran the failed call's check again, or one covering it,
        and did not fail (checks.py): evidence about the failure itself."""
        if failed.check is None:
            return None
        seqs = self._successes.get(failed.check.family, ())
        for seq in seqs[bisect.bisect_right(seqs, failed.seq) :]:
            later = self.by_seq[seq]
            if later.check is not None and covers(later.check, failed.check):
                return later
        return None

    def _next(self, seqs: tuple[int, ...], after: int) -> Observation | None:
        i = bisect.bisect_right(seqs, after)
        return self.by_seq[seqs[i]] if i < len(seqs) else None

    def unknown_between(self, after: int, before: int) -> bool:
        """Whether a call between seqs `after` and `before` (exclusive) had unknown effects."""
        return _between(self._unknown, after, before)

    def shell_changed_between(self, after: int, before: int) -> bool:
        """Whether a call between seqs `after` and `before` (exclusive) may have changed the
        shell's directory or variables (what a relative path means)."""
        return _between(self._shell_state, after, before)

    def _is_shell(self, call: ToolUseBlock) -> bool:
        spec = self._tools.get(call.name)
        return spec is not None and spec.effect == ToolEffectKind.SHELL.value

    def may_have_moved_lines(self, path: str, after: int, before: int) -> bool:
        """Whether anything between seqs `after` and `before` (exclusive) may have moved
        the lines of `path`: a write of a file of that name (by any path to it) other
        than a line-for-line substitution, or a call whose effects are unknown."""
        if self.unknown_between(after, before):
            return True
        name = posixpath.basename(path.rstrip("/"))
        return _between(self._by_name.get(name, ()), after, before)


_FAILURE = re.compile(  # what an output says of a failure, whatever the flag (not every agent sets it)
    r"<returncode>\s*[1-9]\d*\s*</returncode>|No such file or directory|Is a directory|Permission denied|"
    r"cannot open|can't read|command not found",
)


def _between(seqs: Sequence[int], after: int, before: int) -> bool:
    i = bisect.bisect_right(seqs, after)
    return i < len(seqs) and seqs[i] < before


def _arguments(call: ToolUseBlock) -> dict[str, Any] | None:
    try:
        parsed = json.loads(call.input_json)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _call_text(call: ToolUseBlock) -> str:
    return f"{call.name}({call.input_json})"
