"""Renders on render processes (`--render-processes`): the same views as one process, the
same answers to bad calls, a render process that dies started again, none outliving its
server (contextd/render_processes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from contextd.config import Settings
from contextd.render_processes import environment_of, route, settings_of
from contextd_client import Client, ViewFormat
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from contextd_lab.service import ServerProcess
from contextd_storage import migrate
from tests import backends
from tests.integration.test_replicas import _agent_turn

PIDS = re.compile(r"render processes, pids (\d+), (\d+)")


def pids_of(server: ServerProcess) -> list[int]:
    found = next(m for m in map(PIDS.search, server.log) if m)
    return [int(p) for p in found.groups()]


SOCKET = re.compile(r"serving the renders of its parent on unix:(\S+)")


def sockets_of(server: ServerProcess) -> set[Path]:
    """The render processes' sockets, from their log lines (each may come just after the server's)."""
    assert wait_until(lambda: len(SOCKET.findall("\n".join(server.log))) == 2, 10), server.log
    return {Path(path) for path in SOCKET.findall("\n".join(server.log))}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a child of this test's process that has exited but was not reaped still "exists"
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (gone between the open and the read: ESRCH)
        return False


def wait_until(predicate, seconds: float = 30) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def sessions_on_each(count: int, tenant: str = "default") -> list[str]:
    """Session ids, `count` of them, that the routing sends to each of two render processes in turn."""
    ids: list[str] = []
    n = 0
    while len(ids) < count:
        candidate = f"routed-{n}"
        if route(tenant, candidate, 2) == len(ids) % 2:
            ids.append(candidate)
        n += 1
    return ids


def test_the_settings_a_render_process_gets_load_from_its_environment() -> None:
    settings = Settings.load(
        {"CONTEXTD_API_KEYS": "a:k1", "CONTEXTD_TENANT_REQUESTS_PER_SECOND": "5"},
        {"render_processes": 2, "metrics_listen": "0.0.0.0:9464", "lock_timeout_ms": 750, "grace_seconds": 2.5},
    )
    child = settings_of(settings, 1, "/tmp/x/1.sock")
    assert Settings.load(environment_of(child)) == child
    assert (child.listen, child.render_processes, child.render_worker) == ("unix:/tmp/x/1.sock", 0, True)
    assert (child.api_keys, child.lock_timeout_ms, child.grace_seconds) == ("a:k1", 750, 2.5)
    assert child.tenant_requests_per_second == 0  # the parent admits the call before handing it on
    assert child.metrics_listen == "0.0.0.0:9466"  # a port of its own


def test_a_session_always_goes_to_one_render_process_and_sessions_spread() -> None:
    assert {route("t", "s-1", 4) for _ in range(3)} == {route("t", "s-1", 4)}
    # The same in every serving process, whatever its string hashing (Python's is salted per process).
    elsewhere = subprocess.run(
        [sys.executable, "-c", "from contextd.render_processes import route; print(route('t', 's-1', 1000))"],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(elsewhere.stdout) == route("t", "s-1", 1000)
    spread = [route("t", f"s-{n}", 4) for n in range(400)]
    assert all(70 < spread.count(k) < 130 for k in range(4)), [spread.count(k) for k in range(4)]
    assert route("a", "s", 1000) != route("b", "s", 1000)  # the tenant is part of the key


@pytest.fixture
def database(postgres_server_url: str) -> Iterator[str]:
    url = backends.create_database(postgres_server_url, "contextd_render_processes")
    asyncio.run(migrate.upgrade(url))
    try:
        yield url
    finally:
        backends.drop_database(postgres_server_url, url)


def test_views_rendered_on_render_processes_are_those_of_one_process(database: str) -> None:
    """A server handing its renders to two render processes and a plain one, over one database:
    twin sessions rendered call by call give the same views and the same decisions."""
    common = ("--database-url", database, "--no-migrate-on-start")
    with (
        ServerProcess(*common, "--render-processes", "2") as handing,
        ServerProcess(*common) as plain,
        Client(handing.target, timeout=60) as on_handing,
        Client(plain.target, timeout=60) as on_plain,
    ):
        routed = sessions_on_each(2)
        twins = [f"twin-{s}" for s in routed]
        prompt = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix test_parse."}]
        for session in (*routed, *twins):
            on_plain.create_session(session)
            on_plain.append_openai(session, prompt)
        for n in range(1, 26):
            for session, twin in zip(routed, twins, strict=True):
                on_plain.append_openai(session, _agent_turn(n))
                on_plain.append_openai(twin, _agent_turn(n))
                fmt = ViewFormat.ANTHROPIC_MESSAGES if n % 2 else ViewFormat.OPENAI_CHAT
                handed, alone = on_handing.render_view(session, fmt), on_plain.render_view(twin, fmt)
                assert (handed.messages_json, handed.system, handed.items, handed.total_tokens) == (
                    alone.messages_json,
                    alone.system,
                    alone.items,
                    alone.total_tokens,
                ), (session, n)
                assert [(c.seq, c.decision, c.rule, c.reason) for c in handed.certificates] == [
                    (c.seq, c.decision, c.rule, c.reason) for c in alone.certificates
                ], (session, n)
        assert sum(c.decision == "prune" for c in on_plain.list_certificates(routed[0])) > 5
        assert not any("ERROR" in line for line in handing.log), handing.log
        # The renders were the render processes': with the first gone, its session's renders
        # fail on the handing server alone, and the other's go on.
        first = pids_of(handing)[0]
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: not alive(first))
        assert _render(handing.target, routed[0], None)[2]["contextd-reason"] == "RENDER_PROCESS_UNAVAILABLE"
        assert _render(handing.target, routed[1], None)[0] is grpc.StatusCode.OK
        assert _render(plain.target, routed[0], None)[0] is grpc.StatusCode.OK


def _status(call: grpc.RpcError) -> tuple[grpc.StatusCode, str, dict[str, str | bytes]]:
    return call.code(), call.details(), dict(call.trailing_metadata() or ())


def _render(
    target: str, session_id: str, key: str | None, known: bytes = b""
) -> tuple[grpc.StatusCode, str, dict[str, str | bytes]]:
    with grpc.insecure_channel(target) as channel:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        metadata = (("authorization", f"Bearer {key}"),) if key else ()
        try:
            stub.RenderView(
                api.RenderViewRequest(
                    session_id=session_id, format=api.VIEW_FORMAT_OPENAI_CHAT, known_view_token=known
                ),
                metadata=metadata,
                timeout=30,
            )
        except grpc.RpcError as exc:
            return _status(exc)  # type: ignore[arg-type]
    return grpc.StatusCode.OK, "", {}


def test_a_render_process_answers_bad_calls_as_the_server_would(tmp_path: Path) -> None:
    """Status, message and trailers (the reason, the machine-readable details) pass through
    unchanged; the tenant is the caller's, whichever process renders."""
    database = f"sqlite:///{tmp_path}/c.db"
    keys = ("--api-keys", "acme:k-acme,umbra:k-umbra")
    with ServerProcess("--database-url", database, *keys, "--render-processes", "2") as handing:
        with Client(handing.target, api_key="k-acme") as acme:
            acme.create_session("mine")
            acme.append_openai("mine", [{"role": "user", "content": "hello"}])
            assert acme.render_view("mine", ViewFormat.OPENAI_CHAT).messages_json
        handed = {
            "missing": _render(handing.target, "nope", "k-acme"),
            "another tenant's": _render(handing.target, "mine", "k-umbra"),
            "bad id": _render(handing.target, "x" * 300, "k-acme"),
            "no key": _render(handing.target, "mine", None),
            "bad token": _render(handing.target, "mine", "k-acme", b"\x01\xff"),
        }
        assert _render(handing.target, "mine", "k-acme")[0] is grpc.StatusCode.OK
    with ServerProcess("--database-url", database, *keys) as plain:
        alone = {
            "missing": _render(plain.target, "nope", "k-acme"),
            "another tenant's": _render(plain.target, "mine", "k-umbra"),
            "bad id": _render(plain.target, "x" * 300, "k-acme"),
            "no key": _render(plain.target, "mine", None),
            "bad token": _render(plain.target, "mine", "k-acme", b"\x01\xff"),
        }
    assert handed == alone
    assert [code for code, _, _ in handed.values()] == [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    assert handed["missing"][2]["contextd-reason"] == "SESSION_NOT_FOUND"
    assert "grpc-status-details-bin" in handed["bad id"][2]


def test_a_render_process_that_dies_is_started_again(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path}/c.db"
    with (
        ServerProcess("--database-url", database, "--render-processes", "2") as handing,
        Client(handing.target, timeout=30) as client,
    ):
        first, second = sessions_on_each(2)
        for session in (first, second):
            client.create_session(session)
            client.append_openai(session, [{"role": "user", "content": f"hello {session}"}])
        pids = pids_of(handing)
        os.kill(pids[0], signal.SIGKILL)
        assert wait_until(lambda: not alive(pids[0]))
        # The other render process goes on; the dead one's sessions answer UNAVAILABLE with a
        # retry delay, never INTERNAL, until it serves again (it is started a second after).
        assert client.render_view(second, ViewFormat.OPENAI_CHAT).messages_json
        code, details, trailers = _render(handing.target, first, None)
        assert code is grpc.StatusCode.UNAVAILABLE, details
        assert trailers["contextd-reason"] == "RENDER_PROCESS_UNAVAILABLE"
        assert "grpc-status-details-bin" in trailers  # with RetryInfo, which the client waits out
        assert wait_until(lambda: any("render process 0 serving again" in line for line in handing.log))
        assert _render(handing.target, first, None)[0] is grpc.StatusCode.OK
        assert "hello" in client.render_view(first, ViewFormat.OPENAI_CHAT).messages_json


def test_render_processes_end_with_their_server_however_it_ends(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path}/c.db"
    with contextlib.ExitStack() as servers:  # stopped whatever happens: a failed assertion leaves none running
        stopped = ServerProcess("--database-url", database, "--render-processes", "2")
        servers.callback(stopped.stop)
        stopped.wait_serving()
        pids = pids_of(stopped)
        assert all(map(alive, pids))
        nicer = min(19, os.getpriority(os.PRIO_PROCESS, stopped.process.pid) + 10)
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [nicer, nicer]  # calls before renders
        # An answer after the serving line means the server has taken its signals (api/server.py).
        assert _render(stopped.target, "none", None)[0] is grpc.StatusCode.NOT_FOUND
        sockets = sockets_of(stopped)
        assert all(path.exists() for path in sockets)
        stopped.terminate()
        assert stopped.wait() == 0
        assert wait_until(lambda: not any(map(alive, pids)), 10)
        assert not any(path.parent.exists() for path in sockets)  # nothing left behind

        killed = ServerProcess("--database-url", database, "--render-processes", "2")
        servers.callback(killed.stop)
        killed.wait_serving()
        pids = pids_of(killed)
        sockets = sockets_of(killed)
        killed.process.kill()  # no chance to stop them: they see their parent's end of the pipe close
        killed.wait()
        assert wait_until(lambda: not any(map(alive, pids)), 20)
        assert not any(path.parent.exists() for path in sockets)  # they tidied up for it


def _two_ports(held: contextlib.ExitStack) -> tuple[socket.socket, socket.socket]:
    """Two listening sockets on consecutive loopback ports (other tests take ports too)."""
    for _ in range(100):
        first = held.enter_context(socket.socket())
        first.bind(("127.0.0.1", 0))
        second = held.enter_context(socket.socket())
        try:
            second.bind(("127.0.0.1", first.getsockname()[1] + 1))
        except OSError:
            continue
        second.listen()
        return first, second
    raise AssertionError("no two consecutive free ports")


def test_a_server_whose_render_process_cannot_start_says_why(tmp_path: Path) -> None:
    """Render process 0 scrapes on the metrics port + 1; with that port taken it cannot start,
    and the server does not start either: it says which process and why."""
    with contextlib.ExitStack() as held:
        own, _ = _two_ports(held)
        port_number = own.getsockname()[1]
        own.close()  # the server's own, free again just before it starts; the next one stays taken
        server = ServerProcess(
            "--database-url",
            f"sqlite:///{tmp_path}/c.db",
            "--render-processes",
            "1",
            "--metrics-listen",
            f"127.0.0.1:{port_number}",
        )
        assert server.wait() == 1
    log = "\n".join(server.log)
    assert f"cannot serve metrics on 127.0.0.1:{port_number + 1}" in log, log
    assert "render process 0 exited with status 1 before serving" in log, log
    assert "contextd serving on" not in log


def test_the_render_worker_setting_is_refused_on_a_server_run_by_hand(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "contextd", "serve", "--listen", "127.0.0.1:0", "--render-worker"]
    done = subprocess.run(
        [*command, "--database-url", f"sqlite:///{tmp_path}/c.db"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "render_worker is set, but stdin is not a pipe" in done.stderr, done.stderr
