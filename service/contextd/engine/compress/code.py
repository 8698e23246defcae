"""Source code as a skeleton: what is defined where, with the bodies the focus names whole.

Kept verbatim: imports, module-level statements, class headers, every
function's decorators and signature, and the first line of its docstring;
a body is said by its line range (lines of the output as shown, so they can
be asked for). A function or class the focus names stays whole, and so do
body lines that mention the focus.

With `examples` (a skeleton read in place of the file by the very call that
read it, which has seen none of its bodies), what an agent writes new code
from stays whole too: the setup of a test module (``setUp``,
``setUpTestData``, pytest's ``setup_*`` and fixtures), which builds the
objects its tests use, and each short body (fewer than SHORT_BODY lines: one
use of the module's names and its check) but one alike a body shown before
it (the same statements but for names and literals: the one shown says how
the other is written).

Python is read with `ast`; a fragment that does not parse (a range of lines
cut from a file) by its indentation; JavaScript, TypeScript, Go, Rust and
Java with tree-sitter grammars packaged on the registry (nothing is
downloaded). Line-numbered output (``nl -ba``, ``cat -n``) is read without
its numbers and shown with them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from contextd.engine.compress.examples import FIXTURE, SETUP, SHORT_BODY, body_shape, builds
from contextd.engine.compress.text import Compressed, Focus, Kept, Lines, Remembered, elided

_NUMBERED = re.compile(r"^\s*\d+(?:\t|  )")
_NUMBER = re.compile(r"^\s*(\d+)(?:\t|  )")
_MIN_BODY = 4
"""Bodies shorter than this many lines are shown: a marker would save little."""
EXTENSIONS = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
}


@dataclass(frozen=True, slots=True)
class Body:
    """A definition's body: lines [start, stop) of the source, elidable unless the focus names it."""

    name: str
    start: int
    stop: int
    elidable: bool = True
    """False for a class (its members' bodies are elided one by one): it only says what a
    focus on its name keeps whole."""
    setup: bool = False
    """A test module's setup or fixture (Python): what builds the objects its tests use."""


def compress_code(
    text: str, focus: Focus, language: str = "", first_line: int = 1, examples: bool = False
) -> Compressed | None:
    """The skeleton of `text` (None when it is not code this reads); `examples`: keep what an
    agent writes new code from (as the module docstring says)."""
    lines, source_lines, source, language = _source(text, language)
    if not language:
        return None
    bodies, how = _bodies(source, source_lines, language)
    if bodies is None:
        return None
    kept = Kept(lines, first_line)
    kept.add_range(0, len(lines))
    mentioned = focus.lines_mentioning(Lines(source, source_lines)) | focus.lines_read(first_line, len(lines))
    whole = [(b.start, b.stop) for b in bodies if b.name in focus.names]
    hidden = 0
    shown: set[str] = set()  # with `examples`, the shapes of the short bodies shown
    for body in bodies:
        if not body.elidable or body.stop - body.start < _MIN_BODY or body.name in focus.names:
            continue
        if examples and body.setup:
            continue
        if examples and body.stop - body.start < SHORT_BODY:
            shape = body_shape(source_lines[body.start : body.stop])
            if shape not in shown:
                shown.add(shape)
                continue
        if any(start <= body.start and body.stop <= stop for start, stop in whole):
            continue  # inside a definition the focus names: shown whole
        if any(i not in kept.keep for i in range(body.start, body.stop)):
            continue  # inside a body already left out
        for i in range(body.start, body.stop):
            kept.keep.discard(i)
        mentions = [i for i in range(body.start, body.stop) if i in mentioned]
        kept.add(*mentions)
        hidden += body.stop - body.start - len(mentions)
    if not hidden:
        # Read as code, with nothing to leave out (the focus names what is here, or the bodies
        # are short): it stays whole. None would have it read another way, as lines, and lose
        # what the focus keeps.
        return Compressed("code", text, "nothing left out", lossless=True) if bodies else None

    comment = "# " if language == "python" else "// "

    def marker(start: int, stop: int) -> str:
        line = source_lines[start]
        indent = line[: len(line) - len(line.lstrip())]
        numbers = [m.group(1) for i in range(start, stop) if (m := _NUMBER.match(lines[i]))]
        if not numbers:
            return elided(start, stop, indent + comment, first_line)
        # Say the file's own line numbers, as the output shows them.
        return f"{' ' * 7}\t{indent}{comment}[… lines {numbers[0]}-{numbers[-1]} left out …]"

    summary = f"skeleton ({language}, {how}): {len(lines) - hidden:,} of {len(lines):,} lines kept, bodies left out"
    return Compressed("code", kept.write(marker), summary)


