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

    @property
    def net_tokens_removed(self) -> int:
        """Tokens a PRUNE took out of the view, less its placeholder's; 0 for other decisions."""
        return max(0, self.tokens_removed - self.placeholder_tokens) if self.decision is Decision.PRUNE else 0


@dataclass(frozen=True, slots=True)
class Certificate:
    number: int
    """1, 2, 3 ... within the session."""
    body: CertificateBody
    stamp: Stamp
    previous_hash: str
    hash: str

    @property
    def view_version(self) -> int:
        return self.stamp.view_version

    @property
    def policy_version(self) -> str:
        return self.stamp.policy_version

    @property
    def view_format(self) -> str:
        return self.stamp.view_format


@dataclass(frozen=True, slots=True)
class Stamp:
    """Where a decision was made: the render (its view version and format) and the policy."""

    view_version: int
    view_format: str
    policy_version: str


def _hashed(number: int, body: CertificateBody, stamp: Stamp, previous: str) -> str:
    fields = asdict(body) | asdict(stamp) | {"number": number}
    return hashlib.sha256(previous.encode() + canonical_json(fields)).hexdigest()


def chain(bodies: Iterable[CertificateBody], first_number: int, previous_hash: str, stamp: Stamp) -> list[Certificate]:
    """Number and link `bodies` after the certificate with `previous_hash`."""
    out = []
    for number, body in enumerate(bodies, start=first_number):
        digest = _hashed(number, body, stamp, previous_hash)
        out.append(Certificate(number, body, stamp, previous_hash, digest))
        previous_hash = digest
    return out


def verify_chain(certificates: Iterable[Certificate]) -> int | None:
    """The number of the first certificate whose link is broken, or None when the chain is whole."""
    previous, expected = GENESIS, 1
    for cert in certificates:
        recomputed = _hashed(cert.number, cert.body, cert.stamp, previous)
        if cert.number != expected or cert.previous_hash != previous or cert.hash != recomputed:
            return cert.number
        previous, expected = cert.hash, expected + 1
    return None
