"""Search over a session's items, on both backends: full text ranked, substring and regex,
filters, paging, and bounded answers."""

from __future__ import annotations

import uuid

import pytest
from contextd_client import Client, ContextdError, ViewFormat

from tests.api.test_recovery import MASK_OLD
from tests.conftest import ServerThread


def long_session(client: Client, n_items: int = 1000) -> tuple[str, int]:
    """A session of `n_items` items whose one tool output holds a unique identifier; its seq."""
    session = client.create_session(f"search-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
    messages: list[dict[str, object]] = [{"role": "user", "content": "Find the failing charge."}]
    planted = 0
    call = 0
    while len(messages) < n_items:
        call += 1
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {call}}}'}}
        messages.append({"role": "assistant", "content": f"Looking at batch {call}.", "tool_calls": [use]})
        body = "".join(f"batch {call} row {k}: charge ok amount={k * 7}\n" for k in range(8))
        if call == 217:
            body += "charge ch_7Hq2LwQz declined: insufficient funds (request req_55Z1)\n"
            planted = len(messages) + 1
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": body})
    for start in range(0, n_items, 250):
        client.append_openai(session, messages[start : start + 250])
    return session, planted


def test_search_finds_a_planted_identifier_among_a_thousand_items(server: ServerThread) -> None:
    with Client(server.target, timeout=30) as client:
        session, planted = long_session(client)
        view = client.render_view(session, ViewFormat.OPENAI_CHAT)  # the planted output leaves the view
        assert planted in {c.seq for c in view.certificates if c.decision == "prune"}

        found = client.search(session, "ch_7Hq2LwQz")
        assert [h.seq for h in found.hits] == [planted]
        [hit] = found.hits
        assert (hit.role, hit.tool_name) == ("tool", "bash") and "declined" in hit.snippet
        assert client.retrieve(session, hit.handle).content.endswith("(request req_55Z1)\n")  # and back, whole

        out_of_view = client.search(session, "insufficient funds", only_out_of_view=True)
        assert [h.seq for h in out_of_view.hits] == [planted]
        exact = client.search(session, "req_55Z1)", mode="substring")
        assert [h.seq for h in exact.hits] == [planted] and "«req_55Z1)»" in exact.hits[0].snippet
        pattern = client.search(session, r"ch_[0-9A-Za-z]{8} declined", mode="regex")
        assert [h.seq for h in pattern.hits] == [planted]
        assert client.search(session, "ch_7Hq2LwQz", roles=["assistant"]).hits == ()
        assert client.search(session, "ch_7Hq2LwQz", max_seq=planted - 1).hits == ()


def test_results_are_ranked_bounded_and_paged(server: ServerThread) -> None:
    with Client(server.target, timeout=30) as client:
        session, _ = long_session(client, 200)
        first = client.search(session, "charge ok", page_size=500)  # asks for more than the cap
        assert len(first.hits) == 50 and first.next_page_token
        assert [h.score for h in first.hits] == sorted((h.score for h in first.hits), reverse=True)
        seen, token = [h.seq for h in first.hits], first.next_page_token
        while token:
            page = client.search(session, "charge ok", page_size=50, page_token=token)
            seen += [h.seq for h in page.hits]
            token = page.next_page_token
        assert len(seen) == len(set(seen)) == 100  # every tool output (one per call), once
        assert all(len(h.snippet) <= 240 for h in first.hits)
        batch = client.search(session, "Looking at batch", mode="substring", roles=["assistant"], page_size=5)
        assert [h.seq for h in batch.hits] == [2, 4, 6, 8, 10]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "(unclosed", "mode": "regex"}, "query"),
        ({"query": "x", "page_token": "not-a-token"}, "page_token"),
        ({"query": "x", "min_seq": 5, "max_seq": 2}, "max_seq"),
    ],
)
def test_bad_searches_say_which_field(client: Client, session_id: str, options: dict[str, object], field: str) -> None:
    client.append_openai(session_id, [{"role": "user", "content": "hello there"}])
    rest = dict(options)
    query = str(rest.pop("query"))
    with pytest.raises(ContextdError) as bad:
        client.search(session_id, query, **rest)
    assert bad.value.code == "INVALID_ARGUMENT" and field in bad.value.message


def test_a_huge_output_is_stored_and_searchable_and_patterns_cannot_stall(server: ServerThread) -> None:
    ids = [str(uuid.UUID(int=n * 7919 + 12345)) for n in range(14_000)]  # 518 KB of identifiers
    with Client(server.target, timeout=30) as client:
        session = client.create_session(f"huge-{uuid.uuid4().hex[:10]}").id
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        client.append_openai(
            session,
            [
                {"role": "user", "content": "List them."},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "\n".join([*ids, "a" * 40 + "!"])},
            ],
        )
        assert [h.seq for h in client.search(session, ids[3]).hits] == [3]  # full text: its first 100,000 characters
        assert [h.seq for h in client.search(session, ids[-1], mode="substring").hits] == [3]  # all of it
        # A pattern that backtracks for ever in a backtracking engine answers at once (RE2).
        assert client.search(session, "^(a+)+$", mode="regex").hits == ()
        assert client.retrieve(session, seq=3, page_unit="lines", grep="^(a+)+$").content == ""


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"query": "a\x00b"}, "query"),
        ({"query": "x", "tools": ["ba\x00sh"]}, "tools[0]"),
        ({"query": "x", "min_seq": 2**63}, "min_seq"),
    ],
)
def test_searches_that_cannot_be_stored_values_are_refused(
    client: Client, session_id: str, options: dict[str, object], field: str
) -> None:
    rest = dict(options)
    query = str(rest.pop("query"))
    with pytest.raises(ContextdError) as bad:
        client.search(session_id, query, **rest)
    assert bad.value.code == "INVALID_ARGUMENT" and field in bad.value.message
