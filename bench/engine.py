"""Engine time of a render: cold (no previous render) and incremental (the
previous render's state, one item appended since), with a policy of 5 rules
(or, --workload default-unprunable, the default policy on a session it can
prune nothing of).

    python bench/engine.py [--items 1000] [--repeat 50] [--format openai_chat|anthropic_messages]
                           [--workload five-rules|default-unprunable]

Runs the pure engine in-process (contextd.engine.pipeline.render): no gRPC,
no database, so the figures are the engine's own work. Prints a Markdown
table and the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contextd.engine.model import Item, ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock  # noqa: E402
from contextd.engine.pipeline import Carry, RenderInput, RenderOutput, render  # noqa: E402
from contextd.engine.policy import default_policy, parse_policy  # noqa: E402
from contextd.engine.state import ViewState  # noqa: E402
from contextd.engine.tokens import TiktokenCounter  # noqa: E402
from contextd.engine.transforms import TransformRegistry  # noqa: E402
from contextd.engine.view import ViewFormat, ViewRequest  # noqa: E402
from tests.helpers import make_session, to_item  # noqa: E402

POLICY = """
evidence: {max_level: 4}
protection: {last_turns: 3, tools: ["memory_*"], sources: ["file:///repo/SPEC.md"]}
tools:
  read_file: {effect: read, source_arg: path}
  bash: {effect: volatile}
rules:
  - {name: old-bash, transform: mask, when: {roles: [tool], tools: {include: [bash]}, age_turns: {min: 40}}}
  - name: big-reads
    transform: mask
    when: {roles: [tool], tools: {include: [read_file]}, tokens: {min: 400}, age_turns: {min: 60}}
  - {name: tracebacks, transform: mask, when: {regex: "Traceback", age_turns: {min: 80}}}
  - {name: pressure, transform: mask, when: {roles: [tool], utilization: {min: 0.95}}}
  - {name: sources, transform: mask, when: {source_glob: "file:///tmp/*", age_turns: {min: 20}}}
"""

OUTPUT = (
    'Traceback (most recent call last):\n  File "src/app/parse.py", line 41, in parse_header\n'
    "    key, value = line.split(':', 1)\nValueError: not enough values to unpack (expected 2, got 1)\n"
)


def agent_session(n: int, call: Callable[[int], tuple[str, str, str]]) -> list[ItemContent]:
    """n items: a system prompt, a task, then tool calls and outputs; `call(k)` gives the
    k-th call's tool, command and output."""
    contents = [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("You are a coding agent."),)),
        ItemContent(role=Role.USER, content=(TextBlock("Fix the parser."),)),
    ]
    k = 0
    while len(contents) < n:
        k += 1
        tool, command, output = call(k)
        use = ToolUseBlock(f"c{k}", tool, json.dumps({"command": command}))
        contents.append(ItemContent(role=Role.ASSISTANT, content=(use,)))
        result = ToolResultBlock(f"c{k}", (TextBlock(output),), name=tool)
        contents.append(ItemContent(role=Role.TOOL, content=(result,)))
    return contents[:n]


def history(n: int) -> list[ItemContent]:
    """Reads of one file by two tools, outputs repeating (what the 5 rules act on)."""
    return agent_session(
        n,
        lambda k: ("bash" if k % 2 else "read_file", f"sed -n {k},{k + 40}p src/app/parse.py", OUTPUT * (1 + k % 4)),
    )


def unprunable(n: int) -> list[ItemContent]:
    """A bash agent's session the default policy can prune nothing of: reads of different
    files, every output its own."""
    return agent_session(
        n,
        lambda k: ("bash", f"sed -n '1,60p' src/module_{k}.py", f"# module {k}\n" + f"value_{k} = compute({k})\n" * 60),
    )


def stored(contents: list[ItemContent]) -> list[Item]:
    """The items as an append would store them (the history is built valid, so not re-checked)."""
    return [to_item(c, seq) for seq, c in enumerate(contents, start=1)]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--format", choices=[f.value for f in ViewFormat], default=ViewFormat.OPENAI_CHAT.value)
    parser.add_argument("--workload", choices=["five-rules", "default-unprunable"], default="five-rules")
    args = parser.parse_args()

    counter, registry = TiktokenCounter(), TransformRegistry.default()
    if args.workload == "five-rules":
        policy = parse_policy(POLICY, registry)
        assert len(policy.rules) == 5
        contents = history(args.items + 1)
    else:  # the default policy's strategies, on a session they can prune nothing of
        policy = default_policy()
        contents = unprunable(args.items + 1)
    items = stored(contents)
    request = ViewRequest(ViewFormat(args.format), budget_tokens=0)

    def run(n: int, state: ViewState, now: float, carry: Carry | None = None) -> tuple[float, RenderOutput]:
        inp = RenderInput(make_session(n), items[:n], policy, request, counter, registry, state, now, carry=carry)
        started = time.perf_counter()
        out = render(inp)
        return (time.perf_counter() - started) * 1000, out

    # Cold: no previous render. Incremental: one item appended since the
    # previous render (itself a render after an append, as in a running
    # session), 60 s later (the cache still warm); with the carry of that
    # render (as the service keeps it), and without (as after a restart, or
    # when another replica made the previous render).
    cold = [run(args.items, ViewState(), 0.0)[0] for _ in range(max(5, args.repeat // 5))]
    _, before = run(args.items - 1, ViewState(), 0.0)
    _, previous = run(args.items, before.state, 30.0, before.carry)
    assert previous.carry is not None
    incremental = [run(args.items + 1, previous.state, 60.0, previous.carry)[0] for _ in range(args.repeat)]
    uncarried = [run(args.items + 1, previous.state, 60.0)[0] for _ in range(args.repeat)]

    print(f"command: python bench/engine.py {' '.join(sys.argv[1:])}".rstrip())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine}, {time.strftime('%Y-%m-%d')}; view format: {args.format}; workload: {args.workload}")
    print()
    rules = f"{len(policy.rules)} rules"
    print("| render | items | p50 | p99 | mean |")
    print("| --- | --- | --- | --- | --- |")
    for name, samples, size in (
        (f"cold (no previous render), {rules}", cold, args.items),
        (f"incremental (previous state and carry, 1 item appended since), {rules}", incremental, args.items),
        (f"incremental without the carry (previous state only), {rules}", uncarried, args.items),
    ):
        print(
            f"| {name} | {size:,} | {percentile(samples, 50):.2f} ms | {percentile(samples, 99):.2f} ms "
            f"| {statistics.mean(samples):.2f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