def names(text: str, language: str = "") -> frozenset[str]:
    """The names of the definitions `compress_code` reads in `text`: a focus term whose last
    part is one keeps its body whole, wherever else the term occurs (`text.matters`)."""
    _, source_lines, source, language = _source(text, language)
    if not language:
        return frozenset()
    bodies, _ = _bodies(source, source_lines, language)
    return frozenset(body.name for body in bodies or ())


def _source(text: str, language: str) -> tuple[list[str], list[str], str, str]:
    """(the lines of `text`, the lines of source (without the numbers a numbered listing gives
    them), the source, its language: `language`, or sniffed; "" when it is not code)."""
    lines = text.split("\n")  # not splitlines(): a form feed or U+2028 inside a line is not a line break
    source_lines = [_NUMBERED.sub("", line, count=1) for line in lines] if _numbered(lines) else lines
    source = "\n".join(source_lines)
    return lines, source_lines, source, language or sniff_language(source)


def _numbered(lines: Sequence[str]) -> bool:
    """Whether (nearly) every line with something on it starts with its number (``nl -ba``,
    ``cat -n``; plain ``nl`` leaves blank lines unnumbered)."""
    head = [line for line in lines[:30] if line.strip()]
    if sum(1 for line in head if _NUMBERED.match(line)) < 0.9 * len(head):
        return False  # most outputs: decided on their first lines
    filled = [line for line in lines if line.strip()]
    return sum(1 for line in filled if _NUMBERED.match(line)) >= 0.9 * max(1, len(filled))


def sniff_language(source: str) -> str:
    head = source[:4000]
    # A definition, or imports at the margin (two of them: a README may say `import x` once).
    if re.search(r"^\s*(?:def|class|async def) \w+.*:\s*$", head, re.MULTILINE) or (
        len(re.findall(r"^(?:from \S+ )?import \w", head, re.MULTILINE)) >= 2
    ):
        return "python"
    if re.search(r"^package \w+|^func (?:\(\w+ \*?\w+\) )?\w+\(", head, re.MULTILINE):
        return "go"
    if re.search(r"^\s*(?:pub )?fn \w+|^\s*impl\b|^use \w+::", head, re.MULTILINE):
        return "rust"
    if re.search(
        r"^\s*(?:public|private|protected) (?:static )?(?:final )?(?:class|interface|\w+ \w+\()", head, re.MULTILINE
    ):
        return "java"
    if re.search(r"^\s*(?:export )?(?:interface|type) \w+|: (?:string|number|boolean)\b", head, re.MULTILINE):
        return "typescript"
    if re.search(r"^\s*(?:export )?(?:async )?function\b|^\s*(?:const|let|var) \w+ = |=> \{", head, re.MULTILINE):
        return "javascript"
    return ""


def _bodies(source: str, lines: Sequence[str], language: str) -> tuple[tuple[Body, ...] | None, str]:
    """The definitions of `source` and how they were read; remembered by content, since an
    output is compressed again each time the focus that concerns it moves."""
    key = (language, hashlib.sha256(source.encode()).digest())
    return PARSED.get(key, lambda: _parsed_bodies(source, lines, language))


PARSED: Remembered[tuple[tuple[Body, ...] | None, str]] = Remembered(20_000, 16 << 20)
"""Definitions by language and content hash (about 300 bytes a definition), to 16 MiB: an output
is compressed again whenever a focus term it holds comes or goes, and a session's modules are
read again in any order (512 of them, the bound before, was half the modules of a long session:
every other recompression parsed its module again)."""


