"""Getting back what left a view (DESIGN principle 2, section 7): Retrieve, Search, and the
status that lists what is out of the view.

Retrieve: a handle names an original this session holds: it is looked up in
the stash (fast, shared by replicas), then in the durable history, which
warms the stash again, so a handle never dangles. A handle this session
does not hold is NOT_FOUND, never an empty answer. What comes back is
bounded: a page of lines or tokens under the server's cap, a line range, or
the lines matching a regular expression with context; every answer says the
totals of what was asked for, and pages cut by tokens join back to it
exactly. Search finds items by full text, substring or regular expression
(storage/search.py); regular expressions, from clients and models alike,
run in RE2 (linear time). The stash is filled here too, after each render.
"""

from __future__ import annotations

import asyncio
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from contextd.engine.errors import InvalidArgument, ItemRedacted, LimitExceeded, OriginalNotFound
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, Role, ToolUseBlock
from contextd.engine.originals import original_text
from contextd.engine.patterns import compile_pattern
from contextd.engine.placeholders import arguments_digest, handle_of
from contextd.engine.retraction import REDACTED, is_retraction
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.types import target_of
from contextd.engine.validation import MAX_NAME_LENGTH
from contextd.sessions import check_session_id
from contextd.telemetry import annotate
from contextd_storage import events, search, views
from contextd_storage.events import NewEvent
from contextd_storage.history import HistoryStore
from contextd_storage.regex_literals import required_literals
from contextd_storage.rows import searchable
from contextd_storage.stash import Stash, Stashed, scope_of
from contextd_storage.state_cache import StateCache

if TYPE_CHECKING:
    from contextd_storage.kept_carries import KeptCarries

MAX_PAGE_TOKENS = 2000
_INLINE_PAGE_CHARS = 64 * 1024
"""Larger originals are paged on a worker thread, not on the event loop."""
"""The server's cap on one page, whatever the client asks."""
MAX_GREP_CHARS = 1000
STASH_WRITES_AT_ONCE = 16
MAX_QUERY_CHARS = 1000
DEFAULT_HITS, MAX_HITS = 10, 50
"""Search results per page: by default, and at most whatever the client asks."""
TOKENIZED_KEPT = 32
"""Originals (or selections of them) whose token offsets are remembered for paging."""
REDUCED_KEPT = 1_000_000
"""Most seqs remembered (8 bytes each), over all sessions, of the items their views leave out."""
MAX_CONTEXT_LINES = 50
MAX_TOOL_FILTERS = 1000
"""Most tool names one search filters by."""
SEQ_LIMIT = 2**63
"""Seqs are stored as int64: anything from here on names no item."""
HANDLE = re.compile(r"[0-9a-f]{16}")


class PageUnit(Enum):
    TOKENS = "tokens"
    LINES = "lines"


@dataclass(frozen=True, slots=True)
class RetrieveQuery:
    handle: str = ""
    seq: int = 0
    unit: PageUnit = PageUnit.TOKENS
    offset: int = 0
    size: int = 0
    """0: the cap."""
    line_start: int = 0
    line_end: int = 0
    grep: str = ""
    context_lines: int = 0


@dataclass(frozen=True, slots=True)
class Page:
    handle: str
    seq: int
    content: str
    total_lines: int
    total_tokens: int
    next_offset: int
    """Where the next page starts, in the query's unit; the total of the selection after the last."""
    served_from: str
    """``stash`` or ``history``."""


