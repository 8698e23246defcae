"""The view states and carries a server process keeps between renders, by session (bounded
by bytes and a number of sessions)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from contextd.engine.pipeline import Carry
from contextd.engine.state import ViewState


class StateCache:
    """The view states this process saved or read last, by session, each with the engine's carry
    of the render that made it (when this process made it).

    A render reads only the stored version numbers when it holds the state of that version
    already: no JSON to parse, and the same objects as before, which keeps the engine's memos
    (rendered messages, handles) warm; with the carry, it works only on what was appended
    since. When another replica rendered since, the changes it stored bring the state (and the
    carry) up to date.

    Bounded by the bytes it holds (a state's estimated from its stored size, a carry's by
    `Carry.footprint`) and by a number of sessions; the least recently used session goes
    first, state and carry, and is read again from the database when next used.
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, max_states: int = 4096) -> None:
        self.max_bytes = max_bytes
        self.max_states = max_states
        self._entries: OrderedDict[int, tuple[ViewState, Carry | None, int]] = OrderedDict()
        self._held = 0
        self.on_evict: Callable[[int, Carry], None] | None = None
        """Told of each carry let go of to stay in the bounds (to keep it elsewhere: kept_carries.py)."""

    @property
    def held_bytes(self) -> int:
        return self._held

    def get(self, key: int, version: int) -> ViewState | None:
        state = self.latest(key)
        return state if state is not None and state.view_version == version else None

    def latest(self, key: int) -> ViewState | None:
        """The last state of the session this process saved, whatever its version."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def holds_carry(self, key: int) -> bool:
        found = self._entries.get(key)
        return found is not None and found[1] is not None

    def carries(self) -> list[tuple[int, Carry]]:
        """The carries held, the most recently used first."""
        return [(key, carry) for key, (_, carry, _) in reversed(self._entries.items()) if carry is not None]

    def carry(self, key: int, state: ViewState) -> Carry | None:
        """The carry of the render that produced `state`, if it is still held."""
        found = self._entries.get(key)
        return found[1] if found is not None and found[1] is not None and found[1].state is state else None

    def put(
        self,
        key: int,
        state: ViewState,
        carry: Carry | None = None,
        state_bytes: int | None = None,
        carry_bytes: int | None = None,
    ) -> None:
        """Remember a state once its transaction has committed (never before: a rolled-back
        version number could be committed later, by another render, with other content).
        `state_bytes`, `carry_bytes`: what the state and the carry take in memory, when the
        caller knows better than `estimated_bytes` or has weighed the carry already (off the
        event loop: a 10,000-item carry takes a third of a millisecond to weigh)."""
        held = self._entries.pop(key, None)
        if held is not None:
            self._held -= held[2]
        if carry_bytes is None:
            carry_bytes = carry.footprint() if carry is not None else 0
        weight = (state_bytes if state_bytes is not None else estimated_bytes(state)) + carry_bytes
        self._entries[key] = (state, carry, weight)
        self._held += weight
        while len(self._entries) > 1 and (self._held > self.max_bytes or len(self._entries) > self.max_states):
            gone, (_, gone_carry, evicted) = self._entries.popitem(last=False)
            self._held -= evicted
            if gone_carry is not None and self.on_evict is not None:
                self.on_evict(gone, gone_carry)


def estimated_bytes(state: ViewState) -> int:
    """About what a view state takes in memory, from its shape: each edit in force with what it
    shows, each segment sent (on bench/scale.py's sessions a decoded state takes about 2.2 KB
    an edit in force, tracemalloc)."""
    segments = sum(len(r.segments) for r in state.renders.values())
    return 2000 + 2200 * len(state.applied) + 120 * segments + 300 * len(state.pending) + 100 * len(state.decided)


MEMORY_PER_STORED_BYTE = 2.5
"""A decoded view state takes about 2.4 times the bytes of its JSON (tracemalloc, bench/scale.py's
sessions at 2,000 items)."""
