"""The built-in pruning strategies, on the evidence ladder (DESIGN section 5).

Each strategy is a transform: it proposes, citing its evidence, and the
engine decides (protection, the ladder's maximum, the evidence kept whole,
the cache). Each looks its evidence up in the session's observation index
(observations.py) rather than guessing from names:

* ``dedupe`` (level 0): a tool output byte-identical to an earlier one still
  shown in full becomes a placeholder naming it. The newer copy goes: the
  older is in the cached prefix already, and the view reads the same.
* ``same_source`` (level 1): a read of a source at a version the client
  declared, when an earlier read of the same source at the same version,
  covering it, is shown in full.

  With ``params.on_entry`` (the default policy's), either goes when it first
  enters the view, for the very call that made it (past the protection of the
  latest turns only, as the compress rule's ``on_entry`` kinds do): what it
  shows is in the view already, whole, so the call reads all of it, and
  nothing a cache holds is written twice or rewritten.
* ``supersede`` (level 2): a read of a file that a later read shows again:
  a read of the whole file, or of lines covering it with nothing between
  that may have moved its lines (a write of a file of that name other than a
  line-for-line substitution, or any call whose effects are unknown).
* ``snapshots`` (level 2): an older run of a command the policy declares a
  snapshot (a status, a test run) when the same command ran again later and
  did not fail: it keeps a one-line residue (command, exit code, and the
  run's summary line, else its last; the agent framework's tags left out).
* ``errors`` (level 2): a failed call's output, once a later run of the same
  check succeeded (the same command, or a newer run covering it: checks.py),
  keeps its residue: the command, the exit status and the output's own
  evidence of the failure (failures.py). A call stopped short (a timeout, a
  kill) did not fail: its output stays.
* ``errored_inputs`` (level 2): an assistant turn whose call failed, once a
  later run of the same check succeeded, keeps the call (id, name) with a
  JSON stand-in for its bulky input: what was left out, the error, the run
  that succeeded, the handle.
* ``completed`` (level 3): an item in a span of work the client marked
  complete (metadata ``contextd.completes: FIRST-LAST`` on the item that
  records the outcome), while the outcome is shown in full.
* ``compress`` (compress/strategy.py): not a prune but a reduced form: the output stays
  in the view with its fact lines verbatim, what was left out said by line
  range, and the handle named; what the focus names stays whole, and so does
  what the call that made the output was made for (`_reason`). Certified at
  level 0 when only repetition was folded, else 4; the policy's
  ``compression`` switch allows it whatever the maximum level.

A strategy never proposes for an item too small to be worth a placeholder
(``min_tokens``), so the certificates are not filled with refusals.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import posixpath
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from contextd.engine.failures import MAX_LINES, exit_status, failure_residue, last_error, summary_line
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import ReasoningBlock, Representation, TextBlock, ToolUseBlock
from contextd.engine.observations import LAST_SEQ, Observation, ObservationIndex
from contextd.engine.placeholders import PREFIX, describe, handle_of
from contextd.engine.shell import WHOLE, Read, covers
from contextd.engine.types import Entry, Proposal, Remove, Replace, TransformContext, prunable

log = logging.getLogger(__name__)

MIN_TOKENS = 40
"""Below this an output is about the size of the placeholder that would replace it."""


def worth(entry: Entry, params: Mapping[str, Any]) -> bool:
    return prunable(entry) and entry.tokens >= params.get("min_tokens", MIN_TOKENS)


def shown_in_full(context: TransformContext, seq: int) -> bool:
    entry = context.by_seq.get(seq)
    return entry is not None and entry.representation is Representation.FULL


class Strategy:
    """Proposes, for each candidate that is a tool output worth a placeholder, what
    `proposal` finds (or nothing)."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            seen = context.observations.by_seq.get(entry.seq)
            if seen is not None and worth(entry, params):
                found = self.proposal(context, entry, seen, params)
                if found is not None:
                    yield found

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        raise NotImplementedError

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        """What `proposal` rests on for `entry` beyond the entry itself (types.Incremental)."""
        seen = context.observations.by_seq.get(entry.seq)
        if seen is None or not worth(entry, params):
            return ()
        return self.rests_on(entry, seen, params)

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        raise NotImplementedError