def may_hold_bodies(source: str) -> bool:
    """Whether Python `source` may hold a body: a definition, or a statement over more than one
    line. False only when neither can be there, so the parse (the most a first render spends on
    a module's output, about 5 µs a line) is left out for outputs of modules without either
    (constants, settings, imports, generated tables): they read as they would parsed.

    Source that does not parse holds no body without a definition (the indentation reader starts
    at one), so what is said here needs to hold for source that parses only. There, a ``def`` or
    ``class`` is the word, unjoined to another, and a statement goes on past its line by a
    backslash, a string in triple quotes, or a bracket left open. The brackets are those left
    when strings and comments are taken out as the tokenizer reads them (on one line, with no
    triple quotes and no backslash at a line's end, each ends on its line; from Python 3.12 an
    f-string's fields may span lines and hold its own quotes, so source with one is parsed
    there) and the other ASCII characters after them, line by line (at ``\\r`` too, as the
    parser breaks lines): in source that parses, a bracket spans lines only if some line opens
    more than it closes."""
    if ("def" in source or "class" in source) and _DEFINING.search(source):
        return True
    if '"""' in source or "'''" in source or _CONTINUED.search(source):
        return True
    if _NESTED_QUOTES and _FORMATTED.search(source):
        return True  # an f-string's fields may hold its own quotes and span lines (PEP 701)
    lines = _WRITTEN.sub("", source).translate(_BRACKETS_ONLY).replace("\r", "\n").split("\n")
    return any(_opened(line) for line in set(lines))


def _opened(brackets: str) -> int:
    """How many more brackets `brackets` opens than it closes."""
    return sum(map(brackets.count, "([{")) - sum(map(brackets.count, ")]}"))


_DEFINING = re.compile(r"\b(?:def|class)\b")
_LONE_CR = re.compile(r"\r(?!\n)")
_NESTED_QUOTES = sys.version_info >= (3, 12)
_FORMATTED = re.compile(r"(?<!\w)(?:[fFtT][rR]?|[rR][fFtT])[\"']")
"""An f-string's prefix, or a t-string's (3.14: the same rules)."""
_CONTINUED = re.compile(r"\\(?:[\r\n]|\Z)")
_WRITTEN = re.compile(r"#[^\r\n]*|'(?:[^'\\\r\n]|\\.)*'?|\"(?:[^\"\\\r\n]|\\.)*\"?")
"""A comment, or a string on one line (its prefix, letters, goes with the other characters). A
string left open runs to the line's end: source with one does not parse (and each quote is
read once: a pattern that looked for the closing quote from every quote took time as the
square of a line of them)."""
_BRACKETS_ONLY = {c: None for c in range(128) if chr(c) not in "()[]{}\r\n"}
"""The other ASCII characters out (any other stays, and is counted as no bracket)."""


def _parsed_bodies(source: str, lines: Sequence[str], language: str) -> tuple[tuple[Body, ...] | None, str]:
    if language == "python":
        if not may_hold_bodies(source):
            return (), "ast"
        if "\r" in source and _LONE_CR.search(source):
            # The parser breaks lines at a lone carriage return, the lines shown do not: its
            # line numbers would point past what is shown. Read as the lines are shown.
            return tuple(_indented_bodies(lines)), "by indentation"
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting recurses in the parser
            return tuple(_indented_bodies(lines)), "by indentation"
        return tuple(_python_bodies(tree, lines)), "ast"
    grammar = _grammar(language)
    if grammar is None:
        return None, ""
    # A parser of its own per parse (cheap beside the parse): renders may run on several
    # threads, and a tree-sitter parser is not to be shared between them.
    import tree_sitter

    parsed = parse_bounded(tree_sitter.Parser(grammar), source.encode())
    if parsed is None:
        return None, ""
    return tuple(_tree_sitter_bodies(parsed.root_node, lines)), "tree-sitter"


PARSE_STEPS = 2_000
PARSE_STEPS_PER_KB = 60
PARSE_SECONDS = 1.0
"""The work a tree-sitter parse may do: its progress checks (one per ~100 parser operations,
the same count for the same input on any machine). Real JavaScript takes 7 per KB (20 at
most, over 796 files of npm's), but the parser's error recovery is worse than linear on
text that is not code at all (48 KB of ``a:b a:b`` kept it a minute): past the budget, the
output is read as lines. Counted, so a file is read the same way every time; and, as a last
bound for text whose every step is slow, never longer than PARSE_SECONDS (which real code
of the largest item a session takes, 1 MB, is far from)."""


