"""A genuine first render of each development trace: its whole history rendered once by the
engine with the default policy, in a fresh process (nothing memoised), CPU time.

    python bench/first_render.py [--traces ../shared/traces] [--format openai_chat]

`bench/scale.py` measures the first render of a synthetic session of shell reads at 1,000 to
50,000 items (every output a 60-line module, parsed and read as lines); this measures it on
what agents really sent, each trace as it stood at its last call. Prints a Markdown table (CPU
per item and per KB of the trace's messages) and the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def child(path: str, fmt: str) -> dict[str, float]:
    """In a fresh process: the first render of the trace at `path`."""
    from contextd import interpreter
    from contextd.api.mapping import items_from_proto
    from contextd.engine.pipeline import RenderInput, render
    from contextd.engine.policy import default_policy
    from contextd.engine.state import ViewState
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd_lab.replay import trace_items
    from tests.helpers import make_session, to_item

    interpreter.tune()  # as the service runs
    counter, registry, policy = TiktokenCounter(), TransformRegistry.default(), default_policy()
    counter.count("warm the tokenizer")
    trace = json.loads(Path(path).read_text())
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(trace_items(trace)), start=1)]
    request = ViewRequest(ViewFormat(fmt))
    cpu = time.process_time()
    render(RenderInput(make_session(len(items)), items, policy, request, counter, registry, ViewState(), 0.0))
    spent = time.process_time() - cpu
    kb = sum(len(json.dumps(m)) for m in trace["messages"]) / 1000
    return {"items": len(items), "kb": kb, "cpu_ms": spent * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    parser.add_argument("--format", default="openai_chat")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.format)))
        return 0
    rows = []
    for path in sorted(Path(args.traces).glob("*.json")):
        command = [sys.executable, __file__, "--child", str(path), "--format", args.format]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append((path.stem, json.loads(done.stdout.strip().splitlines()[-1])))
    print(f"command: python bench/first_render.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}; {args.format}"
    )
    print()
    print("| trace | items | KB | CPU | per item | per KB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        print(
            f"| {name} | {r['items']:,.0f} | {r['kb']:,.0f} | {r['cpu_ms']:.1f} ms | "
            f"{r['cpu_ms'] / r['items']:.3f} ms | {r['cpu_ms'] / r['kb']:.3f} ms |"
        )
    items, cpu = sum(r["items"] for _, r in rows), sum(r["cpu_ms"] for _, r in rows)
    print(f"| all | {items:,.0f} | {sum(r['kb'] for _, r in rows):,.0f} | {cpu:.1f} ms | {cpu / items:.3f} ms | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
