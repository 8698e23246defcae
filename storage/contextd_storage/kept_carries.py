"""The engine's carries, kept in Redis: a replica that did not make a session's last render
(restarted, new, or one that let the session go to stay in its memory budget) resumes from
what that render worked out instead of deriving the whole session again.

Redis, not Postgres: a carry is derived from the history, which Postgres holds durably, and
is worth keeping only while its session is in use (a TTL); it is large (a few MB for a
10,000-item session, compressed), rewritten whole, and read when a replica first renders the
session. Losing one costs one render the time of deriving it; Postgres would keep such
blobs in its write-ahead log and tables for nothing.

What a replica keeps: the carry of a session of at least `KEEP_FROM_ITEMS` items, which it goes
on holding (a render of the session that comes while it is written waits for the write; one that
comes before takes it over, and it is not written), after a
render that derived the session whole (a first render, or a replica's first of the session) and
again once `--carry-keep-seconds` have passed since it last did (so that what another replica,
or this one after a crash, resumes from is recent: a carry older than the view state's last
full copy cannot be caught up); the carry of each session it lets go of to stay in its memory
budget (`StateCache`'s least recently used); and as it stops, the carries it still holds, the
most recently used first, for as long as its stop allows. Each is pickled off the event loop,
by a thread of its own (carries let go of one at a time, resting between them as long as the
last one took: at most half of a core).

What a replica reads: the session's carry, when it holds none of its own, before its first
render of the session, or, as it starts (`--carry-warm-seconds`), those of the sessions whose
carries were kept most recently (`recent`: a rolling restart's replica holds the sessions its
predecessor stopped with before it takes calls); it is used when it is of the stored view state
or one the stored changes lead on from (as another replica's carry would be), and refused
otherwise, or when its bytes fail their signature or name items not in the history.

The bytes are a pickle (engine/carry_pickle.py), which runs code as it is read: each is
signed with an HMAC of the deployment's secret (`--carry-secret`), checked before it is
read, and stamped with the fingerprint of the code that wrote it, so a carry of other code
(a deploy) is not read. A session's carry is dropped when the session is deleted or items of
it are redacted.

Redis being down fails no call: a carry not read is derived, one not written is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import pickle
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import zstandard
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from contextd.engine.carry_pickle import UnusableCarry, dump_carry, load_carry
from contextd.engine.model import Item
from contextd.engine.pipeline import Carry
from contextd.engine.tokens import TokenCounter
from contextd_storage.stash.redis_stash import redis_client

log = logging.getLogger(__name__)

PREFIX = "contextd:carry"
MAGIC = b"contextd-carry-2\n"
DEFAULT_TTL_SECONDS = 3600.0
FLOOR_SECONDS = 7 * 24 * 3600
"""How long a deleted or redacted session's floor stays (`drop`): no carry written before it is
kept again for that long (a replica that holds one in memory longer may write it: never used,
its durable edits are not the history's, it is gone at its TTL)."""
GONE = 2**52
"""The floor of a deleted session: above any count of durable edits."""
KEEP_FROM_ITEMS = 1000
"""A carry held is kept only for sessions of at least these many items: below it, deriving costs a
replica little more than reading the carry back (bench/kept_carries.py)."""
KEPT_AT_SESSIONS = 65_536
"""Sessions whose last write `due` remembers (one forgotten is due again)."""
QUEUED_BYTES = 64 * 1_048_576
"""Carries let go of and waiting to be written, at most, by `Carry.footprint`: they are let go
of because memory is short; past it the oldest waiting is not written."""
TIMEOUT_SECONDS = 5.0
"""For one carry's write (tens of MB for the longest sessions)."""
READ_SECONDS = 1.0
"""For one carry's read, inside a render's transaction: slower than this, it is derived."""
REST_SECONDS = 1.0
"""After Redis fails to answer, how long it is not asked (reads miss, writes are dropped)."""
RECENT_SESSIONS = 10_000
"""Sessions the deployment's list of recent carries names at most (`recent`), the most recently
kept first."""
ZSTD_LEVEL = 1
"""A 10,000-item carry of bench/scale.py's sessions: 11.9 MB -> 2.1 MB in 12 ms, read back in 6
(zlib at its level 1: 2.4 MB in 56 ms, read back in 25)."""

_PUT = """
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < floor then return 0 end
local held = tonumber(redis.call('HGET', KEYS[1], 'v') or '-1')
if tonumber(ARGV[3]) < held then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[3], 'c', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""
"""A carry (ARGV[1]), unless the session's floor (KEYS[2]) is above its count of durable edits
(ARGV[2]: written before a redaction, or the session deleted) or a carry of a later view state
is kept (a slower replica's older carry does not replace another's newer one)."""

_DROP = """
redis.call('DEL', KEYS[1])
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], math.max(floor, tonumber(ARGV[1])), 'PX', ARGV[2])
return 1
"""


def deployment_of(secret: str) -> str:
    """The deployment's part of its keys' names: deployments that share a Redis with secrets of
    their own keep their sessions' carries apart. Derived slowly (PBKDF2), since key names are
    seen by whoever can list Redis's keys, the secret must not be guessed from them."""
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), b"contextd carries", 100_000).hex()[:16]


