"""How a carry's objects are written and read back (engine/carry_pickle.py): the frozen
slotted dataclasses by their fields, objects shared or referring back to themselves as they
were, the history's items by reference."""

from __future__ import annotations

import copyreg
import io
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from contextd.engine import carry_pickle
from contextd.engine.carry_pickle import UnusableCarry
from contextd.engine.model import Role, TextBlock
from tests.helpers import counter, make_item

COUNTER = counter()


def text_item(text: str, seq: int) -> Any:
    return make_item(Role.USER, TextBlock(text), seq=seq, token_count=1)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    around: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Single:
    value: Any


@dataclass(frozen=True, slots=True)
class Made:
    value: int
    made: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "made", self.made + 1)


@dataclass(frozen=True, slots=True)
class Reduced:
    value: int

    def __reduce__(self) -> tuple[type[Reduced], tuple[int]]:
        return Reduced, (self.value * 10,)


def round_trip(value: object, items: list[Any] | None = None) -> Any:
    out = io.BytesIO()
    carry_pickle._Writer(out, COUNTER).dump(value)
    return carry_pickle._Reader(io.BytesIO(out.getvalue()), items or [], COUNTER).load()


def test_frozen_slotted_dataclasses_come_back_equal_shared_and_referring_to_themselves() -> None:
    node = Node("a")
    node.around.append(node)  # a cycle through the object itself
    shared = Node("b", [node, node, Single(node), Single((1, "x"))])
    back = round_trip([shared, node, COUNTER])
    assert back[0].around[0] is back[0].around[1] is back[1] is back[1].around[0]
    assert back[0].around[2].value is back[1] and back[0].around[3] == Single((1, "x"))
    assert back[0].name == "b" and back[2] is COUNTER
    assert carry_pickle._fields_of(Node) is not None and carry_pickle._fields_of(Single) is not None


def test_objects_are_read_back_as_they_were_written_not_made_again() -> None:
    made = Made(3)
    object.__setattr__(made, "made", 7)
    back = round_trip(made)
    assert back == made and back.made == 7  # neither __init__ nor __post_init__ ran


@dataclass(frozen=True, slots=True)
class Derived(Single):
    more: str
    extra: tuple[int, ...] = ()


def test_the_fields_a_slotted_base_holds_are_set_too() -> None:
    back = round_trip([Derived("a", "b", (1,)), Derived(2, "c")])
    assert back == [Derived("a", "b", (1,)), Derived(2, "c")]
    fields = carry_pickle._fields_of(Derived)  # (written by its fields, not pickle's own way)
    assert fields is not None and fields[0] == ("value", "more", "extra")


@dataclass(frozen=True, slots=True)
class Registered:
    value: int


@dataclass(frozen=True, slots=True)
class WithNewArgs:
    value: int

    def __getnewargs__(self) -> tuple[int]:
        return (self.value,)


def test_a_class_with_a_reduction_of_its_own_is_written_by_it() -> None:
    assert carry_pickle._fields_of(Reduced) is None
    assert round_trip(Reduced(2)) == Reduced(20)
    assert carry_pickle._fields_of(WithNewArgs) is None
    copyreg.pickle(Registered, lambda r: (Registered, (r.value + 1,)))
    try:
        assert carry_pickle._fields_of(Registered) is None and round_trip(Registered(1)) == Registered(2)
    finally:
        del copyreg.dispatch_table[Registered]


def test_items_are_written_by_reference_and_read_back_as_the_reader_s_own() -> None:
    items = [text_item("one", seq=1), text_item("two", seq=2)]
    written = io.BytesIO()
    carry_pickle._Writer(written, COUNTER).dump([items[1], items[1], items[0]])
    assert b"two" not in written.getvalue()
    mine = [text_item("one", seq=1), text_item("two", seq=2)]
    back = carry_pickle._Reader(io.BytesIO(written.getvalue()), mine, COUNTER).load()
    assert back[0] is back[1] is mine[1] and back[2] is mine[0]
    with pytest.raises(UnusableCarry):
        carry_pickle._Reader(io.BytesIO(written.getvalue()), mine[:1], COUNTER).load()


def test_the_stand_ins_for_the_reader_s_items_and_counter_read_nothing_elsewhere() -> None:
    written = io.BytesIO()
    carry_pickle._Writer(written, COUNTER).dump(COUNTER)
    with pytest.raises(UnusableCarry):
        pickle.loads(written.getvalue())  # a plain unpickler: no counter of its own to give


class BadReference(pickle.Pickler):
    """Writes each `Node` as a reference to an item with `args` (a writer gone wrong)."""

    def __init__(self, out: io.BytesIO, args: tuple[object, ...]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.args = args

    def reducer_override(self, obj: Any) -> Any:
        return (carry_pickle._item, self.args) if type(obj) is Node else NotImplemented


def test_a_reference_to_an_item_that_is_not_a_seq_and_a_hash_is_refused() -> None:
    mine = [text_item("one", seq=1)]
    for args in (("1", mine[0].content_hash), (1, 2), (True, mine[0].content_hash)):
        written = io.BytesIO()
        BadReference(written, args).dump([Node("ref")])
        with pytest.raises(UnusableCarry):
            carry_pickle._Reader(io.BytesIO(written.getvalue()), mine, COUNTER).load()
