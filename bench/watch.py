"""What watchers cost writers: AppendItems latency with no watcher, with watchers that keep up,
and with one watcher that reads nothing, side by side; and how soon an event reaches a watcher
on another replica.

    python bench/watch.py [--rounds 300] [--watchers 20] [--postgres-url URL]

Starts two `contextd serve` processes over one fresh database (a SQLite file, or a fresh
database on `--postgres-url`, dropped after). A writer appends one item at a time to a session
of its own on the first; in each phase, in turn (`--rounds` appends a phase, the phases
alternated three times so that drift in the machine's speed falls on all):

- none: nobody watches;
- keeping up: `--watchers` tenant-wide watches on the second replica, each read on a thread;
- one stalled: the same, and one more watch that is never read (what gRPC's flow control
  does not absorb fills its buffer, and the server ends it with WATCH_LAGGING; it is opened
  again every 5 s, unread).

Prints append p50 and p99 per phase, and the delay from an append's answer to its event at a
watcher on the other replica (p50, p99: the other replica's poll, `watch_poll_ms`, is most of
it). A benchmark, not a test: read the ratios, on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import database as fresh_database
from common import percentile, report

PHASES = ("none", "keeping up", "one stalled")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--watchers", type=int, default=20)
    parser.add_argument("--postgres-url", default="")
    args = parser.parse_args()

    import grpc

    from contextd_client import Client
    from contextd_client.v1 import content_pb2 as pb
    from contextd_client.v1 import contextd_pb2, contextd_pb2_grpc
    from contextd_lab.service import ServerProcess

    appends: dict[str, list[float]] = {phase: [] for phase in PHASES}
    delays: list[float] = []
    answered: dict[int, float] = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        fresh_database(args.postgres_url, Path(folder), "watch") as url,
    ):
        flags = ("--database-url", url, "--watch-buffer-events", "50")
        with (
            ServerProcess(*flags, "--migrate-on-start", cwd=Path(folder)) as writer_side,
            ServerProcess(*flags, "--no-migrate-on-start", cwd=Path(folder)) as watch_side,
            Client(writer_side.target, timeout=30) as writer,
            Client(watch_side.target, timeout=30) as watching,
        ):
            session = writer.create_session().id
            item = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="go on " * 40))])
            stop = threading.Event()
            live: list[threading.Thread] = []

            def keep_up(timed: bool) -> None:
                with watching.watch_session("") as watch:
                    for event in watch:
                        if timed and event.kind == "items_appended" and event.session_id == session:
                            sent = answered.get(event.details["first_seq"])
                            if sent is not None:
                                delays.append(time.perf_counter() - sent)
                        if stop.is_set():
                            return

            def stall() -> None:
                with grpc.insecure_channel(watch_side.target) as channel:
                    stub = contextd_pb2_grpc.ContextServiceStub(channel)
                    while not stop.is_set():
                        stream = stub.WatchSession(contextd_pb2.WatchSessionRequest())  # never read
                        stop.wait(5)
                        stream.cancel()

            for _ in range(3):
                for phase in PHASES:
                    stop.clear()
                    if phase != "none":
                        live = [
                            threading.Thread(target=keep_up, args=(n == 0,), daemon=True) for n in range(args.watchers)
                        ]
                        if phase == "one stalled":
                            live.append(threading.Thread(target=stall, daemon=True))
                        for thread in live:
                            thread.start()
                        time.sleep(1.0)  # joined
                    for _ in range(args.rounds):
                        started = time.perf_counter()
                        result = writer.append_items(session, [item])
                        answered[result.first_seq] = done = time.perf_counter()
                        appends[phase].append(done - started)
                    stop.set()
                    writer.append_items(session, [item])  # wakes the watchers to see `stop`
                    for thread in live:
                        thread.join(10)
                    live = []

    rows = [
        [phase, f"{percentile(times, 50) * 1000:.2f} ms", f"{percentile(times, 99) * 1000:.2f} ms", str(len(times))]
        for phase, times in appends.items()
    ]
    base = percentile(appends["none"], 50)
    for row, times in zip(rows, appends.values(), strict=True):
        row.append(f"{percentile(times, 50) / base:.3f}")
    report("watch.py", ["watchers", "append p50", "append p99", "appends", "p50 / none"], rows)
    if delays:
        print()
        print(
            f"an append's event at a watcher on the other replica: p50 {percentile(delays, 50) * 1000:.0f} ms, "
            f"p99 {percentile(delays, 99) * 1000:.0f} ms ({len(delays)} events)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
