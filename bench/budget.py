"""A long session under a token budget, call by call: does the view fit, and what does the
prompt cache make of the offloads?

    python bench/budget.py [--rounds 3000] [--budget 150000] [--low-water X] [--format openai_chat]

The session is `bench/scale.py`'s (a coding agent's shell reads of different files, each output
its own: the default policy compresses each once it is older than the last turn, and removes
nothing). One round (a call and its output) is appended before each render, a minute apart, as
an agent goes; every render asks for `--budget` tokens and resumes from the previous one's carry,
as the service does. Each view is priced as the lab prices its default condition's calls
(bench/contextd_lab/cache.py: Anthropic reads back to an earlier call's breakpoint, which the view
places, `place_cache_breakpoint`; OpenAI any shared prefix).

`--low-water X` sets the policy's `cache.low_water` (the share of the budget an offload goes
down to); without it, the default policy as it ships (the only choice when measuring a commit
from before the setting existed). Prints what it measured and the command; a benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3000, help="rounds (a call and its output) in the session")
    parser.add_argument("--budget", type=int, default=150_000, help="the budget every render asks for")
    parser.add_argument("--low-water", type=float, default=None, help="the policy's cache.low_water")
    parser.add_argument("--format", default="openai_chat")
    args = parser.parse_args()

    from contextd import interpreter
    from contextd.api.mapping import items_from_proto
    from contextd.engine.pipeline import RenderInput, render
    from contextd.engine.policy import default_policy_text, parse_policy
    from contextd.engine.state import ViewState
    from contextd.engine.tokens import TiktokenCounter
    from contextd.engine.transforms import TransformRegistry
    from contextd.engine.view import ViewFormat, ViewRequest
    from contextd_client.formats.openai import items_from_openai
    from contextd_lab.cache import PromptCache
    from contextd_lab.replay import _segments, cached_messages
    from scale import tool_calls
    from tests.helpers import make_session, to_item

    interpreter.tune()
    counter, registry = TiktokenCounter(), TransformRegistry.default()
    text = default_policy_text()
    if args.low_water is not None:
        text = text.replace("cache: {", f"cache: {{low_water: {args.low_water}, ", 1)
    policy = parse_policy(text, registry)
    messages = tool_calls(2 + 2 * args.rounds, "unprunable")
    items = [to_item(c, seq) for seq, c in enumerate(items_from_proto(items_from_openai(messages)), start=1)]
    request = ViewRequest(ViewFormat(args.format), budget_tokens=args.budget, place_breakpoint=True)
    caches = {p: PromptCache(p) for p in ("anthropic", "openai")}
    dollars = dict.fromkeys(caches, 0.0)
    written = {p: 0 for p in caches}
    sent, over, offloading, renders, largest = 0, 0, 0, [], 0
    out = None
    for n in range(4, len(items) + 1, 2):
        inp = RenderInput(
            make_session(n),
            items[:n],
            policy,
            request,
            counter,
            registry,
            out.state if out else ViewState(),
            60.0 * n,
            carry=out.carry if out else None,
        )
        started = time.perf_counter()
        out = render(inp)
        renders.append((time.perf_counter() - started) * 1000)
        view = out.view
        prompt = _segments(json.loads(view.messages_json), view.items, view.framing_tokens)
        through = cached_messages(view)  # type: ignore[arg-type]
        for provider, cache in caches.items():
            billed = cache.call(prompt, 60.0 * n, through)
            dollars[provider] += billed.dollars
            written[provider] += billed.cache_write + billed.uncached
        sent += view.total_tokens
        largest = max(largest, view.total_tokens)
        over += view.over_budget
        offloading += any(c.rule == "budget" for c in out.certificates)
    calls = len(renders)
    setting = f"low_water {args.low_water}" if args.low_water is not None else "the default policy"
    print(f"{calls} calls, {len(items):,} items at the end, budget {args.budget:,} tokens, {setting}")
    print()
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| calls over the budget (OVER_BUDGET) | {over} |")
    print(f"| calls that offloaded | {offloading} |")
    print(f"| largest view | {largest:,} tokens |")
    print(f"| tokens sent, all calls | {sent:,} |")
    for provider in caches:
        print(f"| {provider}: priced | ${dollars[provider]:.2f} |")
        print(f"| {provider}: tokens written to the cache or sent uncached | {written[provider]:,} |")
    print(f"| render, p50 / max | {statistics.median(renders):.1f} / {max(renders):.1f} ms |")
    print()
    print(f"Python {platform.python_version()}, {platform.machine()}")
    command = ["python", "bench/budget.py", "--rounds", str(args.rounds), "--budget", str(args.budget)]
    if args.low_water is not None:
        command += ["--low-water", str(args.low_water)]
    print("command: " + " ".join([*command, "--format", args.format]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
