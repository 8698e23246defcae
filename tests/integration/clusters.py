"""Servers a test owns outright, to kill and restart at will: a Postgres cluster it
initialises itself (initdb, pg_ctl) and a redis-server, each on a spare loopback port,
and `contextd serve` replicas over them. Never the machine's shared servers: nothing
here connects to a port it did not choose.

Postgres refuses to run as root; under root the cluster's commands run as the
`postgres` OS user, and the cluster's directory belongs to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import redis

from contextd_lab.service import ServerProcess
from contextd_storage import migrate
from tests import backends

START_TIMEOUT = 30.0
"""Seconds a server may take to answer after it is started (a loaded CI machine)."""


def spare_port() -> int:
    """A loopback TCP port nobody listens on now (bound to port 0, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _postgres_bin(name: str) -> str | None:
    """The Postgres binary `name`: on PATH, else in the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


class PrivatePostgres:
    """A Postgres cluster of the test's own in a temporary directory, on a spare port.

    `start()` runs initdb the first time; `stop(mode)` is `pg_ctl stop -m mode`;
    `destroy()` stops it at once (`-m immediate`) and removes the directory.
    """

    def __init__(self) -> None:
        initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            backends.unavailable("Postgres", "initdb/pg_ctl not found (on PATH or in /usr/lib/postgresql/*/bin)")
        assert initdb is not None and pg_ctl is not None
        self._initdb, self._pg_ctl = initdb, pg_ctl
        self._as_user: tuple[str, ...] = ()
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                backends.unavailable("Postgres", "running as root and there is no `postgres` user to run initdb as")
            self._as_user = ("runuser", "-u", "postgres", "--")
        self.port = spare_port()
        # In /tmp itself, not under pytest's tmp_path: the `postgres` user must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="contextd-pg-"))
        if owner is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.data = self.root / "data"
        self.logfile = self.root / "postgres.log"
        self._initialised = False

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str, timeout: float = START_TIMEOUT) -> None:
        done = subprocess.run([*self._as_user, *command], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _initialise(self) -> None:
        self._run(self._initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            # The test stops the server, it never crashes the machine: durability
            # to the OS is all an acknowledged append needs here, and it is faster.
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "100",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("".join(f"{name} = {value}\n" for name, value in settings.items()))
        self._initialised = True

    def start(self) -> None:
        """Start the cluster (initialising it the first time) and wait until it takes connections.

        The first start on a spare port another process took since (see `PrivateRedis`) is
        made again on a fresh one; a restart keeps the port its clients know."""
        first = not self._initialised
        if first:
            self._initialise()
        for attempt in range(1, PrivateRedis.ATTEMPTS + 1):
            try:
                self._pg_ctl_run("-l", str(self.logfile), "start")
                return
            except RuntimeError as failed:
                if not first or attempt == PrivateRedis.ATTEMPTS or "Address already in use" not in str(failed):
                    raise
            self.port = spare_port()
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(f"port = {self.port}\n")  # the last setting of a name wins

    def stop(self, mode: str = "fast", *, wait: bool = True) -> None:
        """`pg_ctl stop -m mode`, waiting until the server has gone unless `wait` is False.

        A smart stop that is not waited for leaves the server shutting down: it refuses
        new connections while the open ones go on, until a fast stop ends them."""
        self._pg_ctl_run("-m", mode, "stop", wait=wait)

    def _pg_ctl_run(self, *args: str, wait: bool = True) -> None:
        self._run(self._pg_ctl, "-D", str(self.data), "-w" if wait else "-W", "-t", str(int(START_TIMEOUT)), *args)

    def destroy(self) -> None:
        """Stop at once if running, and remove the cluster's directory."""
        if (self.data / "postmaster.pid").exists():
            # Removed below even so: a server that has lost its directory exits on its own.
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A redis-server of the test's own on a spare port, without persistence: a restart is empty.

    With `cluster`, a Redis Cluster node (on a spare bus port too) keeping its cluster state
    in its directory; `destroy()` kills it and removes the directory. A spare port is one
    nobody listened on when it was chosen, and another process may take it before the
    server binds it: until the server has once answered, a start that exits picks fresh
    ports and starts again (`ATTEMPTS` in all); a restart keeps the ports its clients know."""

    ATTEMPTS = 3

    def __init__(self, cluster: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            backends.unavailable("Redis", "redis-server is not installed")
        assert binary is not None
        self._binary = binary
        self._cluster = cluster
        self.root = Path(tempfile.mkdtemp(prefix="contextd-redis-"))
        self.logfile = self.root / "redis.log"
        self.port, self.bus_port = spare_port(), spare_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._answered = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> Sequence[str]:
        command = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--logfile", str(self.logfile)]
        if self._cluster:
            # The bus port is chosen too: by default it is the port + 10,000, past 65,535 for
            # a spare port above 55,535, and redis-server would not start.
            command += ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
            command += ["--cluster-port", str(self.bus_port), "--dir", str(self.root)]
            command += ["--cluster-config-file", str(self.root / "nodes.conf")]
        return command

    def start(self) -> None:
        """Start redis-server and wait until it answers PING."""
        for attempt in range(1, self.ATTEMPTS + 1):
            if self._try_start():
                self._answered = True
                return
            if self._answered or attempt == self.ATTEMPTS:
                log = self.logfile.read_text(errors="replace") if self.logfile.exists() else "(no log)"
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log[-2000:]}")
            self.port, self.bus_port = spare_port(), spare_port()

    def _try_start(self) -> bool:
        """Whether the server started answers PING within `START_TIMEOUT` (False: it exited)."""
        self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        probe = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    return False
                try:
                    probe.ping()
                    return True
                except (redis.ConnectionError, redis.TimeoutError):
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(f"redis-server on port {self.port} did not answer") from None
                    time.sleep(0.05)
        finally:
            probe.close()

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedisCluster:
    """Redis servers of the test's own on spare ports, joined into one Redis Cluster without
    replicas (`redis-cli --cluster create`): each node holds its share of the hash slots."""

    def __init__(self, nodes: int = 3) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            backends.unavailable("Redis", "redis-cli is not installed")
        assert cli is not None
        self._cli = cli
        self.nodes = [PrivateRedis(cluster=True) for _ in range(nodes)]

    @property
    def url(self) -> str:
        """Any one node: the cluster client learns the others from it."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [self._cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        for node in self.nodes:
            probe = redis.Redis(port=node.port, socket_timeout=1)
            try:
                while probe.cluster("INFO")["cluster_state"] != "ok":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not come up")
                    time.sleep(0.05)
            finally:
                probe.close()

    def destroy(self) -> None:
        for node in self.nodes:
            node.destroy()


# The replicas' log: a record's first line, an ERROR record, an exception line of a traceback.
LOGGED_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
LOGGED_ERROR = re.compile(r" ERROR (.*?)(?: \(reference \w+\))?$")
LOGGED_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b")


class Cluster:
    """`contextd serve` replicas over a PrivatePostgres and a PrivateRedis."""

    def __init__(self, replicas: int) -> None:
        self.size = replicas
        self.redis = PrivateRedis()
        self.postgres = PrivatePostgres()
        self.replicas: list[ServerProcess] = []
        self.started: list[ServerProcess] = []
        """Every replica process ever started, the killed ones too (their logs are evidence)."""

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        asyncio.run(migrate.upgrade(self.postgres.url))
        starting = [self._replica() for _ in range(self.size)]
        self.replicas = [r.wait_serving() for r in starting]

    def _replica(self, *listen: str) -> ServerProcess:
        replica = ServerProcess(
            *("--database-url", self.postgres.url, "--redis-url", self.redis.url, "--no-migrate-on-start"),
            *("--db-pool-size", "4", "--lock-timeout-ms", "3000", "--grace-seconds", "2"),
            *listen,
        )
        self.started.append(replica)
        return replica

    @property
    def targets(self) -> list[str]:
        return [r.target for r in self.replicas]

    def kill_replica(self, index: int) -> None:
        self.replicas[index].process.kill()
        self.replicas[index].wait(10)

    def restart_replica(self, index: int) -> None:
        """Start the replica again on the port it had (a later --listen wins)."""
        port = self.replicas[index].port
        self.replicas[index] = self._replica("--listen", f"127.0.0.1:{port}").wait_serving()

    def stop(self) -> None:
        try:
            for replica in self.started:
                if replica.process.poll() is None:
                    replica.process.kill()
                replica.wait(10)
            self.redis.destroy()
        finally:
            self.postgres.destroy()

    def logged_failures(self) -> Counter[str]:
        """Each ERROR the replicas logged (its reference cut off), with the first exception of
        its traceback (the root cause, as Python prints chains) and the type of the last, counted."""
        found: Counter[str] = Counter()
        for replica in self.started:
            error = ""
            causes: list[str] = []  # the exception lines of the record's traceback
            for line in [*replica.log, "0000-00-00 00:00:00,000 END"]:
                if LOGGED_LINE.match(line):  # a new record: the previous one is complete
                    if error:
                        last = causes[-1].split(":")[0] if causes else ""
                        found[f"{error} <- {causes[0] if causes else '(no traceback)'} [raised as {last}]"] += 1
                    match = LOGGED_ERROR.search(line)
                    error, causes = (match.group(1) if match else ""), []
                elif error and LOGGED_EXCEPTION.match(line):
                    causes.append(line[:200])
        return found
