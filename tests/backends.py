"""Where the integration tier finds its Postgres and Redis.

In order: the URL in an environment variable (CONTEXTD_TEST_POSTGRES_URL,
CONTEXTD_TEST_REDIS_URL); else a throw-away container when a Docker engine
answers; else the tests that need it skip with the reason printed in the
summary. Under CI=true a missing Postgres or Redis fails the run instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import urllib.parse
import uuid
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

POSTGRES_ENV = "CONTEXTD_TEST_POSTGRES_URL"
REDIS_ENV = "CONTEXTD_TEST_REDIS_URL"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(what: str, why: str) -> None:
    message = f"{what} is not available: {why}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: integration tests must run, not skip)", pytrace=False)
    pytest.skip(f"{message}; set {POSTGRES_ENV if what == 'Postgres' else REDIS_ENV} to run these tests")


def unavailable_tool(what: str, how: str) -> None:
    """A tool a test needs is not installed: a failure under CI=true (.ci/run installs it), a skip otherwise."""
    message = f"{what} is not installed"
    if in_ci():
        pytest.fail(f"{message} (CI=true: .ci/run installs it)", pytrace=False)
    pytest.skip(f"{message}: {how}")


def _docker_answers() -> bool:
    """Whether a Docker engine answers on its socket (DOCKER_HOST or the default)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a remote engine: let testcontainers try it and report
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(2)
        try:
            probe.connect(host.removeprefix("unix://"))
            probe.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b" 200 " in probe.recv(64)
        except OSError:
            return False


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A SQLAlchemy asyncpg URL of a Postgres server this test run may create databases on."""
    url = os.environ.get(POSTGRES_ENV)
    if url:
        _check_postgres(url)
        yield url
        return
    if not _docker_answers():
        unavailable("Postgres", f"{POSTGRES_ENV} is not set and no Docker engine answers")
    from testcontainers.community.postgres import PostgresContainer

    with PostgresContainer("postgres:16-alpine", driver="asyncpg") as container:
        yield container.get_connection_url()


def _check_postgres(url: str) -> None:
    try:
        admin(url, "SELECT 1")
    except Exception as exc:
        unavailable("Postgres", f"{POSTGRES_ENV}={url} does not answer ({type(exc).__name__}: {exc})")


def admin(url: str, *statements: str) -> None:
    """Run statements outside any transaction (CREATE/DROP DATABASE need that)."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def run() -> None:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    # On a thread of its own, so this works from sync fixtures and from
    # inside a running event loop alike.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


def create_database(server_url: str, prefix: str = "contextd_test") -> str:
    """Create a uniquely named database on the server; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, database_url: str) -> None:
    admin(server_url, f'DROP DATABASE IF EXISTS "{make_url(database_url).database}" WITH (FORCE)')


def worker_database(url: str) -> str:
    """`url` with a Redis database of this test process's own when pytest-xdist runs the suite
    in several processes (worker gwN takes the Nth database after the one named): tests that
    empty their database (FLUSHDB) must not empty another worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    parts = urllib.parse.urlsplit(url)
    database = (int(parts.path.strip("/") or 0) + int(worker.removeprefix("gw"))) % REDIS_DATABASES
    return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))


REDIS_DATABASES = 16
"""Redis's default count of databases; more workers than this would share one."""


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    url = os.environ.get(REDIS_ENV)
    if url:
        import redis

        url = worker_database(url)
        try:
            with redis.Redis.from_url(url, socket_connect_timeout=2) as probe:
                probe.ping()
        except Exception as exc:
            unavailable("Redis", f"{REDIS_ENV}={url} does not answer ({type(exc).__name__}: {exc})")
        yield url
        return
    if not _docker_answers():
        unavailable("Redis", f"{REDIS_ENV} is not set and no Docker engine answers")
    from testcontainers.community.redis import RedisContainer

    with RedisContainer("redis:7-alpine") as container:
        yield f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"


@contextlib.contextmanager
def postgres_role(database_url: str) -> Iterator[tuple[str, str]]:
    """A login role of its own with every right on the (migrated) database: (its URL, its name).

    Tests make the database unavailable to it alone (CONNECTION LIMIT 0,
    `pg_terminate_backend` of its connections) without touching the server
    other tests share. Dropped afterwards, with its connections.
    """
    role = f"contextd_{uuid.uuid4().hex[:10]}"
    database = make_url(database_url).database
    admin(
        database_url,
        f'CREATE ROLE "{role}" LOGIN',
        f'GRANT ALL ON DATABASE "{database}" TO "{role}"',
        f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"',
        f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"',
    )
    try:
        yield make_url(database_url).set(username=role).render_as_string(hide_password=False), role
    finally:
        admin(
            database_url,
            f'ALTER ROLE "{role}" CONNECTION LIMIT -1',
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'",
            f'REASSIGN OWNED BY "{role}" TO CURRENT_USER',
            f'DROP OWNED BY "{role}"',
            f'DROP ROLE "{role}"',
        )


def end_connections(database_url: str, role: str) -> None:
    """Terminate every connection of `role`, as an operator's restart or a failover would (57P01)."""
    admin(database_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
