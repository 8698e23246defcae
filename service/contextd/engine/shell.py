"""What a shell command does to files, read conservatively (issue: built-in strategies).

Many agents have a single shell tool: their file reads and edits are shell
commands. A prune may rest on what a command did only when that is certain,
so this module recognises a small set of command shapes and calls
everything else *unknown*, which proves nothing and may have written
anything:

* reads: ``cat``, ``nl -ba``, ``head``, ``sed -n 'A,Bp'`` (a file, or a part
  of it by line numbers, possibly through ``nl -ba F | sed -n ...``), whose
  output is shown (not redirected, not behind ``||``); listings and searches
  (``ls``, ``find``, ``grep``, ``rg``, ``git status|diff|log|show``, ``wc``
  ...) change nothing but show no file whole;
* writes: ``sed -i``, output redirections (``>``, ``>>``, heredocs into a
  file), ``tee``, ``rm``/``touch``/``mkdir``, ``patch FILE``; a write is
  *in place* when it changes a file line for line (one ``s///`` with no
  newline in what it puts);
* unknown: anything else, and any shape not recognised in full: scripts,
  test runs, ``git`` commands that change the work tree, ``cp``/``mv``,
  recursive or glob writes, variables, command and process substitution,
  subshells, comments, a ``cd`` left in effect for the next command.

``cd DIR &&`` prefixes are followed, so relative paths resolve to the same
file whichever way the agent named it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from contextd.engine.shell_words import number, split_commands, words_of

WHOLE: tuple[tuple[int, int], ...] = ((1, 10**12),)
"""The span of a read of a whole file."""


@dataclass(frozen=True, slots=True)
class Read:
    path: str
    span: tuple[tuple[int, int], ...] | None
    """Line ranges read (inclusive); WHOLE for the whole file; None when the part
    read is not known by line numbers (a search, a tail, a filtered read)."""


@dataclass(frozen=True, slots=True)
class Effects:
    reads: tuple[Read, ...] = ()
    """What the command's output shows of files."""
    writes: tuple[str, ...] = ()
    unknown: bool = False
    """Some part was not recognised: it may have read or written anything."""
    listing: bool = False
    """Its output shows more than its reads (a listing, a search, a message)."""
    command: str = field(default="", compare=False)
    in_place: tuple[str, ...] = ()
    """Those of `writes` changed line for line (``sed -i 's/a/b/'``): no line moved."""
    shell_state: bool = False
    """It may have changed the shell itself (its directory, its variables) for the
    commands after it, in a shell that persists between calls."""


UNKNOWN = Effects(unknown=True)
SHELL_STATE = Effects(unknown=True, shell_state=True)
_BUILTINS = {"cd", "pushd", "popd", "source", ".", "eval", "exec", "export", "unset", "set", "alias", "shopt", "umask"}
"""Commands that change the shell they run in (not a program it starts)."""

_LISTINGS = {
    "ls",
    "find",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "ag",
    "wc",
    "pwd",
    "echo",
    "which",
    "file",
    "stat",
    "diff",
    "tree",
    "du",
    "df",
    "printf",
    "true",
    "whoami",
    "date",
}
_FILTERS = {"head", "tail", "grep", "egrep", "fgrep", "sort", "uniq", "wc", "cut", "sed", "nl", "cat", "tr", "column"}
"""What may follow a pipe: reads its input, writes only its output (checked further below)."""
_GIT_READS = {"status", "diff", "log", "show", "blame", "branch", "ls-files", "rev-parse", "grep"}
_WRITERS = {"rm", "touch", "mkdir", "rmdir", "tee", "truncate", "chmod", "chown"}
_SED_RANGES = re.compile(r"^(\d+)(?:,(\d+))?p$")
_EXPANDS = re.compile(r"\$\(|`|\$[A-Za-z_{@*#?$!0-9]|<\(|>\(")
_GLOB = re.compile(r"[*?\[]")


