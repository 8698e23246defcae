"""Server-sent events as they arrive: each complete event's bytes, as the upstream sent them,
with its name and data read (the WHATWG HTML event stream format: events end at a blank line;
lines end in CRLF, LF or CR; `data:` lines join with LF).

Hand-written because the proxy relays each event's own bytes: the SSE parsers at hand
(httpx-sse, sse-starlette's) give the parsed fields only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n")
_LINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Event:
    raw: bytes
    name: str
    data: str


class Events:
    """Feed the stream's bytes; get each event once it is complete. `rest`: what follows the
    last complete event (a stream cut short)."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self.rest += chunk
        while (end := _END.search(self.rest)) is not None:
            raw, self.rest = self.rest[: end.end()], self.rest[end.end() :]
            yield _parse(raw, end.start())


def _parse(raw: bytes, length: int) -> Event:
    name, data = "", []
    for line in _LINE.split(raw[:length].decode("utf-8", errors="replace")):
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return Event(raw, name, "\n".join(data))
