"""Each operation as a value: the RPC, its request, how to decode the answer.

The sync and async clients only differ in how they wait; everything a call
means is built here once, including the idempotency key that every retry of
that call reuses.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from contextd_client._errors import REASON_KEY, ContextdError, error_from_rpc, trailers
from contextd_client._held import Held, HeldViews
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
    _items,
)
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    """Name of the ContextService RPC."""
    request: Any
    decode: Callable[[Any], T]
    # A retried mutation can run into its own first attempt, which reached the
    # server although its answer was lost: on a retry, an error with
    # `done_code` means "already done", and `settle` gives the result.
    done_code: grpc.StatusCode | None = None
    settle: Call[T] | None = None
    settle_value: T | None = None
    writes: bool = False
    """A mutation made safe to repeat (by key or client-chosen id), or a render:
    retried even after a deadline, when the first try may have been committed
    unseen (a render is, once the service has started it)."""
    safe_to_repeat: bool = True
    """False for a mutation nothing makes harmless to repeat: it gets only a few
    tries, when the service could not take it (`RetryPolicy.unsafe_attempts`)."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What to do after a try failed: wait `delay` and retry, settle, or raise `error`."""

    delay: float | None = None
    settled: bool = False
    error: ContextdError | None = None


def after_failure(call: Call[T], attempt: int, error: grpc.RpcError, policy: RetryPolicy, elapsed: float) -> Outcome[T]:
    """What to do after try `attempt` of `call` failed, `elapsed` seconds after the first try started."""
    if attempt > 1 and call.done_code is not None and error.code() == call.done_code:
        return Outcome(settled=True)
    delay = policy.delay(attempt, error, elapsed, after_deadline=call.writes, safe=call.safe_to_repeat)
    if delay is not None:
        return Outcome(delay=delay)
    failure = error_from_rpc(error)
    if call.method == "AppendItems":
        failure.idempotency_key = call.request.idempotency_key
    return Outcome(error=failure)


