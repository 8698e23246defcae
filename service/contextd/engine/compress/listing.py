"""Diffs and listings, folded by file and directory with counts.

A diff keeps, for every file, its header and a count of lines added and
removed; the hunks that mention the focus whole; in the others, the
changed lines (not the unchanged context), up to a share per file. A
listing (``ls -R``, ``find``, ``git status``) keeps every directory with
a few names (and, when some are left out, its count of entries by
extension), and every entry that mentions the focus. A subdirectory that
``ls -R`` lists under its own header is named there, not again in its
parent; directories tools generate (``__pycache__``, ``node_modules`` ...)
are counted, their names not listed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from contextd.engine.compress.text import Compressed, Focus, Lines

CHANGED_PER_FILE = 12
"""Changed lines shown per file outside the hunks the focus asks for."""
NAMES_PER_DIRECTORY = 6


def looks_like_diff(lines: Sequence[str]) -> bool:
    return any(line.startswith(("diff --git ", "+++ ", "@@ ")) for line in lines[:200]) and any(
        line.startswith("@@ ") for line in lines
    )


_COMMIT = re.compile(r"^commit [0-9a-f]{7,64}\b")


def compress_diff(text: str, focus: Focus) -> Compressed | None:
    lines = text.split("\n")
    headers = any(line.startswith("diff ") for line in lines)
    out: list[str] = []
    files = 0
    for kind, segment in _segments(lines, headers):
        if kind == "file":
            out.extend(_file(segment, focus))
            files += 1
        else:
            out.extend(segment)  # what is not a file's diff (a commit's header and message) stays
    summary = f"{files:,} files: headers and counts, changed lines, hunks on the focus whole"
    return Compressed("diff", "\n".join(out), summary)


def _segments(lines: list[str], headers: bool) -> list[tuple[str, list[str]]]:
    """The diff cut into files (from a ``diff`` line, or a ``---``/``+++`` pair when there are
    none) and what lies between them (a commit's header in ``git log -p``)."""
    out: list[tuple[str, list[str]]] = [("other", [])]
    for n, line in enumerate(lines):
        starts_file = (
            line.startswith("diff ")
            if headers
            else line.startswith("--- ") and n + 1 < len(lines) and lines[n + 1].startswith("+++ ")
        )
        if starts_file:
            out.append(("file", [line]))
        elif _COMMIT.match(line):
            out.append(("other", [line]))
        else:
            out[-1][1].append(line)
    return [(kind, segment) for kind, segment in out if segment]


def _file(lines: list[str], focus: Focus) -> list[str]:
    first_hunk = next((n for n, line in enumerate(lines) if line.startswith("@@")), len(lines))
    header = lines[:first_hunk]
    # A combined diff (`diff --cc`, a merge) marks each line in one column per parent.
    width = 2 if header and header[0].startswith(("diff --cc", "diff --combined")) else 1
    hunks: list[list[str]] = []
    for line in lines[first_hunk:]:
        if line.startswith("@@") or not hunks:
            hunks.append([])
        hunks[-1].append(line)

    def changed(line: str) -> bool:
        return any(c in "+-" for c in line[:width])

    added = sum(1 for h in hunks for line in h[1:] if "+" in line[:width])
    removed = sum(1 for h in hunks for line in h[1:] if "-" in line[:width])
    out = [*header, f"[{len(hunks):,} hunks, +{added:,} -{removed:,}]"]
    whole = focus.mentions("\n".join(header))  # the file the focus names: all of it
    budget = CHANGED_PER_FILE
    for hunk in hunks:
        if whole or focus.mentions("\n".join(hunk)):
            out.extend(hunk)
            continue
        changes = [line for line in hunk[1:] if changed(line)]
        shown = changes[:budget]
        budget -= len(shown)
        out.append(hunk[0])
        out.extend(shown)
        left = len(hunk) - 1 - len(shown)
        if left:
            out.append(f"[… {left:,} more lines of this hunk ({len(changes) - len(shown):,} changed) …]")
    return out


def compress_listing(text: str, focus: Focus) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    mentioned = focus.selective(found).lines_mentioning(found)
    directories: dict[str, list[str]] = {}
    focused: set[tuple[str, str]] = set()
    current = "."
    # `ls -R`: a directory's header is its path and a colon, nothing else.
    recursive = any(_is_header(line) for line in lines)
    if not recursive and not _paths(lines):
        return None  # not a listing (a search's code lines, a message): another reader's
    for i, line in enumerate(lines):
        stripped, points_to = line.strip(), ""
        if not stripped or stripped.startswith("total "):
            continue
        if recursive and _HEADER.fullmatch(stripped):
            current = stripped[:-1]
            directories.setdefault(current, [])
            continue
        long = _LONG.match(stripped)
        if long:  # `ls -l`: the name is what follows the date, its kind is the mode's first letter
            name = long.group(1)
            if name in (".", ".."):
                continue  # in every directory: no entry of its own
            name, arrow, target = name.partition(" -> ")
            if stripped[0] == "d":
                name = name.rstrip("/") + "/"  # a directory says so, as `ls -F` and `find` paths do
            stripped, points_to = name, arrow + target  # a link keeps its arrow and target
        if recursive:
            # Columns (a terminal's `ls`) are two spaces or a tab apart; a name may hold one space.
            parent, names = current, [stripped + points_to] if long else _COLUMNS.split(stripped)
        else:
            path = stripped.split()[-1] if stripped.startswith(_STATUS) else stripped
            parent, _, name = path.rstrip("/").rpartition("/")
            parent, names = parent or ".", [name + ("/" if path.endswith("/") else "") + points_to]
        directories.setdefault(parent, []).extend(names)
        if i in mentioned:
            focused.update((parent, n) for n in names if focus.mentions(f"{parent}/{n}") or focus.mentions(n))
    if not directories:
        return None
    out: list[str] = []
    counted: set[str] = set()
    below = _common_root(list(directories))
    for directory, names in directories.items():
        root = _generated_root(directory, below)
        if root and not any(d == directory for d, _ in focused):
            if root not in counted:  # one line for it, counting what is listed anywhere under it
                counted.add(root)
                out.append(_generated_line(root, directories))
            continue
        # An entry `ls -R` lists again under its own header is said there.
        listed = [n for n in names if f"{directory}/{n.rstrip('/')}" not in directories or (directory, n) in focused]
        shown = list(dict.fromkeys([*(n for n in listed if (directory, n) in focused), *listed[:NAMES_PER_DIRECTORY]]))
        more = len(listed) - len(shown)
        if not more:
            out.append(f"{directory}/: {'  '.join(shown)}" if shown else f"{directory}/")
            continue
        kinds = Counter(_extension(n) for n in listed)
        counts = ", ".join(f"{c} {k}" for k, c in kinds.most_common(5))
        out.append(f"{directory}/ ({len(listed):,}: {counts}): {'  '.join(shown)} … +{more:,} more")
    entries = sum(len(names) for names in directories.values())
    summary = f"{len(directories):,} directories, {entries:,} entries, folded by directory with counts"
    return Compressed("listing", "\n".join(out), summary)


GENERATED = ("__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox", "node_modules")
"""Directories tools fill (caches, installed packages): counted, their names not listed."""


def is_recursive(text: str) -> bool:
    """Whether `text` has the directory headers of an `ls -R` listing (as `compress_listing` finds them)."""
    return any(_is_header(line) for line in text.split("\n"))


def fold_unnamed(text: str, focus: Focus) -> str:
    """Names an `ls -R` listed under a header that a tool's cut left out: folded as a
    directory's are, under a label that says the directory is not known. They stay as
    printed when they are few, when the fold would not be shorter, or when a line of them
    would read as a header."""
    lines = [line.strip() for line in text.split("\n")]
    if sum(1 for line in lines if line) <= NAMES_PER_DIRECTORY or any(_HEADER.fullmatch(line) for line in lines):
        return text  # (a line the listing would read as a header: its names are not to be put there)
    found = compress_listing(f"{_UNNAMED}:\n{text}", focus)
    if found is None:
        return text
    folded = found.text.replace(f"{_UNNAMED}/", UNNAMED, 1)
    return folded if len(folded) < len(text) else text


UNNAMED = "(a directory the tool's cut hid)"
_UNNAMED = "?cut?"
"""A header no listing prints, for names whose directory is not known."""


def first_header(text: str) -> int:
    """Where the first directory header of an `ls -R` listing starts (the length of `text`
    when it has none)."""
    offset = 0
    for line in text.split("\n"):
        if _is_header(line):
            return offset
        offset += len(line) + 1
    return len(text)


def _common_root(directories: Sequence[str]) -> int:
    """How many leading parts every directory of the listing shares (what was asked for)."""
    split = [d.split("/") for d in directories]
    shortest = min(split, key=len)
    for n, part in enumerate(shortest):
        if any(parts[n] != part for parts in split):
            return n
    return len(shortest)


def _generated_root(directory: str, below: int) -> str:
    """The outermost directory tools generate that holds `directory` (itself, maybe), looking
    only below the listing's own root: a listing asked of one is listed ("" when none)."""
    parts = directory.split("/")
    for n in range(below, len(parts)):
        if parts[n] in GENERATED or parts[n].endswith(".egg-info"):
            return "/".join(parts[: n + 1])
    return ""


def _generated_line(root: str, directories: dict[str, list[str]]) -> str:
    """A generated directory and what the listing holds under it, as counts."""
    inside = [n for d, names in directories.items() if d == root or d.startswith(root + "/") for n in names]
    kinds = Counter(_extension(n) for n in inside)
    counts = ", ".join(f"{c} {k}" for k, c in kinds.most_common(3))
    return f"{root}/ ({len(inside):,} entries{': ' + counts if counts else ''}; generated, not listed)"


_STATUS = ("M ", "A ", "D ", "?? ", "R ", " M", " D")
"""How `git status --short` marks a path."""
_COLUMNS = re.compile(r"\s{2,}|\t")
_HEADER = re.compile(r"[^\s:][^\s]*:")


_LONG = re.compile(r"^[-dlcbps][-rwxsStT@+.]{9,10}\s+\d+\s+\S+\s+\S+\s+[\d,]+\s+\S+\s+\S+\s+\S+\s+(.+)$")
"""An `ls -l` line: mode, links, owner, group, size, date (three fields), name."""


def _is_header(line: str) -> bool:
    """Whether a line is a directory's header in `ls -R` (its path and a colon; CRLF output too)."""
    return _HEADER.fullmatch(line.rstrip("\r")) is not None


def _paths(lines: Sequence[str]) -> bool:
    """Whether (nearly) every line is a path (or an `ls -l` or `git status --short` entry)."""
    filled = [line.strip() for line in lines if line.strip() and not line.startswith("total ")]
    pathlike = sum(
        1
        for line in filled
        if _LONG.match(line) or line.startswith(_STATUS) or ((" " not in line or "/" in line) and len(line) < 512)
    )
    return bool(filled) and pathlike >= 0.9 * len(filled)


def _extension(name: str) -> str:
    if name.endswith("/"):
        return "(dir)"
    if " -> " in name:
        return "(link)"
    stem, dot, extension = name.rpartition(".")
    return f".{extension}" if dot and stem else "(none)"
