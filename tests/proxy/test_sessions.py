"""How the proxy keeps a session equal to the conversation an SDK resends: retries, edits by
the agent, another proxy (or a restart), no header; and what it leaves alone."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest

from contextd.proxy import app as app_module
from contextd.proxy.app import API_KEY_HEADER, BUDGET_HEADER, SESSION_HEADER, VIEW_VERSION_HEADER
from contextd.proxy.dialects import OpenAIChat
from contextd.proxy.ledger import IDS, chains
from contextd.proxy.sse import Events
from contextd_client import Client, ViewFormat
from contextd_lab.stub_upstream import Upstream
from tests.conftest import ServerThread
from tests.proxy.test_proxy import CHAT_TOOLS, SYSTEM, TASK, run_tests, settled

DIALECT = OpenAIChat()


@pytest.fixture
def stub(upstream: tuple[Upstream, str]) -> Upstream:
    return upstream[0]


@pytest.fixture
def proxy(contextd: ServerThread, make_proxy: Callable[..., str]) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as http:
        yield http


@pytest.fixture
def client(contextd: ServerThread) -> Iterator[Client]:
    with Client(contextd.target) as c:
        yield c


def call(http: httpx2.Client, messages: list[Any], session: str | None = None, **headers: str) -> httpx2.Response:
    if session is not None:
        headers[SESSION_HEADER] = session
    body = {"model": "gpt-4o", "messages": messages, "tools": CHAT_TOOLS}
    answer = http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-test", **headers})
    assert answer.status_code == 200, answer.text
    return answer


def reply_of(answer: httpx2.Response) -> dict[str, Any]:
    message: dict[str, Any] = answer.json()["choices"][0]["message"]
    return message


def turn(http: httpx2.Client, messages: list[Any], session: str | None = None) -> httpx2.Response:
    """One model call and, when it asks for a tool, the tool's result: `messages` grows as an
    agent's would."""
    answer = call(http, messages, session)
    message = reply_of(answer)
    messages.append(message)
    for tool_call in message.get("tool_calls") or []:
        output = run_tests(json.loads(tool_call["function"]["arguments"])["command"])
        messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": output})
    return answer


def held(client: Client, session: str) -> list[str]:
    """The chains of the session's live conversation, under the caller's tool call ids."""
    stored = client.render_view(session, ViewFormat.OPENAI_CHAT, as_stored=True)
    if not stored.items:
        return []
    last = client.explain_item(session, max(i.seq for i in stored.items if i.representation != "omitted")).item
    callers = {v: k for k, v in json.loads(last.metadata.get(IDS) or "{}").items()}
    text = json.dumps(stored.messages)
    for renamed, given in callers.items():
        text = text.replace(json.dumps(renamed), json.dumps(given))
    return chains(DIALECT.split({"messages": json.loads(text)}).items)


def chains_of(messages: list[Any]) -> list[str]:
    return chains(DIALECT.split({"messages": messages}).items)


def retracted(client: Client, session: str) -> list[int]:
    return sorted(c.seq for c in client.list_certificates(session) if c.rule == "retraction")


def opening() -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{TASK} ({uuid.uuid4().hex})"}]


def test_a_retried_request_writes_nothing_twice_and_the_answer_it_lost_leaves_the_views(
    proxy: httpx2.Client, client: Client
) -> None:
    session, messages = f"retry-{uuid.uuid4().hex[:8]}", opening()
    turn(proxy, messages, session)
    asked = messages[:]
    first = turn(proxy, messages, session)  # the session holds all but the lead and the last tool result
    settled(lambda: client.get_session(session).version == len(messages) - 2)

    again = call(proxy, asked, session)  # the caller never got `first`: it asks again

    settled(lambda: client.get_session(session).version == len(messages) - 1)
    lost = client.get_session(session).version - 1  # the seq of the first answer
    assert retracted(client, session) == [lost]
    assert held(client, session) == chains_of([*asked[1:], reply_of(again)])
    assert int(again.headers[VIEW_VERSION_HEADER]) > int(first.headers[VIEW_VERSION_HEADER])


