"""Fuzz a contextd server for minutes: every RPC, hostile values, raw bytes (issue 16).

    python scripts/fuzz.py [--minutes 3] [--seed N] [--database-url URL | --target HOST:PORT] [--out DIR]
    python scripts/fuzz.py --replay DIR/01-ListSessions.bin [--target HOST:PORT]

Without --target it starts `contextd serve` itself (on SQLite in a temporary
directory, or on --database-url), reads its log to name the exception behind
each INTERNAL answer, and starts it again when it stops answering or exits
(each such event is a finding). With --target the findings name the
reference only; fuzz a throw-away server: the run leaves many sessions.

What it sends (tests/fuzzing.py): first the sweep, every hand-written hostile
value in every field that takes it, nested messages' fields included, and each
hand-written policy and tool output through its scenario; then, for the rest
of the time, hypothesis examples round robin over the RPCs (messages and raw
bytes) and the two scenarios, seeded so a run can be repeated. It prints, per
RPC, the calls, the status histogram and the slowest call; every failure
(INTERNAL, UNKNOWN, a stall, a crash), deduplicated, with the smallest request
that still fails the same way, written under --out with the command that
replays it; and the calls slower than --slow seconds. Exit status 1 when
anything failed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contextd_lab.service import ServerProcess  # noqa: E402
from tests.fuzzing import (  # noqa: E402
    RPCS,
    HistoryRender,
    PolicyRender,
    RawCase,
    history_renders,
    history_sweep,
    policy_renders,
    policy_sweep,
    prepare_targets,
    raw_requests,
    requests,
    sweep,
)
from tests.service.api.fuzzing import Caller, Failure, Findings, Fuzzer, ServerError, ServerErrors  # noqa: E402

EXAMPLES_PER_TURN = 10
"""Hypothesis examples of one family (an RPC's messages, its raw bytes, a scenario) before the next."""
SCENARIO_CASES = {"render under a drawn policy": "CreateSession", "render a hostile history": "AppendItems"}


class Server:
    """The server under test: one this script started (and restarts), or someone else's at --target."""

    def __init__(self, target: str | None, database_url: str | None, workdir: Path) -> None:
        self.external = target
        self.database_url = database_url or f"sqlite+aiosqlite:///{workdir / 'contextd.db'}"
        self.workdir = workdir
        self.process: ServerProcess | None = None
        self.errors = ServerErrors()
        self.restarts = 0

    def start(self) -> str:
        if self.external:
            return self.external
        self.process = ServerProcess("--database-url", self.database_url, cwd=self.workdir).wait_serving()
        return self.process.target

    def restart(self) -> str:
        self.stop()
        self.restarts += 1
        return self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.errors.feed(self.process.log)
            self.process.stop()

    def exit_code(self) -> int | None:
        return self.process.process.poll() if self.process is not None else None

    def answers(self, channel: grpc.Channel) -> bool:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        try:
            stub.GetAgentTools(api.GetAgentToolsRequest(format=api.VIEW_FORMAT_OPENAI_CHAT), timeout=5)
        except grpc.RpcError:
            return False
        return True

    def lookup(self, details: str) -> ServerError | None:
        """The log entry of an INTERNAL answer's reference (the log is read by a thread: wait a little)."""
        for _ in range(10):
            if self.process is not None:
                self.errors.feed(self.process.log)
            found = self.errors.lookup(details)
            if found is not None or self.process is None:
                return found
            time.sleep(0.05)
        return None


class Run:
    """A fuzzer against the server, with the server restarted (and the targets prepared again) when it
    stalls or exits; what it found so far survives a restart."""

    def __init__(self, server: Server, slow_seconds: float, stop_at: float, deadline: float) -> None:
        self.server = server
        self.stop_at = stop_at
        self.deadline = deadline
        self.findings = Findings(lookup=server.lookup, slow_seconds=slow_seconds)
        self.fuzzer = self._connect(server.start())

    def _connect(self, target: str) -> Fuzzer:
        caller = Caller(target, self.deadline)
        return Fuzzer(caller, prepare_targets(caller.channel), self.findings, max_stalls=None)  # restarts instead

    def time_left(self) -> bool:
        return time.monotonic() < self.stop_at

    def guarded(self, send: Callable[[], Any]) -> None:
        """Run one send; then, when the server stopped answering or exited, record it and start it again."""
        stalls = sum(counts["DEADLINE_EXCEEDED"] for counts in self.findings.statuses.values())
        with contextlib.suppress(grpc.RpcError):  # preparing the scratch session again failed: looked at below
            send()
        stalled = sum(counts["DEADLINE_EXCEEDED"] for counts in self.findings.statuses.values()) > stalls
        code = self.server.exit_code()
        if code is None and not (stalled and not self.server.answers(self.fuzzer.caller.channel)):
            return
        if self.server.external:
            if code is None:
                print("the server stopped answering; waiting 30 s", file=sys.stderr)
                time.sleep(30)
            return
        last = self.fuzzer.last
        what = f"the server exited (code {code})" if code is not None else "the server stopped answering after a stall"
        if last is not None:
            self.findings.record(replace(last, code="SERVER_DOWN", details=what))
        self.fuzzer.caller.close()
        self.fuzzer = self._connect(self.server.restart())

    def sweep(self) -> None:
        for rpc in RPCS:
            for request in sweep(rpc, self.fuzzer.targets):
                if not self.time_left():
                    return
                self.guarded(functools.partial(self._send, rpc, request))
        for scenario in policy_sweep():
            if self.time_left():
                self.guarded(functools.partial(self._render_under, scenario))
        for history in history_sweep():
            if self.time_left():
                self.guarded(functools.partial(self._render_history, history))

    # Through self.fuzzer at call time: a restart replaces it.
    def _send(self, rpc: str, request: Message) -> None:
        self.fuzzer.send(rpc, request)

    def _send_raw(self, rpc: str, raw: RawCase) -> None:
        self.fuzzer.send_raw(rpc, raw)

    def _render_under(self, scenario: PolicyRender) -> None:
        self.fuzzer.render_under(scenario)

    def _render_history(self, scenario: HistoryRender) -> None:
        self.fuzzer.render_history(scenario)

    def explore(self, base_seed: int) -> int:
        """Hypothesis examples, one family at a time, until the time is up; the number of turns."""
        turn = 0
        while self.time_left():
            for strategy, send in self._families():
                if not self.time_left():
                    break
                self._examples(strategy, send, base_seed + turn)
                turn += 1
        return turn

    def _families(self) -> list[tuple[st.SearchStrategy[Any], Callable[[Any], Any]]]:
        """(strategy, send) of each RPC's messages and raw bytes, and of the two scenarios."""
        targets = self.fuzzer.targets
        families: list[tuple[st.SearchStrategy[Any], Callable[[Any], Any]]] = []
        for rpc in RPCS:
            families.append((requests(rpc, targets), functools.partial(self._send, rpc)))
            families.append((raw_requests(rpc, targets), functools.partial(self._send_raw, rpc)))
        families.append((policy_renders(), self._render_under))
        families.append((history_renders(), self._render_history))
        return families

    def _examples(self, strategy: st.SearchStrategy[Any], send: Callable[[Any], Any], turn_seed: int) -> None:
        @seed(turn_seed)
        @settings(
            max_examples=EXAMPLES_PER_TURN,
            deadline=None,
            database=None,
            derandomize=False,
            phases=[Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        )
        @given(strategy)
        def one(example: Any) -> None:
            if self.time_left():
                self.guarded(functools.partial(send, example))

        one()


def _reproducer(out: Path) -> Callable[[Failure], str]:
    def save(failure: Failure) -> str:
        example = failure.smallest
        number = len(list(out.glob("*.bin"))) + 1
        rpc, data = example.rpc, example.request
        then = ""
        if example.case in SCENARIO_CASES and example.message is not None:  # the input is the session's
            rpc, data = SCENARIO_CASES[example.case], example.message.SerializeToString()
            then = f", then RenderView the session ({example.case})"
        path = out / f"{number:02d}-{rpc}.bin"
        path.write_bytes(data)
        hexed = data.hex() if len(data) <= 96 else f"{data[:48].hex()}... ({len(data):,} bytes)"
        return f"{hexed}; python scripts/fuzz.py --replay {path} --target HOST:PORT{then}"

    return save


def replay(path: Path, server: Server) -> int:
    rpc = re.sub(r"^\d+-", "", path.stem)
    caller = Caller(server.start())
    outcome = caller.call(rpc, path.read_bytes(), case=f"replay of {path.name}")
    logged = server.lookup(outcome.details) if outcome.code == "INTERNAL" else None
    print(f"{rpc} -> {outcome.code} in {outcome.seconds:.2f} s: {logged.explanation if logged else outcome.details}")
    caller.close()
    server.stop()
    return 1 if Findings.failed(outcome) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long to fuzz (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    parser.add_argument("--target", help="host:port of a running server (default: start one)")
    parser.add_argument("--database-url", help="for the server this script starts (default: SQLite in a temp dir)")
    parser.add_argument("--out", type=Path, help="where reproducers go (default: a new temp dir)")
    parser.add_argument("--slow", type=float, default=2.0, help="report calls slower than this, in seconds")
    parser.add_argument("--deadline", type=float, default=20.0, help="per-call deadline in seconds (past it: a stall)")
    parser.add_argument("--skip-sweep", action="store_true", help="hypothesis examples only")
    parser.add_argument("--replay", type=Path, help="send one reproducer (NN-RPC.bin) and print the answer")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="contextd-fuzz-"))
    server = Server(args.target, args.database_url, workdir)
    if args.replay:
        return replay(args.replay, server)
    run_seed = args.seed if args.seed is not None else random.randrange(2**32)
    out = args.out or workdir / "findings"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run = Run(server, args.slow, started + args.minutes * 60, args.deadline)
    try:
        if not args.skip_sweep:
            run.sweep()
        swept = time.monotonic() - started
        turns = run.explore(run_seed)
    finally:
        run.fuzzer.caller.close()
        server.stop()
    elapsed = time.monotonic() - started
    calls = sum(run.findings.calls.values())
    backend = "external" if args.target else run.server.database_url.partition("+")[0]
    print(f"$ python scripts/fuzz.py {' '.join(sys.argv[1:])}")
    print(
        f"seed {run_seed}; {backend} server; {elapsed / 60:.1f} minutes "
        f"({'no sweep' if args.skip_sweep else f'{swept:.0f} s of sweep'}, "
        f"{turns} hypothesis turns of {EXAMPLES_PER_TURN} examples); {calls:,} calls; "
        f"server restarts: {server.restarts}; reproducers in {out}"
    )
    print()
    print(run.findings.report(_reproducer(out)))
    print()
    print(run.findings.slowest_calls())
    return 1 if run.findings.failures else 0


if __name__ == "__main__":
    sys.exit(main())
