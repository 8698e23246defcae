"""The literals a pattern's every match holds: read as RE2 reads the pattern, never one a
match could lack."""

from __future__ import annotations

import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.patterns import PatternError, compile_linear
from contextd_storage.regex_literals import MOST_LITERALS, ascii_lower, required_literals

ALPHABET = "abAB kKſ\u212aé1_-{},:]["
"""Letters RE2 folds with others (k, K, the Kelvin sign; s with ſ), RE2's syntax as text."""
TOKENS = st.sampled_from(
    [
        *"abAkKſé1_ -,:",
        *(r"\.", r"\Q.*\E", r"\x41", r"\x{212A}", r"\101", r"\d", r"\w", r"\s", r"\b", r"\pL", r"\p{Greek}"),
        *(".", "^", "$", "[ab]", "[^a]", "[]a]", "[[:alpha:]]", "[[:x]", r"[\]a]", "{", "}", "{,2}", "{01}"),
        *("*", "+", "?", "*?", "{2}", "{0,1}", "{1,}", "|", "(", ")", "(?:", "(?i)", "(?-i)", "(?i:", "(?P<n>"),
        *("(?s)", "(?m)", "(?U)", r"\Q", r"\E", "\\"),
    ]
)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    return "".join(draw(st.lists(TOKENS, max_size=12)))


@settings(max_examples=3000, deadline=None)
@given(patterns(), st.lists(st.text(alphabet=ALPHABET, max_size=30), min_size=1, max_size=8))
def test_every_match_holds_every_literal(pattern: str, texts: list[str]) -> None:
    try:
        compiled = compile_linear(pattern)
    except PatternError:
        return
    literals = required_literals(pattern)
    caseless = required_literals(pattern, caseless=True)
    assert len(literals) <= MOST_LITERALS and all(literals)
    assert len(caseless) <= MOST_LITERALS and all(caseless) and all(c == ascii_lower(c) for c in caseless)
    # Texts made of the pattern's own characters, so that many of them match.
    plain = "".join(c for c in pattern if c not in "\\()[]|*+?^$.")
    for text in [*texts, plain, plain + plain, plain.swapcase(), "".join(texts) + plain]:
        for match in compiled.finditer(text):
            assert all(literal in match.group(0) for literal in literals), (pattern, text, match.group(0))
            lowered = ascii_lower(match.group(0))
            assert all(literal in lowered for literal in caseless), (pattern, text, match.group(0))


@settings(max_examples=500, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_a_pattern_that_is_a_quoted_text_requires_that_text(text: str) -> None:
    if "\x00" in text:
        return
    assert required_literals(re2.escape(text)) == (text,)


def test_what_is_read_and_what_is_given_up() -> None:
    cases = {
        r"ch_[0-9A-Za-z]{8} declined": (" declined", "ch_"),
        r"1 failed, \w+ assertion": (" assertion", "1 failed, "),
        r"foo(bar)?baz": ("baz", "foo"),
        r"foo(bar)+baz": ("bar", "baz", "foo"),
        r"(?P<name>abc)d$": ("abcd",),
        r"\x41\x{42}C\101": ("ABCA",),
        r"\Qa.b\E+c": ("a.", "b", "c"),
        r"a{b": ("a{b",),  # not a repetition: RE2 reads the brace as itself
        r"[]abc]def[[:alpha:]]xyz": ("def", "xyz"),
        r"(?i)ERR_42 (?-i)found": ("_42 found",),
        r"(?i:abc)_12": ("_12",),
        r"abc|abd": (),
        r"abc|abc": ("abc",),
        r"\d{3}-\d{4}": ("-",),
        r"(?i)insufficient funds": (" ",),
        r"a(?i)bc|de": (),
        r"x{,2}yz": (),  # RE2 reads "{,2}" as text: given up, not misread
        r"a(?i)*b": (),  # the repetition takes the "a" before the flag
        r"a\x00b": ("a", "b"),
        "(" * 100 + "abc" + ")" * 100: (),
    }
    for pattern, literals in cases.items():
        compile_linear(pattern)
        assert required_literals(pattern) == literals, pattern


def test_up_to_ascii_case_a_folded_letter_is_literal_unless_re2_folds_it_beyond_ascii() -> None:
    cases = {
        r"(?i)insufficient funds": ("ufficient fund", "in"),  # "s" matches the long s too
        r"(?i)KEY_42": ("ey_42",),  # "k" matches the Kelvin sign too
        r"(?i)ERR_42 (?-i)Found": ("err_42 found",),
        r"Café(?i)Crème": ("cafécr", "me"),  # under folding, "è" is not read
        r"(?i:abc)|(?i:ABC)": ("abc",),
        r"\x{212A}EY": ("\u212aey",),  # the Kelvin sign itself, not folded
        r"(?i)\d+ failed": (" failed",),
    }
    for pattern, literals in cases.items():
        compile_linear(pattern)
        assert required_literals(pattern, caseless=True) == literals, pattern


def test_only_the_longest_literals_are_kept() -> None:
    pattern = ".".join(f"w{n:02d}" + "x" * n for n in range(20))
    literals = required_literals(pattern)
    assert len(literals) == MOST_LITERALS and literals[0] == "w19" + "x" * 19


def test_under_case_folding_re2_matches_ascii_non_letters_as_themselves_only() -> None:
    """Why `(?i)` keeps those as literals and no letter: ``k`` matches the Kelvin sign too."""
    every = "".join(chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    for code in range(1, 128):
        char = chr(code)
        found = {m.group(0) for m in compile_linear("(?i)" + re2.escape(char)).finditer(every)}
        assert (found == {char}) == (not char.isalpha()), repr(char)
    assert {m.group(0) for m in compile_linear("(?i)k").finditer(every)} == {"k", "K", "\u212a"}
    # Why the literals up to ASCII case keep every letter but k and s: the others fold within ASCII.
    for letter in "abcdefghijklmnopqrstuvwxyz":
        found = {m.group(0) for m in compile_linear("(?i)" + letter).finditer(every)}
        beyond = {"k": {"\u212a"}, "s": {"\u017f"}}.get(letter, set())
        assert found == {letter, letter.upper(), *beyond}, letter
