"""Which compressor reads an output: by its declared type, content that parses as JSON, the
tool's hint, then sniffing.

Sniffing is cheap (a parse attempt, line patterns on the first lines) and
its answer is remembered by content hash, so identical content is never
classified twice.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, wraps
from typing import TypeVar

from contextd.engine.compress import code, html, jsondata, listing, logs, search
from contextd.engine.compress.text import Compressed, Focus, Remembered

R = TypeVar("R")

KINDS = ("log", "test", "json", "code", "search", "diff", "listing", "html", "diagnostics", "status", "file")
"""What a client or a policy may declare an output to hold. ``diagnostics`` (a linter's or a
compiler's findings), ``status`` (``git status``: every line a fact) and ``file`` (a file's
contents no reader understands: a config, a document) are left whole; ``text``, the fallback
for other lines, is read as a log."""

_TEST_COMMANDS = re.compile(
    r"^(?:\S+=\S+\s+)*(?:python\d?(?:\.\d+)? -m |npx |pnpm exec |yarn )?"
    r"(?:pytest|py\.test|tox|nox|unittest|jest|vitest|mocha)\b"
    r"|^(?:go|cargo) test\b|^(?:npm|yarn|pnpm) (?:run )?test\b|\bruntests\.py\b|manage\.py test\b"
)
_SEARCH_COMMANDS = re.compile(r"^(?:grep|egrep|fgrep|rg|ag|ack)\b|^git grep\b")
_DIFF_COMMANDS = re.compile(r"^git (?:diff|show|log -p|stash show)\b|^diff -[a-zA-Z]*u")
_LISTING_COMMANDS = re.compile(r"^(?:ls|find|fd)\b|^git ls-files\b")
_DIAGNOSTICS_COMMANDS = re.compile(
    r"^(?:\S+=\S+\s+)*(?:python\d?(?:\.\d+)? -m |npx |uv run |poetry run )?"
    r"(?:ruff|mypy|pyright|flake8|pylint|eslint|tsc|shellcheck|golangci-lint|go vet)\b|^cargo (?:check|clippy)\b"
)
_DIAGNOSTIC_LINE = re.compile(
    r"^\S+?(?::\d+:\d+:?|:\d+: (?:error|warning|note)\b|\(\d+,\d+\): (?:error|warning))|^(?:error|warning)\[\w+\]:"
)
_READ_COMMANDS = re.compile(r"^(?:cat|head|tail|sed -n|nl|less|more|bat)\b")
_LOG_COMMANDS = re.compile(r"^(?:pip|pip3|npm|yarn|make|cmake|cargo|docker|kubectl|journalctl|mvn|gradle)\b")
_LOG_LINE = re.compile(
    r"^\s*(?:\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\[?\d{2}:\d{2}:\d{2}"
    r"|\[?(?:DEBUG|INFO|WARN|WARNING|ERROR|TRACE|FATAL)\b)"
)
_TEST_OUTPUT = re.compile(
    r"=+ test session starts =+|^(?:FAILED|PASSED|ERROR) \S+::|\d+ (?:passed|failed) in "
    r"|^\S+::\S+ (?:PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b",  # a verbose run's line per test
    re.MULTILINE,
)
_TAIL = 4_000
"""Characters at the end of an output read for a test run's summary (its head may be all passes)."""


def _last_command(command: str) -> str:
    """The command whose output this is, for hints: the last of `a && b`, without a `cd`."""
    parts = [p.strip() for p in re.split(r"&&|;|\|\|", command) if p.strip()]
    while len(parts) > 1 and parts[-1].startswith(("echo ", "true", "exit")):
        parts.pop()
    last = parts[-1] if parts else command.strip()
    if "|" in last:
        pipeline = [p.strip() for p in last.split("|")]
        # `nl -ba f | sed -n 1,50p`: the file's reader decides; `... | grep x`: a search.
        last = (
            pipeline[0]
            if _READ_COMMANDS.match(pipeline[-1])
            else pipeline[-1]
            if _SEARCH_COMMANDS.match(pipeline[-1])
            else pipeline[0]
        )
    return last


def _remembered_when_short(function: Callable[..., R]) -> Callable[..., R]:
    """`function` of a command (first) and more, remembered for commands up to 1,000
    characters: an output is compressed again each time the focus moves, and its command read
    again each time; a longer one (a heredoc writing a file, say) is read again, not held."""
    remembered = lru_cache(maxsize=4096)(function)

    @wraps(function)
    def read(command: str, *more: str) -> R:
        return remembered(command, *more) if len(command) <= 1_000 else function(command, *more)

    return read