_UNREADABLE = (
    pickle.UnpicklingError,
    zstandard.ZstdError,
    AttributeError,
    ImportError,
    EOFError,
    ValueError,
    TypeError,
)
"""What reading signed bytes back may raise when they are not a carry of this code."""


def key_of(deployment: str, session_key: int) -> str:
    return f"{PREFIX}:{deployment}:{{{session_key}}}"


def code_fingerprint() -> str:
    """A digest of the code a pickle's objects are rebuilt with: every file of the `contextd`
    package and the interpreter's version (any change, and a carry is derived again)."""
    import contextd

    digest = hashlib.sha256(sys.version.encode())
    root = Path(contextd.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".yaml", ".json") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class OtherCode(UnusableCarry):
    """A carry another version of the code wrote (or no carry at all)."""


@dataclass(slots=True, eq=False)
class _Held:
    """A held carry's write (`keep_held`)."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    writing: bool = False
    """Its thread has begun to write it: a render of the session waits."""
    given_up: bool = False
    """A render of the session came first and takes it over: it is not written."""


@dataclass(slots=True)
class KeptStats:
    kept: int = 0
    """Carries written."""
    loaded: int = 0
    """Carries read back."""
    resumed: int = 0
    """Of those, carries the render that read them resumed from (not refused by the engine:
    of an earlier state the stored changes do not lead on from, another policy, ...)."""
    missed: int = 0
    """Reads that found none (or Redis did not answer)."""
    refused: int = 0
    """Carries read but not used: a bad signature, another code's, or not of this history."""
    dropped: int = 0
    """Carries not written: a render held them, the queue was full, the write failed, or the
    process stopped first."""
    warmed: int = 0
    """Of those read back, carries read as the process started (`--carry-warm-seconds`)."""
    followed: int = 0
    """Of those read back, carries another replica kept, read as they were listed, before this
    process was asked to render their sessions (`--carry-follow-seconds`)."""


