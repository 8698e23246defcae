"""Requests from their bytes: a malformed message or an out-of-range number is the
caller's mistake (INVALID_ARGUMENT naming the field), never an internal error.

The server hands each handler the request's bytes (api/interceptors.py), and
`RequestDecoder` turns them into the message. When protobuf refuses the bytes
it does not say where (invalid UTF-8 in a string, a truncated field, garbage),
so `first_problem` walks the wire format against the message's descriptor to
name the field, on that failure path only. protobuf offers no public walker,
hence the few lines here; the format is protobuf's documented encoding.

Every uint64 a request carries reaches a signed 64-bit column or counter, so
values of 2^63 and above are refused by field as well (`too_large`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from contextd.engine.errors import FieldViolation, InvalidArgument

MAX_STORED_INTEGER = 2**63 - 1
"""The largest number a request field may hold: the database's BIGINT, which is signed."""

_VARINT, _FIXED64, _LENGTH, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5


class RequestDecoder:
    """Bytes to one request message type, with errors that name the field."""

    def __init__(self, message_type: type[Message]) -> None:
        self.message_type = message_type

    def __call__(self, data: bytes) -> Any:
        descriptor = self.message_type.DESCRIPTOR
        try:
            message = self.message_type.FromString(data)
        except (DecodeError, RecursionError):
            field, problem = first_problem(data, descriptor) or ("request", "malformed")
            raise InvalidArgument.at(field, f"{problem} (not a valid {descriptor.full_name})") from None
        violations = list(too_large(message))
        if violations:
            raise InvalidArgument(violations)
        return message


# ------------------------------------------------------------- the wire walk


class _Truncated(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Truncated
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def first_problem(data: bytes, descriptor: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """(field path, problem) of the first field of `data` that does not decode as
    `descriptor` says, or None when the walk finds none."""
    if depth > 64:
        return path or "request", "messages nested too deeply"
    seen: dict[str, int] = {}
    pos = 0
    while pos < len(data):
        try:
            tag, pos = _varint(data, pos)
        except _Truncated:
            return path or "request", "truncated"
        number, wire = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number)
        where = _path(path, field, number, seen)
        if number == 0 or wire in (_START_GROUP, _END_GROUP) or wire > _FIXED32:
            return where, "malformed (an invalid field tag)"
        try:
            if wire == _VARINT:
                _, pos = _varint(data, pos)
            elif wire in (_FIXED64, _FIXED32):
                pos += 8 if wire == _FIXED64 else 4
                if pos > len(data):
                    raise _Truncated
            else:
                length, pos = _varint(data, pos)
                payload, pos = data[pos : pos + length], pos + length
                if pos > len(data):
                    raise _Truncated
                problem = _payload_problem(payload, field, where, depth)
                if problem is not None:
                    return problem
        except _Truncated:
            return where, "truncated"
    return None


def _path(path: str, field: FieldDescriptor | None, number: int, seen: dict[str, int]) -> str:
    name = field.name if field is not None else f"<field {number}>"
    at = f"{path}.{name}" if path else name
    if field is None or not _repeated(field) or _is_map(field):
        return at
    index = seen.get(name, 0)
    seen[name] = index + 1
    return f"{at}[{index}]"


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _payload_problem(payload: bytes, field: FieldDescriptor | None, where: str, depth: int) -> tuple[str, str] | None:
    if field is None:
        return None  # an unknown field: protobuf keeps its bytes as they are
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return where, "not valid UTF-8"
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        return first_problem(payload, field.message_type, where, depth + 1)
    return None


# ----------------------------------------------------------- number bounds


def too_large(message: Message, path: str = "") -> Iterator[FieldViolation]:
    """A violation for every uint64 of `message` (nested messages included) past MAX_STORED_INTEGER."""
    for name, kind, repeated in _wide_fields(message.DESCRIPTOR):
        at = f"{path}.{name}" if path else name
        value = getattr(message, name)
        if kind == "number":
            numbers = enumerate(value) if repeated else [(None, value)]
            for index, number in numbers:
                if number > MAX_STORED_INTEGER:
                    where = at if index is None else f"{at}[{index}]"
                    yield FieldViolation(where, f"{number} is over the largest value stored, {MAX_STORED_INTEGER}")
        elif repeated:
            for index, child in enumerate(value):
                yield from too_large(child, f"{at}[{index}]")
        elif message.HasField(name):
            yield from too_large(value, at)


@functools.cache
def _wide_fields(descriptor: Any) -> tuple[tuple[str, str, bool], ...]:
    """(field name, "number" or "message", repeated) of the fields that are, or hold, uint64s."""
    found: list[tuple[str, str, bool]] = []
    for field in descriptor.fields:
        if field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            found.append((field.name, "number", _repeated(field)))
        elif field.message_type is not None and _holds_wide(field.message_type, frozenset({descriptor.full_name})):
            found.append((field.name, "message", _repeated(field)))
    return tuple(found)


def _holds_wide(descriptor: Any, visiting: frozenset[str]) -> bool:
    if descriptor.full_name in visiting:
        return False  # a recursive type: its uint64s, if any, are found where it is declared
    for field in descriptor.fields:
        if field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            return True
        if field.message_type is not None and _holds_wide(field.message_type, visiting | {descriptor.full_name}):
            return True
    return False
