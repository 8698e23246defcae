"""Hashes of every view the lab's replays render: a change that should not touch the views
(a refactor, a move of modules) shows it left them byte for byte the same.

    python scripts/view_hashes.py record   # write tests/data/view_hashes.json
    python scripts/view_hashes.py check    # recompute; exit 1, naming each replay and call that differs
    python scripts/view_hashes.py replay openai_chat   # one format's hashes as JSON (what both run)

What is replayed: every trace in tests/data/traces/ (with its probes from bench/probes/) and
the fixtures the lab's report generates by default (seeds 0-4, EPISODES_PER_FIXTURE episodes;
every kind of episode is in each), under the shipped default policy with the trace's tools, as
the lab replays them (`contextd_lab.replay.replay`: the messages up to each assistant message
appended, the view rendered, the answer appended with what follows; the probes' originals
fetched back with Retrieve, the lab's bill reported with ReportUsage). Each replay runs once
per view format, on a session of its own, every render in that format. The two formats run at
once, each in a process of its own (`replay FORMAT`) whose one server, in that process on
embedded SQLite, serves all its replays.

What a call's hash covers: SHA-256 (its first 16 hex digits) of the canonical JSON (sorted
keys) of the whole view as the client returns it: the exact bytes of its messages, its system,
items (seq, representation, tokens, message, handle), token counts, warnings, cache breakpoint,
view and policy versions, and each certificate (number, seq, decision, level, rule, reason,
evidence, rationale, handle, figures, chain hashes). Handles and chain hashes are digests of
content and stay in. Left out, as they differ from run to run: the session id (a UUID drawn
at CreateSession) and each certificate's ``created_at`` (the time it was stored).

Wall-clock time reaches the engine in one way only: a render more than the provider cache's
TTL after the previous one (5 minutes for the default's provider) prices the cache as cold. Calls here follow each other
within milliseconds, so no replay comes near it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contextd_client import Client, View, ViewFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextd  # noqa: E402
from contextd_lab import fixtures  # noqa: E402
from contextd_lab.conditions import CALLER_BREAKPOINT, policy_text  # noqa: E402
from contextd_lab.replay import replay  # noqa: E402
from tests.conftest import ServerThread, test_settings  # noqa: E402

TRACES = ROOT / "tests" / "data" / "traces"
PROBES = ROOT / "bench" / "probes"
HASHES = ROOT / "tests" / "data" / "view_hashes.json"
FIXTURE_SEEDS = range(5)
"""The seeds of the lab report's fixtures (``contextd-lab report --seeds 0-4``)."""
CONDITION = "default"
FORMATS = (ViewFormat.OPENAI_CHAT, ViewFormat.ANTHROPIC_MESSAGES)
DIGITS = 16
"""Hex digits kept of each SHA-256: enough that a changed view never hashes the same."""


class RecordingClient(Client):
    """A client whose every render is in `format`, each view's hash appended to `hashes`."""

    def __init__(self, target: str, format: ViewFormat) -> None:
        super().__init__(target, timeout=120)
        self.format = format
        self.hashes: list[str] = []

    def render_view(
        self,
        session_id: str,
        format: ViewFormat | str,
        *,
        budget_tokens: int = 0,
        focus: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
        place_cache_breakpoint: bool = False,
    ) -> View:
        view = super().render_view(
            session_id,
            self.format,
            budget_tokens=budget_tokens,
            focus=focus,
            tools=tools,
            place_cache_breakpoint=place_cache_breakpoint,
        )
        self.hashes.append(view_hash(view))
        return view


def view_hash(view: View) -> str:
    """The hash of what a render returned, less what differs from run to run (module docstring)."""
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}
    del fields["session_id"], fields["messages"]  # the messages are hashed as their exact bytes, messages_json
    fields["items"] = [dataclasses.astuple(shown) for shown in view.items]
    fields["warnings"] = [dataclasses.astuple(warning) for warning in view.warnings]
    fields["certificates"] = [
        {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "created_at"} for c in view.certificates
    ]
    canonical = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGITS]