class RecoveryService:
    def __init__(
        self,
        store: HistoryStore,
        stash: Stash,
        counter: TiktokenCounter,
        max_page_tokens: int = MAX_PAGE_TOKENS,
        states: StateCache | None = None,
    ) -> None:
        self.store = store
        self.stash = stash
        self.counter = counter
        self.max_page_tokens = max_page_tokens
        self.states = states
        """The view states this process's renders saved (the view service's): what is out of a
        view is read from them."""
        self.carries: KeptCarries | None = None
        """The renders' carries kept in Redis: a deleted session's are dropped."""
        self._reduced: OrderedDict[int, tuple[int, array[int]]] = OrderedDict()
        """Per session, its view state's version and the items that state's edits reduce."""
        self._reduced_seqs = 0
        self._handles: IdentityMemo[dict[str, Item]] = IdentityMemo(64)
        """Per loaded history (by its first and last item), its items by handle."""
        self._tokenized: OrderedDict[tuple[Any, ...], array[int]] = OrderedDict()
        """Per original (or selection of one), where its tokens start."""
        self._tokenizing = threading.Lock()

    async def stash_items(self, tenant: str, session_key: int, items: list[Item]) -> None:
        """Keep the originals of `items` (taken out of a view) in the stash, a few at a time
        (a render may prune hundreds: they must not take every connection at once)."""
        scope = scope_of(tenant, session_key)
        for start in range(0, len(items), STASH_WRITES_AT_ONCE):
            batch = items[start : start + STASH_WRITES_AT_ONCE]
            await asyncio.gather(
                *(self.stash.put(scope, handle_of(item), Stashed(item.seq, original_text(item))) for item in batch)
            )

    async def unstash_items(self, tenant: str, session_key: int, items: list[Item]) -> None:
        """Drop the originals of redacted `items` from the stash (Retrieve refuses them anyway,
        by the history's record; this frees them now rather than at their TTL)."""
        scope = scope_of(tenant, session_key)
        for start in range(0, len(items), STASH_WRITES_AT_ONCE):
            batch = items[start : start + STASH_WRITES_AT_ONCE]
            await asyncio.gather(*(self.stash.delete(scope, handle_of(item)) for item in batch))

    async def forget(self, tenant: str, session_key: int) -> None:
        """Drop a deleted session's stash (what it held is unreachable anyway: a new session of
        the same name has another key; this frees it now rather than at its TTL)."""
        await self.stash.delete(scope_of(tenant, session_key))
        if self.carries is not None:
            await self.carries.drop(session_key)

    async def retrieve(self, tenant: str, session_id: str, query: RetrieveQuery) -> Page:
        check_session_id(session_id)
        _check(query)
        # The session must exist now (a stash entry alone proves nothing once it is deleted).
        key = await self.store.session_key(tenant, session_id)
        scope = scope_of(tenant, key)
        found = await self.stash.get(scope, query.handle) if query.handle else None
        served_from = "stash"
        handle = query.handle
        if found is None:
            served_from = "history"
            item = await self._durable(tenant, session_id, query)
            handle = handle_of(item)
            found = Stashed(item.seq, original_text(item))
            await self._refuse_redacted(session_id, key, found.seq)
            await self.stash.put(scope, handle, found)  # warm again: the next ask is fast
        else:
            await self._refuse_redacted(session_id, key, found.seq)
        if len(found.text) > _INLINE_PAGE_CHARS:  # splitting, matching, tokenizing: off the event loop
            content, total_lines, total_tokens, next_offset = await asyncio.to_thread(
                self._page, handle, found.text, query
            )
        else:
            content, total_lines, total_tokens, next_offset = self._page(handle, found.text, query)
        retrieved = {"handle": handle, "seq": found.seq, "served_from": served_from}
        async with self.store.db.write() as conn:  # the watchers': a retrieve changes nothing else
            await events.record(conn, NewEvent(tenant, session_id, "handle_retrieved", retrieved))
        annotate(session_id=session_id, tenant=tenant, served_from=served_from, tokens=total_tokens)
        return Page(handle, found.seq, content, total_lines, total_tokens, next_offset, served_from)

    async def _refuse_redacted(self, session_id: str, key: int, seq: int) -> None:
        """ItemRedacted when item `seq` was redacted: asked of the history every time, as the
        stash may still hold an original that a redaction's unstashing missed (Redis down)."""
        async with self.store.db.read() as conn:
            withdrawn = await views.retractions(conn, key, [seq])
        if withdrawn.get(seq) == REDACTED:
            raise ItemRedacted(session_id, seq)

    async def search(self, tenant: str, session_id: str, query: SearchQuery) -> tuple[list[Hit], str]:
        """The session's items matching `query`, best first (full text) or in order, a page at a
        time: the hits and the token of the next page ("" after the last)."""
        check_session_id(session_id)
        _check_search(query)
        size = min(query.page_size or DEFAULT_HITS, MAX_HITS)
        offset = _offset(query.page_token)
        pattern = compile_pattern(query.query, "query") if query.mode is SearchMode.REGEX else None
        async with self.store.db.read() as conn:
            row, _, items = await self.store.history_in(conn, tenant, session_id)
            where = query.where
            withdrawn = await views.retractions(conn, row["key"])
            if withdrawn:  # no longer part of the conversation; a redacted one is never read again
                where = replace(where, excluded=tuple(sorted(withdrawn)))
            if query.only_out_of_view:
                where = replace(where, seqs=await self._out_of_view(conn, row["key"]))
            if pattern is not None:
                literals = required_literals(query.query)
                caseless = required_literals(query.query, caseless=True)
                texts = _EncodedTexts(items)
                found = await search.regex(
                    conn, row["key"], pattern, where, size + 1, offset, literals, caseless, texts
                )
            elif query.mode is SearchMode.SUBSTRING:
                found = await search.substring(conn, row["key"], query.query, where, size + 1, offset)
            else:
                found = await search.full_text(conn, row["key"], query.query, where, size + 1, offset)
        hits = [_hit(items[f.seq - 1], f) for f in found[:size]]
        annotate(session_id=session_id, tenant=tenant, items=len(hits))
        return hits, str(offset + size) if len(found) > size else ""

    async def _out_of_view(self, conn: AsyncConnection, key: int) -> tuple[int, ...]:
        """The items out of the session's view: those the edits in force reduce, the durable
        ones included. The state's are read from the state this process's render saved, else
        remembered by the state's version: a state is decoded once a version, not per search."""
        version = await views.state_version(conn, key)
        held = self._reduced.get(key)
        if held is not None and held[0] == version:
            self._reduced.move_to_end(key)
            reduced = held[1]
        else:
            state = self.states.get(key, version) if self.states is not None else None
            if state is None:
                state = await views.load_state(conn, key)
            seqs = {target_of(a.edit) for a in state.applied}
            reduced = array("q", sorted(s for s in seqs if s is not None and s > 0))
            self._remember_reduced(key, state.view_version, reduced)
        durable = await views.mutation_targets(conn, key)
        return tuple(sorted(durable.union(reduced))) if durable else tuple(reduced)

    def _remember_reduced(self, key: int, version: int, reduced: array[int]) -> None:
        dropped = self._reduced.pop(key, None)
        self._reduced_seqs -= len(dropped[1]) if dropped is not None else 0
        self._reduced[key] = (version, reduced)
        self._reduced_seqs += len(reduced)
        while self._reduced_seqs > REDUCED_KEPT and len(self._reduced) > 1:
            _, (_, evicted) = self._reduced.popitem(last=False)
            self._reduced_seqs -= len(evicted)

    async def status(self, tenant: str, session_id: str) -> Status:
        """Where the session stands: its size, its latest view, what is out of it and why."""
        check_session_id(session_id)
        async with self.store.db.read() as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            state = await views.load_state(conn, row["key"])
            in_force = (*await views.load_mutations(conn, row["key"]), *state.applied)
            usage = await views.usage_summary(conn, row["key"])
        latest = max(state.renders.values(), key=lambda r: r.rendered_at, default=None)
        offloaded = []
        listed: set[int] = set()
        for applied in in_force:  # durable edits first: they outrank the state's on the same item
            seq = target_of(applied.edit)
            if seq is None or not 0 < seq <= len(items) or seq in listed:
                continue
            listed.add(seq)
            item = items[seq - 1]
            redacted = applied.reason == REDACTED and is_retraction(applied)
            offloaded.append(
                Offloaded(
                    seq,
                    "" if redacted else handle_of(item),  # nothing gets a redacted original back
                    _tool_of(item, items),
                    _digest_of(item, items),
                    item.token_count,
                    applied.reason,
                )
            )
        return Status(
            version=session.version,
            history_tokens=session.token_count,
            view_tokens=latest.view_tokens if latest is not None else 0,
            budget_tokens=latest.budget_tokens if latest is not None else 0,
            offloaded=sorted(offloaded, key=lambda o: o.seq),
            pending_deferred=len(state.pending),
            stash_hit_rate=self.stash.stats.hit_rate,
            usage=usage,
        )

    async def _durable(self, tenant: str, session_id: str, query: RetrieveQuery) -> Item:
        _, items = await self.store.load_history(tenant, session_id)
        if query.seq:
            if query.seq > len(items):
                raise OriginalNotFound(session_id, f"seq {query.seq}")
            return items[query.seq - 1]
        # Keyed by the first and the last item (the same objects while the session is cached):
        # the list itself is new at every load.
        by_handle = self._handles.get((items[0], items[-1]), lambda: {handle_of(i): i for i in items}) if items else {}
        item = by_handle.get(query.handle)
        if item is None:
            raise OriginalNotFound(session_id, f"handle {query.handle!r}")
        return item

    def _starts(self, key: tuple[Any, ...], text: str) -> array[int]:
        """Where each token of `text` starts, remembered by `key` (an original never changes
        under its handle): paging through a long original tokenizes it once, not per page.
        Called from worker threads too: the memory is kept under a lock."""
        with self._tokenizing:
            found = self._tokenized.get(key)
            if found is not None:
                self._tokenized.move_to_end(key)
                return found
        found = array("I", self.counter.starts(text))  # 4 bytes an offset
        with self._tokenizing:
            self._tokenized[key] = found
            if len(self._tokenized) > TOKENIZED_KEPT:
                self._tokenized.popitem(last=False)
        return found

    def _page(self, handle: str, text: str, query: RetrieveQuery) -> tuple[str, int, int, int]:
        """(content, total lines, total tokens, next offset) of the part the query asks for."""
        total_lines = text.count("\n") + (0 if not text or text.endswith("\n") else 1)
        total_tokens = len(self._starts((handle,), text))
        selected = (query.line_start, query.line_end, query.grep, query.context_lines)
        selection = text
        if any(selected) or query.unit is PageUnit.LINES:
            lines = lines_of(text)
            if query.line_start or query.line_end:
                if query.line_start > len(lines):
                    raise InvalidArgument.at("line_start", f"the original has {len(lines):,} lines")
                lines = lines[max(query.line_start, 1) - 1 : query.line_end or len(lines)]
            if query.grep:
                lines = _grep(lines, query.grep, query.context_lines, first=max(query.line_start, 1))
            if query.unit is PageUnit.LINES:
                content, next_offset = self._lines_page(lines, query.offset, query.size)
                # The totals of what was selected: the last page ends at them.
                return content, len(lines), self.counter.count("".join(lines)), next_offset
            selection = "".join(lines)
        starts = self._starts((handle, *selected), selection) if any(selected) else self._starts((handle,), text)
        if query.offset > len(starts):
            raise InvalidArgument.at("offset", f"past the end ({len(starts):,} tokens)")
        stop = query.offset + min(query.size or self.max_page_tokens, self.max_page_tokens)
        end = starts[stop] if stop < len(starts) else len(selection)
        begin = starts[query.offset] if query.offset < len(starts) else len(selection)
        if any(selected):  # the totals of what was selected: the last page ends at them
            total_lines, total_tokens = (
                selection.count("\n") + (not selection.endswith("\n") and bool(selection)),
                len(starts),
            )
        return selection[begin:end], total_lines, total_tokens, min(stop, len(starts))

    def _lines_page(self, lines: list[str], offset: int, size: int) -> tuple[str, int]:
        """Up to `size` lines from `offset`, as many as fit under the token cap (at least one)."""
        if offset > len(lines):
            raise InvalidArgument.at("offset", f"past the end ({len(lines):,} lines)")
        taken: list[str] = []
        tokens = 0
        for line in lines[offset : offset + size if size else len(lines)]:
            cost = self.counter.count(line)
            if taken and tokens + cost > self.max_page_tokens:
                break
            if not taken and cost > self.max_page_tokens:
                raise InvalidArgument.at(
                    "page_unit",
                    f"line {offset + 1} alone is {cost:,} tokens, over the {self.max_page_tokens:,}-token page cap: "
                    "page by tokens",
                )
            taken.append(line)
            tokens += cost
        return "".join(taken), offset + len(taken)


