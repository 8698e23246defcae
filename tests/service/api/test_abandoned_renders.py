"""A render whose caller gave up while the engine worked (its deadline passed, the call was
cancelled) is kept: the work, which a render thread cannot stop, is stored as any render's,
and the next render resumes from it instead of deriving the session again. It is no model call."""

from __future__ import annotations

import time
from typing import Any

import pytest

from contextd import view_service
from contextd_client import Client, DeadlineExceeded, RetryPolicy, ViewFormat
from tests.conftest import ServerThread
from tests.service.api.test_view_engine import conversation


def test_a_render_its_caller_gave_up_on_is_stored_and_the_next_resumes_from_it(
    server: ServerThread, client: Client, session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation(client, session_id)
    engine = view_service._render
    resumed: list[bool] = []

    def outlasting_the_first_caller(*args: Any) -> Any:
        if not resumed:
            time.sleep(1.0)  # on the render thread: the caller's deadline passes meanwhile
        done = engine(*args)
        resumed.append(done[3])
        return done

    monkeypatch.setattr(view_service, "_render", outlasting_the_first_caller)
    hasty = Client(server.target, timeout=0.3, retry=RetryPolicy(max_attempts=1))
    with hasty, pytest.raises(DeadlineExceeded):
        hasty.render_view(session_id, ViewFormat.OPENAI_CHAT)
    client.append_openai(session_id, [{"role": "user", "content": "Now run the tests."}])
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)  # after the first (the session's lock)
    assert (view.view_version, resumed) == (2, [False, True])
    # No model is called with the view its caller never got: one render of the two is a call.
    assert client.get_status(session_id).usage.renders == 1
