"""examples/pydantic_ai_agent.py run as a user runs it, against a server that needs an API key."""

from __future__ import annotations

from pathlib import Path

from tests.examples.conftest import run_example


def test_a_pydantic_ai_agent_gets_back_what_left_its_view_and_continues_from_contextd(
    repo_root: Path, target: str
) -> None:
    out = run_example(repo_root, "pydantic_ai_agent.py", target)
    assert "tools: run, contextd_retrieve, contextd_search" in out
    assert "model call 2: 3 messages, the test run compressed, handle " in out
    assert "model call 3: 5 messages, the test run a placeholder, handle " in out  # it left the view...
    assert "  calls contextd_retrieve(handle='" in out  # ... and the model took it back by its handle
    assert "answer: parse() adds 1 to the month; the test run says: 601:E   ValueError" in out
    # The agent's own history keeps everything; the session holds each turn once.
    assert "run 1: 9 items in the session; the agent's own history kept the test run whole (602 lines)" in out
    assert "run 2 starts from contextd: 8 messages, the test run a placeholder" in out
    assert "answer: Drop the + 1" in out and "done: 11 items (pydantic-ai-example-" in out
