"""Replay real agent traces call by call and count what each model call is sent.

    python bench/traces.py [--traces ../shared/traces] [--probes bench/probes] [--policy FILE]
                           [--gap SECONDS] [--caller-breakpoint] [--composition]

For every trace (the neutral format of ../shared/traces/README.md): append
the messages in order and, before each assistant message (a model call),
render the view as an agent would, from the previous render's state and
carry, --gap seconds after it (30 by default: the prompt cache warm, so
edits to what was sent are priced and may wait; past the cache's TTL every
call finds it cold, and what is eligible applies at once), letting the view
place the prompt-cache breakpoint (with --caller-breakpoint the agent puts it
at the end of each call, and the engine prices edits so). It runs the
engine in-process, as the service does under its lock, with the default
policy unless --policy names another. The same through a running service,
over gRPC, with the prompt cache priced: `contextd-lab replay` (the lab).

Prints, per trace and in total: tokens sent over all calls with the policy
and with the raw history, the reduction, the median time of a render (the
engine's own), what each rule removed (tokens not
sent, summed over calls, net of what stands in for them), and the probes
(facts from early turns needed late; bench/probes/<trace>.json): visible in
the final view, recoverable through a handle it shows, or lost. And at every
call, the identifiers the model's answer in the trace wrote that the history
before the call held, and those of them the call's view hid (listed at the end):
what an agent shown that view would have had to fetch back, or do without.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from contextd.engine.codec import canonical_json, item_to_json  # noqa: E402
from contextd.engine.model import Item, ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock  # noqa: E402
from contextd.engine.pipeline import RenderInput, identity_view, render  # noqa: E402
from contextd.engine.placeholders import handle_of  # noqa: E402
from contextd.engine.policy import Policy, default_policy, parse_policy  # noqa: E402
from contextd.engine.state import ViewState  # noqa: E402
from contextd.engine.tokens import TiktokenCounter, block_tokens  # noqa: E402
from contextd.engine.transforms import TransformRegistry  # noqa: E402
from contextd.engine.view import ViewFormat, ViewRequest  # noqa: E402
from contextd_lab.replay import answer_terms, used_and_hidden, view_text, written  # noqa: E402
from tests.helpers import make_session, to_item  # noqa: E402


def contents(trace: dict[str, Any]) -> list[ItemContent]:
    """The trace's messages as items (reasoning text is left out: providers do not take it back)."""
    out: list[ItemContent] = []
    for message in trace["messages"]:
        role, text = Role(message["role"]), message.get("content") or ""
        if role is Role.TOOL:
            result = ToolResultBlock(
                message["tool_call_id"], (TextBlock(text),), bool(message.get("is_error")), message.get("name", "")
            )
            out.append(ItemContent(role=role, content=(result,)))
            continue
        blocks: list[Any] = [TextBlock(text)] if text else []
        for call in message.get("tool_calls") or ():
            blocks.append(ToolUseBlock(call["id"], call["name"], json.dumps(call["arguments"])))
        out.append(ItemContent(role=role, content=tuple(blocks) or (TextBlock("(empty)"),)))
    return out


@dataclass
class Replay:
    trace_id: str
    calls: int = 0
    sent: int = 0
    raw: int = 0
    engine_ms: list[float] = field(default_factory=list)
    by_rule: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    final_view: str = ""
    """The messages (and system) of the view at the end, as sent."""
    items: list[Item] = field(default_factory=list)
    used: int = 0
    hidden: list[tuple[int, str]] = field(default_factory=list)
    """(call, identifier): what a call's answer used from the history that its view did not show."""


