"""The application core for views: rendering through the engine under the
session lock, and the controls around it (pins, the agent's prune
proposals, the certificate log, explanations). Nothing here knows gRPC.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextd.engine.certificates import Certificate, verify_chain
from contextd.engine.errors import InvalidArgument, LimitExceeded
from contextd.engine.model import Item, Representation, Session
from contextd.engine.pipeline import RenderInput, protection_map, render
from contextd.engine.policy import Policy, parse_policy
from contextd.engine.state import AppliedEdit
from contextd.engine.tokens import TokenCounter
from contextd.engine.transforms import Remove, Replace, TransformRegistry, target_of
from contextd.engine.view import View, ViewRequest
from contextd.sessions import check_session_id
from contextd.storage import views
from contextd.storage.history import HistoryStore
from contextd.telemetry import annotate

MAX_PROPOSAL_REASON = 1000
MAX_SEQS = 1000


@dataclass(frozen=True, slots=True)
class RenderResult:
    view: View
    certificates: list[Certificate]
    """The decisions of this render, numbered and chained (a dry run numbers none: 0)."""


@dataclass(frozen=True, slots=True)
class ProposalOutcome:
    seq: int
    accepted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Explanation:
    item: Item
    representation: Representation
    pinned: bool
    protection: str
    certificates: list[views.StoredCertificate]


class ViewService:
    def __init__(
        self,
        store: HistoryStore,
        counter: TokenCounter,
        registry: TransformRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.counter = counter
        self.registry = registry
        self.clock = clock
        self._policies: dict[str, Policy] = {}
        self._states = views.StateCache()

    def policy_of(self, session: Session) -> Policy:
        """The session's parsed policy, parsed once per version."""
        policy = self._policies.get(session.policy_version)
        if policy is None:
            policy = parse_policy(session.policy, self.registry)
            if len(self._policies) > 256:
                self._policies.clear()
            self._policies[session.policy_version] = policy
        return policy

    async def render(
        self,
        tenant: str,
        session_id: str,
        request: ViewRequest,
        *,
        tools_json: str = "",
        force: bool = False,
        dry_run: bool = False,
    ) -> RenderResult:
        """Render a view; the decisions and the new view state are stored unless `dry_run`."""
        check_session_id(session_id)
        tools = _tools(tools_json)
        fmt = request.format.value
        async with self.store.db.write(tenant, session_id) as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            key = row["key"]
            policy = self.policy_of(session)
            out = render(
                RenderInput(
                    session=session,
                    items=items,
                    policy=policy,
                    request=request,
                    counter=self.counter,
                    registry=self.registry,
                    state=await views.load_state(conn, key, fmt, self._states),
                    now=self.clock(),
                    pins=await views.pinned(conn, key),
                    agent_proposals=await views.proposals(conn, key),
                    force=force,
                    tools=tools,
                    durable=await views.load_mutations(conn, key),
                )
            )
            certificates: list[Certificate] = []
            if not dry_run:
                await views.save_state(conn, key, fmt, out.state)
                certificates = await views.append_certificates(
                    conn, key, out.certificates, fmt, out.state.view_version, policy.version
                )
                await views.forget_proposals(conn, out.decided_proposals)
                await views.append_mutations(conn, key, out.durable)
            else:
                certificates = [
                    Certificate(0, body, out.state.view_version, policy.version, "", "") for body in out.certificates
                ]
        if not dry_run:
            self._states.put(key, fmt, out.state)  # committed now
        view = out.view
        annotate(
            session_id=session_id,
            items=len(items),
            tokens=view.total_tokens,
            budget_tokens=request.budget_tokens,
            over_budget=view.over_budget,
            decisions=len(certificates),
            view_version=view.view_version,
        )
        return RenderResult(view, certificates)

    async def pin(self, tenant: str, session_id: str, seqs: Sequence[int], *, pinning: bool = True) -> list[int]:
        """Pin (or unpin) items; returns the seqs that were asked for."""
        check_session_id(session_id)
        async with self.store.db.write(tenant, session_id) as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            _check_seqs(seqs, row["version"])
            if pinning:
                await views.pin(conn, row["key"], seqs)
            else:
                await views.unpin(conn, row["key"], seqs)
        annotate(session_id=session_id, items=len(seqs))
        return sorted(set(seqs))

    async def propose_prune(
        self, tenant: str, session_id: str, seqs: Sequence[int], reason: str
    ) -> list[ProposalOutcome]:
        """Queue the agent's prunes for the next render; protected items are refused now."""
        check_session_id(session_id)
        if len(reason) > MAX_PROPOSAL_REASON:
            raise LimitExceeded.at("reason", f"{len(reason):,} characters, over the maximum of {MAX_PROPOSAL_REASON}")
        async with self.store.db.write(tenant, session_id) as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            _check_seqs(seqs, row["version"])
            protected = protection_map(items, self.policy_of(session), await views.pinned(conn, row["key"]))
            outcomes = [
                ProposalOutcome(s, False, f"protected: {protected[s]}")
                if s in protected
                else ProposalOutcome(s, True, "queued: decided at the next render, applied at a cache-safe point")
                for s in dict.fromkeys(seqs)
            ]
            await views.propose(conn, row["key"], [o.seq for o in outcomes if o.accepted], reason)
        annotate(session_id=session_id, items=len(outcomes))
        return outcomes

    async def list_certificates(
        self, tenant: str, session_id: str, where: views.CertificateFilter, page_size: int, page_token: str
    ) -> tuple[list[views.StoredCertificate], str]:
        check_session_id(session_id)
        if page_size > 1000:
            raise LimitExceeded.at("page_size", f"{page_size} is over the maximum of 1000")
        async with self.store.db.read() as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            return await views.list_certificates(conn, row["key"], where, page_size or 100, page_token)

    async def explain(self, tenant: str, session_id: str, seq: int) -> Explanation:
        """Why item `seq` is shown the way it is now, with its certificate history."""
        check_session_id(session_id)
        async with self.store.db.read() as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            _check_seqs([seq], row["version"], field="seq")
            key = row["key"]
            pins = await views.pinned(conn, key)
            latest = await views.latest_state(conn, key)
            durable = await views.load_mutations(conn, key)
            history, _ = await views.list_certificates(conn, key, views.CertificateFilter(seq=seq), 1000, "")
        in_force = [*durable, *(latest[1].applied if latest else ())]
        return Explanation(
            item=items[seq - 1],
            representation=_representation(seq, in_force, pins),
            pinned=seq in pins,
            protection=protection_map(items, self.policy_of(session), pins).get(seq, ""),
            certificates=history,
        )

    async def verify(self, tenant: str, session_id: str) -> tuple[int, int | None]:
        """(certificates checked, the number of the first broken one or None)."""
        check_session_id(session_id)
        async with self.store.db.read() as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            chain = await views.all_certificates(conn, row["key"])
        return len(chain), verify_chain(chain)


