"""Which check a call ran, so that a later call can be known to have run it again.

A failure stops mattering when the failure itself is answered: the same
command succeeding later, or a newer run of the same check that covers it.
"The same tool succeeded since" is no such evidence: for an agent whose only
tool is a shell, it is true almost at once. So each call is read as a
`Check`:

* a shell command as the shell user means it: its directory (``cd DIR &&``),
  and per command of the chain the program (``pytest``, ``python -m
  tools.build``, ``git apply``, ``npm run test``) with its operands (the
  words that are not options); what only shapes the output is left out
  (redirections, filters after a pipe such as ``| tail -n 30``, ``timeout
  60``, ``2>&1``), and so are steps that check nothing (``echo``, ``set
  -e``);
* another tool as what it was called on: its name, any sub-command argument
  (``command``, ``action``), and its target (the declared source argument,
  else a ``path``-like argument); without a target, its whole arguments.

A later check `covers` an earlier one when it is the same program in the
same directory and its operands include the earlier's (a path includes what
lies under it: ``tests`` includes ``tests/test_app.py::test_parse``); a test
runner given no operands runs everything.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contextd.engine.shell_words import PYTHON, split_commands, split_pipeline, words_of

Step = tuple[str, ...]
"""A program: its name and the words that say which of its commands ran."""


@dataclass(frozen=True, slots=True)
class Check:
    family: tuple[str, ...]
    """The tool, the directory and the programs of each step: the checks that may cover
    one another share it."""
    operands: tuple[frozenset[str], ...]
    """Per step, what it ran on."""
    runs_all: tuple[bool, ...]
    """Per step, whether no operands means everything (a test runner)."""


def covers(later: Check, earlier: Check) -> bool:
    """Whether `later` ran at least what `earlier` did, the same way."""
    if later.family != earlier.family:
        return False
    for old, new, everything in zip(earlier.operands, later.operands, later.runs_all, strict=True):
        if not new and everything:
            continue
        if not all(any(_within(o, n) for n in new) for o in old):
            return False
    return True


def _within(operand: str, wider: str) -> bool:
    """``tests/test_app.py::test_x`` lies within ``tests/test_app.py`` and ``tests``."""
    if operand == wider:
        return True
    return operand.startswith(wider) and operand[len(wider) : len(wider) + 1] in ("/", ":")


# --------------------------------------------------------------- shell

_OUTPUT_FILTERS = {
    "head", "tail", "grep", "egrep", "fgrep", "sort", "uniq", "wc", "cut", "nl", "cat", "tr", "column", "less",
    "more", "tee", "sed", "awk", "jq", "fold", "fmt", "ts",
}  # fmt: skip
"""After a pipe, these shape what is shown of the output: the check is what feeds them."""
_SAYS_NOTHING = {"echo", "printf", "true", ":", "set", "clear", "sleep", "date", "pwd", "export"}
_WRAPPERS = {"time": 0, "nice": 0, "nohup": 0, "env": 0, "sudo": 0, "stdbuf": 0, "timeout": 1, "xvfb-run": 0}
"""Commands that run the rest of the line, with how many of their own operands come first."""
_SUBCOMMANDS = {
    "git", "npm", "yarn", "pnpm", "bun", "cargo", "go", "docker", "kubectl", "pip", "pip3", "uv", "poetry",
    "npx", "dotnet", "mvn", "gradle", "bundle", "rake", "helm", "terraform", "conda", "apt", "apt-get", "brew",
    "deno", "mix", "composer", "gem", "rustup", "tox", "nox", "hatch", "pdm", "just", "bazel",
}  # fmt: skip
"""Programs whose first operand names which of their commands runs (``git apply``)."""
_RUNNERS = {"run", "exec", "x"}
"""Sub-commands that run another program named next (``npm run test``, ``uv run pytest``)."""
_TEST_RUNNERS = {
    ("pytest",), ("python", "-m", "unittest"), ("cargo", "test"), ("cargo", "build"), ("cargo", "check"),
    ("cargo", "clippy"), ("npm", "test"), ("yarn", "test"), ("pnpm", "test"), ("npm", "run", "test"),
    ("yarn", "run", "test"), ("pnpm", "run", "test"), ("tox",), ("nox",), ("jest",), ("vitest",), ("tsc",),
}  # fmt: skip
"""Programs that, given no operands, run every test or check of the project they are in."""
_OPERATORS = {"|", "|&", "&", ">", ">>", ">|", "&>", "&>>", ">&", "<", "<>", "<<<"}


def shell_check(command: str) -> Check | None:
    """The check a shell command runs; None when it cannot be read as one."""
    tokens = words_of(command)
    if tokens is None:
        return None
    directory = ""
    family: list[str] = []
    operands: list[frozenset[str]] = []
    runs_all: list[bool] = []
    for words in split_commands(tokens):
        if words[0] in ("cd", "pushd"):
            directory = posixpath.normpath(posixpath.join(directory, words[1])) if len(words) == 2 else "?"
            continue
        step = _step(_first_stage(words))
        if step is None:
            continue
        program, ran_on = step
        family.append(" ".join(program))
        operands.append(ran_on)
        runs_all.append(program in _TEST_RUNNERS)
    if not family:
        return None
    return Check(("shell", directory, *family), tuple(operands), tuple(runs_all))


def _first_stage(words: list[str]) -> list[str]:
    """The words of the pipeline that run the check: what feeds the output filters, without
    redirections."""
    stages = split_pipeline(words)
    kept = [s for s in stages if s and s[0] not in _OUTPUT_FILTERS] or stages[:1]
    out: list[str] = []
    for stage in kept:
        skip = False
        for i, word in enumerate(stage):
            if skip:
                skip = False
                continue
            if word in _OPERATORS:
                skip = True  # the redirection's target
                continue
            if word.isdigit() and i + 1 < len(stage) and stage[i + 1] in _OPERATORS:
                continue  # `2>&1`'s descriptor
            out.append(word)
    return out


def _step(words: list[str]) -> tuple[Step, frozenset[str]] | None:
    """The program a simple command runs and its operands; None for one that checks nothing."""
    while words and ("=" in words[0] and not words[0].startswith(("-", "="))):
        words = words[1:]  # `CI=1 pytest`: the environment
    while words and words[0] in _WRAPPERS:
        rest = words[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        words = rest[_WRAPPERS[words[0]] :]
    if not words or words[0] in _SAYS_NOTHING:
        return None
    name = posixpath.basename(words[0])
    args = words[1:]
    if PYTHON.match(name):
        return _python(args)
    if name in ("py.test", "pytest"):
        return ("pytest",), _operands(args)
    program: list[str] = [name]
    if name in _SUBCOMMANDS:
        sub = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
        if sub is not None:
            program.append(args[sub])
            args = args[sub + 1 :]
            if program[1] in _RUNNERS and args and not args[0].startswith("-"):
                if name in ("uv", "poetry", "pdm", "hatch", "conda", "bundle"):
                    return _step(args)  # `uv run pytest -x`: pytest
                program.append(args[0])
                args = args[1:]
    return tuple(program), _operands(args)


def _python(args: list[str]) -> tuple[Step, frozenset[str]]:
    if len(args) >= 2 and args[0] == "-m":
        module, rest = args[1], args[2:]
        if module == "pytest":
            return ("pytest",), _operands(rest)
        return ("python", "-m", module), _operands(rest)
    if len(args) >= 2 and args[0] == "-c":
        return ("python", "-c", args[1]), _operands(args[2:])
    script = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if script is None:
        return ("python",), frozenset()
    return ("python", _path(args[script])), _operands(args[script + 1 :])


def _operands(args: list[str]) -> frozenset[str]:
    return frozenset(_path(a) for a in args if a and not a.startswith("-"))


def _path(word: str) -> str:
    stripped = word[2:] if word.startswith("./") else word
    return stripped.rstrip("/") or word


# --------------------------------------------------------------- other tools

_TARGETS = ("path", "file_path", "filepath", "file", "filename", "target_file", "uri", "url", "notebook_path")
_SUBCOMMAND_ARGS = ("command", "action", "operation", "mode")


def tool_check(tool: str, arguments: Mapping[str, Any] | None, source_arg: str = "") -> Check:
    """The check a call of a tool that is not a shell ran: the tool on its target."""
    if arguments is None:
        return Check((tool, "?"), (frozenset(),), (False,))
    sub = tuple(
        f"{k}={arguments[k]}" for k in _SUBCOMMAND_ARGS if isinstance(arguments.get(k), str) and len(arguments[k]) <= 40
    )
    for key in (source_arg, *_TARGETS) if source_arg else _TARGETS:
        target = arguments.get(key)
        if isinstance(target, str) and target:
            return Check((tool, *sub), (frozenset({target}),), (False,))
    whole = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return Check((tool, *sub, whole), (frozenset(),), (False,))
