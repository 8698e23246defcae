"""Can one tenant stall another? GetSession latency of tenant A while tenant B works.

    python bench/stall.py [--items 10000] [--seconds 8] [--postgres-url URL] [--target HOST:PORT]
                          [--batch 800] [--phases idle,renders,incremental,appends,regex,restart]
                          [--render-processes N] [--budget-tokens N] [--redis-url URL]

Starts a real `contextd serve` (SQLite in a temporary folder unless
`--postgres-url` names a server, on which a fresh database is made and
dropped after; or uses `--target`, which must accept the API keys `a:key-a`
and `b:key-b`), then measures tenant A's GetSession, one call every 10 ms
from its own process, in the phases `--phases` names (all by default), `--seconds` each:

1. idle: nothing else runs;
2. renders: tenant B, from another process, renders its `--items`-item
   session of tool calls over and over (the first render cold), appending one
   item before each;
3. incremental: as 2, on a session B rendered
   before the phase, so that every render in it resumes from the last one (in
   phase 2 the cold first render, seconds of pure Python on one thread, fills
   much of the window; this is the steady state of an agent's session);
4. appends: B appends `--batch` calls and outputs a call (800: what an agent
   framework's import of a long history, or a proxy's first request, sends),
   back to back; "B renders" then counts B's appends and their median;
5. hostile regex: B's policy holds a rule whose `when.regex` is `(a+)+$`,
   over 2,000 outputs of 28 `a`s and a `!` (with Python's `re` each match
   takes seconds), and B renders that session over and over;
6. restart: B's `--items`-item session, rendered once, then the server
   restarted (not with `--target`): B's first render loads the history, the
   view state and the certificates from the database, then renders go on as
   in 2 (run last: it restarts the server).

With `--render-processes N` the server renders on N processes of its own
(contextd/render_processes.py), not on threads beside A's calls. With
`--budget-tokens N` B's renders ask for a budget (a view sized to a model's
window, not the whole history). With `--redis-url URL` the server keeps its
carries there (`--carry-secret`): B's first render of its long session keeps
what it derived, beside A's calls, and after the restart B's first render
resumes from what the server kept as it stopped.

Prints A's p50 / p99 / max per phase, B's renders and their median time, and
the command that produced it. The target: A's p99 at most 20 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = "a:key-a,b:key-b"
HOSTILE_POLICY = (
    "protection: {last_turns: 1}\nevidence: {max_level: 4}\n"
    "rules: [{name: hostile, transform: mask, when: {roles: [tool], regex: '(a+)+$'}}]\n"
)


def tool_session(n_items: int, start: int = 0, body: str | None = None) -> list[dict[str, Any]]:
    """OpenAI messages: a user turn, then calls of a shell tool and their distinct outputs."""
    messages: list[dict[str, Any]] = [] if start else [{"role": "user", "content": "Work through the modules."}]
    call = start
    while len(messages) < n_items:
        call += 1
        arguments = f'{{"command": "python -m tool --step {call}"}}'
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
        text = body if body is not None else "".join(f"step {call} row {k}: value={call * 31 + k}\n" for k in range(8))
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": text})
    return messages[:n_items]


def flags(database: str, render_processes: int = 0, kept: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The server's flags: its database, the two tenants' keys, where it renders, and where it
    keeps its carries (`kept`)."""
    return ("--database-url", database, "--api-keys", KEYS, "--render-processes", str(render_processes), *kept)


def _fill(client: Any, session_id: str, messages: list[dict[str, Any]]) -> None:
    for start in range(0, len(messages), 800):
        client.append_openai(session_id, messages[start : start + 800])


def _render_loop(target: str, session_id: str, seconds: float, next_call: int, out: Any, budget: int = 0) -> None:
    """Tenant B: append one call and its output, render, again, for `seconds`. The view comes
    back as bytes, not decoded: this process shares the machine's two cores with the server,
    and what is measured is the server."""
    import grpc

    from contextd_client import Client, RetryPolicy
    from contextd_client.v1 import contextd_pb2 as api

    request = api.RenderViewRequest(
        session_id=session_id, format=api.VIEW_FORMAT_OPENAI_CHAT, budget_tokens=budget
    ).SerializeToString()
    times: list[float] = []
    with (
        Client(target, api_key="key-b", timeout=120, retry=RetryPolicy(budget=120)) as client,
        grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)]) as channel,
    ):
        render = channel.unary_unary("/contextd.v1.ContextService/RenderView")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            render(request, timeout=120, metadata=(("authorization", "Bearer key-b"),))
            times.append(time.perf_counter() - started)
            next_call += 1
            client.append_openai(session_id, tool_session(2, start=next_call))
    out.put(times)


def _append_loop(target: str, seconds: float, batch: int, out: Any) -> None:
    """Tenant B: append `batch` calls and outputs at once, again and again, for `seconds` (a new
    session every ten batches)."""
    from contextd_client import Client, RetryPolicy

    times: list[float] = []
    with Client(target, api_key="key-b", timeout=120, retry=RetryPolicy(budget=120)) as client:
        end = time.monotonic() + seconds
        session_id, start = "", 0
        while time.monotonic() < end:
            if len(times) % 10 == 0:
                session_id, start = client.create_session().id, 0
            messages = tool_session(batch, start=start)
            started = time.perf_counter()
            client.append_openai(session_id, messages)
            times.append(time.perf_counter() - started)
            start += batch
    out.put(times)