def parse_bounded(parser: Any, data: bytes, steps: int | None = None) -> Any | None:
    """The tree of `data`, or None when parsing it needs more than `steps` progress checks (by
    default PARSE_STEPS and PARSE_STEPS_PER_KB of it) or PARSE_SECONDS."""
    budget = PARSE_STEPS + PARSE_STEPS_PER_KB * len(data) // 1024 if steps is None else steps
    deadline = time.monotonic() + PARSE_SECONDS
    taken = 0

    def over(*_: Any) -> bool:
        nonlocal taken
        taken += 1
        return taken > budget or time.monotonic() > deadline

    def read(offset: int, _point: Any) -> bytes:
        return data[offset : offset + 65_536]

    try:
        # (The progress callback is only called when the source comes in chunks.)
        return parser.parse(read, progress_callback=over)
    except ValueError:  # given up
        parser.reset()  # (else the next parse would resume this one)
        return None
    except BaseException:
        parser.reset()
        raise


def _python_bodies(tree: ast.Module, lines: Sequence[str]) -> Iterator[Body]:
    yield from _long_statements(tree.body, lines)
    for node in _definitions(tree.body):
        body = node.body
        first = body[0]
        if isinstance(node, ast.ClassDef):
            yield Body(node.name, node.lineno - 1, node.end_lineno or node.lineno, elidable=False)
            yield from _long_statements(body, lines)
            continue
        if _is_docstring(first):
            if len(body) == 1 and first.end_lineno == first.lineno:
                continue
            # The docstring's first line of text stays; the rest of it goes with the body.
            start = first.lineno if first.end_lineno != first.lineno else body[1].lineno - 1
            if _QUOTES_ONLY.match(lines[first.lineno - 1]):
                start += 1
        else:
            start = first.lineno - 1
        stop = node.end_lineno or start
        # A body on the signature's own line (def f(): return 1) has nothing to elide.
        if start >= stop or start <= node.lineno - 1:
            continue
        yield Body(node.name, start, stop, setup=builds(node))


_BLOCKS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.TryStar,
    ast.Match,
)
"""The statements that hold statements."""


def _definitions(body: Sequence[ast.stmt]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Every function and class, outer ones first, walking statements only (never into
    expressions: a walk over every node costs more than the parse)."""
    for statement in body:
        if not isinstance(statement, _BLOCKS):
            continue  # a simple statement holds no statements
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield statement
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(statement, name, None)
            if isinstance(inner, list):
                yield from _definitions(inner)
        for branch in getattr(statement, "handlers", None) or getattr(statement, "cases", None) or ():
            yield from _definitions(branch.body)


LONG_STATEMENT = 8
"""A docstring or a statement (a table, a long literal) of a module or a class this many lines
long or longer keeps its first line (of text, for a docstring)."""


def _long_statements(body: Sequence[ast.stmt], lines: Sequence[str]) -> Iterator[Body]:
    for statement in body:
        if not isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)):
            continue  # definitions, and blocks that may hold them (if, try ...), are read inside
        end = statement.end_lineno or statement.lineno
        if end - statement.lineno + 1 < LONG_STATEMENT:
            continue
        start = statement.lineno  # 0-based: the line after the statement's first
        if _is_docstring(statement) and _QUOTES_ONLY.match(lines[statement.lineno - 1]):
            start += 1
        yield Body("", start, end)


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


_QUOTES_ONLY = re.compile(r"^\s*[rRbBuU]?(?:\"\"\"|\'\'\')\s*$")
"""A docstring that opens on a line of its own: its text starts on the next line."""
_PY_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+(\w+)")
SIGNATURE_LINES = 20


def _indented_bodies(lines: Sequence[str]) -> Iterator[Body]:
    """Python that does not parse on its own (a cut range): a `def` owns the lines indented
    deeper than it that follow its signature; lines a cut range opens with, deeper than the
    first definition, are the rest of a body (its first line stays)."""
    first_def = next((i for i, line in enumerate(lines) if _PY_DEF.match(line)), len(lines))
    if first_def == len(lines):
        return  # no definition: nothing to make a skeleton of (the lines are read another way)
    margin = _indent(lines[first_def])
    opening = next(i for i, line in enumerate(lines) if line.strip())
    if opening < first_def and _indent(lines[opening]) > margin:
        stop = opening + 1
        while stop < first_def and (not lines[stop].strip() or _indent(lines[stop]) > margin):
            stop += 1
        yield Body("", opening + 1, stop)
    for i, line in enumerate(lines):
        match = _PY_DEF.match(line)
        if not match:
            continue
        indent = _indent(line)
        # The signature: up to the line ending with ':' (a few lines at most; a one-line
        # definition, `def f(): return 1`, has no body of its own to leave out).
        j = next((k for k in range(i, min(i + SIGNATURE_LINES, len(lines))) if lines[k].rstrip().endswith(":")), None)
        if j is None:
            continue
        start = j + 1
        stop = start
        while stop < len(lines) and (not lines[stop].strip() or _indent(lines[stop]) > indent):
            stop += 1
        while stop > start and not lines[stop - 1].strip():
            stop -= 1
        if start < len(lines) and re.match(r'\s*[rRbBuU]?("""|\'\'\')', lines[start]):
            start += 2 if _QUOTES_ONLY.match(lines[start]) else 1  # the docstring's first line of text stays
        if line.lstrip().startswith("class"):
            yield Body(match.group(2), i, stop, elidable=False)
        elif stop > start:
            name = match.group(2)
            setup = name in SETUP or (i > 0 and FIXTURE.match(lines[i - 1]) is not None)
            yield Body(name, start, stop, setup=setup)


