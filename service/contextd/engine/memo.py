"""Remembering pure results per object, across renders.

Items never change, and the representations edits give them are kept from
render to render, so what is derived from them (a handle, a rendered
message, searchable text) can be computed once. The memo is keyed by the
identity of the objects it was computed from and holds them, so an id is
never reused while its result is remembered.

Every memo of the process draws on one byte budget (`set_memo_bytes`; the
server sets it from `--memo-bytes`), with the caches of results by content
beside them (`Budgeted`): each result is weighed when it is
remembered (`weigh`: an estimate of its size, the objects it was computed
from left out, as the caches that hold them count those), and past the
budget the largest memo gives up its oldest results. A memo is also bounded
by a number of results. A result given up is computed again when asked for:
slower, never wrong.

Renders run on worker threads (view_service.py), several at once: a memo
is read without a lock (one dict lookup, atomic under the GIL) and written
under the budget's lock, so an eviction never races another.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from itertools import compress, count
from operator import attrgetter, is_, ne
from typing import Any, Generic, Protocol, TypeVar

from contextd.engine.blocks import shared as blocks_shared
from contextd.engine.model import Item
from contextd.engine.prefix import common

V = TypeVar("V")
T = TypeVar("T")

DEFAULT_MEMO_BYTES = 256 * 1024 * 1024
ENTRY_BYTES = 160
"""A result's own cost in a memo (the dict slot, the key and the tuple that holds it)."""


class _Budget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        """What the memos hold, kept as they change (a memo dropped unused leaves its count in
        until the next trim recounts)."""
        self.memos: weakref.WeakSet[Budgeted] = weakref.WeakSet()
        self.lock = threading.Lock()

    def trim(self) -> None:
        """Under the lock: past the budget, give up results, the largest memo's oldest first,
        until the memos hold `TRIMMED_TO` of it."""
        if self.held <= self.max_bytes:
            return
        memos = list(self.memos)
        self.held = sum(m.bytes for m in memos)
        if self.held <= self.max_bytes:
            return  # (the count was high by memos garbage-collected since: nothing to give up)
        target = int(self.max_bytes * TRIMMED_TO)
        while self.held > target:
            memos.sort(key=attrgetter("bytes"), reverse=True)
            largest, floor = memos[0], memos[1].bytes if len(memos) > 1 else 0
            freed = largest.drop_oldest()
            if freed is None:
                return
            self.held -= freed
            while self.held > target and largest.bytes >= floor and (freed := largest.drop_oldest()) is not None:
                self.held -= freed  # (the largest gives way until it is no longer the largest)


TRIMMED_TO = 0.9
"""Past the budget, results go until the memos hold this share of it: memos that fill the
budget (a first render of a long session: 50,000 items fill the default) are trimmed once in
a while, not at every result remembered (each trim lists and weighs every memo; trimmed back
to the budget alone, that was 5% of such a render)."""


_BUDGET = _Budget(DEFAULT_MEMO_BYTES)


class Budgeted(Protocol):
    """What draws on the byte budget: every `IdentityMemo`, and the caches of results by
    content (compress/text.py's `Remembered`: parsed modules, searches read)."""

    bytes: int

    def drop_oldest(self) -> int | None:
        """Under the budget's lock: give up the oldest result; the bytes it held (None: there
        was none). The budget counts them off."""
        ...

    def clear(self) -> None: ...


def join_budget(member: Budgeted) -> None:
    """Let `member`'s results count against the budget (its changes made `within_budget`) and
    be given up past it."""
    with _BUDGET.lock:
        _BUDGET.memos.add(member)


def within_budget(change: Callable[[], int]) -> None:
    """Run `change`, a member's update of its results under its own lock, which returns the
    bytes it added (negative: freed), under the budget's lock: counted, and past the budget the
    largest member gives way. The budget's lock first, as trimming takes it before a member's;
    and held throughout, so that a trim's recount of the members never sees the update and then
    has it added again."""
    with _BUDGET.lock:
        _BUDGET.held += change()
        _BUDGET.trim()


class Resumable(Protocol):
    """What a render keeps for the next one to resume in place (an assembly, a repair run)."""

    taken: bool
    """A later render took it over: its lists and maps are that render's now."""


