"""A genuine first render counted in machine instructions, not timed: the engine's render of
`bench/scale.py`'s sessions in a fresh process under Valgrind's callgrind, counting only the
render itself.

    python bench/instructions.py [--sizes 1000] [--workloads unprunable,modules,sliding,mixed]

Time on a shared machine varies by a fifth between runs of the same code (two runs of the
same first render, minutes apart: 0.64 and 0.87 ms of CPU an item), more than most changes to
a render move it; the instructions a render executes vary by nothing, so two commits compare
by one run each. They are not time: a cache miss costs more than an addition, and Valgrind
sees every instruction of the interpreter, the tokenizer and the parser alike. Prints a
Markdown table (instructions per item, the exponent between sizes) and the command. Needs
`valgrind` (Debian: `apt install valgrind`); a run of 1,000 items takes about two minutes.

The render is counted from the moment it is called to its return: the child calls it through
`functools.reduce`, a C function nothing else in the child calls, and callgrind collects while
that function is on the stack (`--toggle-collect`).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTED = re.compile(r"Collected : (\d+)")


def child(n_items: int, workload: str) -> None:
    """In the process callgrind runs: the first render of `workload` at `n_items`, through
    `functools.reduce` (what is collected)."""
    import functools

    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from contextd import interpreter
    from contextd.api.mapping import items_from_proto
    from contextd.engine.pipeline import RenderInput, render
    from contextd.engine.policy import default_policy
    from contextd.engine.state import ViewState
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd_client.formats.openai import items_from_openai
    from scale import tool_calls
    from tests.helpers import make_session, to_item

    interpreter.tune()  # as the service runs
    counter, registry, policy = TiktokenCounter(), TransformRegistry.default(), default_policy()
    counter.count("warm the tokenizer")
    messages = tool_calls(n_items, workload)
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(items_from_openai(messages)), start=1)]
    given = RenderInput(
        make_session(n_items), items, policy, ViewRequest(ViewFormat.OPENAI_CHAT), counter, registry, ViewState(), 0.0
    )
    functools.reduce(lambda _, __: render(given), [0], None)


def counted(n_items: int, workload: str) -> int:
    """The instructions of the first render of `workload` at `n_items`, in a fresh process."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={scratch}/out",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            sys.executable,
            __file__,
            "--child",
            f"{n_items},{workload}",
        ]
        path = os.pathsep.join(str(ROOT / part) for part in ("service", "storage", "clients/python"))
        env = {**os.environ, "PYTHONPATH": path}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = COLLECTED.search(done.stderr)
    if found is None or int(found.group(1)) == 0:
        raise SystemExit(f"callgrind collected nothing of the render:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000")
    parser.add_argument("--workloads", default="unprunable,modules,sliding,mixed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        n_items, workload = args.child.split(",")
        child(int(n_items), workload)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt install valgrind)")
    sizes = [int(n) for n in args.sizes.split(",")]
    workloads = args.workloads.split(",")
    print(f"command: python bench/instructions.py --sizes {args.sizes} --workloads {args.workloads}")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print("\n| workload | " + " | ".join(f"{n:,} items (instructions an item)" for n in sizes) + " | exponent |")
    print("| --- | " + " | ".join("---:" for _ in sizes) + " | ---: |")
    for workload in workloads:
        totals = [counted(n, workload) for n in sizes]
        slope = f"{math.log(totals[-1] / totals[0]) / math.log(sizes[-1] / sizes[0]):.2f}" if len(sizes) > 1 else ""
        cells = " | ".join(f"{total / n / 1e6:.3f} M" for total, n in zip(totals, sizes, strict=True))
        print(f"| {workload} | {cells} | {slope} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
