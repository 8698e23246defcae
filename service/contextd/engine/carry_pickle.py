"""A render's carry as bytes, and back: so that a process that did not make the render (a
restarted or new replica) resumes from it as the process that made it would.

The bytes hold what the render derived, not the history: an item is written as its seq
and content hash, and read back as the item of that seq in the history the reader holds
(refused when the hash differs), and the token counter as the reader's own. They are a
pickle, so they must come from a trusted writer: the caller signs and checks them
(storage's `KeptCarries`), and names them by the code that wrote them, since a pickle
rebuilds objects by their classes' names and a carry of other code is not this code's.

Why a pickle rather than a codec written here: the carry is dozens of the engine's own types
(drafts, ledgers, assemblies, the view state), each of which a codec would have to be written
for and kept in step with; pickle writes them as they are, keeps the objects they share
shared, and is C code on both sides. The price is that a carry is this code's only.

Two of pickle's default ways took most of the time at 10,000 items, and are done otherwise
here (`_Writer.reducer_override`): a `persistent_id` hook, which pickle calls for each of the
1.5 million objects written (ints and strings too), where a reducer is asked about the others
only (about 100,000); and the frozen slotted dataclasses' own state methods, which list their
class's fields again for each of their 51,000 objects. Their fields are written and set by
names listed once a class (`_fields_of`). Writing a carry of bench/scale.py's mixed session
at 10,000 items took 391-403 ms of CPU before, 189-199 after; reading it back 169-177, 146-154.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import operator
import pickle
from collections.abc import Callable, Sequence
from types import MappingProxyType, MemberDescriptorType
from typing import Any

from contextd.engine.memo import take_over
from contextd.engine.model import Item
from contextd.engine.pipeline import Carry
from contextd.engine.tokens import TokenCounter

__all__ = ["UnusableCarry", "dump_carry", "load_carry"]


class UnusableCarry(Exception):
    """The bytes are not a carry of this history: an item they name is missing or differs."""


def dump_carry(carry: Carry, counter: TokenCounter, *, release: bool = False) -> bytes | None:
    """The carry as bytes; None when a render holds part of it (took it over, or is taking it
    over): what it would write could be half that render's.

    The carry is claimed first, as the render that follows would claim it, so no render takes
    it over while it is written. With `release`, it is as it was afterwards, for the next render
    in this process to take over (the caller sees that none starts meanwhile); otherwise it
    serves no render in this process any more (a carry this process lets go of)."""
    if not _claim(carry):
        return None
    out = io.BytesIO()
    try:
        _Writer(out, counter).dump(carry)
    finally:
        if release:
            _release(carry)
    return out.getvalue()


def load_carry(data: bytes, items: Sequence[Item], counter: TokenCounter) -> Carry:
    """The carry `data` holds, over `items` (the session's history as this process read it),
    ready to be taken over by the next render from its state. Raises UnusableCarry when an
    item it names is not in `items` as it was written; pickle's own errors when the bytes
    are not a carry."""
    carry = _Reader(io.BytesIO(data), items, counter).load()
    if not isinstance(carry, Carry):
        raise UnusableCarry(f"the bytes hold a {type(carry).__name__}, not a carry")
    _release(carry)
    return carry


def _parts(carry: Carry) -> list[object]:
    """Each part of the carry a render takes over (memo.take_over), in the order a render does."""
    parts: list[object] = [carry.finished.claim]
    if carry.ledgers is not None:
        parts.append(carry.ledgers.claim)
    parts += [carry.repaired, carry.assembly]
    return parts


def _claim(carry: Carry) -> bool:
    """Claim every part, or none: a part a render holds already leaves the parts claimed before
    it as they were (each part is taken over on its own, as renders from one carry do)."""
    claimed: list[object] = []
    for part in _parts(carry):
        if not take_over(part):  # type: ignore[arg-type]
            for mine in claimed:
                mine.taken = False  # type: ignore[attr-defined]
            return False
        claimed.append(part)
    return True


def _release(carry: Carry) -> None:
    """Undo `_claim` on a carry read back: it is as its render left it. What it keyed by the
    identity of its objects is keyed again by theirs in this process (the repair's answers:
    the result entries it indexed)."""
    for part in _parts(carry):
        part.taken = False  # type: ignore[attr-defined]
    run = carry.repaired
    run.answers = {id(entry) for entry in run.results.values()}


class _Writer(pickle.Pickler):
    def __init__(self, out: io.BytesIO, counter: TokenCounter) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self._counter = counter
        self.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _proxy_reduced}

    def reducer_override(self, obj: Any) -> Any:
        """An item of the history as a call of the reader's `_item` by its seq and hash, the
        counter as the reader's `_counter`, a frozen slotted dataclass as its fields' values,
        set on an object made without its `__init__` (as pickle's own way does); anything
        else as pickle writes it."""
        kind = type(obj)
        if kind is Item and obj.seq >= 1:  # (content a transform inserted is written whole)
            return _item, (obj.seq, obj.content_hash)
        if obj is self._counter:
            return _counter, ()
        fields = _fields_of(kind)
        if fields is None:
            return NotImplemented
        values = fields[1](obj)
        return _NEWOBJ, (kind,), values if len(fields[0]) != 1 else (values,), None, None, _set_fields


_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]
"""`kind.__new__(kind)`, as pickle writes it (the NEWOBJ opcode)."""


_DATACLASS_STATE = (
    getattr(dataclasses, "_dataclass_getstate", None),
    getattr(dataclasses, "_dataclass_setstate", None),
)
"""The state methods `dataclass(frozen=True, slots=True)` gives a class (where this Python has them)."""
_Fields = tuple[tuple[str, ...], Callable[[Any], Any], Callable[[object, tuple[object, ...]], None]]
"""A class's field names, a getter of their values, and a setter of them (`_setter`)."""
_FIELDS: dict[type, _Fields | None] = {}


def _fields_of(kind: type) -> _Fields | None:
    """The names of the fields of a frozen slotted dataclass whose state is its fields (the
    state methods `dataclass` gives such a class, and nothing else pickle would heed), with a
    getter and a setter of their values; None for any other class."""
    try:
        return _FIELDS[kind]
    except KeyError:
        pass
    found = None
    state = (getattr(kind, "__getstate__", None), getattr(kind, "__setstate__", None))
    plain = kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__  # type: ignore[comparison-overlap]
    # (what else pickle's own way would heed: arguments for __new__, a reduction registered)
    plain = plain and not hasattr(kind, "__getnewargs_ex__") and not hasattr(kind, "__getnewargs__")
    plain = plain and kind not in copyreg.dispatch_table
    if None not in _DATACLASS_STATE and state == _DATACLASS_STATE and plain and "__slots__" in kind.__dict__:
        names = tuple(f.name for f in dataclasses.fields(kind))
        setter = _setter(kind, names) if names else None
        if setter is not None:
            found = names, operator.attrgetter(*names), setter
    _FIELDS[kind] = found
    return found


def _setter(kind: type, names: tuple[str, ...]) -> Callable[[object, tuple[object, ...]], None] | None:
    """A function that sets the slots `names` of a `kind` to values given in their order, one
    statement a slot, written out as `dataclasses` writes an `__init__` (a loop over the names
    took about three times as long, as did `object.__setattr__` mapped over them: 51,000 objects
    at 10,000 items); None when a name is not a slot of the class."""
    slots = []
    for name in names:
        slot = next((base.__dict__[name] for base in kind.__mro__ if name in base.__dict__), None)
        if not isinstance(slot, MemberDescriptorType):
            return None
        slots.append(slot.__set__)  # (the slot itself: a frozen class's __setattr__ refuses)
    values = ", ".join(f"v{n}" for n in range(len(names)))
    body = "".join(f"    s{n}(obj, v{n})\n" for n in range(len(names)))
    scope: dict[str, Any] = {f"s{n}": slot for n, slot in enumerate(slots)}
    exec(f"def set_fields(obj, values):\n    {values}, = values\n{body}", scope)  # names by number only
    setter: Callable[[object, tuple[object, ...]], None] = scope["set_fields"]
    return setter


def _set_fields(obj: object, values: tuple[object, ...]) -> None:
    """What `dataclass(frozen=True, slots=True)`'s `__setstate__` does, by the slots listed once
    a class."""
    fields = _fields_of(type(obj))
    if fields is None or len(fields[0]) != len(values):
        raise UnusableCarry(f"{type(obj).__name__} is not a slotted dataclass of these fields here")
    fields[2](obj, values)


def _item(seq: int, content_hash: str) -> Item:
    """Stands in the bytes for the reader's own (`_Reader.find_class`)."""
    raise UnusableCarry("an item is read back only over a history")


def _counter() -> TokenCounter:
    """Stands in the bytes for the reader's own (`_Reader.find_class`)."""
    raise UnusableCarry("the token counter is read back only as the reader's")


def _proxy_reduced(proxy: MappingProxyType[str, str]) -> tuple[Callable[..., object], tuple[dict[str, str]]]:
    """An item's metadata (read-only) as the dict it shows."""
    return _proxied, (dict(proxy),)


def _proxied(values: dict[str, str]) -> MappingProxyType[str, str]:
    return MappingProxyType(values)


class _Reader(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, items: Sequence[Item], counter: TokenCounter) -> None:
        super().__init__(data)
        self._items = items
        self._counter = counter

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_item":
            return self._item
        if module == __name__ and name == "_counter":
            return self._counter_of
        return super().find_class(module, name)

    def _item(self, seq: int, content_hash: str) -> Item:
        known = type(seq) is int and 1 <= seq <= len(self._items)
        if not known or self._items[seq - 1].content_hash != content_hash:
            raise UnusableCarry(f"item {seq} is not in the history as the carry was written")
        return self._items[seq - 1]

    def _counter_of(self) -> TokenCounter:
        return self._counter
