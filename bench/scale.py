"""How a render's cost grows with the session: the engine alone and through the service.

    python bench/scale.py [--sizes 1000,10000] [--workload unprunable|modules|mixed|sliding] [--repeat 20]
                          [--backend sqlite|postgres] [--postgres-url URL] [--parts engine,service]
                          [--budget-tokens N] [--format openai_chat|anthropic_messages|...] [--back-to-back]
                          [--redis-url URL] [--restarts N]

The session is a coding agent's tool calls whose outputs the default policy can remove
nothing of (`unprunable`: reads of different files, every output its own, 60 lines of
assignments; so nothing shrinks the work), reads of different modules of functions
(`modules`: each output's skeleton read with Python's parser, the most a first render spends
on an output), calls of many kinds (`mixed`: modules and ranges read, some again, test runs,
greps, `git status` again and again, edits, failures: the rules find much to do), or reads that
page through one file (`sliding`: `sed -n k,k+40p` of the same path, as agents do). Each size
is measured in processes of its own:

* engine (in process, `contextd.engine.pipeline.render`, no gRPC, no database; the
  garbage collector tuned as the service tunes it; a second table gives the render after
  one append stage by stage, medians in ms):
  *cold*, a genuine first render in a fresh process (nothing memoised; wall time and
  CPU time, and CPU per item); *one appended*, a render after one item is appended,
  from the previous render's state and carry, as the service keeps them (*the first after the
  cold render*: the first of those, from the cold render's carry); *without
  the carry*, the same from the state alone (memos warm, as in the process that made it),
  measured between two renders after an append: a render as long as the session leaves the
  processor's caches cold for the next, as other sessions' renders do in a shared process
  (`--back-to-back`: not measured, the renders after an append one after another).
* service (`contextd serve` processes over loopback, the blocking client; the view comes
  back undecoded): *cold*, the first render of the session; *one appended*, one item
  appended then a render, on the replica that made the previous render; *another
  replica*, the same, each render on the other of two replicas over one database (on
  SQLite, two processes over one file, one at a time); *after a restart*, the first
  render of a replica started after the previous render; with `--redis-url` (the replicas keep
  their carries in Redis, `--carry-secret`): *after a restart, its kept carries read as it
  starts*, the first render of the other replica, stopped (keeping its carry) and started again
  (it reads the carries kept most recently before it serves, `--carry-warm-seconds`); *new to
  the session, from the kept carry*, the first render of the first replica started again with
  `--carry-warm-seconds 0 --carry-follow-seconds 0` (it reads the session's carry at its first
  render); *new to the session, read as another replica kept it*, the first render of a replica
  started with `--carry-warm-seconds 0` while the other, having rendered the session, stops,
  keeping its carry, which the new one reads back as it is kept (`--carry-follow-seconds`) and
  has read before the render comes (the other replica, likewise, reads what the cold render
  kept before anything after it is timed); *cold response*, the size of the cold render's
  response; *one appended: its response*, the median size of the responses after one append,
  and *its transport alone*, the round trip of a response that size through a bare gRPC server
  of its own process (no database, no render: what sending the view costs, whatever made it),
  measured as many times; *through the client*, one appended then `Client.render_view` (the
  view decoded into messages and items, as an agent gets it), wall time and the client's
  processor time, by a client holding no view (`held_views=0`: each view comes whole) and one
  holding its last (the default: the service sends what changed since, contextd_client/_held.py),
  taking turns; *to a caller holding the last view*, one appended then a render whose request
  sends back the token of the view the caller got last (`known_view_token`), and *its
  response*, that render's response (what changed since). Each restart's first render is a
  single render, of
  whichever item came; `--restarts N` (3) restarts each kind N times and reports the median.

`--budget-tokens N`: every render, the engine's and the service's, asks for that budget (a
session over it offloads its oldest turns to placeholders, and the first render decides about
every output it offloads or compresses).

Prints a Markdown table of p50s, the exponent of each column between consecutive sizes
(cost ~ items^k), and the command. A benchmark, not a test: read ratios, on a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CODE_LINES = 60
FOLLOWED = re.compile(r"read back the carries other replicas kept of \d+ sessions in [\d.]+ s")


def tool_calls(n_items: int, workload: str, start: int = 0) -> list[dict[str, Any]]:
    """OpenAI messages: a system prompt and a task (unless `start`), then shell calls and outputs."""
    messages: list[dict[str, Any]] = (
        []
        if start
        else [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the parser."},
        ]
    )
    call = start
    while len(messages) < n_items:
        call += 1
        if workload == "sliding":  # paging through one file, 40 lines a read, overlapping
            command = f"sed -n {call},{call + 40}p src/app/parse.py"
            output = "".join(f"    line_{k} = parse(line_{k - 1})  # {k}\n" for k in range(call, call + 41))
        elif workload == "modules":  # reads of different modules of functions, each parsed for its skeleton
            command = f"cat src/module_{call}.py"
            output = f"# module {call}\nimport os\n\n" + "".join(
                f'def step_{call}_{k}(x):\n    """Step {k}."""\n    a = x + {k}\n    b = a * 2\n'
                f"    c = os.sep * b\n    d = len(c) - a\n    return a + b + d\n\n"
                for k in range((CODE_LINES - 3) // 8)
            )
        elif workload == "mixed":
            command, output = mixed_call(call)
        else:  # reads of different files, every output its own
            command = f"sed -n '1,{CODE_LINES}p' src/module_{call}.py"
            output = f"# module {call}\n" + "".join(f"value_{call}_{k} = compute({k})\n" for k in range(CODE_LINES))
        arguments = json.dumps({"command": command})
        use = {"id": f"c{call}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [use]})
        messages.append({"role": "tool", "tool_call_id": f"c{call}", "content": output})
    return messages[:n_items] if not start else messages


def mixed_call(call: int) -> tuple[str, str]:
    """(command, output) of call `call` of a session of many kinds of calls, drawn from the call's
    number: whole modules read (some read again, unchanged), ranges of lines, test runs, greps,
    `git status` and listings run again and again, edits, failures."""
    draw = random.Random(call)
    kind, path = draw.randrange(10), f"src/pkg{draw.randrange(30)}/mod{draw.randrange(20)}.py"
    if kind in (0, 1):  # a module, or one read before (the same content again)
        n = call if kind == 0 else call % 50
        return f"cat {path}", "\n".join(
            f'def f_{n}_{k}(x):\n    """Doc {k}."""\n    a = x + {k}\n    b = a * 2\n'
            f"    c = b - a\n    return a + b + c\n"
            for k in range(10)
        )
    if kind == 2:
        first = draw.randrange(1, 400)
        lines = (f"    value_{i} = parse(value_{i - 1})  # {path}" for i in range(first, first + 60))
        return f"sed -n '{first},{first + 60}p' {path}", "\n".join(lines)
    if kind == 3:
        passed = "\n".join(f"tests/test_{i}.py::test_case_{j} PASSED" for i in range(5) for j in range(12))
        failed = "FAILED tests/test_3.py::test_4\n=== 1 failed ==="
        ending = "=== 60 passed in 1.2s ===" if draw.random() < 0.5 else failed
        return "pytest -v", f"{passed}\n{ending}"
    if kind == 4:
        found = "\n".join(f"src/pkg{i}/mod{i}.py:{3 * i}:    x = parse(y{i})" for i in range(50))
        return "grep -rn parse src/ | head -50", found
    if kind == 5:
        changed = "\n".join(f"\tmodified:   src/pkg{i}/mod{i}.py" for i in range(draw.randrange(3, 40)))
        return "git status", f"On branch main\n{changed}"
    if kind == 6:
        listed = "\n".join(f"-rw-r--r-- 1 u g {100 * i} Jan 1 mod{i}.py" for i in range(30))
        return f"ls -la src/pkg{draw.randrange(30)}", listed
    if kind == 7:
        return f"sed -i 's/a/b/' {path}", ""
    if kind == 8:
        frame = '  File "run.py", line 3, in <module>\n    main()'
        return "python3 run.py", f"Traceback (most recent call last):\n{frame}\nValueError: bad value {call}"
    return "python3 -c 'print(1)'", "1"


# ------------------------------------------------------------------ engine


def engine_child(
    n_items: int, workload: str, repeat: int, budget: int, fmt: str, back_to_back: bool = False
) -> dict[str, float]:
    """Run in a fresh process: the engine's figures for one size (ms; CPU in s). `back_to_back`:
    no render from the state alone between the renders after an append."""
    from contextd import interpreter
    from contextd.api.mapping import items_from_proto
    from contextd.engine.pipeline import RenderInput, render
    from contextd.engine.policy import default_policy
    from contextd.engine.prefix import Prefix
    from contextd.engine.state import ViewState
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd_client.formats.openai import items_from_openai
    from tests.helpers import make_session, to_item

    interpreter.tune()  # the garbage collector as the service runs it (service/contextd/interpreter.py)
    counter, registry, policy = TiktokenCounter(), TransformRegistry.default(), default_policy()
    counter.count("warm the tokenizer")
    messages = tool_calls(n_items + 2 * repeat + 2, workload)
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(items_from_openai(messages)), start=1)]
    view_request = ViewRequest(ViewFormat(fmt), budget_tokens=budget)

    history: list[Any] = []  # as the service's item cache holds it: one list, only appended to

    def given(n: int, state: ViewState, now: float, carry: Any = None) -> RenderInput:
        """The input of a render of the first `n` items (made before the render is timed)."""
        history.extend(items[len(history) : n])
        given = Prefix(history, n)
        return RenderInput(make_session(n), given, policy, view_request, counter, registry, state, now, carry=carry)

    def run(n: int, state: ViewState, now: float, carry: Any = None) -> Any:
        return render(given(n, state, now, carry))

    started, cpu = time.perf_counter(), time.process_time()
    first = run(n_items, ViewState(), 0.0)
    cold_ms, cold_cpu = (time.perf_counter() - started) * 1000, time.process_time() - cpu
    appended, appended_cpu, uncarried = [], [], []
    stages: dict[str, list[float]] = {}
    out = first
    for k in range(repeat):  # one item appended each time, as a session goes on
        n = n_items + 1 + k
        following_input = given(n, out.state, 60.0 * (k + 1), out.carry)
        started, cpu = time.perf_counter(), time.process_time()
        following = render(following_input)
        appended.append((time.perf_counter() - started) * 1000)
        appended_cpu.append((time.process_time() - cpu) * 1000)  # (less moved by other processes)
        for stage, seconds in following.stages:
            stages.setdefault(stage, []).append(seconds * 1000)
        if not back_to_back:
            started = time.perf_counter()
            run(n, out.state, 60.0 * (k + 1))
            uncarried.append((time.perf_counter() - started) * 1000)
        out = following
    return {
        "cold_ms": cold_ms,
        "cold_cpu_s": cold_cpu,
        "after_cold_ms": appended[0],
        "appended_ms": statistics.median(appended),
        "appended_cpu_ms": statistics.median(appended_cpu),
        **({"uncarried_ms": statistics.median(uncarried)} if uncarried else {}),
        **{f"stage {stage}_ms": statistics.median(times) for stage, times in stages.items()},
    }


def engine(n_items: int, workload: str, repeat: int, budget: int, fmt: str, back_to_back: bool) -> dict[str, float]:
    command = [
        sys.executable,
        __file__,
        "--engine-child",
        str(n_items),
        "--workload",
        workload,
        "--repeat",
        str(repeat),
        "--budget-tokens",
        str(budget),
        "--format",
        fmt,
        *(["--back-to-back"] if back_to_back else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------- service


def read_ahead_by(replica: Any, seconds: float = 120.0) -> None:
    """Wait until `replica` (a ServerProcess) has read back a carry another replica kept, and print
    its line saying so (how long it took); SystemExit when it has not within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        said = next((line for line in replica.log if FOLLOWED.search(line)), None)
        if said is not None:
            print(said, file=sys.stderr)
            return
        time.sleep(0.05)
    raise SystemExit(f"the replica read no carry back in {seconds:.0f} s:\n" + "\n".join(replica.log[-20:]))


