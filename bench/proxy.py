"""The latency `contextd proxy` adds to a model call: the same calls straight to a provider,
through a proxy whose contextd is down, and through the proxy with contextd, side by side.

    python bench/proxy.py [--calls 200] [--turns 20] [--output-kb 4] [--pause-ms 50] [--quick]

Five processes: a real `contextd serve` (SQLite in a temporary directory, `--metrics-listen`
on); the stub provider (`contextd_lab.stub_upstream`, answering like Chat Completions, Messages
and Responses at once) served by uvicorn in a process of its own (this script, `--serve-stub`),
so that client, stub and proxies share no GIL; `python -m contextd proxy` in front of the stub,
as an operator runs it (its defaults, `--timeout 2` and `--backoff 5`, unless
`--proxy-timeout`; `--metrics-listen` on, to read the time each request spent on contextd); a
second proxy whose contextd is unreachable (`--backoff 1e9`: after the first call, every call
goes upstream unchanged, so it costs only the HTTP hop and the proxy's reading of the body);
and this process, the client.

The client is an agent's loop in raw HTTP (httpx2, a keep-alive connection pool per route):
conversations of `--turns` calls, each resending the whole conversation as an SDK does (system
prompt, task, then every tool call and its output, a test log of `--output-kb` KB), under an
`x-contextd-session` header of its own. Every turn is sent by each route (straight to the
stub, through the proxy whose contextd is down, through the proxy), each route keeping its own
conversation; which goes first rotates from turn to turn, so the machine's drift falls on all.
Bodies are encoded before the clock starts. After each turn the loop waits `--pause-ms` (the
tool's run, not measured), so the proxy has recorded the answer, as it would in an agent.
A warm-up conversation per API and mode goes first, not measured.

For each API, as JSON and as a stream (server-sent events): the total time of a call (the
whole body read) and, for streams, the time to the first bytes of the first event. Prints
min / p50 / p95 per route, the latency the proxy adds (p50 through it less p50 direct) and the
ratio; then, per API and mode, how many calls went upstream with contextd's view, the mean
added latency and the hop's share of it, the mean time the proxy spent on contextd before
sending upstream (its `contextd.proxy.added.duration`), the mean server time of AppendItems and
RenderView and the RPCs per call (contextd's `rpc.server.call.duration`, the recording of the
answer after the caller has it included), and the CPU the proxy and contextd spent per call.
A benchmark, not a test: the stub answers in a millisecond or two, so the ratios are against the
floor of a loopback HTTP call, not a model; read the added milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from common import cpu_seconds, percentile
from contextd_lab.service import ServerProcess, child_environment

HERE = Path(__file__).resolve()
SESSION_HEADER = "x-contextd-session"
VIEW_VERSION_HEADER = "x-contextd-view-version"
SYSTEM = "You are a coding agent. Use bash to run the tests and read the code; fix the failing test."
TASK = "The CI run on main fails. Find the failing test and tell me why it fails."
PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH: dict[str, Any] = {"name": "bash", "description": "Run a shell command in the repository."}
STUB_SERVING = re.compile(r"stub serving on (http://[\d.]+:\d+)")
PROXY_SERVING = re.compile(r"contextd proxy serving on (http://[\d.]+:\d+)")
CONTEXTD_METRICS = re.compile(r"metrics for Prometheus on (http://[\d.]+:\d+/metrics)")
SAMPLE = re.compile(r"^(\w+)_(sum|count)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
PROXY_ADDED = "contextd_proxy_added_duration_seconds"
RPC_DURATION = "rpc_server_call_duration_seconds"
METHOD = "contextd.v1.ContextService/"
TROUBLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")
ROUTES = ("direct", "hop", "proxied")
"""Straight to the stub; through a proxy whose contextd is down (every call bypassed: the hop
alone); through the proxy with contextd."""
API_LABELS = {"chat": "openai_chat", "messages": "anthropic_messages", "responses": "openai_responses"}


# ------------------------------------------------------------------ the three APIs, as a client


@dataclass(frozen=True)
class Api:
    """One provider API as an agent's loop speaks it: the request, and how an answer (JSON or
    the events of a stream) and a tool's output go back into the conversation."""

    name: str
    label: str
    path: str
    headers: dict[str, str]
    request: Callable[[list[Any], bool], dict[str, Any]]
    start: Callable[[], list[Any]]
    answered: Callable[[dict[str, Any]], tuple[list[Any], str]]
    streamed: Callable[[list[dict[str, Any]]], tuple[list[Any], str]]
    result: Callable[[str, str], Any]


