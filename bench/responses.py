"""What encoding RenderView's response costs, in process (api/responses.py).

    python bench/responses.py [--items 10000] [--repeat 30]

Builds a view of `--items` items (a tool output of eight lines each, about 270 bytes of
messages an item: 2.7 MB at 10,000), encodes its response once (the items' bytes are
remembered, as after a render), then times `render_response` on the same view `--repeat`
times, as every render of a long session that resumes the previous one does: the encoding
runs on a render thread and holds the interpreter lock throughout, so what it costs another
tenant's calls is what it costs here. Prints min and median, and the command. A benchmark,
not a test: compare two checkouts by running it in each (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    from contextd.api.responses import render_response
    from contextd.engine.model import Representation
    from contextd.engine.view import View, ViewFormat, ViewItem

    def output(n: int) -> str:
        content = f"step {n} row k: value={n * 31}\\n" * 8
        return f'{{"role":"tool","tool_call_id":"c{n}","content":"{content}"}}'

    outputs = tuple(output(n) for n in range(args.items))
    view = View(
        session_id="session",
        version=args.items,
        format=ViewFormat.OPENAI_CHAT,
        encoding="o200k_base",
        message_parts=outputs,
        system_json="",
        items=tuple(ViewItem(n + 1, Representation.FULL, 60, n, "") for n in range(args.items)),
        item_tokens=60 * args.items,
        framing_tokens=4 * args.items,
        total_tokens=64 * args.items,
        budget_tokens=0,
        over_budget=False,
        warnings=(),
    )
    render_response(view, ())
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        render_response(view, ())
        times.append((time.perf_counter() - started) * 1000)
    megabytes = len(view.messages_json) / 1e6
    print(f"\nRenderView's response, {args.items:,} items ({megabytes:.1f} MB of messages), {args.repeat} encodings\n")
    print(f"| min ms | median ms |\n| ---: | ---: |\n| {min(times):.2f} | {statistics.median(times):.2f} |")
    print(f"\ncommand: python bench/responses.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
