"""Search latency at 10,000 items, on both backends, in every mode.

    python bench/search.py [--backends sqlite,postgres] [--postgres-url URL] [--items 10000] [--repeat 50]

Starts a real `contextd serve` process per backend (SQLite in a temporary
directory; Postgres in a fresh database on the given server, dropped after),
builds a session of tool calls and their outputs (test logs, grep hits,
source files, listings, JSON; about 2 KB each, a 30 KB test log every 50th
call, the planted failure in one call of 500), renders it once with a policy
that masks older tool outputs (so most of them are out of the view), gathers
Postgres' statistics (ANALYZE, as autovacuum would soon after), then times
Search with the blocking client over loopback. Each query's hits are
digested, so runs before and after a change can be compared for the same
answers. Prints a Markdown table (the first call of each query, which warms what it reads,
then p50 and p99 of the rest) and the command that produced it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contextd_client import Client, ViewFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contextd_lab.service import ServerProcess  # noqa: E402
from tests import backends  # noqa: E402 - reuse the suite's database helpers

MASK_OLD = (
    "cache: {prices: {input: 3, cache_write: 3.75, cache_read: 0.3, ttl_seconds: 0.000001}}\n"
    "protection: {last_turns: 2}\nevidence: {max_level: 4}\n"
    "rules: [{name: mask-old-outputs, transform: mask, when: {roles: [tool]}}]\n"
)
PLANTED_EVERY = 1000
"""Every this many items, a tool output holds the planted failure."""
QUERIES: list[tuple[str, str, dict[str, Any]]] = [
    ("full text, a word ten outputs hold", "insufficient", {}),
    ("substring, ten outputs hold it", "declined: insufficient funds", {"mode": "substring"}),
    ("substring, every output holds it (first page)", "passed in", {"mode": "substring"}),
    ("substring, no item holds it", "zanzibar_quokka", {"mode": "substring"}),
    (
        "substring, out of the view only",
        "declined: insufficient funds",
        {"mode": "substring", "only_out_of_view": True},
    ),
    ("full text, out of the view only", "insufficient", {"only_out_of_view": True}),
    ("regex with literals, ten outputs", r"ch_[0-9A-Za-z]{8} declined", {"mode": "regex"}),
    ("regex with literals, no item", r"req_\d+ zanzibar", {"mode": "regex"}),
    ("regex without a literal (a scan)", r"\d{3}-\d{4}-\d{5}", {"mode": "regex"}),
    ("regex, case-insensitive", r"(?i)INSUFFICIENT FUNDS", {"mode": "regex"}),
]
WORDS = ("parse", "config", "session", "token", "render", "cache", "budget", "retry", "worker", "queue", "index")


def tool_output(rng: random.Random, call: int) -> str:
    """One of a coding agent's tool outputs: about 2-3 KB, a 30 KB test log every 50th call."""
    kind = call % 5
    if kind == 0:
        cases = 500 if call % 50 == 0 else 40
        lines = [
            f"tests/test_{rng.choice(WORDS)}.py::test_{rng.choice(WORDS)}_{n} passed in {n % 97} ms"
            for n in range(cases)
        ]
        return "\n".join([f"======== test session starts (run {call}) ========", *lines, f"{cases} passed"]) + "\n"
    if kind == 1:
        return "".join(
            f"src/app/{rng.choice(WORDS)}.py:{rng.randrange(1, 900)}:    {rng.choice(WORDS)} = "
            f"{rng.choice(WORDS)}_{rng.choice(WORDS)}(key, {n}) passed in\n"
            for n in range(40)
        )
    if kind == 2:
        body = [f"def {rng.choice(WORDS)}_{n}(self, {rng.choice(WORDS)}: int) -> str:" for n in range(16)]
        body = [
            f"{line}\n    return self.{rng.choice(WORDS)}[{n}]  # passed in by the caller\n"
            for n, line in enumerate(body)
        ]
        return f'"""Module {call}."""\n\nimport os\n\n\nclass {rng.choice(WORDS).title()}:\n' + "".join(body)
    if kind == 3:
        return "".join(
            f"-rw-r--r-- 1 dev dev {rng.randrange(100, 99999):6d} Dec  1 12:{n:02d} "
            f"{rng.choice(WORDS)}_{n}.py passed in\n"
            for n in range(45)
        )
    return (
        "{"
        + ", ".join(
            f'"{rng.choice(WORDS)}_{n}": {{"id": {call * 100 + n}, "state": "passed in review"}}' for n in range(30)
        )
        + "}\n"
    )


