"""Compressors keep their facts: planted facts are present verbatim in each compressed form,
and the router reads each kind of content as that kind."""

from __future__ import annotations

import itertools
import json
import random
import string
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.compress import KINDS, NO_FOCUS, Focus, code, compress, logs, route, router
from contextd.engine.compress.listing import UNNAMED
from contextd.engine.compress.router import SNIFFED, envelope, hint, unread
from contextd.engine.compress.search import SAMPLES
from contextd.engine.compress.text import ERROR_SUFFIXES, ERROR_WORDS, MAX_FOCUS_TERMS, WORD, Lines, TextWords
from contextd.engine.memo import weigh
from contextd.engine.model import ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.pipeline import RenderInput, render
from contextd.engine.policy import parse_policy, schema
from contextd.engine.stages.propose import focus_terms
from contextd.engine.state import ViewState
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from tests.helpers import counter, make_session, stored_items

REGISTRY = TransformRegistry.default()


def _build_log(seed: int = 1) -> str:
    rng = random.Random(seed)
    lines = [
        f"2026-03-0{1 + i // 900} 10:{i // 60 % 60:02d}:{i % 60:02d} INFO worker-{rng.randint(1, 4)} "
        f"processed batch {i} in {rng.randint(5, 90)} ms"
        for i in range(1500)
    ]
    lines[700] = "2026-03-01 10:11:40 ERROR worker-3 upload failed: disk quota exceeded on /dev/sdb1 (job 8812)"
    lines[1100] = "2026-03-02 10:18:20 WARNING worker-2 retrying connection to db-7 (attempt 3)"
    return "\n".join(
        [
            *lines,
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.11/site-packages/celery/app/trace.py", line 451, in trace_task',
            "    R = retval = fun(*args, **kwargs)",
            '  File "/usr/lib/python3.11/site-packages/celery/app/trace.py", line 734, in __protected_call__',
            "    return self.run(*args, **kwargs)",
            '  File "/srv/app/billing/invoices.py", line 88, in render_invoice',
            "    total = compute_total(lines)",
            '  File "/srv/app/billing/totals.py", line 17, in compute_total',
            "    return sum(line.amount for line in lines) / len(lines)",
            "ZeroDivisionError: division by zero",
            "worker exited with code 1",
        ]
    )


def test_a_log_keeps_its_errors_the_exception_and_the_user_frames() -> None:
    text = _build_log()
    out = compress(text, NO_FOCUS, command="python worker.py")
    assert out is not None and out.kind == "log"
    for fact in (
        "ERROR worker-3 upload failed: disk quota exceeded on /dev/sdb1 (job 8812)",
        "WARNING worker-2 retrying connection to db-7 (attempt 3)",
        "ZeroDivisionError: division by zero",
        '  File "/srv/app/billing/totals.py", line 17, in compute_total',
        "    return sum(line.amount for line in lines) / len(lines)",
        '  File "/srv/app/billing/invoices.py", line 88, in render_invoice',
        '  File "/usr/lib/python3.11/site-packages/celery/app/trace.py", line 451, in trace_task',  # the first frame
        "worker exited with code 1",
    ):
        assert fact in out.text
    # A library frame in the middle goes; the log is a tenth of its size or less.
    assert "__protected_call__" not in out.text
    assert len(out.text) < len(text) / 10


def _plain_head(line: str) -> str:
    """A line's head read the plain way, a line at a time (what `run_heads` reads at C speed)."""
    words = line.split(None, 1)
    if len(words) < 2:
        return ""
    head = words[0].translate(str.maketrans("", "", "0123456789"))
    letters = [c.isascii() and c.isalpha() for c in head]
    return head if any(a and b for a, b in itertools.pairwise(letters)) else ""


@given(st.lists(st.text(alphabet="ab1 \t\x0b\x1c\u2003\u3000\r:[]", max_size=12), max_size=12))
def test_the_heads_of_a_run_of_lines_are_each_lines_own(lines: list[str]) -> None:
    assert logs.run_heads(lines) == [_plain_head(line) for line in lines]


def test_repeated_lines_fold_with_their_count_and_nothing_else_goes() -> None:
    text = "\n".join(["start", *["connection reset, retrying"] * 50, "done"])
    out = compress(text, NO_FOCUS, declared="log")
    assert out is not None and out.lossless
    # The first copy, the count, then the last lines as they ended.
    assert "start\nconnection reset, retrying\n[… the line above 47 more times (lines 3-49) …]\n" in out.text


def _build_pytest() -> str:
    passed = "\n".join(f"tests/test_mod{i}.py {'.' * 40} [{i * 5:3d}%]" for i in range(1, 19))
    return textwrap.dedent(
        """\
        ============================= test session starts ==============================
        platform linux -- Python 3.11.4, pytest-8.3.4, pluggy-1.5.0
        rootdir: /repo
        collected 745 items

        {passed}
        tests/test_parser.py ......F.....                                        [ 98%]
        tests/test_zz.py ........                                                [100%]

        =================================== FAILURES ===================================
        ___________________________ test_parse_nested_quotes ___________________________

            def test_parse_nested_quotes():
                source = 'say "a \\\\"b\\\\" c"'
        >       assert parse(source) == ["say", 'a "b" c']
        E       AssertionError: assert ['say', 'a \\\\', 'b', 'c'] == ['say', 'a "b" c']
        E         At index 1 diff: 'a \\\\' != 'a "b" c'

        tests/test_parser.py:42: AssertionError
        =========================== short test summary info ============================
        FAILED tests/test_parser.py::test_parse_nested_quotes - AssertionError: assert ['say', 'a \\\\', 'b'...
        ======================== 1 failed, 744 passed in 12.31s ========================
        """
    ).format(passed=passed)


def test_test_output_keeps_every_failing_id_the_assertion_and_the_summary() -> None:
    text = _build_pytest()
    out = compress(text, NO_FOCUS, command="cd /repo && python -m pytest -q")
    assert out is not None and out.kind == "test"
    for fact in (
        "FAILED tests/test_parser.py::test_parse_nested_quotes",
        "E       AssertionError: assert ['say', 'a \\\\', 'b', 'c'] == ['say', 'a \"b\" c']",
        '>       assert parse(source) == ["say", \'a "b" c\']',
        "tests/test_parser.py:42: AssertionError",
        "1 failed, 744 passed in 12.31s",
    ):
        assert fact in out.text
    assert "tests/test_mod7.py" not in out.text  # a file where everything passed
    # Without the summary that names the failing test, its file's progress line says where.
    without_summary = text[: text.index("=========================== short test summary")]
    out = compress(without_summary, NO_FOCUS, command="pytest")
    assert out is not None and "tests/test_parser.py ......F....." in out.text


_PY_SOURCE = textwrap.dedent(
    '''\
    """Invoices."""

    import decimal
    from dataclasses import dataclass


    @dataclass
    class Line:
        amount: decimal.Decimal
        quantity: int = 1


    def compute_total(lines, *, rounding="half_even"):
        """Sum the lines, rounded."""
        total = decimal.Decimal(0)
        for line in lines:
            total += line.amount * line.quantity
        if not lines:
            raise ValueError("an invoice has lines")
        return total.quantize(decimal.Decimal("0.01"), rounding=rounding)


    class Renderer:
        """Writes invoices out."""

        def __init__(self, template):
            self.template = template
            self.cache = {}
            self.count = 0
            self.rendered = []

        def render(self, invoice):
            """Fill the template."""
            key = invoice.number
            if key in self.cache:
                return self.cache[key]
            text = self.template.format(invoice=invoice)
            self.cache[key] = text
            return text
    '''
)


def test_a_python_skeleton_keeps_signatures_and_the_focus_function_whole() -> None:
    out = compress(_PY_SOURCE, Focus(("compute_total",)), command="cat billing/invoices.py")
    assert out is not None and out.kind == "code"
    body = _PY_SOURCE[_PY_SOURCE.index("def compute_total") : _PY_SOURCE.index("class Renderer")].rstrip()
    assert body in out.text  # the focus function, whole
    for fact in (
        "import decimal",
        "class Renderer:",
        "    def render(self, invoice):",
        '        """Fill the template."""',
    ):
        assert fact in out.text
    assert "self.cache[key] = text" not in out.text  # a body the focus does not name
    assert "[… lines 34-39 left out …]" in out.text  # said by range, to be asked for


TEST_MODULE = textwrap.dedent(
    """
    import pytest

    from shop.models import Author, Book, Shelf


    class ShelfTests(TestCase):
        @classmethod
        def setUpTestData(cls):
            cls.author = Author.objects.create(name="Ann")
            cls.book = Book.objects.create(title="Poems", author=cls.author)
            cls.other_book = Book.objects.create(title="Prose", author=cls.author)
            cls.shelf = Shelf.objects.create(label="new")
            cls.shelf.books.add(cls.book)
            cls.reader = Author.objects.create(name="Bo")
            cls.reader.set_password("secret")
            cls.reader.save()

        def test_books_of_an_author(self):
            self.client.force_login(self.author)
            with self.assertNumQueries(1):
                books = list(Book.objects.filter(author=self.author))
            self.assertEqual(books, [self.book, self.other_book])
            self.assertEqual(books[0].title, "Poems")

        def test_shelves_of_a_book(self):
            self.client.force_login(self.reader)
            with self.assertNumQueries(1):
                shelves = list(Shelf.objects.filter(books=self.book))
            self.assertEqual(shelves, [self.shelf, self.shelf])
            self.assertEqual(shelves[0].label, "new")

        def test_an_empty_shelf(self):
            empty = Shelf.objects.create(label="empty")
            self.assertFalse(empty.books.exists())
            self.assertEqual(str(empty), "empty")
            self.assertEqual(Shelf.objects.count(), 2)

        def test_moving_a_book(self):
            other = Shelf.objects.create(label="other")
            self.shelf.books.remove(self.book)
            other.books.add(self.book)
            self.assertEqual(list(other.books.all()), [self.book])
            self.assertFalse(self.shelf.books.exists())
            self.book.refresh_from_db()
            self.assertEqual(self.book.shelf_set.get(), other)
            self.assertEqual(Shelf.objects.count(), 2)


    @pytest.fixture
    def client_of_a_reader(client):
        reader = Author.objects.create(name="Reader")
        reader.set_password("secret")
        reader.save()
        shelf = Shelf.objects.create(label="reading")
        shelf.books.add(Book.objects.create(title="Odes"))
        client.force_login(reader)
        client.cookies["shelf"] = str(shelf.pk)
        return client
    """
)


