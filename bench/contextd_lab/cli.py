"""``contextd-lab``: fixtures, replays and the lab's report (issue 6).

    contextd-lab fixtures [--seeds 0-4] [--episodes 18] [--out DIR]
    contextd-lab replay TRACE [--probes FILE] [--condition NAME ...] [--at-once] [--json FILE] [SERVICE]
    contextd-lab report [--traces DIR] [--probes DIR] [--seeds 0-4] [--episodes 18] [--out docs/lab.md] [--headroom]
                        [--json FILE] [SERVICE]

SERVICE: ``--target HOST:PORT`` replays through a running contextd; otherwise one is
started for the run (``contextd serve`` on a free port): embedded (SQLite in a temporary
folder, the stash in process) unless ``--database-url`` (and ``--redis-url``) name real ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from contextd_client import Client
from contextd_lab import fixtures, headroom
from contextd_lab import report as lab_report
from contextd_lab.conditions import CONDITIONS, DEFAULT_VARIANTS
from contextd_lab.service import ServerProcess


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextd-lab", description=__doc__, formatter_class=_Raw)
    commands = parser.add_subparsers(dest="command", required=True)

    made = commands.add_parser("fixtures", help="write generated fixtures (trace + labels, probes)")
    made.add_argument("--seeds", type=_seeds, default=_seeds("0-4"), help="a seed or a range, e.g. 0-4")
    made.add_argument("--out", type=Path, default=Path("lab-fixtures"))
    made.add_argument("--episodes", type=int, default=fixtures.EPISODES_PER_FIXTURE, help="episodes in each fixture")

    one = commands.add_parser("replay", help="replay one trace under each condition and print its figures")
    one.add_argument("trace", type=Path)
    one.add_argument("--json", type=Path, help="also write every figure as JSON records to this file")
    one.add_argument("--probes", type=Path, help="a probe file (default: the trace's own, for a fixture)")
    names = [*CONDITIONS, *DEFAULT_VARIANTS, headroom.CONDITION]
    one.add_argument("--condition", action="append", choices=names, help="repeatable; default: all")
    one.add_argument(
        "--at-once", action="store_true", help="edits apply when found (the cache priced as saving nothing)"
    )
    _service_options(one)

    report = commands.add_parser("report", help="run fixtures and traces under every condition; write the report")
    report.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    report.add_argument("--probes", type=Path, default=Path("bench/probes"), help="<trace id>.json probe files")
    report.add_argument("--seeds", type=_seeds, default=_seeds("0-4"))
    report.add_argument("--episodes", type=int, default=fixtures.EPISODES_PER_FIXTURE, help="episodes in each fixture")
    report.add_argument("--out", type=Path, default=Path("docs/lab.md"), help="the report; plots go beside it")
    report.add_argument("--json", type=Path, help="also write every figure as JSON records to this file")
    report.add_argument(
        "--headroom",
        action="store_true",
        help="also run headroom-ai's proxy in the loop (its venv, .venv-headroom, is installed from PyPI on first use)",
    )
    _service_options(report)

    args = parser.parse_args(argv)
    if argv is None:  # the command itself: stopped from outside, unwind so the service started for it stops too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.command == "fixtures":
        return _write_fixtures(args.seeds, args.episodes, args.out)
    with _service(args) as target, Client(target, timeout=120) as client:
        if args.command == "replay":
            trace = json.loads(args.trace.read_text())
            conditions = args.condition or names
            by_trace = {trace["id"]: _probes(trace, args.probes)}
            results = lab_report.run(client, [trace], by_trace, conditions, args.gap, at_once=args.at_once)
            print(lab_report.replay_table(results))
            _write_json(args.json, results)
            return 1 if results.lost() else 0
        traces = [json.loads(p.read_text()) for p in sorted(args.traces.glob("*.json"))]
        if not traces:
            print(f"no traces in {args.traces} (--traces): the report covers the fixtures only", file=sys.stderr)
        made_fixtures = [fixtures.generate(seed, args.episodes).trace() for seed in args.seeds]
        probes = {t["id"]: _probes(t, args.probes / f"{t['id']}.json") for t in traces}
        probes.update((f["id"], _probes(f, None)) for f in made_fixtures)
        command = "contextd-lab " + " ".join(sys.argv[1:] if argv is None else argv)
        peers = [headroom.CONDITION] if args.headroom else []
        results = lab_report.write(
            client, traces, made_fixtures, probes, args.out, gap=args.gap, command=command, peers=peers
        )
        _write_json(args.json, results)
        print(f"wrote {args.out}")
        return 0


class _Raw(argparse.RawDescriptionHelpFormatter):
    pass


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def _service_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gap",
        type=float,
        default=30.0,
        help="seconds between model calls in the lab's cache model (the service itself sees the calls back to back)",
    )
    parser.add_argument("--target", help="a running contextd (host:port); else one is started for the run")
    parser.add_argument("--database-url", help="for the service started: e.g. postgresql+asyncpg://user@host/db")
    parser.add_argument("--redis-url", help="for the service started: its stash, e.g. redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def _service(args: argparse.Namespace) -> Iterator[str]:
    if args.target:
        yield args.target
        return
    with tempfile.TemporaryDirectory(prefix="contextd-lab-") as tmp:
        flags: list[str] = []
        if args.database_url:
            flags += ["--database-url", args.database_url]
        if args.redis_url:
            flags += ["--redis-url", args.redis_url]
        with ServerProcess(*flags, cwd=Path(tmp)) as server:
            yield server.target


def _probes(trace: dict[str, Any], path: Path | None) -> list[dict[str, Any]]:
    if path is not None and path.exists():
        return [p for p in json.loads(path.read_text())["probes"] if p.get("trace_id", trace["id"]) == trace["id"]]
    if "labels" in trace:  # a fixture carries its own
        return fixtures.probes_of(trace)
    return []


def _write_json(path: Path | None, results: lab_report.Results) -> None:
    if path is not None:
        path.write_text(json.dumps(lab_report.records(results), indent=1, sort_keys=True) + "\n")


def _write_fixtures(seeds: Sequence[int], episodes: int, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        fixture = fixtures.generate(seed, episodes)
        (out / f"{fixture.id}.json").write_text(json.dumps(fixture.trace(), indent=1) + "\n")
        (out / f"{fixture.id}.probes.json").write_text(json.dumps(fixture.probe_file(), indent=1) + "\n")
        print(f"{out / fixture.id}.json: {len(fixture.messages)} messages, {len(fixture.probes)} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
