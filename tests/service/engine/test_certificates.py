"""The certificate chain: every certificate's hash covers its body, where it
was decided (view version, format, policy) and the hash before it."""

from __future__ import annotations

from dataclasses import replace

from contextd.engine.certificates import GENESIS, CertificateBody, Decision, Stamp, chain, verify_chain
from contextd.engine.state import ControlMode


def body(seq: int) -> CertificateBody:
    return CertificateBody(
        seq=seq,
        decision=Decision.PRUNE,
        level=2,
        rule="r",
        reason="superseded",
        evidence=f"superseded by {seq + 10}",
        rationale="the cache is cold",
        handle="0123456789abcdef",
        protection="",
        tokens_removed=100,
        placeholder_tokens=20,
        first_divergence_tokens=0,
        mutation_radius_tokens=0,
        cost_effect=0.0,
        control=ControlMode.RULE,
    )


STAMP = Stamp(view_version=1, view_format="openai_chat", policy_version="p1")


def test_a_chain_built_in_steps_verifies() -> None:
    first = chain([body(4), body(6)], 1, GENESIS, STAMP)
    second = chain([body(8)], 3, first[-1].hash, replace(STAMP, view_version=2))
    assert verify_chain([*first, *second]) is None
    assert [c.number for c in (*first, *second)] == [1, 2, 3]


def test_any_change_breaks_the_chain_where_it_was_made() -> None:
    certs = chain([body(4), body(6), body(8)], 1, GENESIS, STAMP)
    for changed in (
        replace(certs[1], body=replace(certs[1].body, rationale="edited")),
        replace(certs[1], stamp=replace(STAMP, view_format="anthropic_messages")),
        replace(certs[1], stamp=replace(STAMP, policy_version="p2")),
    ):
        assert verify_chain([certs[0], changed, certs[2]]) == 2
    assert verify_chain([certs[0], certs[2]]) == 3  # one taken out of the middle
    assert verify_chain([certs[1], certs[0], certs[2]]) == 2
