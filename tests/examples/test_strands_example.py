"""examples/strands_agent.py runs as a user runs it, against a server that needs an API key, and shows
what it says: the model got contextd's view, the session holds each message once, a guardrail's
redaction holds, and a new agent continues the conversation from contextd."""

from __future__ import annotations

from pathlib import Path

from tests.examples.conftest import run_example


def test_a_strands_agent_keeps_its_conversation_in_contextd(repo_root: Path, target: str) -> None:
    out = run_example(repo_root, "strands_agent.py", target)
    assert "  tools: run, contextd_retrieve, contextd_search, contextd_pin" in out
    assert "model call 1: view of 1 messages, " in out  # the question (the system prompt is Strands' own)
    # The long test run left the model's view (a placeholder with its handle) ...
    assert "model call 3: view of 5 messages, " in out and ", seq 3 placeholder [BUDGET_OFFLOADED]" in out
    assert '  -> contextd_retrieve({"handle": ' in out  # ... and the model got the error back by that handle
    assert "  answer: parse() adds 1 to the month; the test run says: 601:E   ValueError" in out
    # ... while contextd kept it whole and each message once; agent.messages is the view.
    whole = "session: 8 items (each message once, the test run whole: 602 lines); agent.messages: the last view"
    assert f"{whole} (the test run as a placeholder)" in out
    assert "redacted: seq 9 (retraction, client); retrieve -> ITEM_REDACTED" in out
    assert "resumed: 10 messages from contextd, the password in none of them: True" in out
    assert "  answer: Not until parse() stops adding 1 to the month." in out
    assert "next turn: the session went from 11 to 13 items" in out