@pytest.mark.parametrize("tail", ["", "\n    def test_cut_off(self, shelf"], ids=["ast", "by indentation"])
def test_a_skeleton_read_by_the_call_that_read_the_file_keeps_what_new_code_is_written_from(tail: str) -> None:
    source = TEST_MODULE + tail
    plain = compress(source, NO_FOCUS, command="cat tests/test_shelf.py")
    out = compress(source, NO_FOCUS, command="cat tests/test_shelf.py", examples=True)
    assert plain is not None and out is not None and out.kind == plain.kind == "code"
    kept = (
        'cls.author = Author.objects.create(name="Ann")',  # the setup of the tests: how objects are built
        'shelf.books.add(Book.objects.create(title="Odes"))',  # a fixture
        "books = list(Book.objects.filter(author=self.author))",  # a short body
        'empty = Shelf.objects.create(label="empty")',  # a short body of another shape
    )
    for line in kept:
        assert line in out.text
        assert line not in plain.text  # the skeleton of a file read before: bodies left out
    assert "shelves = list(Shelf.objects.filter(books=self.book))" not in out.text  # alike the one shown
    assert "self.book.refresh_from_db()" not in out.text  # a long body
    assert len(out.text) < len(source)


def test_a_cut_range_of_numbered_python_is_read_by_indentation() -> None:
    numbered = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(_PY_SOURCE.splitlines()[14:], start=15))
    out = compress(numbered, Focus(("render",)), command="nl -ba billing/invoices.py | sed -n '15,40p'")
    assert out is not None and out.kind == "code"
    assert "    26\t    def __init__(self, template):" in out.text
    assert "self.cache[key] = text" in out.text  # render: the focus
    assert "self.rendered = []" not in out.text
    assert "[… lines 27-30 left out …]" in out.text  # the file's own line numbers


_FLAT_LINES = (
    "SETTINGS = {'debug': True}",
    "x = compute(1)",
    "import os",
    "from a.b import c",
    "# a comment (with brackets",
    "name = ')' + '(' + \"#\"",
    "value = f'{a}' + \"it's\"",
    "",
    "    y = [1, 2]",
)
_SPANNING_LINES = (
    "x = (1,",
    "2)",
    "x = [",
    "]",
    "total = 1 + \\",
    'doc = """',
    '"""',
    "s = ')' + (",
    "t = ( # )",
    "z = {'(': 1,",
    "def f():",
    "class A:",
    "    return 1",
    "@decorator",
    "async def g():",
)


@pytest.mark.parametrize(
    "source",
    [
        "x = (\n1, 2, 3, 4, 5, 6, 7, 8,\n)",  # a bracket open at the line's end
        "x = (1,\r2,\r3,\r4,\r5,\r6,\r7,\r8)",  # the parser breaks lines at \r too
        "x = ')' + (\n" + "1,\n" * 8 + ")",  # the bracket in the string is not the one open
        "x = (  # )\n" + "1,\n" * 8 + ")",  # nor the one in the comment
        "x = (  # )\n" + "1,\n" * 7 + "'(')",  # a real pair apart, each beside a written one
        "x = 1 + \\\n2",
        "'''\nA module's docstring\n'''",
        '"""\nA module\'s docstring\n"""',
        "def f(): return 1",
        "if True:\n    class A: pass",
    ],
)
def test_python_that_may_hold_a_body_is_parsed(source: str) -> None:
    assert code.may_hold_bodies(source)


def test_from_python_3_12_source_with_an_f_string_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    source = "NAME = f'{x}'\nSIZE = rf\"{y}\""  # one line each to 3.11's tokenizer
    assert not code.may_hold_bodies(source)
    monkeypatch.setattr(code, "_NESTED_QUOTES", True)  # 3.12: a field may span lines (PEP 701)
    assert code.may_hold_bodies(source)
    assert not code.may_hold_bodies("NAME = 'x'\nSIZE = b'y'")  # no f-string


@pytest.mark.parametrize(
    ("source", "holds"),
    [
        ("DATA = " + "[" * 200_000 + "]" * 200_000, False),  # deeper than the parser goes: one line
        ("x = '" + "\\'" * 200_000, False),  # a string never closed: does not parse
        ("x = (" + "'(' + " * 100_000 + "\n1)", True),
    ],
)
def test_the_check_reads_a_large_output_in_one_pass(source: str, holds: bool) -> None:
    """A file an agent reads may be any text up to the largest item (1 MB): read in time as the
    square of its length (a pass per level of nesting, a look for the closing quote from every
    quote), these took minutes, past the test's timeout."""
    assert code.may_hold_bodies(source) is holds


@settings(max_examples=300)
@given(st.lists(st.sampled_from(_FLAT_LINES + _SPANNING_LINES), max_size=14), st.sampled_from(["\n", "\r\n", "\r"]))
def test_python_said_to_hold_no_body_holds_none_when_parsed(lines: list[str], newline: str) -> None:
    """The check that leaves the parse out is never wrong: what it says holds no body, parsed
    (or read by indentation when it does not parse), has none."""
    source = newline.join(lines)
    if not code.may_hold_bodies(source):
        assert code._parsed_bodies(source, source.split("\n"), "python")[0] == ()


def test_a_module_without_definitions_is_not_parsed_and_reads_the_same() -> None:
    source = "\n".join(
        ["# Settings.", "import os", "from a.b import c", "", "DEBUG = os.environ.get('DEBUG') == '1'"]
        + [f"LIMIT_{k} = {{'calls': {k}, 'names': [\"a\", 'b']}}  # per minute" for k in range(40)]
    )
    assert not code.may_hold_bodies(source)
    assert code._parsed_bodies(source, source.split("\n"), "python")[0] == ()


@pytest.mark.parametrize(
    ("path", "source", "kept", "gone"),
    [
        (
            "web/cart.js",
            "import { price } from './price.js';\n\nexport function addItem(cart, item) {\n  const p = price(item);\n"
            "  cart.items.push(item);\n  cart.total += p;\n  cart.count += 1;\n  return cart;\n}\n\n"
            "export function removeItem(cart, id) {\n  const i = cart.items.findIndex(x => x.id === id);\n"
            "  if (i < 0) throw new Error(`no item ${id}`);\n  cart.items.splice(i, 1);\n  cart.count -= 1;\n"
            "  return cart;\n}\n",
            ["export function addItem(cart, item) {", "if (i < 0) throw new Error(`no item ${id}`);"],
            "cart.items.push(item);",
        ),
        (
            "srv/handler.go",
            'package srv\n\nimport "fmt"\n\nfunc Handle(w Writer, r *Request) error {\n\tid := r.ID\n'
            '\tif id == "" {\n\t\treturn fmt.Errorf("no id")\n\t}\n\tw.Write(id)\n\treturn nil\n}\n\n'
            "func Lookup(id string) (*Record, error) {\n\trec, ok := table[id]\n\tif !ok {\n"
            "\t\treturn nil, ErrMissing\n\t}\n\trec.hits++\n\treturn rec, nil\n}\n",
            ["func Handle(w Writer, r *Request) error {", "return nil, ErrMissing"],
            "w.Write(id)",
        ),
        (
            "src/store.rs",
            "use std::collections::HashMap;\n\npub struct Store { map: HashMap<String, u64> }\n\nimpl Store {\n"
            "    pub fn get(&self, key: &str) -> Option<u64> {\n        let v = self.map.get(key)?;\n"
            "        let doubled = v * 2;\n        let halved = doubled / 2;\n        Some(halved)\n    }\n\n"
            "    pub fn put(&mut self, key: String, value: u64) {\n        let old = self.map.insert(key, value);\n"
            '        if old.is_some() {\n            eprintln!("replaced");\n        }\n'
            "        self.len += 1;\n    }\n}\n",
            ["pub fn get(&self, key: &str) -> Option<u64> {", "let old = self.map.insert(key, value);"],
            "let doubled = v * 2;",
        ),
    ],
)
def test_other_languages_are_read_with_tree_sitter(path: str, source: str, kept: list[str], gone: str) -> None:
    focus_name = {"web/cart.js": "removeItem", "srv/handler.go": "Lookup", "src/store.rs": "put"}[path]
    out = compress(source, Focus((focus_name,)), command=f"cat {path}")
    assert out is not None and out.kind == "code" and "tree-sitter" in out.summary
    for fact in kept:
        assert fact in out.text
    assert gone not in out.text


def test_a_class_is_one_container_to_tree_sitter_reading() -> None:
    import tree_sitter

    from contextd.engine.compress import code

    source = "class Cart {\n  add(item) {\n    this.items.push(item);\n    return this;\n  }\n}\n"
    grammar = code._grammar("javascript")
    assert grammar is not None
    parser = tree_sitter.Parser(grammar)
    bodies = list(code._tree_sitter_bodies(parser.parse(source.encode()).root_node, source.split("\n")))
    # The declaration is a container; its `class` keyword, a node of the same type name, is not.
    assert [(b.name, b.start, b.stop, b.elidable) for b in bodies] == [("Cart", 0, 6, False), ("add", 2, 4, True)]


def test_a_tree_sitter_parse_that_takes_too_much_work_is_given_up_and_the_parser_still_works() -> None:
    import tree_sitter

    from contextd.engine.compress import code

    parser = tree_sitter.Parser(code._grammar("javascript"))
    source = b"function add(a, b) {\n  return a + b;\n}\n"
    assert code.parse_bounded(parser, b"a:b " * 5_000, steps=0) is None  # over its budget at once
    # Text that is not code at all: given up within its budget (a minute's work unbounded).
    assert code.parse_bounded(parser, (b"a:b " * 3_000 + b"\n") * 3) is None
    tree = code.parse_bounded(parser, source)
    assert tree is not None and tree.root_node.type == "program" and not tree.root_node.has_error
    assert tree.root_node.end_byte == len(source)  # not the abandoned document, resumed


