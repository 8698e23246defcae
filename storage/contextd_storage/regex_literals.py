"""The literal strings every match of an RE2 regular expression contains, for an index to
narrow the texts RE2 then reads.

Read from the pattern's own syntax (RE2's, with its default options: Perl classes, word
boundaries, flags i, m, s and U), conservatively: whatever this reader is unsure of
(alternation, optional or repeated parts, classes, a syntax it does not know) yields no
literal there, never a wrong one, so a pattern it cannot read at all yields none and is
matched against every text. Under case folding (``(?i)``) only ASCII characters without
case (digits, punctuation, spaces) stay literal: RE2 folds a letter with others (``k``
with the Kelvin sign, ``s`` with the long s) that no database index folds alike. Read
`caseless`, the literals hold up to ASCII case instead (for a case-insensitive `LIKE`):
the ASCII letters but those two fold only with each other, so they stay literal, lowered.

Hand-written because nothing installable gives these literals: RE2 computes them itself
(FilteredRE2's atoms), but the google-re2 binding's `Filter.Compile` keeps them inside
and answers only whether it compiled, and Python's `sre_parse` reads Python's syntax, not
RE2's (it refuses ``\\C``, ``\\pN`` and ``(?U)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["MOST_LITERALS", "ascii_lower", "required_literals"]

MOST_LITERALS = 8
"""Most literals returned (the longest): any subset of them narrows soundly."""
_MAX_DEPTH = 64
"""Deeper nesting of groups yields no literals (the reader recurses once per group)."""
_REPEAT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
"""What could be a counted repetition; read as RE2 does below, or the pattern is given up."""
_HEX = re.compile(r"\{([0-9A-Fa-f]+)\}|([0-9A-Fa-f]{2})")
_OCTAL = re.compile(r"[0-7]{1,3}")
_OCTAL_DIGITS = frozenset("01234567")
_CONTROL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "f": "\f", "v": "\v"}
_ZERO_WIDTH_ESCAPES = frozenset("bBAz")
_CLASS_ESCAPES = frozenset("dDsSwWC")
_CASELESS = frozenset(chr(c) for c in range(1, 128) if not chr(c).isalpha())
"""Characters RE2 matches only as themselves under case folding (tests/storage/test_regex_literals.py)."""
_FOLDED_BEYOND_ASCII = frozenset("kKsS")
"""The ASCII letters RE2 folds with a character outside ASCII too (the Kelvin sign, the long s)."""
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """`text` with its ASCII letters lowered and every other character as it is (as SQLite's
    `LIKE` compares)."""
    return text.translate(_ASCII_LOWER)


def required_literals(pattern: str, caseless: bool = False) -> tuple[str, ...]:
    """Strings every match of `pattern` holds (at most MOST_LITERALS, longest first); none
    when the pattern offers none this reader is sure of. `pattern` is one RE2 compiled.

    `caseless`: strings every match holds up to ASCII case (`ascii_lower` of the match holds
    them), lowered: under ``(?i)`` these keep the letters that fold within ASCII."""
    reader = _Reader(pattern, caseless)
    try:
        found = reader.alternation(depth=0)
    except _Unsure:
        return ()
    if reader.at < len(pattern):  # a ")" with no group open: RE2 refuses it
        return ()
    literals = {*found.required, *([found.exact] if found.exact else [])}
    return tuple(sorted(literals, key=lambda s: (-len(s), s))[:MOST_LITERALS])


class _Unsure(Exception):
    """The reader does not know what this part of the pattern means."""


@dataclass(slots=True)
class _Info:
    """What a part of a pattern matches: exactly one string (`exact`), or texts holding
    every one of `required`."""

    exact: str | None = None
    required: list[str] = field(default_factory=list)


def _anything() -> _Info:
    return _Info()


class _Reader:
    """Reads a pattern as RE2's parser does, left to right; `folded`: whether case folding is
    on here (a flag holds to the end of its group, across its alternatives)."""

    def __init__(self, pattern: str, caseless: bool = False) -> None:
        self.pattern = pattern
        self.caseless = caseless
        self.at = 0
        self.folded = False

    def peek(self, ahead: int = 0) -> str:
        place = self.at + ahead
        return self.pattern[place] if place < len(self.pattern) else ""

    def alternation(self, depth: int) -> _Info:
        """Up to the ")" closing the group (not consumed) or the end."""
        if depth > _MAX_DEPTH:
            raise _Unsure
        branches = [self.concatenation(depth)]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.concatenation(depth))
        exacts = {b.exact for b in branches}
        if len(branches) == 1:
            return branches[0]
        # Alternatives that are one and the same string are that string; otherwise any text.
        return _Info(exact=exacts.pop()) if len(exacts) == 1 and None not in exacts else _anything()

    def concatenation(self, depth: int) -> _Info:
        required: list[str] = []
        run = ""
        whole = True
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "(" and self.peek(1) == "?" and self._flags_alone():
                self.flags()
                continue
            parts = self.atom(depth)
            if not parts and self._repetition_follows():
                raise _Unsure  # as in "a\\Q\\E*": RE2 repeats what came before
            if parts:
                parts[-1] = self.repeated(parts[-1])
            for part in parts:
                if part.exact is not None:
                    run += part.exact
                    continue
                whole = False
                if run:
                    required.append(run)
                run = ""
                required.extend(part.required)
        if whole:
            return _Info(exact=run)
        return _Info(required=[*required, *([run] if run else [])])

    def _flags_alone(self) -> bool:
        """Whether the "(?" here sets flags for the rest of the group, as "(?i)" does."""
        end = self.at + 2
        while end < len(self.pattern) and self.pattern[end] in "imsU-":
            end += 1
        return end < len(self.pattern) and self.pattern[end] == ")"

    def flags(self) -> None:
        """Reads "(?flags)", or the "(?flags:" opening a group."""
        self.at += 2
        on = True
        while self.peek() in ("i", "m", "s", "U", "-"):
            if self.peek() == "-":
                on = False
            elif self.peek() == "i":
                self.folded = on
            self.at += 1
        if self.peek() not in (")", ":"):
            raise _Unsure
        self.at += 1

    def _repetition_follows(self) -> bool:
        return self.peek() in ("*", "+", "?") or (
            self.peek() == "{" and _REPEAT.match(self.pattern, self.at) is not None
        )

    def atom(self, depth: int) -> list[_Info]:
        """The next atom: one part, or each character of a \\Q...\\E (a repetition takes the last)."""
        char = self.peek()
        if char == "(":
            return [self.group(depth)]
        if char == "[":
            self.skip_class()
            return [_anything()]
        if char == ".":
            self.at += 1
            return [_anything()]
        if char in ("^", "$"):
            self.at += 1
            return [_Info(exact="")]
        if self._repetition_follows():
            raise _Unsure  # a repetition of nothing (or of a flag): not read
        if char == "\\":
            return self.escape()
        self.at += 1
        return [self.literal(char)]

    def group(self, depth: int) -> _Info:
        outside = self.folded
        if self.peek(1) == "?":
            if (self.peek(2) == "P" and self.peek(3) == "<") or self.peek(2) == "<":
                end = self.pattern.find(">", self.at)
                if end < 0:
                    raise _Unsure
                self.at = end + 1
            else:
                self.flags()  # "(?flags:"
        else:
            self.at += 1
        inside = self.alternation(depth + 1)
        if self.peek() != ")":
            raise _Unsure
        self.at += 1
        self.folded = outside
        return inside

    def repeated(self, part: _Info) -> _Info:
        """`part` with the repetition that follows it, if any."""
        char = self.peek()
        if char in ("*", "?"):
            least, self.at = 0, self.at + 1
        elif char == "+":
            least, self.at = 1, self.at + 1
        elif char == "{" and (found := _REPEAT.match(self.pattern, self.at)) is not None:
            low, high = found.group(1), found.group(3)
            # RE2 reads {n}, {n,} and {n,m}, numbers without a leading zero; a brace
            # otherwise like it is not read (RE2 may take it for literal characters).
            if not _is_count(low) or (high and not _is_count(high)):
                raise _Unsure
            least, self.at = int(low), found.end()
        else:
            return part
        if self.peek() == "?":  # lazy
            self.at += 1
        if least == 0:
            return _anything()
        return _Info(required=[*part.required, *([part.exact] if part.exact else [])])

    def escape(self) -> list[_Info]:
        letter = self.peek(1)
        if letter in _ZERO_WIDTH_ESCAPES:
            self.at += 2
            return [_Info(exact="")]
        if letter in _CLASS_ESCAPES:
            self.at += 2
            return [_anything()]
        if letter in ("p", "P"):
            self.at += 2
            if self.peek() == "{":
                end = self.pattern.find("}", self.at)
                if end < 0:
                    raise _Unsure
                self.at = end + 1
            else:
                self.at += 1
            return [_anything()]
        if letter == "Q":
            end = self.pattern.find("\\E", self.at + 2)
            stop = end if end >= 0 else len(self.pattern)
            quoted = self.pattern[self.at + 2 : stop]
            self.at = stop + 2 if end >= 0 else stop
            return [self.literal(c) for c in quoted]
        if letter in _CONTROL_ESCAPES:
            self.at += 2
            return [self.literal(_CONTROL_ESCAPES[letter])]
        if letter == "x":
            found = _HEX.match(self.pattern, self.at + 2)
            if found is None or int(found.group(1) or found.group(2), 16) > 0x10FFFF:
                raise _Unsure
            self.at = found.end()
            return [self.literal(chr(int(found.group(1) or found.group(2), 16)))]
        if letter in _OCTAL_DIGITS:
            digits = _OCTAL.match(self.pattern, self.at + 1)
            if digits is None or (letter != "0" and len(digits.group(0)) == 1):
                raise _Unsure  # a digit alone is a backreference: RE2 refuses it
            self.at = digits.end()
            return [self.literal(chr(int(digits.group(0), 8)))]
        if letter and letter.isascii() and not letter.isalnum():
            self.at += 2
            return [self.literal(letter)]
        raise _Unsure

    def skip_class(self) -> None:
        """Past a character class, its "]" included, as RE2 reads one."""
        self.at += 1
        if self.peek() == "^":
            self.at += 1
        first = True  # a "]" first is one of the class
        while True:
            char = self.peek()
            if not char:
                raise _Unsure
            if char == "]" and not first:
                self.at += 1
                return
            first = False
            if char == "[" and self.peek(1) == ":":
                end = self.pattern.find(":]", self.at + 2)
                if end >= 0:  # RE2 reads "[:" up to the first ":]" as a class name
                    self.at = end + 2
                    continue
            if char == "\\":
                letter = self.peek(1)
                if not letter:
                    raise _Unsure
                self.at += 2
                if letter in ("p", "P", "x") and self.peek() == "{":
                    end = self.pattern.find("}", self.at)
                    if end < 0:
                        raise _Unsure
                    self.at = end + 1
                continue
            self.at += 1

    def literal(self, char: str) -> _Info:
        """A character matched as itself; any text when case folding may match it otherwise,
        and for NUL (stored texts hold none, and Postgres binds none). Read `caseless`, a
        letter is its ASCII lower case, and under folding one that folds only within ASCII
        is literal too."""
        if char == "\x00":
            return _anything()
        if self.caseless:
            if self.folded and (not char.isascii() or char in _FOLDED_BEYOND_ASCII):
                return _anything()
            return _Info(exact=ascii_lower(char))
        if self.folded and char not in _CASELESS:
            return _anything()
        return _Info(exact=char)


def _is_count(digits: str | None) -> bool:
    return digits is not None and digits != "" and (digits == "0" or digits[0] != "0")
