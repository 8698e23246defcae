"""The proxy in front of a stub provider (`contextd_lab.stub_upstream`) and a real contextd,
each served over HTTP or gRPC in its own thread, as the SDKs meet them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from contextd.proxy.app import Proxy, Settings
from contextd.remote import Connection
from contextd_lab.stub_upstream import Upstream, serving
from tests.conftest import ServerThread, test_settings
from tests.service.api.test_metrics import reader, snapshot  # noqa: F401 - the metrics fixtures


@pytest.fixture(scope="module")
def contextd(sqlite_url: str) -> Iterator[ServerThread]:
    """A contextd for the module (the proxy speaks gRPC only: one backend is enough)."""
    running = ServerThread(test_settings(sqlite_url)).start()
    yield running
    running.stop()


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, str]]:
    stub = Upstream()
    with serving(stub.app()) as url:
        yield stub, url


@pytest.fixture
def make_proxy(upstream: tuple[Upstream, str]) -> Iterator[Callable[..., str]]:
    """Start a proxy (`target`: the contextd it asks) in front of the stub; its base URL."""
    with ExitStack() as stack:

        def make(target: str, timeout: float = 10.0, **settings: object) -> str:
            url = upstream[1]
            connection = Connection(target, timeout=timeout, retry_budget=min(0.5, timeout))
            proxy = Proxy(Settings(connection, url, url, **settings))  # type: ignore[arg-type]
            return stack.enter_context(serving(proxy.app()))

        yield make