def service(
    n_items: int,
    workload: str,
    repeat: int,
    database: str,
    folder: Path,
    budget: int,
    fmt: str,
    redis_url: str = "",
    restarts: int = 3,
) -> dict[str, float]:
    import grpc

    from contextd_client import Client, RetryPolicy
    from contextd_client.v1 import contextd_pb2 as api
    from contextd_lab.service import ServerProcess
    from contextd_storage.kept_carries import KEEP_FROM_ITEMS

    sizes: list[int] = []

    raw: list[bytes] = []

    def timed(channel: Any, request: bytes) -> float:
        started = time.perf_counter()
        response = channel(request, timeout=600)
        spent = (time.perf_counter() - started) * 1000
        sizes.append(len(response))
        raw[:] = [response]  # (the last response, read after the timing)
        return spent

    flags = ("--database-url", database, "--no-migrate-on-start", "--max-message-bytes", str(1 << 30))
    options = [("grpc.max_receive_message_length", 1 << 30)]
    messages = tool_calls(n_items + 5 * repeat + 5 * restarts, workload)
    following = iter(messages[n_items:])  # appended one at a time: a call, then its output, ...
    results: dict[str, float] = {}

    def renderer(target: str) -> tuple[Any, Any]:
        channel = grpc.insecure_channel(target, options=options)
        grpc.channel_ready_future(channel).result(timeout=30)
        return channel, channel.unary_unary("/contextd.v1.ContextService/RenderView")

    kept = ("--redis-url", redis_url, "--carry-secret", secrets.token_hex(16)) if redis_url else ()
    unfollowing = ("--carry-follow-seconds", "0")  # (a replica that reads a session's carry at its first render)
    replicas = [ServerProcess(*flags, *kept, cwd=folder).wait_serving() for _ in range(2)]
    clients = [Client(r.target, timeout=600, retry=RetryPolicy(budget=60)) for r in replicas]
    channels = [renderer(r.target) for r in replicas]
    try:
        session_id = clients[0].create_session().id
        for start in range(0, n_items, 500):
            clients[0].append_openai(session_id, messages[start : min(start + 500, n_items)])
        request = api.RenderViewRequest(
            session_id=session_id, format=api.ViewFormat.Value(f"VIEW_FORMAT_{fmt.upper()}"), budget_tokens=budget
        ).SerializeToString()
        results["cold_ms"] = timed(channels[0][1], request)
        results["cold_mb"] = sizes[0] / 1e6
        if kept and n_items >= KEEP_FROM_ITEMS:  # the other replica reads back what the cold render kept:
            read_ahead_by(replicas[1])  # done before anything is timed
        same, other = [], []
        for _ in range(repeat):  # append and render on the replica that made the previous render
            clients[0].append_openai(session_id, [next(following)])
            same.append(timed(channels[0][1], request))
        # The same, by a caller that sends back the token of the view it holds (the last one
        # it got): the service sends what changed since.
        view = api.RenderViewResponse.FromString(channels[0][1](request, timeout=600)).view
        known = []
        for _ in range(repeat):
            clients[0].append_openai(session_id, [next(following)])
            holding = api.RenderViewRequest.FromString(request)
            holding.known_view_token = view.view_token
            known.append(timed(channels[0][1], holding.SerializeToString()))
            view = api.RenderViewResponse.FromString(raw[-1]).view
        results["known_ms"] = statistics.median(known)
        results["known_kb"] = statistics.median(sizes[-repeat:]) / 1e3
        client_ms: dict[bool, list[float]] = {True: [], False: []}
        client_cpu: dict[bool, list[float]] = {True: [], False: []}
        # Through the client, as an agent calls it: the view decoded into messages and items,
        # by a client that holds its last view (the service sends what changed) and one that
        # holds none, in turn.
        through = {
            holds: Client(replicas[0].target, timeout=600, retry=RetryPolicy(budget=60), held_views=64 if holds else 0)
            for holds in (True, False)
        }
        for _ in range(repeat):
            for holds, client in through.items():
                clients[0].append_openai(session_id, [next(following)])
                started, cpu = time.perf_counter(), time.process_time()
                client.render_view(session_id, fmt, budget_tokens=budget)
                client_ms[holds].append((time.perf_counter() - started) * 1000)
                client_cpu[holds].append((time.process_time() - cpu) * 1000)
        for client in through.values():
            client.close()
        for holds, name in ((True, "held"), (False, "whole")):
            results[f"client_{name}_ms"] = statistics.median(client_ms[holds])
            results[f"client_{name}_cpu_ms"] = statistics.median(client_cpu[holds])
        for k in range(repeat):  # each render on the other replica
            replica = (k + 1) % 2
            clients[replica].append_openai(session_id, [next(following)])
            other.append(timed(channels[replica][1], request))
        results["appended_ms"] = statistics.median(same)
        results["appended_mb"] = statistics.median(sizes[1 : 1 + repeat]) / 1e6  # (the renders on the same replica)
        results["transport_ms"] = transport_ms(int(results["appended_mb"] * 1e6), repeat, options)
        results["replica_ms"] = statistics.median(other)

        def restart(replica: int, *extra: str) -> float:
            """Stop the replica and start it again, then one append and the first render on it."""
            channels[replica][0].close()
            clients[replica].close()
            replicas[replica].stop()
            replicas[replica] = ServerProcess(*flags, *extra, cwd=folder).wait_serving()
            clients[replica] = Client(replicas[replica].target, timeout=600, retry=RetryPolicy(budget=60))
            channels[replica] = renderer(replicas[replica].target)
            clients[replica].append_openai(session_id, [next(following)])
            return timed(channels[replica][1], request)

        def followed(*command: str) -> float:
            """A replica new to the session starts (reading nothing as it starts); the other stops,
            keeping its carry, which the new one reads back as it is kept (`--carry-follow-seconds`),
            and takes the stopped one's place: one append and its first render of the session."""
            # The other replica renders the session first: the carry it keeps as it stops is the
            # latest (Redis keeps no carry of an earlier state over a later one).
            clients[1].append_openai(session_id, [next(following)])
            timed(channels[1][1], request)
            newcomer = ServerProcess(*command, cwd=folder).wait_serving()
            channels[1][0].close()
            clients[1].close()
            replicas[1].stop()
            replicas[1] = newcomer
            read_ahead_by(newcomer)
            clients[1] = Client(newcomer.target, timeout=600, retry=RetryPolicy(budget=60))
            channels[1] = renderer(newcomer.target)
            clients[1].append_openai(session_id, [next(following)])
            return timed(channels[1][1], request)

        # Each restart's first render is one render, of whichever item came: the median of
        # `restarts` of them is what compares with the median of the renders after an append.
        # Without kept carries: it derives the session again.
        results["restart_ms"] = statistics.median(restart(0) for _ in range(restarts))
        if kept:
            # The other replica stops (keeping its carry) and starts again: it reads the carry back
            # before it serves, and its first render resumes from it.
            results["warm_ms"] = statistics.median(restart(1, *kept) for _ in range(restarts))
            # The first replica starts again with kept carries, reading none as it starts: its first
            # render reads the session's (the one kept as the last replica to render it stopped).
            warm_none = ("--carry-warm-seconds", "0")
            results["kept_ms"] = statistics.median(restart(0, *kept, *warm_none, *unfollowing) for _ in range(restarts))
            results["followed_ms"] = statistics.median(followed(*flags, *kept, *warm_none) for _ in range(restarts))
    finally:
        for channel, _ in channels:
            channel.close()
        for client in clients:
            client.close()
        for r in replicas:
            r.stop()
    return results


