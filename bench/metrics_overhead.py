"""What metrics cost a call: RenderView and AppendItems with metrics off and on, side by side.

    python bench/metrics_overhead.py [--rounds 400] [--items 200] [--postgres-url URL]

Starts two `contextd serve` processes, each on a database of its own (SQLite files, or fresh
databases on `--postgres-url`, dropped after): one as deployed without metrics, one with
`--metrics-listen` (the Prometheus endpoint, scraped every 5 s by a thread of this process,
as a Prometheus server would). Each gets the same session of `--items` tool calls; then, for
`--rounds` rounds, each server in turn (the order alternating, so drift in the machine's speed
falls on both) is sent one appended item and a render of the view. Prints the p50 latency of
each call and the server's CPU time per round, for both, and their ratio (target: metrics on
within 3% of off). A benchmark, not a test: read the ratios, on a quiet machine.

The ratio of two p50s taken apart moves by a few points from run to run on a 2-core machine
(the machine's speed drifts between and during runs), so each ratio is also read paired: per
round for the latencies (the two servers' calls of one round are made back to back), per block
of `BLOCK` rounds for the CPU, with the median of the pairs and a 95% bootstrap interval of it.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import cpu_seconds, percentile, report
from common import database as fresh_database
from scale import tool_calls

SCRAPE_SECONDS = 5.0
BLOCK = 50
"""Rounds per reading of the servers' CPU time."""
METRICS = re.compile(r"metrics for Prometheus on (http://[\d.]+:\d+/metrics)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument(
        "--control",
        action="store_true",
        help="both servers without metrics (an A/A run): what the method itself shows when nothing differs",
    )
    args = parser.parse_args()

    from contextd_client import Client, ViewFormat
    from contextd_lab.service import ServerProcess

    kinds = ("off", "on")
    latencies: dict[tuple[str, str], list[float]] = {(k, c): [] for k in kinds for c in ("append", "render")}
    cpu: dict[str, float] = {}
    stop = threading.Event()
    with (
        tempfile.TemporaryDirectory() as folder,
        fresh_database(args.postgres_url, Path(folder), "metrics_off") as off_url,
        fresh_database(args.postgres_url, Path(folder), "metrics_on") as on_url,
    ):
        servers = {
            "off": ServerProcess("--database-url", off_url, cwd=Path(folder)),
            "on": ServerProcess(
                "--database-url",
                on_url,
                *(() if args.control else ("--metrics-listen", "127.0.0.1:0")),
                cwd=Path(folder),
            ),
        }
        try:
            for server in servers.values():
                server.wait_serving()
            if not args.control:
                scrape_url = next(m.group(1) for line in servers["on"].log if (m := METRICS.search(line)))
                threading.Thread(target=_scrape, args=(scrape_url, stop), daemon=True).start()
            clients = {k: Client(s.target, timeout=60) for k, s in servers.items()}
            sessions = {}
            history = tool_calls(args.items + args.rounds, "unprunable")
            for kind, client in clients.items():
                sessions[kind] = client.create_session().id
                client.append_openai(sessions[kind], history[: args.items])
                client.render_view(sessions[kind], ViewFormat.OPENAI_CHAT)
            before = {k: cpu_seconds(s.process.pid) for k, s in servers.items()}
            blocks: list[dict[str, float]] = []
            mark = dict(before)
            for n in range(args.rounds):
                if n and n % BLOCK == 0:
                    now = {k: cpu_seconds(s.process.pid) for k, s in servers.items()}
                    blocks.append({k: now[k] - mark[k] for k in kinds})
                    mark = now
                message = history[args.items + n]
                for kind in kinds if n % 2 == 0 else kinds[::-1]:
                    client, session = clients[kind], sessions[kind]
                    started = time.perf_counter()
                    client.append_openai(session, [message])
                    appended = time.perf_counter()
                    client.render_view(session, ViewFormat.OPENAI_CHAT)
                    latencies[(kind, "append")].append((appended - started) * 1000)
                    latencies[(kind, "render")].append((time.perf_counter() - appended) * 1000)
            now = {k: cpu_seconds(s.process.pid) for k, s in servers.items()}
            blocks.append({k: now[k] - mark[k] for k in kinds})  # the last block, however short
            cpu = {k: (now[k] - before[k]) / args.rounds * 1000 for k in kinds}
            for client in clients.values():
                client.close()
        finally:
            stop.set()
            for server in servers.values():
                server.stop()

    def row(name: str, off: float, on: float, pairs: list[tuple[float, float]]) -> list[str]:
        low, middle, high = _paired(pairs)
        return [
            name,
            f"{off:.2f}",
            f"{on:.2f}",
            f"{(on / off - 1) * 100:+.1f}%",
            f"{middle:+.1f}% [{low:+.1f}, {high:+.1f}]",
        ]

    backend = "postgres" if args.postgres_url else "sqlite"
    rows = [
        row(
            f"{backend}: {name} p50 (ms)",
            *(percentile(latencies[(k, call)], 50) for k in kinds),
            list(zip(latencies[("off", call)], latencies[("on", call)], strict=True)),
        )
        for name, call in (("AppendItems", "append"), ("RenderView", "render"))
    ]
    rows.append(
        row(f"{backend}: server CPU a round (ms)", cpu["off"], cpu["on"], [(b["off"], b["on"]) for b in blocks])
    )
    print(f"{args.rounds} rounds of one appended item and a render, a session of {args.items} items to start")
    if args.control:
        print("control run: the server named 'metrics on' runs without metrics too")
    header = ["measure", "metrics off", "metrics on", "on vs off", "paired: median [95% interval]"]
    report("metrics_overhead.py", header, rows)
    return 0


def _paired(pairs: list[tuple[float, float]], resamples: int = 2000) -> tuple[float, float, float]:
    """The median of the pairs' ratios (on / off - 1, in %) and a 95% bootstrap interval of it
    (seeded: the same pairs give the same interval)."""
    ratios = sorted((on / off - 1) * 100 for off, on in pairs if off > 0)
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], statistics.median(ratios), medians[int(0.975 * resamples) - 1]


def _scrape(url: str, stop: threading.Event) -> None:
    while not stop.wait(SCRAPE_SECONDS):
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()


if __name__ == "__main__":
    sys.exit(main())
