"""Diffs and listings, folded by file and directory with counts.

A diff keeps, for every file, its header and a count of lines added and
removed; the hunks that mention the focus whole; in the others, the
changed lines (not the unchanged context), up to a share per file. A
listing (``ls -R``, ``find``, ``git status``) keeps every directory with
its count of entries by extension and a few names, and every entry that
mentions the focus.
"""

from __future__ import annotations

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


def compress_diff(text: str, focus: Focus) -> Compressed | None:
    lines = text.split("\n")
    out: list[str] = []
    files = 0
    i = 0
    # What precedes the first file (a commit header, a status line) stays.
    while i < len(lines) and not lines[i].startswith(("diff ", "--- ")):
        out.append(lines[i])
        i += 1
    while i < len(lines):
        start = i
        i += 1
        while (
            i < len(lines)
            and not lines[i].startswith("diff ")
            and not (
                lines[i].startswith("--- ")
                and i + 1 < len(lines)
                and lines[i + 1].startswith("+++ ")
                and lines[i - 1][:1] not in "+- @"
            )
        ):
            i += 1
        out.extend(_file(lines[start:i], focus))
        files += 1
    written = "\n".join(out)
    summary = f"{files:,} files: headers and counts, changed lines, hunks on the focus whole"
    return Compressed("diff", written, summary)


def _file(lines: list[str], focus: Focus) -> list[str]:
    header = [
        line for line in lines[:6] if not line.startswith(("@@", "+", "-", " ")) or line.startswith(("---", "+++"))
    ]
    hunks: list[list[str]] = []
    for line in lines[len(header) :]:
        if line.startswith("@@") or not hunks:
            hunks.append([])
        hunks[-1].append(line)
    added = sum(1 for h in hunks for line in h[1:] if line.startswith("+"))
    removed = sum(1 for h in hunks for line in h[1:] if line.startswith("-"))
    out = [*header, f"[{len(hunks):,} hunks, +{added:,} -{removed:,}]"]
    budget = CHANGED_PER_FILE
    for hunk in hunks:
        if focus.mentions("\n".join(hunk)):
            out.extend(hunk)
            continue
        changed = [line for line in hunk[1:] if line[:1] in "+-"]
        shown = changed[:budget]
        budget -= len(shown)
        out.append(hunk[0])
        out.extend(shown)
        left = len(hunk) - 1 - len(shown)
        if left:
            out.append(f"[… {left:,} more lines of this hunk ({len(changed) - len(shown):,} changed) …]")
    return out


def compress_listing(text: str, focus: Focus) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    mentioned = focus.selective(found).lines_mentioning(found)
    directories: dict[str, list[str]] = {}
    focused: set[tuple[str, str]] = set()
    current = "."
    recursive = any(line.endswith(":") and line[:1].strip() for line in lines)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if recursive and stripped.endswith(":"):
            current = stripped[:-1]
            directories.setdefault(current, [])
            continue
        if recursive:
            parent, names = current, stripped.split()
        else:
            path = stripped.split()[-1] if stripped.startswith(_STATUS) else stripped
            parent, _, name = path.rstrip("/").rpartition("/")
            parent, names = parent or ".", [name + ("/" if path.endswith("/") else "")]
        directories.setdefault(parent, []).extend(names)
        if i in mentioned:
            focused.update((parent, n) for n in names if focus.mentions(f"{parent}/{n}"))
    if not directories:
        return None
    out: list[str] = []
    for directory, names in directories.items():
        kinds = Counter(_extension(n) for n in names)
        shown = list(dict.fromkeys([*(n for n in names if (directory, n) in focused), *names[:NAMES_PER_DIRECTORY]]))
        more = len(names) - len(shown)
        counts = ", ".join(f"{c} {k}" for k, c in kinds.most_common(5))
        tail = f" … +{more:,} more" if more else ""
        out.append(f"{directory}/ ({len(names):,}: {counts}): {'  '.join(shown)}{tail}")
    entries = sum(len(names) for names in directories.values())
    summary = f"{len(directories):,} directories, {entries:,} entries, folded by directory with counts"
    return Compressed("listing", "\n".join(out), summary)


_STATUS = ("M ", "A ", "D ", "?? ", "R ", " M", " D")
"""How `git status --short` marks a path."""


def _extension(name: str) -> str:
    if name.endswith("/"):
        return "(dir)"
    stem, dot, extension = name.rpartition(".")
    return f".{extension}" if dot and stem else "(none)"
