"""Search results (grep, rg, git grep): every file named with its count, the lines that matter.

Kept verbatim: every line that defines or mentions a symbol of the focus
(or of the search itself, when few lines do), the matches that report a
failure where few do (the one FAILED among a run's PASSED lines: a rare
failure is the anomaly, a search for "error" is not), and one line for each
distinct text the matches hold, with how many more places hold the same
text (a call repeated across files is read once); context lines
(``-A``/``-B``) go with the match they surround. Every file stays, by
directory, with its count of matches, so where the pattern occurs is never
lost (directories alike but for one part of their path, each locale of a
catalogue say, share one line that names each); the other lines are one
Retrieve away.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from contextd.engine.compress.text import Compressed, Focus, Lines, Remembered

_DEFINES = (
    r"(?:\b(?:def|class|function|func|fn|struct|interface|type|const|let|var|enum|trait|impl)\s+{name}\b"
    r"|\b{name}\s*(?::[^=]*)?=[^=])"
)
"""A line that defines `name`: a definition keyword before it, or an assignment to it."""
SAMPLES = 12
"""Distinct match texts shown beyond those the focus asks for (those most places hold)."""
RARE = 0.1
"""The share of the matches that failures may be and still be kept, each of them, as anomalies."""


@dataclass(slots=True)
class _File:
    path: str
    matches: int = 0


def _parse(line: str) -> tuple[str, bool, str] | None:
    """(path, a match rather than context, the matched text) of a result line; None for others.
    Read by finding separators, not by a pattern that could backtrack over a long line (a match
    in a minified file is one line of 100 KB). A match in a binary file, which grep reports as a
    message rather than a line (``grep: PATH: binary file matches``; ``Binary file PATH matches``
    before GNU grep 3.5), is a match in that file like any other."""
    binary = _binary_match(line)
    if binary:
        return binary, True, _BINARY_MATCH
    colon = line.find(":")
    if colon > 0:
        path = line[:colon]
        rest = line[colon + 1 :]
        number, sep, text = rest.partition(":")
        if "/" in path or "." in path:
            if " " not in path and not path[0].isdigit():
                return (path, True, text) if sep and number.isdigit() else (path, True, rest)
            if sep and number.isdecimal():
                return path, True, text  # a path with spaces: only with a line number after it
    if "-" in line:
        # A context line (grep -A/-B/-C): ``path-12-text``. The path holds no space nor colon;
        # it ends at the first ``-12-`` after its last dot or slash (the file name's), else
        # after the one before (``logs/2024-01-15/app.log-12-``: not ``logs/2024``).
        blank = _BLANK.search(line)
        stop = blank.start() if blank else len(line)
        dots = [m.start() for m in _DOT.finditer(line, 0, stop)]
        end = stop
        for dot in reversed(dots):
            found = _NUMBERED.search(line, dot + 1, end)  # (a -12- holds no dot: it ends before the next)
            if found is not None:
                return line[: found.start()], False, line[found.end() :]
            end = dot
    return None


def _binary_match(line: str) -> str:
    """The path of a binary file a grep line says matched; "" for any other line."""
    for before, after in _BINARY_FORMS:
        if line.startswith(before) and line.endswith(after) and len(line) > len(before) + len(after):
            return line[len(before) : -len(after)]
    return ""


_BINARY_MATCH = "binary file matches"
_BINARY_FORMS = (("grep: ", ": " + _BINARY_MATCH), ("Binary file ", " matches"))
_BLANK = re.compile(r"[\s:]")
_DOT = re.compile(r"[./]")
_NUMBERED = re.compile(r"-(\d+)-")


def _folded(listings: dict[str, str]) -> list[tuple[str, str]]:
    """Directories whose files and counts are the same and whose paths differ in one part only
    (``locale/de/LC_MESSAGES``, ``locale/fr/LC_MESSAGES`` ...) on one line, with that part in
    braces: every directory is still named. A path with a brace or a comma of its own, or an
    empty part, is left as it is (the braces would not say it plainly)."""
    groups: dict[tuple[str, int, tuple[str, ...]], list[str]] = {}
    for directory, listed in listings.items():
        parts = directory.split("/")
        if not directory or any(not part or _BRACES & set(part) for part in parts):
            continue
        for at in range(len(parts)):
            groups.setdefault((listed, at, (*parts[:at], *parts[at + 1 :])), []).append(directory)
    folded: dict[str, tuple[str, str]] = {}
    for (listed, at, rest), members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        members = [m for m in members if m not in folded]
        if len(members) < FOLD_AT:
            continue
        varying = ",".join(m.split("/")[at] for m in members)
        pattern = "/".join((*rest[:at], "{" + varying + "}", *rest[at:]))
        for m in members:
            folded[m] = (pattern, listed)
    out: dict[tuple[str, str], None] = {}  # in the order the search found them, each line once
    for directory, listed in listings.items():
        out[folded.get(directory, (directory, listed))] = None
    return list(out)


_BRACES = frozenset("{},")
FOLD_AT = 3
"""Directories alike in all but one part of their path that share one line."""


def looks_like_search(lines: Sequence[str]) -> bool:
    nonblank = [line for line in lines if line.strip() and line != "--"]
    if len(nonblank) < 4:
        return False
    return sum(1 for line in nonblank if _parse(line)) >= 0.8 * len(nonblank)


@dataclass(frozen=True, slots=True)
class _Results:
    """What a search's output says whatever the focus."""

    texts: dict[int, str]
    """Result line -> the text it matched (or surrounds, for a context line)."""
    matches: frozenset[int]
    count: int
    """Of matches."""
    files: int
    loose: tuple[int, ...]
    """Lines that are no result."""
    failures: frozenset[int]
    """Matches that report a failure."""
    groups: tuple[tuple[int, ...], ...]
    """The matches of each distinct text, the texts most places hold first."""
    per_file: tuple[str, ...]
    """Every file with its count of matches, by directory."""


