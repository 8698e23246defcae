"""Which of a request's messages the session already holds, and making it hold exactly them.

An SDK resends the whole conversation on every call. Each conversation item the proxy appends
carries, in its metadata, its position in the conversation and a *chain hash*: the SHA-256 of
the previous item's chain and this item's canonical content (role, name, blocks). Equal chains
at a position mean equal conversations up to it. So the proxy keeps, per session, only how many
items the session holds and the last one's chain (`Ledger`, in memory; for a session it has not
seen, another replica's or after a restart, read from the session's last item): a request that
holds that chain at that position continues the session, told by one comparison.

`sync` then makes the session's live items the request's conversation:
- the request's items past what the session holds are appended, in one batch whose idempotency
  key is made of the chains, with the session version it was computed against
  (`expected_version`): a retried request never writes twice, and two writers never
  interleave;
- when the request parts from the session (`locate`: the live items, halved over by their
  chains), the session's items past the parting are retracted (RetractItems, not redacted):
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


def fingerprint(dialect: str, caller: str, lead: str, first: str) -> str:
    """The session of a conversation named by no header: its dialect, who calls (a digest of
    their provider key), its lead's text and the chain of its first item."""
    digest = hashlib.sha256("\x00".join((dialect, caller, lead, first)).encode()).hexdigest()
    return f"proxy-{digest[:40]}"


@dataclass(frozen=True, slots=True)
class Known:
    """A session as the proxy knows it: its version; how many items of the conversation it
    holds live and the chain of the last (`length` -1: not known, read it); the tool call ids
    it stores under other names (`IDS`)."""

    version: int
    length: int
    last: str
    ids: tuple[tuple[str, str], ...] = ()

    def followed_by(self, request: Sequence[str]) -> bool:
        """Whether the request holds the session's conversation and perhaps more (the usual
        case, told by one comparison)."""
        if self.length == 0:
            return True
        return 0 < self.length <= len(request) and request[self.length - 1] == self.last


@dataclass(frozen=True, slots=True)
class Synced:
    known: Known
    appended: int
    retracted: int
    located: bool
    """Whether the live items were read (`locate`), not taken from the ledger or the last item."""


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
    for _ in range(_ATTEMPTS):
        try:
            if known is None:
                known = await recover(client, session_id)
            retracted, located = 0, not known.followed_by(request)
            if located:
                known, withdrawn = await locate(client, session_id, view_format, known, items, request)
                if withdrawn:
                    await client.retract(session_id, withdrawn, reason=RETRACTED_BECAUSE)
                    retracted = len(withdrawn)
            if known.length == len(request):
                return Synced(known, 0, retracted, located)
            shared = known.length
            known = await append(client, session_id, known, items[shared:], request[shared:])
            return Synced(known, len(request) - shared, retracted, located)
        except VersionConflict:
            known = None  # another writer moved the session: read it again
    raise Moving(f"session {session_id} kept changing while the proxy wrote to it")


async def append(
    client: AsyncClient, session_id: str, known: Known, items: Sequence[pb.Item], item_chains: Sequence[str]
) -> Known:
    """Append `items` (their chains `item_chains`), the conversation's positions after the
    `known.length` the session holds, against the version `known` read; their tool calls
    renamed when the session has used their ids."""
    # The version keeps a key from meeting an earlier append of the same conversation, which
    # a retraction may have withdrawn since.
    key = "proxy-" + hashlib.sha256(f"{known.length}:{known.version}:{item_chains[-1]}".encode()).hexdigest()[:48]
    for renaming in range(_RENAMINGS):
        ids, batch = _marked(known, items, item_chains, renaming)
        try:
            result = await client.append_items(
                session_id, batch, idempotency_key=key, expected_version=known.version, author=AUTHOR
            )
        except InvalidArgument as exc:
            if not exc.field.endswith(".tool_use.id") or renaming == _RENAMINGS - 1:
                raise
            continue  # an id the session has used (a retracted call's): store the calls anew
        return Known(result.version, known.length + len(items), item_chains[-1], tuple(sorted(ids.items())))
    raise AssertionError("unreachable")


def _marked(
    known: Known, items: Sequence[pb.Item], item_chains: Sequence[str], renaming: int
) -> tuple[dict[str, str], list[pb.Item]]:
    """The batch to append: each item with its place (`CHAIN`, `AT`, `IDS`), its calls under
    new ids from the `renaming`-th try on, its results under their calls' stored ids."""
    start = known.length
    ids = dict(known.ids)
    batch = []
    for offset, (item, chain) in enumerate(zip(items, item_chains, strict=True)):
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


async def recover(client: AsyncClient, session_id: str) -> Known:
    """What a session the proxy has not seen holds, from its last item (created when new)."""
    try:
        session = await client.get_session(session_id)
    except NotFound:
        try:
            await client.create_session(session_id)
            return Known(0, 0, "")
        except AlreadyExists:  # another replica made it first
            session = await client.get_session(session_id)
    if session.version == 0:
        return Known(0, 0, "")
    last = await client.explain_item(session_id, session.version)
    at = _position(last.item)
    if last.representation == "omitted" or not at:  # retracted, or not the proxy's
        return Known(session.version, -1, "")
    return Known(session.version, at, last.item.metadata[CHAIN], _ids(last.item))


async def locate(
    client: AsyncClient,
    session_id: str,
    view_format: ViewFormat,
    known: Known,
    items: Sequence[pb.Item],
    request: Sequence[str],
) -> tuple[Known, list[int]]:
    """Where a request parts from the session: how many leading live items it shares with it
    (found by halving: the chains match at every position up to there), and the seqs of the
    live items after them, which the conversation no longer holds.

    A parting inside a round of tool calls (a result the agent changed or cleared, its call
    kept) moves back to the turn that made the calls: a call keeps its one result in a session,
    so the turn goes with its results and comes again with the new ones (under new ids)."""
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
    if low < len(live) and await _parts_at_a_result(client, session_id, items, live, low):
        turn = low
        while turn > 0 and items[turn - 1].role == pb.ROLE_TOOL:
            turn -= 1
        if turn > 0 and any(block.HasField("tool_use") for block in items[turn - 1].content):
            low = turn - 1
    return Known(known.version, low, request[low - 1] if low else "", ids), live[low:]


async def _parts_at_a_result(
    client: AsyncClient, session_id: str, items: Sequence[pb.Item], live: Sequence[int], at: int
) -> bool:
    """Whether the first item the request and the session do not share is a tool result, on
    either side."""
    if at < len(items) and items[at].role == pb.ROLE_TOOL:
        return True
    return (await client.explain_item(session_id, live[at])).item.role == pb.ROLE_TOOL


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
