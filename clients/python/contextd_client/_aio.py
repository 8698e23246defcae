"""The asyncio client: the same operations as `Client`, awaited."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc

from contextd_client._calls import Call, Tries
from contextd_client._calls import append_items as _append_items
from contextd_client._calls import create_session as _create_session
from contextd_client._calls import delete_session as _delete_session
from contextd_client._calls import explain_item as _explain_item
from contextd_client._calls import get_session as _get_session
from contextd_client._calls import get_status as _get_status
from contextd_client._calls import list_certificates as _list_certificates
from contextd_client._calls import list_sessions as _list_sessions
from contextd_client._calls import pin as _pin
from contextd_client._calls import propose_prune as _propose_prune
from contextd_client._calls import render_view as _render_view
from contextd_client._calls import report_usage as _report_usage
from contextd_client._calls import retract as _retract
from contextd_client._calls import retrieve as _retrieve
from contextd_client._calls import search as _search
from contextd_client._calls import update_session as _update_session
from contextd_client._channel import ChannelConfig, channel_targets
from contextd_client._held import HeldViews
from contextd_client._retry import RetryPolicy
from contextd_client._types import (
    AppendResult,
    Certificate,
    Explanation,
    PruneOutcome,
    Retraction,
    Retrieved,
    SearchResults,
    Session,
    Status,
    Usage,
    View,
    ViewFormat,
)
from contextd_client._watch import AsyncWatch, WatchProgress
from contextd_client.formats import items_from_anthropic, items_from_converse, items_from_openai, items_from_responses
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc

T = TypeVar("T")


class AsyncClient:
    """An asyncio connection to contextd; see `Client` for the behaviour of each call.

    The channels open on first use, inside the running event loop.
    """

    def __init__(
        self,
        target: str | Sequence[str] = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[Any] = (),
        held_views: int = 64,
        held_view_bytes: int = 64 << 20,
    ) -> None:
        targets = channel_targets(target)
        self._held = HeldViews(held_views, held_view_bytes)
        self._config = ChannelConfig(
            targets, api_key, timeout, retry or RetryPolicy(), credentials, tuple(options), tuple(interceptors)
        )
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[contextd_pb2_grpc.ContextServiceAsyncStub] = []
        self._turns = itertools.count()

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], []
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
    ) -> None:
        await self.close()

    async def create_session(
        self, session_id: str | None = None, *, metadata: Mapping[str, str] | None = None, policy: str = ""
    ) -> Session:
        return await self._run(_create_session(session_id, metadata, policy))

    async def update_session(self, session_id: str, *, policy: str | None = None) -> Session:
        return await self._run(_update_session(session_id, policy))

    async def get_session(self, session_id: str) -> Session:
        return await self._run(_get_session(session_id))

    async def list_sessions(self, *, page_size: int = 100) -> AsyncIterator[Session]:
        token = ""
        while True:
            sessions, token = await self._run(_list_sessions(page_size, token))
            for session in sessions:
                yield session
            if not token:
                return

    async def delete_session(self, session_id: str) -> int:
        deleted = await self._run(_delete_session(session_id))
        self._held.forget(session_id)
        return deleted

    async def append_items(
        self,
        session_id: str,
        items: Sequence[pb.Item],
        *,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        author: str = "",
    ) -> AppendResult:
        return await self._run(_append_items(session_id, items, idempotency_key, expected_version, author))

    async def append_openai(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> AppendResult:
        return await self.append_items(session_id, items_from_openai(messages), **kwargs)

    async def append_anthropic(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AppendResult:
        return await self.append_items(session_id, items_from_anthropic(messages, system), **kwargs)

    async def append_responses(
        self, session_id: str, items: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> AppendResult:
        return await self.append_items(session_id, items_from_responses(items), **kwargs)

    async def append_converse(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        system: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AppendResult:
        return await self.append_items(session_id, items_from_converse(messages, system), **kwargs)

    async def render_view(
        self,
        session_id: str,
        format: ViewFormat | str,
        *,
        budget_tokens: int = 0,
        focus: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
        place_cache_breakpoint: bool = False,
        as_stored: bool = False,
    ) -> View:
        call = _render_view(
            session_id, format, budget_tokens, focus, tools, place_cache_breakpoint, as_stored, self._held
        )
        return await self._run(call)

    async def render_openai(self, session_id: str, *, budget_tokens: int = 0) -> list[dict[str, Any]]:
        return (await self.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=budget_tokens)).messages

    async def render_anthropic(
        self, session_id: str, *, budget_tokens: int = 0, place_cache_breakpoint: bool = True
    ) -> dict[str, Any]:
        view = await self.render_view(
            session_id,
            ViewFormat.ANTHROPIC_MESSAGES,
            budget_tokens=budget_tokens,
            place_cache_breakpoint=place_cache_breakpoint,
        )
        return view.anthropic_kwargs()

    async def render_responses(self, session_id: str, *, budget_tokens: int = 0) -> list[dict[str, Any]]:
        view = await self.render_view(session_id, ViewFormat.OPENAI_RESPONSES, budget_tokens=budget_tokens)
        return view.messages

    async def render_converse(self, session_id: str, *, budget_tokens: int = 0) -> dict[str, Any]:
        view = await self.render_view(session_id, ViewFormat.BEDROCK_CONVERSE, budget_tokens=budget_tokens)
        return view.converse_kwargs()

    # ------------------------------------------------------------ controls

    async def pin(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Pin items: never pruned, and shown in full again if they were."""
        return await self._run(_pin(session_id, seqs, pinning=True))

    async def unpin(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        return await self._run(_pin(session_id, seqs, pinning=False))

    async def propose_prune(self, session_id: str, seqs: Sequence[int], reason: str = "") -> list[PruneOutcome]:
        """Ask for items to be pruned (protected ones are refused); applied at a cache-safe point."""
        return await self._run(_propose_prune(session_id, seqs, reason))

    async def retract(
        self, session_id: str, seqs: Sequence[int], *, reason: str = "", redact: bool = False
    ) -> Retraction:
        """Withdraw items from every later view (a framework's "pop" or "redact"); each gets a
        certificate, and the history keeps them. With `redact`, their content is never returned
        again (Retrieve answers ITEM_REDACTED). Returns what this call retracted, certificates included."""
        return await self._run(_retract(session_id, seqs, reason, redact))

    async def list_certificates(
        self,
        session_id: str,
        *,
        decision: str | None = None,
        level: int | None = None,
        seq: int | None = None,
        view_version: int | None = None,
        view_format: ViewFormat | str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Certificate]:
        """The session's certificates, oldest first, optionally filtered, a page at a time."""
        token = ""
        while True:
            call = _list_certificates(
                session_id,
                page_size,
                token,
                decision=decision,
                level=level,
                seq=seq,
                view_version=view_version,
                view_format=view_format,
            )
            page, token = await self._run(call)
            for certificate in page:
                yield certificate
            if not token:
                return

    async def explain_item(self, session_id: str, seq: int) -> Explanation:
        """How item `seq` is shown now, whether it is pinned or protected, and its certificates."""
        return await self._run(_explain_item(session_id, seq))

    async def report_usage(self, session_id: str, view_version: int, usage: Usage) -> bool:
        """Record what the provider billed for the call made with view `view_version`
        (``Usage.from_anthropic(response.usage)``, ``Usage.from_openai(...)``); GetStatus then
        shows it beside what contextd predicted. True when the same was reported before."""
        return await self._run(_report_usage(session_id, view_version, usage))

    async def get_status(self, session_id: str) -> Status:
        """Where the session stands: its size, its latest view, what is out of the view and why."""
        return await self._run(_get_status(session_id))

    async def search(self, session_id: str, query: str, **options: Any) -> SearchResults:
        """Items of the session matching `query`: ``mode`` ("full_text", "substring" or "regex"),
        ``tools``, ``roles``, ``min_seq``/``max_seq``, ``only_out_of_view``, ``page_size`` (the
        server caps it), ``page_token`` (from the previous page)."""
        return await self._run(_search(session_id, query, **options))

    async def retrieve(self, session_id: str, handle: str = "", *, seq: int = 0, **paging: Any) -> Retrieved:
        """A page of the original behind `handle` (or item `seq`): ``page_unit`` ("tokens" or
        "lines"), ``offset``, ``page_size`` (the server caps it), ``line_start``/``line_end``
        (1-based, inclusive), ``grep`` (a regular expression) with ``context_lines``."""
        return await self._run(_retrieve(session_id, handle=handle, seq=seq, **paging))

    def watch_session(self, session_id: str = "", *, cursor: str = "", heartbeats: bool = False) -> AsyncWatch:
        """See `Client.watch_session`; iterate the result with ``async for``."""
        turns = itertools.count(next(self._turns))

        def open_stream(request: api.WatchSessionRequest) -> Any:
            stubs = self._opened()
            return stubs[next(turns) % len(stubs)].WatchSession(request, metadata=self._config.metadata)

        progress = WatchProgress(session_id, cursor, self._config.retry, heartbeats, time.monotonic)
        return AsyncWatch(open_stream, progress)

    def _opened(self) -> list[contextd_pb2_grpc.ContextServiceAsyncStub]:
        """The stubs, their channels opened on first use (inside the running loop)."""
        if not self._stubs:
            self._channels = self._config.aio_channels()
            self._stubs = [contextd_pb2_grpc.ContextServiceStub(c) for c in self._channels]
        return self._stubs

    async def _run(self, call: Call[T]) -> T:
        stubs, turn = self._opened(), next(self._turns)
        tries = Tries(call, self._config.retry, self._config.timeout)
        while True:
            timeout = tries.begin()
            # With several channels, a retry goes to the next but after a deadline (Tries.channel).
            method = getattr(stubs[tries.channel(turn, len(stubs))], call.method)
            try:
                response = await method(call.request, timeout=timeout, metadata=self._config.metadata)
                return call.decode(response)
            except grpc.RpcError as error:
                outcome = tries.failed(error)
                if outcome.settled:
                    return await self._run(call.settle) if call.settle is not None else cast(T, call.settle_value)
                if outcome.error is not None:
                    raise outcome.error from None
                assert outcome.delay is not None
                await asyncio.sleep(outcome.delay)
