"""Run the lab and write its report: docs/lab.md with its tables, and PNG plots beside it.

Every condition replays every trace and fixture through the service (`contextd.lab.replay`);
the figures are the metrics of `contextd.lab.metrics`, side by side, never one score. Where a
condition sends fewer tokens yet costs more with the prompt cache, the tables say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextd_client import Client

from contextd.engine.policy import PROVIDER_PRICES
from contextd.lab.conditions import CONDITIONS, oracle_metadata, policy_text
from contextd.lab.metrics import Quality, Summary, percentile, quality, summarize
from contextd.lab.replay import PROVIDERS, Run, replay

RAW = "A-raw"
_PROVIDER_NAMES = {"anthropic": "Anthropic", "openai": "OpenAI"}
FIXTURE_CONDITIONS = list(CONDITIONS)
TRACE_CONDITIONS = [c for c in CONDITIONS if c != "F-oracle"]  # real traces have no labels


@dataclass
class Results:
    traces: list[Mapping[str, Any]] = field(default_factory=list)
    runs: dict[tuple[str, str], Run] = field(default_factory=dict)
    """By (trace id, condition)."""
    gap: float = 30.0

    def conditions(self, trace_id: str) -> list[str]:
        return [c for (t, c) in self.runs if t == trace_id]

    def summary(self, trace_id: str, condition: str) -> Summary:
        trace = next(t for t in self.traces if t["id"] == trace_id)
        users = {i + 1 for i, m in enumerate(trace["messages"]) if m["role"] == "user"}
        return summarize(self.runs[trace_id, condition], self.runs[trace_id, RAW], users)

    def quality(self, trace_id: str, condition: str) -> Quality | None:
        trace = next(t for t in self.traces if t["id"] == trace_id)
        if "labels" not in trace:
            return None
        return quality(self.runs[trace_id, condition].worst, trace["labels"])

    def lost(self) -> int:
        return sum(1 for run in self.runs.values() for outcome in run.probes.values() if outcome == "lost")


def run(
    client: Client,
    traces: Iterable[Mapping[str, Any]],
    probes: Mapping[str, Sequence[Mapping[str, Any]]],
    conditions: Sequence[str],
    gap: float,
    *,
    at_once: bool = False,
) -> Results:
    """Replay each trace under each condition (and the raw one, which the others are measured
    against); `at_once`: every edit applies when found (see `policy_text`)."""
    results = Results(gap=gap)
    for trace in traces:
        results.traces.append(trace)
        for condition in [RAW, *(c for c in conditions if c != RAW)]:
            if condition == "F-oracle" and "labels" not in trace:
                continue
            metadata = oracle_metadata(trace["labels"]) if condition == "F-oracle" else None
            policy = policy_text(condition, trace.get("tools"), at_once=at_once)
            results.runs[trace["id"], condition] = replay(
                client, trace, condition, policy, probes=probes.get(trace["id"], ()), gap=gap, metadata=metadata
            )
    return results


# ------------------------------------------------------------------ tables


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _probes(counts: Mapping[str, int]) -> str:
    return f"{counts.get('visible', 0)} / {counts.get('recoverable', 0)} / {counts.get('lost', 0)}"


def _dollars(value: float) -> str:
    return f"${value:.3f}"


def replay_table(results: Results) -> str:
    """One row per trace and condition: tokens, reduction, cost, cache, breaks, probes, render time."""
    rows = []
    for trace in results.traces:
        for condition in results.conditions(trace["id"]):
            s = results.summary(trace["id"], condition)
            q = results.quality(trace["id"], condition)
            rows.append(
                [trace["id"], condition, f"{s.sent:,}", f"{s.reduction:.1%}", _dollars(s.cost["anthropic"]),
                 _dollars(s.cost["openai"]), s.breaks, f"{s.abstention:.0%}", _probes(s.probes),
                 f"{q.precision:.2f} / {q.recall:.2f} ({len(q.false_prunes)})" if q else "-",
                 f"{s.render_p50:.1f} / {s.render_p99:.1f}"]
            )  # fmt: skip
    header = [
        "trace", "condition", "tokens sent", "reduction", "Anthropic", "OpenAI", "prefix breaks", "abstained",
        "probes visible / recoverable / lost", "precision / recall (false prunes)", "render p50 / p99 ms",
    ]  # fmt: skip
    return _table(header, rows)


def _summed(results: Results, trace_ids: Sequence[str], condition: str) -> dict[str, Any]:
    """A condition's figures over several traces (sums; render times over all calls)."""
    out: dict[str, Any] = {"sent": 0, "raw": 0, "cost": Counter[str](), "raw_cost": Counter[str](), "breaks": 0}
    out.update(cache=Counter[str](), probes=Counter[str](), decisions=Counter[str](), renders=[], users=0)
    for trace_id in trace_ids:
        if (trace_id, condition) not in results.runs:
            continue
        run, raw = results.runs[trace_id, condition], results.runs[trace_id, RAW]
        s = results.summary(trace_id, condition)
        out["sent"] += s.sent
        out["raw"] += raw.sent
        out["breaks"] += s.breaks
        out["users"] += s.user_turns_reduced
        out["probes"].update(s.probes)
        out["decisions"].update(run.decisions)
        out["renders"] += [c.render_ms for c in run.calls]
        for provider in PROVIDERS:
            out["cost"][provider] += s.cost[provider]
            out["raw_cost"][provider] += raw.cost(provider)
        read, write, uncached = s.cache["anthropic"]
        out["cache"].update(read=read, write=write, uncached=uncached)
    return out