def _rows() -> list[dict[str, object]]:
    rng = random.Random(7)
    rows: list[dict[str, object]] = [
        {"id": f"ord-{i:05d}", "region": "eu-west-1", "status": "settled", "amount": round(rng.uniform(10, 90), 2)}
        for i in range(400)
    ]
    rows[123] = {**rows[123], "status": "failed", "error": "card declined: insufficient funds"}
    rows[301] = {**rows[301], "amount": 48213.5}
    rows[222] = {**rows[222], "note": "customer asked for invoice INV-2207"}
    return rows


def test_json_keeps_the_schema_the_constants_and_the_anomalous_rows() -> None:
    rows = _rows()
    text = json.dumps({"count": 400, "orders": rows}, indent=2)
    out = compress(text, Focus(("INV-2207",)), command="curl -s localhost:8080/orders")
    assert out is not None and out.kind == "json"
    assert '"error": "card declined: insufficient funds"' in out.text  # the error row
    assert '"amount": 48213.5' in out.text  # the outlier
    assert "customer asked for invoice INV-2207" in out.text  # mentions the focus
    assert '{"region": "eu-west-1"}' in out.text  # said once, as a constant
    assert "ord-00200" not in out.text
    assert len(out.text) < len(text) / 10


_GREP = "\n".join(
    [f"src/app/views.py:{10 + i}:    total = compute_total(order.lines)  # call site {i}" for i in range(30)]
    + [f"src/app/jobs.py:{40 + i}:        compute_total(batch)" for i in range(12)]
    + ["src/billing/totals.py:17:def compute_total(lines):", "src/billing/totals.py:30:    return compute_total(rest)"]
    + [f"tests/test_totals.py:{i}:    assert compute_total([]) == 0" for i in range(20)]
)


def test_search_results_keep_every_file_and_the_definition_line() -> None:
    out = compress(_GREP, Focus((), ("compute_total",)), command="grep -rn compute_total src tests")
    assert out is not None and out.kind == "search"
    assert "src/billing/totals.py:17:def compute_total(lines):" in out.text
    assert "src/app/: views.py (30), jobs.py (12)" in out.text and "tests/: test_totals.py (20)" in out.text
    # One line per distinct text, with how many more places hold it.
    assert "src/app/jobs.py:40:        compute_total(batch)  [the same in 11 more places]" in out.text


