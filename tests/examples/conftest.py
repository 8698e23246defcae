"""A server for the programs in examples/ (one per test module), and running them as a user does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerThread
from tests.conftest import test_settings as settings_for

KEY = "example-key"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('examples') / 'contextd.db'}"
    running = ServerThread(settings_for(url, migrate_on_start=True, api_keys=f"examples:{KEY}")).start()
    yield running.target
    running.stop()


def run(repo_root: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    example = repo_root / "examples" / name
    return subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True, timeout=60)


def run_example(repo_root: Path, name: str, target: str) -> str:
    done = run(repo_root, name, "--target", target, "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    return done.stdout
