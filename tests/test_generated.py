"""The committed API stubs match proto/, and the proto passes buf lint."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends import in_ci


def test_committed_stubs_match_the_proto(repo_root: Path) -> None:
    check = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _buf(repo_root: Path) -> str | None:
    local = repo_root / ".ci" / "node" / "node_modules" / ".bin" / "buf"
    return os.environ.get("CONTEXTD_BUF") or (str(local) if local.exists() else shutil.which("buf"))


def test_proto_passes_buf_lint(repo_root: Path) -> None:
    buf = _buf(repo_root)
    if buf is None:
        if in_ci():
            pytest.fail("buf is not installed: .ci/run installs it with npm", pytrace=False)
        pytest.skip("buf is not installed (npm install --prefix .ci/node @bufbuild/buf)")
    lint = subprocess.run([buf, "lint"], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_client_package_needs_only_grpc_and_protobuf(repo_root: Path) -> None:
    """Import the whole client in a process where the server's dependencies cannot load."""
    blocked = ["sqlalchemy", "alembic", "redis", "tiktoken", "opentelemetry", "contextd", "google.rpc"]
    script = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        f"    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r} or name.startswith('google.rpc'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import contextd_client, contextd_client.formats\n"
        "from contextd_client import Client, AsyncClient\n"
        "print('ok')\n"
    )
    assert importlib.util.find_spec("contextd_client") is not None
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
    requirements = (repo_root / "clients" / "python" / "pyproject.toml").read_text()
    dependencies = requirements.split("dependencies = [", 1)[1].split("]", 1)[0]
    names = sorted(line.strip().strip('",').split(">")[0] for line in dependencies.splitlines() if '"' in line)
    assert names == ["grpcio", "protobuf"]
