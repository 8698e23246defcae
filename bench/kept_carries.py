"""What keeping a session's carry in Redis costs and what reading it back costs, by the session's
length (storage/contextd_storage/kept_carries.py), in process.

    python bench/kept_carries.py [--sizes 1000,10000,50000] [--repeat 3] [--redis-url URL]

For each size, bench/scale.py's session (shell calls whose outputs no rule can remove) is
rendered twice (the second after one append, from the first's carry, as the service keeps
it). Then, medians of `--repeat`: *write*, the carry claimed, pickled, compressed and signed
(CPU s, on the store's thread in the service) and its bytes, raw and as kept; *read*, the bytes
checked, decompressed and read back over the history (CPU s: what a replica that never rendered
the session pays before its render, besides reading the history from the database); *render*,
the render after one more append from the carry read back, against the render of the same
from the state alone with the process's memos empty (what such a replica pays without a kept
carry). With `--redis-url`, the bytes also go through Redis (SET, then GET; wall ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _session(n_items: int) -> tuple[Any, Any]:
    """In a fresh process: the token counter, and `run(n, state, now, carry)`, a render of the
    first `n` items of bench/scale.py's session under the default policy."""
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

    interpreter.tune()
    counter, registry, policy = TiktokenCounter(), TransformRegistry.default(), default_policy()
    counter.count("warm the tokenizer")
    messages = tool_calls(n_items + 3, "unprunable")
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(items_from_openai(messages)), start=1)]
    request = ViewRequest(ViewFormat.OPENAI_CHAT)

    def run(n: int, state: ViewState | None = None, now: float = 0.0, carry: Any = None) -> Any:
        inp = RenderInput(make_session(n), items[:n], policy, request, counter, registry, state or ViewState(), now)
        return render(replace(inp, carry=carry))

    run.items = items  # type: ignore[attr-defined]
    return counter, run


def child(n_items: int, repeat: int, redis_url: str, state_path: str) -> dict[str, float]:
    """In a fresh process: one size's figures; the state the carry is of, saved to `state_path`."""
    from contextd.engine.carry_pickle import dump_carry
    from contextd.engine.state import state_to_json
    from contextd_storage.kept_carries import KeptCarries, _Held

    counter, run = _session(n_items)
    items = run.items
    first = run(n_items)
    out = run(n_items + 1, first.state, 60.0, first.carry)
    Path(state_path).write_text(state_to_json(out.state))
    store = KeptCarries(_NoClient(), "bench-secret-0123456789", counter)  # type: ignore[arg-type]  # its bytes alone
    writes, reads, raw, kept = [], [], 0, b""
    for _ in range(repeat):
        gc.collect()
        cpu = time.process_time()
        data = store._bytes(1, out.carry, _Held())  # as a carry held on (released after)
        writes.append(time.process_time() - cpu)
        assert data is not None
        kept, raw = data, len(dump_carry(out.carry, counter, release=True) or b"")
        gc.collect()
        cpu = time.process_time()
        back = store._read(1, data, items[: n_items + 1])
        reads.append(time.process_time() - cpu)
        del back
    back = store._read(1, kept, items[: n_items + 1])
    cpu = time.process_time()
    resumed = run(n_items + 2, back.state, 120.0, back)
    resumed_s = time.process_time() - cpu
    assert back.finished.claim.taken, "the render did not resume from the carry read back"
    figures = {
        "write_s": statistics.median(writes),
        "read_s": statistics.median(reads),
        "raw_mb": raw / 1e6,
        "kept_mb": len(kept) / 1e6,
        "resumed_s": resumed_s,
    }
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        started = time.perf_counter()
        client.set("contextd:bench:carry", kept, px=60_000)
        figures["set_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        assert client.get("contextd:bench:carry") == kept
        figures["get_ms"] = (time.perf_counter() - started) * 1000
        client.delete("contextd:bench:carry")
    return figures | {"view_same": float(resumed.view == run(n_items + 2, back.state, 120.0).view)}


def derived(n_items: int, state_path: str) -> float:
    """In a fresh process (memos empty): the render after one more append from the state at
    `state_path` alone, as a replica without the carry renders it (CPU s)."""
    from contextd.engine.state import state_from_json

    _, run = _session(n_items)
    state = state_from_json(Path(state_path).read_text())
    cpu = time.process_time()
    run(n_items + 2, state, 120.0)
    return time.process_time() - cpu


class _NoClient:
    """No Redis: the store's bytes alone are measured (with `--redis-url`, their trip apart)."""

    def register_script(self, script: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--derived", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeat, args.redis_url, args.state)))
        return 0
    if args.derived:
        print(json.dumps(derived(args.derived, args.state)))
        return 0

    def fresh(*flags: str) -> Any:
        done = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            state = str(Path(folder) / "state.json")  # saved by one process, rendered from by another
            figures = fresh(
                "--child", str(n), "--repeat", str(args.repeat), "--redis-url", args.redis_url, "--state", state
            )
            figures["derived_s"] = fresh("--derived", str(n), "--state", state)
        rows.append((n, figures))
        print(f"{n:,} items: {figures}", file=sys.stderr, flush=True)
    print(f"command: python bench/kept_carries.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    redis_cols = " | Redis SET / GET" if args.redis_url else ""
    print(
        "| items | write (CPU) | kept (raw) | read back (CPU) | render from it (CPU) | render without it (CPU)"
        f"{redis_cols} |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if args.redis_url else ""))
    for n, f in rows:
        redis_cells = f" | {f['set_ms']:.0f} / {f['get_ms']:.0f} ms" if args.redis_url else ""
        assert f["view_same"] == 1.0
        print(
            f"| {n:,} | {f['write_s'] * 1000:,.0f} ms | {f['kept_mb']:.2f} MB ({f['raw_mb']:.1f}) |"
            f" {f['read_s'] * 1000:,.0f} ms | {f['resumed_s'] * 1000:,.1f} ms | {f['derived_s'] * 1000:,.0f} ms"
            f"{redis_cells} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
