"""Per-tenant rates and quotas: counted in Redis across replicas, per replica while Redis
is down, and the stored bytes the database counts."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from contextd.admission import Admission
from contextd.config import ConfigError, Settings, TenantLimit, TenantLimits
from contextd.engine.errors import QuotaExceeded, RateLimited


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"  # a window of its own in the shared Redis


async def _admitted(admission: Admission, tenant: str, calls: int) -> int:
    """How many of `calls` calls in a row the tenant's rate admits."""
    admitted = 0
    for _ in range(calls):
        try:
            await admission.admit_call(tenant)
            admitted += 1
        except RateLimited:
            pass
    return admitted


async def test_calls_past_the_rate_are_refused_with_the_wait(redis_url: str) -> None:
    admission = Admission(TenantLimits(TenantLimit(requests_per_second=5)), redis_url)
    tenant = _tenant()
    try:
        admitted = await _admitted(admission, tenant, 8)
        # A sliding window: crossing a second's edge mid-burst may let one more through.
        assert admitted in (5, 6)
        with pytest.raises(RateLimited) as refused:
            await admission.admit_call(tenant)
        wait = refused.value.retry_after_ms
        assert 0 < wait <= 1000
        assert refused.value.metadata == {"limit": "5", "per": "calls", "retry_after_ms": str(wait)}
        await admission.admit_call(_tenant())  # another tenant is not slowed
        await asyncio.sleep(2.1)  # two windows on: the count has slid away
        await admission.admit_call(tenant)
    finally:
        await admission.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
async def test_replicas_share_a_tenant_s_rate_through_redis(cluster: bool, request: pytest.FixtureRequest) -> None:
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    limits = TenantLimits(TenantLimit(requests_per_second=6))
    replicas = [Admission(limits, url, redis_cluster=cluster) for _ in range(3)]
    tenant = _tenant()
    admitted = 0
    for n in range(12):
        admitted += await _admitted(replicas[n % 3], tenant, 1)
    for replica in replicas:
        await replica.close()
    assert admitted in (6, 7)  # each replica on its own would admit all 12


async def test_without_redis_each_replica_counts_on_its_own_and_no_call_fails_for_it() -> None:
    # Nothing listens on port 1: every Redis call fails at once.
    admission = Admission(TenantLimits(TenantLimit(requests_per_second=3)), "redis://127.0.0.1:1/0")
    assert await _admitted(admission, _tenant(), 6) in (3, 4)
    await admission.close()


async def test_appended_bytes_have_a_rate_and_a_batch_over_a_second_s_worth_is_a_quota() -> None:
    admission = Admission(TenantLimits(TenantLimit(append_bytes_per_second=1000)))
    tenant = _tenant()
    await admission.admit_append(tenant, 600)
    with pytest.raises(RateLimited) as refused:
        await admission.admit_append(tenant, 600)
    assert refused.value.metadata["per"] == "bytes appended"
    with pytest.raises(QuotaExceeded) as too_big:
        await admission.admit_append(tenant, 1001)
    assert "send smaller batches" in too_big.value.message


async def test_stored_bytes_are_read_from_the_database_and_counted_between_reads() -> None:
    stored = {"t": 700}
    reads: list[str] = []

    async def stored_bytes(tenant: str) -> int:
        reads.append(tenant)
        return stored[tenant]

    now = [0.0]
    admission = Admission(TenantLimits(TenantLimit(stored_bytes=1000)), stored_bytes=stored_bytes, clock=lambda: now[0])
    await admission.admit_append("t", 200)
    admission.appended("t", 200)  # 900 now, by this replica's count
    with pytest.raises(QuotaExceeded) as refused:
        await admission.admit_append("t", 200)
    assert "stores 900 bytes" in refused.value.message and refused.value.metadata == {"limit": "1000"}
    assert reads == ["t"]
    stored["t"] = 100  # sessions deleted elsewhere: seen at the next read
    now[0] += 2.5
    await admission.admit_append("t", 200)
    assert reads == ["t", "t"]


def test_limits_per_tenant_override_the_defaults() -> None:
    settings = Settings(tenant_requests_per_second=100, tenant_limits='{"team-a": {"requests_per_second": 5}}')
    limits = settings.limits_of_tenants()
    assert limits.of("team-a") == TenantLimit(requests_per_second=5)
    assert limits.of("team-b") == TenantLimit(requests_per_second=100)
    for bad, words in [
        ("[1]", "a JSON object"),
        ('{"team-a": {"requests": 5}}', "an object of"),
        ('{"team-a": {"stored_bytes": -1}}', "0 or more"),
        ('{"bad tenant": {}}', "is not a tenant"),
        ("{", "is not JSON"),
    ]:
        with pytest.raises(ConfigError, match=words):
            Settings(tenant_limits=bad).validate()
    with pytest.raises(ConfigError, match="positive or 0"):
        Settings(tenant_stored_bytes=-5).validate()
