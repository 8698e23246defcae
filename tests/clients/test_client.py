"""The thin client against a real server: retries that reuse the
idempotency key when an answer is lost, deadlines, errors, both flavours."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from contextd_client import (
    NO_RETRY,
    AlreadyExists,
    AsyncClient,
    Client,
    ContextdError,
    DeadlineExceeded,
    NotFound,
    RetryPolicy,
    Unavailable,
    ViewFormat,
)
from tests.conftest import ServerThread

MakeServer = Callable[..., ServerThread]
FAST_RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.05)


class LoseAnswers(grpc.aio.ServerInterceptor):
    """Runs each call for real, then reports UNAVAILABLE instead of the answer,
    the first `times` times a given request arrives: a reply lost on the wire
    after the work was committed."""

    def __init__(self, methods: set[str], times: int, delay: float = 0, late: bool = False) -> None:
        """With `late`, the first `times` answers arrive after `delay` instead of being lost:
        the work goes on to its commit though the caller gives up waiting (a deadline cancels
        the handler, not the work), and the same request sent again is let in only once the
        first has committed, as a retry after a late answer on the wire would arrive."""
        self.methods, self.times, self.delay, self.late = methods, times, delay, late
        self.seen: Counter[tuple[str, str]] = Counter()
        self.committed: dict[tuple[str, str], asyncio.Event] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        name = details.method.rsplit("/", 1)[-1]
        if handler is None or handler.unary_unary is None or name not in self.methods:
            return handler
        inner = handler.unary_unary

        async def lossy(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            # Interceptors outside contextd's own see each request as its bytes.
            key = (name, hashlib.sha256(request).hexdigest())
            self.seen[key] += 1
            if self.delay and not self.late:
                await asyncio.sleep(self.delay)
            if not self.late:
                response = await inner(request, context)
            else:
                committed = self.committed.setdefault(key, asyncio.Event())
                if self.seen[key] > 1:
                    await committed.wait()
                work = asyncio.ensure_future(inner(request, context))
                work.add_done_callback(lambda _: committed.set())
                response = await asyncio.shield(work)
            if self.seen[key] <= self.times:
                if self.late:
                    await asyncio.sleep(self.delay)  # committed, but the caller has given up waiting
                else:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (injected by the test)")
            return response

        return grpc.unary_unary_rpc_method_handler(
            lossy, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
]


def test_lost_answers_are_retried_with_the_same_key_and_written_once(make_server: MakeServer) -> None:
    lossy = LoseAnswers({"CreateSession", "AppendItems", "DeleteSession"}, times=2)
    server = make_server(interceptors=[lossy])
    with Client(server.target, retry=FAST_RETRY) as client:
        session = client.create_session()
        assert session.version == 0
        result = client.append_openai(session.id, CONVERSATION)
        assert result.replayed and (result.first_seq, result.last_seq) == (1, 4)
        assert client.get_session(session.id).version == 4
        assert client.render_openai(session.id) == CONVERSATION
        assert client.delete_session(session.id) == 0  # the first, lost, try deleted the 4 items
        with pytest.raises(NotFound):
            client.get_session(session.id)
    # The append was answered from its stored result on the third try; the
    # create and delete found their own first try's effect on the second.
    assert {name: count for (name, _), count in lossy.seen.items()} == {
        "CreateSession": 2,
        "AppendItems": 3,
        "DeleteSession": 2,
    }


def test_a_caller_chosen_id_whose_creation_answer_was_lost_is_reported(make_server: MakeServer) -> None:
    # Someone else may own that id: the client cannot tell, so it says so.
    server = make_server(interceptors=[LoseAnswers({"CreateSession"}, times=1)])
    with Client(server.target, retry=FAST_RETRY) as client:
        with pytest.raises(AlreadyExists):
            client.create_session("chosen")
        assert client.get_session("chosen").id == "chosen"


def test_an_append_answered_after_the_deadline_is_retried_and_written_once(make_server: MakeServer) -> None:
    late = LoseAnswers({"AppendItems"}, times=1, delay=1.0, late=True)
    server = make_server(interceptors=[late])
    # Only the append has the short deadline (a loaded machine may take longer for the others).
    with Client(server.target) as plain, Client(server.target, timeout=0.4, retry=FAST_RETRY) as client:
        session_id = plain.create_session().id
        result = client.append_openai(session_id, CONVERSATION[:2])
        assert result.replayed and plain.get_session(session_id).version == 2


def test_a_failed_append_tells_the_key_that_makes_retrying_safe(make_server: MakeServer) -> None:
    late = LoseAnswers({"AppendItems"}, times=1, delay=1.0, late=True)
    server = make_server(interceptors=[late])
    with Client(server.target) as plain, Client(server.target, timeout=0.4, retry=NO_RETRY) as client:
        session_id = plain.create_session().id
        with pytest.raises(DeadlineExceeded) as timed_out:
            client.append_openai(session_id, CONVERSATION[:2])
        key = timed_out.value.idempotency_key
        assert key
        again = plain.append_openai(session_id, CONVERSATION[:2], idempotency_key=key)
        assert again.replayed and plain.get_session(session_id).version == 2


def test_retries_give_up_after_the_policy_allows(make_server: MakeServer) -> None:
    lossy = LoseAnswers({"GetSession"}, times=100)
    server = make_server(interceptors=[lossy])
    with Client(server.target, retry=RetryPolicy(max_attempts=3, initial_backoff=0.01)) as client:
        sid = client.create_session().id
        with pytest.raises(Unavailable) as gave_up:
            client.get_session(sid)
    assert "injected" in gave_up.value.message
    assert sum(lossy.seen.values()) == 3
    with Client(server.target, retry=NO_RETRY) as client, pytest.raises(Unavailable):
        client.get_session(sid)


def test_calls_have_a_deadline(make_server: MakeServer) -> None:
    server = make_server(interceptors=[LoseAnswers({"ListSessions"}, times=0, delay=2)])
    with Client(server.target, timeout=0.3, retry=NO_RETRY) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            list(client.list_sessions())
        assert time.monotonic() - started < 1.5


def test_a_server_that_is_not_there_is_unavailable_after_retries() -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.01)
    with Client("127.0.0.1:1", timeout=1, retry=retry) as client, pytest.raises(Unavailable):
        client.create_session()


async def test_the_async_client_does_everything_the_sync_one_does(make_server: MakeServer) -> None:
    lossy = LoseAnswers({"AppendItems"}, times=1)
    server = make_server(interceptors=[lossy])
    async with AsyncClient(server.target, retry=FAST_RETRY) as client:
        session = await client.create_session(metadata={"flavour": "async"})
        result = await client.append_anthropic(
            session.id,
            [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
            system="Be kind.",
        )
        assert result.replayed and result.version == 3
        assert await client.render_anthropic(session.id, place_cache_breakpoint=False) == {
            "system": "Be kind.",
            "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
        }
        marked = await client.render_anthropic(session.id)  # the view's breakpoint, at its end here
        assert marked["messages"][-1]["content"] == [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
        ]
        view = await client.render_view(session.id, ViewFormat.OPENAI_CHAT)
        assert view.messages[0] == {"role": "system", "content": "Be kind."}
        assert [s.id async for s in client.list_sessions(page_size=1)] == [session.id]
        assert await client.delete_session(session.id) == 3
        with pytest.raises(NotFound):
            await client.get_session(session.id)


class RateLimit(grpc.aio.ServerInterceptor):
    """Refuses the first `times` calls of `method` with RESOURCE_EXHAUSTED, as a
    per-tenant rate limit does, with a retry-after hint when `hint`."""

    def __init__(self, method: str, times: int, hint: bool, retry_after_ms: int = 300) -> None:
        self.method, self.times, self.hint, self.retry_after_ms = method, times, hint, retry_after_ms
        self.refused = 0

    def _trailers(self) -> tuple[tuple[str, str | bytes], ...]:
        trailers: list[tuple[str, str | bytes]] = [("contextd-reason", "RATE_LIMITED")]
        if self.hint:
            trailers.append(("contextd-retry-after-ms", str(self.retry_after_ms)))
        return tuple(trailers)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or not details.method.endswith("/" + self.method):
            return handler
        inner = handler.unary_unary

        async def limited(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if self.refused < self.times:
                self.refused += 1
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited", self._trailers())
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            limited, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


async def test_a_rate_limited_call_waits_as_told_and_succeeds(make_server: MakeServer) -> None:
    limit = RateLimit("GetSession", times=2, hint=True)
    server = make_server(interceptors=[limit])
    with Client(server.target) as client:
        session_id = client.create_session().id
        started = time.monotonic()
        assert client.get_session(session_id).id == session_id
        assert time.monotonic() - started >= 0.6  # two waits of the hinted 300 ms, at least
    limit.refused = 0
    async with AsyncClient(server.target) as aclient:
        started = time.monotonic()
        assert (await aclient.get_session(session_id)).id == session_id
        assert time.monotonic() - started >= 0.6
    assert limit.refused == 2


async def test_resource_exhausted_without_a_hint_is_not_retried(make_server: MakeServer) -> None:
    limit = RateLimit("GetSession", times=100, hint=False)
    server = make_server(interceptors=[limit])
    with Client(server.target) as client:
        session_id = client.create_session().id
        with pytest.raises(ContextdError) as refused:
            client.get_session(session_id)
    async with AsyncClient(server.target) as aclient:
        with pytest.raises(ContextdError) as arefused:
            await aclient.get_session(session_id)
    assert refused.value.code == arefused.value.code == "RESOURCE_EXHAUSTED"
    assert refused.value.reason == "RATE_LIMITED"
    assert limit.refused == 2  # one try each