def test_an_agent_that_edits_its_history_gets_views_of_the_edited_one(
    proxy: httpx2.Client, client: Client, stub: Upstream
) -> None:
    session, messages = f"edit-{uuid.uuid4().hex[:8]}", opening()
    for _ in range(3):
        turn(proxy, messages, session)
    settled(lambda: len(held(client, session)) == len(messages) - 2)
    before = client.get_session(session).version
    # The agent compacts: the first tool round becomes a note of its own.
    edited = [*messages[:2], {"role": "user", "content": "Note: run_tests 0 showed test_case_700 failing."}]
    edited += messages[4:]

    call(proxy, edited, session)

    assert held(client, session)[: len(edited) - 1] == chains_of(edited[1:])
    assert len(retracted(client, session)) == before - 1  # all but the task, whose chain is unchanged
    sent = stub.received[-1].body["messages"]
    assert sent[2] == edited[2]
    assert all("run_tests 0" not in json.dumps(m) for m in sent if m["role"] != "user")
    # The calls sent again are stored under new ids (the session used theirs), results paired.
    calls = [c["id"] for m in sent for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert answered == calls[: len(answered)] and len(answered) == 2
    assert all(c not in json.dumps(messages) for c in calls)


def test_another_proxy_continues_a_session_reading_only_its_last_item(
    contextd: ServerThread, make_proxy: Callable[..., str], client: Client
) -> None:
    session, messages = f"restart-{uuid.uuid4().hex[:8]}", opening()
    with httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as first:
        turn(first, messages, session)
        turn(first, messages, session)
    settled(lambda: client.get_session(session).version == len(messages) - 2)
    version = client.get_session(session).version

    with httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as second:
        turn(second, messages, session)

    settled(lambda: client.get_session(session).version == version + 2)
    assert held(client, session) == chains_of(messages[1:-1])
    assert retracted(client, session) == []


def test_without_a_header_a_conversation_finds_its_session_by_its_opening(proxy: httpx2.Client, client: Client) -> None:
    messages = opening()
    first = turn(proxy, messages)
    second = turn(proxy, messages)
    other = call(proxy, opening())

    session = first.headers[SESSION_HEADER]
    assert session.startswith("proxy-") and second.headers[SESSION_HEADER] == session
    assert other.headers[SESSION_HEADER] != session
    settled(lambda: held(client, session) == chains_of(messages[1:-1]))
    # A changed system prompt is another agent's conversation.
    changed = [{"role": "system", "content": "Another agent."}, *messages[1:2]]
    assert call(proxy, changed).headers[SESSION_HEADER] != session


def test_the_budget_header_bounds_the_view(proxy: httpx2.Client, client: Client) -> None:
    session, messages = f"budget-{uuid.uuid4().hex[:8]}", opening()
    turn(proxy, messages, session)
    call(proxy, messages, session, **{BUDGET_HEADER: "3000"})
    assert client.get_status(session).budget_tokens == 3000


def test_a_view_the_provider_refuses_goes_again_as_the_caller_sent_it(proxy: httpx2.Client, stub: Upstream) -> None:
    session, messages = f"refused-{uuid.uuid4().hex[:8]}", opening()
    turn(proxy, messages, session)
    turn(proxy, messages, session)
    stub.reject = lambda body: "[contextd:" in json.dumps(body)  # refuses what contextd compressed
    count = len(stub.received)

    answer = call(proxy, messages, session)

    assert VIEW_VERSION_HEADER not in answer.headers
    assert len(stub.received) == count + 2  # the view, refused; then the caller's request
    assert stub.received[-1].body["messages"] == messages


def test_requests_the_proxy_does_not_view_go_upstream_as_they_came(proxy: httpx2.Client, stub: Upstream) -> None:
    models = proxy.get("/v1/models", headers={"authorization": "Bearer sk-test"})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "stub"
    held_upstream = {"model": "gpt-4.1", "input": [{"role": "user", "content": "Go on."}], "previous_response_id": "r1"}
    raw = json.dumps(held_upstream, separators=(",", ":")).encode()
    answer = proxy.post("/v1/responses", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and VIEW_VERSION_HEADER not in answer.headers
    assert stub.received[-1].raw == raw  # byte for byte


def test_each_outcome_is_counted(
    contextd: ServerThread, make_proxy: Callable[..., str], stub: Upstream, snapshot: Any
) -> None:
    before = snapshot("contextd.proxy")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{unused.getsockname()[1]}"
    with (
        httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as up,
        httpx2.Client(base_url=make_proxy(nowhere, timeout=2.0, backoff=60.0), timeout=30) as down,
    ):
        messages, session = opening(), "counted-" + uuid.uuid4().hex[:8]
        turn(up, messages, session)  # viewed
        turn(up, messages, session)  # viewed
        call(down, opening())  # failed
        call(down, opening())  # bypassed: contextd failed a moment ago
        stub.reject = lambda body: "[contextd:" in json.dumps(body)
        call(up, messages, session)  # view_rejected
        stub.reject = None
        held_upstream = {"model": "gpt-4.1", "input": "Go on.", "previous_response_id": "r1"}
        assert up.post("/v1/responses", json=held_upstream).status_code == 200  # unsupported
        up.get("/v1/models")  # not a conversation: not counted
    after = snapshot("contextd.proxy")

    def counted(outcome: str) -> float:
        where = {"contextd.proxy.outcome": outcome}
        return after.total("contextd.proxy.requests", **where) - before.total("contextd.proxy.requests", **where)

    assert {o: counted(o) for o in ("viewed", "failed", "bypassed", "view_rejected", "unsupported")} == {
        "viewed": 2,
        "failed": 1,
        "bypassed": 1,
        "view_rejected": 1,
        "unsupported": 1,
    }
    assert after.total("contextd.proxy.added.duration") - before.total("contextd.proxy.added.duration") == 3


@pytest.mark.parametrize("asked", [False, True])
def test_a_stream_is_relayed_event_by_event_with_the_usage_only_when_the_caller_asked(
    proxy: httpx2.Client, stub: Upstream, asked: bool
) -> None:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": opening()[1:], "tools": CHAT_TOOLS, "stream": True}
    if asked:
        body["stream_options"] = {"include_usage": True}
    headers = {SESSION_HEADER: f"stream-{uuid.uuid4().hex[:8]}"}
    with proxy.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
        relayed = b"".join(answer.iter_bytes())
    events = relayed.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]  # the end, as the provider sent it
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [bool(c.get("usage")) for c in chunks].count(True) == (1 if asked else 0)
    assert stub.received[-1].body["stream_options"] == {"include_usage": True}


def test_the_proxys_own_headers_never_reach_the_provider(proxy: httpx2.Client, stub: Upstream) -> None:
    call(proxy, opening(), f"own-{uuid.uuid4().hex[:8]}", **{BUDGET_HEADER: "9000", "x-contextd-api-key": ""})
    sent = stub.received[-1].headers
    assert not [h for h in sent if h.startswith("x-contextd-")] and sent["authorization"] == "Bearer sk-test"


def test_a_bad_session_id_fails_its_own_request_only(proxy: httpx2.Client) -> None:
    refused = call(proxy, opening(), "not a valid id!")
    assert VIEW_VERSION_HEADER not in refused.headers  # sent unchanged
    viewed = call(proxy, opening(), f"fine-{uuid.uuid4().hex[:8]}")
    assert VIEW_VERSION_HEADER in viewed.headers  # no backoff for the others


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 4096])
def test_events_come_whole_with_their_own_bytes_however_the_stream_is_cut(size: int) -> None:
    stream = (
        b'data: {"a": 1}\n\n'
        b"event: message_start\r\ndata: one\r\ndata: two\r\n\r\n"
        b": a comment\n\n"
        b"data:no space\r\rdata: [DONE]\n\n"
        b"data: cut sh"
    )
    events = Events()
    seen = [e for at in range(0, len(stream), size) for e in events.feed(stream[at : at + size])]
    assert [(e.name, e.data) for e in seen] == [
        ("", '{"a": 1}'),
        ("message_start", "one\ntwo"),
        ("", ""),
        ("", "no space"),
        ("", "[DONE]"),
    ]
    assert b"".join(e.raw for e in seen) + events.rest == stream