def on_entry(params: Mapping[str, Any]) -> bool:
    """Whether a rule's copies go when they first enter the view (`params.on_entry`)."""
    return params.get("on_entry", False) is True


def check_on_entry(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`on_entry`: true or false."""
    return [] if isinstance(params.get("on_entry", False), bool) else [("on_entry", "must be true or false")]


class Dedupe(Strategy):
    name: ClassVar[str] = "dedupe"
    check = staticmethod(check_on_entry)

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        index = context.observations
        earlier = next(
            (s for s in index.same_output(seen.output_hash) if s < entry.seq and shown_in_full(context, s)), None
        )
        if earlier is None:
            return None
        note = f"identical to the output of call {index.by_seq[earlier].call_id} (seq {earlier})"
        return Proposal(Remove(entry.seq, True, note), 0, "duplicate", note, (earlier,), on_entry=on_entry(params))

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return (("shown output", seen.output_hash),)


class SameSource(Strategy):
    name: ClassVar[str] = "same_source"
    check = staticmethod(check_on_entry)

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        if not self._applies(seen):
            return None
        read = seen.reads[0]
        assert read.span
        earlier = next(
            (
                o
                for o in context.observations.reads_covering(read.path, read.span, 0, entry.seq - 1)
                if o.version == seen.version
                and not o.is_error
                and any(r.path == read.path and r.span and covers(r.span, read.span) for r in o.reads)
                and shown_in_full(context, o.seq)
            ),
            None,
        )
        if earlier is None:
            return None
        note = (
            f"the same version ({seen.version}) of {read.path} "
            f"as the output of call {earlier.call_id} (seq {earlier.seq})"
        )
        return Proposal(
            Remove(entry.seq, True, note), 1, "same_source", note, (earlier.seq,), on_entry=on_entry(params)
        )

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return (("covered", entry.seq),) if self._applies(seen) else ()

    @staticmethod
    def _applies(seen: Observation) -> bool:
        """A read of one source at a version the client declared, by lines, and nothing else."""
        if not seen.version or len(seen.reads) != 1 or seen.writes or seen.unknown or seen.is_error:
            return False
        return bool(seen.reads[0].span)


class Supersede(Strategy):
    name: ClassVar[str] = "supersede"

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        if not self._applies(seen):
            return None
        index = context.observations
        newer: list[Observation] = []
        for read in seen.reads:
            # A relative path means something else once the shell's directory may have changed.
            until = LAST_SEQ if posixpath.isabs(read.path) else index.shell_unchanged_until(entry.seq)
            lines = WHOLE if read.span is None else read.span  # without line numbers: a whole read only
            later = next(
                (
                    o
                    for o in index.reads_covering(read.path, lines, entry.seq, until)
                    if not o.failed and _rereads(o, read, seen, index) and shown_in_full(context, o.seq)
                ),
                None,
            )
            if later is None:
                return None
            newer.append(later)
        shown = ", ".join(f"call {o.call_id} (seq {o.seq})" for o in dict.fromkeys(newer))
        note = f"read again later by {shown}"
        return Proposal(Remove(entry.seq, True, note), 2, "superseded", note, tuple(sorted({o.seq for o in newer})))

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return (("covered", entry.seq),) if self._applies(seen) else ()

    @staticmethod
    def _applies(seen: Observation) -> bool:
        """Only an output that is the read and nothing else: no listing, no writes."""
        return bool(seen.reads) and not (seen.writes or seen.unknown or seen.listing)


def _rereads(later: Observation, read: Read, earlier: Observation, index: ObservationIndex) -> bool:
    """Whether `later` shows what `read` (part of `earlier`) showed, as it is now."""
    if not posixpath.isabs(read.path) and index.shell_changed_between(earlier.seq, later.seq):
        return False  # a relative path: the shell's directory may have changed in between
    for again in later.reads:
        if again.path != read.path or again.span is None:
            continue
        if again.span == WHOLE:
            return True  # the whole file as it is now: whatever happened in between
        if read.span is not None and covers(again.span, read.span):
            # The same lines, provided nothing moved them in between, or before the
            # later read in its own command.
            name = posixpath.basename(read.path)
            moved_by_it = any(posixpath.basename(p) == name for p in later.moves_lines)
            return not moved_by_it and not index.may_have_moved_lines(read.path, earlier.seq, later.seq)
    return False


class Snapshots(Strategy):
    name: ClassVar[str] = "snapshots"

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        if not self._applies(seen, params):
            return None
        later = context.observations.next_run(seen)
        if later is None or (later.failed and not _finished(output_text(context.by_seq[later.seq]))):
            return None  # a failed run (a timeout, a crash) may show less than the one it would replace
        return Proposal(
            Replace(entry.seq, (TextBlock(_snapshot_residue(entry, seen, later)),)),
            2,
            "snapshot",
            f"the same command ran again at seq {later.seq} (call {later.call_id})",
        )

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        """Once the command ran again, nothing: the run after an output stays the one after it
        (the history only grows), and the proposal reads what that run showed as its item holds
        it. Until then, the command's runs: an output of a command run every few calls is not
        asked about again at each of its runs for as long as it waits for the cache."""
        seen = context.observations.by_seq.get(entry.seq)
        if seen is None or not worth(entry, params) or context.observations.next_run(seen) is not None:
            return ()
        return self.rests_on(entry, seen, params)

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return (("run", seen.tool, seen.command.strip()),) if self._applies(seen, params) else ()

    @staticmethod
    def _applies(seen: Observation, params: Mapping[str, Any]) -> bool:
        command = seen.command.strip()
        return any(fnmatch.fnmatchcase(command, p) for p in params.get("commands", ()))


_FINISHED = re.compile(
    r"^=+ [^=\n]*\b(?:passed|failed)\b[^=\n]* in [\d.]+s\b[^=\n]*=+\r?$"  # pytest
    r"|^Ran \d+ tests? in [\d.]+s\r?$"  # unittest
    r"|^test result: (?:ok|FAILED)\. \d+ passed"  # cargo test
    r"|^(?:ok|FAIL)\s+\S+\s+[\d.]+s\r?$",  # go test
    re.MULTILINE,
)
_STOPPED = re.compile(
    r"^!+ .*(?:Interrupted|KeyboardInterrupt)|ERROR collecting|_FailedTest|^panic: test timed out", re.MULTILINE
)


def _finished(text: str) -> bool:
    """Whether a test run's output shows it ran to its end, whatever its tests did (a closing
    summary of tests that passed or failed, and no sign it stopped short: an interrupt, a
    module that could not be collected or loaded, a timeout): a run that exited nonzero so
    shows all that an earlier run of it did."""
    return _FINISHED.search(text) is not None and _STOPPED.search(text) is None


def output_text(entry: Entry) -> str:
    result = entry.item.tool_result
    if result is None:
        return ""
    return "\n".join(p.text for p in result.content if isinstance(p, TextBlock))


def _snapshot_residue(entry: Entry, seen: Observation, later: Observation) -> str:
    text = output_text(entry)
    status = exit_status(text)
    said = f", exit {status}" if status is not None else (", failed" if seen.is_error else "")
    return (
        f"{PREFIX} {describe(entry.item)} superseded by the same command at seq {later.seq} "
        f"(call {later.call_id}): `{_short(seen.command, 160)}`{said}; last line: {_short(summary_line(text), 200)!r}; "
        f"retrieve the whole with handle {handle_of(entry.item)}]"
    )


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Errors(Strategy):
    name: ClassVar[str] = "errors"

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        fix = _fixed(context, seen)
        if fix is None:
            return None
        held = _residues.get((entry.item,), dict)
        key = (fix.seq, params.get("max_lines", MAX_LINES))
        if key not in held:
            text = output_text(entry)
            status = exit_status(text)
            residue = (
                f"{PREFIX} {describe(entry.item)} reduced to its failure: `{_short(seen.command, 160)}`"
                + (f", exit {status}" if status is not None else "")
                + f"; {_fixed_by(fix)}; retrieve the whole with handle {handle_of(entry.item)}]"
            )
            kept = failure_residue(text, key[1])
            held[key] = Proposal(
                Replace(entry.seq, (TextBlock(f"{residue}\n{kept}" if kept else residue),)),
                2,
                "errored",
                _fixed_by(fix),
            )
            _residues.grew((entry.item,), held, (key, held[key]))
        return held[key]

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return _fix_key(seen)


_residues: IdentityMemo[dict[tuple[int, int], Proposal]] = IdentityMemo(20_000)
"""Per failed output, its residue by the fix that licenses it (the same object each render)."""


def _fixed(context: TransformContext, seen: Observation) -> Observation | None:
    """The later run that answers a failure (checks.py): the same check, covering it, that did
    not fail. None for a call that did not fail, or was stopped short (a timeout or a kill shows
    part of a run, not a failure to leave behind), or whose check has not run again."""
    if not seen.failed or seen.stopped:
        return None
    return context.observations.next_fix(seen)


def _fixed_by(fix: Observation) -> str:
    return f"the same check succeeded later, at seq {fix.seq} (call {fix.call_id})"


def _fix_key(seen: Observation) -> tuple[Hashable, ...]:
    if not seen.failed or seen.stopped or seen.check is None:
        return ()
    return (("fixed", seen.check.family),)


class ErroredInputs:
    """Level 2: the bulky input of a failed call (a script written in a heredoc that did not
    run, a patch that did not apply), once its tool has succeeded since. The call stays,
    with its id and name, so its result still answers it; its input becomes a JSON object
    saying what was left out, the error, and the handle of the whole turn."""

    name: ClassVar[str] = "errored_inputs"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        floor = params.get("min_input_chars", MIN_INPUT_CHARS)
        for entry in candidates:
            item = entry.item
            if entry.representation is not Representation.FULL or not item.tool_uses:
                continue
            if any(isinstance(b, ReasoningBlock) for b in item.content):
                continue  # signed reasoning is sent back with its calls exactly as it was
            stand_ins: dict[str, str] = {}
            successes: list[Observation] = []
            for call in item.tool_uses:
                seen = context.observations.answer(call.id)
                if seen is None or len(call.input_json) < floor:
                    continue
                fix = _fixed(context, seen)
                if fix is None:
                    continue  # not answered yet: the agent may still be on it
                answered = context.by_seq.get(seen.seq)
                error = last_error(output_text(answered)) if answered is not None else ""
                stand_ins[call.id] = json.dumps(
                    {
                        "contextd": (
                            f"input left out ({len(call.input_json):,} characters): this call failed"
                            + (f" ({_short(error, 160)})" if error else "")
                            + f"; {_fixed_by(fix)}; retrieve the whole turn with handle {handle_of(item)}"
                        )
                    }
                )
                successes.append(fix)
            if not stand_ins:
                continue
            content = tuple(
                replace(b, input_json=stand_ins[b.id]) if isinstance(b, ToolUseBlock) and b.id in stand_ins else b
                for b in item.content
            )
            where = ", ".join(f"seq {s.seq}" for s in successes)
            yield Proposal(Replace(entry.seq, content), 2, "errored_input", f"the same check succeeded later ({where})")

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        """Each call's result until it is there; then, for a failed one with a bulky input,
        a later run of its check (types.Incremental)."""
        item = entry.item
        if entry.representation is not Representation.FULL or not item.tool_uses:
            return ()
        if any(isinstance(b, ReasoningBlock) for b in item.content):
            return ()
        floor = params.get("min_input_chars", MIN_INPUT_CHARS)
        keys: list[Hashable] = []
        for call in item.tool_uses:
            seen = context.observations.answer(call.id)
            if seen is None:
                keys.append(("answer", call.id))
            elif len(call.input_json) >= floor:
                keys.extend(_fix_key(seen))
        return tuple(keys)


MIN_INPUT_CHARS = 400
"""A failed call's input shorter than this stays: its stand-in would be about as long."""


class Completed:
    """Level 3: an item inside a span of work the client marked complete, on the item that
    records its outcome (metadata ``contextd.completes: FIRST-LAST``), while that item is
    shown in full."""

    name: ClassVar[str] = "completed"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        spans = context.observations.completions
        if not spans:
            return
        for entry in candidates:
            if not worth(entry, params):
                continue
            done = next(
                (c for c in spans if c.first <= entry.seq <= c.last < c.outcome and shown_in_full(context, c.outcome)),
                None,
            )
            if done is None:
                continue
            note = f"completed work (items {done.first}-{done.last}); its outcome is recorded at seq {done.outcome}"
            yield Proposal(Remove(entry.seq, True, note), 3, "completed", note, (done.outcome,))

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return (("completions",),) if worth(entry, params) else ()
