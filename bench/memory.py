"""What a server process holds as it serves: its resident memory (RSS) over renders.

    python bench/memory.py [--renders 10000] [--sessions 1000] [--items 200] [--postgres-url URL]
                           [--extra FLAG ...]

Starts a real `contextd serve` (SQLite in a temporary folder, or a fresh database on
`--postgres-url`, dropped after) and reads its RSS from /proc while, over loopback:

1. *the same view*: one session of 1,000 items of tool calls is rendered `--renders` times
   with nothing appended (RSS after the first 10% of the renders, then at the end);
2. *one appended each time*: the same session, one item appended before each of
   `--renders` / 5 renders;
3. *many sessions*: `--sessions` sessions of `--items` items each, appended and rendered
   once (RSS every tenth of the way), the in-process caches' byte budgets given by
   `--extra` flags (e.g. `--extra=--session-cache-bytes=67108864`).

Prints each phase's RSS figures in MB and the command. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--renders", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument("--extra", action="append", default=[], help="a flag for contextd serve")
    args = parser.parse_args()

    import grpc

    from common import database as fresh_database
    from common import report
    from contextd_client import Client, RetryPolicy
    from contextd_client.v1 import contextd_pb2 as api
    from contextd_lab.service import ServerProcess
    from scale import tool_calls

    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as folder, fresh_database(args.postgres_url, Path(folder), "memory") as database:
        server = ServerProcess("--database-url", database, *args.extra, cwd=Path(folder)).wait_serving()
        pid = server.process.pid
        try:
            with Client(server.target, timeout=600, retry=RetryPolicy(budget=60)) as client:
                channel = grpc.insecure_channel(server.target, options=[("grpc.max_receive_message_length", 1 << 30)])
                render_call = channel.unary_unary("/contextd.v1.ContextService/RenderView")

                def render(session_id: str) -> None:
                    request = api.RenderViewRequest(session_id=session_id, format=api.VIEW_FORMAT_OPENAI_CHAT)
                    render_call(request.SerializeToString(), timeout=600)

                rows.append(("started", f"{rss_mb(pid):.0f}"))
                messages = tool_calls(1000 + args.renders // 5 + 2, "unprunable")
                session = client.create_session().id
                for start in range(0, 1000, 500):
                    client.append_openai(session, messages[start : start + 500])
                marks: list[float] = []
                started = time.perf_counter()
                for n in range(args.renders):
                    render(session)
                    if n + 1 in (args.renders // 10, args.renders):
                        marks.append(rss_mb(pid))
                seconds = time.perf_counter() - started
                change = (marks[1] - marks[0]) / marks[0] * 100
                rows.append(
                    (
                        f"the same view, {args.renders:,} renders of 1,000 items",
                        f"{marks[0]:.0f} after {args.renders // 10:,}, {marks[1]:.0f} at the end "
                        f"({change:+.1f}%; {seconds / args.renders * 1000:.1f} ms a render)",
                    )
                )
                before = rss_mb(pid)
                for n in range(args.renders // 5):
                    client.append_openai(session, [messages[1000 + n]])
                    render(session)
                rows.append(
                    (f"one appended each time, {args.renders // 5:,} renders", f"{before:.0f} -> {rss_mb(pid):.0f}")
                )
                seen: list[str] = []
                body = tool_calls(args.items, "unprunable")
                for n in range(args.sessions):
                    sid = client.create_session().id
                    client.append_openai(sid, body)
                    render(sid)
                    if (n + 1) % max(1, args.sessions // 10) == 0:
                        seen.append(f"{rss_mb(pid):.0f}")
                rows.append((f"{args.sessions:,} sessions of {args.items} items, each rendered once", " ".join(seen)))
                channel.close()
        finally:
            server.stop()

    report("memory.py", ("phase", "server RSS (MB)"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
