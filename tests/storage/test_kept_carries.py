"""Carries kept in a real Redis (kept_carries.py): what comes back is the carry written, over
the history it was written from, signed by this deployment and written by this code; anything
else is refused, counted, and never read as a pickle."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
import redis.asyncio

from contextd.engine.carry_pickle import dump_carry
from contextd.engine.pipeline import Carry, RenderOutput, render
from contextd.engine.state import ViewState
from contextd_storage import kept_carries
from contextd_storage.kept_carries import KeptCarries, deployment_of, key_of
from tests.helpers import counter
from tests.service.engine.test_carry_strategies import budgeted, file_reads


def carried(calls: int = 6) -> tuple[list, RenderOutput]:  # type: ignore[type-arg]
    items = file_reads(calls)
    out = render(budgeted(items, 0, len(items), ViewState(), None))
    assert out.carry is not None
    return items, out


Make = Callable[..., KeptCarries]


@pytest.fixture
async def kept(redis_url: str) -> AsyncIterator[Make]:
    """KeptCarries on the test Redis (`secret`: a new one unless given), closed after the test."""
    made: list[KeptCarries] = []

    def make(secret: str = "", fingerprint: str = "code-a") -> KeptCarries:
        client = redis.asyncio.Redis.from_url(redis_url)
        made.append(KeptCarries(client, secret or uuid.uuid4().hex, counter(), 60, fingerprint=fingerprint))
        return made[-1]

    yield make
    for carries in made:
        await carries.close()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    connection = redis.asyncio.Redis.from_url(redis_url)
    yield connection
    await connection.aclose()


async def written_all(carries: KeptCarries) -> None:
    for _ in range(500):
        if carries.idle:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writes did not end")


async def written(carries: KeptCarries, session_key: int, carry: Carry) -> None:
    assert await carries.keep_now([(session_key, carry)], seconds=30) == 1


async def test_a_kept_carry_comes_back_over_its_history(kept: Make, client: redis.asyncio.Redis) -> None:
    items, out = carried()
    carries = kept()
    await written(carries, 7, out.carry)  # type: ignore[arg-type]
    back = await carries.load(7, [*items])
    assert back is not None and back.state == out.state and back.items == out.carry.items  # type: ignore[union-attr]
    assert await carries.load(8, items) is None  # another session's: none
    assert (carries.stats.kept, carries.stats.loaded, carries.stats.missed) == (1, 1, 1)
    ttl = await client.pttl(carries._key(7))
    assert 0 < ttl <= 60_000
    await carries.drop(7)
    assert await carries.load(7, items) is None


@pytest.mark.parametrize("what", ["another secret", "another code", "altered", "another history", "another session"])
async def test_a_carry_not_of_this_deployment_code_or_history_is_refused(
    kept: Make, client: redis.asyncio.Redis, what: str
) -> None:
    items, out = carried()
    secret = uuid.uuid4().hex
    writer = kept(secret)
    await written(writer, 3, out.carry)  # type: ignore[arg-type]
    reader = kept(secret)
    history = items
    if what == "another secret":
        reader = kept()
        await client.copy(writer._key(3), reader._key(3))  # the same bytes where the other would look
    elif what == "another code":
        reader = kept(secret, fingerprint="code-b")
    elif what == "altered":
        data = bytearray(await client.hget(writer._key(3), "c"))  # type: ignore[arg-type]
        data[-5] ^= 1
        await client.hset(writer._key(3), "c", bytes(data))
    elif what == "another history":
        history = [*items[:-1], replace(items[-1], content_hash="another")]  # its last item is not the one read
    else:  # the bytes of session 3 under session 4's key: the signature names the session
        await client.copy(writer._key(3), writer._key(4))
        assert await reader.load(4, items) is None
        assert reader.stats.refused == 1
        return
    assert await reader.load(3, history) is None
    assert reader.stats.refused == 1 and reader.stats.loaded == 0


async def test_carries_let_go_of_are_written_in_the_background(kept: Make) -> None:
    items, out = carried()
    carries = kept()
    carries.keep(11, out.carry)  # type: ignore[arg-type]
    for _ in range(200):
        if carries.stats.kept:
            break
        await asyncio.sleep(0.05)
    assert carries.stats.kept == 1
    assert await carries.load(11, items) is not None


async def test_a_carry_a_render_took_over_is_not_written(kept: Make) -> None:
    items, first = carried()
    render(budgeted(items, 0, len(items), first.state, first.carry))
    carries = kept()
    assert await carries.keep_now([(5, first.carry)], seconds=30) == 0  # type: ignore[list-item]
    assert carries.stats.dropped == 1


def test_deployments_sharing_a_redis_keep_their_carries_apart() -> None:
    one, two = (deployment_of(f"secret-{n}-0123456789") for n in ("one", "two"))
    assert key_of(one, 1) != key_of(two, 1) and key_of(one, 1).endswith(":{1}")
    assert "0123456789" not in one


async def test_an_unreachable_redis_costs_a_miss_and_a_dropped_carry_never_an_error() -> None:
    items, out = carried()
    carries = KeptCarries(redis.asyncio.Redis.from_url("redis://127.0.0.1:9/0"), uuid.uuid4().hex, counter(), 60)
    try:
        assert carries.answering
        assert await carries.keep_now([(1, out.carry)], seconds=5) == 0  # type: ignore[list-item]
        assert not carries.answering  # (it rests: a render asks it nothing, and says it read nothing)
        assert await carries.load(1, items) is None
        assert (carries.stats.dropped, carries.stats.missed) == (1, 1)
    finally:
        await carries.close()


async def test_a_held_carry_is_due_again_once_keep_seconds_have_passed(kept: Make) -> None:
    items, out = carried()
    carries = kept()
    assert not carries.due(1)  # keep_seconds 0: never
    carries.keep_seconds = 0.2
    assert carries.due(1)  # never written by this process
    carries.keep_held(1, out.carry)  # type: ignore[arg-type]
    await written_all(carries)
    assert carries.stats.kept == 1 and not carries.due(1)
    await asyncio.sleep(0.25)
    assert carries.due(1)
    assert await carries.load(1, items) is not None and not carries.due(1)  # read back: as recent


async def test_a_carry_made_before_a_deletion_or_redaction_is_not_written_back(
    kept: Make, client: redis.asyncio.Redis
) -> None:
    """Whichever replica still holds it: the drop leaves a floor of durable edits the carries
    written since must reach (none, for a deleted session)."""
    items, out = carried()
    carries = kept()
    await written(carries, 21, out.carry)  # type: ignore[arg-type]
    await carries.drop(21, durable=1)  # a redaction: the session has one durable edit now
    assert await client.exists(carries._key(21)) == 0
    again = render(budgeted(items, 0, len(items), out.state, None)).carry  # made without that edit
    assert await carries.keep_now([(21, again)], seconds=30) == 0  # type: ignore[list-item]
    assert await client.exists(carries._key(21)) == 0 and carries.stats.dropped == 1
    await carries.drop(22)  # a deletion
    assert await carries.keep_now([(22, render(budgeted(items, 0, 9, ViewState(), None)).carry)], 30) == 0  # type: ignore[list-item]
    assert await client.exists(carries._key(22)) == 0


async def test_an_older_carry_does_not_replace_a_later_one(kept: Make) -> None:
    items, first = carried()
    later = render(budgeted(items, 0, len(items), first.state, None))
    carries = kept()
    await written(carries, 31, later.carry)  # type: ignore[arg-type]
    assert await carries.keep_now([(31, first.carry)], seconds=30) == 0  # type: ignore[list-item]
    back = await carries.load(31, items)
    assert back is not None and back.state.view_version == later.state.view_version > first.state.view_version


async def test_a_held_carry_waiting_behind_others_is_given_up_to_the_render_that_comes(
    kept: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread writes carries: a session's render never waits for the writes of others."""
    carries = kept()

    def slowly(*args: object, **kwargs: object) -> bytes | None:
        time.sleep(0.3)  # as a long session's pickling
        return dump_carry(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kept_carries, "dump_carry", slowly)
    outs = [carried()[1] for _ in range(3)]
    for key, out in enumerate(outs, start=1):
        carries.keep_held(key, out.carry)  # type: ignore[arg-type]
    for _ in range(500):  # the first is being written
        if carries._held[1].writing:
            break
        await asyncio.sleep(0.01)
    started = time.monotonic()
    await carries.settled(3)
    assert time.monotonic() - started < 0.25  # given up at once (waiting: behind 0.3 s writes)
    await carries.settled(1)  # being written: waited for
    await written_all(carries)
    assert carries.stats.kept == 2 and carries.stats.dropped == 1
    assert not outs[2].carry.finished.claim.taken  # type: ignore[union-attr]  # free for the render


