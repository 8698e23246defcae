"""Retrieve and Search latency over loopback: the Redis stash, the durable record, full text.

    python bench/retrieve.py [--postgres-url URL] [--redis-url URL] [--repeat 300]

Starts a real `contextd serve` process on Postgres (a fresh database on the
given server, dropped after) with the Redis stash, builds a 1,000-item
session whose older tool outputs a masking policy takes out of the view,
then times Retrieve with the blocking client: by handle with the original
in the stash; by handle after the stash lost it (the key deleted before each
call, outside the timed part), so the durable record answers and warms the
stash again; and a page of a 40,000-token original; then Search over the session (full
text, substring, regex). Prints a Markdown table and the command that
produced it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from contextd_client import Client, ViewFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contextd_lab.service import ServerProcess  # noqa: E402
from contextd_storage.stash import keys  # noqa: E402
from tests import backends  # noqa: E402

MASK_OLD = (
    "cache: {prices: {input: 3, cache_write: 3.75, cache_read: 0.3, ttl_seconds: 0.000001}}\n"
    "protection: {last_turns: 2}\nevidence: {max_level: 4}\n"
    "rules: [{name: mask-old-outputs, transform: mask, when: {roles: [tool]}}]\n"
)


def session_messages(n_items: int) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "user", "content": "Work through the modules."}]
    call = 0
    while len(messages) < n_items:
        call += 1
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {call}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
        body = "".join(f"module_{call}.py:{k}: value = compute({k}, {call})\n" for k in range(30))
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": body})
    return messages[:n_items]


def timed(repeat: int, before: Callable[[], None], call: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres-url", default=os.environ.get("CONTEXTD_TEST_POSTGRES_URL"))
    parser.add_argument("--redis-url", default=os.environ.get("CONTEXTD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    if not args.postgres_url:
        raise SystemExit("needs --postgres-url or CONTEXTD_TEST_POSTGRES_URL")
    database = backends.create_database(args.postgres_url, "contextd_retrieve")
    server = ServerProcess("--database-url", database, "--redis-url", args.redis_url).wait_serving()
    store = redis.Redis.from_url(args.redis_url)
    try:
        with Client(server.target, timeout=30) as client:
            session = client.create_session("bench-retrieve", policy=MASK_OLD).id
            messages = session_messages(1000)
            for start in range(0, len(messages), 200):
                client.append_openai(session, messages[start : start + 200])
            view = client.render_view(session, ViewFormat.OPENAI_CHAT)
            handles = [c.handle for c in view.certificates if c.decision == "prune"]
            handle = handles[len(handles) // 2]
            # The entry's name holds the session's key: found once by its handle.
            entry = next(iter(store.scan_iter(match=f"{keys.PREFIX}:*:e:{handle}")))
            client.retrieve(session, handle)  # in the stash from here on
            rows = [
                (
                    "GetSession (for scale: any call)",
                    timed(args.repeat, lambda: None, lambda: client.get_session(session)),
                ),
                (
                    "by handle, from the Redis stash",
                    timed(args.repeat, lambda: None, lambda: client.retrieve(session, handle)),
                ),
                (
                    "by handle, stash lost: from the durable record",
                    timed(args.repeat, lambda: store.delete(entry), lambda: client.retrieve(session, handle)),
                ),
            ]
            rows += [
                (
                    "Search, full text (1,000 items): a word one output holds",
                    timed(args.repeat, lambda: None, lambda: client.search(session, "module_250.py")),
                ),
                (
                    "Search, full text (1,000 items): a word every output holds, first page",
                    timed(args.repeat, lambda: None, lambda: client.search(session, "compute")),
                ),
                (
                    "Search, substring (1,000 items)",
                    timed(args.repeat, lambda: None, lambda: client.search(session, "(17, 250)", mode="substring")),
                ),
                (
                    "Search, regex (1,000 items)",
                    timed(
                        args.repeat, lambda: None, lambda: client.search(session, r"compute\(29, 49\d\)", mode="regex")
                    ),
                ),
            ]
            big = "".join(
                f"{n:05d} status={'FAIL' if n == 4321 else 'ok'} value={n * 37 % 1009}\n" for n in range(6000)
            )
            call = {"id": "big", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            client.append_openai(
                session,
                [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "big", "content": big},
                    {"role": "user", "content": "Go on."},
                    {"role": "assistant", "content": "On it."},
                    {"role": "user", "content": "And?"},
                ],
            )
            later = client.render_view(session, ViewFormat.OPENAI_CHAT)
            big_handle = next(c.handle for c in later.certificates if c.decision == "prune" and c.seq == 1002)
            total = client.retrieve(session, big_handle).total_tokens
            rows.append(
                (
                    f"a 2,000-token page of a {total:,}-token original, from the stash",
                    timed(args.repeat, lambda: None, lambda: client.retrieve(session, big_handle, offset=20_000)),
                )
            )
    finally:
        server.stop()
        store.close()
        backends.drop_database(args.postgres_url, database)
    print(f"command: python bench/retrieve.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; Postgres, Redis\n"
    )
    print("| call | calls | p50 | p99 |")
    print("| --- | --- | --- | --- |")
    for name, samples in rows:
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"| {name} | {len(samples)} | {statistics.median(samples):.2f} ms | {p99:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
