"""Search over a session's items, on both backends: full text ranked, substring and regex,
every item whole however long, filters, paging, and bounded answers."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextd.recovery import MAX_QUERY_CHARS, MAX_TOOL_FILTERS
from contextd_client import Client, ContextdError, ViewFormat
from contextd_storage.search import CHUNK_CHARS, OVERLAP_CHARS, chunk_bounds, text_chunks
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for
from tests.service.api.test_recovery import MASK_OLD


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
        assert [h.seq for h in client.search(session, ids[3]).hits] == [3]  # full text, near the start
        assert [h.seq for h in client.search(session, ids[-1]).hits] == [3]  # and at the end, 518 KB on
        assert [h.seq for h in client.search(session, ids[-1], mode="substring").hits] == [3]
        # A pattern that backtracks for ever in a backtracking engine answers at once (RE2).
        assert client.search(session, "^(a+)+$", mode="regex").hits == ()
        assert client.retrieve(session, seq=3, page_unit="lines", grep="^(a+)+$").content == ""


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"query": "a\x00b"}, "query"),
        ({"query": "x", "tools": ["ba\x00sh"]}, "tools[0]"),
        ({"query": "x", "min_seq": 2**63}, "min_seq"),
        ({"query": "x", "max_seq": 2**64 - 1}, "max_seq"),
        ({"query": "x", "tools": ["bash", "t" * 257]}, "tools[1]"),
        ({"query": "x", "roles": ["user"] * 5}, "roles"),
        ({"query": "x", "page_token": "\u00b2"}, "page_token"),  # a digit to str.isdigit, not to int
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


def tail_output() -> str:
    """A 150,000-character test log whose one failure, and only mention of "zanzibar", is its
    last line."""
    cases = "".join(f"case {n:06d} passed in {n % 97} ms\n" for n in range(5000))
    return cases + "summary: 1 failed, zanzibar assertion at the very end\n"


def tail_session(client: Client) -> str:
    """A session whose seq 3 is `tail_output()`, and whose seq 4 says "passed" too."""
    session = client.create_session(f"tail-{uuid.uuid4().hex[:10]}").id
    call = {"id": "c1", "type": "function", "function": {"name": "pytest", "arguments": "{}"}}
    client.append_openai(
        session,
        [
            {"role": "user", "content": "Run the suite."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": tail_output()},
            {"role": "user", "content": "Which case failed? Not the ones that passed."},
        ],
    )
    return session


def test_the_tail_of_a_long_output_is_found_in_every_mode(server: ServerThread) -> None:
    log = tail_output()
    assert len(log) > 120_000 and log.count("zanzibar") == 1 and log.index("zanzibar") > len(log) - 100
    with Client(server.target, timeout=30) as client:
        session = tail_session(client)
        [hit] = client.search(session, "zanzibar").hits
        assert (hit.seq, hit.tool_name) == (3, "pytest") and "«zanzibar»" in hit.snippet
        assert "1 failed" in hit.snippet  # the snippet is the last chunk's, around the word
        [exact] = client.search(session, "zanzibar assertion", mode="substring").hits
        assert exact.seq == 3 and "«zanzibar assertion»" in exact.snippet
        [pattern] = client.search(session, r"1 failed, \w+ assertion", mode="regex").hits
        assert pattern.seq == 3 and "«1 failed, zanzibar assertion»" in pattern.snippet
        # Every piece of a query must be in the item, not in one chunk: the first case and the
        # last line are 150,000 characters apart; a piece it does not hold finds nothing.
        assert [h.seq for h in client.search(session, "000007 zanzibar").hits] == [3]
        assert client.search(session, "zanzibar 999999").hits == ()


def test_an_item_is_one_hit_however_many_of_its_chunks_match(server: ServerThread) -> None:
    with Client(server.target, timeout=30) as client:
        session = tail_session(client)
        found = client.search(session, "passed", page_size=50)
        assert sorted(h.seq for h in found.hits) == [3, 4] and not found.next_page_token
        first = client.search(session, "passed", page_size=1)
        second = client.search(session, "passed", page_size=1, page_token=first.next_page_token)
        assert len(first.hits) == len(second.hits) == 1 and not second.next_page_token
        assert {first.hits[0].seq, second.hits[0].seq} == {3, 4}  # paged by items, not chunks


def test_a_piece_across_a_chunk_edge_is_found_and_no_fragment_is_a_word(server: ServerThread) -> None:
    # No whitespace: the first chunk ends at the last comma before CHUNK_CHARS, inside the
    # piece "quokka,wombat"; the next starts OVERLAP_CHARS before that, so it holds the piece whole.
    body = "a," * 3995 + "quokka,wombat" + ",b" * 3000
    first, second = text_chunks(body)[:2]
    assert first.endswith(",quokka,") and "wombat" not in first and "a,quokka,wombat,b" in second
    assert len(first) <= CHUNK_CHARS and chunk_bounds(body)[1][0] <= len(first) - OVERLAP_CHARS
    with Client(server.target) as client:
        session = client.create_session(f"edge-{uuid.uuid4().hex[:10]}").id
        client.append_openai(session, [{"role": "user", "content": body}])
        assert [h.seq for h in client.search(session, "quokka,wombat").hits] == [1]
        assert [h.seq for h in client.search(session, "a,quokka,wombat,b").hits] == [1]
        assert client.search(session, "quo").hits == () and client.search(session, "womb").hits == ()


@given(st.text(alphabet="ab \n,", min_size=0, max_size=40_000))
def test_chunks_cover_the_text_and_overlap_by_at_least_a_query(whole: str) -> None:
    bounds = chunk_bounds(whole)
    assert OVERLAP_CHARS >= MAX_QUERY_CHARS
    assert [whole[s:e] for s, e in bounds] == text_chunks(whole)
    assert all(0 < e - s <= CHUNK_CHARS for s, e in bounds)
    assert (bounds[0][0], bounds[-1][1]) == (0, len(whole)) if whole else bounds == []
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end - start >= OVERLAP_CHARS  # so any span of a query's length is whole in one chunk


def test_a_tools_filter_is_bounded_and_bound_as_one_parameter(server: ServerThread) -> None:
    with Client(server.target, timeout=30) as client:
        session, planted = long_session(client, 500)
        many = [f"tool-{n}" for n in range(MAX_TOOL_FILTERS - 1)] + ["bash"]
        assert [h.seq for h in client.search(session, "ch_7Hq2LwQz", tools=many).hits] == [planted]
        assert client.search(session, "ch_7Hq2LwQz", tools=many[:-1]).hits == ()
        for mode in ("substring", "regex"):
            assert [h.seq for h in client.search(session, "req_55Z1", mode=mode, tools=many).hits] == [planted]
        # A pattern no index narrows (no literal of three characters) is matched over the texts
        # the search holds; the filter is the database's still.
        assert [h.seq for h in client.search(session, r"\d\dZ\d", mode="regex", tools=many).hits] == [planted]
        assert client.search(session, r"\d\dZ\d", mode="regex", tools=many[:-1]).hits == ()
        with pytest.raises(ContextdError) as refused:
            client.search(session, "ch_7Hq2LwQz", tools=[f"tool-{n}" for n in range(40_000)])
        assert refused.value.code == "INVALID_ARGUMENT" and refused.value.reason == "LIMIT_EXCEEDED"
        assert refused.value.message.startswith("tools:")
        roles = client.search(session, "ch_7Hq2LwQz", roles=["system", "user", "assistant", "tool"]).hits
        assert [h.seq for h in roles] == [planted]


def test_full_text_reads_any_query_as_text_never_as_syntax(client: Client, session_id: str) -> None:
    client.append_openai(session_id, [{"role": "user", "content": "it's a:b x|y (c&d) don't stop \\ NEAR AND"}])
    for query in ("it's", "a:b", "x|y", "(c&d)", "don't stop", "\\", "'", "NEAR AND", "a:b* !x", "é's ''"):
        client.search(session_id, query)  # answers, whatever the operators in it
    assert [h.seq for h in client.search(session_id, "x|y (c&d)").hits] == [1]
    assert [h.seq for h in client.search(session_id, "NEAR AND").hits] == [1]
    assert client.search(session_id, "it's nowhere").hits == ()


def test_out_of_the_view_follows_each_render_on_every_replica(server: ServerThread, database_url: str) -> None:
    """What is out of the view is read per view state version: from the state this replica's
    render saved, or decoded once by a replica that did not render it."""
    other = ServerThread(settings_for(database_url)).start()
    try:
        with Client(server.target, timeout=30) as client, Client(other.target, timeout=30) as replica:
            session, planted = long_session(client, 500)
            client.render_view(session, ViewFormat.OPENAI_CHAT)
            body = "".join(f"late row {k}: charge ok amount={k * 7}\n" for k in range(8))
            call = {"id": "late", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            late = [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "late", "content": body + "request req_55Z1 again: declined\n"},
            ]
            client.append_openai(session, late)
            for each in (client, replica):
                found = each.search(session, "req_55Z1", mode="substring", only_out_of_view=True)
                assert [h.seq for h in found.hits] == [planted]  # the late output is in the view
            client.append_openai(
                session, [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": "On it."}]
            )
            view = client.render_view(session, ViewFormat.OPENAI_CHAT)  # the late output leaves it
            later = max(c.seq for c in view.certificates if c.decision == "prune")
            for each in (client, replica):
                for mode in ("substring", "regex", "full_text"):
                    found = each.search(session, "req_55Z1", mode=mode, only_out_of_view=True)
                    assert sorted(h.seq for h in found.hits) == [planted, later], mode  # full text ranks
    finally:
        other.stop()
