"""Logs and test output: what went wrong stays, the routine goes.

Kept verbatim: the first and last lines (what ran, how it ended); every
line naming an error or a failure with a little context (20 of each shape,
then its last); each warning once per shape, then its last; tracebacks as
the exception, the first frame and the frames in the user's own code (not
the standard library or installed packages);
test runners' failing test ids, failure headers, assertion details and
summaries; lines that mention the focus; one line of each long run of alike
lines left out (what kind of lines went). Repeated lines are folded with
their count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence

from contextd.engine.compress.text import Compressed, Focus, Kept, Lines, fold_repeats, shape

_WARNING_WORDS = ("warn", "warning", "warnings")
_WARNING_SUFFIXES = ("warning", "deprecated", "deprecation")
_CARET = re.compile(r"^\s*\^+\s*$")
_MARKUP = re.compile(r"^\s*(?:</?[\w-]+>)+\s*$")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^(\s*)File "([^"]+)", line \d+')
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen |importlib|/usr/lib/|\\lib\\")

# Test runners.
_TEST_ID = re.compile(r"^(?:FAILED|ERROR|XPASS|XFAIL)\s+\S|::\S+\s+(?:FAILED|ERROR)\b|^--- FAIL|^FAIL[: ]|^not ok\b")
_SECTION = re.compile(r"^(?:=|-){3,} .* (?:=|-){3,}\s*$")
_FAILURE = re.compile(r"^_{3,} .* _{3,}\s*$")
_DETAILS_HEAD, _DETAILS_TAIL = 12, 4
"""Assertion detail lines (``E ...``) shown per failure: the first ones and the last."""
_LOCATION = re.compile(r"^\S+:\d+:(?: |$)")
"""A frame's location in a test runner's report: ``path:12: in name`` (short), ``path:12: ValueError``
where it was raised, ``path:12: `` with nothing after it (pytest's long report)."""
_JEST_SOURCE = re.compile(r"^\s*>\s*\d+\s*\|")
_JEST_FRAME = re.compile(r"\(?[^\s()]+:\d+:\d+\)?$")
_RAISED = re.compile(r":\d+: [A-Z][\w.]*\s*$")
_FAILING_SOURCE = re.compile(r"^>\s")
_ID_STARTS = frozenset("FEXn-")
"""First characters of a failing test's line (FAILED, ERROR, XPASS, not ok, --- FAIL)."""
_PROGRESS = re.compile(r"^\S+ [.sxXFE]+\s*(?:\[\s*\d+%\])?\s*$")
_SUMMARY = re.compile(
    r"\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected)\b|^(?:OK|FAILED)\b"
)

_HEAD, _TAIL = 2, 3
_ALIKE_RUN = 8
"""Lines left out in a row, most of them alike, of which one is kept (`_samples`)."""
_CONTEXT_BEFORE, _BLOCK_AFTER = 1, 8
_SAME_SHAPE_KEPT = 20
"""An error of one shape (the same line but for its numbers) is shown this many times, then its
last; a warning once, then its last."""


def compress_log(text: str, focus: Focus, *, kind: str = "log", first_line: int = 1) -> Compressed:
    """`kind`: ``log``, ``test`` (a test runner's output), or ``text`` (lines no other
    compressor reads, read the same way)."""
    found = Lines(text)
    lines = found.lines
    kept = Kept(lines, first_line)
    focus = focus.selective(found)
    managed = _tracebacks(found, kept) if _TRACEBACK in text else set()
    if kind == "test" or "::" in text or " passed" in text:
        managed |= _tests(lines, kept)
    kept.add(*focus.lines_mentioning(found), *focus.lines_read(first_line, len(lines)))
    errors = found.reporting_errors()
    errors.update(found.line_of(i + 1) for i in _offsets(text, "\nE "))
    errors.update(i for i in found.holding("^") if _CARET.match(lines[i]))
    warnings = set(found.having(_WARNING_WORDS, fold_case=True)) | set(
        found.having(_WARNING_SUFFIXES, fold_case=True, suffix=True)
    )
    kept.add(*(i for i in found.holding("<") if _MARKUP.match(lines[i])))
    shown_shapes: dict[bytes, list[int]] = {}
    for i in sorted((errors | warnings) - managed):
        seen = shown_shapes.setdefault(shape(lines[i]), [])
        seen.append(i)
        if i in errors and len(seen) <= _SAME_SHAPE_KEPT:
            # The line before, and the error's block after it (a compiler's location,
            # source and annotations run to the next blank line).
            kept.add(*(j for j in range(i - _CONTEXT_BEFORE, i) if j not in managed), i)
            kept.add(*_block_after(lines, i, managed))
        elif len(seen) <= 1:
            kept.add(i)
    for seen in shown_shapes.values():
        kept.add(seen[-1])  # how it stood at the end
    kept.add(*_nonblank(lines, range(len(lines)), 1 if kind == "test" else _HEAD))
    kept.add(*_nonblank(lines, range(len(lines) - 1, -1, -1), _TAIL))
    fold_repeats(kept)
    sampled = _samples(kept) if kind != "test" else 0  # a test run's routine lines are passes: its summary counts them
    said = [_said(errors, kept, "error"), _said(warnings - errors, kept, "warning")]
    if sampled:
        said.append("one line of each long run of alike lines")
    said.append("failing tests and the summary" if kind == "test" else "the first and last lines")
    summary = f"{len(kept.keep):,} of {len(lines):,} lines kept: " + ", ".join(s for s in said if s)
    return Compressed(kind, kept.write(), summary, lossless=kept.whole)


def _samples(kept: Kept) -> int:
    """In each run of `_ALIKE_RUN` or more lines left out, most of them alike (the same first word
    but for its digits: ``Requirement already satisfied: ...``, ``Compiling foo v1.2 ...``), one
    of them is kept, so the view says what kind of lines went, not only how many
    (where pip installs, what a build compiles). Returns the lines kept so."""
    lines, keep, folded = kept.lines, kept.keep, kept.folded
    added, i, n = 0, 0, len(lines)
    while i < n:
        if i in folded:  # a repeated line, said with its count
            i = folded[i][0]
            continue
        if i in keep:
            i += 1
            continue
        j = i
        while j < n and j not in keep and j not in folded:
            j += 1
        if j - i >= _ALIKE_RUN:
            heads = run_heads(lines[i:j])
            head, count = Counter(heads).most_common(1)[0]
            if head and 2 * count >= j - i:
                kept.add(i + heads.index(head))
                added += 1
        i = j
    return added


def run_heads(lines: Sequence[str]) -> list[str]:
    """Each line's first word without its digits (``Compiling``, ``[INFO]``) when more follow and
    it is a word, else "": a timestamp or a counter first says nothing of what kind of line it
    is. `lines` hold no line break. Read at C speed, as the lines of a long output are many: the
    first words found in one pass, their digits taken out in one, each distinct one judged once."""
    if not lines:
        return []
    firsts = _FIRST_OF_TWO.findall("\n".join(lines))  # one a line: "" for a line of fewer than two words
    heads = "\n".join(firsts).translate(_NO_DIGITS).split("\n")
    judged = {head: head if _WORDLIKE.search(head) else "" for head in set(heads)}
    return list(map(judged.__getitem__, heads))


_NO_DIGITS = str.maketrans("", "", "0123456789")
_WORDLIKE = re.compile(r"[A-Za-z]{2}")
_FIRST_OF_TWO = re.compile(r"^[^\S\n]*(\S+)[^\S\n]+\S|^", re.MULTILINE)
"""A line's first word when another follows (`\\s` is `str.split`'s whitespace, character for
character), else nothing: one match at each line's start."""


def _said(found: set[int], kept: Kept, what: str) -> str:
    """What the header says of the lines of a kind: only what the kept lines show (a claim such as
    "each warning once" would be false of a warning also kept as an error's context)."""
    if not found:
        return ""
    shown = len(found & kept.keep)
    if shown == len(found):
        return f"every {what} line"
    return f"{shown:,} of {len(found):,} {what} lines"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block_after(lines: Sequence[str], i: int, managed: set[int]) -> list[int]:
    """The lines after an error line, up to the next blank one (at most `_BLOCK_AFTER`)."""
    out: list[int] = []
    for j in range(i + 1, min(len(lines), i + 1 + _BLOCK_AFTER)):
        if not lines[j].strip() or j in managed:
            break
        out.append(j)
    return out


def _jest(line: str) -> bool:
    """A line of a JavaScript test runner's failure report (jest, vitest): a failed test (✕),
    a failure's header (●), what was expected and received, the failing source line, a stack
    frame in the user's code."""
    stripped = line.strip()
    return (
        stripped.startswith(("✕", "×", "●", "Expected:", "Received:", "Expected ", "Received "))
        or _JEST_SOURCE.match(line) is not None
        or (stripped.startswith("at ") and _JEST_FRAME.search(stripped) is not None and "node_modules" not in stripped)
    )


def _nonblank(lines: Sequence[str], order: range, count: int) -> list[int]:
    """The first `count` lines with something on them, in `order`."""
    out: list[int] = []
    for i in order:
        if lines[i].strip():
            out.append(i)
            if len(out) == count:
                break
    return out


def _offsets(text: str, needle: str) -> Iterator[int]:
    i = text.find(needle)
    while i != -1:
        yield i
        i = text.find(needle, i + 1)


def _tracebacks(found: Lines, kept: Kept) -> set[int]:
    """Keep what each Python traceback says: the exception, the first frame and the frames in
    the user's own code; return the lines the tracebacks span (decided here, not by context)."""
    lines = found.lines
    managed: set[int] = set()
    for start in sorted(found.having([_TRACEBACK])):
        if start in managed or lines[start].strip() != _TRACEBACK:
            continue
        frames: list[tuple[int, bool]] = []  # (line, in library code)
        margin = _indent(lines[start])  # a logger may indent the whole traceback
        i = start + 1
        while i < len(lines) and (_indent(lines[i]) > margin or not lines[i].strip()):
            match = _FRAME.match(lines[i])
            if match:
                frames.append((i, bool(_LIBRARY.search(match.group(2)))))
            i += 1
        # The exception: the first line back at the traceback's margin, and its continuation.
        end = i
        while end < len(lines) and end - i < 4 and lines[end].strip():
            end += 1
        kept.add(start)
        kept.add_range(i, end)
        chosen = {frames[0][0], frames[-1][0]} if frames else set()
        chosen.update(line for line, library in frames if not library)
        for frame in chosen:
            kept.add(frame)
            source = frame + 1
            if source < i and not _FRAME.match(lines[source]):
                kept.add(source)
                # A caret line under the source (Python 3.11+) points at the failing expression.
                if source + 1 < i and set(lines[source + 1].strip()) <= {"^", "~"} and lines[source + 1].strip():
                    kept.add(source + 1)
        managed.update(range(start, end))
    return managed


def _tests(lines: Sequence[str], kept: Kept) -> set[int]:
    """Test runners: failing ids, section rules and summaries (progress lines where something
    failed when no id is named); in each failure's report (pytest's ``____ name ____`` sections), what failed and
    where: the failing source line, the assertion details, the locations in the user's own code
    and where it was raised. Return the lines of those reports (decided here, not by context)."""
    managed: set[int] = set()
    section: list[int] = []
    progress: list[int] = []
    ids: list[int] = []

    def close() -> None:
        details = [i for i in section if lines[i].startswith("E ")]
        kept.add(*details[:_DETAILS_HEAD], *details[-_DETAILS_TAIL:])
        # Frame by frame (each ends at its location, ``path:12:`` and what was raised there or
        # which function it is in): where it was raised, and every frame in the user's own code,
        # each with its failing source line and its location, never one without the other.
        sources: list[int] = []
        for i in section:
            if _FAILING_SOURCE.match(lines[i]):
                sources.append(i)
            elif _LOCATION.match(lines[i]):
                if not _LIBRARY.search(lines[i]) or _RAISED.search(lines[i]):
                    kept.add(*sources, i)
                sources = []
        kept.add(*sources)  # a source line whose location the report does not give
        managed.update(section)
        section.clear()

    for i, line in enumerate(lines):
        head = line[:3]
        failure = head == "___" and _FAILURE.match(line)
        if failure or (head in ("===", "---") and _SECTION.match(line)):
            if section:
                close()
            kept.add(i)
            if failure:
                section.append(i)
            continue
        if section:
            section.append(i)
            continue
        if line.endswith(("%]", ".", "F", "E")) and _PROGRESS.match(line):
            marks = line.split(" ", 1)[1]
            if "F" in marks or "E" in marks:
                progress.append(i)
            continue
        failing = (line[:1] in _ID_STARTS or "::" in line) and _TEST_ID.search(line)
        summary = (" passed" in line or " failed" in line or " error" in line or line[:2] in ("OK", "FA")) and (
            _SUMMARY.search(line)
        )
        if failing:
            ids.append(i)
        if failing or summary or _jest(line):
            kept.add(i)
    if section:
        close()
    if not ids:
        kept.add(*progress)  # no failing test named: the files where something failed, at least
    return managed
