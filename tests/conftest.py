"""Shared fixtures: databases on both backends, servers, clients.

`database_url` is parametrized over the embedded default (SQLite) and
Postgres, so every test that uses it runs on both (unless marked SQLITE_ONLY);
the Postgres half needs a real server (tests/backends.py says where it comes from).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from hypothesis import settings

from contextd.api import server as server_module
from contextd.config import Settings
from contextd_client import Client
from contextd_storage import migrate
from tests import backends

# In CI the property tests draw the same examples every run, so a red build
# is reproducible and a green one is not luck; locally they explore afresh.
# No example has a deadline: an example's time says how busy the machine is
# (one of 200 ms took 453 ms beside two other processes), not whether the
# code is right; the benchmarks in bench/ hold the timings.
settings.register_profile("local", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files holding a test marked slow first, in their order, then the others: spread over
    processes a file at a time (dev.py), a long file started last leaves the other processes
    idle until it ends (the last 5% of a run took a third of its time)."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    with backends.postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with backends.redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A three-node Redis Cluster of the test run's own (redis-server and redis-cli started here)."""
    from tests.integration.clusters import PrivateRedisCluster

    cluster = PrivateRedisCluster(3)
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A migrated database of its own on the Postgres server, dropped at the end."""
    url = backends.create_database(postgres_server_url)
    asyncio.run(migrate.upgrade(url))
    yield url
    backends.drop_database(postgres_server_url, url)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('sqlite') / 'contextd.db'}"
    asyncio.run(migrate.upgrade(url))
    return url


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
"""For a test of code that reaches the service only over gRPC (the framework adapters, the
lab's replays): the shared `server` (and `client`) on SQLite alone. The storage layer and the
service's API are tested on both backends; these on Postgres as well would repeat that."""


class ServerThread:
    """A contextd server on its own event loop in a background thread, so
    tests can call it with the blocking client as well as the asyncio one."""

    def __init__(self, settings: Settings, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self.settings = settings
        self.interceptors = interceptors
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._running: server_module.RunningServer | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="contextd-test-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._running = self._loop.run_until_complete(server_module.start(self.settings, self.interceptors))
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        return self

    @property
    def target(self) -> str:
        assert self._running is not None
        return f"127.0.0.1:{self._running.port}"

    def stop(self, grace: float = 0) -> None:
        if self._running is not None:
            asyncio.run_coroutine_threadsafe(self._running.stop(grace), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


class ServingCommand:
    """A command run as a process that serves HTTP and logs `<name> serving on URL` once it
    listens (`contextd mcp --transport streamable-http`, `contextd proxy`)."""

    def __init__(self, command: Sequence[str], name: str) -> None:
        self.serving = re.compile(rf"{re.escape(name)} serving on (http://\S+)")
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            if match := self.serving.search(line):
                self.url = match.group(1)
                self._ready.set()
        self.process.stderr.close()
        self._ready.set()

    def wait_serving(self) -> ServingCommand:
        self._ready.wait(60)
        assert self.url, "it did not start:\n" + "\n".join(self.log)
        return self

    def stop(self) -> int:
        """SIGTERM, and its exit code."""
        self.process.terminate()
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def test_settings(database_url: str, **overrides: object) -> Settings:
    base = Settings(listen="127.0.0.1:0", database_url=database_url, migrate_on_start=False)
    return replace(base, **overrides)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[ServerThread]:
    """A server on each backend, shared by the tests of the session."""
    running = ServerThread(test_settings(database_url)).start()
    yield running
    running.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Start servers with custom settings on a fresh SQLite file; stopped after the test."""
    started: list[ServerThread] = []

    def make(interceptors: Sequence[grpc.aio.ServerInterceptor] = (), **overrides: object) -> ServerThread:
        url = f"sqlite+aiosqlite:///{tmp_path / f'custom{len(started)}.db'}"
        settings = test_settings(url, migrate_on_start=True, **overrides)
        started.append(ServerThread(settings, interceptors).start())
        return started[-1]

    yield make
    for running in started:
        running.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[Client]:
    with Client(server.target, timeout=15) as c:
        yield c


@pytest.fixture
def session_id(client: Client) -> str:
    return client.create_session(f"test-{uuid.uuid4().hex[:12]}").id


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