class SearchMode(Enum):
    FULL_TEXT = "full_text"
    SUBSTRING = "substring"
    REGEX = "regex"


@dataclass(frozen=True, slots=True)
class SearchQuery:
    query: str
    mode: SearchMode = SearchMode.FULL_TEXT
    where: search.Where = field(default_factory=search.Where)
    only_out_of_view: bool = False
    page_size: int = 0
    page_token: str = ""


@dataclass(frozen=True, slots=True)
class Hit:
    seq: int
    handle: str
    snippet: str
    score: float
    role: str
    tool: str


@dataclass(frozen=True, slots=True)
class Offloaded:
    seq: int
    handle: str
    tool: str
    arguments_digest: str
    tokens: int
    """The original's tokens (what the view does not show of it)."""
    reason: str


@dataclass(frozen=True, slots=True)
class Status:
    version: int
    history_tokens: int
    view_tokens: int
    """Tokens of the latest render (any format); 0 before the first."""
    budget_tokens: int
    """The budget that render was asked to fit (0: none)."""
    offloaded: list[Offloaded]
    pending_deferred: int
    stash_hit_rate: float
    """Of this process's stash, since it started."""
    usage: views.UsageSummary
    """The usage predicted for the session's calls, beside the usage reported for them."""


def _check(query: RetrieveQuery) -> None:
    if bool(query.handle) == bool(query.seq):
        raise InvalidArgument.at("target", "give a handle or a seq")
    if query.handle and not HANDLE.fullmatch(query.handle):
        raise InvalidArgument.at("handle", "a handle is 16 lowercase hex characters")
    if not 0 <= query.seq < SEQ_LIMIT:
        raise InvalidArgument.at("seq", "past any seq" if query.seq > 0 else "negative")
    # The wire's fields are unsigned; a direct caller's may not be.
    for name, number in (
        ("offset", query.offset),
        ("page_size", query.size),
        ("line_start", query.line_start),
        ("line_end", query.line_end),
        ("context_lines", query.context_lines),
    ):
        if number < 0:
            raise InvalidArgument.at(name, "negative")
    if query.line_end and query.line_end < query.line_start:
        raise InvalidArgument.at("line_end", "before line_start")
    if len(query.grep) > MAX_GREP_CHARS:
        raise InvalidArgument.at("grep", f"over {MAX_GREP_CHARS:,} characters")
    if query.context_lines > MAX_CONTEXT_LINES:
        raise InvalidArgument.at("context_lines", f"over the maximum of {MAX_CONTEXT_LINES}")


