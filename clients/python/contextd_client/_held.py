"""The last view the client received of each session, in each format, held so that the next
render of it comes as only what changed.

A view names its content by a token (`View.view_token`: digests of its blocks of messages and
items). Sent back with the next render (`RenderViewRequest.known_view_token`), it lets the
service leave out the leading messages and items the new view shares with the one held: the
client puts them back from what it holds. A long session's view is megabytes, and most of it
is the last view's; without this, every render sends and decodes all of it (3.3 MB and about
60 ms of the client's processor at 10,000 items: docs/benchmarks.md).

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
    """The last view of each (session, format), for the `most` pairs used most recently."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._held: OrderedDict[tuple[str, str], Held] = OrderedDict()
        self._lock = threading.Lock()  # (a Client is shared by threads)

    def get(self, session_id: str, fmt: str) -> Held | None:
        with self._lock:
            held = self._held.get((session_id, fmt))
            if held is not None:
                self._held.move_to_end((session_id, fmt))
            return held

    def hold(self, session_id: str, fmt: str, held: Held) -> None:
        """Hold `held` as the view of the pair (two renders of it at once: the one decoded last)."""
        if self.most <= 0 or not held.token:
            return
        with self._lock:
            self._held[(session_id, fmt)] = held
            self._held.move_to_end((session_id, fmt))
            while len(self._held) > self.most:
                self._held.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """Let go of the views of a session (deleted)."""
        with self._lock:
            for key in [key for key in self._held if key[0] == session_id]:
                del self._held[key]
