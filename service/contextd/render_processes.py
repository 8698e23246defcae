"""Renders on processes of their own, beside the process that serves (`render_processes`).

A render is CPU work in Python. On a thread of the serving process it shares the
interpreter lock with every other call the process serves: while a 50,000-item
session renders, another tenant's GetSession waits 60-200 ms of wall time for a
few ms of its own work (docs/benchmarks.md, "One tenant's work"), and one
process uses one core however many renders are waiting.

With `render_processes` N > 0 the serving process keeps every other call and hands
each RenderView to one of N processes it starts. Each is a `contextd serve` of
its own: a replica of the same database (replicas are correct whatever the
routing), listening on a unix socket in a directory only this process knows. A
session's renders go to one of them, chosen by a hash of its tenant and id, so
each render resumes from the engine's work of the last one, in that process's
memory. The call's key, its trace context and its deadline go along; the answer
comes back as it was given, view or status with its trailers. A render process
that cannot be reached answers UNAVAILABLE with a retry delay.

Lifecycle: the render processes are started and answering before this process
serves; one that exits is started again (a second apart, doubling to 30 s while
it keeps failing); they are stopped after this process's calls have drained.
A render process ends with its parent however the parent ends: its stdin is a
pipe from the parent, and end of file there is its signal to stop
(api/server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import propagate

from contextd.api.errors import REASON_KEY
from contextd.config import Settings, env_name
from contextd.engine.errors import Retryable
from contextd_client.v1 import contextd_pb2

log = logging.getLogger("contextd.render_processes")

CONTEXT_SERVICE = contextd_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name
RENDER_VIEW = f"/{CONTEXT_SERVICE}/RenderView"
_RETRY_MS = 1000
_FIRST_BACKOFF, _MOST_BACKOFF = 1.0, 30.0
_READY_SECONDS = 60.0
"""How long a render process, started or started again, gets to answer its health check."""
_NICER = 10
"""How much lower a render process's CPU priority is than its parent's (a nice value): renders are
long CPU work, the serving process's calls short and waited on; when they compete for a core the
scheduler should favour the calls (docs/benchmarks.md, "One tenant's work")."""
_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)
"""Statuses that, without contextd's reason in the trailers, say the render process was not there to
answer (not started, exited mid-call). This process's own call being cancelled never gets here:
its task is cancelled with it."""

Metadata = Sequence[tuple[str, str | bytes]]


class RenderProcessDown(Retryable):
    """The render process a session's renders go to did not answer (exited, starting again)."""

    reason = "RENDER_PROCESS_UNAVAILABLE"

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"render process {index} of this server did not answer ({detail}); retry", _RETRY_MS)


class RenderProcessesFailed(Exception):
    """A render process could not be started; the message says why, for the operator."""


class Relayed(Exception):
    """A render process's answer to a call that failed: its status, message and trailers, to pass on."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: Metadata) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.trailers = tuple(trailers)

    @property
    def reason(self) -> str | None:
        """contextd's reason for the failure, when the render process gave one."""
        return next((str(v) for k, v in self.trailers if k == REASON_KEY), None)


def route(tenant: str, session_id: str, count: int) -> int:
    """Which of `count` render processes renders the session: the same one every time, in
    every serving process (a stable hash, not Python's per-process one)."""
    return zlib.crc32(f"{tenant}\x00{session_id}".encode()) % count


def settings_of(settings: Settings, index: int, socket: str) -> Settings:
    """What render process `index` runs with: the parent's settings, serving the parent alone."""
    metrics_listen = ""
    if settings.metrics_listen:
        host, _, port = settings.metrics_listen.rpartition(":")
        # Each process is scraped on its own port: the next ones after the parent's (any free one for port 0).
        metrics_listen = f"{host}:{int(port) + 1 + index if int(port) else 0}"
    return dataclasses.replace(
        settings,
        listen=f"unix:{socket}",
        render_processes=0,
        render_worker=True,
        render_share=f"{index}/{settings.render_processes}",
        migrate_on_start=False,  # the parent has migrated, or checked, before starting them
        tls_cert="",  # a unix socket in a private directory: no network, no TLS
        tls_key="",
        tls_client_ca="",
        reflection=False,
        metrics_listen=metrics_listen,
        # The parent admits each call under the tenant's limits before handing it on.
        tenant_requests_per_second=0,
        tenant_append_bytes_per_second=0,
        tenant_stored_bytes=0,
        tenant_limits="",
    )


