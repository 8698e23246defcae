"""The `contextd` command as a user runs it: serve on the embedded default,
shut down gracefully without losing acknowledged work, migrate, configure."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from contextd_client import Client, ContextdError, RetryPolicy
from contextd_client.v1 import content_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.processes import ServerProcess


def user(text: str) -> pb.Item:
    return pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=text))])


def health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(response.status)


def test_serve_on_the_embedded_default_and_keep_data_across_restarts(tmp_path: Path) -> None:
    server = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        assert health(server.target) == health_pb2.HealthCheckResponse.SERVING
        assert health(server.target, "contextd.v1.ContextService") == health_pb2.HealthCheckResponse.SERVING
        with Client(server.target) as client:
            client.create_session("kept")
            client.append_items("kept", [user("remember me")])
    finally:
        server.terminate()
    assert server.wait() == 0
    assert any("stopped" in line for line in server.log)
    assert (tmp_path / "contextd.db").exists()

    again = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        with Client(again.target) as client:
            assert client.render_openai("kept") == [{"role": "user", "content": "remember me"}]
    finally:
        again.stop()


def test_shutdown_drains_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = ServerProcess("--grace-seconds", "5", cwd=tmp_path).wait_serving()
    acked: list[str] = []
    failures: list[ContextdError] = []
    stop = threading.Event()

    def write() -> None:
        with Client(server.target, retry=RetryPolicy(max_attempts=1), timeout=5) as client:
            client.create_session("busy")
            n = 0
            while not stop.is_set():
                try:
                    client.append_items("busy", [user(f"item {n}")])
                    acked.append(f"item {n}")
                except ContextdError as error:
                    failures.append(error)
                    return
                n += 1

    writer = threading.Thread(target=write)
    writer.start()
    while len(acked) < 50:
        threading.Event().wait(0.01)
    server.terminate()
    assert server.wait() == 0
    stop.set()
    writer.join(10)
    # A call cut off by the shutdown is refused as retryable, never INTERNAL.
    assert all(f.code in ("UNAVAILABLE", "CANCELLED") for f in failures), failures

    again = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        with Client(again.target) as client:
            stored = [m["content"] for m in client.render_openai("busy")]
    finally:
        again.stop()
    assert stored[: len(acked)] == acked  # every acknowledged append survived, in order
    assert len(stored) - len(acked) <= 1  # at most the one whose answer the shutdown cut off


def contextd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "contextd", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_migrate_up_and_down(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    up = contextd("migrate", "--database-url", url, cwd=tmp_path)
    assert up.returncode == 0 and "database at revision 0001" in up.stdout
    down = contextd("migrate", "--database-url", url, "--downgrade", "base", cwd=tmp_path)
    assert down.returncode == 0 and "database at revision base" in down.stdout


def test_bad_configuration_is_reported_without_a_traceback(tmp_path: Path) -> None:
    env_error = contextd("serve", cwd=tmp_path, env={"CONTEXTD_MAX_ITEM_BYTES": "lots"})
    assert env_error.returncode == 2
    assert "CONTEXTD_MAX_ITEM_BYTES='lots'" in env_error.stderr and "Traceback" not in env_error.stderr
    bad_choice = contextd("serve", cwd=tmp_path, env={"CONTEXTD_OTEL_EXPORTER": "jaeger"})
    assert bad_choice.returncode == 2 and "otel_exporter must be one of none, console, otlp" in bad_choice.stderr
    bad_keys = contextd("config", "--api-keys", "no-colon", cwd=tmp_path)
    assert bad_keys.returncode == 2 and "api_keys entries are tenant:key" in bad_keys.stderr


def test_config_shows_settings_but_hides_secrets(tmp_path: Path) -> None:
    shown = contextd(
        "config",
        "--database-url",
        "postgresql+asyncpg://app:hunter2@db.internal/contextd",
        cwd=tmp_path,
        env={"CONTEXTD_API_KEYS": "acme:s3cret", "CONTEXTD_LOCK_TIMEOUT_MS": "750"},
    )
    assert shown.returncode == 0
    assert "s3cret" not in shown.stdout and "hunter2" not in shown.stdout
    assert "api_keys = ***" in shown.stdout and "lock_timeout_ms = 750" in shown.stdout
    assert "database_url = postgresql+asyncpg://app:***@db.internal/contextd" in shown.stdout


@pytest.mark.parametrize("reachable", [True, False])
def test_serving_with_redis_configured(tmp_path: Path, redis_url: str, reachable: bool) -> None:
    url = redis_url if reachable else "redis://127.0.0.1:1/0"
    server = ServerProcess("--redis-url", url, cwd=tmp_path).wait_serving()
    try:
        with Client(server.target) as client:
            client.create_session("with-redis")
    finally:
        server.stop()
    expected = "redis reachable" if reachable else "redis unreachable"
    assert any(expected in line for line in server.log), server.log