def test_search_results_compressed_again_under_another_focus_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output is compressed again each time the focus that concerns it moves: what its lines
    say whatever the focus (files, counts, distinct texts, failures) is read once per content,
    and the compression under each focus is what a first reading gives."""
    from contextd.engine.compress import search

    foci = [Focus((), ("compute_total",)), NO_FOCUS, Focus(("batch",), ("views.py",)), Focus((), ("compute_total",))]
    search.READ.clear()
    first = [compress(_GREP, f, command="grep -rn compute_total src tests") for f in foci]
    reads: list[int] = []
    read_results = search._read_results
    monkeypatch.setattr(search, "_read_results", lambda found: reads.append(1) or read_results(found))
    again = [compress(_GREP, f, command="grep -rn compute_total src tests") for f in foci]
    assert again == first and reads == []
    assert len({out.text for out in first if out is not None}) == 3
    search.READ.clear()
    assert [compress(_GREP, f, command="grep -rn compute_total src tests") for f in foci] == first
    assert reads == [1]  # read once for all four


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("src/my file.py:12:hello", ("src/my file.py", True, "hello")),  # a path with a space, a line number
        ("a b:12:c", None),  # no dot nor slash: not a path
        ("src/my-file.py-12-ctx", ("src/my-file.py", False, "ctx")),  # context: the shortest path
        ("a-1-b.py-2-x", ("a-1-b.py", False, "x")),
        ("logs/2024-01-15/app.log-12-hello", ("logs/2024-01-15/app.log", False, "hello")),
        ("tests/test-1-basic.py-12-    x = 1", ("tests/test-1-basic.py", False, "    x = 1")),
        ("src/app.py-12-foo.bar-3-baz", ("src/app.py-12-foo.bar", False, "baz")),  # ambiguous: after the last dot
        ("x.py-12", None),
        ("dist/app.min.js:1:" + "a.b/c-1-" * 20_000, ("dist/app.min.js", True, "a.b/c-1-" * 20_000)),
        ("a.b" * 30_000 + "-x", None),  # a long line read once, not backtracked over
    ],
)
def test_a_search_line_is_read_by_its_separators(line: str, parsed: tuple[str, bool, str] | None) -> None:
    from contextd.engine.compress.search import _parse

    assert _parse(line) == parsed


def test_a_match_in_a_binary_file_is_counted_with_its_file() -> None:
    """grep says a binary file matched in a message of its own, not as a result line: it is a
    match all the same, and the file that matched is named with the others (the cached bytecode
    of the module searched says a stale copy may be what runs)."""
    lines = []
    for n, lang in enumerate(("ab", "cd", "ef", "gh", "ij")):
        lines += [f'pkg/locale/{lang}/messages.po:{n}:msgid "alias of %s"']
        lines += [f"grep: pkg/locale/{lang}/messages.mo: binary file matches"]
    lines += ["pkg/ext/core.py:40:        text = _('alias of %s') % name"]
    lines += ["grep: pkg/ext/__pycache__/core.cpython-39.pyc: binary file matches"]
    lines += ["Binary file build/lib/pkg/ext/core.so matches"]  # GNU grep before 3.5
    out = compress("\n".join(lines), NO_FOCUS, command="grep -rn 'alias of' pkg build")
    assert out is not None and out.kind == "search"
    counts = out.text.split("[matches per file]\n")[1]
    assert "pkg/ext/__pycache__/: core.cpython-39.pyc (1)" in counts
    assert "build/lib/pkg/ext/: core.so (1)" in counts
    assert "pkg/locale/{ab,cd,ef,gh,ij}/: messages.po (1), messages.mo (1)" in counts
    assert out.text.startswith("[13 matches in 13 files]")
    assert "[…" not in out.text  # no line of the output left unaccounted for


def test_search_results_without_a_focus_still_name_every_file_with_its_count() -> None:
    out = compress(_GREP, NO_FOCUS, command="rg -n compute_total")
    assert out is not None
    assert "src/billing/: totals.py (2)" in out.text
    assert len(out.text) < len(_GREP) / 2


def test_directories_alike_but_for_one_part_share_a_line_of_the_counts() -> None:
    languages = ["de", "fr", "pt_BR", "sr@latin", "zh_CN"]
    lines = [f'app/locale/{lang}/LC_MESSAGES/app.po:{40 + n}:msgid "alias of %s"' for n, lang in enumerate(languages)]
    lines += [f"app/core/{name}.py:12:    alias = resolve(name)  # alias of the type" for name in ("types", "names")]
    lines += ['app/locale/es/LC_MESSAGES/app.po:9:msgid "alias of %s"', "app/locale/es/LC_MESSAGES/app.po:11:x"]
    out = compress("\n".join(lines), NO_FOCUS, command="grep -rn 'alias of' app")
    assert out is not None
    counts = out.text.split("[matches per file]\n")[1].splitlines()
    # Every directory is still named, with its files and counts; es has two matches: its own line.
    assert "app/locale/{de,fr,pt_BR,sr@latin,zh_CN}/LC_MESSAGES/: app.po (1)" in counts
    assert "app/locale/es/LC_MESSAGES/: app.po (2)" in counts
    assert "app/core/: types.py (1), names.py (1)" in counts
    assert len(counts) == 3
    # Files at the top and paths that hold a brace or a comma are never folded into braces.
    said = ":1:msgid 'alias of %s' as the catalogue of this locale has said it for years"
    lines = [f"{d}/app.po{said}" for d in ("a,b", "c", "d", "{e}")] + [f"top{n}.py{said}" for n in range(3)]
    lines += [f"x/{lang}/app.po{said}" for lang in ("de", "fr", "it")]
    out = compress("\n".join(lines), NO_FOCUS, command="grep -rn alias")
    assert out is not None
    counts = out.text.split("[matches per file]\n")[1]
    assert ": top0.py (1), top1.py (1), top2.py (1)" in counts.splitlines()
    assert "a,b/: app.po (1)" in counts and "{e}/: app.po (1)" in counts and "x/{de,fr,it}/: app.po (1)" in counts


def test_a_recursive_listing_names_a_subdirectory_once_and_counts_what_tools_generate() -> None:
    listing = "\n".join(
        [
            ".:", "README.md", "pkg", "setup.py", "",
            "./pkg:", "__init__.py", "__pycache__", "core.py", "tests", "",
            "./pkg/__pycache__:", "__init__.cpython-311.pyc", "core.cpython-311.pyc", "",
            "./pkg/tests:", *(f"test_{n}.py" for n in range(40)), "",
            "./pkg.egg-info:", "PKG-INFO", "SOURCES.txt", "",
        ]
    )  # fmt: skip
    out = compress(listing, Focus(("test_7.py",)), command="ls -R")
    assert out is not None and out.kind == "listing"
    lines = out.text.splitlines()
    # A directory with its own header is not listed again in its parent's names; the few names
    # of a small directory need no counts.
    assert "./: README.md  setup.py" in lines and "./pkg/: __init__.py  core.py" in lines
    assert "./pkg/__pycache__/ (2 entries: 2 .pyc; generated, not listed)" in lines
    assert "./pkg.egg-info/ (2 entries: 1 (none), 1 .txt; generated, not listed)" in lines
    assert any(line.startswith("./pkg/tests/ (40: 40 .py): test_7.py  test_0.py") for line in lines)


def test_a_recursive_listing_keeps_a_name_with_a_space_whole_and_reads_columns() -> None:
    one_per_line = ".:\nmy notes.txt\nsrc\n\n./src:\n" + "\n".join(f"mod {n}.py" for n in range(30))
    out = compress(one_per_line, NO_FOCUS, command="ls -R")
    assert out is not None and "./: my notes.txt" in out.text.splitlines()
    assert "./src/ (30: 30 .py): mod 0.py  mod 1.py" in out.text
    columns = ".:\nREADME.md  'my notes.txt'  src\n\n./src:\n" + "\n".join(f"a{n}.py\tb{n}.py" for n in range(15))
    out = compress(columns, NO_FOCUS, command="ls -R")
    assert out is not None and "./: README.md  'my notes.txt'" in out.text.splitlines()
    assert "./src/ (30: 30 .py): a0.py  b0.py" in out.text


def test_what_tools_generate_is_counted_wherever_it_sits_unless_it_was_asked_for() -> None:
    paths = [f"./src/app/m{n}.py" for n in range(30)]
    paths += [f"./node_modules/{package}/f{n}.js" for package in ("lodash", "react") for n in range(20)]
    out = compress("\n".join(paths), NO_FOCUS, command="find . -type f")
    assert out is not None
    # node_modules has no listing of its own here: it still gets its line, counting all 40.
    assert "./node_modules/ (40 entries: 40 .js; generated, not listed)" in out.text.splitlines()
    asked = "\n".join(["node_modules/react:", "index.js", "lib", "", "node_modules/react/lib:"])
    asked += "\n" + "\n".join(f"part{n}.js" for n in range(40))
    out = compress(asked, NO_FOCUS, command="ls -R node_modules/react")
    assert out is not None and "node_modules/react/: index.js" in out.text  # asked for: listed
    assert "node_modules/react/lib/ (40: 40 .js): part0.js" in out.text


def test_a_cut_recursive_listing_does_not_say_which_directory_the_tails_first_names_are_in() -> None:
    head = "\n".join([".:", "pkg", "", "./pkg:", *(f"mod{n}.py" for n in range(35)), "mod3"])
    tail = "\n".join(
        ["5_extra.py", *(f"mod{n}.py" for n in range(36, 60)), "", "./docs:", *(f"page{n}.rst" for n in range(30))]
    )
    # What the tool left out (812 characters) may hold other directories' headers: the tail's
    # first names are not known to be the head's last directory's, nor the listing root's.
    notice = "\n</output_head>\n<elided_chars>\n812 characters elided\n</elided_chars>\n<output_tail>\n"
    text = f"<returncode>0</returncode>\n<output_head>\n{head}{notice}{tail}\n</output_tail>"
    out = compress(text, Focus(("mod55.py",)), command="ls -R")
    assert out is not None and out.kind == "listing"
    before, _, after = out.text.partition("<elided_chars>")
    assert "./pkg/ (35: 35 .py): mod0.py" in before
    # The lines the tool cut in two stay as they are, beside its notice; the names before the
    # tail's first header are folded under no directory (the focus's kept); then the tail is
    # read from that header on.
    assert "\nmod3\n</output_head>" in out.text and "<output_tail>\n5_extra.py\n" in out.text
    unnamed = f"{UNNAMED} (24: 24 .py): mod55.py  mod36.py"
    assert any(line.startswith(unnamed) for line in after.splitlines())
    assert "./docs/ (30: 30 .rst): page0.rst" in after
    assert not any(line.startswith(("./ (", "./pkg/")) for line in after.splitlines())


def test_a_cut_recursive_listing_whose_tail_has_no_header_says_no_directory_for_it() -> None:
    head = "\n".join([".:", "pkg", "", "./pkg:", *(f"mod{n}.py" for n in range(40)), "mod4"])
    notice = "\n</output_head>\n<elided_chars>\n9000 characters elided\n</elided_chars>\n<output_tail>\n"
    tail = "\n".join(["0_x.py", *(f"name{n}.txt" for n in range(40))])
    out = compress(f"<output_head>\n{head}{notice}{tail}\n</output_tail>", NO_FOCUS, command="ls -R")
    folded = f"{UNNAMED} (40: 40 .txt): name0.txt  name1.txt  name2.txt  name3.txt  name4.txt  name5.txt … +34 more"
    assert out is not None and out.text.endswith(f"<output_tail>\n0_x.py\n{folded}\n</output_tail>")
    few = "\n".join(["0_x.py", *(f"name{n}.txt" for n in range(4))])  # a few names: as printed
    out = compress(f"<output_head>\n{head}{notice}{few}\n</output_tail>", NO_FOCUS, command="ls -R")
    assert out is not None and out.text.endswith(f"<output_tail>\n{few}\n</output_tail>")


def test_a_cut_output_is_read_on_each_side_of_the_notice_of_what_was_left_out() -> None:
    head = "\n".join(f"src/app/mod_{n}.py:3:import compute_total" for n in range(40))
    tail = "\n".join(f"tests/test_{n}.py:9:    compute_total([])" for n in range(40))
    notice = "\n</output_head>\n<elided_chars>\n50211 characters elided\n</elided_chars>\n<output_tail>\n"
    text = f"<returncode>0</returncode>\n<output_head>\n{head}{notice}{tail}\n</output_tail>"
    out = compress(text, NO_FOCUS, command="grep -rn compute_total .")
    assert out is not None and out.kind == "search"
    before, cut, after = out.text.partition(notice)
    assert cut, "the notice stays whole between the two sides"
    assert "src/app/: " in before and "tests/" not in before
    assert "tests/: " in after and "src/app/" not in after
    assert "characters elided" not in before.split("[matches per file]")[1]


_DIFF = "\n".join(
    [
        "diff --git a/src/billing/totals.py b/src/billing/totals.py",
        "index 1111111..2222222 100644",
        "--- a/src/billing/totals.py",
        "+++ b/src/billing/totals.py",
        "@@ -14,7 +14,9 @@ import decimal",
        " ",
        " def compute_total(lines):",
        "-    return sum(l.amount for l in lines) / len(lines)",
        "+    if not lines:",
        "+        return decimal.Decimal(0)",
        "+    return sum(l.amount for l in lines) / len(lines)",
        " ",
        " ",
    ]
    + [
        line
        for n in range(6)
        for line in (
            f"diff --git a/docs/page{n}.md b/docs/page{n}.md",
            "index 3333333..4444444 100644",
            f"--- a/docs/page{n}.md",
            f"+++ b/docs/page{n}.md",
            "@@ -1,40 +1,40 @@",
            *[f" unchanged line {k}" for k in range(30)],
            *[f"-old wording {k}" for k in range(5)],
            *[f"+new wording {k}" for k in range(5)],
        )
    ]
)


def test_a_diff_keeps_every_file_and_the_hunk_on_the_focus_whole() -> None:
    out = compress(_DIFF, Focus(("compute_total",)), command="git diff")
    assert out is not None and out.kind == "diff"
    assert "+        return decimal.Decimal(0)" in out.text and " def compute_total(lines):" in out.text
    for n in range(6):
        assert f"diff --git a/docs/page{n}.md b/docs/page{n}.md" in out.text
    assert "unchanged line 12" not in out.text
    assert len(out.text) < len(_DIFF) / 2


def test_a_listing_folds_by_directory_with_counts_and_keeps_the_focus() -> None:
    paths = [f"./src/pkg/module_{i}.py" for i in range(60)] + [f"./tests/test_{i}.py" for i in range(40)]
    paths.append("./src/pkg/conftest_special.yaml")
    out = compress("\n".join(paths), Focus(("conftest_special.yaml",)), command="find . -type f")
    assert out is not None and out.kind == "listing"
    assert "./src/pkg/ (61:" in out.text and "./tests/ (40: 40 .py)" in out.text
    assert "conftest_special.yaml" in out.text


def _page(nav_item: str = "Install") -> str:
    head = [
        "<head>",
        '  <meta charset="utf-8" />',
        "  <title>Billing API &#8212; Docs</title>",
        *(f'  <link rel="stylesheet" href="_static/theme{n}.css" />' for n in range(6)),
        *(f'  <script src="_static/lib{n}.js"></script>' for n in range(4)),
        "</head>",
    ]
    nav = ['<div class="sphinxsidebar" role="navigation">', "<ul>"]
    nav += [f'  <li><a href="page{n}.html">{nav_item if n == 3 else f"Chapter {n}"}</a></li>' for n in range(12)]
    nav += ["</ul>", "</div>"]
    script = ["<script>", *(f"  var setting{n} = {n};" for n in range(8)), "</script>"]
    content = [
        '<section id="compute-total">',
        '<h1>compute_total<a class="headerlink" href="#compute-total">¶</a></h1>',
        '<p>alias of <code class="xref py py-obj"><span class="pre">Optional</span></code>[int]</p>',
        "</section>",
    ]
    footer = ['<div class="footer">', "  &copy;2026. Powered by Sphinx 4.1.0", "</div>"]
    body = ["<body>", '<div class="document">', *content, "</div>", *nav, *script, *footer, "</body>"]
    return "\n".join(["<!DOCTYPE html>", "<html>", *head, *body, "</html>"])


def test_an_html_page_keeps_its_content_whole_and_says_what_its_furniture_held() -> None:
    page = _page()
    out = compress(page, NO_FOCUS, command="cat _build/html/api.html")
    assert out is not None and out.kind == "html"
    for fact in (
        '<p>alias of <code class="xref py py-obj"><span class="pre">Optional</span></code>[int]</p>',
        '<h1>compute_total<a class="headerlink" href="#compute-total">¶</a></h1>',
        "<title>Billing API &#8212; Docs</title>",  # said in the head's marker, verbatim
        "&copy;2026. Powered by Sphinx 4.1.0",  # a footer is short, and says versions: it stays
    ):
        assert fact in out.text
    assert "theme3.css" not in out.text and "Chapter 7" not in out.text and "setting5" not in out.text
    assert "left out: navigation (12 links)" in out.text and "left out: the script's body" in out.text
    assert len(out.text) < len(page) * 0.6


def test_an_html_page_keeps_a_part_the_focus_names_whole() -> None:
    out = compress(_page(nav_item="compute_total tutorial"), Focus(("compute_total",)), command="cat api.html")
    assert out is not None
    assert "Chapter 7" in out.text and "compute_total tutorial" in out.text  # the navigation names the focus
    assert "theme3.css" not in out.text
    assert route(_page()) == ("html", "")  # sniffed from the content too


def test_an_html_page_folds_only_what_is_plainly_its_furniture() -> None:
    links = [f'  <li><a href="p{n}.html">Chapter {n}</a></li>' for n in range(8)]
    text = "\n".join(
        [
            "<!DOCTYPE html>",
            "<html><head>",
            "<title>",
            "  Billing API",
            "</title>",
            *(f'<link rel="stylesheet" href="s{n}.css" />' for n in range(5)),
            "</head><body>",
            '<div class="container with-sidebar">',  # a wrapper around the content: not a sidebar
            *(f"<p>Refund rule {n}: a second approval above 4800 EUR.</p>" for n in range(6)),
            "</div>",
            '<aside class="footnote">',  # a footnote, not furniture
            *(f"<p>Footnote line {n}.</p>" for n in range(5)),
            "</aside>",
            "<nav>",  # never closed: not folded to the end of the page
            *links,
            "</body></html>",
        ]
    )
    out = compress(text, NO_FOCUS, command="cat api.html")
    assert out is not None
    assert "left out: the head (<title>Billing API</title>, 5 link)" in out.text  # the title on one line
    for fact in ("Refund rule 5: a second approval", "Footnote line 4.", "Chapter 7"):
        assert fact in out.text


def test_the_router_uses_the_declared_type_then_the_command_then_sniffing() -> None:
    assert route("anything", declared="json") == ("json", "")
    assert route("x", command="cd /repo && pytest -x tests") == ("test", "")
    assert route("x", command="nl -ba src/a.go | sed -n '1,40p'") == ("code", "go")
    assert hint("grep -rn foo src")[0] == "search"
    assert route(_DIFF) == ("diff", "")
    assert route(json.dumps(_rows())) == ("json", "")
    assert route("a quiet sentence of prose.") == ("", "")


def test_sniffing_is_remembered_by_content_hash() -> None:
    text = "\n".join(f"src/m{i}.py:{i}: hit" for i in range(40)) + "\nunique-7f3a"
    before = len(SNIFFED)
    assert route(text) == ("search", "")
    assert len(SNIFFED) == before + 1
    assert route(text) == ("search", "")
    assert len(SNIFFED) == before + 1


def test_a_tool_envelope_stays_as_it_is_around_the_compressed_content() -> None:
    inner = _build_pytest()
    text = f"<returncode>1</returncode>\n<output>\n{inner}</output>"
    assert envelope(text)[1].startswith("=====")
    out = compress(text, NO_FOCUS, command="pytest")
    assert out is not None
    assert out.text.startswith("<returncode>1</returncode>\n<output>\n") and out.text.endswith("</output>")


def test_content_no_compressor_reads_is_left_alone() -> None:
    assert compress("just a few words", NO_FOCUS) is None
    assert compress(json.dumps([1, 2, 3]), NO_FOCUS) is None  # nothing long enough to crush
    assert compress("\n".join(f"line {i} of prose" for i in range(12)), NO_FOCUS) is None  # too few lines


def test_lines_no_other_compressor_reads_are_read_as_a_log() -> None:
    page = "\n".join(
        [*(f"<p>paragraph {i} of the generated page</p>" for i in range(60)), "WARNING: duplicate label intro"]
    )
    out = compress(page, NO_FOCUS, command="cd docs && sphinx-build -b html . _build")
    assert out is not None and out.kind == "text"
    assert "WARNING: duplicate label intro" in out.text and "<p>paragraph 0 of the generated page</p>" in out.text
    assert "paragraph 30" not in out.text


def test_derived_focus_terms_must_look_like_identifiers() -> None:
    focus = Focus(("error",), ("the", "file", "compute_total", "ValueError", "src/app.py"))
    assert focus.terms == ("error", "compute_total", "ValueError", "src/app.py")
    assert {"compute_total", "app.py"} <= focus.names and "py" not in focus.names


def test_the_focus_takes_the_work_at_hand_first_and_its_identifiers_only() -> None:
    # A task statement long with prose (mini-swe-agent's) must not fill the focus before the
    # latest calls are read: the cap counts identifiers, not words.
    prose = "Consider the following description of the problem. " * 40
    task, calls, request = stored_items(
        [
            ItemContent(role=Role.USER, content=(TextBlock(prose + "See `Category.objects`."),)),
            ItemContent(
                role=Role.ASSISTANT,
                content=(
                    TextBlock("THOUGHT: it is `queryset = queryset.filter(**query)` with self.field.name: e.g. it."),
                    ToolUseBlock("c1", "bash", json.dumps({"command": "cat <<'EOF' > repro.py\nprint(1)\nEOF"})),
                ),
            ),
            ItemContent(role=Role.USER, content=(TextBlock(" ".join(f"name_{n}" for n in range(40))),)),
        ]
    )
    terms = focus_terms((calls, task), ())
    assert terms[:2] == ("queryset.filter", "self.field.name")  # sentence punctuation stripped
    assert "repro.py" in terms and "Category.objects" in terms
    assert not {"the", "Consider", "THOUGHT", "nEOF", "EOF", "e.g"} & set(terms)  # words, and JSON's escapes
    assert focus_terms((calls,), ("given term", "x"))[:2] == ("given term", "x")  # the client's, as given
    # A user turn newer than the latest calls is the work at hand: its terms come first.
    newer = focus_terms((calls, request), ())
    assert len(newer) == MAX_FOCUS_TERMS and newer == tuple(f"name_{n}" for n in range(MAX_FOCUS_TERMS))


_CLASS_WINDOW = "\n".join(
    [
        "class SparseCodingMixin(TransformerMixin):",
        '    """Sparse coding mixin"""',
        "",
        "    def _set_params(self, n_components, alpha=None, n_jobs=None):",
        *(f"        self.param_{k} = param_{k}" for k in range(8)),
        "",
        "    def transform(self, X):",
        '        """Encode the data."""',
        *(f"        code_{k} = sparse_encode(X, self.param_{k})" for k in range(8)),
        "        return code_0",
        "",
        "    def fit(self, X, y=None):",
        '        """Fit the',  # the range ends inside a docstring: not Python that parses on its own
    ]
)


