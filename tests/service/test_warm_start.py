"""What a starting replica reads back (warm_start.py), decided: the most recent first, within its
time, on a render process only the sessions routed to it, a session deleted since skipped; and
what a serving replica reads back as other replicas keep it (`follow`). (The reading itself,
against Redis and a database, is in tests/integration/test_kept_carries.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from contextd.engine.errors import SessionNotFound
from contextd.engine.model import Role, TextBlock
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.render_processes import route
from contextd.view_service import ViewService
from contextd.warm_start import Warmed, follow, stop_reading, warm_start
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore, ItemCache, item_bytes
from contextd_storage.kept_carries import KeptStats
from tests.helpers import make_item


class Listed:
    """The parts of a ViewService that warm_start asks: what is listed, and a read of each."""

    def __init__(
        self, sessions: int, seconds_each: float = 0.0, gone: tuple[str, ...] = (), naming_seconds: float = 0.0
    ) -> None:
        self.carries = self.store = self
        self.sessions, self.seconds_each, self.gone = sessions, seconds_each, gone
        self.naming_seconds = naming_seconds
        self.read: list[str] = []
        self.held: list[int] = []
        self.stats = KeptStats()

    async def recent(self, count: int) -> list[int]:
        return list(range(1, self.sessions + 1))[:count]

    async def sessions_named(self, keys: list[int]) -> list[tuple[int, str, str]]:
        await asyncio.sleep(self.naming_seconds)
        return [(key, "tenant", f"s{key}") for key in keys]

    async def warm(self, key: int, tenant: str, session_id: str, prepare: Any = None) -> bool:
        if session_id in self.gone:
            raise SessionNotFound(session_id)
        await asyncio.sleep(self.seconds_each)
        self.read.append(session_id)
        return True

    def room_to_warm(self) -> bool:
        return True

    def hold_recent(self, keys: list[int]) -> None:
        self.held = list(keys)


async def test_the_most_recent_are_read_first_and_a_deleted_one_is_skipped() -> None:
    views = Listed(4, gone=("s2",))
    assert await warm_start(views, 10) == Warmed(3, 4)  # type: ignore[arg-type]
    assert views.read == ["s1", "s3", "s4"]
    assert views.held == [1, 3, 4]  # made the most recently used, the most recent last to go


async def test_reading_back_ends_with_its_time() -> None:
    views = Listed(5, seconds_each=0.2)
    started = time.monotonic()
    done = await warm_start(views, 0.5)  # type: ignore[arg-type]
    assert done.read <= 2 and time.monotonic() - started < 1.0  # five would take a second
    assert views.read == [f"s{n}" for n in range(1, done.read + 1)]
    assert views.held == list(range(1, done.read + 1))  # what was read when the time ran out
    # What the time ran out before is left to `follow`; the read under way goes on, and counts.
    assert done.looked == done.read + 1 and done.left == tuple(range(done.looked + 1, 6))
    await asyncio.sleep(0.3)
    assert views.read == [f"s{n}" for n in range(1, done.looked + 1)] and views.stats.warmed == done.looked


async def test_the_read_that_goes_on_past_the_time_ends_with_the_process() -> None:
    views = Listed(3, seconds_each=0.3)
    done = await warm_start(views, 0.1)  # type: ignore[arg-type]
    assert (done.read, done.looked, done.left) == (0, 1, (2, 3))
    stop_reading()
    await asyncio.sleep(0.4)
    assert views.read == [] and views.stats.warmed == 0


async def test_what_is_listed_is_left_to_follow_when_the_time_runs_out_before_the_sessions_are_named() -> None:
    views = Listed(3, naming_seconds=1.0)
    assert await warm_start(views, 0.2) == Warmed(0, 0, (1, 2, 3))  # type: ignore[arg-type]


async def test_a_render_process_reads_the_sessions_routed_to_it_alone() -> None:
    views = Listed(40)
    done = await warm_start(views, 10, share=(1, 3))  # type: ignore[arg-type]
    assert views.read == [f"s{n}" for n in range(1, 41) if route("tenant", f"s{n}", 3) == 1]
    assert 0 < done.read == len(views.read) < 40 and done.left == ()


def test_the_sessions_read_back_are_let_go_of_the_least_recent_first(tmp_path: Path) -> None:
    """Read the most recent first, they enter the caches in that order: held the other way round,
    the most recent session would be the first to go once the memory fills up."""
    each = item_bytes(make_item(Role.USER, TextBlock("x" * 400), seq=1))
    views = ViewService(
        HistoryStore(Database(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}"), ItemCache(3 * each)),
        TiktokenCounter(),
        TransformRegistry.default(),
    )
    for key in (1, 2, 3):  # as warm_start reads them: 1 the most recently used before the stop
        views.store.cache.put(key, [make_item(Role.USER, TextBlock("x" * 400), seq=1)])
    views.hold_recent([1, 2, 3])
    views.store.cache.put(4, [make_item(Role.USER, TextBlock("x" * 400), seq=1)])  # a session used since
    assert [views.store.cache.get(key, []) != [] for key in (1, 2, 3, 4)] == [True, True, False, True]


class Followed(Listed):
    """The parts of a ViewService that `follow` asks: the list as Redis holds it (`listing`, the
    most recent first), what the process holds or wrote or read, and whether memory is free."""

    def __init__(self, listing: list[tuple[int, float]]) -> None:
        super().__init__(0)
        self.listing = listing
        self.polls = 0
        self.holding: set[int] = set()
        self.wrote_or_read: set[int] = set()
        self.ahead: set[int] = set()  # read back, no render here since
        self.room = True
        self.slot_to_spare = True
        self.failing = False
        self.redis_down = False

    async def listed(self, count: int) -> list[tuple[int, float]]:
        self.polls += 1
        if self.failing:
            raise RuntimeError("a database that went away")
        return [] if self.redis_down else self.listing[:count]

    async def warm(self, key: int, tenant: str, session_id: str, prepare: Any = None) -> bool:
        read = await super().warm(key, tenant, session_id, prepare)
        self.holding.add(key)
        self.wrote_or_read.add(key)
        self.ahead.add(key)
        return read

    def holds_carry(self, key: int) -> bool:
        return key in self.holding

    def known(self, key: int) -> bool:
        return key in self.wrote_or_read

    def unused(self, key: int) -> bool:
        return key in self.ahead

    def room_to_warm(self) -> bool:
        return self.room

    def room_to_follow(self, tenant: str) -> bool:
        return self.room and self.slot_to_spare


async def _polled(views: Followed, times: int = 2) -> None:
    """Until `follow` has looked at the list `times` more times (each look's reads done before the
    next look)."""
    until = views.polls + times
    for _ in range(500):
        if views.polls >= until:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("follow stopped looking")


@contextlib.asynccontextmanager
async def _following(
    views: Followed, seen: list[tuple[int, float]], share: tuple[int, int] | None = None, unread: tuple[int, ...] = ()
) -> AsyncIterator[asyncio.Task[None]]:
    """`follow` running over `views` while the block runs (looking every millisecond)."""
    task = asyncio.create_task(follow(views, 0.001, seen, share, None, unread))  # type: ignore[arg-type]
    try:
        yield task
    finally:
        task.cancel()


async def test_what_others_keep_from_now_on_is_read_not_what_was_kept_before() -> None:
    before = [(2, 100.0), (1, 90.0)]
    views = Followed(list(before))
    async with _following(views, before):
        await _polled(views)
        assert views.read == []  # warm_start's to read, as the process started
        views.listing = [(3, 120.0), *before]  # a session another replica derived, kept
        await _polled(views)
        assert views.read == ["s3"]
        views.listing = [(1, 130.0), (3, 120.0), (2, 100.0)]  # kept again (a replica stopping, its keep time)
        await _polled(views)
        assert views.read == ["s3", "s1"]
        views.ahead.discard(3)  # rendered here since
        views.listing = [(3, 140.0), (1, 150.0), (2, 100.0)]  # kept again, both
        await _polled(views)
        # The one rendered here is this process's own; the other, read ahead and never used, is
        # read again: the one kept since is later, and the stored changes may not reach it.
        assert views.read == ["s3", "s1", "s1"] and views.stats.followed == 3
        assert views.held == [1]  # (each look's reads made the most recently used, as warm_start's)


async def test_what_the_start_had_no_time_for_is_read_once_it_serves_after_what_is_kept_since() -> None:
    before = [(4, 100.0), (3, 90.0), (2, 80.0), (1, 70.0)]
    views = Followed(list(before))
    views.holding = views.wrote_or_read = views.ahead = {4}  # read as the time ran out, after all
    async with _following(views, before, unread=(4, 3, 2, 1)):
        views.listing = [(5, 120.0), *before[:3]]  # one kept since; one gone from the list (its TTL)
        await _polled(views)
        assert views.read == ["s5", "s3", "s2"] and views.stats.followed == 3
        await _polled(views)
        assert views.read == ["s5", "s3", "s2"]  # each once


async def test_sessions_this_process_wrote_or_read_or_holds_are_not_read() -> None:
    views = Followed([])
    async with _following(views, []):
        views.wrote_or_read, views.holding = {1}, {2}  # (one let go of since, one held)
        views.listing = [(3, 3.0), (2, 2.0), (1, 1.0)]
        await _polled(views)
        assert views.read == ["s3"]


async def test_nothing_is_read_past_half_the_memory_and_what_was_listed_meanwhile_is_passed_over() -> None:
    views = Followed([])
    async with _following(views, []):
        views.room = False
        views.listing = [(1, 1.0)]
        await _polled(views)
        views.room = True
        await _polled(views)
        assert views.read == []  # listed while memory was short: a render of it reads it
        views.listing = [(2, 2.0), (1, 1.0)]
        await _polled(views)
        assert views.read == ["s2"]


async def test_a_render_process_follows_the_sessions_routed_to_it_alone() -> None:
    views = Followed([])
    async with _following(views, [], share=(1, 3)):
        views.listing = [(n, float(n)) for n in range(40, 0, -1)]
        await _polled(views)
        assert views.read == [f"s{n}" for n in range(40, 0, -1) if route("tenant", f"s{n}", 3) == 1]
        assert 0 < len(views.read) < 40


async def test_following_outlives_what_goes_wrong_and_a_deleted_session() -> None:
    views = Followed([])
    views.gone = ("s1",)
    async with _following(views, []) as task:
        views.failing = True
        await _polled(views)
        views.failing = False
        views.listing = [(2, 2.0), (1, 1.0)]
        await _polled(views)
        assert views.read == ["s2"] and not task.done()


async def test_what_was_listed_before_redis_stopped_answering_is_not_read_once_it_answers() -> None:
    """Redis not answering lists nothing: the next list that comes is compared with the one
    before, not taken as all new (every session kept in the last hour, read back at once)."""
    before = [(2, 2.0), (1, 1.0)]
    views = Followed(list(before))
    async with _following(views, before):
        views.redis_down = True
        await _polled(views)
        views.redis_down = False
        views.listing = [(3, 3.0), *before]
        await _polled(views)
        assert views.read == ["s3"]


class NothingKept:
    """Kept carries that say of every session that nothing of it was read ahead."""

    def unused(self, key: int) -> bool:
        return False


async def test_a_session_with_a_render_under_way_is_left_to_its_render(tmp_path: Path) -> None:
    """Reading a carry back beside a render of the session would put it in the caches under the
    render (which reads what it needs itself): `warm` leaves such a session be, reading nothing."""
    views = ViewService(
        HistoryStore(Database(f"sqlite+aiosqlite:///{tmp_path / 'never-made.db'}"), ItemCache(1 << 20)),
        TiktokenCounter(),
        TransformRegistry.default(),
        carries=NothingKept(),  # type: ignore[arg-type]
    )
    views._rendering["tenant", "s1"] += 1  # (as `render` counts a render it starts)
    assert await views.warm(1, "tenant", "s1") is False
    assert not (tmp_path / "never-made.db").exists()  # nothing read


async def test_what_renders_left_no_slot_for_is_read_at_a_later_look() -> None:
    """Reading ahead takes a render slot only when one is to spare (no render waits, and one stays
    free): what is listed meanwhile waits for a later look, not for the session to be kept again."""
    views = Followed([])
    async with _following(views, []):
        views.slot_to_spare = False
        views.listing = [(2, 2.0), (1, 1.0)]
        await _polled(views)
        assert views.read == []
        views.slot_to_spare = True
        await _polled(views)
        assert views.read == ["s2", "s1"]


async def test_a_look_that_failed_is_made_again() -> None:
    """What was listed at a look whose reading failed (the database, say) is read at the next."""
    views = Followed([])
    async with _following(views, []):
        real = views.sessions_named

        async def failing(keys: list[int]) -> list[tuple[int, str, str]]:
            raise OSError("the database went away")

        views.sessions_named = failing  # type: ignore[method-assign]
        views.listing = [(1, 1.0)]
        await _polled(views)
        views.sessions_named = real  # type: ignore[method-assign]
        await _polled(views)
        assert views.read == ["s1"]