def transport_ms(size: int, repeat: int, options: list[tuple[str, int]]) -> float:
    """The p50 round trip of a unary call whose response is `size` bytes, through a bare gRPC
    server in a process of its own (`--echo-child`), on a channel like the service's."""
    import grpc

    server = subprocess.Popen([sys.executable, __file__, "--echo-child", str(size)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            call = channel.unary_unary(ECHO)
            call(b"", timeout=60)  # (the connection's first call, as the service's was made before)
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                call(b"", timeout=60)
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)
    finally:
        server.kill()
        server.wait()


ECHO = "/bench.Transport/Respond"


def echo_child(size: int) -> None:
    """Serve `ECHO`, answering every call with `size` bytes, and print the port."""
    import asyncio

    import grpc

    payload = b"x" * size

    async def respond(request: bytes, context: Any) -> bytes:
        return payload

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 1 << 30)])
        handler = grpc.unary_unary_rpc_method_handler(respond)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Transport", {"Respond": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


def exponent(small: float, large: float, n_small: int, n_large: int) -> float:
    return math.log(large / small) / math.log(n_large / n_small) if small > 0 and large > 0 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--workload", choices=["unprunable", "modules", "mixed", "sliding"], default="unprunable")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--parts", default="engine,service")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres-url", default=os.environ.get("CONTEXTD_TEST_POSTGRES_URL", ""))
    parser.add_argument("--budget-tokens", type=int, default=0, help="every render asks for this budget")
    parser.add_argument(
        "--redis-url", default="", help="replicas keep their carries there (--carry-secret): one more restart measured"
    )
    formats = ["openai_chat", "anthropic_messages", "openai_responses", "bedrock_converse"]
    parser.add_argument("--format", choices=formats, default="openai_chat", help="the views' format")
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="the engine's renders after an append follow one another, with no render from the state alone "
        "between them (which leaves the processor's caches cold for the next, as other sessions' renders "
        "do in a shared process); the column without the carry is not measured",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=3,
        help="the service's restarts of each kind, the median of their first renders reported (one render "
        "alone varied by 2x between runs of the same code on a busy machine)",
    )
    parser.add_argument("--engine-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--echo-child", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.echo_child >= 0:
        echo_child(args.echo_child)
        return 0

    if args.engine_child:
        measured = engine_child(
            args.engine_child, args.workload, args.repeat, args.budget_tokens, args.format, args.back_to_back
        )
        print(json.dumps(measured))
        return 0

    from common import database as fresh_database

    sizes = [int(s) for s in args.sizes.split(",")]
    parts = set(args.parts.split(","))
    rows: dict[int, dict[str, float]] = {}
    for n in sizes:
        row: dict[str, float] = {}
        if "engine" in parts:
            measured = engine(n, args.workload, args.repeat, args.budget_tokens, args.format, args.back_to_back)
            row |= {f"engine {k}": v for k, v in measured.items()}
        if "service" in parts:
            if args.backend == "postgres" and not args.postgres_url:
                raise SystemExit("--backend postgres needs --postgres-url or CONTEXTD_TEST_POSTGRES_URL")
            url = args.postgres_url if args.backend == "postgres" else ""
            with tempfile.TemporaryDirectory() as folder, fresh_database(url, Path(folder), "scale") as database:
                subprocess.run(
                    [sys.executable, "-m", "contextd", "migrate", "--database-url", database], check=True, cwd=folder
                )
                measured = service(
                    n,
                    args.workload,
                    args.repeat,
                    database,
                    Path(folder),
                    args.budget_tokens,
                    args.format,
                    args.redis_url,
                    args.restarts,
                )
                row |= {f"service {k}": v for k, v in measured.items()}
        rows[n] = row
        print(f"{n:,} items: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items()), file=sys.stderr, flush=True)

    print(f"command: python bench/scale.py {' '.join(sys.argv[1:])}".rstrip())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    setup = f"workload: {args.workload}; {args.format}; service on {args.backend}"
    print(f"machine: {machine}, {time.strftime('%Y-%m-%d')}; {setup}")
    print()
    columns = [c for c in rows[sizes[0]] if c != "engine cold_ms"]
    names = {
        "engine after_cold_ms": "engine, the first after the cold render",
        "engine appended_ms": "engine, one appended",
        "engine appended_cpu_ms": "engine, one appended (CPU)",
        "engine uncarried_ms": "engine, without the carry",
        "engine cold_cpu_s": "engine, cold (CPU s; ms/item)",
        "service appended_ms": "service, one appended",
        "service appended_mb": "service, one appended: its response",
        "service transport_ms": "service, one appended: its transport alone",
        "service known_ms": "service, one appended, to a caller holding the last view",
        "service known_kb": "its response",
        "service client_whole_ms": "service, one appended, through the client holding no view",
        "service client_whole_cpu_ms": "the same, the client's CPU",
        "service client_held_ms": "service, one appended, through the client holding its last view",
        "service client_held_cpu_ms": "the same, the client's CPU",
        "service replica_ms": "service, on another replica",
        "service restart_ms": "service, after a restart",
        "service warm_ms": "service, after a restart, its kept carries read as it starts",
        "service kept_ms": "service, new to the session, from the kept carry",
        "service followed_ms": "service, new to the session, read as another replica kept it",
        "service cold_ms": "service, cold",
        "service cold_mb": "service, cold response",
    }
    columns = [c for c in names if c in columns]
    print("| items | " + " | ".join(names[c] for c in columns) + " |")
    print("| ---: | " + " | ".join("---:" for _ in columns) + " |")
    for n in sizes:
        cells = []
        for c in columns:
            value = rows[n][c]
            if c.endswith("cpu_s"):
                cells.append(f"{value:.2f} s; {value * 1000 / n:.3f}")
            elif c.endswith(("_mb", "_kb")):
                cells.append(f"{value:,.2f} {c[-2:].upper()}")
            else:
                cells.append(f"{value:,.1f} ms")
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    for small, large in itertools.pairwise(sizes):
        cells = [f"{exponent(rows[small][c], rows[large][c], small, large):.2f}" for c in columns]
        print(f"| exponent {small:,}→{large:,} | " + " | ".join(cells) + " |")
        cells = [f"{rows[large][c] / rows[small][c]:.2f}" if rows[small][c] else "" for c in columns]
        print(f"| ratio {large:,} : {small:,} | " + " | ".join(cells) + " |")
    stages = [c for c in rows[sizes[0]] if c.startswith("engine stage ")]
    if stages:  # where the engine's render after one append goes, stage by stage (pipeline.py's laps)
        print()
        print("| items | " + " | ".join(c.removeprefix("engine stage ").removesuffix("_ms") for c in stages) + " |")
        print("| ---: | " + " | ".join("---:" for _ in stages) + " |")
        for n in sizes:
            print(f"| {n:,} | " + " | ".join(f"{rows[n].get(c, float('nan')):.2f} ms" for c in stages) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
