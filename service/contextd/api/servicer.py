"""The ContextService servicer: decode the request, call the core, encode
the response. Errors are raised as domain errors and mapped to statuses by
the interceptor (api/interceptors.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from contextd import agent_tools, metrics
from contextd.api import mapping
from contextd.api.auth import current_tenant
from contextd.api.responses import Encoded, Known, known_view, render_response
from contextd.engine.errors import InvalidArgument, ViewTooLarge
from contextd.engine.model import Role
from contextd.engine.validation import check_batch_size
from contextd.engine.view import ViewFormat, ViewRequest
from contextd.recovery import PageUnit, RecoveryService, RetrieveQuery, SearchMode, SearchQuery
from contextd.render_processes import RenderProcesses
from contextd.sessions import SessionService, check_session_id
from contextd.view_service import RenderResult, ViewService
from contextd.watch import EventFeed, Heartbeat
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from contextd_storage.certificate_log import CertificateFilter, StoredCertificate
from contextd_storage.rows import BULK_ITEMS, off_loop
from contextd_storage.search import Where
from contextd_storage.views import ReportedUsage

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def _certificate(session_id: str, stored: StoredCertificate) -> api.Certificate:
    made_in = stored.certificate.stamp.view_format
    return mapping.certificate_to_proto(
        stored.certificate, session_id, ViewFormat(made_in) if made_in else None, stored.created_at
    )


def _known_view(request: api.RenderViewRequest) -> Known | None:
    """The view the caller holds, by its token; None when it sent none, or one of another
    version of the service."""
    if not request.known_view_token:
        return None
    try:
        return known_view(request.known_view_token)
    except ValueError as error:
        raise InvalidArgument.at("known_view_token", f"{error}: send a View.view_token back as it came") from None


def _as_stored_only(request: api.RenderViewRequest) -> None:
    """A render of the history as stored takes nothing that shapes a view for a model call."""
    for name in ("budget_tokens", "focus", "tools_json", "place_cache_breakpoint", "known_view_token"):
        if getattr(request, name):
            raise InvalidArgument.at(name, "as_stored renders the whole history as stored: leave it unset")


class ContextServicer(contextd_pb2_grpc.ContextServiceServicer):
    def __init__(
        self,
        sessions: SessionService,
        views: ViewService,
        recovery: RecoveryService,
        feed: EventFeed,
        max_response_bytes: int,
    ) -> None:
        self.sessions = sessions
        self.feed = feed
        self.views = views
        self.recovery = recovery
        self.max_response_bytes = max_response_bytes
        self.renders: RenderProcesses | None = None
        """Where renders run when not here (api/server.py starts them, with `render_processes`)."""

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
        check_session_id(request.session_id)
        key = await self.recovery.store.session_key(current_tenant(), request.session_id)
        deleted = await self.sessions.delete_session(current_tenant(), request.session_id)
        await self.recovery.forget(current_tenant(), key)
        return api.DeleteSessionResponse(items_deleted=deleted)

    async def UpdateSession(self, request: api.UpdateSessionRequest, context: Context) -> api.UpdateSessionResponse:
        policy = request.policy if request.HasField("policy") else None
        session = await self.sessions.update_session(current_tenant(), request.session_id, policy)
        return api.UpdateSessionResponse(session=mapping.session_to_proto(session))

    async def AppendItems(self, request: api.AppendItemsRequest, context: Context) -> api.AppendItemsResponse:
        check_batch_size(len(request.items), self.sessions.limits)  # before mapping every item
        many = len(request.items) > BULK_ITEMS
        result = await self.sessions.append(
            current_tenant(),
            request.session_id,
            await off_loop(many, mapping.items_from_proto, request.items),
            idempotency_key=request.idempotency_key,
            expected_version=request.expected_version if request.HasField("expected_version") else None,
            author=request.author,
        )
        return mapping.append_result_to_proto(result)

    async def RenderView(self, request: api.RenderViewRequest, context: Context) -> Encoded:  # type: ignore[override]
        if self.renders is not None:
            data = await self.renders.render(
                current_tenant(),
                request.session_id,
                request.SerializeToString(),
                tuple(context.invocation_metadata() or ()),
                context.time_remaining(),
            )
            return Encoded(data)
        known = _known_view(request)
        view_request = ViewRequest(
            format=mapping.view_format(request.format),
            budget_tokens=request.budget_tokens,
            focus=tuple(request.focus),
            place_breakpoint=request.place_cache_breakpoint,
        )
        responses: list[Encoded] = []
        if request.as_stored:
            _as_stored_only(request)
            stored = await self.views.render_as_stored(current_tenant(), request.session_id, view_request)
            response = render_response(stored.view, (), named=False)
            if len(response.data) > self.max_response_bytes:
                raise ViewTooLarge(request.session_id, len(response.data), self.max_response_bytes)
            return response

        def fits(result: RenderResult) -> None:
            # A view too large to send is refused; its render is stored as no model call (ViewService.render).
            response = render_response(result.view, result.certificates, known)
            if len(response.data) > self.max_response_bytes:
                raise ViewTooLarge(request.session_id, len(response.data), self.max_response_bytes)
            metrics.record_view_size(current_tenant(), len(response.data), response.held)
            responses.append(response)

        await self.views.render(
            current_tenant(), request.session_id, view_request, tools_json=request.tools_json, check=fits
        )
        return responses[0]

    async def Retrieve(self, request: api.RetrieveRequest, context: Context) -> api.RetrieveResponse:
        target = request.WhichOneof("target")
        if request.page_unit not in (api.PAGE_UNIT_UNSPECIFIED, api.PAGE_UNIT_TOKENS, api.PAGE_UNIT_LINES):
            raise InvalidArgument.at("page_unit", f"{request.page_unit} is not a page unit this service knows")
        query = RetrieveQuery(
            handle=request.handle if target == "handle" else "",
            seq=request.seq if target == "seq" else 0,
            unit=PageUnit.LINES if request.page_unit == api.PAGE_UNIT_LINES else PageUnit.TOKENS,
            offset=request.offset,
            size=request.page_size,
            line_start=request.line_start,
            line_end=request.line_end,
            grep=request.grep,
            context_lines=request.context_lines,
        )
        page = await self.recovery.retrieve(current_tenant(), request.session_id, query)
        return api.RetrieveResponse(
            handle=page.handle,
            seq=page.seq,
            content=page.content,
            total_lines=page.total_lines,
            total_tokens=page.total_tokens,
            next_offset=page.next_offset,
            served_from=page.served_from,
        )

    async def Search(self, request: api.SearchRequest, context: Context) -> api.SearchResponse:
        modes = {
            api.SEARCH_MODE_UNSPECIFIED: SearchMode.FULL_TEXT,
            api.SEARCH_MODE_FULL_TEXT: SearchMode.FULL_TEXT,
            api.SEARCH_MODE_SUBSTRING: SearchMode.SUBSTRING,
            api.SEARCH_MODE_REGEX: SearchMode.REGEX,
        }
        if request.mode not in modes:
            raise InvalidArgument.at("mode", f"{request.mode} is not a search mode this service knows")
        roles = []
        for n, role in enumerate(request.roles):
            if role not in mapping.ROLES:
                raise InvalidArgument.at(f"roles[{n}]", f"{role} is not a role")
            roles.append(mapping.ROLES[role].value)
        if request.max_seq and request.max_seq < request.min_seq:
            raise InvalidArgument.at("max_seq", "below min_seq")
        query = SearchQuery(
            query=request.query,
            mode=modes[request.mode],
            where=Where(request.min_seq, request.max_seq, tuple(roles), tuple(request.tools)),
            only_out_of_view=request.only_out_of_view,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        hits, token = await self.recovery.search(current_tenant(), request.session_id, query)
        return api.SearchResponse(
            hits=[
                api.SearchHit(
                    seq=h.seq,
                    handle=h.handle,
                    snippet=h.snippet,
                    score=h.score,
                    role=mapping.ROLE_TO_PROTO[Role(h.role)],
                    tool_name=h.tool,
                )
                for h in hits
            ],
            next_page_token=token,
        )

    async def GetAgentTools(self, request: api.GetAgentToolsRequest, context: Context) -> api.GetAgentToolsResponse:
        return api.GetAgentToolsResponse(tools_json=agent_tools.definitions_json(mapping.view_format(request.format)))

    async def Pin(self, request: api.PinRequest, context: Context) -> api.PinResponse:
        pinned = await self.views.pin(current_tenant(), request.session_id, list(request.seqs))
        return api.PinResponse(pinned=pinned)

    async def Unpin(self, request: api.UnpinRequest, context: Context) -> api.UnpinResponse:
        unpinned = await self.views.unpin(current_tenant(), request.session_id, list(request.seqs))
        return api.UnpinResponse(unpinned=unpinned)

    async def ProposePrune(self, request: api.ProposePruneRequest, context: Context) -> api.ProposePruneResponse:
        outcomes = await self.views.propose_prune(
            current_tenant(), request.session_id, list(request.seqs), request.reason
        )
        return api.ProposePruneResponse(
            outcomes=[api.PruneProposalOutcome(seq=o.seq, accepted=o.accepted, reason=o.reason) for o in outcomes]
        )

    async def RetractItems(self, request: api.RetractItemsRequest, context: Context) -> api.RetractItemsResponse:
        retracted, certificates = await self.views.retract(
            current_tenant(), request.session_id, list(request.seqs), request.reason, request.redact
        )
        return api.RetractItemsResponse(
            retracted=retracted,
            certificates=[mapping.certificate_to_proto(c, request.session_id, None) for c in certificates],
        )

    async def ListCertificates(
        self, request: api.ListCertificatesRequest, context: Context
    ) -> api.ListCertificatesResponse:
        if request.decision and request.decision not in mapping.DECISIONS_FROM_PROTO:
            raise InvalidArgument.at("decision", f"{request.decision} is not a decision this service knows")
        where = CertificateFilter(
            decision=mapping.DECISIONS_FROM_PROTO.get(request.decision),
            view_format=mapping.view_format(request.format).value if request.format else None,
            level=request.level if request.HasField("level") else None,
            seq=request.seq if request.HasField("seq") else None,
            view_version=request.view_version if request.HasField("view_version") else None,
        )
        page, token = await self.views.list_certificates(
            current_tenant(), request.session_id, where, request.page_size, request.page_token
        )
        return api.ListCertificatesResponse(
            certificates=[_certificate(request.session_id, c) for c in page], next_page_token=token
        )

    async def ExplainItem(self, request: api.ExplainItemRequest, context: Context) -> api.ExplainItemResponse:
        found = await self.views.explain(current_tenant(), request.session_id, request.seq)
        return api.ExplainItemResponse(
            item=mapping.item_to_proto(found.item),
            representation=mapping.REPRESENTATION_TO_PROTO[found.representation],
            pinned=found.pinned,
            protection=found.protection,
            certificates=[_certificate(request.session_id, c) for c in found.certificates],
        )

    async def ReportUsage(self, request: api.ReportUsageRequest, context: Context) -> api.ReportUsageResponse:
        usage = ReportedUsage(
            provider=request.provider,
            model=request.model,
            input_tokens=request.input_tokens,
            output_tokens=request.output_tokens,
            cache_read_tokens=request.cache_read_tokens,
            cache_write_tokens=request.cache_write_tokens,
        )
        stored = await self.views.report_usage(current_tenant(), request.session_id, request.view_version, usage)
        return api.ReportUsageResponse(replayed=not stored)

    async def GetStatus(self, request: api.GetStatusRequest, context: Context) -> api.GetStatusResponse:
        status = await self.recovery.status(current_tenant(), request.session_id)
        return api.GetStatusResponse(
            version=status.version,
            history_tokens=status.history_tokens,
            view_tokens=status.view_tokens,
            budget_tokens=status.budget_tokens,
            offloaded=[
                api.OffloadedItem(
                    seq=o.seq,
                    handle=o.handle,
                    tool_name=o.tool,
                    arguments_digest=o.arguments_digest,
                    tokens=o.tokens,
                    reason=o.reason,
                )
                for o in status.offloaded
            ],
            pending_deferred=status.pending_deferred,
            stash_hit_rate=status.stash_hit_rate,
            usage=mapping.usage_to_proto(status.usage),
        )

    async def WatchSession(
        self, request: api.WatchSessionRequest, context: Context
    ) -> AsyncIterator[api.WatchSessionResponse]:
        async for answer in self.feed.watch(current_tenant(), request.session_id, request.cursor):
            if isinstance(answer, Heartbeat):
                yield mapping.heartbeat_to_proto(answer.cursor.encode(), answer.time)
            elif (response := mapping.event_to_proto(answer)) is not None:
                yield response
