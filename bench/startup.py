"""Start-up and shut-down of `contextd serve`: CPU and wall time from exec to SERVING,
what the import costs, and how long SIGTERM takes to end the process.

    python bench/startup.py [--runs 5] [--postgres-url URL] [--grace 3] [--render-items 2400]
                            [--top 12] [--skip import,start,first,stop] [--no-bytecode-cache]

Start: each run execs `python -m contextd serve --listen 127.0.0.1:0` as a child
process on a database migrated beforehand (SQLite in a temporary directory;
with --postgres-url also a fresh database on that server, dropped after), with
--migrate-on-start (it must find the schema current) and without. When the
child logs "contextd serving on", its CPU time (user + sys of all its threads,
from /proc/<pid>/stat) and the wall time since exec are read; then it gets
SIGTERM and the time to its exit is the idle stop. Each condition starts with
one run not counted: it writes the bytecode to a cache of this benchmark's own
(PYTHONPYCACHEPREFIX), which the counted runs read, as a deployed server reads
its .pyc files; with --no-bytecode-cache every start compiles contextd's
sources instead (installed packages keep their own .pyc files).

First calls: made the moment a server (without --migrate-on-start) says
SERVING, as after a restart: AppendItems to a session made before the server
started, its RenderView, then CreateSession. What start-up leaves for later
shows in their latency.

Import: `python -c "import contextd.api.server"` run as often (CPU and wall
read by the child when the import is done), and one `python -X importtime` of
it: the top-level packages whose modules cost most (their own import time
summed).

Stop: `--grace-seconds G` servers get SIGTERM with a call in flight that
should outlast the grace: an append waiting for the database's write lock
(another connection holds it; the lock wait is 30 s), sent 0.3 s before, and
the cold render of a big session of its own (seconds of engine work on a
render thread), sent 1 s before. The figure is the wall time from SIGTERM to
the process's exit (a process still there after 120 s is killed: 120 then
means "did not stop"); the target is G + 1 s. Prints Markdown tables and the
command that produced them. A benchmark, not a test: read medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from contextd_client import Client, ContextdError, RetryPolicy, ViewFormat
from contextd_lab.service import child_environment

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import backends  # noqa: E402 - reuse the suite's database helpers

SERVING = re.compile(r"contextd serving on [^:]+:(\d+)")
IMPORT = "import contextd.api.server"
_TICKS = os.sysconf("SC_CLK_TCK")
CHILD_ENV = child_environment()


@dataclass
class Figures:
    what: str
    cpu: list[float]
    wall: list[float]
    note: str = ""


def spread(samples: list[float]) -> str:
    if not samples:
        return "-"
    return f"{min(samples):.2f} / {statistics.median(samples):.2f} / {max(samples):.2f}"


def progress(what: str) -> None:
    print(f"[startup] {what}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + sys CPU of a live process, all its threads, in seconds (clock-tick resolution)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces; fields start after it
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime: fields 14 and 15 of stat


class Serve:
    """One `contextd serve` child: started, timed to SERVING, stopped and timed to exit."""

    def __init__(self, *flags: str, cwd: Path) -> None:
        command = [sys.executable, "-m", "contextd", "serve", "--listen", "127.0.0.1:0", *flags]
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command, cwd=cwd, env=CHILD_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self.port = 0
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            match = SERVING.search(line)
            if match:
                self.serving_cpu = cpu_seconds(self.process.pid)
                self.serving_wall = time.monotonic() - self.started
                self.port = int(match.group(1))
                break
        else:
            raise RuntimeError("server did not start:\n" + "\n".join(self.log))
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 120) -> float:
        """SIGTERM, then the wall seconds until the process has exited."""
        sent = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        elapsed = time.monotonic() - sent
        self._reader.join(10)
        return elapsed


def bare_import(runs: int) -> Figures:
    """CPU and wall from exec to the end of the import (read by the child itself, as at SERVING:
    the interpreter's teardown after it is not counted)."""
    timed = f"{IMPORT}; import os, time; t = os.times(); print(t.user + t.system, time.monotonic())"
    cpu, wall = [], []
    for run in range(runs + 1):  # the first is a warm-up (it fills the bytecode cache)
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-c", timed], cwd=ROOT, env=CHILD_ENV, capture_output=True, text=True)
        used, ended = map(float, out.stdout.split())
        if run:
            cpu.append(used)
            wall.append(ended - started)
    return Figures(f'`python -c "{IMPORT}"`', cpu, wall)


def import_offenders(top: int) -> list[tuple[str, int]]:
    """(top-level package, its modules' own import time in microseconds), costliest first."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", IMPORT],
        cwd=ROOT,
        env=CHILD_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    costs: Counter[str] = Counter()
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        costs[name.strip().split(".")[0]] += int(own)
    return costs.most_common(top)


@contextmanager
def backend_databases(tmp: Path, postgres_url: str | None) -> Iterator[list[tuple[str, str]]]:
    """(backend, migrated database URL) for SQLite and, given a server, Postgres."""
    found = [("sqlite", f"sqlite+aiosqlite:///{tmp / 'contextd.db'}")]
    if postgres_url:
        found.append(("postgres", backends.create_database(postgres_url, "contextd_startup")))
    try:
        for _, url in found:
            migrated = subprocess.run(
                [sys.executable, "-m", "contextd", "migrate", "--database-url", url], capture_output=True, text=True
            )
            if migrated.returncode:
                raise SystemExit(f"cannot migrate {url}: {migrated.stderr}")
        yield found
    finally:
        if postgres_url:
            for backend, url in found:
                if backend == "postgres":
                    backends.drop_database(postgres_url, url)


def start_up(databases: list[tuple[str, str]], runs: int, tmp: Path) -> tuple[list[Figures], list[Figures]]:
    """Exec to SERVING, and the idle stop, per backend and migrate flag."""
    starts, stops = [], []
    for backend, url in databases:
        for migrate_flag in ("--migrate-on-start", "--no-migrate-on-start"):
            progress(f"start-up: {backend}, {migrate_flag}")
            cpu, wall, stop = [], [], []
            Serve("--database-url", url, migrate_flag, cwd=tmp).stop()  # a warm-up
            for _ in range(runs):
                server = Serve("--database-url", url, migrate_flag, cwd=tmp)
                cpu.append(server.serving_cpu)
                wall.append(server.serving_wall)
                stop.append(server.stop())
            starts.append(Figures(f"{backend}, {migrate_flag} (schema current)", cpu, wall))
            stops.append(Figures(f"{backend}, idle, {migrate_flag}", [], stop))
    return starts, stops


def first_calls(databases: list[tuple[str, str]], runs: int, tmp: Path) -> list[Figures]:
    """The latency of the first calls, made the moment the server says SERVING (what start-up
    left for later shows here): as after a restart, the first is an append to a session the
    database held before the server started, then its render, then a new session."""
    figures = []
    for backend, url in databases:
        progress(f"first calls: {backend}")
        server = Serve("--database-url", url, "--no-migrate-on-start", cwd=tmp)
        with Client(server.target, timeout=60) as client:
            session = client.create_session().id
        server.stop()
        samples: dict[str, list[float]] = {
            "AppendItems (1 item), the first call": [],
            "RenderView": [],
            "CreateSession": [],
        }
        for _ in range(runs):
            server = Serve("--database-url", url, "--no-migrate-on-start", cwd=tmp)
            with Client(server.target, timeout=60) as client:
                started = time.monotonic()
                client.append_openai(session, [{"role": "user", "content": "Fix the failing test. " * 20}])
                appended = time.monotonic()
                client.render_view(session, ViewFormat.OPENAI_CHAT)
                rendered = time.monotonic()
                client.create_session()
                created = time.monotonic()
            server.stop()
            for name, seconds in zip(
                samples, (appended - started, rendered - appended, created - rendered), strict=True
            ):
                samples[name].append(seconds * 1000)
        figures += [Figures(f"{backend}, {name}", [], ms) for name, ms in samples.items()]
    return figures


def big_session(target: str, items: int, output_bytes: int) -> str:
    """A session whose cold render takes seconds: `items` items, half of them test-run outputs."""
    with Client(target, timeout=120) as client:
        session = client.create_session().id
        messages: list[dict[str, object]] = [{"role": "user", "content": "Make the suite pass."}]
        for k in range(items // 2):
            use = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": f'{{"k": {k}}}'}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
            body = "".join(
                f"tests/test_m{k}.py::test_{j} {'FAILED' if (j * k) % 17 == 0 else 'PASSED'} [{j % 100}%] t={j * k}\n"
                for j in range(output_bytes // 60)
            )
            messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
        for start in range(0, len(messages), 50):
            client.append_openai(session, messages[start : start + 50])
        return session


def in_flight(target: str, call: Callable[[Client], object], outcomes: list[str]) -> threading.Thread:
    """`call` on a thread of its own; its outcome (ok or the status code) lands in `outcomes`."""

    def run() -> None:
        with Client(target, timeout=120, retry=RetryPolicy(max_attempts=1)) as client:
            try:
                call(client)
                outcomes.append("completed")
            except ContextdError as error:
                outcomes.append(error.code)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextmanager
def write_lock_held(backend: str, url: str, session: str) -> Iterator[None]:
    """Another connection holds what the next append to `session` needs: SQLite's write lock,
    or the session's advisory lock on Postgres."""
    if backend == "sqlite":
        blocker = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        return
    import asyncpg
    from sqlalchemy.engine import make_url

    from contextd_storage.database import session_lock_key

    held, release = threading.Event(), threading.Event()

    async def hold() -> None:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", session_lock_key("default", session))
            held.set()
            await asyncio.to_thread(release.wait)
        finally:
            await conn.close()

    holder = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    holder.start()
    if not held.wait(30):
        raise RuntimeError("could not take the session's advisory lock")
    try:
        yield
    finally:
        release.set()
        holder.join(30)


def stops_in_flight(
    databases: list[tuple[str, str]], runs: int, grace: float, render_items: int, tmp: Path
) -> list[Figures]:
    """SIGTERM to exit with a call in flight past the grace: a blocked append, a cold render."""
    return [f for backend, url in databases for f in stops_on(backend, url, runs, grace, render_items, tmp)]


def stops_on(backend: str, url: str, runs: int, grace: float, render_items: int, tmp: Path) -> list[Figures]:
    figures = []
    flags = ("--grace-seconds", str(grace), "--lock-timeout-ms", "30000", "--no-migrate-on-start")
    progress(f"stop: {backend}, building {runs + 1} sessions of {render_items:,} items")
    seed = Serve("--database-url", url, *flags, cwd=tmp)
    with Client(seed.target) as client:
        blocked = client.create_session().id
    # A session's first render after a restart is cold only once (the view state is stored
    # with it), so each run renders a session of its own.
    sessions = [big_session(seed.target, render_items, output_bytes=20_000) for _ in range(runs + 1)]
    seed.stop()
    timing = Serve("--database-url", url, *flags, cwd=tmp)
    with Client(timing.target, timeout=120) as client:
        started = time.monotonic()
        client.render_view(sessions.pop(), ViewFormat.OPENAI_CHAT)
        cold = time.monotonic() - started
    timing.stop()

    def append(client: Client) -> object:
        return client.append_openai(blocked, [{"role": "user", "content": "in flight"}])

    def render(client: Client) -> object:
        return client.render_view(sessions.pop(), ViewFormat.OPENAI_CHAT)

    cases = (
        ("an append waiting for the write lock", append, 0.3),
        (f"a cold render of a {render_items:,}-item session ({cold:.1f} s uninterrupted)", render, 1.0),
    )
    for what, call, under_way in cases:
        progress(f"stop: {backend}, {what}")
        wall: list[float] = []
        outcomes: list[str] = []
        for _ in range(runs):
            server = Serve("--database-url", url, *flags, cwd=tmp)
            with write_lock_held(backend, url, blocked) if call is append else nullcontext():
                caller = in_flight(server.target, call, outcomes)
                time.sleep(under_way)  # the call is under way inside the server
                wall.append(server.stop())
            caller.join(30)
        tally = ", ".join(f"{n} {code}" for code, n in Counter(outcomes).items())
        figures.append(Figures(f"{backend}, {what}", [], wall, tally))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres-url", default=os.environ.get("CONTEXTD_TEST_POSTGRES_URL"))
    parser.add_argument("--grace", type=float, default=3.0, help="--grace-seconds of the stop runs")
    parser.add_argument("--render-items", type=int, default=2400, help="items of the stop runs' big sessions")
    parser.add_argument("--top", type=int, default=12, help="packages listed from the import profile")
    parser.add_argument("--skip", default="", help="comma-separated parts not to run: import, start, first, stop")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="every start compiles contextd's sources, as without .pyc files",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    imports, offenders, starts, stops, firsts = [], [], [], [], []
    with tempfile.TemporaryDirectory() as name, backend_databases(Path(name), args.postgres_url) as databases:
        tmp = Path(name)
        CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        if args.no_bytecode_cache:
            CHILD_ENV["PYTHONDONTWRITEBYTECODE"] = "1"  # installed packages keep their own .pyc files
        else:
            CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")  # written by the warm-up runs, read after
        if "import" not in skip:
            imports = [bare_import(args.runs)]
            offenders = import_offenders(args.top)
        if "start" not in skip:
            starts, stops = start_up(databases, args.runs, tmp)
        if "first" not in skip:
            firsts = first_calls(databases, args.runs, tmp)
        if "stop" not in skip:
            stops += stops_in_flight(databases, args.runs, args.grace, args.render_items, tmp)

    print(f"command: python bench/startup.py {' '.join(sys.argv[1:])}".rstrip())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    bytecode = "compiled at every start" if args.no_bytecode_cache else "cached (after a warm-up run)"
    print(f"machine: {machine}, {time.strftime('%Y-%m-%d')}; {args.runs} runs each; bytecode {bytecode}")
    if imports or starts:
        print()
        print("| exec to | runs | CPU s (user+sys) min / median / max | wall s min / median / max |")
        print("| --- | --- | --- | --- |")
        for f in imports:
            print(f"| import: {f.what} | {len(f.cpu)} | {spread(f.cpu)} | {spread(f.wall)} |")
        for f in starts:
            print(f"| SERVING: {f.what} | {len(f.cpu)} | {spread(f.cpu)} | {spread(f.wall)} |")
    if firsts:
        print()
        print("| first call, made at SERVING | runs | ms min / median / max |")
        print("| --- | --- | --- |")
        for f in firsts:
            print(f"| {f.what} | {len(f.wall)} | {spread(f.wall)} |")
    if offenders:
        print()
        print(f'`python -X importtime -c "{IMPORT}"`, own import time by top-level package (one run):')
        print()
        print("| package | ms |")
        print("| --- | --- |")
        for package, micros in offenders:
            print(f"| {package} | {micros / 1000:.1f} |")
    if stops:
        print()
        header = f"SIGTERM to exit (stop runs: --grace-seconds {args.grace:g})"
        print(f"| {header} | runs | wall s min / median / max | the call in flight |")
        print("| --- | --- | --- | --- |")
        for f in stops:
            print(f"| {f.what} | {len(f.wall)} | {spread(f.wall)} | {f.note or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
