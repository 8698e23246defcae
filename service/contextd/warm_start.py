"""A replica that starts reads back the carries its deployment kept most recently, before it says
it serves (`--carry-warm-seconds`).

In a rolling restart each new replica takes the place of one that, as it stopped, kept in Redis
the carries of the sessions it held (kept_carries.py). Without this, the first render of each of
those sessions on any replica reads the history and the carry, at a cost that grows with the
session (about 0.4 s at 10,000 items, docs/benchmarks.md); with it, the replica does that for the
sessions most recently used before its service's health says SERVING (the process's own, service
"", answers at once), and their first renders cost what a render after one append does. The
process serves calls meanwhile (a render of a session being read waits for that read alone,
before it takes the session's lock); only its readiness waits.

Bounded three ways: by time (the setting; a read under way as it ends goes on; what the time
ran out before, `follow` reads once the process serves, unless it is off), by memory (it
stops once half of the sessions' memory is taken, so that it does not let go of what it read,
writing it back), and, on the render processes (`--render-processes`), to the sessions routed
to the process.

Read the most recent first, the sessions are then held the other way round, so that the caches
let go of the least recent of them first once the memory fills up.

Once it serves, a replica goes on reading back (`follow`, `--carry-follow-seconds`) the carries
the other replicas keep, of the sessions it holds nothing of, within the same half of its
memory and on render processes the sessions routed to each: in a rolling restart, the replicas
left read the sessions of the one that stops; a session another replica derived is read before
its next render comes here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from contextd.engine.errors import ContextdError, SessionNotFound
from contextd.engine.pipeline import Carry
from contextd.render_processes import route
from contextd.view_service import ViewService

log = logging.getLogger("contextd.warm_start")

LISTED = 1000
"""Of the sessions with carries kept, how many of the most recent are looked at (as the process
starts, and at each of `follow`'s looks)."""


def share_of(setting: str) -> tuple[int, int] | None:
    """`index/count` (`--render-share`, set on render processes) as numbers; None for ''."""
    if not setting:
        return None
    index, count = (int(part) for part in setting.split("/"))
    return index, count


@dataclass(frozen=True, slots=True)
class Warmed:
    """What `warm_start` did."""

    read: int
    """Carries read back."""
    looked: int
    """Sessions looked at."""
    left: tuple[int, ...] = ()
    """The sessions listed that its time ran out before (not the one it was reading then, which
    goes on), the most recent first: `follow` reads them once the process serves."""


async def warm_start(
    views: ViewService,
    seconds: float,
    share: tuple[int, int] | None = None,
    prepare: Callable[[Carry], None] | None = None,
) -> Warmed:
    """Read back the most recently kept carries for about `seconds` of the sessions `share` routes
    to this process, when given, calling `prepare` with each (off the event loop: the response's
    bytes of its view encoded, api/responses.py). A read under way as the time runs out goes on
    after it returns (one session's, seconds at most), and counts once it ends. A session that
    fails to be read is logged and passed over."""
    assert views.carries is not None
    started = time.monotonic()
    looked = 0
    read: list[int] = []  # the keys of the sessions read back
    listed: list[int] = []
    named: list[tuple[int, str, str]] | None = None
    under_way: tuple[int, asyncio.Future[bool]] | None = None
    left: tuple[int, ...] = ()
    try:
        async with asyncio.timeout(seconds):
            listed = await views.carries.recent(LISTED)
            named = await _named(views, listed, share)
            for key, tenant, session_id in named:
                if not views.room_to_warm():
                    break
                looked += 1
                # Shielded: the time running out ends the waiting, not the read (its carry is held
                # when it ends, not read for nothing, then again by `follow`).
                under_way = key, asyncio.ensure_future(_read_back(views, key, tenant, session_id, prepare))
                if await asyncio.shield(under_way[1]):
                    read.append(key)
                    views.carries.stats.warmed += 1
                under_way = None
    except TimeoutError:
        left = tuple(listed) if named is None else tuple(key for key, _, _ in named[looked:])
        if under_way is not None:
            key, reading = under_way
            if not reading.done():
                _READING.add(reading)
                reading.add_done_callback(functools.partial(_read_late, views))
            elif _was_read(reading):  # (it ended as the time ran out)
                read.append(key)
                views.carries.stats.warmed += 1
    except Exception as exc:  # a start-up's shortcut: whatever went wrong, the replica serves without it
        log.warning("the kept carries were not read back as the server started: %r", exc)
    # Read most recent first, they would be let go of in that order too under the memory's
    # bound: the most recent is made the most recently used.
    views.hold_recent(read)
    if looked:
        log.info(
            "read back the kept carries of %d of the %d sessions used most recently in %.1f s",
            len(read),
            looked,
            time.monotonic() - started,
        )
    return Warmed(len(read), looked, left)


_READING: set[asyncio.Future[bool]] = set()
"""Reads that went on after warm_start's time ran out (held until they end)."""


def stop_reading() -> None:
    """Cancel the reads that went on after warm_start's time ran out (the process stops): those of
    the calling event loop (a process may run servers on loops of their own: tests)."""
    loop = asyncio.get_running_loop()
    for reading in list(_READING):
        if reading.get_loop() is loop:
            reading.cancel()


def _read_late(views: ViewService, reading: asyncio.Future[bool]) -> None:
    """A read that went on after warm_start's time ran out has ended: counted as warm_start's."""
    _READING.discard(reading)
    if _was_read(reading) and views.carries is not None:
        views.carries.stats.warmed += 1


def _was_read(reading: asyncio.Future[bool]) -> bool:
    """Whether an ended `_read_back` read its session's carry (what else went wrong, logged)."""
    if reading.cancelled():
        return False
    if (exc := reading.exception()) is not None:
        log.warning("the kept carries were not read back as the server started: %r", exc)
        return False
    return reading.result()


async def follow(
    views: ViewService,
    every_seconds: float,
    seen: Sequence[tuple[int, float]],
    share: tuple[int, int] | None = None,
    prepare: Callable[[Carry], None] | None = None,
    unread: Sequence[int] = (),
) -> None:
    """Every `every_seconds`, read back the carries other replicas kept since the last look (the
    deployment's list in Redis names each session with when it was used, listed again whenever
    its carry is kept again), of the sessions this process holds nothing of and never kept or
    read (or read ahead and not rendered since), while half of its sessions' memory is free and
    a render slot is to spare (no render waits for one, and one stays free: those listed are
    then read at a later look) (`--carry-follow-seconds`); `seen`: the list as it stood before,
    left to `warm_start`, but for `unread`, those of it `warm_start` ran out of time for (still
    listed, after what is listed anew). Runs until cancelled.

    A session's renders go to any replica: each replica's first render of a session would read
    its history and carry, at a cost that grows with the session. A replica that follows reads
    them as they are kept: after a render that derived a session, again every
    `--carry-keep-seconds` while a replica renders it, and as a replica stops (a rolling restart:
    the replicas left read the sessions of the one that stops). Its first render then skips that
    reading (about two renders after an append, docs/benchmarks.md). The cost is the same reading,
    moved off the render, and memory on every replica for the sessions it may never render (with
    routing that keeps a session on one replica, turn it off)."""
    assert views.carries is not None
    carries = views.carries
    last = dict(seen)
    # Listed, not read yet: warm_start's time ran out (not those it read after all), the render
    # slots were wanted.
    left = [key for key in unread if not (views.holds_carry(key) or carries.known(key))]
    while True:
        await asyncio.sleep(every_seconds)
        try:
            listed = await carries.listed(LISTED)
            if not listed:  # (Redis did not answer: what it lists when it does is compared with the last)
                continue
            now = dict(listed)
            fresh = [key for key, used in listed if last.get(key) != used]
            fresh = [k for k in dict.fromkeys((*fresh, *left)) if k in now]  # (and those left, still listed)
            # Not those this process renders or did, nor those it let go of; those it read ahead
            # of their renders, and none used since, again (a later carry, the stored changes
            # may no longer lead on from the one held).
            fresh = [k for k in fresh if carries.unused(k) or not (views.holds_carry(k) or carries.known(k))]
            left = await _follow(views, fresh, share, prepare) if fresh and views.room_to_warm() else []
            last = now  # (once read: a look that failed is made again at the next)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a shortcut: whatever went wrong, renders read what they need
            log.warning("the carries other replicas kept were not followed: %r", exc)


async def _follow(
    views: ViewService,
    keys: Sequence[int],
    share: tuple[int, int] | None,
    prepare: Callable[[Carry], None] | None,
) -> list[int]:
    """Read back what `keys` name, the most recent first, while there is room; returns those left
    for the next look because the render slots were wanted (none, once memory is short)."""
    assert views.carries is not None
    started = time.monotonic()
    named = await _named(views, keys, share)
    read: list[int] = []
    left: list[int] = []
    for at, (key, tenant, session_id) in enumerate(named):
        if not views.room_to_warm():
            break
        if not views.room_to_follow(tenant):
            left = [k for k, _, _ in named[at:]]
            break
        if await _read_back(views, key, tenant, session_id, prepare):
            read.append(key)
            views.carries.stats.followed += 1
    views.hold_recent(read)  # (as warm_start: the most recent the last to go)
    if read:
        log.info(
            "read back the carries other replicas kept of %d sessions in %.1f s", len(read), time.monotonic() - started
        )
    return left


async def _named(views: ViewService, keys: Sequence[int], share: tuple[int, int] | None) -> list[tuple[int, str, str]]:
    """The sessions `keys` name that are still live, as (key, tenant, id) in that order; of them,
    on a render process (`share`), those routed to it."""
    named = await views.store.sessions_named(keys) if keys else []
    if share is None:
        return named
    return [n for n in named if route(n[1], n[2], share[1]) == share[0]]


async def _read_back(
    views: ViewService, key: int, tenant: str, session_id: str, prepare: Callable[[Carry], None] | None
) -> bool:
    """`views.warm` of one session; False, logged, when it could not be read (deleted since it was
    listed, or the database or Redis failed)."""
    try:
        return await views.warm(key, tenant, session_id, prepare)
    except SessionNotFound:
        return False
    except (ContextdError, SQLAlchemyError, OSError) as exc:
        log.warning("the kept carry of session %d was not read back: %r", key, exc)
        return False
