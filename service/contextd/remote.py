"""What the commands that run beside a contextd server share (`contextd mcp`, `contextd
proxy`): how they reach it over gRPC, and how they listen for HTTP (uvicorn on a socket bound
before serving, so a taken port is said at start-up and port 0 can be told back)."""

from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from contextd_client import AsyncClient, RetryPolicy


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach contextd: `timeout` is seconds a call may take, retries included."""

    target: str
    api_key: str | None = None
    credentials: grpc.ChannelCredentials | None = None
    timeout: float = 10.0
    retry_budget: float | None = None
    """Seconds a call keeps retrying (UNAVAILABLE: a restart, a busy session); the timeout when None."""

    def client(self, api_key: str | None = None) -> AsyncClient:
        """A client (`api_key`: instead of the connection's own). Someone waits on each call, so
        a contextd that is down is said within the timeout, not after the client's usual 30 s
        of retries."""
        retry = RetryPolicy(budget=self.timeout if self.retry_budget is None else self.retry_budget)
        key = api_key or self.api_key
        # A process may hold a client per API key (the proxy: up to 64): each holds its sessions'
        # last views (they come back as what changed) within a smaller share of memory.
        return AsyncClient(
            self.target,
            api_key=key,
            credentials=self.credentials,
            timeout=self.timeout,
            retry=retry,
            held_view_bytes=HELD_VIEW_BYTES,
        )


HELD_VIEW_BYTES = 16 << 20
"""Bytes of the last views each client of a connection holds (contextd_client/_held.py)."""


def bind(listen: str) -> socket.socket:
    """A listening socket on `listen` (host:port; port 0: any free one). OSError when taken."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"--listen must be host:port, not {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, int(port)), family=family)


def url_of(listening: socket.socket) -> str:
    host, port = listening.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


async def serve_asgi(app: Any, listening: socket.socket, grace: float = 5.0) -> None:
    """Serve the ASGI `app` on `listening` until SIGINT or SIGTERM; then requests under way
    have `grace` seconds to finish."""
    import uvicorn

    config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=round(grace))
    http = uvicorn.Server(config)
    if threading.current_thread() is threading.main_thread():
        # Once stopped by SIGINT or SIGTERM, uvicorn raises the signal again under the
        # handlers it found, ending the process by that signal; with its own handler
        # found there, a graceful stop ends in exit code 0, as `contextd serve`'s does.
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, http.handle_exit)
    await http.serve(sockets=[listening])
