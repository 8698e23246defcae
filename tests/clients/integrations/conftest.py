"""The framework adapters reach contextd only over gRPC, so their tests run against the shared
server on SQLite alone (SQLITE_ONLY): the storage layer and the service's API are tested on
both backends, and these on Postgres as well would repeat that at the price of an agent loop."""

from __future__ import annotations

import pytest

from tests.conftest import SQLITE_ONLY


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Before the fixture's own parametrization, which leaves alone an argument a test parametrizes.
    if "database_url" in metafunc.fixturenames:
        metafunc.definition.add_marker(SQLITE_ONLY)
