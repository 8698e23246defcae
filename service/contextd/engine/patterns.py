"""Regular expressions that clients, models and policies supply.

They are compiled by RE2: matching takes time linear in the text whatever the
pattern (no backtracking, hence no backreferences or lookaround), so no pattern
can stall a render or a search, whoever wrote it. Python's `re` stays for the
engine's own fixed patterns, but those it would read too slowly (failures.py).

RE2 lets the interpreter lock go for every match, so each match first makes way for the
event loop's thread (handoff.py): a thread matching thousands of texts would otherwise
keep the lock from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import re2

from contextd.engine.errors import InvalidArgument
from contextd.engine.handoff import make_way

_OPTIONS = re2.Options()
# RE2 logs every pattern it cannot read to stderr: a client sending bad patterns in a
# loop would fill the server's log. The error still reaches the caller.
_OPTIONS.log_errors = False


class PatternError(ValueError):
    """A pattern RE2 cannot read; the message says why."""


class LinearPattern:
    """A pattern compiled by RE2, searched as a `re.Pattern` is; each call makes way first."""

    __slots__ = ("_compiled",)

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def search(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Any:
        make_way()
        return self._compiled.search(text, pos, endpos)

    def finditer(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Iterator[Any]:
        found = self._compiled.finditer(text, pos, endpos)
        while True:
            make_way()  # before each match: RE2 finds the next one on its own call
            match = next(found, None)
            if match is None:
                return
            yield match

    def sub(self, repl: Any, text: Any, count: int = 0) -> Any:
        make_way()  # one release per match: a text with many makes way once
        return self._compiled.sub(repl, text, count)

    def __repr__(self) -> str:
        return f"LinearPattern({self._compiled.pattern!r})"


def compile_linear(pattern: str) -> LinearPattern:
    """`pattern` compiled by RE2.

    Raises PatternError when RE2 cannot read it.
    """
    try:
        return LinearPattern(re2.compile(pattern, _OPTIONS))
    except re2.error as exc:
        message = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(message) from None


def compile_pattern(pattern: str, field: str) -> LinearPattern:
    """A request's pattern compiled by RE2; InvalidArgument naming `field` when RE2 cannot read it."""
    try:
        return compile_linear(pattern)
    except PatternError as exc:
        raise InvalidArgument.at(field, f"not a regular expression RE2 reads: {exc}") from None
