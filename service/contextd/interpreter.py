"""The interpreter tuned for a server whose renders run on threads beside the event loop.

Three things let one tenant's render stall every call of a replica even off
the loop, measured with bench/stall.py and bench/held_lock.py (docs/benchmarks.md):

* Collections of the older generations. A replica's heap holds what its recent
  sessions need (decoded items, the engine's memos, carries): millions of objects
  for a few sessions of 10,000 items. A full collection scans all of them holding
  the interpreter lock, 130-200 ms each, during which no call moves; a collection
  of the middle generation scans what outlived the last ten young collections,
  50-90 ms at a time during a 20,000-item first render. So the survivors of every
  collection are frozen (`gc.freeze`): the older generations stay empty, and each
  collection scans only what was allocated since the one before (at most 9-15 ms
  during that render, bench/held_lock.py). A frozen object is still freed when its
  last reference goes; only reference cycles that outlive a collection and become
  garbage later are kept. Those are few: in bench/memory.py's run the middle and
  full collections found 7,500 objects of garbage in 8 minutes, and RSS ended the
  same with every survivor frozen as with only a full collection's. To free them,
  everything is unfrozen and collected once in full (one pause as long as the
  heap: 0.3 s at 560,000 objects, 1.0 s at 1.5 million), but only once the frozen
  objects have grown by a quarter (`REFREEZE_GROWTH`, looked at every
  `REFREEZE_SECONDS`): a replica whose heap holds steady is not paused for it.
* The interpreter's switch interval. A waiting thread gets the lock after at
  most this long; a call on the loop needs it several times, so the default
  5 ms adds up behind a busy render thread. At 0.2 ms another tenant's call
  waits under 20 ms at p99 while a 10,000-item session renders back to back
  (17-19 ms, against 22-23 ms at 1 ms; the renders themselves got no slower).
* Calls that let the lock go for a moment and take it straight back, made thousands of
  times a second by a render's thread (RE2's matches, tiktoken's encoding). CPython forces
  a switch only after an interval in which no thread took the lock, so the loop's thread
  waits as long as they go on. Those calls make way for it (contextd/engine/handoff.py)
  once `tune` has named it.

And one that makes every render of a long session slower: young collections.
The interpreter collects its youngest generation once 700 more containers
have been allocated than freed, visiting every young container's references. A render of a
10,000-item session allocates few containers but large ones (the carry's maps
and lists, each as long as the session), so such a collection lands in most
renders and visits millions of references: 11 ms each, measured at 10,000
items, a fifth of the render. The youngest generation is collected every
`YOUNG_THRESHOLD` instead, by when most of those containers are
gone (freed by their reference counts, never visited); what waits longer is
garbage in reference cycles, a few MB at most.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from typing import Any

from contextd.engine import handoff

log = logging.getLogger("contextd.interpreter")

SWITCH_INTERVAL_SECONDS = 0.0002
REFREEZE_SECONDS = 900.0
REFREEZE_GROWTH = 1.25
"""A full collection once the frozen objects number this many times those the last one left,
looked at every `REFREEZE_SECONDS` (CPython's own rule for its full collections: a quarter more)."""
YOUNG_THRESHOLD = 20_000


def tune() -> None:
    """Freeze the survivors of every collection from now on, collect the young less often,
    shorten the switch interval, and make the calling thread (the event loop's) the one other
    threads make way for."""
    handoff.start(threading.get_ident())
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def untune() -> None:
    """Back to the interpreter's defaults (for tests and embedders)."""
    handoff.stop()
    if _freeze_survivors in gc.callbacks:
        gc.callbacks.remove(_freeze_survivors)
    gc.unfreeze()
    gc.set_threshold(700, *gc.get_threshold()[1:])
    sys.setswitchinterval(0.005)


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()


def collect_in_full() -> int:
    """Unfreeze everything and collect it: what frozen cycles became garbage is freed.
    Returns the objects collected. One full pause: call it seldom."""
    started = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()  # freezes the survivors again, through the callback
    log.info("full collection: %d objects freed in %.0f ms", collected, (time.perf_counter() - started) * 1000)
    return collected


async def maintain(every_seconds: float = REFREEZE_SECONDS, growth: float = REFREEZE_GROWTH) -> None:
    """Every `every_seconds`, until cancelled: `collect_in_full` if the frozen objects have grown
    `growth` times since the last one (or since the start). A heap that holds steady is never
    paused for a full scan; frozen garbage counts toward the growth as any other object does."""
    left = gc.get_freeze_count()
    while True:
        await asyncio.sleep(every_seconds)
        if gc.get_freeze_count() > left * growth:
            collect_in_full()
            left = gc.get_freeze_count()
