"""Append throughput and RenderView latency over loopback, on both backends.

    python bench/append_render.py [--backends sqlite,postgres] [--postgres-url URL] [--quick]

Starts a real `contextd serve` process per backend (SQLite in a temporary
directory; Postgres in a fresh database on the given server, dropped after)
and drives it with the thin client's asyncio flavour from this process, so
every figure includes gRPC over loopback, protobuf, validation, token
counting and the database. Prints a Markdown table and the command that
produced it. A benchmark, not a test: run it on a quiet machine and read
ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from contextd_client import AsyncClient, ViewFormat
from contextd_client.v1 import content_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contextd_lab.service import ServerProcess  # noqa: E402
from tests import backends  # noqa: E402 - reuse the suite's database helpers

PARAGRAPH = (
    'Traceback (most recent call last):\n  File "src/app/parse.py", line 41, in parse_header\n'
    "    key, value = line.split(':', 1)\nValueError: not enough values to unpack (expected 2, got 1)\n"
)


def item(n: int) -> pb.Item:
    """A user item of ~400 bytes, the size of a short tool output or turn."""
    return pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=f"step {n}\n" + PARAGRAPH * 2))])


def conversation(n_items: int) -> list[pb.Item]:
    """A realistic session: user turn, then assistant tool calls answered by tool outputs."""
    items = [item(0)]
    call = 0
    while len(items) < n_items:
        call += 1
        arguments = f'{{"command": "sed -n {call},{call + 40}p src/app/parse.py"}}'
        use = pb.ToolUseBlock(id=f"call_{call}", name="bash", input_json=arguments)
        items.append(pb.Item(role=pb.ROLE_ASSISTANT, content=[pb.ContentBlock(tool_use=use)]))
        if len(items) < n_items:
            output = pb.ToolResultBlock(
                tool_use_id=f"call_{call}", content=[pb.ContentBlock(text=pb.TextBlock(text=PARAGRAPH * 3))]
            )
            items.append(pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=output)]))
    return items[:n_items]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Row:
    backend: str
    measure: str
    value: str


async def append_throughput(
    target: str, batch: int, clients: int, total_items: int, shared: bool
) -> tuple[float, list[float]]:
    """(items per second, per-call latencies in ms) for `clients` concurrent writers."""
    per_client = max(1, total_items // (batch * clients))
    connections = [AsyncClient(target, timeout=60) for _ in range(clients)]
    shared_id = (await connections[0].create_session()).id
    sessions = [shared_id if shared else (await c.create_session()).id for c in connections]
    latencies: list[float] = []

    async def writer(client: AsyncClient, session_id: str) -> None:
        for n in range(per_client):
            started = time.perf_counter()
            await client.append_items(session_id, [item(n * batch + k) for k in range(batch)])
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(writer(c, s) for c, s in zip(connections, sessions, strict=True)))
    elapsed = time.perf_counter() - started
    for c in connections:
        await c.close()
    return per_client * batch * clients / elapsed, latencies


async def render_latency(target: str, size: int, renders: int) -> list[float]:
    async with AsyncClient(target, timeout=60) as client:
        session_id = (await client.create_session()).id
        items = conversation(size)
        for start in range(0, len(items), 500):
            await client.append_items(session_id, items[start : start + 500])
        await client.render_view(session_id, ViewFormat.OPENAI_CHAT)  # warm up
        samples = []
        for _ in range(renders):
            started = time.perf_counter()
            view = await client.render_view(session_id, ViewFormat.OPENAI_CHAT)
            samples.append((time.perf_counter() - started) * 1000)
        assert len(view.messages) == size
        return samples


async def measure(backend: str, target: str, quick: bool) -> list[Row]:
    rows: list[Row] = []
    scale = 0.2 if quick else 1.0

    _, single = await append_throughput(target, batch=1, clients=1, total_items=int(1000 * scale), shared=False)
    latency = f"{percentile(single, 50):.2f} / {percentile(single, 99):.2f} ms"
    rows.append(Row(backend, "append, 1 item, 1 client: latency p50 / p99", latency))
    cases: list[tuple[int, int, bool, int]] = [
        (1, 1, False, 1000),
        (100, 1, False, 20_000),
        (1, 30, False, 3000),
        (100, 30, False, 30_000),
        (1, 30, True, 3000),
        (100, 30, True, 30_000),
    ]
    for batch, clients, shared, total in cases:
        rate, latencies = await append_throughput(target, batch, clients, int(total * scale), shared)
        where = "one shared session" if shared else "a session each"
        rows.append(
            Row(
                backend,
                f"append throughput, batch {batch}, {clients} client{'s' if clients > 1 else ''} ({where})",
                f"{rate:,.0f} items/s (call p50 {percentile(latencies, 50):.1f} ms)",
            )
        )
    for size, renders in ((10, 300), (100, 200), (1000, 100)):
        samples = await render_latency(target, size, max(20, int(renders * scale)))
        rows.append(
            Row(
                backend,
                f"RenderView, {size:,}-item session: p50 / p99",
                f"{percentile(samples, 50):.2f} / {percentile(samples, 99):.2f} ms",
            )
        )
    return rows


def run_backend(backend: str, postgres_url: str | None, quick: bool, tmp: Path) -> list[Row]:
    database = None
    if backend == "postgres":
        if not postgres_url:
            raise SystemExit("postgres backend needs --postgres-url or CONTEXTD_TEST_POSTGRES_URL")
        database = backends.create_database(postgres_url, "contextd_bench")
        server = ServerProcess("--database-url", database)
    else:
        server = ServerProcess(cwd=tmp)
    try:
        server.wait_serving()
        return asyncio.run(measure(backend, server.target, quick))
    finally:
        server.stop()
        if database is not None and postgres_url:
            backends.drop_database(postgres_url, database)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--postgres-url", default=os.environ.get("CONTEXTD_TEST_POSTGRES_URL"))
    parser.add_argument("--quick", action="store_true", help="a fifth of the work, for a smoke run")
    args = parser.parse_args()

    import tempfile

    rows: list[Row] = []
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            rows.extend(run_backend(backend, args.postgres_url, args.quick, Path(tmp)))

    print(f"command: python bench/append_render.py {' '.join(sys.argv[1:])}".rstrip())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine}, {time.strftime('%Y-%m-%d')}")
    print()
    print("| backend | measure | result |")
    print("| --- | --- | --- |")
    for row in rows:
        print(f"| {row.backend} | {row.measure} | {row.value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
