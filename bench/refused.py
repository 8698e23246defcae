"""Renders refused as too large to send (VIEW_TOO_LARGE), one after another.

    python bench/refused.py [--items 10000] [--max-message-bytes 1000000] [--workload mixed]
                            [--postgres-url URL]

Makes a session of `--items` items (bench/scale.py's workload) on `contextd serve` (SQLite in a
temporary folder, or a fresh database on `--postgres-url`, dropped after), then starts a server
whose `--max-message-bytes` the session's whole view is over. As an agent that does not budget
its views would: three renders, then one item appended and a render, each refused as too large.
Prints each call's outcome, seconds and the
server's CPU seconds (user and system, all its threads, from /proc). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--max-message-bytes", type=int, default=1_000_000)
    parser.add_argument("--workload", choices=["unprunable", "modules", "mixed"], default="mixed")
    parser.add_argument("--postgres-url", default="")
    args = parser.parse_args()

    from common import cpu_seconds, report
    from common import database as fresh_database
    from contextd_client import Client, ContextdError, ViewFormat
    from contextd_lab.service import ServerProcess
    from scale import tool_calls

    messages = tool_calls(args.items + 1, args.workload)
    calls = ["render", "render again", "render again", "one appended, render"]
    rows: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as folder, fresh_database(args.postgres_url, Path(folder), "refused") as url:
        first = ServerProcess("--database-url", url, cwd=Path(folder))  # (it migrates the fresh database)
        with first as server, Client(server.target, timeout=600) as client:
            session = client.create_session().id
            for start in range(0, args.items, 500):
                client.append_openai(session, messages[start : min(start + 500, args.items)])
        limit = ("--max-message-bytes", str(args.max_message_bytes))
        with ServerProcess("--database-url", url, "--no-migrate-on-start", *limit, cwd=Path(folder)) as server:
            pid = server.process.pid
            with Client(server.target, timeout=600) as client:
                for name in calls:
                    if name.startswith("one appended"):
                        client.append_openai(session, messages[args.items :])
                    started, used = time.monotonic(), cpu_seconds(pid)
                    try:
                        view = client.render_view(session, ViewFormat.OPENAI_CHAT)
                        outcome, version = "view", str(view.view_version)
                    except ContextdError as error:
                        outcome, version = error.reason or error.code, "-"
                    spent = f"{time.monotonic() - started:.2f}"
                    rows.append((name, outcome, spent, f"{cpu_seconds(pid) - used:.2f}", version))
    backend = "postgres" if args.postgres_url else "sqlite"
    print(f"{args.items:,} items ({args.workload}), {backend}; --max-message-bytes {args.max_message_bytes:,}")
    report("refused.py", ("call", "outcome", "seconds", "server CPU s", "view version"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
