"""A view state's full copy, once due, is made after the render that stored the state as a
change, in a transaction of its own (`ViewService._copy_later`, `views.save_copy`): the render
itself stores its change alone. (Made inside the render, a copy of 5.4 MB at 10,000 items made
one render in 256 take about 0.2 s.) On both backends."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from contextd.api.auth import DEFAULT_TENANT
from contextd.engine.state import state_to_json
from contextd_client import Client
from contextd_storage import views
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore
from tests import conftest
from tests.conftest import ServerThread


def _call(n: int) -> list[dict[str, Any]]:
    use = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls"})}}
    output = "\n".join(f"file_{n}_{k}.py" for k in range(30))
    return [
        {"role": "assistant", "content": None, "tool_calls": [use]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": output},
    ]


async def _stored(url: str, session_id: str) -> tuple[int, views.StoredState]:
    db = Database(url)
    try:
        store = HistoryStore(db)
        key = await store.session_key(DEFAULT_TENANT, session_id)
        async with db.read() as conn:
            return key, await views.read_state(conn, key)  # (from the database alone: no state held)
    finally:
        await db.close()


def test_a_full_copy_due_is_made_after_its_render_and_reads_back_as_the_state(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "MOST_CHANGES", 2)  # a copy due at every third render after one
    copied_in_render: list[bool] = []
    save_render = views.save_render

    async def saved(conn: Any, key: int, before: Any, change: str, copy: str | None, *args: Any, **kwargs: Any) -> None:
        copied_in_render.append(copy is not None)
        await save_render(conn, key, before, change, copy, *args, **kwargs)

    monkeypatch.setattr(views, "save_render", saved)
    server = ServerThread(conftest.test_settings(database_url)).start()
    try:
        with Client(server.target, held_views=0) as client:
            session = client.create_session().id
            for n in range(7):
                client.append_openai(session, _call(n))
                client.render_view(session, "openai_chat")
        # Only the first render, which had no copy to start from, stored one itself.
        assert copied_in_render == [True, False, False, False, False, False, False]
        deadline = time.monotonic() + 30
        while True:  # the copy due at the seventh render (4 and 7: copies due), made after it
            key, stored = asyncio.run(_stored(database_url, session))
            if stored.snapshot_version == 7 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (stored.state.view_version, stored.snapshot_version, stored.change_bytes) == (7, 7, 0)
        assert server._running is not None and server._running.states is not None
        held = server._running.states.latest(key)  # the state the server's last render made
        assert held is not None and state_to_json(stored.state) == state_to_json(held)
    finally:
        server.stop()


def test_an_operators_command_makes_a_copy_due_in_its_render(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service with no render threads is an operator's command (`contextd prune --apply`), a
    process that ends after its render: the copy due is made in the render, as it was."""
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd.view_service import ViewService

    monkeypatch.setattr(views, "MOST_CHANGES", 0)  # a copy due at every render
    server = ServerThread(conftest.test_settings(database_url)).start()
    try:
        with Client(server.target, held_views=0) as client:
            session = client.create_session().id
            client.append_openai(session, _call(0))
            client.render_view(session, "openai_chat")
            client.append_openai(session, _call(1))
    finally:
        server.stop()

    async def render_by_hand() -> views.StoredState:
        db = Database(database_url)
        service = ViewService(HistoryStore(db), TiktokenCounter(), TransformRegistry.default())
        try:
            await service.render(DEFAULT_TENANT, session, ViewRequest(ViewFormat.OPENAI_CHAT), force=True)
            assert not service._copying
        finally:
            await db.close()
        return (await _stored(database_url, session))[1]

    stored = asyncio.run(render_by_hand())
    assert (stored.state.view_version, stored.snapshot_version) == (2, 2)