def _flag(summed: Mapping[str, Any]) -> str:
    """Negative results, said as such."""
    notes = []
    fewer = summed["sent"] < summed["raw"]
    for provider in PROVIDERS:
        if fewer and summed["cost"][provider] > summed["raw_cost"][provider] + 1e-9:
            notes.append(f"fewer tokens, **costs more than raw** on {_PROVIDER_NAMES[provider]}")
    if summed["probes"].get("lost"):
        notes.append("**loses probes**")
    if summed["users"]:
        notes.append(f"**{summed['users']} user turns reduced**")
    return "; ".join(notes)


def _condition_table(results: Results, trace_ids: Sequence[str], conditions: Sequence[str], labelled: bool) -> str:
    rows = []
    for condition in conditions:
        summed = _summed(results, trace_ids, condition)
        if not summed["raw"]:
            continue
        decided = sum(summed["decisions"].values())
        abstained = f"{summed['decisions']['abstain'] / decided:.0%}" if decided else "-"
        row = [condition, f"{summed['sent']:,}", f"{1 - summed['sent'] / summed['raw']:.1%}"]
        if labelled:  # what the rules find; their timing is off here, so no cost is shown
            qualities = [q for t in trace_ids if (q := results.quality(t, condition)) is not None]
            prunes = sum(q.prunes for q in qualities)
            false = sum(len(q.false_prunes) for q in qualities)
            oracle, taken = sum(q.oracle for q in qualities), sum(q.taken for q in qualities)
            precision = f"{1 - false / prunes:.2f}" if prunes else "1.00"
            rows.append([condition, prunes, false, precision, f"{taken / oracle:.2f}", *row[1:], abstained,
                         _probes(summed["probes"])])  # fmt: skip
            continue
        row += [
            f"{_dollars(summed['cost']['anthropic'])} ({_relative(summed, 'anthropic')})",
            f"{_dollars(summed['cost']['openai'])} ({_relative(summed, 'openai')})",
            f"{summed['cache']['read']:,} / {summed['cache']['write']:,} / {summed['cache']['uncached']:,}",
            summed["breaks"],
            abstained,
            _probes(summed["probes"]),
        ]
        rows.append([*row, _flag(summed)])
    if labelled:
        header = ["condition", "prunes", "false prunes", "precision", "recall vs oracle", "tokens sent", "reduction"]
        return _table([*header, "abstained", "probes vis. / rec. / lost"], rows)
    header = ["condition", "tokens sent", "reduction", "Anthropic, cached (vs raw)", "OpenAI, cached (vs raw)"]
    header += ["Anthropic cache read / write / uncached", "prefix breaks", "abstained", "probes vis. / rec. / lost"]
    return _table([*header, "notes"], rows)


def _relative(summed: Mapping[str, Any], provider: str) -> str:
    raw = summed["raw_cost"][provider]
    return f"{summed['cost'][provider] / raw - 1:+.1%}" if raw else "-"


def _false_prunes(results: Results, trace_ids: Sequence[str], conditions: Sequence[str]) -> str:
    rows = []
    for condition in conditions:
        categories: Counter[str] = Counter()
        for trace_id in trace_ids:
            q = results.quality(trace_id, condition)
            if q is None:
                continue
            trace = next(t for t in results.traces if t["id"] == trace_id)
            categories.update(trace["labels"][seq - 1]["category"] for seq in q.false_prunes)
        if categories:
            rows.append(
                [condition, sum(categories.values()), ", ".join(f"{c} {n}" for c, n in categories.most_common())]
            )
    return _table(["condition", "false prunes", "by the label's category"], rows) if rows else "None."


