"""What every compressor shares: the focus, the result, and the writing of kept lines.

A compressed output is the original's own lines, verbatim, with the lines
left out named by their range (1-based lines of the original), so a reader
can ask for exactly those lines back by handle.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic, TypeVar

from contextd.engine.memo import join_budget, weigh, within_budget
from contextd.engine.patterns import compile_linear

V = TypeVar("V")

_DISTINCT = re.compile(r"[_./:\d-]|[a-z][A-Z]")
"""An identifier rather than a word: it holds _ . / : - or a digit, or is camelCase."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{2,}")
_ABBREVIATION = re.compile(r"[A-Za-z](?:\.[A-Za-z])+")
"""``e.g``, ``i.e``: letters and dots, not a name."""
MAX_FOCUS_TERMS = 32
"""Terms the focus takes from the latest turns, and apart from them, an output takes from the
call that made it."""


def identifiers(text: str, limit: int = MAX_FOCUS_TERMS) -> tuple[str, ...]:
    """The first `limit` distinct words of `text` that look like identifiers (as `Focus` takes
    derived terms), without the punctuation a sentence puts after them: ``self.field.name:``,
    ``utils.py.``. Ordinary words are left out before counting, so a long message of prose
    does not fill the limit with them."""
    found: dict[str, None] = {}
    for match in _IDENTIFIER.finditer(text):
        if len(found) >= limit:
            break
        word = match.group().rstrip("./:-")
        if len(word) >= 3 and _DISTINCT.search(word) and not _ABBREVIATION.fullmatch(word):
            found[word] = None
    return tuple(found)


class Remembered(Generic[V]):
    """Values by a key of content (a hash), bounded by count and, with `max_bytes`, by their
    weight (`memo.weigh`): the least recently used goes first. They count against the memos'
    byte budget too (`memo.join_budget`: `--memo-bytes`, `clear_memos`). Safe to share
    between threads (the order is kept under a lock; `compute` runs outside it)."""

    def __init__(self, size: int, max_bytes: int = 0) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._weights: dict[Hashable, int] = {}
        self._lock = threading.Lock()
        join_budget(self)

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = compute()
        weight = weigh(value)
        if weight > self.max_bytes > 0:
            return value  # not kept: it would push out everything else

        def keep() -> int:
            with self._lock:
                freed = self._weights.pop(key, 0)  # (another thread computed it meanwhile)
                self._values[key] = value
                self._weights[key] = weight
                while len(self._values) > self.size or (
                    self.max_bytes and self.bytes + weight - freed > self.max_bytes
                ):
                    oldest, _ = self._values.popitem(last=False)
                    freed += self._weights.pop(oldest)
                self.bytes += weight - freed
                return weight - freed

        within_budget(keep)
        return value

    def drop_oldest(self) -> int | None:
        """Under the memos' budget's lock: give up the least recently used value; its bytes."""
        with self._lock:
            if not self._values:
                return None
            oldest, _ = self._values.popitem(last=False)
            weight = self._weights.pop(oldest)
            self.bytes -= weight
            return weight

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        def forget() -> int:
            with self._lock:
                freed, self.bytes = self.bytes, 0
                self._values.clear()
                self._weights.clear()
                return -freed

        within_budget(forget)