def replay(
    trace: dict[str, Any],
    policy: Policy,
    counter: TiktokenCounter,
    registry: TransformRegistry,
    gap: float,
    place_breakpoint: bool = True,
) -> Replay:
    items = [to_item(c, seq) for seq, c in enumerate(contents(trace), start=1)]
    request = ViewRequest(ViewFormat.OPENAI_CHAT, place_breakpoint=place_breakpoint)
    out = Replay(trace["id"], items=items)
    state, carry, now = ViewState(), None, 0.0
    ends = [i for i, m in enumerate(trace["messages"]) if m["role"] == "assistant"] + [len(items)]
    for end in ends:  # before each model call, and the view at the end
        prefix = items[:end]
        session = make_session(len(prefix))
        started = time.perf_counter()
        rendered = render(RenderInput(session, prefix, policy, request, counter, registry, state, now, carry=carry))
        out.engine_ms.append((time.perf_counter() - started) * 1000)
        state, carry, now = rendered.state, rendered.carry, now + gap
        out.decisions.update(c.decision.value for c in rendered.certificates)
        if end == len(items):
            out.final_view = rendered.view.messages_json + rendered.view.system_json
            break
        history = "\n".join(written(m) for m in trace["messages"][:end])
        shown = view_text(json.loads(rendered.view.messages_json), json.loads(rendered.view.system_json or "null"))
        used, hidden = used_and_hidden(answer_terms(trace["messages"][end]), history, shown)
        out.used += used
        out.hidden += [(out.calls, term) for term in hidden]
        out.calls += 1
        out.sent += rendered.view.total_tokens
        out.raw += identity_view(session, prefix, ViewRequest(ViewFormat.OPENAI_CHAT), counter).total_tokens
        rule_of = {a.edit.seq: a.rule for a in state.applied if hasattr(a.edit, "seq")}
        for shown in rendered.view.items:
            if shown.seq in rule_of:
                out.by_rule[rule_of[shown.seq]] += prefix[shown.seq - 1].token_count - shown.tokens
    return out


def check_probes(result: Replay, probes: Sequence[dict[str, Any]]) -> Counter[str]:
    """Each probe's answer: visible in the final view, behind a handle the view shows, or lost."""
    view = result.final_view
    by_handle = {handle_of(item): item for item in result.items}
    shown_handles = {h for h in by_handle if h in view}
    outcome: Counter[str] = Counter()
    for probe in probes:
        answer = probe["answer"]
        if json.dumps(answer)[1:-1] in view:
            outcome["visible"] += 1
        elif any(
            answer in canonical_json(item_to_json(by_handle[h])).decode() or _text(by_handle[h], answer)
            for h in shown_handles
        ):
            outcome["recoverable"] += 1
        else:
            outcome["lost"] += 1
            print(f"  LOST: {probe['kind']} {answer!r}")
    return outcome


def _text(item: Item, answer: str) -> bool:
    for block in item.content:
        if isinstance(block, TextBlock) and answer in block.text:
            return True
        if isinstance(block, ToolResultBlock) and any(
            isinstance(p, TextBlock) and answer in p.text for p in block.content
        ):
            return True
        if isinstance(block, ToolUseBlock) and answer in block.input_json:
            return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--probes", type=Path, default=ROOT / "bench" / "probes")
    parser.add_argument("--policy", type=Path)
    parser.add_argument(
        "--gap", type=float, default=30.0, help="seconds between calls (past the cache TTL: every call finds it cold)"
    )
    parser.add_argument(
        "--caller-breakpoint",
        action="store_true",
        help="the agent puts the cache breakpoint at the end of each call (by default the view places it)",
    )
    parser.add_argument(
        "--composition", action="store_true", help="print where the raw tokens sent are (by kind of message), then stop"
    )
    args = parser.parse_args()
    if args.composition:
        return composition(args.traces)
    return _run(args)


