"""The scans for the reads of one file that cover given lines, or that those lines cover
(`contextd.engine.spans.ReadSpans`): CPU per read of a session, each read asking both.

    python bench/spans.py [--reads 2000,8000] [--repeat 5]

Two sessions of reads of one file: paging through it (`sed -n k,k+40p`, k growing, as agents
page through a file: a read covers none of the others, and blocks of reads far from the lines
are passed over by their bounds), and ranges anywhere in its first 460 lines (many reads cover
many others: what a scan yields grows with the session). Prints the best of `--repeat` runs,
in microseconds per read, and the command that produced it.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "service"))

from contextd.engine.spans import ReadSpans, Span  # noqa: E402


def span_of(kind: str, k: int, salt: int) -> Span:
    if kind == "paging":
        return ((k + 1, k + 41),)
    draw = random.Random(salt * 1_000_003 + k)
    first = draw.randrange(1, 400)
    return ((first, first + draw.choice([5, 20, 40, 60])),)


def per_read(kind: str, reads: int) -> tuple[float, int]:
    """(µs of CPU per read for its two scans, how many reads the scans yielded)."""
    spans = ReadSpans()
    for k in range(reads):
        spans.add(2 * k + 2, span_of(kind, k, 1))
    yielded = 0
    started = time.process_time()
    for k in range(reads):
        asked = span_of(kind, k, 2)
        yielded += sum(1 for _ in spans.covered_by(reads, asked))
        yielded += sum(1 for _ in spans.covering(reads, 2 * k + 2, 2**62, asked))
    return (time.process_time() - started) * 1e6 / reads, yielded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reads", default="2000,8000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"command: python bench/spans.py --reads {args.reads} --repeat {args.repeat}")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print("\n| reads of the file | paging through it (µs a read) | ranges anywhere in it (µs a read) |")
    print("| ---: | ---: | ---: |")
    for reads in (int(n) for n in args.reads.split(",")):
        cells = []
        for kind in ("paging", "ranges"):
            runs = [per_read(kind, reads) for _ in range(args.repeat)]
            cells.append(f"{min(us for us, _ in runs):.1f} ({runs[0][1]:,} yielded)")
        print(f"| {reads:,} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
