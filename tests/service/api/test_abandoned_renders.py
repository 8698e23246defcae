"""A render whose caller gave up once the engine had started (its deadline passed, the call was
cancelled) is kept: the work, which a render thread cannot stop, is stored as any render's, and
the next render resumes from it instead of deriving the session again. It is no model call, and
a server that stops waits for it to be stored."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contextd import view_service
from contextd.engine.view import ViewFormat as Format
from contextd.engine.view import ViewRequest
from contextd_client import Client, DeadlineExceeded, RetryPolicy, ViewFormat
from contextd_storage import views
from tests.clients.test_targets import CountCalls
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for
from tests.service.api.test_view_engine import conversation


def resumed_by_renders(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each render from here on resumed from a carry (else it derived the session)."""
    engine = view_service._render
    resumed: list[bool] = []

    def spied(*args: Any) -> Any:
        done = engine(*args)
        resumed.append(done[3])
        return done

    monkeypatch.setattr(view_service, "_render", spied)
    return resumed


def slowed_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    """`owner.name` sleeps 1.5 s at its first call (on a render thread: nothing stops it; in
    the render's transaction: past the caller's deadline, `given_up`)."""
    slow: Callable[..., Any] = getattr(owner, name)
    calls: list[int] = []

    def first_slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.5)
        return slow(*args, **kwargs)

    async def first_slow_async(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(1.5)
        return await slow(*args, **kwargs)

    monkeypatch.setattr(owner, name, first_slow_async if inspect.iscoroutinefunction(slow) else first_slow)


def given_up(target: str, session_id: str) -> None:
    # 1 s: time enough for the render to start its engine first on a busy machine (0.5 s was
    # not, once in a full run: nothing was stored), and less than the engine's 1.5 s sleep.
    hasty = Client(target, timeout=1.0, retry=RetryPolicy(max_attempts=1))
    with hasty, pytest.raises(DeadlineExceeded):
        hasty.render_view(session_id, ViewFormat.OPENAI_CHAT)


@pytest.mark.parametrize(
    ("slowed", "model_calls"),
    [
        ("the engine", 1),
        ("its certificates", 1),  # given up before its model call was recorded: none is
        ("its commit", None),  # given up after its call was recorded (or before, on a slow machine)
    ],
)
def test_a_render_its_caller_gave_up_on_is_stored_and_the_next_resumes_from_it(
    server: ServerThread,
    client: Client,
    session_id: str,
    monkeypatch: pytest.MonkeyPatch,
    slowed: str,
    model_calls: int | None,
) -> None:
    conversation(client, session_id)
    resumed = resumed_by_renders(monkeypatch)
    owner, name = {
        "the engine": (view_service, "_render"),
        "its certificates": (view_service.certificate_log, "append_certificates"),
        "its commit": (views, "save_render"),
    }[slowed]
    slowed_once(monkeypatch, owner, name)
    given_up(server.target, session_id)
    client.append_openai(session_id, [{"role": "user", "content": "Now run the tests."}])
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)  # after the first (the session's lock)
    assert (view.view_version, resumed) == (2, [False, True])
    if model_calls is not None:
        assert client.get_status(session_id).usage.renders == model_calls


def test_the_client_renders_again_after_its_deadline_and_the_render_resumes_from_the_abandoned_one(
    server: ServerThread, client: Client, session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation(client, session_id)
    resumed = resumed_by_renders(monkeypatch)
    slowed_once(monkeypatch, view_service, "_render")
    with Client(server.target, timeout=0.5) as hasty:  # the default retries
        view = hasty.render_view(session_id, ViewFormat.OPENAI_CHAT)
    # (a try of it may outlast 0.5 s on a busy machine too, and be kept as the first was)
    assert view.view_version == len(resumed) >= 2 and resumed == [False] + [True] * (len(resumed) - 1)


def test_a_render_tried_again_after_its_deadline_goes_to_the_replica_that_kept_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'replicas.db'}"
    counters = [CountCalls(), CountCalls()]
    replicas = [ServerThread(settings_for(url, migrate_on_start=True), [counters[0]]).start()]
    replicas.append(ServerThread(settings_for(url), [counters[1]]).start())
    try:
        with Client(replicas[0].target, timeout=15) as client:
            session_id = client.create_session().id
            conversation(client, session_id)
        resumed = resumed_by_renders(monkeypatch)
        slowed_once(monkeypatch, view_service, "_render")
        # Host names: a channel each, a call's retries moving from one to the next (test_targets.py).
        targets = [f"localhost:{r.target.rsplit(':', 1)[1]}" for r in replicas]
        with Client(targets, timeout=0.5) as hasty:
            view = hasty.render_view(session_id, ViewFormat.OPENAI_CHAT)
    finally:
        for replica in replicas:
            replica.stop()
    # Every try on the replica that kept the render (the other would derive the session, holding
    # no carry of it): the one that resumed from it answered.
    assert sorted(c.seen["RenderView"] for c in counters)[0] == 0
    assert view.view_version == len(resumed) >= 2 and resumed == [False] + [True] * (len(resumed) - 1)


def test_a_server_stopping_waits_for_an_abandoned_render_to_be_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'stopping.db'}"
    first = ServerThread(settings_for(url, migrate_on_start=True)).start()
    with Client(first.target, timeout=15) as client:
        session_id = client.create_session().id
        conversation(client, session_id)
    slowed_once(monkeypatch, view_service, "_render")
    given_up(first.target, session_id)
    first.stop(grace=10)  # at once: the call was over; the render still works on its thread
    second = ServerThread(settings_for(url)).start()
    try:
        with Client(second.target, timeout=15) as client:
            assert client.render_view(session_id, ViewFormat.OPENAI_CHAT).view_version == 2
    finally:
        second.stop()


def test_a_caller_cancelled_as_its_render_is_handed_a_slot_leaves_nothing_rendered(
    server: ServerThread, client: Client, session_id: str
) -> None:
    conversation(client, session_id)
    running = server._running
    assert running is not None and running.views is not None and running.views.workers is not None
    views, slots = running.views, running.views.workers.slots

    async def cancelled_as_a_slot_frees() -> int:
        held = []
        for _ in range(slots.per_tenant):  # the tenant's every slot taken
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(slots.slot("default", 5))
            held.append(stack)
        caller = asyncio.create_task(views.render("default", session_id, ViewRequest(Format.OPENAI_CHAT)))
        await asyncio.sleep(0.05)  # its render waits for a slot
        await held.pop().aclose()  # one is handed to it, and in the same turn of the loop
        caller.cancel()  # its caller gives up (a wait handed what it waited for may not say so)
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        for stack in held:
            await stack.aclose()
        await views.wait_for_renders(5)
        return slots.in_use

    assert asyncio.run_coroutine_threadsafe(cancelled_as_a_slot_frees(), server._loop).result(30) == 0
    assert client.render_view(session_id, ViewFormat.OPENAI_CHAT).view_version == 1  # the first stored
