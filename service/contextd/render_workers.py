"""Where renders run: on worker threads, a bounded number at once, shared fairly by tenants.

A render is CPU work (rules over every item, compressors, the certificate
chain): on the event loop it would stall every other call of the replica for
its duration, whoever made them. So the engine runs on a pool of threads
while the loop goes on serving (the GIL still interleaves them; the loop
gets its turn every switch interval).

A render holds a database transaction (and so a pooled connection) from
loading the session to committing the view state; waiting for a thread inside
it would let queued renders take the whole pool. So a render first takes a
slot here (`FairSlots`), then opens its transaction. One tenant holds at most
`per_tenant` slots, so at least one is left for the others, and a freed slot
goes to the tenant waiting longest among those below their share: a tenant
sending a hundred renders at once delays another tenant's render by at most
one render, not a hundred.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import ParamSpec, TypeVar

from contextd.engine.errors import Retryable

P = ParamSpec("P")
R = TypeVar("R")

_BUSY_RETRY_MS = 500


class RendersBusy(Retryable):
    """Every render slot stayed taken for the bounded wait."""

    reason = "RENDERS_BUSY"

    def __init__(self, waited_ms: int) -> None:
        super().__init__(
            f"every render worker of this server stayed busy for {waited_ms} ms; retry (another replica may be free)",
            _BUSY_RETRY_MS,
        )


class FairSlots:
    """`total` slots, at most `per_tenant` held by one tenant; waiters served in turn by tenant."""

    def __init__(self, total: int, per_tenant: int) -> None:
        if total < 1 or not 1 <= per_tenant <= total:
            raise ValueError(f"slots: total {total} and per tenant {per_tenant} must satisfy 1 <= per_tenant <= total")
        self.total = total
        self.per_tenant = per_tenant
        self._held: collections.Counter[str] = collections.Counter()
        self._waiting: collections.OrderedDict[str, collections.deque[asyncio.Future[None]]] = collections.OrderedDict()

    @property
    def in_use(self) -> int:
        return sum(self._held.values())

    def spare(self, tenant: str) -> bool:
        """Whether no one waits for a slot and, with another taken for `tenant`, one would stay free
        for any tenant's render and for the tenant's own: work that can wait (reading a session
        ahead of its renders) takes a slot only then."""
        return not self._waiting and self.in_use + 1 < self.total and self._held[tenant] + 1 < self.per_tenant

    @asynccontextmanager
    async def slot(self, tenant: str, wait_seconds: float) -> AsyncIterator[None]:
        """Hold one of the tenant's slots; RendersBusy when none frees within `wait_seconds`."""
        await self._acquire(tenant, wait_seconds)
        try:
            yield
        finally:
            self._release(tenant)

    def _free_for(self, tenant: str) -> bool:
        return self.in_use < self.total and self._held[tenant] < self.per_tenant

    async def _acquire(self, tenant: str, wait_seconds: float) -> None:
        if self._free_for(tenant) and tenant not in self._waiting:
            self._held[tenant] += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, collections.deque()).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait_seconds)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                self._release(tenant)  # handed a slot just as the wait ended: give it back
            else:
                waiter.cancel()
                self._forget(tenant, waiter)
            if isinstance(exc, TimeoutError):
                raise RendersBusy(int(wait_seconds * 1000)) from None
            raise

    def _release(self, tenant: str) -> None:
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to waiters: the tenant waiting longest first, among those below their share."""
        for tenant in list(self._waiting):
            if self.in_use >= self.total:
                return
            queue = self._waiting[tenant]
            while queue and queue[0].done():
                queue.popleft()  # timed out or cancelled
            if queue and self._held[tenant] < self.per_tenant:
                self._held[tenant] += 1
                queue.popleft().set_result(None)
                self._waiting.move_to_end(tenant)  # its next waiter queues behind the other tenants
            if not queue:
                del self._waiting[tenant]

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        with suppress(ValueError):  # handed over meanwhile
            queue.remove(waiter)
        if not queue:
            del self._waiting[tenant]
        self._hand_over()


class RenderWorkers:
    """The render threads and the slots in front of them (one slot per thread)."""

    def __init__(self, threads: int, wait_seconds: float) -> None:
        self.slots = FairSlots(threads, per_tenant=max(1, threads - 1))
        self.wait_seconds = wait_seconds
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="contextd-render")

    def slot(self, tenant: str) -> AbstractAsyncContextManager[None]:
        """Hold a render slot for `tenant` (take it before opening the render's transaction)."""
        return self.slots.slot(tenant, self.wait_seconds)

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)` on a render thread, in the caller's context; the caller holds a slot.

        A thread cannot be stopped: when the call is cancelled, this waits for the work
        to end before passing the cancellation on, so the caller's slot stays taken as
        long as its thread is, and a client that cancels renders cannot queue more work
        than there are threads.
        """
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        work = asyncio.get_running_loop().run_in_executor(self._pool, call)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            await asyncio.wait([work])
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
