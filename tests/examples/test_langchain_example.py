"""examples/langchain_agent.py runs as a user runs it, against a server that needs an API key, and
shows what it says: the model got contextd's view, the graph's state kept every message."""

from __future__ import annotations

from pathlib import Path

from tests.examples.conftest import run_example


def test_a_langchain_agent_gets_back_what_left_its_view(repo_root: Path, target: str) -> None:
    out = run_example(repo_root, "langchain_agent.py", target)
    assert "  tools: run, contextd_retrieve, contextd_search" in out
    assert "model call 1: 2 messages, a SystemMessage first" in out  # the view: the system prompt, the question
    # The long test run left the model's view (a placeholder with its handle) ...
    assert "  call_1: [contextd: output of tool call call_1 (run) removed (budget: " in out
    assert '  -> contextd_retrieve({"handle": ' in out  # ... and the model got the error back by that handle
    assert "  answer: parse() adds 1 to the month; the test run says: 601:E   ValueError" in out
    # ... while the graph's state kept it whole, and the session holds each message once.
    assert "state: 8 messages, the test run whole (602 lines); session: 9 items" in out
    assert ": seq 4 prune (budget: budget)" in out  # its certificate
    assert "next turn: the session went from 9 to 11 items" in out
