"""The ContextService servicer: decode the request, call the core, encode
the response. Errors are raised as domain errors and mapped to statuses by
the interceptor (api/interceptors.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeAlias

import grpc
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc

from contextd.api import mapping
from contextd.api.auth import current_tenant
from contextd.engine.errors import NotImplementedYet, ViewTooLarge
from contextd.engine.view import ViewRequest
from contextd.sessions import SessionService

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

# What each RPC not served yet is waiting for, so a caller knows why.
_MISSING = {
    "Retrieve": "the stash and recovery layer (handles, paging, grep)",
    "Search": "the session search index",
    "Pin": "the view engine's protection state",
    "Unpin": "the view engine's protection state",
    "ProposePrune": "the view engine's agent-requested pruning",
    "ListCertificates": "the view engine's certificate log",
    "ExplainItem": "the view engine's certificate log",
    "ReportUsage": "the cache-economics model that compares predicted and reported usage",
    "GetStatus": "the stash and the view engine's status report",
    "WatchSession": "session event streaming",
}


def _unimplemented(rpc: str) -> NoReturn:
    raise NotImplementedYet(f"{rpc} is not implemented in this version of contextd: it needs {_MISSING[rpc]}")


class ContextServicer(contextd_pb2_grpc.ContextServiceServicer):
    def __init__(self, sessions: SessionService, max_response_bytes: int) -> None:
        self.sessions = sessions
        self.max_response_bytes = max_response_bytes

    async def CreateSession(self, request: api.CreateSessionRequest, context: Context) -> api.CreateSessionResponse:
        session = await self.sessions.create_session(
            current_tenant(), request.session_id, request.metadata, request.policy
        )
        return api.CreateSessionResponse(session=mapping.session_to_proto(session))

    async def GetSession(self, request: api.GetSessionRequest, context: Context) -> api.GetSessionResponse:
        session = await self.sessions.get_session(current_tenant(), request.session_id)
        return api.GetSessionResponse(session=mapping.session_to_proto(session))

    async def ListSessions(self, request: api.ListSessionsRequest, context: Context) -> api.ListSessionsResponse:
        sessions, token = await self.sessions.list_sessions(current_tenant(), request.page_size, request.page_token)
        return api.ListSessionsResponse(sessions=[mapping.session_to_proto(s) for s in sessions], next_page_token=token)

    async def DeleteSession(self, request: api.DeleteSessionRequest, context: Context) -> api.DeleteSessionResponse:
        deleted = await self.sessions.delete_session(current_tenant(), request.session_id)
        return api.DeleteSessionResponse(items_deleted=deleted)

    async def UpdateSession(self, request: api.UpdateSessionRequest, context: Context) -> api.UpdateSessionResponse:
        policy = request.policy if request.HasField("policy") else None
        session = await self.sessions.update_session(current_tenant(), request.session_id, policy)
        return api.UpdateSessionResponse(session=mapping.session_to_proto(session))

    async def AppendItems(self, request: api.AppendItemsRequest, context: Context) -> api.AppendItemsResponse:
        result = await self.sessions.append(
            current_tenant(),
            request.session_id,
            mapping.items_from_proto(request.items),
            idempotency_key=request.idempotency_key,
            expected_version=request.expected_version if request.HasField("expected_version") else None,
            author=request.author,
        )
        return mapping.append_result_to_proto(result)

    async def RenderView(self, request: api.RenderViewRequest, context: Context) -> api.RenderViewResponse:
        view_request = ViewRequest(
            format=mapping.view_format(request.format),
            budget_tokens=request.budget_tokens,
            focus=tuple(request.focus),
        )
        view = await self.sessions.render(current_tenant(), request.session_id, view_request)
        response = api.RenderViewResponse(view=mapping.view_to_proto(view))
        size = response.ByteSize()
        if size > self.max_response_bytes:
            raise ViewTooLarge(request.session_id, size, self.max_response_bytes)
        return response

    async def Retrieve(self, request: api.RetrieveRequest, context: Context) -> api.RetrieveResponse:
        _unimplemented("Retrieve")

    async def Search(self, request: api.SearchRequest, context: Context) -> api.SearchResponse:
        _unimplemented("Search")

    async def Pin(self, request: api.PinRequest, context: Context) -> api.PinResponse:
        _unimplemented("Pin")

    async def Unpin(self, request: api.UnpinRequest, context: Context) -> api.UnpinResponse:
        _unimplemented("Unpin")

    async def ProposePrune(self, request: api.ProposePruneRequest, context: Context) -> api.ProposePruneResponse:
        _unimplemented("ProposePrune")

    async def ListCertificates(
        self, request: api.ListCertificatesRequest, context: Context
    ) -> api.ListCertificatesResponse:
        _unimplemented("ListCertificates")

    async def ExplainItem(self, request: api.ExplainItemRequest, context: Context) -> api.ExplainItemResponse:
        _unimplemented("ExplainItem")

    async def ReportUsage(self, request: api.ReportUsageRequest, context: Context) -> api.ReportUsageResponse:
        _unimplemented("ReportUsage")

    async def GetStatus(self, request: api.GetStatusRequest, context: Context) -> api.GetStatusResponse:
        _unimplemented("GetStatus")

    async def WatchSession(
        self, request: api.WatchSessionRequest, context: Context
    ) -> AsyncIterator[api.WatchSessionResponse]:
        _unimplemented("WatchSession")
        yield  # an async generator, as streaming handlers must be (api/interceptors.py)