def test_code_the_focus_keeps_whole_is_not_read_another_way() -> None:
    command = "sed -n '861,915p' sklearn/decomposition/dict_learning.py"
    skeleton = compress(_CLASS_WINDOW, NO_FOCUS, command=command)
    assert skeleton is not None and skeleton.kind == "code" and "self.param_3 = param_3" not in skeleton.text
    # The class the agent asked about, whole: nothing to leave out (not a log's five lines).
    assert compress(_CLASS_WINDOW, Focus((), ("SparseCodingMixin",)), command=command) is None
    # A method named: its body stays, the other's goes.
    method = compress(_CLASS_WINDOW, Focus((), ("SparseCodingMixin.transform",)), command=command)
    assert method is not None and "code_5 = sparse_encode(X, self.param_5)" in method.text
    assert "self.param_3 = param_3" not in method.text


@pytest.mark.parametrize(
    ("text", "command"),
    [(_build_log(), "python worker.py"), (_PY_SOURCE, "cat billing/invoices.py"), (_GREP, "grep -rn x"), (_DIFF, "")],
)
def test_terms_that_cannot_occur_in_an_output_do_not_change_its_compression(text: str, command: str) -> None:
    words = frozenset(WORD.findall(text))
    focus = Focus(
        ("compute_total", "absent_name"),
        ("billing.totals.compute_total", "render", "src/app/jobs.py", "nowhere/else.py", "Renderer.render", "QuotaX"),
    )
    narrowed = focus.within(words)
    assert "absent_name" not in narrowed.terms and "nowhere/else.py" not in narrowed.terms
    full, key = compress(text, focus, command=command), compress(text, narrowed, command=command)
    assert full is not None and key is not None and full.text == key.text


def _cut_code() -> str:
    head = "\n".join(
        f"def step_{k}(x):\n    a = x + {k}\n    b = a * 2\n    c = b - a\n    return a + b + c\n" for k in range(8)
    )
    notice = "\n</output_head>\n<elided_chars>\n9000 characters elided\n</elided_chars>\n<output_tail>\n"
    return f"<returncode>0</returncode>\n<output_head>\n{head}{notice}{head.replace('step_', 'tail_')}\n</output_tail>"


_EVERY_READER = [
    (_build_log(), "python worker.py"),
    (_build_pytest(), "pytest -q"),
    (_PY_SOURCE, "cat billing/invoices.py"),
    ("\n".join(f"{n + 1:6d}\t{line}" for n, line in enumerate(_PY_SOURCE.split("\n"))), "cat -n billing/invoices.py"),
    (_cut_code(), "cat src/steps.py"),
    (_GREP, "grep -rn compute_total ."),
    (_DIFF, "git diff"),
    (
        "\n".join([*(f"./src/pkg/module_{i}.py" for i in range(60)), *(f"./tests/test_{i}.py" for i in range(40))]),
        "find .",
    ),
    (json.dumps({"count": 400, "orders": _rows()}, indent=2), "curl -s localhost:8080/orders"),
]


