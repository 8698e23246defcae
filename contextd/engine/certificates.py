"""Certificates: one per decision on a candidate (DESIGN principle 3).

The engine produces the body of each certificate; storage numbers them,
stamps the view and policy versions, and chains them per session: each
certificate's hash covers its body and the previous certificate's hash, so
editing or deleting one breaks every link after it (`verify_chain`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum

from contextd.engine.codec import canonical_json
from contextd.engine.state import ControlMode

GENESIS = "0" * 64


class Decision(StrEnum):
    KEEP = "keep"
    """A proposal was refused: the item is protected."""
    PRUNE = "prune"
    """A reducing edit (replace, remove) was applied."""
    DEFER = "defer"
    """Eligible, but applying it now would cost more than it saves; it waits."""
    ABSTAIN = "abstain"
    """Safety could not be established; nothing was done."""
    APPLY = "apply"
    """An edit that removes nothing (insert, reorder, request patch) was applied."""


@dataclass(frozen=True, slots=True)
class CertificateBody:
    seq: int
    """The item decided on (0 for edits that target none)."""
    decision: Decision
    level: int
    rule: str
    reason: str
    """The proposal's reason code (``duplicate``, ``superseded``, ``agent`` ...)."""
    evidence: str
    rationale: str
    """Why this decision: the protection, the missing evidence, or the cache arithmetic."""
    handle: str
    """Gets the original back (empty when nothing was removed)."""
    protection: str
    tokens_removed: int
    placeholder_tokens: int
    first_divergence_tokens: int
    mutation_radius_tokens: int
    cost_effect: float
    """Estimated dollars saved over the expected calls by applying now (negative: a cost)."""
    control: ControlMode


@dataclass(frozen=True, slots=True)
class Certificate:
    number: int
    """1, 2, 3 ... within the session."""
    body: CertificateBody
    view_version: int
    policy_version: str
    previous_hash: str
    hash: str


def _hashed(number: int, body: CertificateBody, view_version: int, policy_version: str, previous: str) -> str:
    fields = asdict(body) | {"number": number, "view_version": view_version, "policy_version": policy_version}
    return hashlib.sha256(previous.encode() + canonical_json(fields)).hexdigest()


def chain(
    bodies: Iterable[CertificateBody], first_number: int, previous_hash: str, view_version: int, policy_version: str
) -> list[Certificate]:
    """Number and link `bodies` after the certificate with `previous_hash`."""
    out = []
    for number, body in enumerate(bodies, start=first_number):
        digest = _hashed(number, body, view_version, policy_version, previous_hash)
        out.append(Certificate(number, body, view_version, policy_version, previous_hash, digest))
        previous_hash = digest
    return out


def verify_chain(certificates: Iterable[Certificate]) -> int | None:
    """The number of the first certificate whose link is broken, or None when the chain is whole."""
    previous, expected = GENESIS, 1
    for cert in certificates:
        recomputed = _hashed(cert.number, cert.body, cert.view_version, cert.policy_version, previous)
        if cert.number != expected or cert.previous_hash != previous or cert.hash != recomputed:
            return cert.number
        previous, expected = cert.hash, expected + 1
    return None
