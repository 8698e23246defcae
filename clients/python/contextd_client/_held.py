"""The last view the client received of each session, in each format, held so that the next
render of it comes as only what changed.

A view names its content by a token (`View.view_token`: digests of its blocks of messages and
items). Sent back with the next render (`RenderViewRequest.known_view_token`), it lets the
service leave out the leading messages and items the new view shares with the one held: the
client puts them back from what it holds. A long session's view is megabytes, and most of it
is the last view's; without this, every render sends and decodes all of it (3.3 MB and 50-80 ms
of the client's processor at 10,000 items: docs/benchmarks.md).

Held are the view's messages JSON as bytes (the service counts what is shared in bytes) and its
items (immutable), never the parsed messages: those are the caller's to change, and every view
gets its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from contextd_client._types import ViewItem


@dataclass(frozen=True, slots=True)
class Held:
    token: bytes
    messages: bytes
    """The view's `messages_json`, UTF-8."""
    items: tuple[ViewItem, ...]


class HeldViews:
    """The last view of each (session, format), for the `most` pairs used most recently, as
    long as they take no more than `most_bytes` together (the least recent go first)."""

    def __init__(self, most: int, most_bytes: int = 64 << 20) -> None:
        self.most, self.most_bytes = most, most_bytes
        self._held: OrderedDict[tuple[str, str], Held] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # (a Client is shared by threads)

    def get(self, session_id: str, fmt: str) -> Held | None:
        with self._lock:
            held = self._held.get((session_id, fmt))
            if held is not None:
                self._held.move_to_end((session_id, fmt))
            return held

    def hold(self, session_id: str, fmt: str, held: Held) -> None:
        """Hold `held` as the view of the pair (two renders of it at once: the one decoded last)."""
        with self._lock:
            self._drop((session_id, fmt))
            if self.most <= 0 or not held.token or _weight(held) > self.most_bytes:
                return
            self._held[(session_id, fmt)] = held
            self._bytes += _weight(held)
            while len(self._held) > self.most or self._bytes > self.most_bytes:
                self._drop(next(iter(self._held)))

    def forget(self, session_id: str, fmt: str | None = None) -> None:
        """Let go of the views of a session (deleted), or of its view in `fmt`."""
        with self._lock:
            for key in [key for key in self._held if key[0] == session_id and fmt in (None, key[1])]:
                self._drop(key)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _drop(self, key: tuple[str, str]) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._bytes -= _weight(held)


def _weight(held: Held) -> int:
    """About what a view held takes: its messages' bytes and a reference an item (the items
    are the caller's view's too)."""
    return len(held.messages) + 8 * len(held.items) + 200