@pytest.mark.parametrize(("text", "command"), _EVERY_READER)
def test_a_term_that_does_not_occur_whole_changes_a_compression_only_through_a_name_its_reader_reads(
    text: str, command: str
) -> None:
    """The key of a compression keeps of a term that does not occur whole in the output (its
    last part does: ``s/a/b`` and the word ``b``) only what a reader finds by its last part (a
    definition's name in code; any word in a search, a listing, JSON): the compression under
    that key is the one under every term whose last part's words the output holds."""
    words = frozenset(WORD.findall(text))
    picked = sorted(words)[:: max(1, len(words) // 40)]
    focus = Focus(
        ("compute_total",),
        tuple(t for w in picked for t in (f"s/zz9q/{w}", f"absent_pkg.{w}", f"no/such/{w}.py", f"{w}.render")),
    )
    names = router.names_read(text, command=command)
    broad, narrow = focus.within(words), focus.within(words, lambda: names)
    full, key = compress(text, broad, command=command), compress(text, narrow, command=command)
    assert full == key
    if names is not None:  # each term left out: it occurs nowhere whole, and its last part names nothing read
        assert set(broad.terms) - set(narrow.terms), "the key is narrower than the words' alone"


def test_a_sed_script_concerns_code_only_where_a_definition_has_its_last_part_for_name() -> None:
    """``sed -i 's/a/b/' f`` makes ``s/a/b`` a focus term (it looks like a path); its last part
    ``b`` is a name the skeleton keeps whole where a function is so named, and nothing where
    ``b`` is a variable of every function: there the term changes neither the compression nor
    its key."""
    assigns = "\n".join(
        f"def f_{k}(x):\n    a = x + {k}\n    b = a * 2\n    c = b - a\n    return a + b + c\n" for k in range(6)
    )
    defines = assigns + "\ndef b(x):\n    y = x * 2\n    z = y - x\n    w = z + y\n    return w\n"
    command, focus = "cat src/steps.py", Focus((), ("s/a/b",))
    for text, kept in ((assigns, ()), (defines, ("s/a/b",))):
        narrowed = focus.within(
            frozenset(WORD.findall(text)), lambda text=text: router.names_read(text, command=command)
        )
        assert narrowed.terms == kept
        assert compress(text, narrowed, command=command) == compress(text, focus, command=command)
    whole = compress(defines, focus, command=command)
    assert whole is not None and "    w = z + y" in whole.text
    skeleton = compress(defines, NO_FOCUS, command=command)
    assert skeleton is not None and "    w = z + y" not in skeleton.text


# ------------------------------------------------------- found by a second reading


_LONE_RETURNS = (
    "x = 1\r" * 40
    + '\ndef parse_header(a):\n    """Doc.\n\n    More.\n    """\n'
    + "".join(f"    v_{k} = a + {k}\n" for k in range(4))
    + "    return v_0\n"
)
"""Python whose first lines end in lone carriage returns (a progress bar's output, old line endings)."""


def test_python_with_lone_carriage_returns_is_read_as_its_lines_are_shown() -> None:
    """The parser breaks lines at a lone carriage return, the lines shown do not: its line
    numbers pointed past them (an IndexError, or a body said by the wrong range). Such source is
    read by indentation, over the lines as shown."""
    out = compress(_LONE_RETURNS, NO_FOCUS, command="cat src/app.py")
    assert out is not None and out.kind == "code" and "by indentation" in out.summary
    shown = _LONE_RETURNS.split("\n")
    assert out.text.split("\n")[:3] == shown[:3]  # the carriage returns' line, the signature, the docstring's first
    assert "[… lines 4-11 left out …]" in out.text and "v_2 = a + 2" not in out.text
    assert code.names(_LONE_RETURNS) == {"parse_header"}


def test_inputs_that_broke_compressors_are_read_or_left_whole() -> None:
    # A lower case longer than its letter (İ) must not shift where lines are found.
    turkish = "\n".join([*(f"Kullanıcı: {'İ' * 40} {n}" for n in range(30)), "ERROR build failed"])
    out = compress(turkish, NO_FOCUS, command="make")
    assert out is not None and "ERROR build failed" in out.text
    rows = [{"id": n, "city": "İ" * 20} for n in range(19)] + [{"id": 19, "city": "error"}]
    assert compress(json.dumps(rows, ensure_ascii=False), NO_FOCUS) is not None
    # Plain `nl` leaves blank lines unnumbered.
    source = "import os\n" + "".join(
        f'def f{k}(x):\n    """S.\n\n    More.\n    """\n' + "    a = 1\n" * 8 + "    return a\n" for k in range(5)
    )
    numbered = "\n".join("" if not line.strip() else f"{n:6d}\t{line}" for n, line in enumerate(source.split("\n"), 1))
    out = compress(numbered, NO_FOCUS, command="nl s.py")
    assert out is not None and "     2\tdef f0(x):" in out.text
    # Nesting deeper than the parser recurses: read another way, not raised.
    deep = "def f():\n  x = 1\n  y = 2\n  z = 3\n  return x\nX = " + " + ".join(['"s"'] * 3000)
    compress(deep, NO_FOCUS, command="cat gen.py")


def test_markers_count_the_lines_of_the_whole_output_envelope_included() -> None:
    body = "\n".join(f"2024-01-01 10:00:{n:02d} INFO tick {n}" for n in range(60))
    text = f"<returncode>0</returncode>\n<output>\n{body}\n</output>"
    out = compress(text, NO_FOCUS, command="python loop.py")
    assert out is not None
    original = text.split("\n")
    marker = next(line for line in out.text.split("\n") if "left out" in line)
    first, last = (int(n) for n in marker.split("lines ")[1].split(" ")[0].split("-"))
    shown = out.text.split("\n")
    before, after = shown[shown.index(marker) - 1], shown[shown.index(marker) + 1]
    assert original[first - 2] == before and original[last] == after  # the range is exactly what is missing


def test_outputs_whose_every_line_is_a_fact_are_left_whole() -> None:
    status = "On branch main\nChanges not staged for commit:\n" + "\n".join(
        f"\tmodified:   src/module_{n}.py" for n in range(40)
    )
    assert compress(status, NO_FOCUS, command="git status") is None
    ruff = "\n".join(f"src/m{n}.py:{n + 1}:8: F401 `os` imported but unused" for n in range(40))
    assert compress(ruff, NO_FOCUS, command="ruff check .") is None
    assert compress(ruff, NO_FOCUS) is None  # sniffed as diagnostics without the command too
    config = "\n".join(f"  service_{n}:\n    image: app:{n}\n    restart: always" for n in range(20))
    assert compress(config, NO_FOCUS, command="cat docker-compose.yml") is None


def test_every_compiler_error_keeps_its_block() -> None:
    blocks = [
        f"error[E0308]: mismatched types\n --> src/h{n}.rs:3:5\n  |\n3 |     x\n"
        "  |     ^ expected `i32`, found `&str`\n"
        for n in range(5)
    ]
    text = "\n".join(["   Compiling app v0.1.0", *(f"   Compiling dep{n} v1.0.0" for n in range(40)), *blocks])
    out = compress(text, NO_FOCUS, command="make build")
    assert out is not None
    for n in range(5):
        assert f"--> src/h{n}.rs:3:5" in out.text
    assert out.text.count("expected `i32`, found `&str`") == 5


def test_an_indented_traceback_keeps_its_exception_and_what_follows() -> None:
    ticks = "\n".join(f"2024-05-01 10:00:{n:02d} INFO tick {n}" for n in range(30))
    crash = (
        "2024-05-01 10:00:31 ERROR worker crashed:\n    Traceback (most recent call last):\n"
        '      File "/app/worker.py", line 30, in run\n        cfg = load(path)\n'
        "    KeyError: 'database_url'\n    Retrying connection to shard-7: permission denied for role app"
    )
    out = compress(f"{ticks}\n{crash}\n{ticks}", NO_FOCUS, command="python worker.py")
    assert out is not None
    assert "    KeyError: 'database_url'" in out.text and "permission denied for role app" in out.text


def test_a_javascript_test_runner_keeps_what_failed() -> None:
    passing = "\n".join(f"  ✓ works {n} (3 ms)" for n in range(30))
    failure = (
        "  ● Cart › computes total\n\n    expect(received).toBe(expected)\n\n    Expected: 4\n    Received: 3\n\n"
        "       9 |   const cart = new Cart();\n    > 11 |   expect(cart.total()).toBe(4);\n"
        "      at Object.<anonymous> (src/cart.test.js:11:24)\n      at node_modules/jest-circus/run.js:3:1"
    )
    text = f"PASS src/ok.test.js\n{passing}\nFAIL src/cart.test.js\n    ✕ computes total (5 ms)\n\n{failure}\n"
    text += "\nTests:       1 failed, 30 passed, 31 total\nSnapshots:   0 total\n"
    text += "Time:        1.2 s\nRan all test suites."
    out = compress(text, NO_FOCUS, command="npx jest")
    assert out is not None and out.kind == "test"
    for fact in (
        "✕ computes total",
        "● Cart › computes total",
        "Expected: 4",
        "Received: 3",
        "> 11 |",
        "src/cart.test.js:11:24",
    ):
        assert fact in out.text
    assert "jest-circus" not in out.text


def test_a_merge_diff_keeps_both_sides_and_git_log_keeps_every_commit() -> None:
    combined = "\n".join(
        [
            "diff --cc src/config.py",
            "index 1111111,2222222..0000000",
            "--- a/src/config.py",
            "+++ b/src/config.py",
            "@@@ -1,5 -1,5 +1,9 @@@",
            "++<<<<<<< HEAD",
            " +TIMEOUT = 30",
            "++=======",
            "+ TIMEOUT = 60",
            "++>>>>>>> feature",
            *(f"  unchanged {n}" for n in range(40)),
        ]
    )
    out = compress(combined, NO_FOCUS, command="git diff")
    assert out is not None and " +TIMEOUT = 30" in out.text and "+ TIMEOUT = 60" in out.text
    commits = []
    for n in range(1, 4):
        commits += [f"commit {n:040x}", "Author: A <a@example.com>", "", f"    Fix bug number {n}", ""]
        commits += [f"diff --git a/f{n}.py b/f{n}.py", f"--- a/f{n}.py", f"+++ b/f{n}.py", "@@ -1,30 +1,30 @@"]
        commits += [*(f" same {k}" for k in range(30)), f"-old {n}", f"+new {n}"]
    out = compress("\n".join(commits), NO_FOCUS, command="git log -p")
    assert out is not None
    for n in range(1, 4):
        assert f"    Fix bug number {n}" in out.text and f"commit {n:040x}" in out.text and f"+new {n}" in out.text


def test_json_rows_with_a_value_of_another_type_are_kept() -> None:
    rows = [{"id": n, "status": "ok", "latency_ms": 20 + n % 5, "tags": ["a"]} for n in range(40)]
    rows[17]["latency_ms"] = None
    rows[23]["latency_ms"] = "n/a"
    rows[29]["tags"] = []
    out = compress(json.dumps(rows), NO_FOCUS)
    assert out is not None
    for n in (17, 23, 29):
        assert f'"id": {n},' in out.text
    messages = json.dumps({"errors": [f"field 'items[{n}].sku' is required" for n in range(20)]}, indent=2)
    assert compress(messages, NO_FOCUS) is None  # a short list of messages: each one may be the fact


def test_a_compressor_that_fails_leaves_the_output_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextd.engine.compress import strategy

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a compressor bug")

    monkeypatch.setattr(strategy, "compress", broken)
    monkeypatch.setattr(strategy, "_compressions", strategy.IdentityMemo(10))
    items = stored_items(
        [
            ItemContent(role=Role.USER, content=(TextBlock("Run it."),)),
            ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "bash", '{"command": "python w.py"}'),)),
            ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock(_build_log()),), name="bash"),)),
            ItemContent(role=Role.ASSISTANT, content=(TextBlock("Done."),)),
            ItemContent(role=Role.USER, content=(TextBlock("Next."),)),
            ItemContent(role=Role.ASSISTANT, content=(TextBlock("Ok."),)),
        ]
    )
    policy = parse_policy("protection: {last_turns: 0}\nrules: [{name: c, transform: compress}]", REGISTRY)
    inp = RenderInput(
        make_session(len(items)), items, policy, ViewRequest(ViewFormat.OPENAI_CHAT), counter(), REGISTRY, ViewState()
    )
    out = render(inp)
    assert out.certificates == () and "processed batch 1000" in out.view.messages_json