def _results(found: Lines) -> _Results | None:
    """`found` read as search results (None when no line is one); remembered by content, as an
    output is compressed again each time the focus that concerns it moves."""
    text = found.text
    if len(text) > REMEMBERED_CHARS:
        return _read_results(found)
    return READ.get(hashlib.sha256(text.encode()).digest(), lambda: _read_results(found))


READ: Remembered[_Results | None] = Remembered(64)
REMEMBERED_CHARS = 16_000
"""Search outputs up to this long are read once, 64 of them: a reading holds 5 to 25 times its
output's size (tracemalloc: a grep of 30 KB holds 143 KB, one of short lines 26 times its size),
so at most about 27 MB, counted against the memos' byte budget (`Remembered`)."""


def _read_results(found: Lines) -> _Results | None:
    files: dict[str, _File] = {}
    texts: dict[int, str] = {}
    matches: list[int] = []
    loose: list[int] = []
    for i, line in enumerate(found.lines):
        parsed = _parse(line)
        if parsed is None:
            if line.strip() and line != "--":
                loose.append(i)
            continue
        path, is_match, texts[i] = parsed
        entry = files.get(path)
        if entry is None:
            entry = files[path] = _File(path)
        if is_match:
            entry.matches += 1
            matches.append(i)
    if not files:
        return None
    # One line per distinct text, at the first place it occurs: the texts most places hold first.
    same: dict[str, list[int]] = {}
    for i in matches:
        same.setdefault(texts[i].strip(), []).append(i)
    groups = sorted(same.values(), key=lambda p: (-len(p), p[0]))
    by_directory: dict[str, list[_File]] = {}
    for entry in files.values():
        by_directory.setdefault(posixpath.dirname(entry.path), []).append(entry)
    listings = {
        directory: ", ".join(f"{posixpath.basename(e.path)} ({e.matches:,})" for e in entries)
        for directory, entries in by_directory.items()
    }
    return _Results(
        texts,
        frozenset(matches),
        len(matches),
        len(files),
        tuple(loose),
        frozenset(found.reporting_errors().intersection(matches)),
        tuple(map(tuple, groups)),
        tuple(f"{directory + '/' if directory else ''}: {listed}" for directory, listed in _folded(listings)),
    )


def compress_search(text: str, focus: Focus) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    read = _results(found)
    if read is None:
        return None
    texts, matched, failures, loose = read.texts, read.matches, read.failures, read.loose
    # Definitions of a focus name, and mentions of the focus terms few lines share.
    names = [n for n in focus.names if re.fullmatch(r"\w+", n)]
    chosen: set[int] = set()
    if names:
        defines = re.compile(_DEFINES.format(name="(?:" + "|".join(map(re.escape, names)) + ")"))
        chosen = {i for i in found.having(names) if i in texts and defines.search(texts[i])}
    chosen |= focus.selective(found).lines_mentioning(found) & texts.keys()
    rare = len(failures) <= max(SAMPLES, RARE * read.count)
    if failures and rare:
        chosen |= failures
    shown = set(chosen)
    samples = [p for p in read.groups if chosen.isdisjoint(p)][:SAMPLES]
    shown.update(places[0] for places in samples)
    repeats = {places[0]: len(places) - 1 for places in samples if len(places) > 1}
    # Context lines go with the shown match they surround.
    for i in sorted(shown):
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(lines) and j in texts and j not in matched:
                shown.add(j)
                j += step
    out = [f"[{read.count:,} matches in {read.files:,} files]"]
    previous = -2
    for i in sorted(shown):
        if i != previous + 1 and previous >= 0:
            out.append("--")
        more = repeats.get(i, 0)
        out.append(lines[i] + (f"  [the same in {more:,} more {'place' if more == 1 else 'places'}]" if more else ""))
        previous = i
    out.append("[matches per file]")
    out.extend(read.per_file)
    out.extend(lines[i] for i in loose[:5])
    if len(loose) > 5:
        more = len(loose) - 5
        out.append(f"[… {more:,} other {'line' if more == 1 else 'lines'} …]")
    which = (
        "the focus, every failure, one per distinct text" if failures and rare else "the focus, one per distinct text"
    )
    summary = f"{len(shown):,} of {len(texts):,} result lines kept ({which}), every file counted"
    return Compressed("search", "\n".join(out), summary)