@_remembered_when_short
def _path_of(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    files = [w for w in words[1:] if not w.startswith("-") and "." in posixpath.basename(w)]
    return files[-1] if files else ""


@_remembered_when_short
def hint(command: str = "", path: str = "") -> tuple[str, str]:
    """(kind, language) a command or a file path suggests; empty when it suggests nothing."""
    if command:
        last = _last_command(command)
        if _TEST_COMMANDS.search(last) or _TEST_COMMANDS.search(command.strip()):
            return "test", ""
        if _DIAGNOSTICS_COMMANDS.match(last):
            return "diagnostics", ""
        if last.startswith("git status"):
            return "status", ""
        if _SEARCH_COMMANDS.match(last):
            return "search", ""
        if _DIFF_COMMANDS.match(last):
            return "diff", ""
        if _LISTING_COMMANDS.match(last):
            return "listing", ""
        if _LOG_COMMANDS.match(last):
            return "log", ""
        if _READ_COMMANDS.match(last):
            path = path or _path_of(last)
    if path:
        extension = posixpath.splitext(path)[1].lower()
        if extension in code.EXTENSIONS:
            return "code", code.EXTENSIONS[extension]
        if extension == ".json":
            return "json", ""
        if extension in (".html", ".htm", ".xhtml"):
            return "html", ""
        if extension in (".log", ".out"):
            return "log", ""
        if extension and command and _READ_COMMANDS.match(_last_command(command)):
            return "file", ""  # a config, a document: its lines are all its own
    return "", ""


def sniff(text: str) -> str:
    """The kind of content from the content itself ("" when nothing fits)."""
    head = text[:20_000]
    lines = head.splitlines()
    if head.lstrip()[:1] in ("[", "{") and jsondata.parse(text) is not None:
        return "json"
    if html.looks_like_html(head):
        return "html"
    if listing.looks_like_diff(lines):
        return "diff"
    if _TEST_OUTPUT.search(head) or _TEST_OUTPUT.search(text[-_TAIL:]):
        return "test"
    nonblank = [line for line in lines[:200] if line.strip()]
    if nonblank and sum(1 for line in nonblank if _DIAGNOSTIC_LINE.match(line)) >= 0.5 * len(nonblank):
        return "diagnostics"
    if lines and sum(1 for line in lines[:200] if _LOG_LINE.match(line)) >= 0.3 * min(len(lines), 200):
        return "log"
    if search.looks_like_search(lines[:200]):
        return "search"
    if code.sniff_language(head):
        return "code"
    if "Traceback (most recent call last):" in head:
        return "log"
    return ""


SNIFFED: Remembered[str] = Remembered(50_000)
"""Each content's kind by its hash: identical content is never classified twice."""


def route(text: str, *, declared: str = "", command: str = "", path: str = "") -> tuple[str, str]:
    """(kind, language) for `text`: the declared type when it is a known kind; else JSON when
    the content parses as JSON, whatever the command suggests (``kubectl ... -o json`` is no
    log, a JSON test report no test run: the hint only breaks ties); else what the command or
    path suggests; else what sniffing finds ("" when nothing fits)."""
    if declared in KINDS:
        return declared, ""
    sniffed = _sniffed(text) if text.lstrip()[:1] in ("[", "{") else ""
    if sniffed == "json":
        return "json", ""
    kind, language = hint(command, path)
    if kind:
        return kind, language
    return sniffed or _sniffed(text), ""


def _sniffed(text: str) -> str:
    key = hashlib.sha256(text.encode()).digest()[:16]
    return SNIFFED.get(key, lambda: sniff(text))


def compress(
    text: str, focus: Focus, *, declared: str = "", command: str = "", path: str = "", examples: bool = False
) -> Compressed | None:
    """The compressed form of a tool output, or None when no compressor reads it or it saves nothing.
    `examples`: read by the call that made the output, which has seen none of it whole (a
    skeleton of code keeps what an agent writes new code from: code.py)."""
    opening, inner, closing = envelope(text)
    reading, cut = _reading(inner, opening, declared, command, path, examples)
    found = _read(inner, focus, reading) if cut is None else _read_cut(inner, cut, focus, reading)
    if found is None:
        return None
    if opening or closing:
        found = replace(found, text=opening + found.text + closing)
    return found if len(found.text) < len(text) else None


def names_read(text: str, *, declared: str = "", command: str = "", path: str = "") -> frozenset[str] | None:
    """The names in `text` by which `compress` finds a focus term that does not occur in it
    whole (`text.matters`): by its last part, a skeleton of code finds the definitions it names;
    a search, a listing and JSON read it by any word (None); the others find only the term whole."""
    opening, inner, _ = envelope(text)
    reading, cut = _reading(inner, opening, declared, command, path)
    readers = _READERS.get(reading.kind, ())
    if any(reader in _BY_ANY_WORD for reader in readers):
        return None
    if _code not in readers:
        return frozenset()
    parts = (inner,) if cut is None else _cut(inner, cut)[::2]
    return frozenset().union(*(code.names(part, reading.language) for part in parts if part))


def _reading(
    inner: str, opening: str, declared: str, command: str, path: str, examples: bool = False
) -> tuple[Reading, re.Match[str] | None]:
    """How an output's content (`inner`, after a tool's `opening`) is read, and where its tool
    cut it (None: it is read whole)."""
    kind, language = route(inner, declared=declared, command=command, path=path)
    language = language or hint("", _path_of(_last_command(command)))[1]
    cut = _ELIDED.search(inner) if kind not in _LINES and "</output_head>" in inner else None
    return Reading(kind, language, opening.count("\n") + 1, examples), cut


def unread(text: str, *, declared: str = "", command: str = "", path: str = "") -> bool:
    """Whether `compress` gives None for `text` whatever the focus: no compressor reads the kind
    it is taken for (a `git status`, a compiler's diagnostics), or it is read as lines alone and
    has fewer than a reading as lines needs (a short output of no kind: most outputs)."""
    _, inner, _ = envelope(text)
    readers = _READERS.get(route(inner, declared=declared, command=command, path=path)[0], ())
    return not readers or (readers == (_text,) and inner.count("\n") + 1 < TEXT_MIN_LINES)


def _read_cut(inner: str, cut: re.Match[str], focus: Focus, reading: Reading) -> Compressed | None:
    """A tool that kept the head and the tail of a long output: each is read on its own (the
    notice of what it left out, between them, is not a path, a row or a line of code). The
    tool cut them mid-line: the line on each side of the notice stays as it is, with it."""
    head_text, middle, tail_text = _cut(inner, cut)
    if reading.kind == "listing" and listing.is_recursive(head_text) and (names := listing.first_header(tail_text)):
        # The tail goes on listing some directory, but which one is in what the tool left out
        # (headers may be there): its names are put in no directory, beside the notice.
        middle += "\n" + listing.fold_unnamed(tail_text[:names].rstrip("\n"), focus)
        tail_text = tail_text[names:]
    after = replace(reading, first_line=reading.first_line + inner.count("\n", 0, len(inner) - len(tail_text)))
    parts = [
        _read(head_text, focus, reading) if head_text else None,
        _read(tail_text, focus, after) if tail_text else None,
    ]
    if parts == [None, None]:
        return None
    texts = [p.text if p is not None else whole for p, whole in zip(parts, (head_text, tail_text), strict=True)]
    read = [p for p in parts if p is not None]
    return Compressed(
        read[0].kind,
        (texts[0] + "\n" if head_text else "") + middle + ("\n" + texts[1] if tail_text else ""),
        " / ".join(p.summary for p in read),
        lossless=all(p.lossless for p in read),
    )


def _cut(inner: str, cut: re.Match[str]) -> tuple[str, str, str]:
    """(the whole lines before the notice, the notice with the line cut on each side of it,
    the whole lines after it)."""
    head, tail = inner[: cut.start()], inner[cut.end() :]
    end = head.rfind("\n")
    start = tail.find("\n")
    head_text = head[:end] if end >= 0 else ""
    tail_text = tail[start + 1 :] if start >= 0 else ""
    return head_text, head[end + 1 :] + cut.group(0) + (tail[:start] if start >= 0 else tail), tail_text


def _read(text: str, focus: Focus, reading: Reading) -> Compressed | None:
    for reader in _READERS.get(reading.kind, ()):
        found = reader(text, focus, reading)
        if found is not None:
            return found
    return None


_ELIDED = re.compile(r"\n?</output_head>\s*<elided_chars>\s*\d+ characters elided\s*</elided_chars>\s*<output_tail>\n?")
"""Where a tool cut a long output to its head and tail (the notice says how much it left out)."""
_LINES = ("log", "test", "")
"""Kinds read line by line: the notice is one more line to them."""


@dataclass(frozen=True, slots=True)
class Reading:
    kind: str
    language: str
    first_line: int
    """The number of the content's first line in the whole output (after a tool's envelope)."""
    examples: bool = False
    """A skeleton of code keeps what an agent writes new code from (code.py)."""


Reader = Callable[[str, Focus, Reading], "Compressed | None"]


def _log(text: str, focus: Focus, reading: Reading) -> Compressed | None:
    kind = "test" if reading.kind == "test" else "log"
    return logs.compress_log(text, focus, kind=kind, first_line=reading.first_line)


def _text(text: str, focus: Focus, reading: Reading) -> Compressed | None:
    """Lines no other compressor reads (a build's output, a page, a script's prints): read as a
    log, when there are enough of them to be worth it."""
    if text.count("\n") + 1 < TEXT_MIN_LINES:
        return None
    return logs.compress_log(text, focus, kind="text", first_line=reading.first_line)


TEXT_MIN_LINES = 20


def _code(text: str, focus: Focus, reading: Reading) -> Compressed | None:
    return code.compress_code(text, focus, reading.language, reading.first_line, reading.examples)


def _json(text: str, focus: Focus, _: Reading) -> Compressed | None:
    return jsondata.compress_json(text, focus)


def _search(text: str, focus: Focus, _: Reading) -> Compressed | None:
    return search.compress_search(text, focus)


def _html(text: str, focus: Focus, reading: Reading) -> Compressed | None:
    return html.compress_html(text, focus, reading.first_line)


def _diff(text: str, focus: Focus, _: Reading) -> Compressed | None:
    return listing.compress_diff(text, focus)


def _listing(text: str, focus: Focus, _: Reading) -> Compressed | None:
    return listing.compress_listing(text, focus)


_READERS: dict[str, tuple[Reader, ...]] = {
    "log": (_log,),
    "test": (_log,),
    "json": (_json,),
    # Code with no definition to skeleton (a cut range inside one body) is read as lines.
    "code": (_code, _text),
    # grep over one file prints its lines without a path: they are code (or lines);
    # grep -l prints paths: a listing.
    "search": (_search, _listing, _code, _text),
    "diff": (_diff,),
    # A page that is not HTML after all (a template, a fragment) is its own: left whole.
    "html": (_html,),
    "listing": (_listing, _text),
    "diagnostics": (),
    "status": (),
    "file": (),
    "": (_text,),
}
"""Per kind, the compressors to try in order (the next when one cannot read the content)."""
_BY_ANY_WORD = (_search, _listing, _json)
"""Readers taken to find a focus term by any of the text's words though it does not occur whole
(`names_read`): a search does, by a definition of the term's last part; a listing (the paths it
puts together from a directory and a name) and JSON (the values it parses and writes again)
match terms against strings that are not the text itself, and are taken so too rather than
followed that far."""

_OPENING = re.compile(
    r"^(?:\s*<returncode>-?\d+</returncode>)?(?:.{0,2000}?)<(?:output|output_head|stdout)>\n?", re.DOTALL
)
_CLOSING = re.compile(r"\n?</(?:output|output_tail|stdout)>\s*$")
_SCANNED = 32_000


def envelope(text: str) -> tuple[str, str, str]:
    """(opening, content, closing): a tool's wrapping of its output in tags (an exit code, a
    notice, ``<output>`` ... ``</output>``) is kept as it is; the content is compressed."""
    if len(text) <= _SCANNED and "<output" not in text and "<stdout>" not in text:
        # No tag to find: the pattern would try 2,000 characters first (past this length,
        # reading the whole text for a tag costs more than the pattern).
        return "", text, ""
    opening = _OPENING.match(text)
    if opening is None:
        return "", text, ""
    # The closing tag ends the text: look for it there, not over the whole output.
    closing = _CLOSING.search(text, max(opening.end(), len(text.rstrip()) - 40))
    stop = closing.start() if closing else len(text)
    return opening.group(0), text[opening.end() : stop], text[stop:]
