"""Which of a request's messages the session already holds, and making it hold exactly them.

An SDK resends the whole conversation on every call. Each conversation item the proxy appends
carries, in its metadata, its position in the conversation and a *chain hash*: the SHA-256 of
the previous item's chain and this item's canonical content (role, name, blocks). Equal chains
at a position mean equal conversations up to it, so the proxy compares a request with the
session by comparing chains, in memory for the sessions it has seen (`Ledger`) and, for one
it has not (another replica's, or after a restart), from the last item the session holds.

`sync` then makes the session's live items the request's conversation:
- the request's items past the common prefix are appended, in one batch whose idempotency
  key is the chain of the whole request, with the session version it was computed against
  (`expected_version`): a retried request never writes twice, and two writers never
  interleave;
- the session's items past the common prefix are retracted (RetractItems, not redacted):
  the caller's conversation no longer holds them (a retry whose first answer the caller never
  got, an agent that edited its own history), so no view may show them; the record keeps them.

A session never reuses a tool call id, retracted calls' included, so an agent that edits its
history and sends the calls after the edit again has them refused. The proxy then stores
those calls under new ids (the caller's id, `_`, and a hash of the call's place in the
conversation) and their results with them; the renaming goes on every later item's metadata
(`IDS`), so any replica maps the caller's ids the same way. Views show the stored ids,
consistently paired; the caller's own request never needs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from contextd_client import AlreadyExists, AsyncClient, InvalidArgument, NotFound, VersionConflict, ViewFormat
from contextd_client.v1 import content_pb2 as pb

CHAIN = "contextd.proxy.chain"
"""Item metadata: the chain hash of the conversation up to and including the item."""
AT = "contextd.proxy.at"
"""Item metadata: the item's position in the conversation, from 1."""
IDS = "contextd.proxy.ids"
"""Item metadata: the tool call ids stored under another name in the conversation so far (JSON,
the caller's id to the stored one)."""
AUTHOR = "contextd-proxy"
RETRACTED_BECAUSE = "the caller's conversation no longer holds it (contextd proxy)"
_ATTEMPTS = 3
_RENAMINGS = 3
_UNKNOWN = ""
"""The chain of a live item the proxy has not read: equal to no chain."""


class Moving(Exception):
    """Another writer kept changing the session while the proxy made it the request's."""


def chains(items: Sequence[pb.Item], after: str = "") -> list[str]:
    """The chain hash at each position of a conversation (`after`: the chain before its first item)."""
    out: list[str] = []
    previous = after.encode()
    for item in items:
        canonical = pb.Item(role=item.role, content=item.content, name=item.name)
        digest = hashlib.sha256(previous + canonical.SerializeToString(deterministic=True)).hexdigest()
        out.append(digest)
        previous = digest.encode()
    return out


def fingerprint(dialect: str, lead: str, first: str) -> str:
    """The session of a conversation named by no header: its dialect, its lead's text and the
    chain of its first item."""
    digest = hashlib.sha256("\x00".join((dialect, lead, first)).encode()).hexdigest()
    return f"proxy-{digest[:40]}"


@dataclass(frozen=True, slots=True)
class Known:
    """A session as the proxy knows it: its version, the chain and seq of each live item of the
    conversation in order (`seqs` None: not read yet), and the tool call ids it stores under
    other names (`IDS`)."""

    version: int
    chains: tuple[str, ...]
    seqs: tuple[int, ...] | None
    ids: tuple[tuple[str, str], ...] = ()

    def common(self, request: Sequence[str]) -> int:
        """How many leading items the session and the request share."""
        n = 0
        for held, asked in zip(self.chains, request, strict=False):
            if held != asked:
                break
            n += 1
        return n


@dataclass(frozen=True, slots=True)
class Synced:
    known: Known
    appended: int
    retracted: int
    recovered: bool


class Ledger:
    """The sessions this proxy has seen, most recent first kept (at most `most`), and a lock
    per session, so that one process syncs a session one request at a time."""

    def __init__(self, most: int = 10_000) -> None:
        self.most = most
        self._known: OrderedDict[str, Known] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def get(self, key: str) -> Known | None:
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
        return known

    def put(self, key: str, known: Known) -> None:
        self._known[key] = known
        self._known.move_to_end(key)
        while len(self._known) > self.most:
            self._known.popitem(last=False)

    def drop(self, key: str) -> None:
        self._known.pop(key, None)

    def lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock


async def sync(
    client: AsyncClient,
    session_id: str,
    view_format: ViewFormat,
    items: Sequence[pb.Item],
    request: Sequence[str],
    known: Known | None,
) -> Synced:
    """Make the session's live conversation the request's (`items`, their `request` chains)."""
    recovered = False
    for _ in range(_ATTEMPTS):
        if known is None:
            known, recovered = await recover(client, session_id, view_format, request), True
        shared = known.common(request)
        retracted = 0
        try:
            if shared < len(known.chains):
                seqs = known.seqs if known.seqs is not None else await live_seqs(client, session_id, view_format)
                await client.retract(session_id, seqs[shared:], reason=RETRACTED_BECAUSE)
                retracted = len(seqs) - shared
                known = Known(known.version, known.chains[:shared], tuple(seqs[:shared]), known.ids)
            if shared == len(request):
                return Synced(known, 0, retracted, recovered)
            known = await append(client, session_id, known, items[shared:], request)
            return Synced(known, len(request) - shared, retracted, recovered)
        except VersionConflict:
            known = None  # another writer moved the session: read it again
    raise Moving(f"session {session_id} kept changing while the proxy wrote to it")


