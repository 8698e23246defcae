"""Reading shell commands conservatively (service/contextd/engine/shell.py)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.shell import WHOLE, Read, covers, effects
from contextd.engine.shell_words import _without_heredocs, words_of


@pytest.mark.parametrize(
    ("command", "reads", "writes"),
    [
        ("cat src/a.py", [Read("/r/src/a.py", WHOLE)], []),
        ("cat a.py b.py", [Read("/r/a.py", WHOLE), Read("/r/b.py", WHOLE)], []),
        ("nl -ba a.py", [Read("/r/a.py", WHOLE)], []),
        ("head -n 30 a.py", [Read("/r/a.py", ((1, 30),))], []),
        ("head a.py", [Read("/r/a.py", ((1, 10),))], []),
        ("sed -n '10,20p' a.py", [Read("/r/a.py", ((10, 20),))], []),
        ("sed -n '5p;30,40p' a.py", [Read("/r/a.py", ((5, 5), (30, 40)))], []),
        ("nl -ba a.py | sed -n '700,750p'", [Read("/r/a.py", ((700, 750),))], []),
        ("cat a.py | grep foo", [Read("/r/a.py", None)], []),
        ("tail -n 20 log.txt", [Read("/r/log.txt", None)], []),
        ("cd /repo && cat a.py", [Read("/repo/a.py", WHOLE)], []),
        ("cat a.py 2>/dev/null", [Read("/r/a.py", WHOLE)], []),
        ("grep -rn foo src | head -5", [], []),
        ("ls -la", [], []),
        ("git status", [], []),
        ("git diff src/a.py", [], []),
        ("find . -name '*.py'", [], []),
        ("sed -i 's/a/b/' a.py", [], ["/r/a.py"]),
        ("cat <<'EOF' > new.py\nprint(1)\nEOF", [], ["/r/new.py"]),
        ("echo hi >> notes.txt", [], ["/r/notes.txt"]),
        ("ls > out.txt 2>&1", [], ["/r/out.txt"]),
        ("rm -f build.log", [], ["/r/build.log"]),
        ("patch a.py fix.patch", [], ["/r/a.py"]),
        ("cat a.py > /dev/null && echo ok", [], []),  # the output went elsewhere: nothing shown
        ("cat a.py > backup.py", [], ["/r/backup.py"]),
        ("cat a.py 2>&1", [Read("/r/a.py", WHOLE)], []),
        ("grep -q TODO a.py || cat a.py", [Read("/r/a.py", None)], []),  # it may not have run
        ("sed -n -s '1,5p' a.py b.py", [Read("/r/a.py", ((1, 5),)), Read("/r/b.py", ((1, 5),))], []),
    ],
)
def test_what_a_command_reads_and_writes(command: str, reads: list[Read], writes: list[str] | None) -> None:
    found = effects(command, "/r")
    if writes is None:
        assert found.unknown
        return
    assert not found.unknown, command
    assert (list(found.reads), list(found.writes)) == (reads, writes)


@pytest.mark.parametrize(
    "command",
    [
        "python3 reproduce.py",
        "pytest tests",
        "cd /repo && python -m pytest",
        "sed -n '/def foo/,/def/p' a.py",  # addresses by pattern: which lines is not known
        "cat $(ls)",
        "cat `ls`",
        "find . -name '*.pyc' -delete",
        "cat a.py &",
        "make",
        "cd a b",
        'python -c "print(1)\ncat x"',
        "cat 'unbalanced",
        # Found by a second reading: each would have let a prune rest on a wrong claim.
        "rm -rf build",
        "mv a.py b.py",
        "cp /tmp/app.py src/",
        "cp -r /tmp/pristine/. src",
        "git checkout src/a.py",
        "git checkout HEAD~3",
        "git stash",
        "git apply fix.patch",
        "git diff --output=out.txt",
        "sed -i '3d' src/*.py",
        "diff <(python3 fix.py) expected.txt",
        "cat > notes.txt <<EOF\n$(python3 fix.py)\nEOF",
        'cd "`python3 fix.py`" && ls',
        'ls > "$(python3 fix.py)"',
        "cat $F",
        "env PYTHONPATH=src python3 fix.py",
        "PYTHONPATH=src python3 fix.py",
        "echo | awk -i inplace 'NR!=3' a.py",
        "ls | sort -o a.py a.py",
        "ls | uniq in.txt out.txt",
        "ls | sed -ni 's/a/b/' a.py",
        "sed -i -z 's/\\n/ /g' a.py",
        "sed -n -i 's/foo/bar/' a.py",
        "sed -i 's/a/b/w out' a.py",
        "sed -n '1,5p' a.py b.py",  # without -s the two files' lines are numbered as one
        "nl -b a app.py",  # -b takes a value: `a` is not a file
        "cat src/util.py  # compare with src/app.py",
        "(cd tests && cat a.py)",
        "find . -name '*.py' -fprint out.txt",
        "tree -o out.txt",
        "cd tests",  # in a shell that persists, every later relative path changes meaning
        "export F=a.py",
    ],
)
def test_anything_not_recognised_in_full_is_unknown(command: str) -> None:
    assert effects(command, "/r").unknown


@pytest.mark.parametrize(
    ("command", "in_place"),
    [
        ("sed -i 's/a/b/g' a.py", ["/r/a.py"]),
        ("sed -i 's|x/y|z|' a.py", ["/r/a.py"]),
        ("sed -i -e 's/a/b/' -e 's/c/d/' a.py", ["/r/a.py"]),
        ("sed -i 's/a/b\\nc/' a.py", []),  # the replacement adds a line
        ("sed -i 's/, /\\x0a/g' a.py", []),  # so does this one
        ("sed -i '120d' a.py", []),
        ("sed -i '/x/a y' a.py", []),
        ("sed -i 's/a/b/' a.py && sed -i '3d' a.py", []),
        ("cat <<'EOF' > a.py\nx\nEOF", []),
    ],
)
def test_which_writes_keep_every_line_where_it_was(command: str, in_place: list[str]) -> None:
    found = effects(command, "/r")
    assert not found.unknown and found.writes and list(found.in_place) == in_place


def test_line_ranges_cover() -> None:
    assert covers(((1, 50),), ((10, 20),))
    assert covers(((1, 10), (11, 20)), ((5, 15),))
    assert not covers(((1, 10), (12, 20)), ((5, 15),))
    assert covers(WHOLE, ((3, 4),))


def _shlex_words(command: str) -> list[str] | None:
    """`words_of` by shlex alone, heredoc bodies left out first."""
    source = _without_heredocs(command)
    if source is None:
        return None
    lexer = shlex.shlex(source, posix=True, punctuation_chars=";&|<>\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return None


@settings(max_examples=3_000)
@given(st.text(st.sampled_from(list("ab1_ \t\r\n;&|<>()$*?=~-./#{}[]!%^,:@+é\x00\x0b'\"\\")), max_size=30))
def test_a_command_splits_into_the_words_shlex_splits_it_into(command: str) -> None:
    # The quick split (no backslash) must be shlex's: the effects of every command rest on it.
    assert words_of(command) == _shlex_words(command)


@pytest.mark.parametrize(
    "command",
    [
        "sed -n '10,20p' a.py",
        'grep -rn "def  validate(" src|head',
        "echo ''\"\"x",
        "cat 'a b.py'>\"out file\"",
        "echo 'open",
        'echo "open',
        "echo a\\ b",
        "ls 2>&1 | sort >out",
    ],
)
def test_quoted_words_split_as_shlex_splits_them(command: str) -> None:
    assert words_of(command) == _shlex_words(command)