@dataclass(frozen=True)
class Focus:
    """What the next call is about: lines that mention it are kept, symbols it names stay whole.

    `given` terms (the client's) are used as they are; `derived` ones (taken
    from the latest turns, which hold ordinary words too) only when they look
    like identifiers, so ``the`` or ``file`` never keeps a line.
    """

    given: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()
    lines: frozenset[int] = frozenset()
    """Lines of the output the recent calls read again (a `sed -n` range of the same file):
    kept, whatever they mention. Numbered as a compressor's `first_line` numbers them (the
    output's first line is 1)."""

    @cached_property
    def terms(self) -> tuple[str, ...]:
        picked = [t for t in self.given if t.strip()]
        picked += [t for t in self.derived if len(t) >= 3 and _DISTINCT.search(t)]
        return tuple(dict.fromkeys(picked))

    @cached_property
    def names(self) -> frozenset[str]:
        """Symbol names in the focus: each term, and the last part of a dotted one (a path's file name)."""
        out = set()
        for term in self.terms:
            out.add(term)
            last = _last_part(term)
            if last:
                out.add(last)
        return frozenset(out)

    def within(self, words: Words, names: Callable[[], frozenset[str] | None] | None = None) -> Focus:
        """The focus without the terms that cannot matter to a text made of `words` (its
        ``\\w+`` runs): the same compression, and a key for remembering it that changes only
        when the text is concerned. A term matters only where it, or its last part, occurs;
        given `names` (`matters`), only where it occurs whole or its last part is a name the
        compressor reads."""
        read = _Once(names) if names is not None else None
        return Focus(
            tuple(t for t in self.given if matters(t, words, read)),
            tuple(t for t in self.derived if matters(t, words, read)),
            self.lines,
        )

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        if not self.terms:
            return None
        # Whole names: `render` is not mentioned by `self.rendered`.
        return re.compile("|".join(rf"(?<!\w){re.escape(t)}(?!\w)" for t in sorted(self.terms, key=len, reverse=True)))

    def lines_mentioning(self, text: Lines) -> set[int]:
        return set(text.having(self.terms)) if self.terms else set()

    def lines_read(self, first_line: int, count: int) -> set[int]:
        """Of `count` lines numbered from `first_line`, the indexes of those read again (`lines`)."""
        return {n - first_line for n in self.lines if first_line <= n < first_line + count}

    def mentions(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def selective(self, text: Lines, share: float = 0.3) -> Focus:
        """The focus without the terms that most lines mention (the pattern a search was run
        for, a name on every line): keeping every line that mentions them keeps everything."""
        if not self.terms:
            return self
        limit = max(2, int(len(text.lines) * share))
        seen: dict[str, int] = {}
        for terms in text.having(self.terms).values():
            for t in terms:
                seen[t] = seen.get(t, 0) + 1
        keep = {t for t in self.terms if seen.get(t, 0) <= limit}
        if len(keep) == len(self.terms):
            return self
        return Focus(tuple(t for t in self.given if t in keep), tuple(t for t in self.derived if t in keep), self.lines)


NO_FOCUS = Focus()
WORD = re.compile(r"\w+")


def _last_part(term: str) -> str:
    base = term.rstrip("()")
    return base.rsplit("/", 1)[-1] if "/" in base else re.split(r"::|[.:]", base)[-1]


@functools.lru_cache(maxsize=4096)
def term_words(term: str) -> frozenset[str]:
    """The words a text must hold for `term` to matter to it (`Focus.within`): those of its last
    part (none: it matters to every text)."""
    return frozenset(WORD.findall(_last_part(term) or term))


@functools.lru_cache(maxsize=4096)
def whole_words(term: str) -> frozenset[str]:
    """The words of all of `term`: a text holds every one where the term occurs whole (each
    ``\\w+`` run of the term is one of the text's, its first and last bounded as whole words)."""
    return frozenset(WORD.findall(term))


class TextWords:
    """The words (``\\w+`` runs) of a text, each looked for when asked about: a text holds a word
    where it occurs with no word character on either side. A focus asks about a few words of
    an output, once, at its first render: finding every word of each output (`WORD.findall`)
    was 4-8% of a first render of 8,000 items of bench/scale.py's sessions (py-spy), and
    searching the text for a word it does not hold is one pass at C speed."""

    __slots__ = ("_held", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._held: dict[str, bool] = {}

    def holds(self, words: frozenset[str]) -> bool:
        """Whether the text holds every one of `words`."""
        return all(self._holds(word) for word in words)

    def _holds(self, word: str) -> bool:
        found = self._held.get(word)
        if found is None:
            found = self._held[word] = word in self._text and _whole(word).search(self._text) is not None
        return found


@functools.lru_cache(maxsize=1024)
def _whole(word: str) -> re.Pattern[str]:
    """`word` where it is a whole word (the words of focus terms: a few a call; 1 to 2 KB each)."""
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")


Words = frozenset[str] | TextWords
"""A text's words: all of them, or read as asked (`TextWords`)."""


def holds(words: Words, needed: frozenset[str]) -> bool:
    """Whether a text of `words` holds all of `needed`."""
    return needed <= words if isinstance(words, frozenset) else words.holds(needed)


def matters(term: str, words: Words, names: Callable[[], frozenset[str] | None] | None = None) -> bool:
    """Whether focus `term` may change the compression of a text made of `words`. Compressors
    find a term where it occurs whole in the text (a line mentioning it), and some by its last
    part alone (`Focus.names`: a path's file name, a dotted name's last): `names()` says which
    of the text's names they read so (the definitions of a skeleton of code), None any word.
    Without `names` (or when `names()` is None), a term whose last part's words the text holds
    matters; with it, ``s/a/b`` (a ``sed`` script) does not matter to code that assigns ``b``
    and holds no ``s``, unless ``b`` is a definition's name."""
    if not holds(words, term_words(term)):
        return False
    if names is None or holds(words, whole_words(term)):
        return True
    read = names()
    if read is None or term in read:
        return True
    last = _last_part(term)
    return bool(last) and last in read


class _Once:
    """`names` called once, when first needed (`Focus.within` asks for each term)."""

    __slots__ = ("_done", "_names", "_read")

    def __init__(self, names: Callable[[], frozenset[str] | None]) -> None:
        self._names = names
        self._read: frozenset[str] | None = None
        self._done = False

    def __call__(self) -> frozenset[str] | None:
        if not self._done:
            self._read, self._done = self._names(), True
        return self._read


@dataclass(frozen=True, slots=True)
class Compressed:
    kind: str
    """What the content was read as: ``log``, ``test``, ``json``, ``code``, ``search``, ``diff``, ``listing``,
    ``html``."""
    text: str
    summary: str
    """What was kept, in a few words (said in the view's header line and the certificate)."""
    lossless: bool = False
    """Nothing was left out: only repetition folded with its count, or constants factored out."""


@dataclass(slots=True)
class Kept:
    """A choice of lines of a text to show; the rest is said by ranges."""

    lines: Sequence[str]
    first: int = 1
    """The number of the first of `lines` in the whole output (markers say the output's own lines)."""
    keep: set[int] = field(default_factory=set)
    folded: dict[int, tuple[int, str]] = field(default_factory=dict)
    """start -> (stop, what to say): a range of left-out lines said in its own words
    (a repeated line's count) rather than by the generic marker."""

    def add(self, *indexes: int) -> None:
        self.keep.update(i for i in indexes if 0 <= i < len(self.lines))

    def add_range(self, start: int, stop: int) -> None:
        self.keep.update(range(max(0, start), min(len(self.lines), stop)))

    def write(self, marker: Callable[[int, int], str] | None = None) -> str:
        """The kept lines in order; each run of left-out lines becomes one marker line."""
        out: list[str] = []
        lines, keep, folded = self.lines, self.keep, self.folded
        say = marker or (lambda start, stop: elided(start, stop, first=self.first))
        i, n = 0, len(lines)
        while i < n:
            if i in keep:
                out.append(lines[i])
                i += 1
                continue
            if i in folded:
                stop, text = folded[i]
                out.append(text)
                i = stop
                continue
            j = i + 1
            while j < n and j not in keep and j not in folded:
                j += 1
            marker_text = say(i, j)
            if j - i == 1 and len(lines[i]) <= len(marker_text):
                out.append(lines[i])  # a marker would be no shorter than the line
            else:
                out.append(marker_text)
            i = j
        return "\n".join(out)

    @property
    def whole(self) -> bool:
        """Nothing is left out but folded repetition."""
        shown = set(self.keep)
        for start, (stop, _) in self.folded.items():
            shown.update(range(start, stop))
        return len(shown) >= len(self.lines)


def elided(start: int, stop: int, indent: str = "", first: int = 1) -> str:
    """The marker for lines start..stop-1 (0-based, counted from the output's line `first`) left out."""
    where = f"line {start + first}" if stop - start == 1 else f"lines {start + first}-{stop + first - 1}"
    return f"{indent}[… {where} left out …]"


def shape(line: str) -> bytes:
    """The line without its digits: lines of one shape differ only in their numbers."""
    return line.strip().encode().translate(None, b"0123456789")  # bytes: several times faster than str


# The words of a line that reports a failure, whatever wrote it (a log, a test run, a tool).
ERROR_WORDS = (
    "error", "errors", "exception", "fatal", "panic", "panicked", "traceback", "failed", "failure", "fail",
    "critical", "segmentation fault", "core dumped", "abort", "aborted", "denied", "refused", "timed out",
    "timeout", "not found", "no such file", "cannot", "could not", "unable to", "undefined", "unresolved",
    "killed", "npm err!",
)  # fmt: skip
ERROR_SUFFIXES = ("error", "exception")
"""Also at the end of a longer word: ``ValueError``, ``IOException``."""
_ERRORISH = compile_linear("|".join(re.escape(word.lower()) for word in (*ERROR_WORDS, *ERROR_SUFFIXES)))
"""Any of them, in a word or not (in lower case)."""


class Lines:
    """A text's lines and where each starts, to find the lines holding a word at C speed
    (`str.find` over the whole text) rather than a regex per line."""

    def __init__(self, text: str, lines: Sequence[str] | None = None) -> None:
        self.text = text
        self.lines = text.split("\n") if lines is None else lines
        self.starts = [0, *itertools.accumulate(len(line) + 1 for line in self.lines)]

    @classmethod
    def of(cls, parts: Sequence[str]) -> Lines:
        """Texts that may hold newlines themselves, each looked up as one "line"."""
        return cls("\n".join(parts), parts)

    @cached_property
    def lower(self) -> str:
        """The text in lower case, character for character (offsets stay those of the text:
        a character whose lower case is longer, such as ``İ``, is left as it is)."""
        lowered = self.text.lower()
        if len(lowered) == len(self.text):
            return lowered
        return "".join(c if len(c.lower()) != 1 else c.lower() for c in self.text)

    def reporting_errors(self) -> set[int]:
        """The lines that report a failure (`ERROR_WORDS`, `ERROR_SUFFIXES`)."""
        if _ERRORISH.search(self.lower) is None:
            return set()  # none of the words is anywhere in it, as most outputs (one pass: 8 µs, not 30)
        return set(self.having(ERROR_WORDS, fold_case=True)) | set(
            self.having(ERROR_SUFFIXES, fold_case=True, suffix=True)
        )

    def holding(self, needle: str) -> list[int]:
        """The lines holding `needle` (each once, however often it holds it)."""
        out: list[int] = []
        i = self.text.find(needle)
        while i != -1:
            line = self.line_of(i)
            out.append(line)
            i = self.text.find(needle, self.starts[line + 1]) if line + 1 < len(self.starts) else -1
        return out

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1

    def having(
        self, words: Iterable[str], *, fold_case: bool = False, suffix: bool = False, anywhere: bool = False
    ) -> dict[int, set[str]]:
        """line -> the `words` it holds as whole words (with `suffix`, also at the end of a
        longer word: ``ValueError`` holds ``error``; with `anywhere`, inside any word)."""
        hay = self.lower if fold_case else self.text
        found: dict[int, set[str]] = {}
        for word in words:
            needle = word.lower() if fold_case else word
            if not needle:
                continue
            i = hay.find(needle)
            while i != -1:
                end = i + len(needle)
                if anywhere or (
                    (suffix or i == 0 or not _word_char(hay[i - 1], needle[0]))
                    and (end == len(hay) or not _word_char(hay[end], needle[-1]))
                ):
                    line = self.line_of(i)
                    found.setdefault(line, set()).add(word)
                i = hay.find(needle, i + 1)
        return found


def _word_char(neighbour: str, edge: str) -> bool:
    """Whether `neighbour` continues the word whose edge character is `edge` (only a word
    character next to a word character does)."""
    return (neighbour.isalnum() or neighbour == "_") and (edge.isalnum() or edge == "_")


def fold_repeats(kept: Kept, min_run: int = 3) -> None:
    """Runs of `min_run` or more equal lines: the first is shown, the rest said with their count
    (up to the first of them kept for its own sake)."""
    lines = kept.lines
    i, n = 0, len(lines)
    while i < n:
        j = i + 1
        while j < n and lines[j] == lines[i]:
            j += 1
        if j - i < min_run:
            i = j
            continue
        stop = next((k for k in range(i + 1, j) if k in kept.keep), j)
        if stop - i >= min_run and lines[i].strip():
            kept.add(i)
            at = kept.first + i + 1
            kept.folded[i + 1] = (
                stop,
                f"[… the line above {stop - i - 1:,} more times (lines {at}-{at + stop - i - 2}) …]",
            )
        i = j
