"""The synchronous client."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
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
from contextd_client._watch import Watch, WatchProgress
from contextd_client.formats import items_from_anthropic, items_from_converse, items_from_openai, items_from_responses
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc

T = TypeVar("T")


class Client:
    """A connection to contextd. Thread-safe; create one per process and reuse it.

    `target` is one "host:port", any gRPC target URI (``dns:///contextd.internal:50051``
    balances over every address the name resolves to), or a sequence of them for
    several replicas; calls are spread round robin and a replica that is down is
    skipped. Every try has a deadline (`timeout`, in seconds); a call the service
    could not take is retried per `retry`, by default for up to 30 s. Appends
    reuse their idempotency key on every try, so a retry never writes twice.
    `interceptors` (gRPC client interceptors) see every call; with OpenTelemetry
    installed beside the client, each call carries the caller's trace context, so
    an agent's trace continues into the service. The client holds the last view of each
    session in each format, for the `held_views` (session, format) pairs rendered most
    recently, as long as they take no more than `held_view_bytes` together: the next render of
    one comes as only what changed, and the client puts the rest back (a view of a long session
    is megabytes, most of them the last view's); `held_views=0`: every view comes whole.
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
        self._channels = self._config.channels()
        self._stubs = [contextd_pb2_grpc.ContextServiceStub(c) for c in self._channels]
        self._turns = itertools.count()  # next() on it is atomic: safe across threads

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    # ------------------------------------------------------------ sessions

    def create_session(
        self, session_id: str | None = None, *, metadata: Mapping[str, str] | None = None, policy: str = ""
    ) -> Session:
        """Create a session; the id is random unless given.

        With a random id a retry after a lost answer returns the session its
        first try created. A chosen id may belong to someone else, so there a
        lost answer surfaces as AlreadyExists: fetch it with `get_session`.
        """
        return self._run(_create_session(session_id, metadata, policy))

    def update_session(self, session_id: str, *, policy: str | None = None) -> Session:
        """Change the session's policy (a JSON or YAML document; "" for the default)."""
        return self._run(_update_session(session_id, policy))

    def get_session(self, session_id: str) -> Session:
        return self._run(_get_session(session_id))

    def list_sessions(self, *, page_size: int = 100) -> Iterator[Session]:
        """Every session of the caller's tenant, oldest first, fetched a page at a time."""
        token = ""
        while True:
            sessions, token = self._run(_list_sessions(page_size, token))
            yield from sessions
            if not token:
                return

    def delete_session(self, session_id: str) -> int:
        """Delete a session and its history; returns the number of items deleted.

        When a retry finds the session already gone (its first try deleted it
        but the answer was lost), this returns 0 rather than raising NotFound.
        """
        deleted = self._run(_delete_session(session_id))
        self._held.forget(session_id)
        return deleted

    # --------------------------------------------------------------- items

    def append_items(
        self,
        session_id: str,
        items: Sequence[pb.Item],
        *,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        author: str = "",
    ) -> AppendResult:
        """Append items atomically. A random idempotency key is used unless given."""
        return self._run(_append_items(session_id, items, idempotency_key, expected_version, author))

    def append_openai(self, session_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> AppendResult:
        """Append OpenAI Chat Completions messages (the same keywords as `append_items`)."""
        return self.append_items(session_id, items_from_openai(messages), **kwargs)

    def append_anthropic(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AppendResult:
        """Append Anthropic Messages (and optionally the system prompt)."""
        return self.append_items(session_id, items_from_anthropic(messages, system), **kwargs)

    def append_responses(self, session_id: str, items: Sequence[Mapping[str, Any]], **kwargs: Any) -> AppendResult:
        """Append OpenAI Responses input (or output) items."""
        return self.append_items(session_id, items_from_responses(items), **kwargs)

    def append_converse(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        system: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AppendResult:
        """Append Bedrock Converse messages (and optionally its system blocks)."""
        return self.append_items(session_id, items_from_converse(messages, system), **kwargs)

    # --------------------------------------------------------------- views

    def render_view(
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
        """Render the session; `tools` (the provider tools array) lets transforms see the request's tools.
        With `place_cache_breakpoint` the view places the prompt-cache breakpoint (an Anthropic view
        carries its ``cache_control`` mark): send it as it is, adding none. With `as_stored`, the
        history as stored instead (every item in full but what was retracted; nothing decided,
        nothing recorded, no model call counted): for reading a session back, not for a model."""
        call = _render_view(
            session_id, format, budget_tokens, focus, tools, place_cache_breakpoint, as_stored, self._held
        )
        return self._run(call)

    def render_openai(self, session_id: str, *, budget_tokens: int = 0) -> list[dict[str, Any]]:
        """The view as Chat Completions ``messages``."""
        return self.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=budget_tokens).messages

    def render_anthropic(
        self, session_id: str, *, budget_tokens: int = 0, place_cache_breakpoint: bool = True
    ) -> dict[str, Any]:
        """The view as ``messages.create`` keywords: ``messages`` and, when present, ``system``;
        with the prompt-cache breakpoint the view placed (``cache_control`` on one block), unless
        `place_cache_breakpoint` is False (the caller marks its own)."""
        view = self.render_view(
            session_id,
            ViewFormat.ANTHROPIC_MESSAGES,
            budget_tokens=budget_tokens,
            place_cache_breakpoint=place_cache_breakpoint,
        )
        return view.anthropic_kwargs()

    def render_responses(self, session_id: str, *, budget_tokens: int = 0) -> list[dict[str, Any]]:
        """The view as Responses ``input`` items."""
        return self.render_view(session_id, ViewFormat.OPENAI_RESPONSES, budget_tokens=budget_tokens).messages

    def render_converse(self, session_id: str, *, budget_tokens: int = 0) -> dict[str, Any]:
        """The view as ``converse`` keywords (``messages`` and, when present, ``system``), bytes as bytes."""
        return self.render_view(session_id, ViewFormat.BEDROCK_CONVERSE, budget_tokens=budget_tokens).converse_kwargs()

    # ------------------------------------------------------------ controls

    def pin(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Pin items: never pruned, and shown in full again if they were."""
        return self._run(_pin(session_id, seqs, pinning=True))

    def unpin(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        return self._run(_pin(session_id, seqs, pinning=False))

    def propose_prune(self, session_id: str, seqs: Sequence[int], reason: str = "") -> list[PruneOutcome]:
        """Ask for items to be pruned (protected ones are refused); applied at a cache-safe point."""
        return self._run(_propose_prune(session_id, seqs, reason))

    def retract(self, session_id: str, seqs: Sequence[int], *, reason: str = "", redact: bool = False) -> Retraction:
        """Withdraw items from every later view (a framework's "pop" or "redact"); each gets a
        certificate, and the history keeps them. With `redact`, their content is never returned
        again (Retrieve answers ITEM_REDACTED). Returns what this call retracted, certificates included."""
        return self._run(_retract(session_id, seqs, reason, redact))

    def list_certificates(
        self,
        session_id: str,
        *,
        decision: str | None = None,
        level: int | None = None,
        seq: int | None = None,
        view_version: int | None = None,
        view_format: ViewFormat | str | None = None,
        page_size: int = 100,
    ) -> Iterator[Certificate]:
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
            page, token = self._run(call)
            yield from page
            if not token:
                return

    def explain_item(self, session_id: str, seq: int) -> Explanation:
        """How item `seq` is shown now, whether it is pinned or protected, and its certificates."""
        return self._run(_explain_item(session_id, seq))

    def report_usage(self, session_id: str, view_version: int, usage: Usage) -> bool:
        """Record what the provider billed for the call made with view `view_version`
        (``Usage.from_anthropic(response.usage)``, ``Usage.from_openai(...)``); GetStatus then
        shows it beside what contextd predicted. True when the same was reported before."""
        return self._run(_report_usage(session_id, view_version, usage))

    def get_status(self, session_id: str) -> Status:
        """Where the session stands: its size, its latest view, what is out of the view and why."""
        return self._run(_get_status(session_id))

    def search(self, session_id: str, query: str, **options: Any) -> SearchResults:
        """Items of the session matching `query`: ``mode`` ("full_text", "substring" or "regex"),
        ``tools``, ``roles``, ``min_seq``/``max_seq``, ``only_out_of_view``, ``page_size`` (the
        server caps it), ``page_token`` (from the previous page)."""
        return self._run(_search(session_id, query, **options))

    def retrieve(self, session_id: str, handle: str = "", *, seq: int = 0, **paging: Any) -> Retrieved:
        """A page of the original behind `handle` (or item `seq`): ``page_unit`` ("tokens" or
        "lines"), ``offset``, ``page_size`` (the server caps it), ``line_start``/``line_end``
        (1-based, inclusive), ``grep`` (a regular expression) with ``context_lines``."""
        return self._run(_retrieve(session_id, handle=handle, seq=seq, **paging))

    def watch_session(self, session_id: str = "", *, cursor: str = "", heartbeats: bool = False) -> Watch:
        """The session's events as they happen (every session of the tenant's with no id),
        after `cursor` when given (a `cursor` of an earlier event or watch: none missed,
        none twice), from now on otherwise. Iterate the result; a disconnect or a replica's
        restart is ridden out by resuming from the last cursor (giving up, with the error,
        when the retry policy's budget passes without an answer). A watch of one session
        ends when the session is deleted. ``with client.watch_session(...) as watch:``
        closes it on leaving; `watch.close()` ends it from another thread."""
        stubs, turns = self._stubs, itertools.count(next(self._turns))

        def open_stream(request: api.WatchSessionRequest) -> Any:
            # No deadline: a watch lasts as long as its watcher; each reconnect tries the next channel.
            return stubs[next(turns) % len(stubs)].WatchSession(request, metadata=self._config.metadata)

        return Watch(open_stream, WatchProgress(session_id, cursor, self._config.retry, heartbeats, time.monotonic))

    # ------------------------------------------------------------ plumbing

    def _run(self, call: Call[T]) -> T:
        stubs, turn = self._stubs, next(self._turns)
        tries = Tries(call, self._config.retry, self._config.timeout)
        while True:
            timeout = tries.begin()
            # With several channels, a retry goes to the next but after a deadline (Tries.channel).
            method = getattr(stubs[tries.channel(turn, len(stubs))], call.method)
            try:
                response = method(call.request, timeout=timeout, metadata=self._config.metadata)
                return call.decode(response)
            except grpc.RpcError as error:
                outcome = tries.failed(error)
                if outcome.settled:
                    return self._run(call.settle) if call.settle is not None else cast(T, call.settle_value)
                if outcome.error is not None:
                    raise outcome.error from None
                assert outcome.delay is not None
                time.sleep(outcome.delay)
