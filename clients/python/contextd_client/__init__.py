"""Thin Python client for contextd, the context service for LLM agents.

    from contextd_client import Client

    ctx = Client("127.0.0.1:50051")
    session = ctx.create_session()
    ctx.append_openai(session.id, [{"role": "user", "content": "Fix the failing test."}])
    messages = ctx.render_openai(session.id, budget_tokens=100_000)

Depends on grpcio and protobuf only.
"""

from contextd_client._agent import AgentTools, AsyncAgentTools
from contextd_client._aio import AsyncClient
from contextd_client._client import Client
from contextd_client._errors import (
    AlreadyExists,
    ContextdError,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    VersionConflict,
)
from contextd_client._marks import completes
from contextd_client._retry import NO_RETRY, RetryPolicy
from contextd_client._types import (
    AppendResult,
    Certificate,
    Explanation,
    ItemReceipt,
    Offloaded,
    PruneOutcome,
    Retraction,
    Retrieved,
    SearchHit,
    SearchResults,
    Session,
    Status,
    Usage,
    UsageSummary,
    View,
    ViewFormat,
    ViewItem,
    ViewWarning,
)
from contextd_client._watch import AsyncWatch, SessionEvent, Watch
from contextd_client.formats import items_from_anthropic, items_from_openai

__version__ = "0.1.0"

__all__ = [
    "NO_RETRY",
    "AgentTools",
    "AlreadyExists",
    "AppendResult",
    "AsyncAgentTools",
    "AsyncClient",
    "AsyncWatch",
    "Certificate",
    "Client",
    "ContextdError",
    "DeadlineExceeded",
    "Explanation",
    "InvalidArgument",
    "ItemReceipt",
    "NotFound",
    "Offloaded",
    "PruneOutcome",
    "Retraction",
    "Retrieved",
    "RetryPolicy",
    "SearchHit",
    "SearchResults",
    "Session",
    "SessionEvent",
    "Status",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Usage",
    "UsageSummary",
    "VersionConflict",
    "View",
    "ViewFormat",
    "ViewItem",
    "ViewWarning",
    "Watch",
    "completes",
    "items_from_anthropic",
    "items_from_openai",
]