def _check_search(query: SearchQuery) -> None:
    """Before any database work: what the database could not bind or store (a NUL, a seq
    past int64), and filters bounded (each is one parameter, but no list is unbounded)."""
    if not query.query.strip():
        raise InvalidArgument.at("query", "empty")
    if "\x00" in query.query:
        raise InvalidArgument.at("query", "holds a NUL character")
    if len(query.query) > MAX_QUERY_CHARS:
        raise InvalidArgument.at("query", f"over {MAX_QUERY_CHARS:,} characters")
    where = query.where
    if len(where.tools) > MAX_TOOL_FILTERS:
        raise LimitExceeded.at("tools", f"{len(where.tools):,} tool names, over the limit of {MAX_TOOL_FILTERS:,}")
    for n, tool in enumerate(where.tools):
        if "\x00" in tool:
            raise InvalidArgument.at(f"tools[{n}]", "holds a NUL character")
        if len(tool) > MAX_NAME_LENGTH:
            raise InvalidArgument.at(f"tools[{n}]", f"over {MAX_NAME_LENGTH} characters: no tool is named so")
    if len(where.roles) > len(Role):
        raise LimitExceeded.at("roles", f"{len(where.roles):,} roles: there are {len(Role)}, each given at most once")
    for name, number in (("min_seq", where.min_seq), ("max_seq", where.max_seq)):
        if not 0 <= number < SEQ_LIMIT:
            raise InvalidArgument.at(name, "past any seq" if number > 0 else "negative")
    if query.page_size < 0:
        raise InvalidArgument.at("page_size", "negative")


