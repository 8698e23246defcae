"""Generate the Python stubs for the contextd API from proto/.

The stubs are committed under clients/python/contextd_client/v1/ so that
installing the client or the service needs no protoc. The test suite runs
this script with --check, which fails when the committed stubs differ from
what the .proto files generate (a forgotten regeneration).

    python scripts/gen_protos.py           # regenerate in place
    python scripts/gen_protos.py --check   # exit 1 on drift
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE_DIR = PROTO_ROOT / "contextd" / "v1"
OUT_DIR = ROOT / "clients" / "python" / "contextd_client" / "v1"

# protoc writes absolute imports that mirror the proto package
# (`from contextd.v1 import content_pb2`); the stubs live inside the client
# package, so those imports are rewritten to point there.
PROTO_IMPORT = "from contextd.v1 import "
PACKAGE_IMPORT = "from contextd_client.v1 import "

INIT = '"""Generated protobuf and gRPC stubs for contextd.v1 (scripts/gen_protos.py)."""\n'


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: install the test extra (mypy-protobuf)")
    return found


def generate() -> dict[str, str]:
    """Run protoc and return {file name: text} of the stubs to commit."""
    protos = sorted(PROTO_PACKAGE_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in protos),
        ]
        subprocess.run(command, check=True, cwd=PROTO_ROOT, capture_output=True)
        files = {"__init__.py": INIT}
        for path in sorted((Path(tmp) / "contextd" / "v1").iterdir()):
            text = path.read_text()
            # protoc emits a grpc module for every file; only files that
            # declare a service have anything in it.
            if path.name.endswith(("_pb2_grpc.py", "_pb2_grpc.pyi")) and "Stub" not in text:
                continue
            files[path.name] = text.replace(PROTO_IMPORT, PACKAGE_IMPORT)
    return files


def check(files: dict[str, str]) -> list[str]:
    """Return a unified diff (as lines) between `files` and OUT_DIR."""
    committed = {p.name: p.read_text() for p in OUT_DIR.glob("*.py*")} if OUT_DIR.exists() else {}
    diff: list[str] = []
    for name in sorted(set(files) | set(committed)):
        old, new = committed.get(name, ""), files.get(name, "")
        if old != new:
            diff.extend(
                difflib.unified_diff(
                    old.splitlines(), new.splitlines(), f"committed/{name}", f"generated/{name}", lineterm=""
                )
            )
    return diff


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    args = parser.parse_args()
    files = generate()
    if args.check:
        diff = check(files)
        if diff:
            print("\n".join(diff[:200]))
            print("\nstubs are stale: run `python scripts/gen_protos.py` and commit the result", file=sys.stderr)
            return 1
        print(f"stubs match proto/ ({len(files)} files)")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in OUT_DIR.glob("*.py*"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (OUT_DIR / name).write_text(text)
    print(f"wrote {len(files)} files to {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