def session_messages(n_items: int) -> list[dict[str, object]]:
    rng = random.Random(18)
    messages: list[dict[str, object]] = [{"role": "user", "content": "Find why the charges fail."}]
    call = 0
    while len(messages) < n_items:
        call += 1
        arguments = f'{{"command": "run step {call}"}}'
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
        body = tool_output(rng, call)
        if call % (PLANTED_EVERY // 2) == 0:
            tag = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789") for _ in range(8))
            middle = len(body) // 2
            body = (
                f"{body[:middle]}\ncharge ch_{tag} declined: insufficient funds (request req_{call})\n{body[middle:]}"
            )
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": body})
    return messages[:n_items]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(
    target: str, n_items: int, repeat: int, analyze: Callable[[], None]
) -> tuple[list[tuple[str, float, list[float], str]], dict[str, float]]:
    with Client(target, timeout=120) as client:
        session = client.create_session("bench-search", policy=MASK_OLD).id
        messages = session_messages(n_items)
        started = time.perf_counter()
        for start in range(0, len(messages), 500):
            client.append_openai(session, messages[start : start + 500])
        built = time.perf_counter() - started
        started = time.perf_counter()
        view = client.render_view(session, ViewFormat.OPENAI_CHAT)
        rendered = time.perf_counter() - started
        analyze()
        facts = {
            "append seconds": built,
            "render seconds": rendered,
            "out of the view": sum(c.decision == "prune" for c in view.certificates),
            "text MB": sum(len(str(m["content"] or "")) for m in messages) / 1e6,
        }
        rows = []
        for name, query, options in QUERIES:
            began = time.perf_counter()
            answer = client.search(session, query, **options)  # warm, and the answer digested
            first = (time.perf_counter() - began) * 1000
            seqs = [h.seq for h in answer.hits]
            digest = hashlib.sha256(repr([(h.seq, h.snippet) for h in answer.hits]).encode()).hexdigest()[:8]
            summary = f"{len(seqs)} hits{' +more' if answer.next_page_token else ''}, {digest}"
            samples = []
            for _ in range(repeat):
                began = time.perf_counter()
                client.search(session, query, **options)
                samples.append((time.perf_counter() - began) * 1000)
            rows.append((name, first, samples, summary))
        return rows, facts


def analyze(database: str | None) -> None:
    """Postgres: statistics of the tables, as autovacuum gathers them soon after a session this
    size is written (the development server runs without autovacuum)."""
    if database is not None:
        backends.admin(database, "ANALYZE")


def run_backend(
    backend: str, postgres_url: str | None, n_items: int, repeat: int
) -> tuple[list[Any], dict[str, float]]:
    database = None
    with tempfile.TemporaryDirectory() as tmp:
        if backend == "postgres":
            if not postgres_url:
                raise SystemExit("postgres backend needs --postgres-url or CONTEXTD_TEST_POSTGRES_URL")
            database = backends.create_database(postgres_url, "contextd_bench_search")
            server = ServerProcess("--database-url", database)
        else:
            server = ServerProcess(cwd=Path(tmp))
        try:
            server.wait_serving()
            return measure(server.target, n_items, repeat, lambda: analyze(database))
        finally:
            server.stop()
            if database is not None and postgres_url:
                backends.drop_database(postgres_url, database)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--postgres-url", default=os.environ.get("CONTEXTD_TEST_POSTGRES_URL"))
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    results = [(b, *run_backend(b, args.postgres_url, args.items, args.repeat)) for b in args.backends.split(",")]
    print(f"command: python bench/search.py {' '.join(sys.argv[1:])}".rstrip())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine}, {time.strftime('%Y-%m-%d')}")
    for backend, _, facts in results:
        print(f"{backend}: " + ", ".join(f"{k} {v:,.1f}" for k, v in facts.items()))
    print()
    print(f"| backend | Search, {args.items:,} items | first | p50 | p99 | answer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for backend, rows, _ in results:
        for name, first, samples, summary in rows:
            p50, p99 = statistics.median(samples), percentile(samples, 99)
            print(f"| {backend} | {name} | {first:.1f} ms | {p50:.1f} ms | {p99:.1f} ms | {summary} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