class Claim:
    """A `Resumable` for what a render keeps in a frozen value that is copied (the rules'
    ledgers): every copy shares the one claim, so one render in all may take them over."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken = False


_TAKING = threading.Lock()


def take_over(kept: Resumable) -> bool:
    """Whether this render may resume `kept` in place: the first to ask may, whatever the
    threads; any later one (another render from the same carry, or one after a render that
    failed half-way) starts over."""
    with _TAKING:
        if kept.taken:
            return False
        kept.taken = True
        return True


SHARED_SCAN = 32
"""Past a difference narrowed to this many elements, `shared_prefix` compares one by one."""


def shared_prefix(previous: Sequence[T], current: Sequence[T], known: int = 0) -> int:
    """How many leading elements of `current` equal those of `previous`; `known`: how many the
    caller knows they share (the same objects), which are not compared.

    A render resumes what the previous one did for what both share, and what they share is
    almost all of it and the same objects: the sequences are compared a slice at a time (a
    list's or tuple's equality tests each pair for identity first, a pointer compare), halving
    the slice that differs down to a few elements. About 2 elements' copies and compares each
    (nanoseconds), where a Python call per element (`map(is_not, ...)`) costs tens: it is run
    several times a render over the whole view. Equal but distinct elements count as shared:
    a render is a pure function of what it is given, so they give what the same objects give.
    """
    if (shared := common(previous, current)) is not None:
        return shared  # (two prefixes of one list: the shorter, uncompared)
    if (same := blocks_shared(previous, current, known)) is not None:
        return max(same, min(known, len(previous), len(current)))  # (block by block)
    n = min(len(previous), len(current))
    if known > 0:
        known = min(known, n)  # what follows is copied and compared: the short part
        return known + shared_prefix(previous[known:n], current[known:n]) if known < n else n
    a: Sequence[T] = previous if len(previous) == n else previous[:n]  # a list's slice is a copy
    b: Sequence[T] = current if len(current) == n else current[:n]
    if type(a) is not type(b):  # a list's slice never equals a tuple's: the other side a list too
        a, b = (a if type(a) is list else list(a)), (b if type(b) is list else list(b))
    if a == b:
        return n
    lo, hi = 0, n  # they differ in [lo, hi)
    while hi - lo > SHARED_SCAN:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next(compress(count(lo), map(ne, a[lo:hi], b[lo:hi])), hi)


def set_memo_bytes(max_bytes: int) -> None:
    """The bytes every memo of the process may hold between them (results given up at once if
    they hold more)."""
    with _BUDGET.lock:
        _BUDGET.max_bytes = max_bytes
        _BUDGET.trim()


def clear_memos() -> None:
    """Forget every result of every memo (a first render after this is a genuine one)."""
    for memo in list(_BUDGET.memos):
        memo.clear()


def memo_bytes() -> int:
    """About how many bytes the process's memos hold now."""
    with _BUDGET.lock:
        _BUDGET.held = sum(m.bytes for m in list(_BUDGET.memos))
        return _BUDGET.held


class IdentityMemo(Generic[V]):
    """Bounded by count and, with every other memo, by bytes; when full, the oldest result
    goes first (cheaper on the hot path than keeping the least recently used order)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.bytes = 0
        self._held: dict[object, tuple[Any, V, int]] = {}
        """id of the one source (or the ids of the sources) -> that source (or the sources),
        the result, its weight: one source held alone, not in a tuple of its own, which would
        be one more object an entry for the garbage collector to visit."""
        join_budget(self)

    def get(self, sources: tuple[object, ...], compute: Callable[[], V]) -> V:
        """`compute()`, remembered for exactly these objects."""
        # On the hot path of every render, many times per item: C-level calls only, and for
        # one source (most memos) not even an iterator.
        key: object
        held_by: object
        if len(sources) == 1:
            held_by = sources[0]
            key = id(held_by)
            found = self._held.get(key)
            if found is not None and found[0] is held_by:
                return found[1]
        else:
            held_by = sources
            key = tuple(map(id, sources))
            found = self._held.get(key)
            if found is not None and all(map(is_, found[0], sources)):
                return found[1]
        value = compute()
        weight = ENTRY_BYTES + weigh(value)
        with _BUDGET.lock:
            held = self._held
            if key in held:
                _BUDGET.held -= self._forget(key)
            elif len(held) >= self.size:
                _BUDGET.held -= self.drop_oldest() or 0
            held[key] = (held_by, value, weight)
            self.bytes += weight
            _BUDGET.held += weight
            _BUDGET.trim()
        return value

    def reweigh(self, sources: tuple[object, ...]) -> None:
        """Weigh again the result remembered for `sources`, which its holder changed in place
        (a dict of results by another key, grown or cleared)."""
        self._weighed(sources, None, lambda found: ENTRY_BYTES + weigh(found[1]))

    def grew(self, sources: tuple[object, ...], result: object, by: object) -> None:
        """`result`, remembered for `sources`, grew in place by `by` alone (a key and its
        value): its weight is added, the rest not weighed again; nothing if the memo holds
        another result for them now (given up and computed again since: weighed as it is)."""
        self.resized(sources, result, weigh(by))

    def resized(self, sources: tuple[object, ...], result: object, by_bytes: int) -> None:
        """`result`, remembered for `sources`, changed in place by about `by_bytes` (negative:
        it shrank), which its holder knows without weighing it (`grew`); nothing if the memo
        holds another result for them now."""
        self._weighed(sources, result, lambda found: found[2] + by_bytes)

    def _weighed(
        self, sources: tuple[object, ...], result: object, weight_of: Callable[[tuple[Any, Any, int]], int]
    ) -> None:
        single = len(sources) == 1
        key: object = id(sources[0]) if single else tuple(map(id, sources))
        with _BUDGET.lock:
            found = self._held.get(key)
            if found is None or not (found[0] is sources[0] if single else all(map(is_, found[0], sources))):
                return
            if result is not None and found[1] is not result:
                return
            weight = weight_of(found)
            self._held[key] = (found[0], found[1], weight)
            self.bytes += weight - found[2]
            _BUDGET.held += weight - found[2]
            _BUDGET.trim()

    def drop_oldest(self) -> int | None:
        """Under the budget's lock: give up the oldest result; its bytes (None: none held)."""
        return self._forget(next(iter(self._held))) if self._held else None

    def _forget(self, key: object) -> int:
        weight = self._held.pop(key)[2]
        self.bytes -= weight
        return weight

    def clear(self) -> None:
        with _BUDGET.lock:
            _BUDGET.held -= self.bytes
            self.bytes = 0
            self._held.clear()


