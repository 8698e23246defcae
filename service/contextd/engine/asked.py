"""What the agent's recent calls asked for, read as a shell user means them: focus terms.

The focus otherwise takes from the latest turns only the words that look like
identifiers (``parse_header``, ``src/app.py``), so that ``the`` or ``file``
never keeps a line. A word the agent searched for is no ordinary word
however plain it is: after ``grep -n "def validate(" src/app.py``, the body of
``validate`` is what the agent is about to read. So these are taken as the
agent's own focus, used as they are:

* the patterns of ``grep``/``egrep``/``fgrep``/``rg``/``ag``/``ack``/``git grep``
  (and a search tool's ``pattern``/``query`` argument), regex syntax stripped
  to the words it matches (``def\\s+validate\\(`` → ``validate``);
* the names in a ``python -c`` snippet (``from app.forms import validate`` →
  ``app.forms``, ``validate``);
* the file of a ``sed -n``/``head``/``tail``/``cat`` range, whatever its name;
  and the range itself (`ranges_read`): those lines of the file, in another
  output that shows them (an earlier ``cat`` of it), are kept as they are.

Keywords of the languages searched (``def``, ``class``, ``import`` ...) are
left out: every line of code holds them.
"""

from __future__ import annotations

import json
import keyword
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Protocol

from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, ToolUseBlock
from contextd.engine.observations import Observation
from contextd.engine.shell import WHOLE
from contextd.engine.shell_words import PYTHON, split_commands, split_pipeline, words_of
from contextd.engine.types import ReadAgain

MAX_SEARCHED = 12
"""Terms taken from the recent calls, the newest first."""
RECENT_CALLS = 4
"""Assistant turns with calls whose arguments count (stages/draft.py keeps them)."""

_SEARCHES = {"grep", "egrep", "fgrep", "rg", "ag", "ack"}
_SEARCH_VALUED = {"-e", "--regexp", "-f", "--file", "-m", "--max-count", "-A", "-B", "-C", "--context", "-g",
                  "--glob", "-t", "--type", "--include", "--exclude", "-d", "--max-depth"}  # fmt: skip
"""Options that take the next word as their value (only `-e`'s is a pattern)."""
_READERS = {"sed", "head", "tail", "cat", "nl", "less", "bat"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_REGEX_ESCAPE = re.compile(r"\\[a-zA-Z]")
"""``\\s``, ``\\w``, ``\\b``: a class or an anchor, not a letter to match."""
_COMMON = frozenset(keyword.kwlist) | {
    "def", "class", "function", "func", "fn", "return", "import", "from", "self", "cls", "const", "let", "var",
    "async", "await", "pub", "struct", "impl", "type", "interface", "print", "true", "false", "null", "None",
    "True", "False", "this", "new", "static", "public", "private", "void", "int", "str", "len", "sys", "os",
}  # fmt: skip
_PATTERN_ARGS = ("pattern", "regex", "query", "search_term", "search", "needle")
_COMMAND_ARGS = ("command", "cmd", "script")


class Declared(Protocol):
    @property
    def effect(self) -> str: ...
    @property
    def command_arg(self) -> str: ...


def searched_terms(calls: Iterable[Item], tools: Mapping[str, Declared]) -> tuple[str, ...]:
    """The terms the calls of `calls` (assistant items, oldest first) searched for or named, the
    newest call's first."""
    found: list[str] = []
    for item in reversed(list(calls)):
        found.extend(_searched.get((item, tools), partial(_of_item, item, tools)))
    return tuple(dict.fromkeys(found))[:MAX_SEARCHED]


def ranges_read(calls: Iterable[Item], answer: Callable[[str], Observation | None]) -> ReadAgain:
    """The line ranges the calls of `calls` (assistant items) read of files, as their outputs'
    observations say (``sed -n 5,40p f``, ``head -n 20 f``; not a whole file, not a search):
    per read, its path, the seq of its output and its lines, the newest call's first."""
    found = []
    for item in reversed(list(calls)):
        for call in item.tool_uses:
            seen = answer(call.id)
            if seen is not None:
                found += [(r.path, seen.seq, r.span) for r in seen.reads if r.span is not None and r.span != WHOLE]
    return tuple(found)


def _of_item(item: Item, tools: Mapping[str, Declared]) -> tuple[str, ...]:
    return tuple(term for call in item.tool_uses for term in _of_call(call, tools))


_searched: IdentityMemo[tuple[str, ...]] = IdentityMemo(1_000)
"""Per assistant item (and the policy's tools), its calls' terms: a call stays among the recent
ones for several renders."""


def _of_call(call: ToolUseBlock, tools: Mapping[str, Declared]) -> list[str]:
    try:
        arguments = json.loads(call.input_json)
    except ValueError:
        return []
    if not isinstance(arguments, dict):
        return []
    spec = tools.get(call.name)
    names = (spec.command_arg,) if spec is not None and spec.effect == "shell" else _COMMAND_ARGS
    terms: list[str] = []
    for name in names:
        command = arguments.get(name)
        if isinstance(command, str):
            terms.extend(command_terms(command))
    for name in _PATTERN_ARGS:
        pattern = arguments.get(name)
        if isinstance(pattern, str):
            terms.extend(pattern_words(pattern))
    return terms


def command_terms(command: str) -> list[str]:
    """What a shell command searched for or named (see the module's docstring)."""
    words = words_of(command)
    if words is None:
        return []
    terms: list[str] = []
    for part in split_commands(words):
        for stage in split_pipeline(part):
            terms.extend(_of_stage(stage))
    return list(dict.fromkeys(terms))


def _of_stage(words: list[str]) -> list[str]:
    if not words:
        return []
    name = posixpath.basename(words[0])
    args = words[1:]
    if name == "git" and args[:1] == ["grep"]:
        name, args = "grep", args[1:]
    if name in _SEARCHES:
        return [w for p in _patterns(args) for w in pattern_words(p)]
    if PYTHON.match(name) and len(args) >= 2 and args[0] == "-c":
        return [w for w in _WORD.findall(args[1]) if _worth(w)]
    if name in _READERS:
        return [a for a in args if not a.startswith("-") and ("/" in a or re.search(r"\.\w+$", a))]
    return []


def _patterns(args: list[str]) -> list[str]:
    """A search's patterns: each `-e`'s value, else its first operand."""
    given: list[str] = []
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-e", "--regexp") and i + 1 < len(args):
            given.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--regexp="):
            given.append(arg.split("=", 1)[1])
        elif arg in _SEARCH_VALUED:
            i += 1  # its value
        elif not arg.startswith("-") or arg == "-":
            operands.append(arg)
        i += 1
    return given or operands[:1]


def pattern_words(pattern: str) -> list[str]:
    """The words a search pattern matches literally: ``def\\s+validate\\(`` → ``validate``."""
    plain = _REGEX_ESCAPE.sub(" ", pattern)
    return [w for w in _WORD.findall(plain) if _worth(w)]


def _worth(word: str) -> bool:
    return len(word) >= 3 and word not in _COMMON