def _representation(seq: int, in_force: Sequence[AppliedEdit], pins: frozenset[int]) -> Representation:
    for applied in in_force:
        if target_of(applied.edit) != seq or seq in pins:
            continue
        if isinstance(applied.edit, Replace):
            return Representation.REDUCED
        if isinstance(applied.edit, Remove):
            return Representation.PLACEHOLDER if applied.edit.placeholder else Representation.OMITTED
    return Representation.FULL


def _check_seqs(seqs: Sequence[int], version: int, field: str = "seqs") -> None:
    if not seqs:
        raise InvalidArgument.at(field, "name at least one item")
    if len(seqs) > MAX_SEQS:
        raise LimitExceeded.at(field, f"{len(seqs)} items, over the maximum of {MAX_SEQS}")
    for i, seq in enumerate(seqs):
        if not 1 <= seq <= version:
            where = field if field == "seq" else f"{field}[{i}]"
            raise InvalidArgument.at(where, f"no item {seq} in this session (its items are 1-{version})")


def _tools(tools_json: str) -> tuple[dict[str, Any], ...]:
    if not tools_json:
        return ()
    try:
        tools = json.loads(tools_json)
    except ValueError as exc:
        raise InvalidArgument.at("tools_json", f"not valid JSON: {exc}") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidArgument.at("tools_json", "must be a JSON array of tool objects")
    return tuple(tools)
