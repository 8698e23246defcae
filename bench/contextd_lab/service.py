"""`contextd serve` as a real child process: the lab replays through it, and the multi-replica
and CLI tests and the benchmarks run against it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

SERVING = re.compile(r"contextd serving on [^:]+:(\d+)")


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child started in another folder, with `extra`: the
    relative entries of PYTHONPATH (an empty one too) made absolute against this process's
    folder. Left relative, they name nothing in the child's folder and it imports the installed
    package instead: a benchmark run in each of two checkouts to compare them ran one code twice."""
    env = {**os.environ, **(extra or {})}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(entry) for entry in env["PYTHONPATH"].split(os.pathsep))
    return env


class ServerProcess:
    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        """`contextd serve` on a free loopback port, with `args` (flags) in `cwd`."""
        command = [sys.executable, "-m", "contextd", "serve", "--listen", "127.0.0.1:0", *args]
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=child_environment(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.port: int | None = None
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            match = SERVING.search(line)
            if match:
                self.port = int(match.group(1))
                self._started.set()
        self.process.stderr.close()
        self._started.set()

    def wait_serving(self, timeout: float = 60) -> ServerProcess:
        self._started.wait(timeout)
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "\n".join(self.log))
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 30) -> int:
        """The exit code, once the process has ended and its whole log is read."""
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(30)

    def __enter__(self) -> ServerProcess:
        return self.wait_serving()

    def __exit__(self, *exc: object) -> None:
        self.stop()
