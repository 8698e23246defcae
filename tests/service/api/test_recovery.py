"""Getting originals back through Retrieve: from the stash, from the durable record when the
stash has lost them (TTL, flush, restart, another replica, Redis down), bounded pages that join
back to the exact original, grep with context, and handles that never cross sessions."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from contextd_client import Client, ContextdError, ViewFormat
from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for
from tests.service.api.test_view_engine import COLD, conversation

MASK_OLD = COLD + (
    "protection: {last_turns: 1}\nevidence: {max_level: 4}\n"
    "rules: [{name: mask-old-outputs, transform: mask, when: {roles: [tool]}}]\n"
)


def pruned_handles(client: Client, session_id: str) -> dict[int, str]:
    """seq -> handle of every item the render took out of the view."""
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    return {c.seq: c.handle for c in view.certificates if c.decision == "prune"}


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_a_pruned_original_comes_back_from_the_stash_then_from_the_history(
    database_url: str, redis_url: str, redis_client: redis.Redis
) -> None:
    first = ServerThread(settings_for(database_url, redis_url=redis_url, stash_ttl_seconds=1.0)).start()
    try:
        with Client(first.target) as client:
            session = client.create_session(f"rec-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
            conversation(client, session, rounds=3)
            handles = pruned_handles(client, session)
            assert sorted(handles) == [4, 6]
            original = "output number 0\n" * 20
            hit = client.retrieve(session, handles[4])
            assert (hit.content, hit.seq, hit.served_from) == (original, 4, "stash")
            assert (hit.total_lines, hit.next_offset) == (20, hit.total_tokens)

            time.sleep(2.2)  # past the stash's TTL: the durable record answers, and warms the stash again
            expired = client.retrieve(session, handles[4])
            assert (expired.content, expired.served_from) == (original, "history")
            assert client.retrieve(session, handles[4]).served_from == "stash"

            redis_client.flushdb()
            assert client.retrieve(session, handles[6]).served_from == "history"
            assert client.retrieve(session, seq=6).content == "output number 1\n" * 20
    finally:
        first.stop()
    # A restarted service, and another replica, with the stash emptied: the handle still answers.
    redis_client.flushdb()
    again = ServerThread(settings_for(database_url, redis_url=redis_url)).start()
    other = ServerThread(settings_for(database_url)).start()  # no Redis: its own in-process stash
    try:
        for target in (again.target, other.target):
            with Client(target) as client:
                back = client.retrieve(session, handles[6])
                assert (back.content, back.served_from) == ("output number 1\n" * 20, "history")
    finally:
        again.stop()
        other.stop()


def test_a_handle_of_another_session_or_tenant_is_not_found(make_server: object) -> None:
    server = make_server(api_keys="acme:key-a,umbrella:key-u")  # type: ignore[operator]
    with (
        Client(server.target, api_key="key-a") as acme,
        Client(server.target, api_key="key-u") as umbrella,
    ):
        a = acme.create_session("a", policy=MASK_OLD).id
        conversation(acme, a, rounds=3)
        handle = pruned_handles(acme, a)[4]
        assert acme.retrieve(a, handle).content.startswith("output number 0")
        b = acme.create_session("b").id
        acme.append_openai(b, [{"role": "user", "content": "something else"}])
        for ask in (lambda: acme.retrieve(b, handle), lambda: umbrella.retrieve("a", handle)):
            with pytest.raises(ContextdError) as refused:
                ask()
            assert refused.value.code == "NOT_FOUND"
        with pytest.raises(ContextdError) as unknown:
            acme.retrieve(a, "0123456789abcdef")
        assert unknown.value.code == "NOT_FOUND" and "names nothing" in unknown.value.message
        with pytest.raises(ContextdError) as malformed:
            acme.retrieve(a, "not-a-handle")
        assert malformed.value.code == "INVALID_ARGUMENT"
        acme.delete_session(a)
        acme.create_session("a")
        with pytest.raises(ContextdError) as gone:  # a new session of the same name holds none of it
            acme.retrieve("a", handle)
        assert gone.value.code == "NOT_FOUND"


def big_output() -> str:
    lines = [
        f"{n:05d} {'é' if n % 7 == 0 else 'e'} value={n * 37 % 1009} status={'FAIL' if n == 4321 else 'ok'}"
        for n in range(6000)
    ]
    return "\n".join(lines) + "\n"


def test_a_large_original_comes_back_in_bounded_pages_that_join_exactly(make_server: object) -> None:
    server = make_server()  # type: ignore[operator]
    original = big_output()
    with Client(server.target) as client:
        session = client.create_session("big", policy=MASK_OLD).id
        call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        client.append_openai(
            session,
            [
                {"role": "user", "content": "Scan."},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": original},
                {"role": "user", "content": "Go on."},
                {"role": "assistant", "content": "Done."},
            ],
        )
        handle = pruned_handles(client, session)[3]
        first = client.retrieve(session, handle)
        assert first.total_tokens > 40_000 and first.total_lines == 6000
        pages, offset = [], 0
        while offset < first.total_tokens:
            page = client.retrieve(session, handle, offset=offset, page_size=5000)  # asks for more than the cap
            assert 0 < page.next_offset - offset <= 2000
            pages.append(page.content)
            offset = page.next_offset
        assert "".join(pages) == original  # byte for byte, multi-byte characters included

        lines, offset = [], 0
        while offset < first.total_lines:
            page = client.retrieve(session, handle, page_unit="lines", offset=offset, page_size=700)
            lines.append(page.content)
            offset = page.next_offset
        assert "".join(lines) == original

        ranged = client.retrieve(session, handle, page_unit="lines", line_start=10, line_end=12)
        assert ranged.content == "".join(original.splitlines(keepends=True)[9:12])
        found = client.retrieve(session, handle, page_unit="lines", grep=r"status=FAIL", context_lines=1)
        assert found.content == (
            f"4321-{original.splitlines()[4320]}\n4322:{original.splitlines()[4321]}\n"
            f"4323-{original.splitlines()[4322]}\n"
        )
        with pytest.raises(ContextdError) as bad:
            client.retrieve(session, handle, grep="(unclosed")
        assert bad.value.code == "INVALID_ARGUMENT" and "grep" in bad.value.message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A redis-server of this test's own, to stop and start again."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (the CI machine has it)")
        self.binary, self.port = binary, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(self.url) as probe:  # its socket closed, not left to the collector
                    probe.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def test_with_redis_down_appends_renders_and_retrieves_go_on_and_the_stash_comes_back(make_server: object) -> None:
    own = OwnRedis()
    own.start()
    try:
        server = make_server(redis_url=own.url)  # type: ignore[operator]
        with Client(server.target) as client:
            session = client.create_session("down", policy=MASK_OLD).id
            conversation(client, session, rounds=2)
            handle = pruned_handles(client, session)[4]
            assert client.retrieve(session, handle).served_from == "stash"

            own.stop()
            more = [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c9", "content": "output number 9\n" * 20},
                {"role": "user", "content": "Next."},
            ]
            client.append_openai(session, more)  # appends and renders do not notice
            assert 6 in pruned_handles(client, session)
            down = client.retrieve(session, handle)
            assert (down.content, down.served_from) == ("output number 0\n" * 20, "history")

            own.start()  # empty: what was stashed before is gone
            time.sleep(1.2)  # the stash rests a second after a failure, then tries again
            assert client.retrieve(session, handle).served_from == "history"  # and stashes it again
            assert client.retrieve(session, handle).served_from == "stash"
    finally:
        own.stop()


def test_status_says_what_is_out_of_the_view_and_how_to_get_it_back(client: Client) -> None:
    session = client.create_session(f"status-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
    before = client.get_status(session)
    assert (before.version, before.view_tokens, before.offloaded) == (0, 0, ())
    conversation(client, session, rounds=3)
    view = client.render_view(session, ViewFormat.OPENAI_CHAT, budget_tokens=5000)
    status = client.get_status(session)
    assert status.version == 8 and status.view_tokens == view.total_tokens < status.history_tokens
    assert status.budget_tokens == 5000
    assert [(o.seq, o.tool_name, o.reason) for o in status.offloaded] == [(4, "bash", "masked"), (6, "bash", "masked")]
    assert {o.handle for o in status.offloaded} == {c.handle for c in view.certificates if c.decision == "prune"}
    first = status.offloaded[0]
    assert first.arguments_digest.startswith("sha256:") and first.tokens > 0
    assert client.retrieve(session, first.handle).content == "output number 0\n" * 20
    assert status.pending_deferred == 0 and 0.0 <= status.stash_hit_rate <= 1.0


def test_turns_a_budget_left_out_whole_come_back_by_the_seqs_their_marker_names(client: Client) -> None:
    """A long session over a small budget: its oldest turns leave whole, behind one marker that
    names their seqs; each comes back by its seq (and by the handle its certificate names)."""
    session = client.create_session(f"runs-{uuid.uuid4().hex[:10]}").id
    conversation(client, session, rounds=60)
    view = client.render_view(session, ViewFormat.OPENAI_CHAT, budget_tokens=1_500)
    assert not view.over_budget and view.total_tokens <= 1_500
    markers = [m["content"] for m in view.messages if "[contextd: items " in str(m.get("content"))]
    assert len(markers) == 1
    first, last = map(int, re.findall(r"items (\d+) to (\d+) ", markers[0])[0])
    handles = {c.seq: c.handle for c in view.certificates if c.decision == "prune" and c.rule == "budget"}
    for seq in (first + 1, (first + last) // 2 // 2 * 2, last):  # outputs have even seqs
        back = client.retrieve(session, seq=seq)
        assert back.seq == seq and back.content == f"output number {seq // 2 - 2}\n" * 20
        assert client.retrieve(session, handles[seq]).content == back.content


def test_a_render_that_prunes_many_items_stashes_them_all(make_server: object, redis_url: str) -> None:
    server = make_server(redis_url=redis_url)  # type: ignore[operator]
    with Client(server.target, timeout=30) as client:
        session = client.create_session("many", policy=MASK_OLD).id
        conversation(client, session, rounds=150)
        handles = pruned_handles(client, session)
        assert len(handles) == 149
        assert {client.retrieve(session, h).served_from for h in handles.values()} == {"stash"}


def test_a_selection_pages_to_its_own_end(make_server: object) -> None:
    server = make_server()  # type: ignore[operator]
    with Client(server.target) as client:
        session = client.create_session("sel").id
        client.append_openai(session, [{"role": "user", "content": "".join(f"line {n}\n" for n in range(100))}])
        first = client.retrieve(session, seq=1, line_start=3, line_end=5, page_size=2)
        assert first.total_lines == 3
        pages, offset = [], 0
        while offset < first.total_tokens:
            page = client.retrieve(session, seq=1, line_start=3, line_end=5, page_size=2, offset=offset)
            pages.append(page.content)
            offset = page.next_offset
        assert "".join(pages) == "line 2\nline 3\nline 4\n"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"seq": 2**64 - 1}, "seq"),
        ({"seq": 2**63}, "seq"),
        ({"seq": 1, "offset": 2**64 - 1}, "offset"),
        ({"seq": 1, "offset": 2**64 - 1, "page_unit": "lines"}, "offset"),
        ({"seq": 1, "line_start": 2**32 - 1}, "line_start"),
        ({"seq": 1, "context_lines": 2**32 - 1, "grep": "x"}, "context_lines"),
    ],
)
def test_retrieve_values_past_any_item_name_their_field(
    client: Client, session_id: str, options: dict[str, object], field: str
) -> None:
    client.append_openai(session_id, [{"role": "user", "content": "one\ntwo\n"}])
    with pytest.raises(ContextdError) as bad:
        client.retrieve(session_id, **options)  # type: ignore[arg-type]
    assert bad.value.code == "INVALID_ARGUMENT" and bad.value.message.startswith(f"{field}:")


def test_retrieve_takes_the_largest_sizes_and_line_ends_as_the_cap(client: Client, session_id: str) -> None:
    client.append_openai(session_id, [{"role": "user", "content": "one\ntwo\n"}])
    assert client.retrieve(session_id, seq=1, page_size=2**32 - 1).content == "one\ntwo\n"
    assert client.retrieve(session_id, seq=1, line_start=2, line_end=2**32 - 1).content == "two\n"
    assert client.retrieve(session_id, seq=1, page_unit="lines", page_size=2**32 - 1).next_offset == 2


def test_the_stash_serves_from_a_redis_cluster(sqlite_url: str, redis_cluster_url: str) -> None:
    server = ServerThread(settings_for(sqlite_url, redis_url=redis_cluster_url, redis_cluster=True)).start()
    try:
        with Client(server.target) as client:
            session = client.create_session(f"cluster-{uuid.uuid4().hex[:10]}", policy=MASK_OLD).id
            conversation(client, session, rounds=3)
            handles = pruned_handles(client, session)
            hits = [client.retrieve(session, handle) for handle in handles.values()]
            assert [(h.seq, h.served_from) for h in hits] == [(seq, "stash") for seq in handles]
    finally:
        server.stop()
