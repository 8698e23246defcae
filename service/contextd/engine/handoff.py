"""A thread beside the event loop lets the loop's thread in between brief calls that release
the interpreter lock.

CPython hands the lock to a waiting thread by force only when no thread took it during a
whole switch interval (`sys.getswitchinterval`). A C call that lets the lock go for a moment
and takes it straight back (an RE2 match, tiktoken's encoding) counts as a switch, yet the
waiting thread, woken a few microseconds later, finds the lock taken again. So a thread that
makes such calls thousands of times a second keeps the lock to itself for as long as it
goes on: while a 20,000-item session's first render read its outputs on a thread, the event
loop's thread got the lock back 30-110 ms at a time (bench/held_lock.py), and every other
tenant's call waited as long.

`make_way`, called before such a call, sleeps once `HANDOFF_SECONDS` have passed since this
thread last did: the lock is then free for longer than a waiting thread takes to wake, and
it takes it. It does nothing until `start` names the loop's thread (the server does, as it
tunes the interpreter: contextd/interpreter.py), and nothing on that thread.
"""

from __future__ import annotations

import threading
from time import perf_counter, sleep

HANDOFF_SECONDS = 0.002
"""How long a thread may keep the lock through brief releases: a call on the loop waits at
most about this long each time it needs the lock back."""

_PAUSE_SECONDS = 0.00001
"""Asked of `sleep`, which takes about 90 µs at the least on the machine measured:
long enough for the woken thread to take the lock, and under 5% of `HANDOFF_SECONDS`."""

_loop_thread: int | None = None
_last = threading.local()


def start(loop_thread: int) -> None:
    """Make way, from now on, for `loop_thread` (its `threading.get_ident()`)."""
    global _loop_thread
    _loop_thread = loop_thread


def stop() -> None:
    global _loop_thread
    _loop_thread = None


def make_way() -> None:
    """Let a thread waiting for the interpreter lock take it, if this thread has kept it
    `HANDOFF_SECONDS` since it last did. Call it before a brief call that releases the lock."""
    if _loop_thread is None:
        return
    if perf_counter() - getattr(_last, "at", -HANDOFF_SECONDS) < HANDOFF_SECONDS:
        return
    if threading.get_ident() == _loop_thread:
        return
    sleep(_PAUSE_SECONDS)
    _last.at = perf_counter()
