"""The programs in examples/ run as a user runs them, against a server that needs an API key,
and say what they show."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples.conftest import run, run_example


@pytest.mark.parametrize("name", ["openai_loop.py", "anthropic_loop.py"])
def test_an_agent_loop_gets_back_what_left_its_view(repo_root: Path, target: str, name: str) -> None:
    out = run_example(repo_root, name, target)
    assert "tools: run, contextd_retrieve, contextd_search" in out
    assert "seq 4 placeholder [BUDGET_OFFLOADED]" in out  # the long test run left the view...
    assert '  contextd_retrieve({"handle": ' in out  # ... and the model retrieved it by its handle
    assert "answer: parse() adds 1 to the month; the test run says: 601:E   ValueError" in out


def test_retrieve_and_search_find_the_output_behind_a_placeholder(repo_root: Path, target: str) -> None:
    out = run_example(repo_root, "retrieve_and_search.py", target)
    assert "  seq 4: placeholder, " in out
    assert "retrieve with handle " in out
    assert "  806:FAILED tests/test_parser.py::test_parse - ValueError: month must be in 1..12" in out
    assert "search 'month must be' among the items out of the view: 1 hit(s)" in out


def test_without_the_key_an_example_fails_with_the_reason(repo_root: Path, target: str) -> None:
    done = run(repo_root, "retrieve_and_search.py", "--target", target)
    assert done.returncode != 0 and "UNAUTHENTICATED" in done.stderr
