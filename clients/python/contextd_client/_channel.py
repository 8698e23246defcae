"""Channel settings shared by the sync and async clients, and how targets become channels.

Each channel balances its calls round robin over every address its target
resolves to (``dns:///contextd.internal:50051`` names them all), skipping
the ones it cannot connect to. A list of ``IP:port`` targets becomes one
such channel (gRPC's ``ipv4:``/``ipv6:`` URIs take several addresses); any
other list (host names, URIs) opens one channel per target, and the client
rotates over them: each call starts on the next, each retry moves on.

Calls are not wait-for-ready: one waits while its channel is still
connecting, and goes to any replica that is up, but fails at once
(UNAVAILABLE) when none is; the retry backoff then paces the tries. Waiting
for a replica instead would spend each try's whole deadline and end in
DEADLINE_EXCEEDED, which reads are not retried after, and would hide a
service that is not there behind a timeout.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from contextd_client._retry import RetryPolicy


@functools.cache
def _injector() -> Callable[[dict[str, str]], None] | None:
    """OpenTelemetry's propagator, when it is installed beside the client (optional: the client
    depends on grpcio and protobuf alone); imported at the first call, not with the client."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:  # pragma: no cover - exercised where OpenTelemetry is not installed
        return None
    return inject


# We retry ourselves (see _retry.py), so the service config names no retry
# policy: gRPC then only makes its transparent retries, of calls that never
# reached a server, which are always safe.
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})

_DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Views of long sessions can be large; the server caps what it sends.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.service_config", _ROUND_ROBIN),
    # gRPC waits up to 120 s between attempts to reconnect to a replica that
    # went away; one back from a restart is wanted within the retry budget
    # and soon, so try it every second (a refused connection each time).
    ("grpc.max_reconnect_backoff_ms", 1000),
)
# Options naming the load-balancing policy themselves, in place of ours.
_LB_OPTIONS = frozenset({"grpc.service_config", "grpc.lb_policy_name"})


def channel_targets(target: str | Sequence[str]) -> tuple[str, ...]:
    """The gRPC target of each channel to open for `target`: one "host:port" or gRPC
    target URI, or a sequence of them."""
    if isinstance(target, str):
        return (target,)
    targets = tuple(target)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets are 'host:port' strings or gRPC target URIs, not {target!r}")
    if len(targets) == 1:
        return targets
    combined = _ip_uri(targets)
    return (combined,) if combined else targets


def _ip_uri(targets: tuple[str, ...]) -> str | None:
    """One ``ipv4:`` (or ``ipv6:``) URI naming every target, when all are IP:port of one family."""
    versions: set[int] = set()
    for target in targets:
        host, _, port = target.rpartition(":")
        if not port.isdigit():
            return None
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            address = ipaddress.ip_address(host[1:-1] if bracketed else host)
        except ValueError:
            return None
        if (address.version == 6) != bracketed:
            return None
        versions.add(address.version)
    if len(versions) != 1:
        return None
    return f"ipv{versions.pop()}:" + ",".join(targets)


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    targets: tuple[str, ...]
    """The gRPC target of each channel (see `channel_targets`)."""
    api_key: str | None
    timeout: float
    """Deadline of each try, in seconds."""
    retry: RetryPolicy
    credentials: grpc.ChannelCredentials | None
    options: tuple[tuple[str, Any], ...]
    interceptors: tuple[Any, ...] = ()
    """gRPC client interceptors, outermost first (sync ones for Client, grpc.aio ones for AsyncClient)."""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Each call's metadata: the API key, and the caller's trace context when OpenTelemetry
        is installed beside the client (W3C `traceparent`), so the caller's trace continues
        into the service."""
        auth = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()
        inject = _injector()
        if inject is None:
            return auth
        carrier: dict[str, str] = {}
        inject(carrier)
        return (*auth, *carrier.items())

    def _options(self) -> list[tuple[str, Any]]:
        given = {name for name, _ in self.options}
        skipped = given | (_LB_OPTIONS if given & _LB_OPTIONS else set())
        return [*self.options, *(o for o in _DEFAULT_OPTIONS if o[0] not in skipped)]

    def channels(self) -> list[grpc.Channel]:
        if self.credentials is not None:
            made = [grpc.secure_channel(t, self.credentials, options=self._options()) for t in self.targets]
        else:
            made = [grpc.insecure_channel(t, options=self._options()) for t in self.targets]
        return [grpc.intercept_channel(c, *self.interceptors) for c in made] if self.interceptors else made

    def aio_channels(self) -> list[grpc.aio.Channel]:
        given = list(self.interceptors) or None
        if self.credentials is not None:
            return [
                grpc.aio.secure_channel(t, self.credentials, options=self._options(), interceptors=given)
                for t in self.targets
            ]
        return [grpc.aio.insecure_channel(t, options=self._options(), interceptors=given) for t in self.targets]
