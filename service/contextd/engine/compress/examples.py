"""What an agent writes new code from, in a module a skeleton stands for (code.py's
`examples`): a test module's setup and fixtures, which build the objects its tests use, and
short bodies, one of each shape."""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Sequence

SHORT_BODY = 8
"""With `examples`, bodies shorter than this many lines are shown (but one alike a body shown
before it). In Python's standard library such bodies are 35% of those a skeleton leaves out
and 11% of their lines (30% and 7% in the packages of contextd's environment, 36% and 13% in
their tests): most of the module's uses for a tenth of what it costs."""

_SHAPE_STRING = re.compile(r"""[rRbBuUfF]*("[^"\n]*"|'[^'\n]*')""")
_SHAPE_NUMBER = re.compile(r"\b\d[\w.]*")
_SHAPE_WORD = re.compile(r"[A-Za-z_]\w*")
_KEYWORDS = frozenset(keyword.kwlist)


def body_shape(lines: Sequence[str]) -> str:
    """A body's statements with their names, strings and numbers said alike (keywords and
    punctuation kept): two bodies of one shape differ only in what they name."""
    text = "\n".join(line.strip() for line in lines)
    text = _SHAPE_NUMBER.sub("0", _SHAPE_STRING.sub('""', text))
    return _SHAPE_WORD.sub(lambda m: m.group(0) if m.group(0) in _KEYWORDS else "n", text)


SETUP = frozenset(
    {
        "setUp",
        "setUpClass",
        "setUpTestData",
        "setUpModule",
        "asyncSetUp",
        "setup_method",
        "setup_class",
        "setup_module",
        "setup_function",
    }
)
"""The setup of unittest's, Django's and pytest's test classes and modules."""


def builds(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function is a test module's setup or a pytest fixture (``@pytest.fixture``,
    ``@fixture(...)``)."""
    if node.name in SETUP:
        return True
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
        if isinstance(target, ast.Name) and target.id == "fixture":
            return True
    return False


FIXTURE = re.compile(r"\s*@(?:[\w.]*\.)?fixture\b")
"""A pytest fixture's decorator line, for code read by its indentation."""