def _chat_answer(body: dict[str, Any]) -> tuple[list[Any], str]:
    message = body["choices"][0]["message"]
    kept = {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]}
    return [kept], message["tool_calls"][0]["id"]


def _chat_stream(events: list[dict[str, Any]]) -> tuple[list[Any], str]:
    call = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    for event in events:
        for choice in event.get("choices") or []:
            for part in choice["delta"].get("tool_calls") or []:
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""  # type: ignore[index]
                call["function"]["arguments"] += function.get("arguments") or ""  # type: ignore[index]
    return [{"role": "assistant", "content": None, "tool_calls": [call]}], str(call["id"])


def _messages_answer(body: dict[str, Any]) -> tuple[list[Any], str]:
    use = next(b for b in body["content"] if b["type"] == "tool_use")
    return [{"role": "assistant", "content": body["content"]}], use["id"]


def _messages_stream(events: list[dict[str, Any]]) -> tuple[list[Any], str]:
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    for event in events:
        index = event.get("index", 0)
        if event["type"] == "content_block_start":
            blocks[index] = dict(event["content_block"])
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            inputs[index] = inputs.get(index, "") + event["delta"]["partial_json"]
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
            blocks[index]["text"] = blocks[index].get("text", "") + event["delta"]["text"]
    for index, text in inputs.items():
        blocks[index]["input"] = json.loads(text or "{}")
    content = [blocks[i] for i in sorted(blocks)]
    use = next(b for b in content if b["type"] == "tool_use")
    return [{"role": "assistant", "content": content}], use["id"]


def _responses_answer(body: dict[str, Any]) -> tuple[list[Any], str]:
    call = next(o for o in body["output"] if o["type"] == "function_call")
    return list(body["output"]), call["call_id"]


def _responses_stream(events: list[dict[str, Any]]) -> tuple[list[Any], str]:
    completed = next(e for e in events if e["type"] == "response.completed")
    return _responses_answer(completed["response"])


