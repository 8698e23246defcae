"""What Anthropic bills when the view places the cache breakpoint, against the agent's own.

    python bench/breakpoints.py [--traces ../shared/traces] [--policy FILE] [--gap SECONDS]

For every trace in ../shared/traces/ (replayed in-process with the default
policy, as bench/traces.py does, `--gap` seconds between calls), it prices
with Anthropic's cache (the lab's model, bench/contextd_lab/cache.py) the raw
history with a breakpoint at the end of each call, as agents put it; the
policy's prompts with that same breakpoint (the caller places it); and the
policy's prompts rendered with `place_breakpoint`, which the view ends
before the newest outputs the next render expects to reduce, when that pays
(service/contextd/engine/breakpoint.py). The engine prices its edits from where the
breakpoint was, so the two policy runs may decide differently: it also
prints their tokens, and how many calls of the last placed the breakpoint
early and how many of those the next call did reduce.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from contextd.engine.model import Representation, Role  # noqa: E402
from contextd.engine.pipeline import RenderInput, identity_view, render  # noqa: E402
from contextd.engine.policy import Policy, default_policy, parse_policy  # noqa: E402
from contextd.engine.state import ViewState  # noqa: E402
from contextd.engine.tokens import TiktokenCounter  # noqa: E402
from contextd.engine.transforms import TransformRegistry  # noqa: E402
from contextd.engine.view import View, ViewFormat, ViewRequest  # noqa: E402
from contextd_lab.cache import PromptCache, Segment  # noqa: E402
from contextd_lab.replay import _segments, cached_messages  # noqa: E402
from tests.helpers import make_session, to_item  # noqa: E402
from traces import contents  # noqa: E402


def prompt(view: View) -> tuple[Segment, ...]:
    return _segments(json.loads(view.messages_json), view.items, view.framing_tokens)


def views(trace: dict[str, Any], policy: Policy, counter: TiktokenCounter, gap: float, placed: bool) -> list[View]:
    """The policy's view at each model call (with the view placing the breakpoint, when `placed`)."""
    registry = TransformRegistry.default()
    request = ViewRequest(ViewFormat.OPENAI_CHAT, place_breakpoint=placed)
    items = [to_item(c, seq) for seq, c in enumerate(contents(trace), start=1)]
    state, carry, now, out = ViewState(), None, 0.0, []
    for end in (i for i, item in enumerate(items) if item.role is Role.ASSISTANT):
        prefix = items[:end]
        rendered = render(
            RenderInput(make_session(len(prefix)), prefix, policy, request, counter, registry, state, now, carry=carry)
        )
        state, carry, now = rendered.state, rendered.carry, now + gap
        out.append(rendered.view)
    return out


def raw_views(trace: dict[str, Any], counter: TiktokenCounter) -> list[View]:
    items = [to_item(c, seq) for seq, c in enumerate(contents(trace), start=1)]
    request = ViewRequest(ViewFormat.OPENAI_CHAT)
    ends = [i for i, item in enumerate(items) if item.role is Role.ASSISTANT]
    return [identity_view(make_session(end), items[:end], request, counter) for end in ends]


def bill(calls: Sequence[View], gap: float) -> float:
    cache = PromptCache("anthropic")
    return sum(cache.call(prompt(view), n * gap, cached_messages(view)).dollars for n, view in enumerate(calls))


def early(calls: Sequence[View]) -> tuple[int, int]:
    """Calls whose breakpoint the view placed before the end, and of those, the ones whose next
    call showed the item after it reduced."""
    placed = kept = 0
    for view, following in pairwise(calls):
        if not view.cache_breakpoint_seq:
            continue
        placed += 1
        seqs = [s.seq for s in view.items]
        first = seqs[seqs.index(view.cache_breakpoint_seq) + 1]
        later = {s.seq: s.representation for s in following.items}
        kept += later.get(first, Representation.FULL) is not Representation.FULL
    return placed, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--policy", type=Path)
    parser.add_argument("--gap", type=float, default=30.0)
    args = parser.parse_args()
    counter = TiktokenCounter()
    policy = parse_policy(args.policy.read_text(), TransformRegistry.default()) if args.policy else default_policy()
    print(f"command: python bench/breakpoints.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"policy: {policy.version}; Anthropic's prices; {args.gap:g} s between calls\n")
    print(
        "| trace | raw | policy, the caller's breakpoint at the end | policy, the view's breakpoint "
        "| tokens sent (caller's / view's) | placed early / reduced next call |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    totals = [0.0, 0.0, 0.0]
    sent, moved = [0, 0], [0, 0]
    for path in sorted(args.traces.glob("*.json")):
        trace = json.loads(path.read_text())
        end, placed = views(trace, policy, counter, args.gap, False), views(trace, policy, counter, args.gap, True)
        bills = [bill(raw_views(trace, counter), args.gap), bill(end, args.gap), bill(placed, args.gap)]
        totals = [t + b for t, b in zip(totals, bills, strict=True)]
        tokens = [sum(v.total_tokens for v in end), sum(v.total_tokens for v in placed)]
        sent = [a + b for a, b in zip(sent, tokens, strict=True)]
        count = early(placed)
        moved = [a + b for a, b in zip(moved, count, strict=True)]
        print(
            f"| {trace['id']} | ${bills[0]:.3f} | {_versus(bills[1], bills[0])} | {_versus(bills[2], bills[0])} "
            f"| {tokens[0]:,} / {tokens[1]:,} | {count[0]} / {count[1]} |"
        )
    print(
        f"| **all** | ${totals[0]:.3f} | {_versus(totals[1], totals[0])} | {_versus(totals[2], totals[0])} "
        f"| {sent[0]:,} / {sent[1]:,} | {moved[0]} / {moved[1]} |"
    )
    return 0


def _versus(bill: float, raw: float) -> str:
    return f"${bill:.3f} ({bill / raw - 1:+.1%})" if raw else f"${bill:.3f}"


if __name__ == "__main__":
    sys.exit(main())