class _EncodedTexts:
    """The texts search reads of `items` (`rows.searchable`'s), UTF-8 encoded as RE2 reads them,
    by index (`search.HeldTexts`): what a regex no index narrows is matched over. Remembered per
    item, as items never change."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> bytes:
        item = self.items[index]
        return _ENCODED.get((item,), lambda: searchable(item).encode())


_ENCODED: IdentityMemo[bytes] = IdentityMemo(200_000)
"""Items' search texts, encoded (a regex search over 10,000 items asks for each; the memos'
byte budget bounds them with the engine's)."""


def _grep(lines: list[str], pattern: str, context: int, first: int) -> list[str]:
    """The lines matching `pattern` with `context` lines around them, each prefixed by its
    line number (``12:`` for a match, ``12-`` for context), groups apart by ``--``."""
    matcher = compile_pattern(pattern, "grep")
    hits = [i for i, line in enumerate(lines) if matcher.search(line.rstrip("\r\n"))]
    shown = sorted({j for i in hits for j in range(max(0, i - context), min(len(lines), i + context + 1))})
    out: list[str] = []
    previous = -2
    hit = set(hits)
    for j in shown:
        if out and j != previous + 1:
            out.append("--\n")
        line = lines[j] if lines[j].endswith("\n") else lines[j] + "\n"
        out.append(f"{first + j}{':' if j in hit else '-'}{line}")
        previous = j
    return out