def weigh(value: object, depth: int = 6) -> int:
    """About how many bytes `value` takes (CPython's object sizes, roughly): strings, numbers,
    containers and slotted objects, `depth` levels down. History items are not counted: they
    are the objects results are computed from, held by the caches of history."""
    # Every result remembered is weighed (about a hundred objects an item of a first render):
    # the common types by their exact type first, the general reading (`_weigh_other`) for
    # the rest.
    kind = type(value)
    if kind is str or kind is bytes:
        return 49 + len(value)  # type: ignore[arg-type]
    if value is None or kind is int or kind is bool or kind is float:
        return 28
    if depth <= 0:
        return _weigh_other(value, depth)
    below = depth - 1
    if kind is tuple or kind is list or kind is frozenset or kind is set:
        members: Collection[Any] = value  # type: ignore[assignment]
        total = 56 + 8 * len(members)
        if set(map(type, members)) == _STRINGS:
            # All strings (the words of an output, its lines): summed at C speed.
            return total + 49 * len(members) + sum(map(len, members))
        for x in members:
            total += 49 + len(x) if type(x) is str else weigh(x, below)
        return total
    if kind is dict:
        total = 232 + 104 * len(value)  # type: ignore[arg-type]
        for k, v in value.items():  # type: ignore[attr-defined]
            total += weigh(k, below) + weigh(v, below)
        return total
    names = _SLOTS.get(kind)
    if names is None:
        return _weigh_other(value, depth)
    total = 56
    for name in names:
        x = getattr(value, name, None)
        total += 49 + len(x) if type(x) is str else weigh(x, below)
    return total


_STRINGS = {str}
_SLOTS: dict[type, tuple[str, ...]] = {}
"""The slot names of each slotted class weighed so far."""


def _weigh_other(value: object, depth: int) -> int:
    """`weigh` of what is not of an exact common type: subclasses (enums, named tuples),
    history items, slotted objects (their slots remembered by class), and the rest."""
    if isinstance(value, str | bytes):
        return 49 + len(value)
    if value is None or isinstance(value, int | float | bool):
        return 28
    if depth <= 0:
        return 64
    if isinstance(value, tuple | list | set | frozenset):
        return 56 + 8 * len(value) + sum(weigh(x, depth - 1) for x in value)
    if isinstance(value, dict):
        return 232 + sum(104 + weigh(k, depth - 1) + weigh(v, depth - 1) for k, v in value.items())
    if isinstance(value, Item):
        return 8
    slots = getattr(type(value), "__slots__", None)
    if not slots:
        return 64
    names = (slots,) if isinstance(slots, str) else tuple(slots)
    _SLOTS[type(value)] = names
    return 56 + sum(weigh(getattr(value, n, None), depth - 1) for n in names)