APIS = (
    Api(
        "chat",
        "Chat Completions",
        "/v1/chat/completions",
        {"authorization": "Bearer sk-bench"},
        lambda conversation, stream: {
            "model": "gpt-4o",
            "messages": [{"role": "system", "content": SYSTEM}, *conversation],
            "tools": [{"type": "function", "function": {**BASH, "parameters": PARAMETERS}}],
            "stream": stream,
        },
        lambda: [{"role": "user", "content": TASK}],
        _chat_answer,
        _chat_stream,
        lambda call, output: [{"role": "tool", "tool_call_id": call, "content": output}],
    ),
    Api(
        "messages",
        "Anthropic Messages",
        "/v1/messages",
        {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"},
        lambda conversation, stream: {
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "system": SYSTEM,
            "messages": conversation,
            "tools": [{**BASH, "input_schema": PARAMETERS}],
            "stream": stream,
        },
        lambda: [{"role": "user", "content": TASK}],
        _messages_answer,
        _messages_stream,
        lambda call, output: [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": output}]}
        ],
    ),
    Api(
        "responses",
        "OpenAI Responses",
        "/v1/responses",
        {"authorization": "Bearer sk-bench"},
        lambda conversation, stream: {
            "model": "gpt-4.1",
            "instructions": SYSTEM,
            "input": conversation,
            "tools": [{"type": "function", **BASH, "parameters": PARAMETERS}],
            "stream": stream,
        },
        lambda: [{"role": "user", "content": TASK}],
        _responses_answer,
        _responses_stream,
        lambda call, output: [{"type": "function_call_output", "call_id": call, "output": output}],
    ),
)


def tool_output(step: int, size: int) -> str:
    """A test run's log of about `size` bytes, one failure in it, different at every step."""
    lines = [f"$ pytest -q tests/ --maxfail=50 -p no:cacheprovider  # run {step}"]
    total, k = len(lines[0]), 0
    failing = 7 + step * 13
    while total < size:
        line = f"tests/test_app.py::test_case_{k} {'FAILED' if k == failing else 'PASSED'} [{k % 100:3d}%]"
        lines.append(line)
        total += len(line) + 1
        k += 1
    lines.append(f"1 failed, {k - 1} passed in {1 + step / 10:.2f}s")
    return "\n".join(lines)


# ------------------------------------------------------------------ one call, timed


@dataclass
class Timed:
    total: float
    first: float | None
    """Seconds to the first bytes of the body (streams only)."""
    body: bytes
    viewed: bool


def call(client: httpx2.Client, url: str, body: bytes, headers: dict[str, str], stream: bool) -> Timed:
    if not stream:
        started = time.perf_counter()
        response = client.post(url, content=body, headers=headers)
        total = time.perf_counter() - started
        _check(response, url)
        return Timed(total, None, response.content, VIEW_VERSION_HEADER in response.headers)
    chunks: list[bytes] = []
    first = None
    started = time.perf_counter()
    with client.stream("POST", url, content=body, headers=headers) as response:
        for chunk in response.iter_raw():
            if first is None and chunk:
                first = time.perf_counter() - started
            chunks.append(chunk)
    total = time.perf_counter() - started
    _check(response, url)
    return Timed(total, first, b"".join(chunks), VIEW_VERSION_HEADER in response.headers)


def _check(response: httpx2.Response, url: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.read()[:300]!r}")


def events_of(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of a stream's events (`[DONE]` left out)."""
    out = []
    for frame in raw.decode().replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in frame.split("\n") if line.startswith("data:"))
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


# ------------------------------------------------------------------ the loop


@dataclass
class Route:
    name: str
    base: str
    client: httpx2.Client


@dataclass
class Cell:
    """One API in one mode: each route's samples (seconds), and the proxy's side."""

    api: Api
    stream: bool
    total: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROUTES})
    first: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROUTES})
    viewed: int = 0
    scraped: Series = field(default_factory=dict)
    """What the proxy's and contextd's histograms gained over the measured calls."""
    cpu: tuple[float, float] = (0.0, 0.0)
    """CPU seconds the proxy and contextd spent over the measured calls."""

    def mean(self, metric: str, series: str) -> float | None:
        count = self.scraped.get((metric, series, "count"), 0.0)
        return self.scraped.get((metric, series, "sum"), 0.0) / count if count else None

    def count(self, metric: str, series: str | None = None) -> float:
        return sum(
            v for (m, s, kind), v in self.scraped.items() if m == metric and kind == "count" and series in (None, s)
        )


def conversation(
    api: Api, stream: bool, routes: list[Route], turns: int, output_size: int, pause: float, flip: int
) -> list[tuple[str, Timed]]:
    """One conversation of `turns` calls, each sent by every route in turn; the timings."""
    session = f"bench-{api.name}-{uuid.uuid4().hex[:12]}"
    state = {route.name: api.start() for route in routes}
    timings: list[tuple[str, Timed]] = []
    for turn in range(turns):
        shift = (turn + flip) % len(routes)
        order = routes[shift:] + routes[:shift]  # each route first as often as the others
        for route in order:
            body = json.dumps(api.request(state[route.name], stream)).encode()
            headers = {"content-type": "application/json", SESSION_HEADER: session, **api.headers}
            timed = call(route.client, route.base + api.path, body, headers, stream)
            timings.append((route.name, timed))
            if turn == turns - 1:
                continue
            if stream:
                reply, call_id = api.streamed(events_of(timed.body))
            else:
                reply, call_id = api.answered(json.loads(timed.body))
            state[route.name].extend(reply)
            state[route.name].extend(api.result(call_id, tool_output(turn, output_size)))
        time.sleep(pause)
    return timings


