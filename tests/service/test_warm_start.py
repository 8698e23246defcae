"""What a starting replica reads back (warm_start.py), decided: the most recent first, within its
time, on a render process only the sessions routed to it, a session deleted since skipped.
(The reading itself, against Redis and a database, is in tests/integration/test_kept_carries.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from contextd.engine.errors import SessionNotFound
from contextd.engine.model import Role, TextBlock
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.render_processes import route
from contextd.view_service import ViewService
from contextd.warm_start import warm_start
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore, ItemCache, item_bytes
from tests.helpers import make_item


class Listed:
    """The parts of a ViewService that warm_start asks: what is listed, and a read of each."""

    def __init__(self, sessions: int, seconds_each: float = 0.0, gone: tuple[str, ...] = ()) -> None:
        self.carries = self.store = self
        self.sessions, self.seconds_each, self.gone = sessions, seconds_each, gone
        self.read: list[str] = []
        self.held: list[int] = []

    async def recent(self, count: int) -> list[int]:
        return list(range(1, self.sessions + 1))[:count]

    async def sessions_named(self, keys: list[int]) -> list[tuple[int, str, str]]:
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
    assert await warm_start(views, 10) == (3, 4)  # type: ignore[arg-type]
    assert views.read == ["s1", "s3", "s4"]
    assert views.held == [1, 3, 4]  # made the most recently used, the most recent last to go


async def test_reading_back_ends_with_its_time() -> None:
    views = Listed(5, seconds_each=0.2)
    started = time.monotonic()
    warmed, _ = await warm_start(views, 0.5)  # type: ignore[arg-type]
    assert warmed <= 2 and time.monotonic() - started < 1.0  # five would take a second
    assert views.read == [f"s{n}" for n in range(1, warmed + 1)]
    assert views.held == list(range(1, warmed + 1))  # what was read when the time ran out


async def test_a_render_process_reads_the_sessions_routed_to_it_alone() -> None:
    views = Listed(40)
    warmed, _ = await warm_start(views, 10, share=(1, 3))  # type: ignore[arg-type]
    assert views.read == [f"s{n}" for n in range(1, 41) if route("tenant", f"s{n}", 3) == 1]
    assert 0 < warmed == len(views.read) < 40


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
