"""What a command's output says of how it ended, read the same way for any agent.

Agent frameworks wrap a command's output in their own tags (``<returncode>``,
``<output>``, ``<output_head>``, ``<elided_chars>``, ``<output_tail>``,
``<warning>``): those are the framework speaking, never the command, so no
summary line is chosen among them. A failure that a later run answers keeps
its own evidence (`failure_residue`): the exception and where it was raised,
the first error lines with their context, the lines naming the files
involved, and how it ended, each run of left-out lines said by a marker so
that two fragments never read as one block. A command that was stopped (a
timeout, a kill) did not fail: its output is partial (`stopped_short`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from contextd.engine.compress.text import Kept
from contextd.engine.patterns import compile_linear
from contextd.engine.shell_words import number

_WRAPPER = re.compile(r"</?(?:returncode|output|output_head|output_tail|elided_chars|warning|exit_code|stdout|stderr)>")
_WRAPPER_LINE = re.compile(
    rf"^\s*(?:{_WRAPPER.pattern}\s*)+$"  # tags alone
    r"|^\s*<(returncode|exit_code)>\s*-?\d+\s*</\1>\s*$"  # the exit status (a residue's header says it)
)
# RE2 (linear): with Python's `re`, each opening tag without a closing one would scan to the
# end again, quadratic in an output full of them.
_FRAMEWORK_BLOCK = compile_linear(r"(?s)<warning>.*?</warning>")
"""The framework's own note to the agent (an output too long ...), not the command's."""
# The two scans below read every output of a session once (a first render reads them all):
# RE2, a scan at a few ns a character, where Python's `re` tries the pattern at every
# position (`\b` and the folded case leave it no first character to look for), about 60
# ns a character, as long as tokenising the output. RE2's `\b`, `\d` and `\s` are ASCII
# ones, as exit statuses and these words are.
_STATUS = compile_linear(
    r"(?i)<returncode>\s*(-?\d+)\s*</returncode>|<exit_code>\s*(-?\d+)\s*</exit_code>"
    r"|\bexit(?:ed with)?(?: code| status)[: ]+(-?\d+)|\bExit code:? (-?\d+)"
)
_STOPPED_STATUS = frozenset({124, 137, 143, -9, -15})
"""``timeout``'s own exit, and a process killed (SIGKILL, SIGTERM) as a shell or Python reports it."""
# Blanks, not \s: `^\s*` would run from every line start across all the blank lines after it.
_STOPPED = compile_linear(r"(?im)\btimed out\b|^[ \t]*Killed[ \t]*$|\bTimeoutExpired\b")
_RUNNER_SUMMARY = re.compile(
    r"\b\d+ (?:passed|failed|errors?)\b|^Ran \d+ tests? in|^(?:OK|FAILED)\b(?: \(.*\))?\s*$"
    r"|^test result: |^(?:ok|FAIL)\s+\S+\s+[\d.]+s|^Tests?:\s+\d+|\bFound \d+ errors?\b|^Success: no issues",
    re.MULTILINE,
)


def exit_status(text: str) -> int | None:
    """The exit status the output reports (the framework's ``<returncode>``, "exit code N")."""
    match = _STATUS.search(text)
    if match is None:
        return None
    return number(next(g for g in match.groups() if g is not None))


def stopped_short(text: str) -> bool:
    """Whether the command was stopped before its end (timed out, killed): what it shows is
    partial, and says nothing of whether it would have failed."""
    status = exit_status(text)
    return (status is not None and status in _STOPPED_STATUS) or _STOPPED.search(text) is not None


def command_lines(text: str) -> list[str]:
    """The output's own lines with something on them: the framework's tags and notes left out."""
    body = _FRAMEWORK_BLOCK.sub("\n", text)
    return [line for line in (_WRAPPER.sub("", raw).strip() for raw in body.splitlines()) if line]


def summary_line(text: str) -> str:
    """The line that says how a run ended: a test runner's or checker's summary when there is
    one (``3 failed, 41 passed in 2.1s``), else the output's last line."""
    lines = command_lines(text)
    found = next((line for line in reversed(lines) if _RUNNER_SUMMARY.search(line)), None)
    if found is not None:
        return found  # (the last: read from the end, as a run's summary closes it)
    return lines[-1] if lines else "(no output)"


# ------------------------------------------------------------ the residue