def _versus_masking(results: Results, trace_ids: Sequence[str]) -> str:
    rows = []
    for trace_id in trace_ids:
        default, masking = results.runs[trace_id, "default"], results.runs[trace_id, "masking"]
        raw = results.runs[trace_id, RAW]
        d, m = results.summary(trace_id, "default"), results.summary(trace_id, "masking")
        if default.sent <= masking.sent:
            why = "fewer tokens"
        else:
            hidden = {seq for seq, shown, _, _ in masking.final if shown != "full"}
            kept = {seq for seq, shown, _, _ in default.final if shown == "full"} & hidden
            tokens = sum(default.item_tokens.get(s, 0) for s in kept)
            why = (
                f"more tokens: masking hides {len(hidden)} outputs on age alone, {len(kept)} of them "
                f"({tokens:,} tokens) shown whole by the default, which prunes only on evidence; masking leaves "
                f"{m.probes.get('recoverable', 0)} probes behind handles (the default {d.probes.get('recoverable', 0)})"
            )
        if d.cost["anthropic"] > raw.cost("anthropic") + 1e-9:
            why += "; **the default costs more than raw here** (Anthropic)"
        rows.append(
            [trace_id, f"{default.sent:,}", f"{masking.sent:,}", _dollars(d.cost["anthropic"]),
             _dollars(m.cost["anthropic"]), _dollars(raw.cost("anthropic")), _probes(d.probes), _probes(m.probes), why]
        )  # fmt: skip
    header = ["trace", "default tokens", "masking tokens", "default $ (Anthropic)", "masking $", "raw $"]
    return _table([*header, "default probes", "masking probes", "verdict"], rows)


def _by_rule(results: Results, trace_ids: Sequence[str], condition: str) -> str:
    saved: Counter[str] = Counter()
    raw = 0
    for trace_id in trace_ids:
        saved.update(results.runs[trace_id, condition].saved_by_rule)
        raw += results.runs[trace_id, RAW].sent
    rows = [[rule, f"{tokens:,}", f"{tokens / raw:.1%}"] for rule, tokens in saved.most_common()]
    return _table(["rule", "tokens not sent (all calls, net of stand-ins)", "share of raw"], rows)


def _overhead(results: Results, trace_id: str) -> str:
    rows = []
    for condition in results.conditions(trace_id):
        renders = [c.render_ms for c in results.runs[trace_id, condition].calls]
        rows.append([condition, len(renders), f"{percentile(renders, 50):.1f}", f"{percentile(renders, 99):.1f}"])
    return _table(["condition", "calls", "RenderView p50 ms", "p99 ms"], rows)


# ------------------------------------------------------------------- plots