def measure(
    cell: Cell, routes: list[Route], calls: int, turns: int, output_size: int, pause: float, processes: Processes
) -> None:
    api, stream = cell.api, cell.stream
    conversation(api, stream, routes, min(turns, 3), output_size, pause, 0)  # warm up, not counted
    time.sleep(0.2)
    before, cpu = processes.scrape(), processes.cpu()
    for n in range(math.ceil(calls / turns)):
        for route, timed in conversation(api, stream, routes, turns, output_size, pause, n):
            cell.total[route].append(timed.total)
            if timed.first is not None:
                cell.first[route].append(timed.first)
            if route == "proxied" and timed.viewed:
                cell.viewed += 1
    time.sleep(0.2)  # the last answer's recording, after the caller had it
    after, spent = processes.scrape(), processes.cpu()
    cell.scraped = {key: value - before.get(key, 0.0) for key, value in after.items()}
    cell.cpu = (spent[0] - cpu[0], spent[1] - cpu[1])


# ------------------------------------------------------------------ the processes


class Child:
    """A child process whose stderr (or stdout) is read for a line saying where it serves."""

    def __init__(self, command: list[str], pattern: re.Pattern[str], cwd: Path, stream: str = "stderr") -> None:
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=child_environment(),
            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
            stderr=subprocess.PIPE if stream == "stderr" else None,
            text=True,
        )
        self.log: list[str] = []
        self.url: str | None = None
        self._pattern = pattern
        self._started = threading.Event()
        pipe = self.process.stdout if stream == "stdout" else self.process.stderr
        self._reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._reader.start()

    def _read(self, pipe: Any) -> None:
        for line in pipe:
            self.log.append(line.rstrip())
            if self.url is None and (match := self._pattern.search(line)):
                self.url = match.group(1)
                self._started.set()
        self._started.set()

    def wait_serving(self, timeout: float = 60) -> str:
        self._started.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError("did not start:\n" + "\n".join(self.log[-30:]))
        return self.url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(10)


Series = dict[tuple[str, str, str], float]
"""Scraped histograms: (metric, the label that names the series, sum | count) to the value."""


def scrape(url: str, metric: str, label: str) -> Series:
    """The `_sum` and `_count` of histogram `metric` at the Prometheus endpoint `url`, by `label`."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    out: Series = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None or match.group(1) != metric:
            continue
        labels = dict(LABEL.findall(match.group(3)))
        key = (metric, labels.get(label, ""), match.group(2))
        out[key] = out.get(key, 0.0) + float(match.group(4))
    return out


@dataclass
class Processes:
    proxy: Child
    proxy_metrics: str
    contextd: ServerProcess
    contextd_metrics: str

    def cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.proxy.process.pid), cpu_seconds(self.contextd.process.pid)

    def scrape(self) -> Series:
        return {
            **scrape(self.proxy_metrics, PROXY_ADDED, "contextd_proxy_api"),
            **scrape(self.contextd_metrics, RPC_DURATION, "rpc_method"),
        }


def start_proxy(target: str, upstream: str, cwd: Path, *flags: str) -> Child:
    """`contextd proxy` as an operator runs it, in front of `upstream`, asking the contextd at `target`."""
    command = [sys.executable, "-m", "contextd", "proxy", "--listen", "127.0.0.1:0", "--target", target]
    command += ["--openai-upstream", upstream, "--anthropic-upstream", upstream, *flags]
    return Child(command, PROXY_SERVING, cwd)


def logged(log: list[str], pattern: re.Pattern[str], timeout: float = 30) -> str:
    """The first group of `pattern` in a log a thread is filling, once a line has it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(log):
            if match := pattern.search(line):
                return match.group(1)
        time.sleep(0.05)
    raise RuntimeError(f"no {pattern.pattern!r} in the log:\n" + "\n".join(log[-30:]))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_stub() -> int:
    """This script as the stub provider's process: serve it on a free port, say where on stdout."""
    import uvicorn

    from contextd_lab.stub_upstream import Received, Upstream

    forgotten = Received("", {}, {}, b"")

    class Forgetful(Upstream):
        """The stub, keeping no request (a run sends some hundred MB of them): only their count,
        which its ids use."""

        async def _read(self, request: Any) -> dict[str, Any]:
            body = await super()._read(request)
            self.received[-1] = forgotten
            return body

    stub = Forgetful(turns=10**9)  # always a tool call: the loop decides when a conversation ends
    listening = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(stub.app(), log_config=None, access_log=False, lifespan="off"))
    print(f"stub serving on http://127.0.0.1:{listening.getsockname()[1]}", flush=True)
    server.run(sockets=[listening])
    return 0


