"""Regular expressions that clients, models and policies supply.

They are compiled by RE2: matching takes time linear in the text whatever the
pattern (no backtracking, hence no backreferences or lookaround), so no pattern
can stall a render or a search, whoever wrote it. Python's `re` stays for the
engine's own fixed patterns.
"""

from __future__ import annotations

from typing import Any

import re2

from contextd.engine.errors import InvalidArgument

_OPTIONS = re2.Options()
# RE2 logs every pattern it cannot read to stderr: a client sending bad patterns in a
# loop would fill the server's log. The error still reaches the caller.
_OPTIONS.log_errors = False


class PatternError(ValueError):
    """A pattern RE2 cannot read; the message says why."""


def compile_linear(pattern: str) -> Any:
    """`pattern` compiled by RE2 (it has `search`, `finditer`, ... like a `re.Pattern`).

    Raises PatternError when RE2 cannot read it.
    """
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        message = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(message) from None


def compile_pattern(pattern: str, field: str) -> Any:
    """A request's pattern compiled by RE2; InvalidArgument naming `field` when RE2 cannot read it."""
    try:
        return compile_linear(pattern)
    except PatternError as exc:
        raise InvalidArgument.at(field, f"not a regular expression RE2 reads: {exc}") from None
