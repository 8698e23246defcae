"""Operator commands: what would be pruned and why (and applying it), and
checking a session's certificate chain. They open the database directly,
with the same settings as the server, and take the session lock like it."""

from __future__ import annotations

import asyncio

from contextd.config import Settings
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd.view_service import RenderResult, ViewService
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore


def _service(settings: Settings) -> tuple[Database, ViewService]:
    db = Database(settings.database_url, pool_size=2, lock_timeout_ms=settings.lock_timeout_ms)
    return db, ViewService(HistoryStore(db), TiktokenCounter(), TransformRegistry.default())


def prune(settings: Settings, tenant: str, session_id: str, view_format: str, budget: int, apply: bool) -> int:
    """Show every decision the session's rules would take now, ignoring the cache; with `apply`, take them."""

    async def run() -> RenderResult:
        db, service = _service(settings)
        try:
            request = ViewRequest(ViewFormat(view_format), budget_tokens=budget)
            return await service.render(tenant, session_id, request, force=True, dry_run=not apply)
        finally:
            await db.close()

    result = asyncio.run(run())
    view = result.view
    print(f"session {session_id} (tenant {tenant}), {view_format} view, policy {view.policy_version}")
    print(f"{'seq':>6}  {'decision':<8} {'level':>5}  {'rule':<16} {'reason':<14} {'tokens':>8}  rationale")
    for cert in result.certificates:
        body = cert.body
        print(
            f"{body.seq:>6}  {body.decision.value:<8} {body.level:>5}  {body.rule[:16]:<16} {body.reason[:14]:<14} "
            f"{body.tokens_removed:>8,}  {body.rationale}"
        )
    verb = "applied and certified" if apply else "would be taken (dry run: nothing stored; --apply to take them)"
    print(f"{len(result.certificates)} decisions {verb}; the view is {view.total_tokens:,} tokens")
    return 0


def verify(settings: Settings, tenant: str, session_id: str) -> int:
    """Walk a session's certificate chain; exit 1 at the first broken link."""

    async def run() -> tuple[int, int | None]:
        db, service = _service(settings)
        try:
            return await service.verify(tenant, session_id)
        finally:
            await db.close()

    checked, broken = asyncio.run(run())
    if broken is not None:
        print(f"session {session_id}: certificate chain BROKEN at certificate {broken} (of {checked})")
        return 1
    print(f"session {session_id}: {checked} certificates, chain intact")
    return 0