def effects(command: str, cwd: str = "") -> Effects:
    """What `command` reads and writes, resolving relative paths against `cwd` (and any
    ``cd`` in it); UNKNOWN unless every part of it is recognised."""
    tokens = words_of(command)
    if tokens is None:
        return UNKNOWN
    # What runs something else, or changes what a word means, is not read here:
    # expansions and substitutions, subshells and groups, comments.
    if any(_EXPANDS.search(t) or t[:1] in "(){}#" or t[-1:] in ")" for t in tokens):
        return UNKNOWN
    segments = split_commands(tokens)
    if any(s[0] in _BUILTINS and (s[0] != "cd" or s is segments[-1]) for s in segments):
        return SHELL_STATE  # e.g. a directory that stays changed for the next command
    gathered = _Gathered()
    for segment in segments:
        if segment[0] == "cd":
            if len(segment) != 2:
                return UNKNOWN
            cwd = _resolve(cwd, segment[1])
            continue
        found = _pipeline(segment, cwd)
        if found is None or found.unknown:
            return UNKNOWN
        gathered.add(found)
    if "||" in tokens:
        # A part behind `||` may not have run, and one before it may have failed
        # unseen (the chain still succeeds): what the output shows is not known.
        gathered.reads = [Read(r.path, None) for r in gathered.reads]
        gathered.listing = True
    return gathered.effects(command)


class _Gathered:
    """The effects of the parts of a command, put together."""

    def __init__(self) -> None:
        self.reads: list[Read] = []
        self.writes: list[str] = []
        self.in_place: list[str] = []
        self.moving: set[str] = set()
        self.listing = False

    def add(self, found: Effects) -> None:
        self.reads.extend(found.reads)
        self.writes.extend(found.writes)
        self.in_place.extend(found.in_place)
        self.moving.update(w for w in found.writes if w not in found.in_place)
        self.listing = self.listing or found.listing

    def effects(self, command: str = "") -> Effects:
        if any(_GLOB.search(w) for w in self.writes):
            return UNKNOWN  # which files a pattern names is not known here
        kept = tuple(dict.fromkeys(w for w in self.in_place if w not in self.moving))  # written both ways: moved
        return Effects(tuple(self.reads), tuple(dict.fromkeys(self.writes)), False, self.listing, command, kept)


def _pipeline(segment: list[str], cwd: str) -> Effects | None:
    """A pipeline of simple commands with redirections; None when not recognised."""
    parts: list[list[str]] = [[]]
    for token in segment:
        if token == "|":
            parts.append([])
        elif token in ("&", "|&"):
            return None  # background jobs, odd pipes
        else:
            parts[-1].append(token)
    if any(not p for p in parts):
        return None
    gathered = _Gathered()
    hidden = False
    for index, part in enumerate(parts):
        redirected = _redirections(part, cwd)
        if redirected is None:
            return None
        words, targets, stdout_away = redirected
        gathered.add(Effects(writes=tuple(targets)))
        hidden = hidden or stdout_away
        if not words:
            continue
        if index > 0:
            if not _filters(words):
                return None
            continue
        found = _simple(words, cwd)
        if found is None:
            return None
        gathered.add(found)
    if hidden:
        gathered.reads = []  # the output went elsewhere: it shows nothing of what was read
        gathered.listing = True
    elif len(parts) > 1:
        # A read through filters shows a part of the file, but which lines is not
        # known by number, except `nl -ba F | sed -n 'A,Bp'`.
        span = _numbered_range(parts) if len(gathered.reads) == 1 else None
        gathered.reads = [Read(r.path, span) for r in gathered.reads]
        gathered.listing = gathered.listing or span is None
    return gathered.effects()


_REDIRECTS = {">", ">>", ">|", "&>", "&>>", ">&", "<", "<>"}