# ------------------------------------------------------------------ the report


def ms(value: float) -> str:
    return f"{value * 1000:.2f}"


def spread(samples: list[float]) -> str:
    return f"{ms(min(samples))} / {ms(percentile(samples, 50))} / {ms(percentile(samples, 95))}"


def rows(cells: list[Cell]) -> list[list[str]]:
    out = []
    for cell in cells:
        mode = "stream" if cell.stream else "JSON"
        measures = [("total", cell.total)]
        if cell.stream:
            measures.insert(0, ("first byte", cell.first))
        for measure, samples in measures:
            direct, proxied = percentile(samples["direct"], 50), percentile(samples["proxied"], 50)
            out.append(
                [
                    cell.api.label,
                    mode,
                    measure,
                    spread(samples["direct"]),
                    spread(samples["hop"]),
                    spread(samples["proxied"]),
                    f"+{ms(proxied - direct)}" if proxied >= direct else ms(proxied - direct),
                    f"{proxied / direct:.1f}x",
                ]
            )
    return out


def table(header: list[str], body: list[list[str]], right: int) -> None:
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" if n < right else "---:" for n in range(len(header))) + " |")
    for row in body:
        print("| " + " | ".join(row) + " |")


def report(cells: list[Cell], args: argparse.Namespace, argv: list[str]) -> None:
    print(f"command: python bench/proxy.py {' '.join(argv)}".rstrip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
        f"{platform.python_implementation()} {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    calls = math.ceil(args.calls / args.turns) * args.turns
    print(
        f"setup: {calls} calls per route and cell ({calls // args.turns} conversations of {args.turns} calls), "
        f"tool outputs of {args.output_kb} KB, {args.pause_ms:g} ms between turns"
    )
    print()
    table(
        [
            "API",
            "mode",
            "measure",
            "direct min / p50 / p95 ms",
            "proxy, contextd down min / p50 / p95 ms",
            "proxied min / p50 / p95 ms",
            "added p50 ms",
            "ratio",
        ],
        rows(cells),
        3,
    )
    print()
    body = []
    for cell in cells:
        calls = len(cell.total["proxied"])
        added = mean(cell.total["proxied"]) - mean(cell.total["direct"])
        hop = mean(cell.total["hop"]) - mean(cell.total["direct"])
        body.append(
            [
                cell.api.label,
                "stream" if cell.stream else "JSON",
                f"{cell.viewed} / {calls}",
                ms(added),
                ms(hop),
                optional(cell.mean(PROXY_ADDED, API_LABELS[cell.api.name])),
                optional(cell.mean(RPC_DURATION, METHOD + "AppendItems")),
                optional(cell.mean(RPC_DURATION, METHOD + "RenderView")),
                f"{cell.count(RPC_DURATION) / calls:.1f}",
                ms(cell.cpu[0] / calls),
                ms(cell.cpu[1] / calls),
            ]
        )
    table(
        [
            "API",
            "mode",
            "viewed",
            "added, mean",
            "of which the hop, mean",
            "proxy on contextd, mean",
            "AppendItems in contextd, mean",
            "RenderView in contextd, mean",
            "RPCs a call",
            "proxy CPU a call",
            "contextd CPU a call",
        ],
        body,
        2,
    )


def mean(samples: list[float]) -> float:
    return sum(samples) / len(samples)


def optional(value: float | None) -> str:
    return ms(value) if value is not None else "-"


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="measured calls per route, API and mode")
    parser.add_argument("--turns", type=int, default=20, help="calls per conversation")
    parser.add_argument("--output-kb", type=float, default=4, help="size of a tool's output")
    parser.add_argument("--pause-ms", type=float, default=50, help="the tool's run between two turns")
    parser.add_argument("--apis", default="chat,messages,responses")
    parser.add_argument("--proxy-timeout", type=float, help="the proxy's --timeout (default: its own, 2 s)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 calls, conversations of 5")
    parser.add_argument("--serve-stub", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_stub:
        return serve_stub()
    if args.quick:
        args.calls, args.turns = min(args.calls, 10), min(args.turns, 5)
    apis = [api for name in args.apis.split(",") for api in APIS if api.name == name]

    cells = [Cell(api, stream) for api in apis for stream in (False, True)]
    with tempfile.TemporaryDirectory() as folder:
        contextd = ServerProcess("--metrics-listen", "127.0.0.1:0", cwd=Path(folder))
        stub = Child([sys.executable, str(HERE), "--serve-stub"], STUB_SERVING, Path(folder), "stdout")
        proxies: dict[str, Child] = {}
        clients: list[httpx2.Client] = []
        try:
            contextd.wait_serving()
            stub_url = stub.wait_serving()
            metrics = f"127.0.0.1:{free_port()}"
            flags = ["--metrics-listen", metrics]
            flags += ["--timeout", str(args.proxy_timeout)] if args.proxy_timeout else []
            proxies["proxied"] = start_proxy(contextd.target, stub_url, Path(folder), *flags)
            # contextd down for good: after the first call's failure, every call is bypassed
            proxies["hop"] = start_proxy(f"127.0.0.1:{free_port()}", stub_url, Path(folder), "--backoff", "1e9")
            urls = {"direct": stub_url, **{name: proxy.wait_serving() for name, proxy in proxies.items()}}
            contextd_metrics = logged(contextd.log, CONTEXTD_METRICS)
            processes = Processes(proxies["proxied"], f"http://{metrics}/metrics", contextd, contextd_metrics)
            routes = []
            for name in ROUTES:
                clients.append(httpx2.Client(timeout=httpx2.Timeout(120.0, connect=10.0)))
                routes.append(Route(name, urls[name], clients[-1]))
            size = int(args.output_kb * 1024)
            for cell in cells:
                measure(cell, routes, args.calls, args.turns, size, args.pause_ms / 1000, processes)
        finally:
            for client in clients:
                client.close()
            for proxy in proxies.values():
                proxy.stop()
            stub.stop()
            contextd.stop()
    report(cells, args, sys.argv[1:] if argv is None else argv)
    if any(c.viewed < len(c.total["proxied"]) for c in cells):
        print("\nnote: some proxied calls went upstream without a view (contextd failed or was bypassed): see 'viewed'")
    for name, log in (("proxy", proxies["proxied"].log), ("contextd", contextd.log)):
        troubles = [line for line in log if TROUBLE.search(line)]
        if troubles:
            print(f"\nnote: the {name} logged {len(troubles)} warnings or errors, the first:\n    {troubles[0][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
