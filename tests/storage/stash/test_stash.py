"""Both stash providers: TTL, the per-session byte bound (least recently used out first),
scopes kept apart, whole-session deletion; Redis keys all carry a TTL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from contextd_storage.stash import Stash, Stashed, keys, scope_of
from contextd_storage.stash.memory import MemoryStash
from contextd_storage.stash.redis_stash import RedisStash

ENTRY = Stashed(7, "x" * 100)  # 102 bytes stored (the seq line and the text)


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
async def stash(request: pytest.FixtureRequest) -> AsyncIterator[Stash]:
    if request.param == "memory":
        yield MemoryStash(ttl_seconds=60, session_bytes=350)
        return
    cluster = request.param == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    made = RedisStash.from_url(url, ttl_seconds=60, session_bytes=350, cluster=cluster)
    yield made
    await made.close()


def scope() -> str:
    return scope_of("tenant", uuid.uuid4().int % 2**62)


async def test_an_entry_comes_back_with_its_seq_and_text(stash: Stash) -> None:
    here = scope()
    await stash.put(here, "a" * 16, Stashed(3, "line one\nline two é\n"))
    assert await stash.get(here, "a" * 16) == Stashed(3, "line one\nline two é\n")
    assert await stash.get(here, "b" * 16) is None
    assert await stash.get(scope(), "a" * 16) is None  # another session's scope holds nothing of it
    assert (stash.stats.hits, stash.stats.misses) == (1, 2)


async def test_a_session_over_its_bound_loses_its_least_recently_used_entries(stash: Stash) -> None:
    here, other = scope(), scope()
    await stash.put(other, "0" * 16, ENTRY)
    for handle in ("1" * 16, "2" * 16, "3" * 16):
        await stash.put(here, handle, ENTRY)
    assert await stash.get(here, "1" * 16) is not None  # used: now the most recent
    await stash.put(here, "4" * 16, ENTRY)  # 4 x 102 bytes > 350: the least recently used (2) goes
    assert [e.handle for e in await stash.manifest(here)] == ["3" * 16, "1" * 16, "4" * 16]
    assert await stash.get(here, "2" * 16) is None
    assert await stash.get(other, "0" * 16) is not None  # the bound is per session


async def test_a_whole_session_can_be_dropped(stash: Stash) -> None:
    here, other = scope(), scope()
    await stash.put(here, "1" * 16, ENTRY)
    await stash.put(here, "2" * 16, ENTRY)
    await stash.put(other, "1" * 16, ENTRY)
    await stash.delete(here, "1" * 16)
    assert await stash.get(here, "1" * 16) is None and await stash.get(here, "2" * 16) is not None
    await stash.delete(here)
    assert await stash.manifest(here) == [] and await stash.get(other, "1" * 16) is not None


async def test_entries_expire_after_their_ttl_unless_used() -> None:
    now = [0.0]
    stash = MemoryStash(ttl_seconds=10, clock=lambda: now[0])
    here = scope()
    await stash.put(here, "1" * 16, ENTRY)
    await stash.put(here, "2" * 16, ENTRY)
    now[0] = 8.0
    assert await stash.get(here, "1" * 16) is not None  # renewed: ten more seconds
    now[0] = 12.0
    assert await stash.get(here, "1" * 16) is not None
    assert await stash.get(here, "2" * 16) is None


async def test_every_redis_key_carries_a_ttl(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    stash = RedisStash(client, ttl_seconds=30)
    here = scope()
    await stash.put(here, "1" * 16, ENTRY)
    await stash.get(here, "1" * 16)
    names = [keys.entry(here, "1" * 16), keys.recency(here), keys.sizes(here), keys.total(here)]
    ttls = [await client.ttl(name) for name in names]
    assert all(0 < ttl <= 30 for ttl in ttls), ttls
    assert sorted(k.decode() for k in await client.keys(f"{keys.PREFIX}:{{{here}}}:*")) == sorted(names)
    await stash.close()


async def test_an_unreachable_redis_is_counted_never_raised() -> None:
    stash = RedisStash.from_url("redis://127.0.0.1:9/0", ttl_seconds=60, session_bytes=350)
    here = scope()
    await stash.put(here, "1" * 16, ENTRY)
    assert await stash.get(here, "1" * 16) is None
    await stash.delete(here)
    assert await stash.manifest(here) == []
    assert stash.stats.skipped >= 2 and stash.stats.writes == 0
    await stash.close()


async def test_the_redis_session_total_follows_puts_evictions_and_deletes(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    stash = RedisStash(client, ttl_seconds=60, session_bytes=350)
    here = scope()
    for handle in ("1" * 16, "2" * 16, "3" * 16, "4" * 16, "2" * 16):  # one evicted, one put again
        await stash.put(here, handle, ENTRY)
    await stash.put(here, "5" * 16, Stashed(1, "short"))
    await stash.delete(here, "3" * 16)
    sizes = [int(v) for v in (await client.hgetall(keys.sizes(here))).values()]
    assert int(await client.get(keys.total(here))) == sum(sizes) <= 350
    await stash.delete(here)
    assert await client.exists(keys.total(here), keys.sizes(here), keys.recency(here)) == 0
    await stash.close()


async def test_on_a_cluster_sessions_spread_over_the_nodes_each_in_one_slot(redis_cluster_url: str) -> None:
    from redis.cluster import RedisCluster

    stash = RedisStash.from_url(redis_cluster_url, ttl_seconds=60, session_bytes=10_000, cluster=True)
    scopes = [scope() for _ in range(24)]
    try:
        for here in scopes:
            await stash.put(here, "h1", ENTRY)
            await stash.put(here, "h2", Stashed(8, "y" * 50))
        for here in scopes:
            assert await stash.get(here, "h1") == ENTRY and len(await stash.manifest(here)) == 2
        await stash.delete(scopes[0])
        assert await stash.get(scopes[0], "h2") is None
    finally:
        await stash.close()
    cluster = RedisCluster.from_url(redis_cluster_url)
    try:
        holding = [node.name for node in cluster.get_primaries() if node.redis_connection.keys(f"{keys.PREFIX}:*")]
        assert len(holding) >= 2  # the sessions are spread: a cluster, not one node
        for here in scopes[1:]:
            session_keys = [keys.entry(here, "h1"), keys.recency(here), keys.sizes(here), keys.total(here)]
            assert len({cluster.keyslot(k) for k in session_keys}) == 1
    finally:
        # close() leaves the nodes' pools connected when the client came from a URL (their
        # sockets, left to the collector, fail whichever test it runs in): disconnected here.
        for node in cluster.get_nodes():
            node.redis_connection.connection_pool.disconnect()
        cluster.close()