def _probe(target: str, session_id: str, seconds: float) -> list[float]:
    """Tenant A: one GetSession every 10 ms for `seconds`; the latency of each, in ms."""
    from contextd_client import Client

    samples: list[float] = []
    with Client(target, api_key="key-a", timeout=60) as client:
        client.get_session(session_id)  # the channel is connected before timing
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            client.get_session(session_id)
            samples.append((time.perf_counter() - started) * 1000)
            time.sleep(max(0.0, 0.01 - (time.perf_counter() - started)))
    return samples


def _phase(
    target: str, a_session: str, seconds: float, b_session: str | None, next_call: int, batch: int = 0, budget: int = 0
) -> dict[str, Any]:
    """A's latency while B renders `b_session` (or, with `batch`, appends batches of that many items)."""
    context = multiprocessing.get_context("spawn")
    renders: list[float] = []
    worker = None
    queue = context.Queue()
    if batch:
        worker = context.Process(target=_append_loop, args=(target, seconds + 2, batch, queue))
    elif b_session is not None:
        worker = context.Process(target=_render_loop, args=(target, b_session, seconds + 2, next_call, queue, budget))
    if worker is not None:
        worker.start()
        time.sleep(1.0)  # B's first call is under way
    samples = _probe(target, a_session, seconds)
    if worker is not None:
        renders = queue.get(timeout=600)
        worker.join(600)
    ordered = sorted(samples)
    return {
        "calls": len(samples),
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
        "renders": len(renders),
        "render_median": statistics.median(renders) * 1000 if renders else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument("--batch", type=int, default=800, help="items per append in the appends phase")
    parser.add_argument("--target", default="", help="a running server that takes the keys a:key-a,b:key-b")
    parser.add_argument("--render-processes", type=int, default=0, help="the server's --render-processes")
    parser.add_argument("--budget-tokens", type=int, default=0, help="B's renders ask for this budget (0: none)")
    parser.add_argument(
        "--redis-url", default="", help="the server keeps its carries there (--carry-secret): B's long session's too"
    )
    parser.add_argument(
        "--phases",
        default="idle,renders,incremental,appends,regex,restart",
        help="which phases to run, of idle, renders, incremental, appends, regex, restart (comma-separated)",
    )
    args = parser.parse_args()

    from contextd_client import Client, ViewFormat
    from contextd_lab.service import ServerProcess
    from tests import backends

    server, database = None, ""
    kept = ("--redis-url", args.redis_url, "--carry-secret", secrets.token_hex(16)) if args.redis_url else ()
    with tempfile.TemporaryDirectory() as folder:
        if not args.target:
            database = (
                backends.create_database(args.postgres_url, "contextd_stall")
                if args.postgres_url
                else f"sqlite:///{Path(folder) / 'stall.db'}"
            )
            server = ServerProcess(*flags(database, args.render_processes, kept)).wait_serving()
        target = args.target or (server.target if server else "")
        try:
            with Client(target, api_key="key-a") as a, Client(target, api_key="key-b", timeout=300) as b:
                a_session = a.create_session().id
                a.append_openai(a_session, [{"role": "user", "content": "hello"}])
                big = b.create_session().id
                _fill(b, big, tool_session(args.items))
                hostile = b.create_session(policy=HOSTILE_POLICY).id
                _fill(b, hostile, tool_session(2_000, body="a" * 28 + "!"))
            chosen = set(args.phases.split(","))
            phases = {}
            if "idle" in chosen:
                phases["idle"] = _phase(target, a_session, args.seconds, None, 0)
            if "renders" in chosen:
                phases[f"B renders {args.items:,} items"] = _phase(
                    target, a_session, args.seconds, big, args.items, budget=args.budget_tokens
                )
            if "incremental" in chosen:
                with Client(target, api_key="key-b", timeout=300) as b:
                    warm = b.create_session().id
                    _fill(b, warm, tool_session(args.items))
                    # the cold render, before the window
                    b.render_view(warm, ViewFormat.OPENAI_CHAT, budget_tokens=args.budget_tokens)
                name = f"B renders {args.items:,} items, each resuming the last"
                phases[name] = _phase(target, a_session, args.seconds, warm, args.items, budget=args.budget_tokens)
            if "appends" in chosen:
                name = f"B appends {args.batch:,} items a call"
                phases[name] = _phase(target, a_session, args.seconds, None, 0, batch=args.batch)
            if "regex" in chosen:
                phases["B's policy: (a+)+$"] = _phase(target, a_session, args.seconds, hostile, 2_000)
            if "restart" in chosen and server is not None:
                with Client(target, api_key="key-b", timeout=300) as b:
                    rendered = b.create_session().id
                    _fill(b, rendered, tool_session(args.items))
                    b.render_view(rendered, ViewFormat.OPENAI_CHAT, budget_tokens=args.budget_tokens)
                server.stop()
                server = ServerProcess(*flags(database, args.render_processes, kept)).wait_serving()
                target = server.target
                name = f"B's first render of {args.items:,} items after a restart, then renders"
                phases[name] = _phase(target, a_session, args.seconds, rendered, args.items, budget=args.budget_tokens)
        finally:
            if server is not None:
                server.stop()
            if args.postgres_url and database:
                backends.drop_database(args.postgres_url, database)

    print(f"\nTenant A's GetSession while tenant B works ({platform.python_version()}, {sys.platform})\n")
    print("| phase | A's calls | A p50 ms | A p99 ms | A max ms | B renders | B render median ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in phases.items():
        print(
            f"| {name} | {r['calls']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['renders']} "
            f"| {r['render_median']:.0f} |"
        )
    print(f"\ncommand: python bench/stall.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