class KeptCarries:
    """The deployment's kept carries (one per session, the last written), and the thread and
    queue that write them."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        secret: str,
        counter: TokenCounter,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        fingerprint: str | None = None,
        keep_seconds: float = 0.0,
    ) -> None:
        self._client = client
        self._secret = secret.encode()
        self._deployment = deployment_of(secret)
        self._counter = counter
        self.ttl_seconds = ttl_seconds
        self.keep_seconds = keep_seconds
        """A carry held and written is written again once this long has passed (0: never)."""
        self._kept_at: OrderedDict[int, float] = OrderedDict()
        """When this process last wrote or read each session's carry (the most recent sessions only)."""
        fingerprint = fingerprint or code_fingerprint()
        self._stamp = MAGIC + fingerprint.encode() + b"\n"
        self._recent = f"{PREFIX}:{self._deployment}:recent:{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}"
        """The list of sessions with carries kept (`recent`) by this code: after a deploy, a
        starting replica of the new code finds none of the old code's, which it would refuse."""
        self.stats = KeptStats()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="contextd-carries")
        self._queue: OrderedDict[int, tuple[Carry, int]] = OrderedDict()
        """Carries let go of, waiting to be written, each with its weight as it was queued."""
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._writing = 0
        """Writes under way (the queue's, and those of carries still held)."""
        self._held: dict[int, _Held] = {}
        """Sessions whose carry, still held, waits to be written or is being written (`settled`)."""
        self._holding = threading.Lock()
        """Between a render that would take a held carry over and the thread about to write it."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._read_back: set[int] = set()
        """Sessions whose carries were read back and not rendered since (`rendered`)."""
        self._resting_until = 0.0
        """After Redis fails to answer, it is not asked until then (a down Redis costs no timeouts)."""
        self._put = client.register_script(_PUT)
        self._drop = client.register_script(_DROP)

    @property
    def idle(self) -> bool:
        """Nothing waits to be written, nor is being written."""
        return not self._queue and not self._writing and not self._held

    @classmethod
    def from_url(
        cls,
        url: str,
        secret: str,
        counter: TokenCounter,
        ttl_seconds: float,
        *,
        keep_seconds: float = 0.0,
        cluster: bool = False,
    ) -> KeptCarries:
        client = redis_client(url, cluster, timeout=TIMEOUT_SECONDS)
        return cls(client, secret, counter, ttl_seconds, keep_seconds=keep_seconds)

    # ------------------------------------------------------------------ reading

    async def load(
        self, session_key: int, items: Sequence[Item], run: Callable[..., Awaitable[Carry]] | None = None
    ) -> Carry | None:
        """The session's kept carry over `items`, or None (none kept, or not usable). `run(fn,
        *args)` reads it off the event loop (the caller's render thread; by default a thread of
        this store's, which may be writing a carry)."""
        data = None
        if self.answering:
            try:
                data = await asyncio.wait_for(self._client.hget(self._key(session_key), "c"), READ_SECONDS)
            except (RedisError, OSError, TimeoutError) as exc:
                log.info("the carry of session %d is not read: %s", session_key, exc or "too slow")
                self._rest()
        if not isinstance(data, bytes):
            self.stats.missed += 1
            return None
        try:
            carry = await (run or self._in_thread)(self._read, session_key, data, items)
        except OtherCode as exc:  # every session's once, after a deploy: expected
            log.debug("the kept carry of session %d is not used: %s", session_key, exc)
            self.stats.refused += 1
            return None
        except UnusableCarry as exc:
            log.info("the kept carry of session %d is not used: %s", session_key, exc)
            self.stats.refused += 1
            return None
        self.stats.loaded += 1
        if len(self._read_back) >= KEPT_AT_SESSIONS:  # (renders that failed after a read: any one goes)
            self._read_back.pop()
        self._read_back.add(session_key)
        self._written(session_key)  # as recent as what another process wrote
        return carry

    def rendered(self, session_key: int, resumed: bool) -> None:
        """Told of each render (`resumed`: from a carry, not deriving the session): one that
        resumed from a carry read back (by its own read, or as the process started) counts."""
        if session_key in self._read_back:
            self._read_back.discard(session_key)
            if resumed:
                self.stats.resumed += 1

    async def _in_thread(self, fn: Callable[..., Carry], *args: object) -> Carry:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _read(self, session_key: int, data: bytes, items: Sequence[Item]) -> Carry:
        n = len(self._stamp)
        if data[:n] != self._stamp:
            raise OtherCode("written by other code (or not a carry)")
        signature, body = data[n : n + 32], data[n + 32 :]
        if not hmac.compare_digest(signature, self._sign(session_key, body)):
            raise UnusableCarry("its signature does not hold (another secret, or altered)")
        try:
            return load_carry(zstandard.ZstdDecompressor().decompress(body), items, self._counter)
        except _UNREADABLE as exc:
            raise UnusableCarry(f"it does not read back: {exc}") from exc

    def _key(self, session_key: int) -> str:
        return key_of(self._deployment, session_key)

    def _sign(self, session_key: int, body: bytes) -> bytes:
        return hmac.new(self._secret, self._stamp + str(session_key).encode() + b"\n" + body, hashlib.sha256).digest()

    # ------------------------------------------------------------------ writing

    def keep(self, session_key: int, carry: Carry) -> None:
        """Write the carry, later, off the event loop (the session's earlier one waiting is
        replaced): a carry this process lets go of. Call from the event loop. One read back and
        never used since (`unused`) is not: what it holds is kept already."""
        if session_key in self._read_back:
            self._read_back.discard(session_key)
            return
        self._enqueue(session_key, carry)
        while self._queued_bytes > QUEUED_BYTES and len(self._queue) > 1:
            self._unqueue(next(iter(self._queue)))
            self.stats.dropped += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())
        self._wake.set()

    def _enqueue(self, session_key: int, carry: Carry) -> None:
        self._unqueue(session_key)
        weight = carry.footprint()
        self._queue[session_key] = (carry, weight)
        self._queued_bytes += weight

    def _unqueue(self, session_key: int) -> Carry | None:
        found = self._queue.pop(session_key, None)
        if found is None:
            return None
        self._queued_bytes -= found[1]
        return found[0]

    def worth_keeping(self, session_key: int, items: int, derived: bool) -> bool:
        """Whether to keep the carry of a render of a session of `items` items (`keep_held`):
        long enough, and derived whole by this process or due again."""
        return items >= KEEP_FROM_ITEMS and (derived or self.due(session_key))

    def due(self, session_key: int) -> bool:
        """Whether the session's held carry was last written `keep_seconds` ago or more (or
        never, by this process)."""
        if not self.keep_seconds:
            return False
        at = self._kept_at.get(session_key)
        return at is None or time.monotonic() - at >= self.keep_seconds

    def keep_held(self, session_key: int, carry: Carry) -> None:
        """Write, off the event loop, a carry this process goes on holding. A render of the
        session that comes first takes it over and it is not written (`settled`); one that
        comes while it is written waits for the write. Call from the event loop, once the
        carry's state is committed."""
        if session_key in self._held:
            return
        held = self._held[session_key] = _Held()
        task = asyncio.get_running_loop().create_task(self._keep_held(session_key, carry, held))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _written(self, session_key: int) -> None:
        self._kept_at.pop(session_key, None)
        self._kept_at[session_key] = time.monotonic()
        if len(self._kept_at) > KEPT_AT_SESSIONS:
            self._kept_at.popitem(last=False)

    async def _keep_held(self, session_key: int, carry: Carry, held: _Held) -> None:
        try:
            await self._write(session_key, carry, held)
        finally:
            del self._held[session_key]
            held.done.set()

    async def settled(self, session_key: int) -> None:
        """Once the session's held carry may be taken over: one waiting to be written is not
        written (the render takes it over now), one being written is, first."""
        held = self._held.get(session_key)
        if held is None:
            return
        with self._holding:
            if not held.writing:
                held.given_up = True
                return
        await held.done.wait()

    async def keep_now(self, held: Sequence[tuple[int, Carry]], seconds: float) -> int:
        """Write `held` (the most recently used first), then what waits, now, for at most `seconds`:
        as the process stops. Returns how many were written. Of `held`, those read back and never
        used since are not written (kept already: written again, they would be listed as new,
        and read again by the replicas that follow)."""
        held = [(session_key, carry) for session_key, carry in held if session_key not in self._read_back]
        for session_key, carry in held:
            self._enqueue(session_key, carry)
        for session_key, _ in reversed(held):  # before those let go of (used less recently), in order
            self._queue.move_to_end(session_key, last=False)
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        deadline = time.monotonic() + seconds
        written = 0
        # In use until now, the most recently used first: listed so (`recent`), above any written before.
        used = time.time() + 0.001 * len(self._queue)
        while self._queue and (left := deadline - time.monotonic()) > 0:
            session_key = next(iter(self._queue))
            waiting = self._unqueue(session_key)
            assert waiting is not None
            used -= 0.001
            try:  # a pickling under way goes on on its thread; the stop does not wait for it
                written += await asyncio.wait_for(self._write(session_key, waiting, used=used), left)
            except TimeoutError:
                self.stats.dropped += 1
                break
        self.stats.dropped += len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        return written

    async def _write_queued(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                session_key = next(iter(self._queue))
                carry = self._unqueue(session_key)
                assert carry is not None
                started = time.monotonic()
                await self._write(session_key, carry)
                await asyncio.sleep(time.monotonic() - started)  # at most half of a core

    @property
    def answering(self) -> bool:
        """Whether Redis is asked: not for `REST_SECONDS` after it failed to answer."""
        return time.monotonic() >= self._resting_until

    def _rest(self) -> None:
        self._resting_until = time.monotonic() + REST_SECONDS

    async def _write(self, session_key: int, carry: Carry, held: _Held | None = None, used: float | None = None) -> int:
        """Write one carry (`held`: one the process goes on holding; `used`: when the session was
        last used, by the clock, now by default); 1 if written, else 0 (and counted): never
        raises but for cancellation."""
        if not self.answering:
            self.stats.dropped += 1
            return 0
        self._writing += 1
        try:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(self._thread, self._bytes, session_key, carry, held)
            if data is None:
                self.stats.dropped += 1
                return 0
            ttl = max(1, round(self.ttl_seconds * 1000))
            keys = [self._key(session_key), self._floor(session_key)]
            put = await self._put(keys=keys, args=[data, len(carry.durable), carry.state.view_version, ttl])
            if put:
                await self._list(session_key, time.time() if used is None else used, ttl)
        except (RedisError, OSError) as exc:
            log.info("the carry of session %d is not kept: %s", session_key, exc)
            self.stats.dropped += 1
            self._rest()
            return 0
        except Exception:  # the writer goes on with the next carry, whatever went wrong with this one
            log.exception("the carry of session %d is not kept", session_key)
            self.stats.dropped += 1
            return 0
        finally:
            self._writing -= 1
        if not put:  # the session was deleted or redacted since, or a later carry of it is kept
            self.stats.dropped += 1
            return 0
        self.stats.kept += 1
        self._written(session_key)
        return 1

    def _bytes(self, session_key: int, carry: Carry, held: _Held | None) -> bytes | None:
        if held is not None:
            with self._holding:
                if held.given_up:
                    return None
                held.writing = True
        try:
            pickled = dump_carry(carry, self._counter, release=held is not None)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # a policy's object that does not pickle
            log.info("the carry of session %d cannot be kept: %s", session_key, exc)
            return None
        if pickled is None:
            return None
        body = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(pickled)
        return self._stamp + self._sign(session_key, body) + body

    def _floor(self, session_key: int) -> str:
        return f"{self._key(session_key)}:floor"

    # ------------------------------------------------------------------ the recent ones

    async def _list(self, session_key: int, used: float, ttl_ms: int) -> None:
        """Name the session among those with a carry kept, as used at `used` (a command of its
        own: in a Redis Cluster the list and the carry are in slots of their own; a session
        deleted in between is named with no carry, a miss when read)."""
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zadd(self._recent, {str(session_key): used})
                pipe.zremrangebyscore(self._recent, "-inf", f"({time.time() - ttl_ms / 1000}")  # their TTLs ended
                pipe.zremrangebyrank(self._recent, 0, -RECENT_SESSIONS - 1)
                pipe.pexpire(self._recent, ttl_ms)
                await pipe.execute()
        except (RedisError, OSError) as exc:  # kept, not listed: read at the session's first render only
            log.info("the carry of session %d is kept but not listed: %s", session_key, exc)

    async def recent(self, count: int = RECENT_SESSIONS) -> list[int]:
        """The sessions whose carries were kept most recently (by when they were last used, as
        their replicas knew it), the most recent first: at most `count`, none when Redis does
        not answer. A session named may have no carry any more (its TTL, a deletion)."""
        return [session_key for session_key, _ in await self.listed(count)]

    async def listed(self, count: int) -> list[tuple[int, float]]:
        """`recent`, each session with when it was last used as its carry was listed: a session
        listed again (its carry kept again) shows another time."""
        if not self.answering:
            return []
        try:
            named = await asyncio.wait_for(
                self._client.zrevrange(self._recent, 0, count - 1, withscores=True), READ_SECONDS
            )
        except (RedisError, OSError, TimeoutError) as exc:
            log.info("the sessions with carries kept are not read: %s", exc or "too slow")
            self._rest()
            return []
        return [(int(pair[0]), float(pair[1])) for pair in named]  # (member, score) pairs

    def known(self, session_key: int) -> bool:
        """Whether this process wrote or read the session's carry (of the most recent
        `KEPT_AT_SESSIONS` sessions): it holds the session's work, or let it go of."""
        return session_key in self._kept_at

    def unused(self, session_key: int) -> bool:
        """Whether the session's carry was read back ahead of its renders (as the process started,
        or another replica kept it) and no render here has used it since."""
        return session_key in self._read_back

    # ------------------------------------------------------------------ forgetting

    async def drop(self, session_key: int, durable: int = GONE) -> None:
        """Forget the session's carry, and keep any replica from writing one again that was made
        before now: the session was deleted (`durable` left as it is), or items of it redacted
        (`durable`: the count of the session's durable edits with the redaction's)."""
        self._unqueue(session_key)
        try:
            await self._drop(
                keys=[self._key(session_key), self._floor(session_key)], args=[durable, FLOOR_SECONDS * 1000]
            )
            await self._client.zrem(self._recent, str(session_key))
        except (RedisError, OSError) as exc:
            log.warning("the carry of session %d is not dropped (its TTL ends it): %s", session_key, exc)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        for task in list(self._tasks):
            task.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)
        await self._client.aclose()
