"""A client holds the last view of each session in each format and sends its token back with
the next render: the service sends what changed, the client puts back the rest, and the view
it returns is the one a client holding nothing gets (contextd_client/_held.py,
api/responses.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from contextd_client import AsyncClient, Client, ContextdError, InvalidArgument, View
from contextd_client._calls import render_view
from contextd_client._held import Held, HeldViews
from contextd_client._types import ViewItem
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from tests.conftest import ServerThread

MakeServer = Callable[..., ServerThread]


def calls(start: int, count: int) -> list[dict[str, Any]]:
    """OpenAI messages: `count` shell calls and their outputs, some read again, some long
    enough to compress, some failing."""
    messages: list[dict[str, Any]] = []
    for call in range(start, start + count):
        path = f"src/m{call % 40}.py"
        output = "".join(f"def f_{call % 40}_{k}(x):\n    return x + {k}\n\n" for k in range(12))
        if call % 7 == 3:
            output = f"Traceback (most recent call last):\nValueError: bad {call}"
        arguments = json.dumps({"command": f"cat {path}"})
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": output})
    return messages


class Seen(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The RenderView requests a client sent and the views that came back, as they came."""

    def __init__(self) -> None:
        self.requests: list[api.RenderViewRequest] = []
        self.views: list[api.View] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = continuation(details, request)
        if details.method.endswith("/RenderView"):
            self.requests.append(request)
            self.views.append(call.result().view)
        return call


def same(held: View, whole: View) -> None:
    assert held.messages_json == whole.messages_json
    assert held.messages == whole.messages
    assert held.items == whole.items
    assert (held.system, held.total_tokens, held.view_version) == (whole.system, whole.total_tokens, whole.view_version)


def test_a_view_held_comes_back_as_what_changed_and_reads_as_the_whole_one(make_server: MakeServer) -> None:
    """Two sessions of the same history, rendered in step: one by a client that holds its views,
    one by a client that holds none. Through appends, a format changed and back, a cache
    breakpoint placed and a pin, each view is the other's, and the holding client was sent
    less than the whole of each view after its first."""
    server = make_server()
    seen, whole_seen = Seen(), Seen()
    with (
        Client(server.target, interceptors=[seen]) as holding,
        Client(server.target, held_views=0, interceptors=[whole_seen]) as whole,
    ):
        sessions = [holding.create_session().id, whole.create_session().id]
        for client, session in zip((holding, whole), sessions, strict=True):
            client.append_openai(session, calls(0, 300))  # 600 items: three blocks of 256
        steps: list[tuple[str, dict[str, Any]]] = [
            ("openai_chat", {}),
            ("openai_chat", {}),
            ("anthropic_messages", {"place_cache_breakpoint": True}),
            ("anthropic_messages", {"place_cache_breakpoint": True}),
            ("openai_chat", {}),
            ("openai_chat", {}),
        ]
        for n, (fmt, options) in enumerate(steps):
            views = [c.render_view(s, fmt, **options) for c, s in zip((holding, whole), sessions, strict=True)]
            same(*views)
            for client, session in zip((holding, whole), sessions, strict=True):
                client.append_openai(session, calls(300 + n, 1))
                if n == 3:
                    client.pin(session, [5])
    assert not any(r.known_view_token for r in whole_seen.requests)
    assert not any(v.shared_messages_bytes or v.shared_items for v in whole_seen.views)
    sent_back = [bool(r.known_view_token) for r in seen.requests]
    assert sent_back == [False, True, False, True, True, True]  # (the first in each format: none held)
    for request, view, whole_view in zip(seen.requests, seen.views, whole_seen.views, strict=True):
        if request.known_view_token:
            assert view.shared_messages_bytes > len(whole_view.messages_json.encode()) // 2
            assert view.shared_items >= 256
            assert len(view.messages_json) < len(whole_view.messages_json) // 2


def test_an_async_client_holds_its_views_too(make_server: MakeServer) -> None:
    server = make_server()

    async def run() -> tuple[list[View], list[View]]:
        async with AsyncClient(server.target) as holding, AsyncClient(server.target, held_views=0) as whole:
            sessions = [(await holding.create_session()).id, (await whole.create_session()).id]
            for client, session in zip((holding, whole), sessions, strict=True):
                await client.append_openai(session, calls(0, 150))
            held, plain = [], []
            for n in range(3):
                held.append(await holding.render_view(sessions[0], "openai_chat"))
                plain.append(await whole.render_view(sessions[1], "openai_chat"))
                for client, session in zip((holding, whole), sessions, strict=True):
                    await client.append_openai(session, calls(150 + n, 1))
            assert holding._held.get(sessions[0], "openai_chat") is not None
            return held, plain

    for held, whole in zip(*asyncio.run(run()), strict=True):
        same(held, whole)


