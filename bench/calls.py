"""What one call costs the server: CPU per call and latency, for the calls every agent makes
most (a one-item append, GetSession, a render of a short session), and the throughput of
several server processes.

    python bench/calls.py [--calls 2000] [--postgres-url URL] [--processes 1,2,4] [--clients 8]

Starts `contextd serve` (SQLite in a temporary folder, or a fresh database on
`--postgres-url`, dropped after) and, from this process over loopback with the blocking
client, makes `--calls` calls of each kind one after another: the server's CPU time per
call is read from /proc (user + system, all its threads) before and after, the latency of
each call on the client. Then, for each count in `--processes`, starts that many server
processes on the same database and has `--clients` client processes append one item at a
time to sessions of their own, round robin over the servers, for a few seconds: items
appended per second. Prints a Markdown table and the command. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECONDS = 6.0


def _appender(targets: list[str], seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from contextd_client import Client

    with Client(targets, timeout=60) as client:
        session = client.create_session().id
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            client.append_openai(session, [{"role": "user", "content": f"step {done}: go on with the next file"}])
            done += 1
    out.put(done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    from common import cpu_seconds, percentile, report
    from common import database as fresh_database
    from contextd_client import Client
    from contextd_lab.service import ServerProcess

    rows: list[tuple[str, str]] = []
    backend = "postgres" if args.postgres_url else "sqlite"
    with tempfile.TemporaryDirectory() as folder, fresh_database(args.postgres_url, Path(folder), "calls") as database:
        server = ServerProcess("--database-url", database, cwd=Path(folder)).wait_serving()
        try:
            with Client(server.target, timeout=60) as client:
                session = client.create_session().id
                client.append_openai(session, [{"role": "user", "content": "warm up"}])
                client.get_session(session)
                # A short agent session: a task, then calls and their outputs, rendered again and
                # again (each render stores its state's change, its call and its event).
                small = client.create_session().id
                turns: list[dict[str, object]] = [{"role": "user", "content": "fix the failing test in parse.py"}]
                for call in range(1, 10):
                    use = {"id": f"call_{call}", "type": "function"}
                    arguments = f'{{"command": "sed -n {call},{call + 40}p parse.py"}}'
                    turns.append(
                        {
                            "role": "assistant",
                            "tool_calls": [{**use, "function": {"name": "bash", "arguments": arguments}}],
                        }
                    )
                    turns.append({"role": "tool", "tool_call_id": f"call_{call}", "content": f"line {call}: ok\n" * 20})
                client.append_openai(small, turns[:20])
                client.render_openai(small)
                for name, call in (
                    (
                        "AppendItems, one item",
                        lambda n: client.append_openai(
                            session, [{"role": "user", "content": f"step {n}: go on with the next file"}]
                        ),
                    ),
                    ("GetSession", lambda n: client.get_session(session)),
                    ("RenderView, a 20-item session, nothing appended", lambda n: client.render_openai(small)),
                ):
                    latencies = []
                    before = cpu_seconds(server.process.pid)
                    for n in range(args.calls):
                        started = time.perf_counter()
                        call(n)
                        latencies.append((time.perf_counter() - started) * 1000)
                    cpu = (cpu_seconds(server.process.pid) - before) / args.calls * 1000
                    rows.append(
                        (
                            f"{backend}: {name}",
                            f"server CPU {cpu:.2f} ms a call; latency p50 {percentile(latencies, 50):.2f} ms, "
                            f"p99 {percentile(latencies, 99):.2f} ms",
                        )
                    )
        finally:
            server.stop()
        for count in (int(p) for p in args.processes.split(",")):
            servers = [
                ServerProcess("--database-url", database, "--no-migrate-on-start", cwd=Path(folder))
                for _ in range(count)
            ]
            try:
                targets = [s.wait_serving().target for s in servers]
                context = multiprocessing.get_context("spawn")
                queue = context.Queue()
                workers = [
                    context.Process(target=_appender, args=(targets, SECONDS, queue)) for _ in range(args.clients)
                ]
                for w in workers:
                    w.start()
                done = sum(queue.get(timeout=120) for _ in workers)
                for w in workers:
                    w.join(60)
                rows.append(
                    (
                        f"{backend}: {count} server process{'es' if count > 1 else ''}, {args.clients} clients",
                        f"{done / SECONDS:,.0f} one-item appends a second",
                    )
                )
            finally:
                for s in servers:
                    s.stop()

    report("calls.py", ("measure", "result"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