_ERROR = re.compile(
    r"error|exception|traceback|fail|fatal|panic|denied|not found|no such|cannot|can't|undefined|invalid|"
    r"assert|expected|received|npm ERR!|unresolved|conflict|rejected|"
    r"^E\s|^\s*\+\s+where\b|^\s*-->\s|^\s*(left|right)\b\s*:|^\s*\w+_test\.go:\d+:|\bwant\b",
    re.IGNORECASE,
)
_TRACEBACK = re.compile(r"^(\s*)Traceback \(most recent call last\):")
_PY_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_LOCATION = re.compile(r'(?:^|[\s("\'])((?:[\w.-]+/)*[\w.-]+\.[A-Za-z]\w*):(\d+)')
"""``src/app.py:41``, ``main.rs:4:5``: a file and a line."""
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen |importlib|/usr/lib/|node_modules|\\lib\\")
_FIRST_ERRORS, _CONTEXT_BEFORE, _CONTEXT_AFTER = 3, 1, 2
_LOCATIONS = 6
MAX_LINES = 30
"""A residue shows at most this many of the output's lines."""


def failure_residue(text: str, limit: int = MAX_LINES) -> str:
    """The output's own evidence of its failure, its lines verbatim and each run of left-out
    lines said by a marker: what was raised and where (each traceback's exception, its last
    frame and the last in the project's own code), the first error lines with their context,
    the lines naming the files involved, and the last line (how it ended). At most `limit`
    lines, chosen in that order."""
    lines = text.split("\n")
    wanted: list[Sequence[int]] = list(_tracebacks(lines))
    errors = [
        i
        for i, line in enumerate(lines)
        if _ERROR.search(line) and _own(lines, i) and not (_TRACEBACK.match(line) or _PY_FRAME.match(line))
    ]
    for i in errors[:_FIRST_ERRORS]:
        wanted.append([j for j in range(i - _CONTEXT_BEFORE, i + _CONTEXT_AFTER + 1) if _own(lines, j)])
    located = [i for i, line in enumerate(lines) if _own(lines, i) and _project_location(line)]
    wanted.extend([i] for i in located[:_LOCATIONS])
    last = next((i for i in range(len(lines) - 1, -1, -1) if _own(lines, i)), None)
    if last is not None:
        wanted.append([last])
    if errors:
        wanted.append([errors[-1]])
    kept = Kept(lines)
    for group in wanted:
        fresh = [i for i in group if i not in kept.keep]
        if len(kept.keep) + len(fresh) > limit:
            continue  # a group whole or not at all: a frame without its source says little
        kept.add(*fresh)
    return kept.write() if kept.keep else ""


def last_error(text: str) -> str:
    """The output's last line naming an error (how the failure ended), or ""."""
    lines = text.split("\n")
    found = (lines[i] for i in range(len(lines) - 1, -1, -1) if _ERROR.search(lines[i]) and _own(lines, i))
    return next(found, "").strip()


def _own(lines: Sequence[str], i: int) -> bool:
    """Whether line `i` exists and is the command's own (not blank, not a framework tag)."""
    return 0 <= i < len(lines) and bool(lines[i].strip()) and not _WRAPPER_LINE.match(lines[i])


def _project_location(line: str) -> bool:
    match = _PY_FRAME.match(line) or _LOCATION.search(line)
    return match is not None and not _LIBRARY.search(line)


def _tracebacks(lines: Sequence[str]) -> list[list[int]]:
    """Per Python traceback, in order: its first line with the exception, then the frame it was
    raised in and the last frame in the project's own code (the root cause to open), each with
    its source line."""
    groups: list[list[int]] = []
    for start, line in enumerate(lines):
        head = _TRACEBACK.match(line)
        if head is None:
            continue
        margin = len(head.group(1))
        frames: list[int] = []
        i = start + 1
        while i < len(lines) and (len(lines[i]) - len(lines[i].lstrip()) > margin or not lines[i].strip()):
            if _PY_FRAME.match(lines[i]):
                frames.append(i)
            i += 1
        exception = [j for j in range(i, min(i + 3, len(lines))) if _own(lines, j)][:1]
        groups.append([start, *exception])
        chosen = frames[-1:] + [f for f in reversed(frames) if not _LIBRARY.search(lines[f])][:1]
        for frame in dict.fromkeys(chosen):
            source = frame + 1
            has_source = source < i and not _PY_FRAME.match(lines[source]) and lines[source].strip()
            groups.append([frame, source] if has_source else [frame])
    return groups
