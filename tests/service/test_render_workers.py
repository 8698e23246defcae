"""Render slots: bounded, shared fairly between tenants, never lost to a timeout or a
cancellation; render threads that keep the event loop free."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from contextd.render_workers import FairSlots, RendersBusy, RenderWorkers


async def _hold(slots: FairSlots, tenant: str, order: list[str], release: asyncio.Event) -> None:
    async with slots.slot(tenant, wait_seconds=30):
        order.append(tenant)
        await release.wait()


async def test_one_tenant_leaves_a_slot_for_the_others_and_waiters_take_turns() -> None:
    slots = FairSlots(total=3, per_tenant=2)
    order: list[str] = []
    gates = [asyncio.Event() for _ in range(8)]
    # Tenant b asks for five renders at once, then tenant a for one.
    tasks = [asyncio.create_task(_hold(slots, "b", order, gates[n])) for n in range(5)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(_hold(slots, "a", order, gates[5])))
    await asyncio.sleep(0.01)
    assert order == ["b", "b", "a"]  # b holds its share of two; a gets the third at once
    assert slots.in_use == 3
    gates[0].set()
    await asyncio.sleep(0.01)
    assert order == ["b", "b", "a", "b"]
    gates[5].set()  # a's slot frees: b may not take a third
    await asyncio.sleep(0.01)
    assert order == ["b", "b", "a", "b"] and slots.in_use == 2
    tasks.append(asyncio.create_task(_hold(slots, "c", order, gates[6])))
    await asyncio.sleep(0.01)
    assert order[-1] == "c"  # a newcomer is not queued behind b's backlog
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks)
    assert slots.in_use == 0 and order.count("b") == 5


async def test_a_wait_past_its_bound_is_retryable_and_gives_the_slot_back() -> None:
    slots = FairSlots(total=1, per_tenant=1)
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(slots, "a", [], release))
    await asyncio.sleep(0)
    with pytest.raises(RendersBusy) as busy:
        async with slots.slot("b", wait_seconds=0.05):
            pass
    assert busy.value.retry_after_ms > 0 and busy.value.reason == "RENDERS_BUSY"
    release.set()
    await holder
    async with slots.slot("b", wait_seconds=1):  # nothing was left taken by the timeout
        assert slots.in_use == 1
    assert slots.in_use == 0


async def test_a_cancelled_waiter_takes_no_slot() -> None:
    slots = FairSlots(total=1, per_tenant=1)
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(slots, "a", [], release))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(_hold(slots, "b", [], asyncio.Event()))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await holder
    assert slots.in_use == 0


def _spin(seconds: float) -> str:
    """CPU work, as a render is: holds the GIL but for the interpreter's switches."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))
    return threading.current_thread().name


async def test_work_runs_on_a_render_thread_while_the_loop_goes_on() -> None:
    workers = RenderWorkers(threads=2, wait_seconds=5)
    try:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticker = asyncio.create_task(tick())
        async with workers.slot("a"):
            name = await workers.run(_spin, 0.5)
        ticker.cancel()
        assert name.startswith("contextd-render")
        # On the loop, the spin would have let no tick through; on a thread, the loop
        # runs between the interpreter's switches (a loose count: the machine may be busy).
        assert ticks >= 5
    finally:
        workers.close()


async def test_a_cancelled_call_keeps_its_slot_until_its_thread_is_done() -> None:
    workers = RenderWorkers(threads=1, wait_seconds=5)
    try:
        done = threading.Event()

        def render() -> None:
            _spin(0.3)
            done.set()

        async def call() -> None:
            async with workers.slot("a"):
                await workers.run(render)

        task = asyncio.create_task(call())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done.is_set()  # the cancellation waited for the thread
        assert workers.slots.in_use == 0
    finally:
        workers.close()


async def test_a_slot_is_to_spare_only_while_none_waits_and_one_would_stay_free() -> None:
    """Work that can wait (a session read ahead of its renders) takes a slot only when a render
    would still find one free."""
    slots = FairSlots(4, per_tenant=3)
    assert slots.spare("a")
    async with slots.slot("a", 1):
        assert slots.spare("a") and slots.spare("b")  # three free: one taken, two left
        async with slots.slot("a", 1):
            assert not slots.spare("a")  # the tenant's last: its own next render's
            assert slots.spare("b")
            async with slots.slot("b", 1):
                assert not slots.spare("b") and not slots.spare("c")  # one free: a render's
                async with slots.slot("c", 1):
                    waiting = asyncio.create_task(_held_briefly(slots, "c"))
                    await asyncio.sleep(0.01)
                    assert not slots.spare("d")  # (all taken, and a render waits)
                await waiting
    assert slots.spare("a")
    assert not FairSlots(1, per_tenant=1).spare("a")  # one thread: renders alone


async def _held_briefly(slots: FairSlots, tenant: str) -> None:
    async with slots.slot(tenant, 1):
        await asyncio.sleep(0)
