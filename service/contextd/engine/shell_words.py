"""How a shell splits a command: its words (quotes removed, operators words of their own,
heredoc bodies left out), the commands that ``&&``, ``||``, ``;`` and newlines separate, the
stages of a pipeline; and the numbers a command spells. shell.py reads a command's effects on
files from these words; checks.py and asked.py read what a command runs and searches for."""

from __future__ import annotations

import re
import shlex

MAX_DIGITS = 18


def number(text: str) -> int | None:
    """The integer `text` spells (a sign, then decimal digits), or None: when it spells none,
    or spells it with more than MAX_DIGITS digits. No line number, count or exit status is
    that long, and `int()` refuses more than 4,300 digits (leading zeros count): on a command
    or an output of the history, that error would fail every render of the session."""
    unsigned = text[1:] if text[:1] in ("+", "-") else text
    if not unsigned.isdecimal() or len(unsigned) > MAX_DIGITS:
        return None
    return int(text)


_SEPARATORS = {"&&", ";", "||", "\n", ";;"}


def words_of(command: str) -> list[str] | None:
    """The command's words as the shell splits them, its operators (``&&``, ``|``, ``>``,
    an unquoted newline ...) words of their own and heredoc bodies left out; None when it
    does not parse (an open quote) or a heredoc's body would run something."""
    source = _without_heredocs(command)
    if source is None:
        return None
    quick = _quick_words(source)
    if quick is not None:
        return quick
    try:
        # Unquoted newlines separate commands, like `;`: they are punctuation here.
        lexer = shlex.shlex(source, posix=True, punctuation_chars=";&|<>\n")
        lexer.whitespace = " \t\r"
        lexer.whitespace_split = True
        lexer.commenters = ""
        return list(lexer)
    except ValueError:
        return None


_WORDS = re.compile(r"""[;&|<>\n]+|(?:[^;&|<>\n \t\r'"]+|'[^']*'|"[^"]*")+""")
_QUOTED = re.compile("'([^']*)'|\"([^\"]*)\"")


def _quick_words(source: str) -> list[str] | None:
    """`words_of`'s split by two regular expressions, at C speed, for a command with no
    backslash in it (most are): runs of operator characters, and words of plain and quoted
    parts; None when shlex must read it (a backslash, a quote left open). The shlex reading
    stays the reference: a test holds the two to the same words."""
    if "\\" in source:
        return None
    words, end = [], 0
    for match in _WORDS.finditer(source):
        if source[end : match.start()].strip(" \t\r"):
            return None  # a quote no word could close
        word, end = match.group(), match.end()
        if "'" in word or '"' in word:
            word = _QUOTED.sub(lambda q: q.group(1) if q.group(1) is not None else q.group(2), word)
        words.append(word)
    return None if source[end:].strip(" \t\r") else words


def _without_heredocs(command: str) -> str | None:
    """The command with each heredoc body left out (``cat <<'EOF' > f`` keeps ``cat > f``):
    the body is data, not shell; None when an unquoted body would run something."""
    out: list[str] = []
    lines = command.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        match = re.search(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1", line)
        out.append(line if match is None else line[: match.start()] + line[match.end() :])
        i += 1
        if match is not None:
            end, quoted = match.group(2), bool(match.group(1))
            while i < len(lines) and lines[i].strip() != end:
                if not quoted and ("$(" in lines[i] or "`" in lines[i]):
                    return None  # an unquoted body is expanded: this runs a command
                i += 1
            i += 1  # the terminator
    return "\n".join(out)


def split_pipeline(words: list[str]) -> list[list[str]]:
    """A command's words split into the stages of its pipeline (``|``, ``|&``); a stage may be
    empty where the command is malformed."""
    stages: list[list[str]] = [[]]
    for word in words:
        if word in ("|", "|&"):
            stages.append([])
        else:
            stages[-1].append(word)
    return stages


PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)*)?$")
"""A Python interpreter's name: ``python``, ``python3``, ``python3.11``."""


def split_commands(tokens: list[str]) -> list[list[str]]:
    """Words split into the commands that ``&&``, ``||``, ``;`` and newlines separate."""
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]
