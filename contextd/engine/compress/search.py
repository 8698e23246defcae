"""Search results (grep, rg, git grep): grouped by file, with a count per file.

Kept verbatim: in every file, the first matches and every line that defines
or mentions a symbol of the focus (or of the search itself); the other
matches are counted. Every file keeps its name and count, so where the
pattern occurs is never lost.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from contextd.engine.compress.text import Compressed, Focus, Lines

_CONTEXT = re.compile(r"^(?P<path>[^\s:]*[./][^\s:]*?)-(?P<line>\d+)-(?P<text>.*)$")
"""A context line (grep -A/-B/-C): ``path-12-text``."""
_DEFINES = (
    r"(?:\b(?:def|class|function|func|fn|struct|interface|type|const|let|var|enum|trait|impl)\s+{name}\b"
    r"|\b{name}\s*(?::[^=]*)?=[^=])"
)
"""A line that defines `name`: a definition keyword before it, or an assignment to it."""
PER_FILE = 2
"""Matches shown per file besides those the focus asks for."""


@dataclass(slots=True)
class _File:
    path: str
    lines: list[int] = field(default_factory=list)
    matches: int = 0


def _parse(line: str) -> tuple[str, bool, str] | None:
    """(path, a match rather than context, the matched text) of a result line; None for others."""
    colon = line.find(":")
    if colon > 0:
        path = line[:colon]
        if " " not in path and ("/" in path or "." in path) and not path[0].isdigit():
            rest = line[colon + 1 :]
            number, sep, text = rest.partition(":")
            return (path, True, text) if sep and number.isdigit() else (path, True, rest)
    if "-" in line:
        context = _CONTEXT.match(line)
        if context:
            return context["path"], False, context["text"]
    return None


def looks_like_search(lines: Sequence[str]) -> bool:
    nonblank = [line for line in lines if line.strip() and line != "--"]
    if len(nonblank) < 4:
        return False
    return sum(1 for line in nonblank if _parse(line)) >= 0.8 * len(nonblank)


def compress_search(text: str, focus: Focus) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    files: dict[str, _File] = {}
    loose: list[int] = []
    texts: dict[int, str] = {}
    for i, line in enumerate(lines):
        parsed = _parse(line)
        if parsed is None:
            if line.strip() and line != "--":
                loose.append(i)
            continue
        path, is_match, texts[i] = parsed
        entry = files.get(path)
        if entry is None:
            entry = files[path] = _File(path)
        entry.lines.append(i)
        entry.matches += is_match
    if not files:
        return None
    # Definitions of a focus name; mentions of the focus terms that few lines share.
    names = [n for n in focus.names if re.fullmatch(r"\w+", n)]
    chosen = set()
    for i, held in found.having(names).items():
        if i in texts and any(re.search(_DEFINES.format(name=re.escape(n)), texts[i]) for n in held):
            chosen.add(i)
    chosen |= focus.selective(found).lines_mentioning(found)
    out: list[str] = []
    kept_lines = 0
    for entry in files.values():
        first = [i for i in entry.lines if i not in chosen][: max(0, PER_FILE - sum(i in chosen for i in entry.lines))]
        shown = sorted({*first, *(i for i in entry.lines if i in chosen)})
        left = len(entry.lines) - len(shown)
        out.append(f"{entry.path} ({entry.matches:,} {'match' if entry.matches == 1 else 'matches'})")
        out.extend(f"  {lines[i]}" for i in shown)
        if left:
            out.append(f"  [… {left:,} more {'line' if left == 1 else 'lines'} in this file …]")
        kept_lines += len(shown)
    out.extend(lines[i] for i in loose[:5])
    if len(loose) > 5:
        out.append(f"[… {len(loose) - 5:,} other lines …]")
    total = sum(len(f.lines) for f in files.values())
    summary = f"{kept_lines:,} of {total:,} result lines kept in {len(files):,} files, every file counted"
    return Compressed("search", "\n".join(out), summary)
