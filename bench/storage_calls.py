"""CPU of the storage layer's most frequent calls, in process: no gRPC, no other process.

    python bench/storage_calls.py [--postgres-url URL] [--calls 1000] [--runs 7]

Every call of the API first looks up its session, and every render reads the same handful
of rows before the engine runs; at a few hundred microseconds each, the Python around those
statements (building them, their cache keys, reading the rows back) is a good part of a
call's CPU. This measures, on a fresh database (SQLite in a temporary folder, or one made on
`--postgres-url` and dropped after), the CPU time (this process's, `time.process_time`: the
statements' building and the driver's client side) per call of:

* `get_session` (GetSession: one statement);
* `session_key` (Retrieve, Search, DeleteSession look a session up by it);
* a render's reads: in one transaction under the session's lock, as `ViewService.render`
  makes them, the session row and its items (the items cached after the first call), then
  the view state, pins, the agent's proposals and the durable edits (one statement since
  `views.render_reads`; four before);
* a one-item append with an idempotency key (an agent's turn; hashing and counting, done
  before the storage layer, are not in it);
* a render's writes: in one transaction, the session row, the view state's change, the
  record of the call and its `view_rendered` event (`views.save_render`: one statement on
  Postgres; the certificates a render may add are not in it).

`--runs` runs of `--calls` calls each; prints min and median per call, and the command. A
benchmark, not a test: compare two checkouts by running it in each (PYTHONPATH), alternated.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def _measure(call: Callable[[], Awaitable[object]], calls: int, runs: int) -> list[float]:
    """ms of CPU per call, one figure a run (after a warm-up of a few hundred calls)."""
    for _ in range(min(300, calls)):
        await call()
    per_call = []
    for _ in range(runs):
        started = time.process_time()
        for _ in range(calls):
            await call()
        per_call.append((time.process_time() - started) * 1000 / calls)
    return per_call


async def run(url: str, calls: int, runs: int) -> dict[str, list[float]]:
    from contextd.engine.model import ItemContent, Role, TextBlock
    from contextd.engine.state import ViewState, state_to_json
    from contextd.engine.timing import Usage
    from contextd_storage import migrate, views
    from contextd_storage.database import Database
    from contextd_storage.events import NewEvent
    from contextd_storage.history import HistoryStore
    from contextd_storage.rows import AppendRequest, PreparedItem

    await migrate.upgrade(url)
    db = Database(url)
    store = HistoryStore(db)
    try:
        await store.create_session("tenant", "session", {})
        contents = [
            ItemContent(role=Role.USER, content=(TextBlock(f"step {n}: read the next module"),)) for n in range(50)
        ]
        prepared = [PreparedItem(content, f"{n:064x}", 10) for n, content in enumerate(contents)]
        await store.append(AppendRequest("tenant", "session", prepared, "batch"))

        async def reads() -> None:
            async with db.write("tenant", "session") as conn:
                row, _, _ = await store.history_in(conn, "tenant", "session")
                key = row["key"]
                await views.render_reads(conn, key)

        appended = itertools.count()

        async def append() -> None:
            n = next(appended)
            one = ItemContent(role=Role.USER, content=(TextBlock(f"turn {n}: go on"),))
            key = f"append-{n}"
            await store.append(AppendRequest("tenant", "appends", [PreparedItem(one, f"{n:064x}", 5)], key, key))

        await store.create_session("tenant", "appends", {})
        rendered = itertools.count(1)
        await store.create_session("tenant", "writes", {})
        writes_key = await store.session_key("tenant", "writes")
        async with db.write("tenant", "writes") as conn:
            await views.save_state(conn, writes_key, views.StoredState(ViewState()), "", state_to_json(ViewState()))

        async def writes() -> None:
            version = next(rendered)
            before = views.StoredState(ViewState(view_version=version), snapshot_version=1)
            async with db.write("tenant", "writes") as conn:
                await store.session_row(conn, "tenant", "writes")
                call = views.CallRecord(version + 1, "openai_chat", 900, Usage(0, 100, 800))
                told = [NewEvent("tenant", "writes", "view_rendered", {"view_version": version + 1})]
                await views.save_render(conn, writes_key, before, '{"applied":[]}', None, call, told)

        return {
            "get_session": await _measure(lambda: store.get_session("tenant", "session"), calls, runs),
            "session_key": await _measure(lambda: store.session_key("tenant", "session"), calls, runs),
            "a render's reads (one transaction)": await _measure(reads, calls, runs),
            "a one-item append, with its idempotency key": await _measure(append, calls, runs),
            "a render's writes (one transaction: lock, session row, state change, call record, event)": await _measure(
                writes, calls, runs
            ),
        }
    finally:
        await db.engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres-url", default="", help="a server to make (and drop) a database on")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    from tests import backends

    with tempfile.TemporaryDirectory() as folder:
        if args.postgres_url:
            url = backends.create_database(args.postgres_url, "contextd_storage_calls")
        else:
            url = f"sqlite+aiosqlite:///{Path(folder) / 'calls.db'}"
        try:
            figures = asyncio.run(run(url, args.calls, args.runs))
        finally:
            if args.postgres_url:
                backends.drop_database(args.postgres_url, url)

    backend = "postgres" if args.postgres_url else "sqlite"
    print(f"\nCPU per storage call, in process ({backend}; {args.runs} runs of {args.calls:,} calls)\n")
    print("| call | min ms | median ms |")
    print("| --- | ---: | ---: |")
    for name, runs in figures.items():
        print(f"| {name} | {min(runs):.3f} | {statistics.median(runs):.3f} |")
    print(f"\ncommand: python bench/storage_calls.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
