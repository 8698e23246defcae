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

Bounded three ways: by time (the setting; a read under way as it ends finishes), by memory (it
stops once half of the sessions' memory is taken, so that it does not let go of what it read,
writing it back), and, on the render processes (`--render-processes`), to the sessions routed
to the process.

Read the most recent first, the sessions are then held the other way round, so that the caches
let go of the least recent of them first once the memory fills up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from contextd.engine.errors import ContextdError, SessionNotFound
from contextd.engine.pipeline import Carry
from contextd.render_processes import route
from contextd.view_service import ViewService

log = logging.getLogger("contextd.warm_start")

LISTED = 1000
"""Of the sessions with carries kept, how many of the most recent are looked at."""


def share_of(setting: str) -> tuple[int, int] | None:
    """`index/count` (`--render-share`, set on render processes) as numbers; None for ''."""
    if not setting:
        return None
    index, count = (int(part) for part in setting.split("/"))
    return index, count


async def warm_start(
    views: ViewService,
    seconds: float,
    share: tuple[int, int] | None = None,
    prepare: Callable[[Carry], None] | None = None,
) -> tuple[int, int]:
    """Read back the most recently kept carries for about `seconds` (a read under way when they
    end finishes on its thread: one session's, seconds at most) of the sessions `share` routes
    to this process, when given, calling `prepare` with each (off the event loop: the response's
    bytes of its view encoded, api/responses.py); returns (carries read, sessions looked at). A
    session that fails to be read is logged and passed over."""
    assert views.carries is not None
    started = time.monotonic()
    looked = 0
    read: list[int] = []  # the keys of the sessions read back
    try:
        async with asyncio.timeout(seconds):
            keys = await views.carries.recent(LISTED)
            named = await views.store.sessions_named(keys) if keys else []
            if share is not None:
                named = [n for n in named if route(n[1], n[2], share[1]) == share[0]]
            for key, tenant, session_id in named:
                if not views.room_to_warm():
                    break
                looked += 1
                try:
                    if await views.warm(key, tenant, session_id, prepare):
                        read.append(key)
                except SessionNotFound:  # deleted since it was listed
                    continue
                except (ContextdError, SQLAlchemyError, OSError) as exc:
                    log.warning("the kept carry of session %d was not read back: %r", key, exc)
    except TimeoutError:
        pass
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
    return len(read), looked