def _indent(line: str) -> int:
    expanded = line.expandtabs()
    return len(expanded) - len(expanded.lstrip())


# ------------------------------------------------------------------ tree-sitter

_FUNCTIONS = {
    "function_declaration",
    "generator_function_declaration",
    "method_definition",
    "function_expression",
    "arrow_function",
    "function_item",
    "method_declaration",
    "constructor_declaration",
    "func_literal",
}
_CONTAINERS = {
    "class_declaration",
    "class",
    "abstract_class_declaration",
    "interface_declaration",
    "impl_item",
    "trait_item",
    "mod_item",
    "enum_declaration",
}


@functools.cache
def _grammar(language: str) -> Any | None:
    """The tree-sitter grammar of `language` from its installed package (None when not installed)."""
    try:
        import tree_sitter
    except ImportError:
        return None
    modules = {
        "javascript": ("tree_sitter_javascript", "language"),
        "typescript": ("tree_sitter_typescript", "language_typescript"),
        "tsx": ("tree_sitter_typescript", "language_tsx"),
        "go": ("tree_sitter_go", "language"),
        "rust": ("tree_sitter_rust", "language"),
        "java": ("tree_sitter_java", "language"),
    }
    if language not in modules:
        return None
    module_name, function = modules[language]
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return tree_sitter.Language(getattr(module, function)())


_DESCEND = _CONTAINERS | {
    "program",
    "source_file",
    "export_statement",
    "class_body",
    "declaration_list",
    "interface_body",
    "enum_body",
    "lexical_declaration",
    "variable_declaration",
    "variable_declarator",
    "expression_statement",
    "assignment_expression",
    "pair",
    "object",
}
"""Where definitions are found: a file's top level, classes, declarations (``const f = () =>``).
The walk does not go into function bodies (what is in them goes with them) nor into
other expressions, so a large file costs little more than its parse."""


def _tree_sitter_bodies(root: Any, lines: Sequence[str]) -> Iterator[Body]:
    stack = [root]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in _FUNCTIONS:
            body = node.child_by_field_name("body")
            if body is not None and body.type in ("statement_block", "block", "constructor_body"):
                # The lines strictly inside the braces: the signature and the closing brace stay.
                start, stop = body.start_point[0] + 1, body.end_point[0]
                if stop > start:
                    yield Body(_name(node), start, stop)
            continue
        if kind in _CONTAINERS and node.is_named:  # (not the `class` keyword of a declaration)
            yield Body(_name(node), node.start_point[0], node.end_point[0] + 1, elidable=False)
        if kind in _DESCEND:
            stack.extend(reversed(node.children))


def _name(node: Any) -> str:
    named = node.child_by_field_name("name") or node.child_by_field_name("type")
    if named is None and node.parent is not None and node.parent.type == "variable_declarator":
        named = node.parent.child_by_field_name("name")
    return named.text.decode() if named is not None and named.text is not None else ""