async def append(
    client: AsyncClient, session_id: str, known: Known, items: Sequence[pb.Item], request: Sequence[str]
) -> Known:
    """Append `items`, the conversation's positions after `known.chains` (whose chains end
    `request`), against the version `known` read; their tool calls renamed when the session
    has used their ids."""
    start = len(known.chains)
    # The version keeps a key from meeting an earlier append of the same conversation, which
    # a retraction may have withdrawn since.
    key = "proxy-" + hashlib.sha256(f"{start}:{known.version}:{request[-1]}".encode()).hexdigest()[:48]
    for renaming in range(_RENAMINGS):
        ids, batch = _marked(known, items, request, renaming)
        try:
            result = await client.append_items(
                session_id, batch, idempotency_key=key, expected_version=known.version, author=AUTHOR
            )
        except InvalidArgument as exc:
            if not exc.field.endswith(".tool_use.id") or renaming == _RENAMINGS - 1:
                raise
            continue  # an id the session has used (a retracted call's): store the calls anew
        seqs = None if known.seqs is None else (*known.seqs, *range(result.first_seq, result.last_seq + 1))
        return Known(result.version, tuple(request), seqs, tuple(sorted(ids.items())))
    raise AssertionError("unreachable")


def _marked(
    known: Known, items: Sequence[pb.Item], request: Sequence[str], renaming: int
) -> tuple[dict[str, str], list[pb.Item]]:
    """The batch to append: each item with its place (`CHAIN`, `AT`, `IDS`), its calls under
    new ids from the `renaming`-th try on, its results under their calls' stored ids."""
    start = len(known.chains)
    ids = dict(known.ids)
    batch = []
    for offset, item in enumerate(items):
        chain = request[start + offset]
        marked = pb.Item()
        marked.CopyFrom(item)
        for block in marked.content:
            if block.HasField("tool_use"):
                given = block.tool_use.id
                if renaming:
                    stored = f"{given}_{hashlib.sha256(f'{chain}:{given}:{renaming}'.encode()).hexdigest()[:8]}"
                    ids[given] = block.tool_use.id = stored
                else:
                    ids.pop(given, None)  # a call of this id now: its results are its own
            elif block.HasField("tool_result"):
                block.tool_result.tool_use_id = ids.get(block.tool_result.tool_use_id, block.tool_result.tool_use_id)
        marked.metadata[CHAIN] = chain
        marked.metadata[AT] = str(start + offset + 1)
        if ids:
            marked.metadata[IDS] = json.dumps(ids, sort_keys=True)
        batch.append(marked)
    return ids, batch


async def recover(client: AsyncClient, session_id: str, view_format: ViewFormat, request: Sequence[str]) -> Known:
    """Read how far a session the proxy has not seen follows the request (created when new)."""
    try:
        session = await client.get_session(session_id)
    except NotFound:
        try:
            await client.create_session(session_id)
            return Known(0, (), ())
        except AlreadyExists:  # another replica made it first
            session = await client.get_session(session_id)
    if session.version == 0:
        return Known(0, (), ())
    last = await client.explain_item(session_id, session.version)
    at = _position(last.item)
    if last.representation != "omitted" and 0 < at <= len(request) and last.item.metadata[CHAIN] == request[at - 1]:
        return Known(session.version, tuple(request[:at]), None, _ids(last.item))  # the usual case: one read
    # The request diverges from the session (or the last item is not the proxy's): find how
    # many leading live items follow it, by halving (a chain matches at every position up to there).
    live = await live_seqs(client, session_id, view_format)
    low, high = 0, min(len(live), len(request))
    ids: tuple[tuple[str, str], ...] = ()
    while low < high:
        middle = (low + high + 1) // 2
        held = (await client.explain_item(session_id, live[middle - 1])).item
        if held.metadata.get(CHAIN) == request[middle - 1]:
            low, ids = middle, _ids(held)
        else:
            high = middle - 1
    return Known(session.version, (*request[:low], *[_UNKNOWN] * (len(live) - low)), tuple(live), ids)


async def live_seqs(client: AsyncClient, session_id: str, view_format: ViewFormat) -> list[int]:
    """The seqs of the session's items that a view may show (not retracted), in order."""
    view = await client.render_view(session_id, view_format, as_stored=True)
    return sorted({item.seq for item in view.items if item.representation != "omitted"})


def _ids(item: pb.Item) -> tuple[tuple[str, str], ...]:
    renamed = json.loads(item.metadata.get(IDS) or "{}")
    return tuple(sorted((str(k), str(v)) for k, v in renamed.items()))


def _position(item: pb.Item) -> int:
    value = item.metadata.get(AT, "")
    return int(value) if value.isdigit() and CHAIN in item.metadata else 0
