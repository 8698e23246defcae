"""What a session event costs an append: `HistoryStore.append` with its event's row and without,
in process, blocks of appends alternated.

    python bench/event_cost.py [--appends 200] [--blocks 6] [--postgres-url URL]

On a fresh database (a SQLite file, or a fresh database on `--postgres-url`, dropped after),
one session gets `--blocks` blocks of `--appends` one-item appends with the event written
(`events.record`, as the service does) and as many without (the call replaced by a no-op),
the two alternated. Prints the median per-append wall and CPU time of each. A benchmark, not a
test: read the ratio, on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import database as fresh_database
from common import report


async def _measure(url: str, appends: int, blocks: int) -> dict[str, list[tuple[float, float]]]:
    from contextd.engine.model import ItemContent, Role, TextBlock
    from contextd_storage import events, migrate
    from contextd_storage.database import Database
    from contextd_storage.history import HistoryStore
    from contextd_storage.rows import AppendRequest, PreparedItem

    async def no_event(*_: object) -> None:
        return None

    await migrate.upgrade(url)
    db = Database(url)
    store = HistoryStore(db)
    recording = events.record
    try:
        await store.create_session("bench", "s", {})
        item = ItemContent(role=Role.USER, content=(TextBlock("go on with the next file " * 10),))
        found: dict[str, list[tuple[float, float]]] = {"with the event": [], "without": []}
        for _ in range(blocks):
            for mode in found:
                events.record = recording if mode == "with the event" else no_event  # type: ignore[assignment]
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(appends):
                    prepared = [PreparedItem(item, uuid.uuid4().hex * 2, 50)]
                    await store.append(AppendRequest("bench", "s", prepared, request_hash="r"))
                found[mode].append(((time.perf_counter() - wall) / appends, (time.process_time() - cpu) / appends))
        return found
    finally:
        events.record = recording  # type: ignore[assignment]
        await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--postgres-url", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, fresh_database(args.postgres_url, Path(folder), "events") as url:
        found = asyncio.run(_measure(url.replace("sqlite:///", "sqlite+aiosqlite:///"), args.appends, args.blocks))
    base_wall = statistics.median(w for w, _ in found["without"])
    base_cpu = statistics.median(c for _, c in found["without"])
    rows = []
    for mode, blocks in found.items():
        wall, cpu = statistics.median(w for w, _ in blocks), statistics.median(c for _, c in blocks)
        rows.append(
            [mode, f"{wall * 1000:.2f} ms", f"{cpu * 1000:.2f} ms", f"{wall / base_wall:.3f}", f"{cpu / base_cpu:.3f}"]
        )
    report(
        "event_cost.py",
        ["append", "wall (median block)", "CPU (median block)", "wall / without", "CPU / without"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
