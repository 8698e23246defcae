"""The certificate log: each session's decisions, numbered and hash-chained in the order they
were made (DESIGN section on certificates), stored in the caller's transaction and read back
by page or whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from contextd.engine.certificates import GENESIS, Certificate, CertificateBody, Decision, Stamp, chain
from contextd.engine.state import ControlMode
from contextd.telemetry import traced
from contextd_storage import page_tokens, schema

_LAST_CERTIFICATE = (
    select(schema.certificates.c.number, schema.certificates.c.hash)
    .where(schema.certificates.c.session_key == bindparam("key"))
    .order_by(schema.certificates.c.number.desc())
    .limit(1)
)
"""The session's last certificate: the next is numbered and chained after it."""


@traced("storage.append_certificates")
async def append_certificates(
    conn: AsyncConnection,
    key: int,
    bodies: Sequence[CertificateBody],
    stamp: Stamp,
) -> list[Certificate]:
    """Number, chain and store `bodies` after the session's last certificate."""
    if not bodies:
        return []
    c = schema.certificates
    last = (await conn.execute(_LAST_CERTIFICATE, {"key": key})).first()
    chained = chain(bodies, (last.number + 1) if last else 1, last.hash if last else GENESIS, stamp)
    now = datetime.now(UTC)
    await conn.execute(
        insert(c),
        [
            {
                "session_key": key,
                "number": cert.number,
                "seq": cert.body.seq,
                "decision": cert.body.decision.value,
                "level": cert.body.level,
                "rule": cert.body.rule,
                "reason": cert.body.reason,
                "evidence": cert.body.evidence,
                "rationale": cert.body.rationale,
                "handle": cert.body.handle,
                "protection": cert.body.protection,
                "tokens_removed": cert.body.tokens_removed,
                "placeholder_tokens": cert.body.placeholder_tokens,
                "first_divergence_tokens": cert.body.first_divergence_tokens,
                "mutation_radius_tokens": cert.body.mutation_radius_tokens,
                "cost_effect": cert.body.cost_effect,
                "control": cert.body.control.value,
                "view_format": cert.view_format,
                "view_version": cert.view_version,
                "policy_version": cert.policy_version,
                "previous_hash": cert.previous_hash,
                "hash": cert.hash,
                "created_at": now,
            }
            for cert in chained
        ],
    )
    return chained


@dataclass(frozen=True, slots=True)
class StoredCertificate:
    certificate: Certificate
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CertificateFilter:
    decision: Decision | None = None
    level: int | None = None
    seq: int | None = None
    view_version: int | None = None
    view_format: str | None = None


def _stored(row: Any) -> StoredCertificate:
    body = CertificateBody(
        seq=row.seq,
        decision=Decision(row.decision),
        level=row.level,
        rule=row.rule,
        reason=row.reason,
        evidence=row.evidence,
        rationale=row.rationale,
        handle=row.handle,
        protection=row.protection,
        tokens_removed=row.tokens_removed,
        placeholder_tokens=row.placeholder_tokens,
        first_divergence_tokens=row.first_divergence_tokens,
        mutation_radius_tokens=row.mutation_radius_tokens,
        cost_effect=row.cost_effect,
        control=ControlMode(row.control),
    )
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    stamp = Stamp(row.view_version, row.view_format, row.policy_version)
    return StoredCertificate(Certificate(row.number, body, stamp, row.previous_hash, row.hash), created)


@traced("storage.list_certificates")
async def list_certificates(
    conn: AsyncConnection, key: int, where: CertificateFilter, page_size: int, page_token: str
) -> tuple[list[StoredCertificate], str]:
    c = schema.certificates
    after = page_tokens.decode("certificate", page_token)
    query = select(c).where(c.c.session_key == key, c.c.number > after)
    if where.decision is not None:
        query = query.where(c.c.decision == where.decision.value)
    if where.level is not None:
        query = query.where(c.c.level == where.level)
    if where.seq is not None:
        query = query.where(c.c.seq == where.seq)
    if where.view_version is not None:
        query = query.where(c.c.view_version == where.view_version)
    if where.view_format is not None:
        query = query.where(c.c.view_format == where.view_format)
    rows = (await conn.execute(query.order_by(c.c.number).limit(page_size + 1))).all()
    page = [_stored(r) for r in rows[:page_size]]
    more = len(rows) > page_size
    return page, page_tokens.encode("certificate", page[-1].certificate.number) if more else ""


async def all_certificates(conn: AsyncConnection, key: int) -> list[Certificate]:
    c = schema.certificates
    rows = await conn.execute(select(c).where(c.c.session_key == key).order_by(c.c.number))
    return [_stored(r).certificate for r in rows]