def composition(traces: Path) -> int:
    """Where the tokens a raw history sends over all calls are: each message's tokens times
    the number of model calls that send it, by kind of message, over all the traces."""
    counter = TiktokenCounter()
    sent: Counter[str] = Counter()
    for path in sorted(traces.glob("*.json")):
        items = [to_item(c, seq) for seq, c in enumerate(contents(json.loads(path.read_text())), start=1)]
        calls = [i for i, item in enumerate(items) if item.role is Role.ASSISTANT]
        for i, item in enumerate(items):
            times = len(calls) - bisect.bisect_right(calls, i)  # the calls after it send it
            if item.role is Role.TOOL:
                kind = "tool outputs of 200 tokens or more" if item.token_count >= 200 else "smaller tool outputs"
                sent[kind] += times * item.token_count
            elif item.role is Role.ASSISTANT:
                calls_tokens = sum(block_tokens(b, counter) for b in item.tool_uses)
                sent["assistant: tool calls"] += times * calls_tokens
                sent["assistant: text"] += times * (item.token_count - calls_tokens)
            else:
                sent[f"{item.role.value} messages"] += times * item.token_count
    print("command: python bench/traces.py --composition\n")
    print("| messages | tokens sent over all calls (raw) | share |\n| --- | --- | --- |")
    total = sum(sent.values())
    for kind, tokens in sent.most_common():
        print(f"| {kind} | {tokens:,} | {tokens / total:.1%} |")
    return 0


def _run(args: argparse.Namespace) -> int:
    counter, registry = TiktokenCounter(), TransformRegistry.default()
    policy = parse_policy(args.policy.read_text(), registry) if args.policy else default_policy()
    print(f"command: python bench/traces.py {' '.join(sys.argv[1:])}".rstrip())
    where = f"in-process, {args.gap:g} s between calls"
    where += "; the agent's breakpoint at the end of each call" if args.caller_breakpoint else "; the view's breakpoint"
    print(f"policy: {policy.version} ({args.policy or 'the default policy'}); {where}\n")
    rows, totals, rules, probes_total, decisions = [], Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    hidden: list[tuple[str, int, str]] = []
    for path in sorted(args.traces.glob("*.json")):
        trace = json.loads(path.read_text())
        result = replay(trace, policy, counter, registry, args.gap, not args.caller_breakpoint)
        probe_file = args.probes / f"{trace['id']}.json"
        probes = json.loads(probe_file.read_text())["probes"] if probe_file.exists() else []
        kept = check_probes(result, probes)
        probes_total.update(kept)
        totals.update(sent=result.sent, raw=result.raw, calls=result.calls, used=result.used)
        totals["hidden"] += len(result.hidden)
        hidden += [(trace["id"], call, term) for call, term in result.hidden]
        rules.update(result.by_rule)
        decisions.update(result.decisions)
        median = sorted(result.engine_ms)[len(result.engine_ms) // 2]
        rows.append(
            f"| {trace['id']} | {result.calls} | {result.raw:,} | {result.sent:,} | "
            f"{1 - result.sent / result.raw:.1%} | {median:.2f} ms | "
            f"{kept['visible']} / {kept['recoverable']} / {kept['lost']} | {len(result.hidden)} / {result.used:,} |"
        )
    columns = ["trace", "calls", "tokens sent, raw", "tokens sent, policy", "reduction", "render p50"]
    columns += ["probes visible / recoverable / lost", "identifiers the next answer wrote: hidden / in the history"]
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    print("\n".join(rows))
    print(
        f"| **all** | {totals['calls']} | {totals['raw']:,} | {totals['sent']:,} | "
        f"{1 - totals['sent'] / totals['raw']:.1%} | | "
        f"{probes_total['visible']} / {probes_total['recoverable']} / {probes_total['lost']} | "
        f"{totals['hidden']} / {totals['used']:,} |"
    )
    print("\n| rule | tokens not sent (over all calls) | share of raw |")
    print("| --- | --- | --- |")
    for rule, saved in rules.most_common():
        print(f"| {rule} | {saved:,} | {saved / totals['raw']:.1%} |")
    print("\ndecisions certified: " + ", ".join(f"{d} {n}" for d, n in sorted(decisions.items())))
    if hidden:
        print("\nidentifiers a call's answer wrote that its view hid (trace, call: identifiers):")
        by_call: dict[tuple[str, int], list[str]] = {}
        for trace_id, call, term in hidden:
            by_call.setdefault((trace_id, call), []).append(term)
        for (trace_id, call), terms in by_call.items():
            print(f"  {trace_id}, call {call}: {', '.join(terms)}")
    return 1 if probes_total["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
