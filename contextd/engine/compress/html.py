"""HTML pages: the content whole, the page's furniture said by what it holds.

Kept verbatim: every line of the page's content (its text and its markup),
and every line that mentions the focus. Left out, each said by its line
range and what it held: the head (its title, verbatim, in the marker; its
links, scripts, styles and meta tags counted), the bodies of script and
style elements, and the page's navigation and sidebars (``nav``, ``aside``,
``role="navigation"``, a class that says sidebar, navbar, breadcrumbs or
related). A footer stays: it is short, and says versions and dates. A part
that mentions the focus stays whole. Other XML is not read here.
"""

from __future__ import annotations

import re
from collections import Counter

from contextd.engine.compress.text import Compressed, Focus, Kept, Lines

MIN_FOLD = 4
"""Parts shorter than this many lines stay: a marker would save little."""

_HEAD = re.compile(r"<head\b[^>]*>(.*?)</head\s*>", re.IGNORECASE | re.DOTALL)
_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_CODE = re.compile(r"<(script|style)\b[^>]*>(.*?)</\1\s*>", re.IGNORECASE | re.DOTALL)
_FURNITURE = re.compile(
    r"<(nav|aside)\b[^>]*>"
    r"|<(div|section|ul)\b[^>]*?(?:role=[\"']navigation[\"']|class=[\"'][^\"']*"
    r"\b(?:sidebar|sphinxsidebar|navbar|nav-bar|breadcrumbs?|related)\b[^\"']*[\"'])[^>]*>",
    re.IGNORECASE,
)
_HEAD_TAGS = re.compile(r"<(link|script|style|meta)\b", re.IGNORECASE)
_LINK = re.compile(r"<a\b", re.IGNORECASE)


def looks_like_html(text: str) -> bool:
    start = text.lstrip()[:100].lower()
    return start.startswith(("<!doctype html", "<html"))


def compress_html(text: str, focus: Focus, first_line: int = 1) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    mentioned = focus.lines_mentioning(found)
    kept = Kept(lines, first_line)
    kept.add_range(0, len(lines))
    said: list[str] = []

    def fold(start: int, stop: int, what: str) -> None:
        """Leave out lines [start, stop) unless the focus is in them or they are few."""
        if stop - start < MIN_FOLD or any(i in mentioned for i in range(start, stop)):
            return
        if any(i not in kept.keep for i in range(start, stop)):
            return  # inside a part already left out
        kept.keep.difference_update(range(start, stop))
        where = f"lines {start + first_line}-{stop + first_line - 1}"
        kept.folded[start] = (stop, f"[… {where} left out: {what} …]")
        said.append(what.split(" (")[0])

    head = _HEAD.search(text)
    if head:
        start, stop = found.line_of(head.start(1)), found.line_of(head.end(1))
        tags = Counter(m.group(1).lower() for m in _HEAD_TAGS.finditer(head.group(1)))
        title = _TITLE.search(head.group(1))
        named = f"<title>{title.group(1)}</title>, " if title else ""
        fold(start + 1, stop, "the head (" + named + ", ".join(f"{n} {tag}" for tag, n in tags.most_common()) + ")")
    for element in _FURNITURE.finditer(text):
        tag = (element.group(1) or element.group(2)).lower()
        end = _closing(text, tag, element.end())
        start, stop = found.line_of(element.start()), found.line_of(end)
        links = len(_LINK.findall(text, element.end(), end))
        fold(start + 1, stop, f"{_name(element.group(0), tag)} ({links} links)")
    for element in _CODE.finditer(text):
        start, stop = found.line_of(element.start(2)), found.line_of(element.end(2))
        fold(start + 1, stop, f"the {element.group(1).lower()}'s body")
    if not said:
        return None
    summary = f"html: {len(kept.keep):,} of {len(lines):,} lines kept; left out: " + ", ".join(dict.fromkeys(said))
    return Compressed("html", kept.write(), summary)


def _closing(text: str, tag: str, after: int) -> int:
    """Where the element opened just before `after` closes (the end of the text if it does not)."""
    depth = 1
    for match in re.finditer(rf"<(/?){tag}\b[^>]*>", text[after:], re.IGNORECASE):
        depth += -1 if match.group(1) else 1
        if depth == 0:
            return after + match.start()
    return len(text)


def _name(opening: str, tag: str) -> str:
    lowered = opening.lower()
    if "navigation" in lowered or tag == "nav" or "nav" in lowered:
        return "navigation"
    if "footer" in lowered:
        return "the footer"
    return "a sidebar" if "sidebar" in lowered or tag == "aside" else "the page's links"