def test_the_policy_schema_names_exactly_the_kinds_the_router_knows() -> None:
    tool = schema()["properties"]["tools"]["additionalProperties"]["properties"]["content"]
    assert tuple(tool["enum"]) == KINDS


def test_names_a_cut_hid_the_directory_of_are_folded_only_when_that_is_shorter_and_safe() -> None:
    head = "\n".join([".:", "pkg", "", "./pkg:", *(f"mod{n}.py" for n in range(40)), "mod4"])
    notice = "\n</output_head>\n<elided_chars>\n9000 characters elided\n</elided_chars>\n<output_tail>\n"
    for unnamed in (
        ["n0.txt", "n1.txt", "src: ", *(f"m{i}.c" for i in range(6))],  # a name the listing would take for a header
        list("abcdefg"),  # names shorter than the fold's own words
    ):
        tail = "\n".join(["x_", *unnamed, "", "./docs:", "a.rst"])
        out = compress(f"<output_head>\n{head}{notice}{tail}\n</output_tail>", NO_FOCUS, command="ls -R")
        assert out is not None and "<output_tail>\nx_\n" + "\n".join(unnamed) + "\n" in out.text
        assert UNNAMED not in out.text and "src/:" not in out.text


def test_a_recursive_listing_with_crlf_line_ends_is_read_by_directory() -> None:
    listing = "\r\n".join([".:", "pkg", "", "./pkg:", *(f"mod{n}.py" for n in range(30)), "", "./docs:", "a.rst"])
    out = compress(listing, NO_FOCUS, command="ls -R")
    assert out is not None and "./pkg/ (30: 30 .py): mod0.py" in out.text and "./docs/: a.rst" in out.text


def _long_traceback_run() -> str:
    """pytest's long report of one failure 16 frames deep: the project's frames, then a library's."""
    separator = "_ " * 40
    frames = [
        ("tests/test_orders.py", 31, "test_checkout", "    checkout(cart)"),
        *((f"src/shop/step_{n}.py", 10 + n, f"step_{n}", f"    return step_{n + 1}(cart)") for n in range(9)),
        ("src/shop/validators.py", 88, "validate_address", "    return schema.check(cart.address)"),
        *(
            (f".venv/lib/python3.11/site-packages/schemalib/core_{n}.py", 200 + n, f"check_{n}", "    return inner()")
            for n in range(5)
        ),
    ]
    report = ["=" * 30 + " FAILURES " + "=" * 30, "_" * 25 + " test_checkout " + "_" * 25, ""]
    for n, (path, line, function, source) in enumerate(frames):
        report += [f"    def {function}(cart):", "        prepare(cart)", f">   {source}", ""]
        if n == len(frames) - 1:
            report += ["E   schemalib.errors.ValidationError: 'zip' is a required property", ""]
            report.append(f"{path}:{line}: ValidationError")
        else:
            report += [f"{path}:{line}: ", separator, ""]
    head = [
        "=" * 20 + " test session starts " + "=" * 20,
        "collected 40 items",
        "",
        "tests/test_orders.py F" + "." * 39,
    ]
    tail = ["=" * 20 + " short test summary info " + "=" * 20, "FAILED tests/test_orders.py::test_checkout"]
    tail.append("1 failed, 39 passed in 1.22s")
    return "\n".join([*head, "", *report, *tail])


def test_a_tracebacks_root_cause_keeps_its_location_with_its_frame() -> None:
    out = compress(_long_traceback_run(), NO_FOCUS, command="python -m pytest tests")
    assert out is not None and out.kind == "test"
    lines = out.text.split("\n")
    # The deepest frame in the project's own code, the one to open: its location and its source.
    assert "src/shop/validators.py:88: " in lines, out.text
    assert ">       return schema.check(cart.address)" in lines
    # Where it was raised, what was raised, and which test failed.
    assert ".venv/lib/python3.11/site-packages/schemalib/core_4.py:204: ValidationError" in lines
    assert "E   schemalib.errors.ValidationError: 'zip' is a required property" in lines
    assert "FAILED tests/test_orders.py::test_checkout" in lines
    # Every frame's source line kept with its location, never alone.
    for i, line in enumerate(lines):
        if line.startswith(">"):
            after = next(x for x in lines[i + 1 :] if x.strip() and not x.startswith("E "))
            assert after.startswith(("src/", "tests/", ".venv/", "[…")), (line, after)


def test_a_logs_header_claims_only_what_its_lines_show() -> None:
    """Repeated warnings said to be shown once must be shown once."""
    lines = [f"2026-05-01 10:00:{n:02d} INFO step {n} done" for n in range(60)]
    for n in (10, 20, 30, 40):  # the same warning, each just before an error (kept as its context)
        lines[n] = f"2026-05-01 10:00:{n:02d} WARNING pool near capacity ({n} of 64 connections)"
        lines[n + 1] = f"2026-05-01 10:00:{n + 1:02d} ERROR request {n} failed: connection reset"
    for n in range(44, 56):
        lines[n] = f"2026-05-01 10:00:{n:02d} WARNING slow query ({n} ms)"
    out = compress("\n".join(lines), NO_FOCUS, command="cat app.log")
    assert out is not None and out.kind == "log"
    shown = out.text.split("\n")
    pool = sum("WARNING pool near capacity" in line for line in shown)
    slow = sum("WARNING slow query" in line for line in shown)
    assert pool == 4  # each is the context of an error
    assert "once" not in out.summary, out.summary
    assert f"{pool + slow} of 16 warning lines" in out.summary, out.summary


def test_a_long_run_of_alike_lines_left_out_of_a_log_keeps_one_of_them() -> None:
    """A gap says how many lines went; one of them says what kind, and what they all share (here
    where pip installs: the environment the agent's code runs from)."""
    packages = ["alabaster", "babel", "docutils", "imagesize", "jinja2", "packaging", "pygments", "requests"]
    where = "/opt/conda/envs/app/lib/python3.9/site-packages"
    lines = ["Obtaining file:///work/app", "  Preparing metadata (setup.py): started"]
    lines += [
        f"Requirement already satisfied: {p} in {where} (from app==1.0) (1.{n}.0)" for n, p in enumerate(packages)
    ]
    lines += ["Installing collected packages: app", "  Running setup.py develop for app", "Successfully installed app"]
    out = compress("\n".join(lines), NO_FOCUS, command="pip install -e .")
    assert out is not None and out.kind == "log", out
    shown = out.text.splitlines()
    assert sum(where in line for line in shown) == 1, out.text
    assert "one line of each long run of alike lines" in out.summary
    # Lines of many kinds left out: none is chosen to stand for them.
    stages = string.ascii_letters[:40]
    mixed = [f"{c}-stage ran over batch {n} of the nightly import and wrote its shard" for n, c in enumerate(stages)]
    out = compress("\n".join(["start", "begin", *mixed, "end", "stop", "done"]), NO_FOCUS, command="./job")
    assert out is not None and out.kind == "text", out
    assert not any(line in out.text for line in mixed), out.text
    # A test run's routine lines are passes, which its summary counts: no sample of them.
    run = [f"tests/test_mod.py::test_case_{n} PASSED" for n in range(40)] + ["40 passed in 0.52s"]
    out = compress("\n".join(run), NO_FOCUS, command="pytest -v")
    assert out is not None and out.kind == "test" and "alike" not in out.summary, out
    assert not any(line in out.text for line in run[1:-3]), out.text


def test_a_folded_long_listing_keeps_which_names_are_directories() -> None:
    names = sorted([*(f"module_{n:02d}.py" for n in range(30)), "docs", "src", "tests", "build", "scripts"])
    directories = {"docs", "src", "tests", "build", "scripts"}
    lines = ["total 208", "drwxr-xr-x 12 dev dev 4096 Mar  3 10:01 .", "drwxr-xr-x  5 dev dev 4096 Mar  3 09:12 .."]
    for name in names:
        mode = "drwxr-xr-x  4" if name in directories else "-rw-r--r--  1"
        lines.append(f"{mode} dev dev {4096 if name in directories else 1520} Mar  3 10:01 {name}")
    lines.append("lrwxrwxrwx  1 dev dev   11 Mar  3 10:01 latest -> build/v1.2.3")
    out = compress("\n".join(lines), NO_FOCUS, command="ls -la")
    assert out is not None and out.kind == "listing", out
    shown = set(out.text.replace("\n", "  ").split("  "))
    for name in directories:
        assert name not in shown, (name, out.text)  # never a directory read as a file
    assert any(f"{name}/" in shown for name in directories), out.text
    assert "5 (dir)" in out.text and "1 (link)" in out.text, out.text


def _pods(broken: int) -> str:
    """`kubectl get pods -o json`: twelve pods, one of them crash-looping."""

    def pod(n: int) -> dict[str, object]:
        running = {"running": {"startedAt": f"2026-05-01T10:{n:02d}:00Z"}}
        waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}}
        terminated = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-05-01T10:40:00Z"}}
        status = {
            "phase": "Running",
            "podIP": f"10.0.3.{n}",
            "containerStatuses": [
                {
                    "name": "api",
                    "ready": n != broken,
                    "restartCount": 7 if n == broken else 0,
                    "image": "registry.local/api:1.4.2",
                    "state": waiting if n == broken else running,
                    "lastState": terminated if n == broken else {},
                }
            ],
        }
        metadata = {"name": f"api-7d9f8-{n:04d}", "namespace": "shop", "labels": {"app": "api", "tier": "backend"}}
        spec = {"nodeName": f"node-{n % 3}", "containers": [{"name": "api", "image": "registry.local/api:1.4.2"}]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}

    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod(n) for n in range(12)]}, indent=2)


def test_content_that_parses_as_json_is_read_as_json_whatever_the_command_suggests() -> None:
    text = _pods(broken=5)
    for command in ("kubectl get pods -n shop -o json", "docker inspect api", "cat pods.log"):
        out = compress(text, NO_FOCUS, command=command)
        assert out is not None and out.kind == "json", (command, out)
        # The anomalous object's status-like fields stay.
        for fact in ("api-7d9f8-0005", "CrashLoopBackOff", '"restartCount": 7', '"exitCode": 1', "back-off 5m0s"):
            assert fact in out.text, (command, fact, out.text)