async def test_the_writer_goes_on_after_a_carry_fails_unexpectedly(kept: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    carries = kept()
    real = carries._bytes
    calls: list[int] = []

    def failing_once(session_key: int, *args: object) -> bytes | None:
        calls.append(session_key)
        if len(calls) == 1:
            raise RecursionError("a carry too deep to pickle")
        return real(session_key, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(carries, "_bytes", failing_once)
    carries.keep(1, carried()[1].carry)  # type: ignore[arg-type]
    await written_all(carries)
    carries.keep(2, carried()[1].carry)  # type: ignore[arg-type]
    await written_all(carries)
    assert (carries.stats.dropped, carries.stats.kept) == (1, 1)


async def test_the_stop_keeps_carries_for_no_longer_than_it_is_given(
    kept: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    carries = kept()
    monkeypatch.setattr(carries, "_bytes", lambda *args: time.sleep(1.0))  # a pickling longer than the stop
    started = time.monotonic()
    assert await carries.keep_now([(1, carried()[1].carry), (2, carried()[1].carry)], seconds=0.2) == 0  # type: ignore[list-item]
    assert time.monotonic() - started < 0.9 and carries.stats.dropped == 2  # (each would take 1 s)


async def test_the_sessions_with_carries_kept_are_listed_the_most_recently_used_first(
    kept: Make, client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a starting replica reads back first (warm_start.py): the sessions a stop held, the most
    recently used first, then those it had let go of, before those kept earlier; a deleted one is
    not named; the list is bounded, the oldest going first, and goes with its TTL; each code has
    its own."""
    monkeypatch.setattr(kept_carries, "RECENT_SESSIONS", 5)
    carries = kept()
    assert await carries.recent() == []

    def carry() -> Carry:
        made = carried(2)[1].carry
        assert made is not None
        return made

    carries.keep_held(5, carry())  # written in the background, as a render's
    await written_all(carries)
    carries.keep(9, carry())  # let go of, waiting to be written as the stop comes
    assert await carries.keep_now([(k, carry()) for k in (3, 1, 2)], seconds=30) == 4  # 3 was used last
    assert await carries.recent() == [3, 1, 2, 9, 5]
    assert await carries.recent(2) == [3, 1]
    await carries.drop(1)
    assert await carries.recent() == [3, 2, 9, 5]
    assert await carries.keep_now([(k, carry()) for k in (6, 7)], seconds=30) == 2
    assert await carries.recent() == [6, 7, 3, 2, 9]  # five at most: 5, the oldest, is no longer named
    assert 0 < await client.pttl(carries._recent) <= 60_000
    assert await kept().recent() == []  # another deployment's list
    assert await kept(carries._secret.decode(), fingerprint="code-b").recent() == []  # another code's


async def test_an_unreachable_redis_lists_no_sessions() -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    carries = KeptCarries(client, uuid.uuid4().hex, counter(), fingerprint="code-a")
    try:
        assert await carries.recent() == []
    finally:
        await carries.close()


async def test_on_a_cluster_carries_are_kept_listed_read_and_dropped(redis_cluster_url: str) -> None:
    """The put and drop scripts touch one session's keys (one hash slot); the list of recent
    sessions is a key of its own, written and read by commands of their own."""
    carries = KeptCarries.from_url(redis_cluster_url, uuid.uuid4().hex, counter(), 60, cluster=True)
    try:
        made = {key: carried(2) for key in (11, 12, 13)}
        written = [(key, out.carry) for key, (_, out) in made.items() if out.carry is not None]
        assert await carries.keep_now(written, seconds=30) == 3
        assert await carries.recent() == [11, 12, 13]
        for key, (items, out) in made.items():
            back = await carries.load(key, items)
            assert back is not None and back.state == out.state
        await carries.drop(12)
        assert await carries.recent() == [11, 13] and await carries.load(12, made[12][0]) is None
        assert carries.stats.dropped == 0 and carries.stats.refused == 0
    finally:
        await carries.close()


async def test_a_carry_read_back_and_never_used_is_not_written_back(kept: Make, redis_url: str) -> None:
    """What a replica read back ahead of renders that never came is kept already: let go of, or
    held as the replica stops, it is not written again (listed anew, the replicas that follow
    would read it again). Once a render used it, it is the replica's own work, written as any."""
    items, out = carried()
    secret = uuid.uuid4().hex
    writer, reader = kept(secret), kept(secret)
    await written(writer, 41, out.carry)  # type: ignore[arg-type]
    listed = await reader.listed(10)
    back = await reader.load(41, [*items])
    assert back is not None and reader.unused(41)
    assert await reader.keep_now([(41, back)], seconds=30) == 0
    reader.keep(41, back)  # let go of
    assert reader.idle and reader.stats.kept == 0
    assert await reader.listed(10) == listed  # not listed anew
    again = await reader.load(41, [*items])
    assert again is not None
    reader.rendered(41, resumed=True)  # used by a render: the replica's own
    assert not reader.unused(41)
    assert await reader.keep_now([(41, again)], seconds=30) == 1