def _call_of(item: Item, items: Sequence[Item]) -> ToolUseBlock | None:
    """The call a tool output answers."""
    result = item.tool_result
    if result is None:
        return None
    for other in reversed(items[: item.seq - 1]):
        for use in other.tool_uses:
            if use.id == result.tool_use_id:
                return use
    return None


def _tool_of(item: Item, items: Sequence[Item]) -> str:
    call = _call_of(item, items)
    return call.name if call is not None else ",".join(u.name for u in item.tool_uses)


def _digest_of(item: Item, items: Sequence[Item]) -> str:
    call = _call_of(item, items)
    calls = [call] if call is not None else list(item.tool_uses)
    return ",".join(arguments_digest(c.input_json) for c in calls)


def _hit(item: Item, found: search.Found) -> Hit:
    result = item.tool_result
    tool = result.name if result is not None else ",".join(u.name for u in item.tool_uses)
    return Hit(found.seq, handle_of(item), found.snippet, found.score, item.role.value, tool)


def _offset(token: str) -> int:
    if not token:
        return 0
    # ASCII digits only: `isdigit` alone takes "²", which `int` refuses.
    if not (token.isascii() and token.isdigit()) or len(token) > 9:
        raise InvalidArgument.at("page_token", "not a token this service gave")
    return int(token)


def lines_of(text: str) -> list[str]:
    """The text's lines, each with its newline: split at ``\\n`` only, as the compressors count
    them (a form feed or U+2028 inside a line does not end it); they join back to the text."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines
