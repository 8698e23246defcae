"""Diffs and listings, folded by file and directory with counts.

A diff keeps, for every file, its header and a count of lines added and
removed; the hunks that mention the focus whole; in the others, the
changed lines (not the unchanged context), up to a share per file. A
listing (``ls -R``, ``find``, ``git status``) keeps every directory with
its count of entries by extension and a few names, and every entry that
mentions the focus.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Sequence

from contextd.engine.compress.text import Compressed, Focus

CHANGED_PER_FILE = 12
"""Changed lines shown per file outside the hunks the focus asks for."""
NAMES_PER_DIRECTORY = 6


def looks_like_diff(lines: Sequence[str]) -> bool:
    return any(line.startswith(("diff --git ", "+++ ", "@@ ")) for line in lines[:200]) and any(
        line.startswith("@@ ") for line in lines
    )


def compress_diff(text: str, focus: Focus) -> Compressed | None:
    lines = text.splitlines()
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
    lines = text.splitlines()
    directories: dict[str, list[str]] = {}
    order: list[str] = []
    current = "."
    recursive = any(re.match(r"^\S.*:$", line) for line in lines)
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if recursive and stripped.endswith(":") and not stripped.startswith(("total ",)):
            current = stripped[:-1]
            directories.setdefault(current, [])
            order.append(current)
            continue
        if recursive:
            names = stripped.split()
            directories.setdefault(current, []).extend(names)
        else:
            path = stripped.split()[-1] if stripped.startswith(("M ", "A ", "D ", "?? ", "R ", " M")) else stripped
            parent, name = posixpath.split(path.rstrip("/"))
            directories.setdefault(parent or ".", []).append(name + ("/" if path.endswith("/") else ""))
    if not directories:
        return None
    out: list[str] = []
    entries = 0
    for directory in sorted(directories, key=lambda d: (order.index(d) if d in order else -1, d)):
        names = directories[directory]
        entries += len(names)
        kinds = Counter(posixpath.splitext(n)[1] or ("(dir)" if n.endswith("/") else "(none)") for n in names)
        focused = [n for n in names if focus.mentions(posixpath.join(directory, n))]
        shown = list(dict.fromkeys([*focused, *names[:NAMES_PER_DIRECTORY]]))
        more = len(names) - len(shown)
        counts = ", ".join(f"{c} {k}" for k, c in kinds.most_common(5))
        tail = f" … +{more:,} more" if more else ""
        out.append(f"{directory}/ ({len(names):,}: {counts}): {'  '.join(shown)}{tail}")
    summary = f"{len(directories):,} directories, {entries:,} entries, folded by directory with counts"
    return Compressed("listing", "\n".join(out), summary)
