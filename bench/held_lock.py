"""Where a render's thread holds the interpreter lock in long stretches, during which no other
thread of the process moves (the event loop's calls of other tenants, other renders).

    python bench/held_lock.py [--items 20000] [--workload mixed] [--longer-than 15]

In process, the interpreter tuned as the service tunes it (contextd/interpreter.py): a thread
does what a server's render thread does for a genuine first render of a session of `--items`
items (bench/scale.py's workload): the engine's render, then the view state written whole and
as a change (`state_to_json`, `change_to_json`), as the first render of a session stores them.
Meanwhile the main thread sleeps 1 ms at a time; each wake-up later than `--longer-than` ms is
a stretch in which it could not take the lock back. Prints the stretches by where the render
thread was when the main thread next ran (its innermost frames: where the stretch ended, so
the code that held the lock is at or just before it; a garbage collection's is the callback
`_freeze_survivors`), their count, longest and sum; then the garbage collections of the run by
generation (count, longest, sum, objects collected) and how long the server's occasional full
collection (interpreter.collect_in_full) of what is left takes; and the command. A benchmark,
not a test.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--workload", choices=["unprunable", "modules", "mixed", "sliding"], default="mixed")
    parser.add_argument("--longer-than", type=float, default=15.0, help="ms")
    parser.add_argument("--frames", type=int, default=4, help="innermost frames that name a stretch")
    args = parser.parse_args()

    from common import report
    from contextd import interpreter
    from contextd.api.mapping import items_from_proto
    from contextd.engine.changes import change_to_json
    from contextd.engine.pipeline import RenderInput, render
    from contextd.engine.policy import default_policy
    from contextd.engine.state import ViewState, state_to_json
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd_client.formats.openai import items_from_openai
    from scale import tool_calls
    from tests.helpers import make_session, to_item

    interpreter.tune()
    counter, registry = TiktokenCounter(), TransformRegistry.default()
    counter.count("warm the tokenizer")
    messages = tool_calls(args.items, args.workload)
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(items_from_openai(messages)), start=1)]
    request = ViewRequest(ViewFormat.OPENAI_CHAT)
    given = RenderInput(make_session(len(items)), items, default_policy(), request, counter, registry, ViewState(), 0.0)
    done = threading.Event()

    def work() -> None:
        out = render(given)
        state_to_json(out.state)
        if out.change is not None:
            change_to_json(out.change)
        done.set()

    collections: dict[int, list[tuple[float, int]]] = defaultdict(list)
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections[info["generation"]].append(((time.perf_counter() - began[0]) * 1000, info["collected"]))

    gc.callbacks.insert(0, timed)
    worker = threading.Thread(target=work, name="render")
    stretches: dict[str, list[float]] = defaultdict(list)
    started = last = time.perf_counter()
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        if (now - last) * 1000 > args.longer_than:
            frame = sys._current_frames().get(worker.ident or 0)
            stack = traceback.extract_stack(frame)[-args.frames :] if frame is not None else []
            where = " < ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(stack))
            stretches[where or "(ended)"].append((now - last) * 1000)
        last = now
    worker.join()
    seconds = time.perf_counter() - started
    gc.callbacks.remove(timed)
    sweep_started = time.perf_counter()
    interpreter.collect_in_full()  # what the server does once its heap grew (interpreter.maintain)
    sweep_ms = (time.perf_counter() - sweep_started) * 1000
    rows = [
        (str(len(found)), f"{max(found):.1f}", f"{sum(found):.1f}", where)
        for where, found in sorted(stretches.items(), key=lambda kv: -sum(kv[1]))
    ]
    every = [ms for found in stretches.values() for ms in found]
    print(
        f"{args.items:,} items ({args.workload}), the render and its state's JSON in {seconds:.1f} s; "
        f"{len(every)} stretches over {args.longer_than:g} ms, {sum(every):.0f} ms in all, "
        f"the longest {max(every, default=0):.1f} ms"
    )
    report("held_lock.py", ("stretches", "longest ms", "sum ms", "the render thread then (innermost first)"), rows)
    by_generation = [
        (
            str(gen),
            str(len(found)),
            f"{max(ms for ms, _ in found):.1f}",
            f"{sum(ms for ms, _ in found):.1f}",
            f"{sum(n for _, n in found):,}",
        )
        for gen, found in sorted(collections.items())
    ]
    print(
        f"garbage collections (thresholds {gc.get_threshold()}); then a full one of everything "
        f"(the server's once its heap grew by a quarter), {gc.get_freeze_count():,} objects kept: "
        f"{sweep_ms:.0f} ms"
    )
    report("held_lock.py", ("generation", "collections", "longest ms", "sum ms", "objects collected"), by_generation)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