class Tries(Generic[T]):
    """The tries of one call, timed on `clock` (seconds; `time.monotonic` unless given)."""

    def __init__(
        self, call: Call[T], policy: RetryPolicy, timeout: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.call, self.policy, self.timeout, self.clock = call, policy, timeout, clock
        self.attempt = 0
        self.started = clock()
        self.moves = 0
        """Tries that went on to the next channel (`channel`)."""

    def begin(self) -> float:
        """Count a new try; returns its deadline, in seconds."""
        self.attempt += 1
        return self.policy.try_timeout(self.timeout, self.attempt, self.clock() - self.started)

    def channel(self, first: int, channels: int) -> int:
        """The channel of this try, of `channels` whose turn `first` the call took: the next after
        a try the replica could not take; the same after a try whose deadline passed, where the
        call may still run (a render the service finishes, which the next resumes from, holding
        what it worked out), or that found its session busy (as busy on every replica: most
        likely with that render)."""
        return (first + self.moves) % channels

    def failed(self, error: grpc.RpcError) -> Outcome[T]:
        busy = any(key == REASON_KEY and value == "SESSION_BUSY" for key, value in trailers(error))
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED and not busy:
            self.moves += 1
        return after_failure(self.call, self.attempt, error, self.policy, self.clock() - self.started)


def create_session(session_id: str | None, metadata: Mapping[str, str] | None, policy: str) -> Call[Session]:
    request = api.CreateSessionRequest(
        session_id=session_id or uuid.uuid4().hex, metadata=dict(metadata or {}), policy=policy
    )
    if session_id:
        # A caller-chosen id may be taken by someone else: ALREADY_EXISTS on
        # a retry cannot be told from a real conflict, so it is reported, and
        # the call is not repeated for long.
        return Call("CreateSession", request, _session, safe_to_repeat=False)
    # An id chosen here is ours alone: ALREADY_EXISTS on a retry means the
    # first try created it, and the answer was lost.
    return Call(
        "CreateSession",
        request,
        _session,
        done_code=grpc.StatusCode.ALREADY_EXISTS,
        settle=get_session(request.session_id),
        writes=True,
    )


def _session(response: Any) -> Session:
    return Session.from_proto(response.session)


def get_session(session_id: str) -> Call[Session]:
    return Call("GetSession", api.GetSessionRequest(session_id=session_id), _session)


def update_session(session_id: str, policy: str | None) -> Call[Session]:
    request = api.UpdateSessionRequest(session_id=session_id)
    if policy is not None:
        request.policy = policy
    # Setting a policy twice is the same as once: safe to retry.
    return Call("UpdateSession", request, _session, writes=True)


def list_sessions(page_size: int, page_token: str) -> Call[tuple[list[Session], str]]:
    return Call(
        "ListSessions",
        api.ListSessionsRequest(page_size=page_size, page_token=page_token),
        lambda r: ([Session.from_proto(s) for s in r.sessions], r.next_page_token),
    )


def delete_session(session_id: str) -> Call[int]:
    return Call(
        "DeleteSession",
        api.DeleteSessionRequest(session_id=session_id),
        lambda r: int(r.items_deleted),
        done_code=grpc.StatusCode.NOT_FOUND,
        settle_value=0,
        writes=True,
    )


def append_items(
    session_id: str,
    items: Sequence[pb.Item],
    idempotency_key: str | None,
    expected_version: int | None,
    author: str,
) -> Call[AppendResult]:
    request = api.AppendItemsRequest(
        session_id=session_id,
        items=list(items),
        idempotency_key=idempotency_key or uuid.uuid4().hex,
        author=author,
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return Call("AppendItems", request, AppendResult.from_proto, writes=True)


def render_view(
    session_id: str,
    fmt: ViewFormat | str,
    budget_tokens: int,
    focus: Sequence[str],
    tools: Sequence[Any] | None,
    place_cache_breakpoint: bool = False,
    as_stored: bool = False,
    views: HeldViews | None = None,
) -> Call[View]:
    """`views`: the last views received, the session's in this format sent back by its token
    (the service then sends only what changed) and this one held in its place."""
    fmt = ViewFormat(fmt)
    holding = views if views is not None and views.most > 0 and not as_stored else None
    held = holding.get(session_id, fmt) if holding is not None else None

    def decode(response: api.RenderViewResponse) -> View:
        message = response.view
        if held is not None and (message.shared_messages_bytes or message.shared_items):
            if message.shared_messages_bytes > len(held.messages) or message.shared_items > len(held.items):
                assert holding is not None
                holding.forget(session_id, fmt)  # (the next render comes whole)
                raise ContextdError("DATA_LOSS", "the service left out more of the view than the client held")
            messages = held.messages[: message.shared_messages_bytes] + message.messages_json.encode()
            items = held.items[: message.shared_items] + _items(message)
            view = View.from_proto(message, (messages.decode(), items))
        else:
            view = View.from_proto(message)
            messages = view.messages_json.encode() if holding is not None and message.view_token else b""
        if holding is not None:
            holding.hold(session_id, fmt, Held(message.view_token, messages, view.items))
        return view

    return Call(
        "RenderView",
        api.RenderViewRequest(
            session_id=session_id,
            format=fmt.to_proto(),
            budget_tokens=budget_tokens,
            focus=list(focus),
            tools_json=json.dumps(list(tools)) if tools else "",
            place_cache_breakpoint=place_cache_breakpoint,
            as_stored=as_stored,
            known_view_token=held.token if held is not None else b"",
        ),
        decode,
        # A render whose deadline passes once the service's engine has started is finished and
        # stored all the same: tried again, it resumes from that one (a view as stored is not).
        writes=not as_stored,
    )


def pin(session_id: str, seqs: Sequence[int], pinning: bool) -> Call[list[int]]:
    # Pinning twice is pinning once: safe to retry.
    if pinning:
        return Call(
            "Pin", api.PinRequest(session_id=session_id, seqs=list(seqs)), lambda r: list(r.pinned), writes=True
        )
    request = api.UnpinRequest(session_id=session_id, seqs=list(seqs))
    return Call("Unpin", request, lambda r: list(r.unpinned), writes=True)


def propose_prune(session_id: str, seqs: Sequence[int], reason: str) -> Call[list[PruneOutcome]]:
    return Call(
        "ProposePrune",
        api.ProposePruneRequest(session_id=session_id, seqs=list(seqs), reason=reason),
        lambda r: [PruneOutcome(o.seq, o.accepted, o.reason) for o in r.outcomes],
        safe_to_repeat=False,  # no key tells a repeat from a second proposal
    )


def retract(session_id: str, seqs: Sequence[int], reason: str, redact: bool) -> Call[Retraction]:
    # Retracting twice is retracting once: safe to retry (a retry answers with nothing retracted).
    request = api.RetractItemsRequest(session_id=session_id, seqs=list(seqs), reason=reason, redact=redact)
    return Call(
        "RetractItems",
        request,
        lambda r: Retraction(list(r.retracted), tuple(Certificate.from_proto(c) for c in r.certificates)),
        writes=True,
    )


def list_certificates(
    session_id: str, page_size: int, page_token: str, **where: Any
) -> Call[tuple[list[Certificate], str]]:
    request = api.ListCertificatesRequest(session_id=session_id, page_size=page_size, page_token=page_token)
    if where.get("decision"):
        request.decision = api.Decision.Value("DECISION_" + where["decision"].upper())
    for name in ("level", "seq", "view_version"):
        if where.get(name) is not None:
            setattr(request, name, where[name])
    if where.get("view_format"):
        request.format = ViewFormat(where["view_format"]).to_proto()
    return Call(
        "ListCertificates",
        request,
        lambda r: ([Certificate.from_proto(c) for c in r.certificates], r.next_page_token),
    )


def explain_item(session_id: str, seq: int) -> Call[Explanation]:
    return Call("ExplainItem", api.ExplainItemRequest(session_id=session_id, seq=seq), Explanation.from_proto)


def retrieve(
    session_id: str,
    *,
    handle: str = "",
    seq: int = 0,
    page_unit: str = "tokens",
    offset: int = 0,
    page_size: int = 0,
    line_start: int = 0,
    line_end: int = 0,
    grep: str = "",
    context_lines: int = 0,
) -> Call[Retrieved]:
    if page_unit not in ("tokens", "lines"):
        raise ValueError(f"page_unit is 'tokens' or 'lines', not {page_unit!r}")
    request = api.RetrieveRequest(
        session_id=session_id,
        page_unit=api.PAGE_UNIT_LINES if page_unit == "lines" else api.PAGE_UNIT_TOKENS,
        offset=offset,
        page_size=page_size,
        line_start=line_start,
        line_end=line_end,
        grep=grep,
        context_lines=context_lines,
    )
    if handle:
        request.handle = handle
    if seq:
        request.seq = seq
    return Call("Retrieve", request, Retrieved.from_proto)


_SEARCH_MODES = {
    "full_text": api.SEARCH_MODE_FULL_TEXT,
    "substring": api.SEARCH_MODE_SUBSTRING,
    "regex": api.SEARCH_MODE_REGEX,
}
_ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}


def search(
    session_id: str,
    query: str,
    *,
    mode: str = "full_text",
    tools: Sequence[str] = (),
    roles: Sequence[str] = (),
    min_seq: int = 0,
    max_seq: int = 0,
    only_out_of_view: bool = False,
    page_size: int = 0,
    page_token: str = "",
) -> Call[SearchResults]:
    if mode not in _SEARCH_MODES:
        raise ValueError(f"mode is one of {', '.join(_SEARCH_MODES)}, not {mode!r}")
    unknown = [r for r in roles if r not in _ROLES]
    if unknown:
        raise ValueError(f"roles are among {', '.join(_ROLES)}: not {', '.join(unknown)}")
    request = api.SearchRequest(
        session_id=session_id,
        query=query,
        mode=_SEARCH_MODES[mode],
        tools=list(tools),
        roles=[_ROLES[r] for r in roles],
        min_seq=min_seq,
        max_seq=max_seq,
        only_out_of_view=only_out_of_view,
        page_size=page_size,
        page_token=page_token,
    )
    return Call("Search", request, SearchResults.from_proto)


def report_usage(session_id: str, view_version: int, usage: Usage) -> Call[bool]:
    # The same figures again are a retry (replayed): safe to repeat.
    request = api.ReportUsageRequest(
        session_id=session_id,
        view_version=view_version,
        provider=usage.provider,
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )
    return Call("ReportUsage", request, lambda r: bool(r.replayed), writes=True)


def get_status(session_id: str) -> Call[Status]:
    return Call("GetStatus", api.GetStatusRequest(session_id=session_id), Status.from_proto)
