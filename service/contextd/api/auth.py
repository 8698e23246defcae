"""Tenants and API keys: who is calling, and which sessions they may see.

Every storage query is scoped by the tenant resolved here, so a session of
one tenant never answers to another (it is NOT_FOUND there).
"""

from __future__ import annotations

import contextvars
import hmac
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from contextd.engine.errors import Unauthenticated

DEFAULT_TENANT = "default"
"""The tenant of every call when no API keys are configured."""

_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("contextd_tenant", default=DEFAULT_TENANT)


def current_tenant() -> str:
    """The tenant of the RPC being served."""
    return _tenant.get()


class ApiKeys:
    def __init__(self, keys: Mapping[str, str]) -> None:
        """`keys` maps each API key to its tenant; empty turns authentication off."""
        self._keys = [(key.encode(), tenant) for key, tenant in keys.items()]

    def tenant_of(self, metadata: Sequence[tuple[str, str | bytes]]) -> str:
        """The caller's tenant, from its one `authorization: Bearer <key>` header."""
        if not self._keys:
            return DEFAULT_TENANT
        given = [value for name, value in metadata if name == "authorization"]
        if len(given) > 1:
            # Proxies differ on which of two they pass on: the call is refused, not guessed.
            raise Unauthenticated(f"{len(given)} authorization headers: send one")
        offered = given[0] if given else ""
        scheme, _, key = (offered if isinstance(offered, str) else "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise Unauthenticated("missing credentials: send `authorization: Bearer <api key>`")
        offered_key = key.encode()
        # Compare against every key, in constant time each, so timing tells nothing.
        matches = [tenant for known, tenant in self._keys if hmac.compare_digest(known, offered_key)]
        if not matches:
            raise Unauthenticated("the API key is not valid")
        return matches[0]

    @contextmanager
    def acting_as(self, metadata: Sequence[tuple[str, str | bytes]]) -> Iterator[str]:
        """Resolve the caller's tenant and make it current while the handler runs."""
        tenant = self.tenant_of(metadata)
        token = _tenant.set(tenant)
        try:
            yield tenant
        finally:
            _tenant.reset(token)
