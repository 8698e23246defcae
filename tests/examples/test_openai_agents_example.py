"""examples/openai_agents_session.py runs as a user runs it, against a server that needs an API
key, and says what it shows."""

from __future__ import annotations

from pathlib import Path

from tests.examples.conftest import run_example


def test_an_agents_sdk_session_on_contextd_gets_back_what_left_its_view(repo_root: Path, target: str) -> None:
    out = run_example(repo_root, "openai_agents_session.py", target)
    assert "tools: run, contextd_retrieve, contextd_search" in out
    assert "model call: view of 5 items, " in out and ", seq 3 placeholder" in out  # the test run left the view
    assert '  contextd_retrieve({"handle":"' in out  # ... and the model got it back by its handle
    assert "answer: The test run says: 601:E   ValueError: month must be in 1..12" in out
    assert "session: 10 SDK items, stored as 10 contextd items, each once" in out  # two runs, nothing twice
    assert out.rstrip().endswith("; 9 SDK items left")  # pop_item took the last answer back