def _redirections(words: list[str], cwd: str) -> tuple[list[str], list[str], bool] | None:
    """The words without redirections, the files written by them, and whether the
    standard output goes elsewhere; None when a redirection is not recognised."""
    out: list[str] = []
    targets: list[str] = []
    stdout_away = False
    i = 0
    while i < len(words):
        word = words[i]
        descriptor = ""
        if word.isdigit() and i + 1 < len(words) and words[i + 1] in _REDIRECTS:
            descriptor, i = word, i + 1  # `2>&1`, `2> err.log`
            word = words[i]
        if word not in _REDIRECTS:
            out.append(word)  # operators come out as words of their own: this one was quoted
            i += 1
            continue
        if i + 1 >= len(words):
            return None
        target = words[i + 1]
        to_stdout = descriptor in ("", "1")
        if word == ">&" and target.isdigit():
            stdout_away = stdout_away or (to_stdout and target != "1")  # `>&2`: the output goes to the errors
        elif word == "<":
            pass
        elif word == "<>":
            targets.append(_resolve(cwd, target))
        else:
            stdout_away = stdout_away or to_stdout or word in ("&>", "&>>")
            if target != "/dev/null":
                targets.append(_resolve(cwd, target))
        i += 2
    return out, targets, stdout_away


def _filters(words: list[str]) -> bool:
    """Whether a command after a pipe only filters its input to its output."""
    name, args = words[0], words[1:]
    if name not in _FILTERS:
        return False
    files = [a for a in args if not a.startswith("-")]
    if name == "sort":
        return not any(a.startswith(("-o", "--output")) for a in args)
    if name == "uniq":
        return len(files) <= 1  # `uniq in out` writes out
    if name == "sed":
        found = _sed(args, "")
        return found is not None and not found.writes
    return True


def _simple(words: list[str], cwd: str) -> Effects | None:
    name, args = words[0], words[1:]
    if "=" in name:
        return None  # `VAR=value command`: an environment for something else
    if name == "cat":
        return _whole_reads(args, {"-n", "-A"}, cwd)
    if name == "nl":
        return _whole_reads(args, {"-ba"}, cwd)
    if name == "head":
        return _head(args, cwd)
    if name == "tail":
        tailed = _files_after_options(args, {"-n", "-c"})
        return None if tailed is None else Effects(tuple(Read(_resolve(cwd, f), None) for f in tailed), listing=True)
    if name == "sed":
        return _sed(args, cwd)
    if name in _LISTINGS:
        runs_or_writes = ("-delete", "-exec", "-execdir", "-ok", "-okdir")
        if name == "find" and any(a in runs_or_writes or a.startswith("-f") for a in args):
            return None  # runs something, or writes a file (-fprint, -fls ...)
        if name == "tree" and "-o" in args:
            return None
        return Effects(listing=True)
    if name == "git":
        sub = next((a for a in args if not a.startswith("-")), "")
        if sub in _GIT_READS and not any(a.startswith(("--output", "-o")) for a in args):
            return Effects(listing=True)
        return None  # git commands that change the work tree change files not named
    if name in _WRITERS:
        files = [a for a in args if not a.startswith("-")]
        if not files or any(a.startswith("-") and set(a[1:]) & set("rRa") for a in args if name == "rm"):
            return None
        return Effects(writes=tuple(_resolve(cwd, f) for f in files))
    if name == "patch":
        files = [a for a in args if not a.startswith("-")]
        return Effects(writes=(_resolve(cwd, files[0]),)) if len(files) in (1, 2) else None
    return None


def _whole_reads(args: list[str], options: set[str], cwd: str) -> Effects | None:
    files = [a for a in args if not a.startswith("-")]
    if any(a.startswith("-") and a not in options for a in args):
        return None
    if not files:
        return Effects(listing=True)  # reading its input (a heredoc, a pipe): a filter
    return Effects(tuple(Read(_resolve(cwd, f), WHOLE) for f in files))


def _head(args: list[str], cwd: str) -> Effects | None:
    count, files, i = 10, [], 0
    while i < len(args):
        arg = args[i]
        if arg == "-n" and i + 1 < len(args) and args[i + 1].isdigit():
            given = number(args[i + 1])
            if given is None:
                return None
            count, i = given, i + 2
            continue
        if re.fullmatch(r"-n?\d+", arg):
            given = number(arg.lstrip("-n"))
            if given is None:
                return None
            count, i = given, i + 1
            continue
        if arg.startswith("-"):
            return None
        files.append(arg)
        i += 1
    if not files:
        return Effects(listing=True)  # reading its input: a filter
    return Effects(tuple(Read(_resolve(cwd, f), ((1, count),)) for f in files))