def environment_of(settings: Settings) -> dict[str, str]:
    """`settings` as the CONTEXTD_* variables that load them again (every field, so the
    parent's flags and its environment reach the child alike)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        out[env_name(f.name)] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


@dataclasses.dataclass
class _Process:
    index: int
    socket: str
    environment: Mapping[str, str]
    channel: grpc.aio.Channel
    render: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]
    process: asyncio.subprocess.Process | None = None


class RenderProcesses:
    """The render processes of one serving process: started, kept running, called, stopped."""

    def __init__(self, settings: Settings, directory: str) -> None:
        self._directory = directory
        self._ready_seconds = _READY_SECONDS + (settings.carry_warm_seconds if settings.carry_secret else 0)
        """(A render process reads kept carries back before it answers SERVING: warm_start.py.)"""
        self._closing = False
        self._watching: list[asyncio.Task[None]] = []
        size = settings.receive_limit()
        options = [
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size),
            # A render process started again answers within a second or so: the channel must try its
            # socket that often, not back off towards gRPC's default of two minutes.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._processes: list[_Process] = []
        for index in range(settings.render_processes):
            socket = os.path.join(directory, f"{index}.sock")
            channel = grpc.aio.insecure_channel(f"unix:{socket}", options=options)
            self._processes.append(
                _Process(
                    index,
                    socket,
                    {**os.environ, **environment_of(settings_of(settings, index, socket))},
                    channel,
                    channel.unary_unary(RENDER_VIEW),  # bytes in, bytes out: nothing decoded on the way
                )
            )

    @classmethod
    async def start(cls, settings: Settings, ready_seconds: float | None = None) -> RenderProcesses:
        """`settings.render_processes` processes, each answering; RenderProcessesFailed when one
        exits or does not answer within `ready_seconds` (by default a minute, and the time it may
        spend reading kept carries back) (those started are stopped)."""
        processes = cls(settings, tempfile.mkdtemp(prefix="contextd-render-"))
        ready_seconds = processes._ready_seconds if ready_seconds is None else ready_seconds
        try:
            async with asyncio.TaskGroup() as group:  # one that fails cancels the others
                for p in processes._processes:
                    group.create_task(processes._start(p, ready_seconds))
        except BaseException as exc:
            await processes.close(grace=0)
            if isinstance(exc, ExceptionGroup):
                failed = exc.exceptions[0]
                if isinstance(failed, OSError):
                    raise RenderProcessesFailed(f"cannot start a render process: {failed}") from None
                raise failed from None
            raise
        processes._watching = [asyncio.create_task(processes._keep(p)) for p in processes._processes]
        return processes

    @property
    def pids(self) -> list[int | None]:
        return [p.process.pid if p.process else None for p in self._processes]

    async def render(
        self, tenant: str, session_id: str, request: bytes, metadata: Metadata, seconds_left: float | None
    ) -> bytes:
        """The serialized RenderViewResponse of the session's render process; Relayed with its
        status when it answered with one, RenderProcessDown when it could not be reached."""
        process = self._processes[route(tenant, session_id, len(self._processes))]
        passed: list[tuple[str, str | bytes]] = [(k, v) for k, v in metadata if k == "authorization"]
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # the render's spans continue this call's trace
        passed.extend(carrier.items())
        try:
            return await process.render(request, metadata=passed, timeout=seconds_left)
        except grpc.aio.AioRpcError as exc:
            trailers: Metadata = tuple(exc.trailing_metadata() or ())
            answered = any(k == REASON_KEY for k, _ in trailers)
            if not answered and exc.code() in _LOST:
                raise RenderProcessDown(process.index, f"{exc.code().name}: {exc.details()}") from None
            raise Relayed(exc.code(), exc.details() or "", trailers) from None

    def kill(self) -> None:
        """Stop every render process now (a hurried stop: what they were doing is abandoned)."""
        self._closing = True
        for p in self._processes:
            if p.process is not None and p.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.process.kill()

    def forget(self) -> None:
        """Remove the sockets' directory, synchronously (for a process about to exit at once)."""
        shutil.rmtree(self._directory, ignore_errors=True)

    async def close(self, grace: float) -> None:
        """Stop every render process: SIGTERM, `grace` seconds and a little more to drain, then SIGKILL."""
        self._closing = True
        for task in self._watching:
            task.cancel()
        await asyncio.gather(*(self._stop(p, grace) for p in self._processes))
        for p in self._processes:
            await p.channel.close()
        self.forget()

    async def _start(self, p: _Process, ready_seconds: float) -> None:
        await self._spawn(p)
        await self._ready(p, ready_seconds)

    async def _spawn(self, p: _Process) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p.socket)  # left by one that was killed
        p.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "contextd",
            "serve",
            stdin=asyncio.subprocess.PIPE,
            env=p.environment,
            start_new_session=True,  # a terminal's Ctrl-C is the parent's to act on: it stops them in turn
        )

    async def _ready(self, p: _Process, seconds: float) -> None:
        assert p.process is not None
        health = health_pb2_grpc.HealthStub(p.channel)
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            if p.process.returncode is not None:
                raise RenderProcessesFailed(
                    f"render process {p.index} exited with status {p.process.returncode} before serving "
                    "(its log is above)"
                )
            with contextlib.suppress(grpc.aio.AioRpcError):
                # The service's own status, not the server's (""): a render process says its service
                # serves once it has read back its sessions' kept carries (warm_start.py).
                answer = await health.Check(health_pb2.HealthCheckRequest(service=CONTEXT_SERVICE), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise RenderProcessesFailed(f"render process {p.index} did not answer within {seconds:.0f} s")
            await asyncio.sleep(0.05)

    async def _keep(self, p: _Process) -> None:
        """Start `p` again whenever it exits, until close()."""
        backoff = _FIRST_BACKOFF
        while True:
            assert p.process is not None
            status = await p.process.wait()
            if self._closing:
                return
            log.error(
                "render process %d (pid %d) exited with status %d; starting another in %.0f s",
                p.index,
                p.process.pid,
                status,
                backoff,
            )
            await asyncio.sleep(backoff)
            try:
                await self._spawn(p)
                await self._ready(p, self._ready_seconds)
            except (RenderProcessesFailed, OSError) as exc:
                log.error("render process %d: %s", p.index, exc)
                if p.process is not None and p.process.returncode is None:
                    p.process.kill()  # started but not answering: the next turn starts another
                backoff = min(2 * backoff, _MOST_BACKOFF)
            else:
                log.info("render process %d serving again (pid %d)", p.index, p.process.pid)
                backoff = _FIRST_BACKOFF

    async def _stop(self, p: _Process, grace: float) -> None:
        process = p.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace + 2)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def become_render_process(listen: str, stop: Callable[[], None]) -> None:
    """In a render process listening on `listen`: take the lower CPU priority, and call `stop()`
    once the parent is gone (end of file on stdin, a pipe from it), removing its socket (and the
    parent's socket directory, once empty: a parent killed outright could not). RenderProcessesFailed
    when stdin is no pipe: `render_worker` is for a server's own render processes, not for a
    process run by hand."""
    fd = sys.stdin.fileno()
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        raise RenderProcessesFailed(
            "render_worker is set, but stdin is not a pipe from a serving process: the setting is for the render "
            "processes a server starts (--render-processes), not for a server run by hand"
        )
    os.nice(_NICER)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        if not os.read(fd, 4096):
            loop.remove_reader(fd)
            log.info("the serving process is gone: stopping")
            stop()
            path = listen.removeprefix("unix:")
            with contextlib.suppress(OSError):
                os.unlink(path)  # connections made stay open; no new one can be
                os.rmdir(os.path.dirname(path))  # fails, as it should, while another's socket is in it

    loop.add_reader(fd, readable)
