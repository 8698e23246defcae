"""The application core: what each session operation does, between the api
layer (protobuf) and the adapters (storage) with the pure engine doing the
domain work. Nothing here knows about gRPC.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, Sequence

from contextd import metrics
from contextd.admission import Admission
from contextd.config import TenantLimits
from contextd.engine.codec import canonical_json, content_hash, item_to_json
from contextd.engine.errors import InvalidArgument, LimitExceeded
from contextd.engine.model import AppendResult, ItemContent, Session
from contextd.engine.observations import COMPLETES, parse_completion
from contextd.engine.policy import Policy, parse_policy
from contextd.engine.tokens import TokenCounter, item_tokens
from contextd.engine.transforms import TransformRegistry
from contextd.engine.validation import Limits, check_batch, check_name, item_bytes
from contextd.telemetry import annotate
from contextd_storage.history import HistoryStore
from contextd_storage.rows import BULK_ITEMS, AppendRequest, PreparedItem, off_loop

SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_METADATA_ENTRIES = 64
MAX_METADATA_BYTES = 16_384
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
# Above this many bytes or `BULK_ITEMS` items a batch is checked, hashed and counted on a worker
# thread, so one large append does not stall every other call on the event loop: checking,
# hashing and counting take about 0.1 ms an item, so a batch of 800 small items held the loop
# for some 80 ms (bench/stall.py's appends phase).
_THREAD_THRESHOLD_BYTES = 256 * 1024
# Likewise policies: parsing and validating one takes about 2 ms per KB.
_THREAD_THRESHOLD_POLICY = 16_384


class SessionService:
    def __init__(
        self,
        store: HistoryStore,
        counter: TokenCounter,
        limits: Limits,
        registry: TransformRegistry,
        admission: Admission | None = None,
    ) -> None:
        self.store = store
        self.counter = counter
        self.limits = limits
        self.registry = registry
        self.admission = admission or Admission(TenantLimits())
        """The tenants' rates and quotas (none unless configured)."""

    async def create_session(self, tenant: str, session_id: str, metadata: Mapping[str, str], policy: str) -> Session:
        session_id = session_id or uuid.uuid4().hex
        check_session_id(session_id)
        _check_metadata(metadata, "metadata")
        parsed = await parse_off_loop(policy, self.registry)
        annotate(session_id=session_id, policy_version=parsed.version)
        return await self.store.create_session(tenant, session_id, dict(metadata), _own(policy), parsed.version)

    async def update_session(self, tenant: str, session_id: str, policy: str | None) -> Session:
        """Change what is given (today: the policy); unset fields stay as they are."""
        check_session_id(session_id)
        annotate(session_id=session_id)
        if policy is None:
            return await self.store.get_session(tenant, session_id)
        parsed = await parse_off_loop(policy, self.registry)
        annotate(policy_version=parsed.version)
        return await self.store.set_policy(tenant, session_id, _own(policy), parsed.version)

    async def get_session(self, tenant: str, session_id: str) -> Session:
        check_session_id(session_id)
        annotate(session_id=session_id)
        return await self.store.get_session(tenant, session_id)

    async def list_sessions(self, tenant: str, page_size: int, page_token: str) -> tuple[list[Session], str]:
        if page_size > MAX_PAGE_SIZE:
            raise LimitExceeded.at("page_size", f"{page_size} is over the maximum of {MAX_PAGE_SIZE}")
        return await self.store.list_sessions(tenant, page_size or DEFAULT_PAGE_SIZE, page_token)

    async def delete_session(self, tenant: str, session_id: str) -> int:
        check_session_id(session_id)
        annotate(session_id=session_id)
        deleted = await self.store.delete_session(tenant, session_id)
        self.admission.forget(tenant)  # its bytes are free again
        return deleted

    async def append(
        self,
        tenant: str,
        session_id: str,
        items: Sequence[ItemContent],
        *,
        idempotency_key: str = "",
        expected_version: int | None = None,
        author: str = "",
    ) -> AppendResult:
        check_session_id(session_id)
        bad_keys = check_name("idempotency_key", idempotency_key) + check_name("author", author)
        if bad_keys:
            raise InvalidArgument(bad_keys)
        many = len(items) > BULK_ITEMS
        size = await off_loop(many, self._checked, items)
        annotate(session_id=session_id, items=len(items), bytes=size)
        await self.admission.admit_append(tenant, size)  # before the hashing and counting
        prepared, request_hash = await off_loop(many or size > _THREAD_THRESHOLD_BYTES, self._prepare, items, author)
        annotate(tokens=sum(p.token_count for p in prepared))
        result = await self.store.append(
            AppendRequest(
                tenant=tenant,
                session_id=session_id,
                items=prepared,
                request_hash=request_hash,
                idempotency_key=idempotency_key,
                expected_version=expected_version,
                author=author,
                stored_bytes=size,
            )
        )
        if not result.replayed:
            self.admission.appended(tenant, size)
            metrics.record_append(tenant, len(items), size)
        return result

    def _checked(self, items: Sequence[ItemContent]) -> int:
        """The batch's bytes, once its items are checked (InvalidArgument naming the first fields at fault)."""
        check_batch(items, self.limits)
        for i, item in enumerate(items):
            _check_metadata(item.metadata, f"items[{i}].metadata")
            _check_completion(item.metadata, f"items[{i}].metadata")
        return sum(item_bytes(i) for i in items)

    def _prepare(self, items: Sequence[ItemContent], author: str) -> tuple[list[PreparedItem], str]:
        prepared = [PreparedItem(i, content_hash(i), item_tokens(i, self.counter)) for i in items]
        request_hash = hashlib.sha256(canonical_json([author, [item_to_json(i) for i in items]])).hexdigest()
        return prepared, request_hash


async def parse_off_loop(policy: str, registry: TransformRegistry) -> Policy:
    """The policy parsed and validated; a large document on a worker thread, off the event loop."""
    return await off_loop(len(policy) > _THREAD_THRESHOLD_POLICY, parse_policy, policy, registry)


def check_session_id(session_id: str) -> None:
    if not SESSION_ID.fullmatch(session_id):
        shown = session_id if len(session_id) <= 40 else session_id[:40] + "..."
        raise InvalidArgument.at("session_id", f"{shown!r} is not 1-128 characters of A-Z a-z 0-9 . _ : -")


def _check_metadata(metadata: Mapping[str, str], field: str) -> None:
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise LimitExceeded.at(field, f"{len(metadata)} entries, over the maximum of {MAX_METADATA_ENTRIES}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise LimitExceeded.at(field, f"{size:,} bytes, over the maximum of {MAX_METADATA_BYTES:,}")


def _check_completion(metadata: Mapping[str, str], field: str) -> None:
    """A completion mark must name a span of earlier items (`FIRST-LAST`)."""
    value = metadata.get(COMPLETES)
    if value is not None and parse_completion(value) is None:
        raise InvalidArgument.at(f"{field}[{COMPLETES}]", f"{value!r} is not FIRST-LAST, two seqs from 1, in order")


def _own(policy: str) -> str:
    """The policy a session stores: empty for the default (which it follows as it is shipped)."""
    return policy if policy.strip() else ""
