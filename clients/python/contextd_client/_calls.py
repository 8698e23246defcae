"""Each operation as a value: the RPC, its request, how to decode the answer.

The sync and async clients only differ in how they wait; everything a call
means is built here once, including the idempotency key that every retry of
that call reuses.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from contextd_client._types import AppendResult, Session, View, ViewFormat
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


def create_session(session_id: str | None, metadata: Mapping[str, str] | None) -> Call[Session]:
    # The id is chosen here, so a retry after a lost answer finds the session
    # its first try created instead of creating a second one.
    session_id = session_id or uuid.uuid4().hex
    return Call(
        "CreateSession",
        api.CreateSessionRequest(session_id=session_id, metadata=dict(metadata or {})),
        lambda r: Session.from_proto(r.session),
        done_code=grpc.StatusCode.ALREADY_EXISTS,
        settle=get_session(session_id),
    )


def get_session(session_id: str) -> Call[Session]:
    return Call("GetSession", api.GetSessionRequest(session_id=session_id), lambda r: Session.from_proto(r.session))


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
    return Call("AppendItems", request, AppendResult.from_proto)


def render_view(session_id: str, fmt: ViewFormat | str, budget_tokens: int, focus: Sequence[str]) -> Call[View]:
    return Call(
        "RenderView",
        api.RenderViewRequest(
            session_id=session_id,
            format=ViewFormat(fmt).to_proto(),
            budget_tokens=budget_tokens,
            focus=list(focus),
        ),
        lambda r: View.from_proto(r.view),
    )