def test_a_bulky_anomalous_objects_status_like_fields_stay_when_the_json_is_compressed() -> None:
    pods = json.loads(_pods(broken=5))
    for pod in pods["items"]:  # specs and annotations that dwarf the status
        pod["spec"]["containers"][0]["env"] = [
            {"name": f"VAR_{k}", "value": f"value-{k}-" + "x" * 40} for k in range(60)
        ]
        pod["metadata"]["annotations"] = {f"note/{k}": "y" * 80 for k in range(20)}
    text = json.dumps(pods, indent=2)
    out = compress(text, NO_FOCUS, command="kubectl get pods -n shop -o json")
    assert out is not None and out.kind == "json" and len(out.text) < len(text) / 4
    for fact in ('"phase": "Running"', '"ready": false', '"restartCount": 7', '"exitCode": 1', '"reason": "Error"'):
        assert fact in out.text, fact
    assert "CrashLoopBackOff" in out.text and "back-off 5m0s restarting failed container" in out.text


def _verbose_run(failing: int, lines: int = 1500) -> str:
    """A verbose test run (a line per test, status after it) by a command no hint knows, its
    summary past the head a sniffer reads."""
    tests = [f"tests/test_app.py::test_case_{k} {'FAILED' if k == failing else 'PASSED'}" for k in range(lines)]
    return "\n".join(["$ ./run_checks", *tests, f"1 failed, {lines - 1} passed in 3.20s"])


@pytest.mark.parametrize("failing", [3, 700, 1499])
def test_a_verbose_test_run_by_a_command_no_hint_knows_is_read_as_one_and_keeps_its_failure(failing: int) -> None:
    text = _verbose_run(failing)
    out = compress(text, NO_FOCUS, command="./run_checks")
    assert out is not None and out.kind == "test", out
    assert f"tests/test_app.py::test_case_{failing} FAILED" in out.text
    assert "1 failed, 1499 passed in 3.20s" in out.text


def test_search_results_keep_a_failure_few_lines_report_and_say_so() -> None:
    lines = [f"build/reports/{name}.txt:1:check {name} ok" for name in (f"module{k}" for k in range(300))]
    lines[211] = "build/reports/module211.txt:1:check module211 FAILED: schema drift in orders.sql"
    out = compress("\n".join(lines), NO_FOCUS, command="grep -rn check build/reports")
    assert out is not None and out.kind == "search"
    assert lines[211] in out.text and "every failure" in out.summary
    # A search for failures keeps its usual samples: each line is no anomaly there.
    errors = [f"src/app/m{k}.py:{k}:    raise ValueError('bad {k}')" for k in range(300)]
    out = compress("\n".join(errors), NO_FOCUS, command="grep -rn ValueError src")
    assert out is not None and out.summary.startswith(f"{SAMPLES} of 300 result lines kept (the focus, one per")


_UNREAD_FOCI = [NO_FOCUS, Focus(("src/app.py",), ()), Focus((), ("parse_header", "app")), Focus(("modified",), ())]


@pytest.mark.parametrize(
    ("text", "command", "read"),
    [
        ("On branch main\n\tmodified:   src/app.py\n\tmodified:   src/cli.py", "git status", False),
        ("On branch main\n" + "\n".join(f"\tmodified:   src/m{k}.py" for k in range(60)), "git status", False),
        ("1", "python3 -c 'print(1)'", False),
        ("\n".join(f"step {k}: ok" for k in range(5)), "./run.sh", False),
        ("\n".join(f"step {k}: ok" for k in range(40)), "./run.sh", True),  # enough lines to read
        ("\n".join(f"def f_{k}(x):\n    return x\n" for k in range(10)), "cat src/app.py", True),
    ],
)
def test_an_output_no_compressor_reads_is_left_whole_under_every_focus(text: str, command: str, read: bool) -> None:
    """`router.unread`: what no compressor reads whatever the focus (its kind has no compressor, or
    it is lines too few to read as lines); the compressing rule does not ask about it again as
    the focus moves (compress/strategy.py, `Compress.keys`)."""
    assert unread(text, command=command) is not read
    if not read:
        assert all(compress(text, focus, command=command) is None for focus in _UNREAD_FOCI)


_WRAPPED = [
    "{}",
    "<output>\n{}\n</output>",
    "<returncode>1</returncode>\n<output>\n{}\n</output>",
    "<stdout>{}</stdout>",
    "<returncode>0</returncode>\n<output_head>\n{}\n</output_head>\n<elided_chars>\n900 characters elided\n"
    "</elided_chars>\n<output_tail>\n{}\n</output_tail>",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["src/app.py", "parse_header", "ERROR", "modified:", "x = 1", "def f(x):", "ok", '{"a": 1}']),
        max_size=30,
    ),
    st.sampled_from(["git status", "ls -la", "./run.sh", "cat notes.txt", "make", "pytest -q", "grep -rn x src", ""]),
    st.sampled_from(_UNREAD_FOCI),
    st.sampled_from(["", "log", "text", "status", "json", "code", "bogus"]),
    st.sampled_from(["", "src/app.py", "notes.txt", "data.json"]),
    st.sampled_from(_WRAPPED),
)
def test_what_no_compressor_reads_none_compresses_under_any_focus(
    lines: list[str], command: str, focus: Focus, declared: str, path: str, wrapped: str
) -> None:
    """Whatever the kind it is declared, hinted or sniffed to be, its tool's tags, a notice of
    what the tool cut, and the focus: what `unread` says no compressor reads, none compresses."""
    body = "\n".join(lines)
    text = wrapped.format(body, body)
    if unread(text, declared=declared, command=command, path=path):
        for examples in (False, True):
            assert compress(text, focus, declared=declared, command=command, path=path, examples=examples) is None


def test_remembered_values_are_bounded_by_their_weight_the_least_recently_used_going_first() -> None:
    from contextd.engine.compress.text import Remembered

    held: Remembered[str] = Remembered(100, max_bytes=3_500)
    for k in range(5):
        held.get(k, lambda k=k: str(k) * 1_000)  # about 1,050 bytes each
    assert len(held) == 3 and held.bytes <= 3_500
    assert held.get(4, lambda: "again") == "4" * 1_000  # the newest stayed
    assert held.get(0, lambda: "again") == "again"  # the oldest went
    held.clear()
    assert (len(held), held.bytes) == (0, 0)
    held.get("small", lambda: "s" * 500)
    assert held.get("big", lambda: "b" * 20_000) == "b" * 20_000  # heavier than the bound: not kept,
    assert len(held) == 1 and held.get("small", lambda: "again") == "s" * 500  # nor the rest pushed out
    by_count: Remembered[str] = Remembered(2)  # no byte bound: by count alone
    for k in range(3):
        by_count.get(k, lambda k=k: str(k) * 10_000)
    assert len(by_count) == 2 and by_count.bytes == 2 * weigh("0" * 10_000)


def test_remembered_values_count_against_the_memos_byte_budget() -> None:
    """Parsed modules and searches read are remembered by content, beside the memos: they count
    against the same budget (`--memo-bytes`), give way past it like a memo, and are forgotten
    with the memos (a render after `clear_memos` is a genuine first one)."""
    from contextd.engine import memo
    from contextd.engine.compress.text import Remembered
    from contextd.engine.memo import DEFAULT_MEMO_BYTES, clear_memos, memo_bytes, set_memo_bytes

    clear_memos()
    memo_bytes()  # (the count recounted: memos of other tests' collected since may leave theirs in)
    held: Remembered[str] = Remembered(100)
    each = weigh("0" * 10_000)
    try:
        for k in range(4):
            held.get(k, lambda k=k: str(k) * 10_000)
        # The budget's own count (not recounted from the members, as `memo_bytes` does) follows.
        assert memo._BUDGET.held == held.bytes == 4 * each
        set_memo_bytes(3 * each)  # past it: trimmed to 90%, the oldest first
        assert len(held) == 2 and memo._BUDGET.held == held.bytes == 2 * each
        assert held.get(3, lambda: "again") == "3" * 10_000 and held.get(0, lambda: "again") == "again"
        assert memo._BUDGET.held == held.bytes == 2 * each + weigh("again")
        set_memo_bytes(DEFAULT_MEMO_BYTES)
        two: Remembered[str] = Remembered(2)  # past its count: what it lets go of is counted off
        for k in range(3):
            two.get(k, lambda k=k: str(k) * 10_000)
        assert len(two) == 2 and memo._BUDGET.held == held.bytes + two.bytes == 4 * each + weigh("again")
        clear_memos()
        assert (len(held), held.bytes, memo._BUDGET.held, memo_bytes()) == (0, 0, 0, 0)
    finally:
        set_memo_bytes(DEFAULT_MEMO_BYTES)
        held.clear()


_WORDISH = st.lists(st.sampled_from([*"ab_1 .:/-\n\té", "ab", "a_b", "b1"]), max_size=20).map("".join)


@settings(max_examples=300, deadline=None)
@given(_WORDISH, st.lists(_WORDISH, max_size=4))
def test_a_text_read_for_words_as_asked_holds_those_all_its_words_hold(text: str, terms: list[str]) -> None:
    """`TextWords` looks for each word asked about in the text (the first render of an output
    asks about a few): it holds a word exactly when finding every word of the text would, and a
    focus within it keeps the same terms."""
    words = frozenset(WORD.findall(text))
    lazily = TextWords(text)
    for term in terms:
        asked = frozenset(WORD.findall(term))
        assert lazily.holds(asked) == (asked <= words), (text, term)
    focus = Focus(tuple(terms), tuple(reversed(terms)))
    assert focus.within(TextWords(text)) == focus.within(words)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["x = 1", "Value", "Error", "ERR", "npm ERR!", "not", " found", "İ", "\n", "_", " "]),
        max_size=30,
    )
)
def test_the_lines_reporting_errors_are_those_holding_an_error_word_whatever_the_text_holds(parts: list[str]) -> None:
    """An output none of whose text holds an error word is passed over in one pass; the others
    are read word by word: the same lines either way."""
    found = Lines("".join(parts))
    every = set(found.having(ERROR_WORDS, fold_case=True)) | set(
        found.having(ERROR_SUFFIXES, fold_case=True, suffix=True)
    )
    assert found.reporting_errors() == every
