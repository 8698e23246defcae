"""Channel settings shared by the sync and async clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from contextd_client._retry import RetryPolicy

# Views of long sessions can be large; the server caps what it sends.
_DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    target: str
    api_key: str | None
    timeout: float
    """Deadline of each try, in seconds."""
    retry: RetryPolicy
    credentials: grpc.ChannelCredentials | None
    options: tuple[tuple[str, Any], ...]

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def _options(self) -> list[tuple[str, Any]]:
        given = {name for name, _ in self.options}
        return [*self.options, *(o for o in _DEFAULT_OPTIONS if o[0] not in given)]

    def channel(self) -> grpc.Channel:
        if self.credentials is not None:
            return grpc.secure_channel(self.target, self.credentials, options=self._options())
        return grpc.insecure_channel(self.target, options=self._options())

    def aio_channel(self) -> grpc.aio.Channel:
        if self.credentials is not None:
            return grpc.aio.secure_channel(self.target, self.credentials, options=self._options())
        return grpc.aio.insecure_channel(self.target, options=self._options())