def test_an_agent_that_clears_an_old_tool_output_gets_views_of_the_cleared_one(
    proxy: httpx2.Client, client: Client, stub: Upstream
) -> None:
    session, messages = f"cleared-{uuid.uuid4().hex[:8]}", opening()
    for _ in range(2):
        turn(proxy, messages, session)
    settled(lambda: len(held(client, session)) == len(messages) - 2)
    # Context editing: the first tool output cleared, its call kept.
    cleared = [*messages[:3], {**messages[3], "content": "[output cleared]"}, *messages[4:]]

    answers = [call(proxy, cleared, session) for _ in range(2)]  # and again: no session left behind

    assert all(VIEW_VERSION_HEADER in a.headers for a in answers)
    sent = stub.received[-1].body["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    assert results[0] == "[output cleared]" and "retracted" not in json.dumps(sent)
    calls = [c["id"] for m in sent for c in m.get("tool_calls") or []]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == calls
    assert held(client, session)[: len(cleared) - 1] == chains_of(cleared[1:])


def test_cookies_an_upstream_sets_reach_their_caller_one_by_one_and_no_other_caller(
    proxy: httpx2.Client, stub: Upstream
) -> None:
    stub.cookies = ("gateway=tenant-a-secret; Path=/", "__cf_bm=abc; Path=/")
    answer = call(proxy, opening(), f"cookie-{uuid.uuid4().hex[:8]}")
    assert answer.headers.get_list("set-cookie") == list(stub.cookies)
    stub.cookies = ()
    with httpx2.Client(base_url=str(proxy.base_url), timeout=30) as other:  # another caller, no cookies
        call(other, opening(), f"cookie-{uuid.uuid4().hex[:8]}", authorization="Bearer sk-tenant-b")
    assert "cookie" not in stub.received[-1].headers


def test_a_client_put_out_of_the_cache_finishes_the_calls_under_way(
    proxy: httpx2.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "_CLIENTS", 1)  # each new contextd key evicts the last one
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda n: call(proxy, opening(), f"evict-{n}-{uuid.uuid4().hex[:6]}", **{API_KEY_HEADER: f"k{n}"}),
                range(16),
            )
        )
    assert all(a.status_code == 200 for a in answers)


