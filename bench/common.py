"""What the service benchmarks share: a database to serve from, and how they print."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import backends  # noqa: E402 - the suite's database helpers


@contextmanager
def database(postgres_url: str, folder: Path, name: str) -> Iterator[str]:
    """A fresh database URL: on the Postgres server of `postgres_url` (dropped after), else a
    SQLite file in `folder`."""
    if not postgres_url:
        yield f"sqlite:///{folder / (name + '.db')}"
        return
    url = backends.create_database(postgres_url, f"contextd_bench_{name}")
    try:
        yield url
    finally:
        backends.drop_database(postgres_url, url)


def percentile(samples: list[float], p: float) -> float:
    """The `p`th percentile of `samples` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(script: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """The command, the machine and a Markdown table of `rows`."""
    print(f"command: python bench/{script} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print()
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
