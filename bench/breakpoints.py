"""What Anthropic would bill if the cache breakpoint went before the outputs the next call compresses.

    python bench/breakpoints.py [--traces ../shared/traces] [--policy FILE] [--gap SECONDS]

A simulation over the same prompts, not a feature: the view does not place
breakpoints today. An agent puts one at the end of each call, so an output
the next call compresses is first written to the cache whole (at the write
price), then written again compressed. With the breakpoint placed before
the newest outputs, when the next call shows one of them reduced, the call
sends them uncached (at the input price) and the cache holds the prompt up
to them only; the next call writes the compressed form as it does now.

For every trace in ../shared/traces/ (replayed in-process with the default
policy, as bench/traces.py does, `--gap` seconds between calls), it prints
the Anthropic bill (the lab's prompt-cache model, contextd/lab/cache.py) of
the raw history, of the policy's prompts with a breakpoint at the end of
each call, and of the same prompts with the breakpoint moved so. The engine's
decisions are the same in the three: what it would choose knowing it could
place the breakpoint is not measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from traces import contents  # noqa: E402

from contextd.engine.model import Representation, Role  # noqa: E402
from contextd.engine.pipeline import RenderInput, identity_view, render  # noqa: E402
from contextd.engine.policy import Policy, default_policy, parse_policy  # noqa: E402
from contextd.engine.state import ViewState  # noqa: E402
from contextd.engine.tokens import TiktokenCounter  # noqa: E402
from contextd.engine.transforms import TransformRegistry  # noqa: E402
from contextd.engine.view import View, ViewFormat, ViewRequest  # noqa: E402
from contextd.lab.cache import PromptCache, Segment  # noqa: E402
from contextd.lab.replay import _segments  # noqa: E402
from tests.helpers import make_session, to_item  # noqa: E402

REQUEST = ViewRequest(ViewFormat.OPENAI_CHAT)


def prompt(view: View) -> tuple[Segment, ...]:
    return _segments(json.loads(view.messages_json), view.items, view.framing_tokens)


def views(trace: dict[str, Any], policy: Policy, counter: TiktokenCounter, gap: float) -> list[tuple[View, View, int]]:
    """Per model call: the policy's view, the raw history's, and where the newest outputs start
    (the index of the first item after the last assistant item)."""
    registry = TransformRegistry.default()
    items = [to_item(c, seq) for seq, c in enumerate(contents(trace), start=1)]
    state, carry, now, out = ViewState(), None, 0.0, []
    for end in (i for i, item in enumerate(items) if item.role is Role.ASSISTANT):
        prefix = items[:end]
        session = make_session(len(prefix))
        rendered = render(RenderInput(session, prefix, policy, REQUEST, counter, registry, state, now, carry=carry))
        state, carry, now = rendered.state, rendered.carry, now + gap
        newest = max((i + 1 for i, item in enumerate(prefix) if item.role is Role.ASSISTANT), default=0)
        out.append((rendered.view, identity_view(session, prefix, REQUEST, counter), newest))
    return out


def cached_upto(view: View, newest: int, following: View | None) -> int | None:
    """The message to put the breakpoint before: the first of the newest outputs, when the next
    call shows one of them reduced (None: at the end, as an agent puts it)."""
    if following is None:
        return None
    later = {shown.seq: shown.representation for shown in following.items}
    fresh = [shown for shown in view.items if shown.seq > newest]
    if any(later.get(shown.seq, Representation.FULL) is not Representation.FULL for shown in fresh):
        return min(shown.message_index for shown in fresh)
    return None


class BreakpointCache(PromptCache):
    """The lab's Anthropic cache, with the breakpoint of a call placed before message `upto`."""

    def send(self, segments: Sequence[Segment], at: float, upto: int | None) -> float:
        if upto is None:
            return self.call(segments, at).dollars
        head = self.call(segments[:upto], at)  # cached up to the breakpoint, as any call is
        rest = sum(s.tokens for s in segments[upto:])
        return head.dollars + rest * self.prices.input / 1_000_000


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
    print("| trace | raw | policy, breakpoint at the end | policy, breakpoint before outputs compressed next |")
    print("| --- | --- | --- | --- |")
    totals = [0.0, 0.0, 0.0]
    for path in sorted(args.traces.glob("*.json")):
        trace = json.loads(path.read_text())
        calls = views(trace, policy, counter, args.gap)
        raw, end, before = PromptCache("anthropic"), PromptCache("anthropic"), BreakpointCache("anthropic")
        bills = [0.0, 0.0, 0.0]
        for n, (view, whole, newest) in enumerate(calls):
            at = n * args.gap
            following = calls[n + 1][0] if n + 1 < len(calls) else None
            bills[0] += raw.call(prompt(whole), at).dollars
            bills[1] += end.call(prompt(view), at).dollars
            bills[2] += before.send(prompt(view), at, cached_upto(view, newest, following))
        totals = [t + b for t, b in zip(totals, bills, strict=True)]
        print(f"| {trace['id']} | ${bills[0]:.3f} | {_versus(bills[1], bills[0])} | {_versus(bills[2], bills[0])} |")
    print(f"| **all** | ${totals[0]:.3f} | {_versus(totals[1], totals[0])} | {_versus(totals[2], totals[0])} |")
    return 0


def _versus(bill: float, raw: float) -> str:
    return f"${bill:.3f} ({bill / raw - 1:+.1%})" if raw else f"${bill:.3f}"


if __name__ == "__main__":
    sys.exit(main())