def test_a_retraction_by_another_replica_is_seen_by_the_count_of_what_the_view_may_show(
    contextd: ServerThread, make_proxy: Callable[..., str], client: Client, stub: Upstream
) -> None:
    session, messages = f"replicas-{uuid.uuid4().hex[:8]}", opening()
    with (
        httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as a,
        httpx2.Client(base_url=make_proxy(contextd.target), timeout=30) as b,
    ):
        turn(a, messages, session)
        turn(a, messages, session)
        settled(lambda: client.get_session(session).version == len(messages) - 2)
        # A late duplicate of the first request reaches the other replica, which retracts all
        # after it; its answer is never recorded (the provider refuses it), so nothing is
        # appended and the session's version stays what replica a last saw.
        stub.reject = lambda body: True
        body = {"model": "gpt-4o", "messages": messages[:2], "tools": CHAT_TOOLS}
        assert b.post("/v1/chat/completions", json=body, headers={SESSION_HEADER: session}).status_code == 400
        stub.reject = None
        assert retracted(client, session)

        answer = turn(a, messages, session)

    assert VIEW_VERSION_HEADER in answer.headers
    sent, asked = stub.received[-1].body["messages"], messages[:-2]  # (the answer and its tool result came after)
    assert [m["role"] for m in sent] == [m["role"] for m in asked]  # all the caller sent: nothing lost
    assert [m.get("content") for m in sent[:2]] == [m["content"] for m in asked[:2]]
    assert [m.get("tool_call_id") is not None for m in sent] == [m["role"] == "tool" for m in asked]