def test_a_token_the_service_did_not_write_is_refused_before_any_render(make_server: MakeServer) -> None:
    server = make_server()
    with Client(server.target) as client, grpc.insecure_channel(server.target) as channel:
        session = client.create_session().id
        client.append_openai(session, calls(0, 3))
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        fmt = api.VIEW_FORMAT_OPENAI_CHAT
        for token in (b"\x01\x01\x00" + b"x" * 15, b"\x01\xff"):
            request = api.RenderViewRequest(session_id=session, format=fmt, known_view_token=token)
            with pytest.raises(grpc.RpcError) as refused:
                stub.RenderView(request)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "known_view_token" in (refused.value.details() or "")
        first = client.render_view(session, "openai_chat")  # (held by the client now)
        assert first.view_version == 1  # the refused ones rendered nothing
        held = client._held.get(session, "openai_chat")
        assert held is not None
        with pytest.raises(grpc.RpcError) as refused:
            stub.RenderView(
                api.RenderViewRequest(session_id=session, format=fmt, known_view_token=held.token, as_stored=True)
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # A token of a view that shares nothing with this one (another session's), or of another
        # version of the service: the view comes whole.
        other = client.create_session().id
        client.append_openai(other, [{"role": "user", "content": "Something else."}])
        for token in (held.token, b"\x07" + held.token[1:]):
            response = stub.RenderView(api.RenderViewRequest(session_id=other, format=fmt, known_view_token=token))
            assert (response.view.shared_messages_bytes, response.view.shared_items) == (0, 0)
            assert json.loads(response.view.messages_json) == [{"role": "user", "content": "Something else."}]
        with pytest.raises(InvalidArgument):
            client.render_view(session, "openai_chat", as_stored=True, budget_tokens=5)


def test_a_view_left_out_beyond_what_the_client_holds_is_an_error_and_the_next_render_comes_whole() -> None:
    views = HeldViews(4)
    views.hold("s", "openai_chat", Held(b"\x01held", b'[{"role":"user","content":"a"}', ()))
    call = render_view("s", "openai_chat", 0, (), None, views=views)
    assert call.request.known_view_token == b"\x01held"
    message = api.View(format=api.VIEW_FORMAT_OPENAI_CHAT, messages_json="]", shared_messages_bytes=500)
    with pytest.raises(ContextdError) as lost:
        call.decode(api.RenderViewResponse(view=message))
    assert lost.value.code == "DATA_LOSS"
    assert views.get("s", "openai_chat") is None
    assert not render_view("s", "openai_chat", 0, (), None, views=views).request.known_view_token


def test_the_views_held_take_no_more_than_their_bytes() -> None:
    views = HeldViews(10, most_bytes=10_000)
    for session in ("a", "b", "c"):
        views.hold(session, "openai_chat", Held(b"\x01" + session.encode(), b"x" * 4_000, ()))
    assert views.get("a", "openai_chat") is None and views.get("c", "openai_chat") is not None
    assert views.bytes <= 10_000
    views.hold("big", "openai_chat", Held(b"\x01big", b"x" * 20_000, ()))  # larger than all: not held
    assert views.get("big", "openai_chat") is None and views.get("b", "openai_chat") is not None
    views.hold("b", "openai_chat", Held(b"\x01b2", b"x" * 10, ()))  # held again: counted once
    views.forget("b", "anthropic_messages")
    assert views.get("b", "openai_chat") is not None
    views.forget("b")
    views.forget("c")
    assert views.bytes == 0


def test_the_views_held_are_the_most_recently_used_pairs() -> None:
    views = HeldViews(2)
    item = ViewItem(1, "full", 3, 0, "")
    for session in ("a", "b", "c"):
        views.hold(session, "openai_chat", Held(b"\x01" + session.encode(), b"[]", (item,)))
    assert views.get("a", "openai_chat") is None
    assert views.get("b", "openai_chat") is not None  # (now the most recent: c goes next)
    views.hold("d", "openai_chat", Held(b"\x01d", b"[]", ()))
    assert views.get("c", "openai_chat") is None and views.get("b", "openai_chat") is not None
    views.forget("b")
    assert views.get("b", "openai_chat") is None
    HeldViews(0).hold("a", "openai_chat", Held(b"\x01a", b"[]", ()))  # holding nothing: no error
    nothing = HeldViews(4)
    nothing.hold("a", "openai_chat", Held(b"", b"[]", ()))  # a view with no token (as stored) is not held
    assert nothing.get("a", "openai_chat") is None