def replays() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each trace and fixture to replay, with its probes."""
    out = []
    for path in sorted(TRACES.glob("*.json")):
        trace = json.loads(path.read_text())
        out.append((trace, _probes(trace)))
    for seed in FIXTURE_SEEDS:
        fixture = fixtures.generate(seed).trace()
        out.append((fixture, fixtures.probes_of(fixture)))
    return out


def _probes(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    path = PROBES / f"{trace['id']}.json"
    if not path.exists():  # a trace replayed without its probes would retrieve less than the lab's replay
        raise SystemExit(f"no probes for the trace {trace['id']}: {path.relative_to(ROOT)} (bench/make_probes.py)")
    return [p for p in json.loads(path.read_text())["probes"] if p.get("trace_id", trace["id"]) == trace["id"]]


@contextmanager
def embedded_server() -> Iterator[str]:
    """A server in this process on a fresh SQLite file; its target."""
    shm = Path("/dev/shm")  # a RAM disk where there is one: SQLite's fsyncs cost nothing there
    with tempfile.TemporaryDirectory(prefix="contextd-views-", dir=shm if shm.is_dir() else None) as tmp:
        server = ServerThread(test_settings(f"sqlite+aiosqlite:///{tmp}/contextd.db", migrate_on_start=True)).start()
        try:
            yield server.target
        finally:
            server.stop()


def replay_all(view_format: ViewFormat) -> dict[str, dict[str, Any]]:
    """Per replay ("<trace id> <format>"): its number of calls and each call's hash, in order."""
    out: dict[str, dict[str, Any]] = {}
    with embedded_server() as target, RecordingClient(target, view_format) as client:
        for trace, probes in replays():
            client.hashes = []
            policy = policy_text(CONDITION, trace.get("tools"))
            replay(client, trace, CONDITION, policy, probes=probes, place_breakpoint=CONDITION not in CALLER_BREAKPOINT)
            out[f"{trace['id']} {view_format.value}"] = {"calls": len(client.hashes), "hashes": client.hashes}
    return out


def compute() -> dict[str, dict[str, Any]]:
    """`replay_all` of every format, each in a process of its own, all at once (a core each)."""
    command = [sys.executable, str(Path(__file__).resolve()), "replay"]
    workers = [subprocess.Popen([*command, f.value], stdout=subprocess.PIPE, text=True) for f in FORMATS]
    out: dict[str, dict[str, Any]] = {}
    for view_format, worker in zip(FORMATS, workers, strict=True):
        printed, _ = worker.communicate()
        if worker.returncode:
            raise RuntimeError(f"the {view_format.value} replays failed (exit status {worker.returncode})")
        out.update(json.loads(printed))
    return out


def render_points(trace: Mapping[str, Any]) -> list[int]:
    """Where each call of a replay renders: before which message (the last: after them all)."""
    return [i for i, m in enumerate(trace["messages"]) if m["role"] == "assistant"] + [len(trace["messages"])]


def differences(computed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per replay whose calls differ from the recorded ones, naming its first differing call."""
    recorded = json.loads(HASHES.read_text())
    points = {trace["id"]: render_points(trace) for trace, _ in replays()}
    out = []
    for name in sorted(recorded.keys() | computed.keys()):
        if name not in computed:
            out.append(f"{name}: recorded, not replayed now")
            continue
        if name not in recorded:
            out.append(f"{name}: replayed, not recorded")
            continue
        was, now = recorded[name]["hashes"], computed[name]["hashes"]
        differing = [n for n, (a, b) in enumerate(zip(was, now, strict=False)) if a != b]
        if differing:
            first, trace_points = differing[0], points[name.rpartition(" ")[0]]
            at = trace_points[first]
            where = f"before messages[{at}]" if at < trace_points[-1] else "after the last message"
            out.append(f"{name}: call {first + 1} of {len(now)} ({where}) differs first; {len(differing)} differ")
        elif len(was) != len(now):
            out.append(f"{name}: {len(now)} calls, {len(was)} recorded (the first {min(len(was), len(now))} agree)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("record", help=f"write {HASHES.relative_to(ROOT)}")
    modes.add_parser("check", help=f"compare with {HASHES.relative_to(ROOT)}; exit 1 on a difference")
    one = modes.add_parser("replay", help="print the hashes of one format's replays as JSON (what the others run)")
    one.add_argument("format", choices=[f.value for f in FORMATS])
    args = parser.parse_args(argv)
    if args.mode == "replay":
        print(json.dumps(replay_all(ViewFormat(args.format))))
        return 0
    started = time.perf_counter()
    computed = compute()
    calls = sum(r["calls"] for r in computed.values())
    source = Path(contextd.__file__).parent
    summary = f"{len(computed)} replays, {calls} calls, in {time.perf_counter() - started:.1f} s (contextd: {source})"
    if args.mode == "record":
        HASHES.write_text(json.dumps(computed, indent=1, sort_keys=True) + "\n")
        print(f"wrote {HASHES.relative_to(ROOT)}: {summary}")
        return 0
    found = differences(computed)
    for line in found:
        print(line)
    print(f"{len(found)} replays differ from {HASHES.relative_to(ROOT)}: {summary}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