def _sed(args: list[str], cwd: str) -> Effects | None:
    scripts: list[str] = []
    words: list[str] = []
    in_place = quiet = separate = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1])
            i += 2
            continue
        if arg == "-i" or arg.startswith(("-i", "--in-place")):
            in_place = True
        elif arg in ("-n", "--quiet", "--silent"):
            quiet = True
        elif arg in ("-s", "--separate"):
            separate = True
        elif arg in ("-E", "-r", "--regexp-extended", "-u"):
            pass
        elif arg.startswith("-"):
            return None  # -f (a script file), -z (lines are not lines), combined flags, anything else
        else:
            words.append(arg)
        i += 1
    if not scripts:
        if not words:
            return None
        scripts, words = [words[0]], words[1:]
    files = tuple(_resolve(cwd, f) for f in words)
    if in_place:
        if not files or quiet or not all(_edits_only(s) for s in scripts):
            return None  # -n -i keeps only what is printed; other commands may write or run
        in_line = all(_substitutes_in_line(script) for script in scripts)
        return Effects(writes=files, in_place=files if in_line else ())
    if not quiet or len(scripts) != 1:
        return None
    spans = _sed_spans(scripts[0])
    if spans is None:
        return None
    if not files:
        return Effects(listing=True)  # a filter
    if len(files) > 1 and not separate:
        return None  # without -s the files' lines are numbered as one stream
    return Effects(tuple(Read(f, spans) for f in files))


_SUBSTITUTION = re.compile(r"s([/|#,:@])((?:\\.|(?!\1).)*)\1((?:\\.|(?!\1).)*)\1([gIi0-9]*)")
_LINE_EDIT = re.compile(r"(?:\d+(?:,\d+)?|/[^/]*/)(?:d|[aic] .*)")
_NEWLINE_ESCAPES = re.compile(r"\\(?:n|x0[aA]|o012|d010|c[jJ])")


def _edits_only(script: str) -> bool:
    """One substitution, or a deletion or text added at an address: nothing that writes
    another file or runs a command (`w`, `e`, `r` ...)."""
    script = script.strip()
    return _SUBSTITUTION.fullmatch(script) is not None or _LINE_EDIT.fullmatch(script) is not None


def _substitutes_in_line(script: str) -> bool:
    """Whether a sed script is one substitution that cannot add or remove a line."""
    match = _SUBSTITUTION.fullmatch(script.strip())
    return match is not None and "\n" not in script and not _NEWLINE_ESCAPES.search(match.group(3))


def _sed_spans(script: str) -> tuple[tuple[int, int], ...] | None:
    spans = []
    for part in script.split(";"):
        match = _SED_RANGES.match(part.strip())
        if match is None:
            return None
        first = number(match.group(1))
        last = number(match.group(2)) if match.group(2) else first
        if first is None or last is None or last < first:
            return None
        spans.append((first, last))
    return tuple(spans) if spans else None


def _numbered_range(parts: list[list[str]]) -> tuple[tuple[int, int], ...] | None:
    """The line ranges of ``nl -ba F | sed -n 'A,Bp'`` (numbering every line, then a range)."""
    if len(parts) != 2:
        return None
    first, second = parts
    if first[:2] != ["nl", "-ba"] or len(first) != 3:
        return None
    if len(second) != 3 or second[:2] != ["sed", "-n"]:
        return None
    return _sed_spans(second[2])


def _files_after_options(args: list[str], with_value: set[str]) -> list[str] | None:
    files, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in with_value:
            i += 2
            continue
        if re.fullmatch(r"-n?\+?\d+", arg):
            i += 1
            continue
        if arg.startswith("-"):
            return None
        files.append(arg)
        i += 1
    return files


def _resolve(cwd: str, path: str) -> str:
    if path.startswith("~"):
        return path
    joined = path if posixpath.isabs(path) or not cwd else posixpath.join(cwd, path)
    return posixpath.normpath(joined)


def covers(newer: tuple[tuple[int, int], ...], older: tuple[tuple[int, int], ...]) -> bool:
    """Whether the line ranges `newer` include every line of `older`."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(newer):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return all(any(a <= first and last <= b for a, b in merged) for first, last in older)
