"""A render that outlasts its caller's deadline, and the render of the session after it.

    python bench/abandoned.py [--items 50000] [--timeout 10] [--workload mixed] [--postgres-url URL]

Makes a session of `--items` items (bench/scale.py's workload) on `contextd serve` (SQLite in a
temporary folder, or a fresh database on `--postgres-url`, dropped after), then restarts the
server, so that its first render of the session derives it whole with nothing memoised. Then,
as an agent would: a render with a deadline of `--timeout` seconds (the Python client's default
is 10 s), which that render outlasts, and at once the render again, with a deadline long enough
and the client's retries (it waits for the first, which holds the session's lock until it
ends). Prints each call's outcome and seconds, the view version the second got (2 when the
first was stored, 1 when it was thrown away), and the server's CPU seconds over both calls (user
and system, all its threads, from /proc). A benchmark, not a test.
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
    parser.add_argument("--items", type=int, default=50000)
    parser.add_argument("--timeout", type=float, default=10.0, help="the first render's deadline, in seconds")
    parser.add_argument("--workload", choices=["unprunable", "modules", "mixed"], default="mixed")
    parser.add_argument("--postgres-url", default="")
    args = parser.parse_args()

    from common import cpu_seconds, report
    from common import database as fresh_database
    from contextd_client import Client, ContextdError, RetryPolicy, ViewFormat
    from contextd_lab.service import ServerProcess
    from scale import tool_calls

    flags = ("--no-migrate-on-start", "--max-message-bytes", str(1 << 30))
    options = [("grpc.max_receive_message_length", 1 << 30)]
    messages = tool_calls(args.items, args.workload)
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as folder, fresh_database(args.postgres_url, Path(folder), "abandoned") as url:
        first = ServerProcess("--database-url", url, cwd=Path(folder))  # (it migrates the fresh database)
        with first as server, Client(server.target, timeout=600) as client:
            session = client.create_session().id
            for start in range(0, args.items, 500):
                client.append_openai(session, messages[start : start + 500])
        with ServerProcess("--database-url", url, *flags, cwd=Path(folder)) as server:
            pid = server.process.pid
            used = cpu_seconds(pid)
            hasty = Client(server.target, timeout=args.timeout, retry=RetryPolicy(max_attempts=1), options=options)
            patient = Client(server.target, timeout=600, retry=RetryPolicy(budget=600), options=options)
            with hasty, patient:
                for name, client in ((f"deadline {args.timeout:g} s", hasty), ("again, at once", patient)):
                    started = time.monotonic()
                    try:
                        view = client.render_view(session, ViewFormat.OPENAI_CHAT)
                        outcome, version = "view", str(view.view_version)
                    except ContextdError as error:
                        outcome, version = error.code, "-"
                    rows.append((name, outcome, f"{time.monotonic() - started:.1f}", version))
            spent = cpu_seconds(pid) - used
    backend = "postgres" if args.postgres_url else "sqlite"
    print(f"{args.items:,} items ({args.workload}), {backend}; server CPU over both renders: {spent:.1f} s")
    report("abandoned.py", ("render", "outcome", "seconds", "view version"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