def _plots(results: Results, out: Path, longest: str, trace_ids: Sequence[str], fixture_ids: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    for condition in TRACE_CONDITIONS:
        calls = results.runs[longest, condition].calls
        axes.plot(range(1, len(calls) + 1), [c.tokens for c in calls], label=condition, linewidth=1.2)
    axes.set(xlabel="model call", ylabel="tokens sent", title=f"Tokens per call: {longest}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "tokens-per-call.png", dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(8, 5))
    for condition in TRACE_CONDITIONS:
        summed = _summed(results, trace_ids, condition)
        saved = summed["raw"] - summed["sent"]
        axes.scatter([saved], [summed["cost"]["anthropic"]], label=condition)
        axes.annotate(
            condition, (saved, summed["cost"]["anthropic"]), fontsize=8, xytext=(4, 4), textcoords="offset points"
        )
    axes.set(xlabel="tokens saved over all calls (vs raw)", ylabel="priced cost, Anthropic, with caching ($)")
    axes.set_title("Cost vs tokens saved, all traces")
    figure.tight_layout()
    figure.savefig(out / "cost-vs-saved.png", dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(9, 5))
    names = [c for c in FIXTURE_CONDITIONS if c != RAW]
    precision, recall = [], []
    for condition in names:
        qualities = [q for f in fixture_ids if (q := results.quality(f, condition)) is not None]
        prunes, false = sum(q.prunes for q in qualities), sum(len(q.false_prunes) for q in qualities)
        precision.append(1 - false / prunes if prunes else 1.0)
        recall.append(sum(q.taken for q in qualities) / max(1, sum(q.oracle for q in qualities)))
    positions = range(len(names))
    axes.bar([p - 0.2 for p in positions], precision, width=0.4, label="precision")
    axes.bar([p + 0.2 for p in positions], recall, width=0.4, label="recall vs oracle")
    axes.set_xticks(list(positions), names, rotation=30, ha="right")
    axes.set(ylim=(0, 1.05), title="Prune precision and recall on the fixtures")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "precision-recall.png", dpi=110)
    plt.close(figure)


# ------------------------------------------------------------------ report


def write(
    client: Client,
    traces: Sequence[Mapping[str, Any]],
    fixtures: Sequence[Mapping[str, Any]],
    probes: Mapping[str, Sequence[Mapping[str, Any]]],
    out: Path,
    *,
    gap: float,
    command: str,
) -> Results:
    results = run(client, fixtures, probes, FIXTURE_CONDITIONS, gap, at_once=True)
    traced = run(client, traces, probes, TRACE_CONDITIONS, gap)
    results.traces += traced.traces
    results.runs.update(traced.runs)
    trace_ids, fixture_ids = [t["id"] for t in traces], [f["id"] for f in fixtures]
    longest = max(traces, key=lambda t: len(t["messages"]))["id"]
    plots = out.parent / "lab"
    plots.mkdir(parents=True, exist_ok=True)
    _plots(results, plots, longest, trace_ids, fixture_ids)
    out.write_text(_document(results, command, trace_ids, fixture_ids, longest, plots.name))
    return results


def _document(
    results: Results, command: str, trace_ids: Sequence[str], fixture_ids: Sequence[str], longest: str, plots: str
) -> str:
    prices = "; ".join(
        f"{_PROVIDER_NAMES[name]}: input ${p.input}, cache write ${p.cache_write}, cache read ${p.cache_read} "
        f"per M tokens, TTL {p.ttl_seconds:g} s"
        for name, p in PROVIDER_PRICES.items()
        if name in PROVIDERS
    )
    default = _summed(results, trace_ids, "default")
    calls = len(results.runs[longest, "default"].calls)
    return f"""# Context Lab

Generated by `{command}`; do not edit by hand. Every figure below was measured by replaying
each trace call by call through a `contextd` service over gRPC (append the turns, render the
view before each assistant turn, as an agent does), once per condition
([contextd/lab/conditions.py](../contextd/lab/conditions.py)). The prompt cache is modelled
from the messages each call sent ([contextd/lab/cache.py](../contextd/lab/cache.py)): Anthropic
reads a whole earlier prompt (a breakpoint at the end of each call) and pays a write premium,
OpenAI reads the longest shared prefix in 128-token steps; nothing under 1,024 tokens is
cached; calls are {results.gap:g} s apart (the cache stays warm). Prices: {prices}.
Token figures are the service's own (cl100k_base). Render times are whole RenderView calls
seen by the client, on a shared 2-core machine.

Probes are facts needed late: **visible** in the last view, **recoverable** through a handle
the last view shows (fetched back with Retrieve), or **lost**.

## Fixtures: correctness against ground truth

{len(fixture_ids)} generated fixtures (`contextd-lab fixtures`, seeds in the command), every
message labelled (what a view must keep of it, what it needs, its category) with probes, and
traps an aggressive rule falls into: the same command with another output, two ranges of a
file with an edit between, an old output holding an id needed late. A prune is false when
the label keeps the item whole, keeps a residue and the item went behind a placeholder, or
keeps nothing but what it needs was pruned too ([contextd/lab/metrics.py](../contextd/lab/metrics.py)).
Here every condition applies what it finds at once (its policy prices the cache as saving
nothing), so precision and recall measure what the rules find, not when their timing lets
them apply; what the timing saves and costs is measured on the real traces below. Recall is
against the oracle's prunes (a duplicate pair counts once, whichever copy went).

{_condition_table(results, fixture_ids, FIXTURE_CONDITIONS, labelled=True)}

False prunes, by the category of what was pruned:

{_false_prunes(results, fixture_ids, FIXTURE_CONDITIONS)}

![precision and recall]({plots}/precision-recall.png)

## Real traces: what each condition sends and costs

The {len(trace_ids)} traces of `../shared/traces/` with their probes (`bench/probes/`).
Tokens and priced cost differ: an edit to what the cache holds makes the next call pay for
the rest of the prompt again, so a condition can send fewer tokens and cost more.

{_condition_table(results, trace_ids, TRACE_CONDITIONS, labelled=False)}

The default policy over all traces: {default["sent"]:,} tokens sent against {default["raw"]:,}
raw; Anthropic {_dollars(default["cost"]["anthropic"])} against {_dollars(default["raw_cost"]["anthropic"])} raw,
OpenAI {_dollars(default["cost"]["openai"])} against {_dollars(default["raw_cost"]["openai"])}.

### The default policy against observation masking, trace by trace

{_versus_masking(results, trace_ids)}

### What the default policy's rules saved

{_by_rule(results, trace_ids, "default")}

![tokens per call]({plots}/tokens-per-call.png)

![cost vs tokens saved]({plots}/cost-vs-saved.png)

## The service's overhead per model call

The longest trace, `{longest}` ({calls} calls): every RenderView call timed by the client.

{_overhead(results, longest)}

## Every replay

{replay_table(results)}
"""
