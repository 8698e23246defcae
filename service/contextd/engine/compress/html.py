"""HTML pages: the content whole, the page's furniture said by what it holds.

Kept verbatim: every line of the page's content (its text and its markup),
and every line that mentions the focus. Left out, each said by its line
range and what it held: the head (its title, verbatim, in the marker; its
links, scripts, styles and meta tags counted), the bodies of script and
style elements, and the page's navigation and sidebars (``nav``,
``role="navigation"``, one of an element's classes naming a sidebar, a
navbar, breadcrumbs or related links). An element that never closes is not
folded, nor is an ``aside`` (a footnote or a topic may be one). A footer
stays: it is short, and says versions and dates. A part that mentions the
focus stays whole. Other XML is not read here.
"""

from __future__ import annotations

import re
from collections import Counter

from contextd.engine.compress.text import Compressed, Focus, Kept, Lines

MIN_FOLD = 4
"""Parts shorter than this many lines stay: a marker would save little."""
TITLE_CHARS = 200

# Tags are read one at a time, their attributes up to the next angle bracket: a page whose tags
# never close costs one pass, never a scan to its end per tag.
_HEAD_OPEN = re.compile(r"<head\b[^<>]*>", re.IGNORECASE)
_HEAD_CLOSE = re.compile(r"</head\s*>", re.IGNORECASE)
_TITLE = re.compile(r"<title\b[^<>]*>([^<]*)</title\s*>", re.IGNORECASE)
_CODE = re.compile(r"<(/?)(script|style)\b[^<>]*>", re.IGNORECASE)
_BLOCKS = re.compile(r"<(/?)(nav|div|section|ul)\b([^<>]*)>", re.IGNORECASE)
_CLASS = re.compile(r"\bclass\s*=\s*[\"']([^\"']*)[\"']", re.IGNORECASE)
_ROLE = re.compile(r"\brole\s*=\s*[\"']navigation[\"']", re.IGNORECASE)
_HEAD_TAGS = re.compile(r"<(link|script|style|meta)\b", re.IGNORECASE)
_LINK = re.compile(r"<a\b", re.IGNORECASE)
NAVIGATION_CLASSES = frozenset({"navbar", "nav-bar", "breadcrumb", "breadcrumbs"})
SIDEBAR_CLASSES = frozenset({"sidebar", "sphinxsidebar"})
LINK_CLASSES = frozenset({"related", "relations"})
"""Class names (whole, one of an element's classes) that say navigation, a sidebar, related links."""


def looks_like_html(text: str) -> bool:
    start = text.lstrip()[:100].lower()
    return start.startswith(("<!doctype html", "<html"))


def compress_html(text: str, focus: Focus, first_line: int = 1) -> Compressed | None:
    found = Lines(text)
    lines = found.lines
    mentioned = focus.lines_mentioning(found) | focus.lines_read(first_line, len(lines))
    kept = Kept(lines, first_line)
    kept.add_range(0, len(lines))
    said: list[str] = []

    def fold(start: int, stop: int, what: str, kind: str) -> None:
        """Leave out lines [start, stop) unless the focus is in them or they are few."""
        if stop - start < MIN_FOLD or any(i in mentioned for i in range(start, stop)):
            return
        if any(i not in kept.keep for i in range(start, stop)):
            return  # inside a part already left out
        kept.keep.difference_update(range(start, stop))
        where = f"lines {start + first_line}-{stop + first_line - 1}"
        kept.folded[start] = (stop, f"[… {where} left out: {what} …]")
        said.append(kind)

    head = _HEAD_OPEN.search(text)
    closing = _HEAD_CLOSE.search(text, head.end()) if head else None
    if head and closing:
        inside = text[head.end() : closing.start()]
        tags = Counter(m.group(1).lower() for m in _HEAD_TAGS.finditer(inside))
        title = _TITLE.search(inside)
        named = ""
        if title:
            words = " ".join(title.group(1).split())
            named = f"<title>{words if len(words) <= TITLE_CHARS else words[: TITLE_CHARS - 1] + '…'}</title>, "
        counted = ", ".join(f"{n} {tag}" for tag, n in tags.most_common())
        fold(found.line_of(head.end()) + 1, found.line_of(closing.start()), f"the head ({named}{counted})", "the head")
    for end, close, what in _furniture(text):
        links = len(_LINK.findall(text, end, close))
        fold(found.line_of(end) + 1, found.line_of(close), f"{what} ({links} links)", what)
    for end, close, tag in _code_bodies(text):
        fold(found.line_of(end) + 1, found.line_of(close), f"the {tag}'s body", f"{tag} bodies")
    if not said:
        return None
    summary = f"html: {len(kept.keep):,} of {len(lines):,} lines kept; left out: " + ", ".join(dict.fromkeys(said))
    return Compressed("html", kept.write(), summary)


def _furniture(text: str) -> list[tuple[int, int, str]]:
    """(end of the opening tag, start of the closing tag, what it is) of each outermost
    navigation or sidebar element that closes; one pass over the block tags."""
    stacks: dict[str, list[tuple[int, str]]] = {}
    out: list[tuple[int, int, str]] = []
    inside = 0  # furniture elements open around the current position
    for tag in _BLOCKS.finditer(text):
        name = tag.group(2).lower()
        stack = stacks.setdefault(name, [])
        if not tag.group(1):
            if tag.group(3).rstrip().endswith("/"):
                continue  # <div/>: opens nothing
            what = _what(name, tag.group(3))
            stack.append((tag.end(), what))
            inside += bool(what)
        elif stack:
            end, what = stack.pop()
            if what:
                inside -= 1
                if not inside:
                    out.append((end, tag.start(), what))
    return out


def _what(name: str, attributes: str) -> str:
    """What a block element is, when it is the page's furniture ("" when it is not)."""
    classes = set()
    if (found := _CLASS.search(attributes)) is not None:
        classes = set(found.group(1).split())
    if name == "nav" or _ROLE.search(attributes) or classes & NAVIGATION_CLASSES:
        return "navigation"
    if classes & SIDEBAR_CLASSES:
        return "a sidebar"
    return "related links" if classes & LINK_CLASSES else ""


def _code_bodies(text: str) -> list[tuple[int, int, str]]:
    """(end of the opening tag, start of the closing tag, tag) of each script and style that closes."""
    out = []
    opened: tuple[int, str] | None = None
    for tag in _CODE.finditer(text):
        name = tag.group(2).lower()
        if not tag.group(1):
            opened = (tag.end(), name) if opened is None else opened  # (a script holds no tags)
        elif opened is not None and opened[1] == name:
            out.append((opened[0], tag.start(), name))
            opened = None
    return out
