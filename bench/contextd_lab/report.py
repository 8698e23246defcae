"""Run the lab and write its report: docs/lab.md with its tables, and PNG plots beside it.

Every condition replays every trace and fixture through the service (`contextd_lab.replay`);
the figures are the metrics of `contextd_lab.metrics`, side by side, never one score. Where a
condition sends fewer tokens yet costs more with the prompt cache, the tables say so.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from contextd.engine.policy import PROVIDER_PRICES, default_policy
from contextd_client import Client
from contextd_lab.cache import RULES, PromptCache
from contextd_lab.conditions import (
    ANY_PREFIX,
    CALLER_BREAKPOINT,
    CONDITIONS,
    DEFAULT_VARIANTS,
    oracle_metadata,
    policy_text,
)
from contextd_lab.headroom import CONDITION as HEADROOM
from contextd_lab.headroom import HeadroomProxy
from contextd_lab.metrics import Quality, Summary, percentile, quality, summarize
from contextd_lab.replay import PROVIDERS, Run, message_text, replay

RAW = "A-raw"
_PROBES = "probes vis. / rec. / lost at the end (of them, only in tool outputs); when used"
_USED = "identifiers the next answer wrote: hidden / in the history"
_PROVIDER_NAMES = {"anthropic": "Anthropic", "openai": "OpenAI"}
FIXTURE_CONDITIONS = list(CONDITIONS)
TRACE_CONDITIONS = [c for c in CONDITIONS if c != "F-oracle"]  # real traces have no labels
PEERS = (HEADROOM,)
"""Known systems the lab can run in the loop beside the conditions (`write`'s `peers`)."""


def ran(results: Results, conditions: Sequence[str]) -> list[str]:
    """`conditions`, and the peers that ran in `results`."""
    peers = {c for _, c in results.runs if c in PEERS}
    return [*conditions, *(p for p in PEERS if p in peers)]


@dataclass
class Results:
    traces: list[Mapping[str, Any]] = field(default_factory=list)
    runs: dict[tuple[str, str], Run] = field(default_factory=dict)
    """By (trace id, condition)."""
    gap: float = 30.0
    at_risk: dict[str, list[bool]] = field(default_factory=dict)
    """By trace id, for each probe: whether its answer is only in tool outputs (what rules prune);
    the others sit in user, system or assistant text as well, which tool-output rules never touch."""

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
        run = self.runs[trace_id, condition]
        return quality(run.worst, trace["labels"], run.pruned_at, run.shown_at)

    def lost(self) -> int:
        """Probes lost, at the end or when used."""
        return sum(1 for run in self.runs.values() for outcome in [*run.probes, *run.needed] if outcome == "lost")

    def risky(self, trace_id: str, condition: str) -> Counter[str]:
        """The outcomes of the probes whose answer is only in tool outputs."""
        risky = self.at_risk.get(trace_id, [])
        return Counter(o for o, r in zip(self.runs[trace_id, condition].probes, risky, strict=True) if r)


def run(
    client: Client,
    traces: Iterable[Mapping[str, Any]],
    probes: Mapping[str, Sequence[Mapping[str, Any]]],
    conditions: Sequence[str],
    gap: float,
    *,
    at_once: bool = False,
    into: Results | None = None,
) -> Results:
    """Replay each trace under each condition (and the raw one, which the others are measured
    against), adding to `into` if given; `at_once`: every edit applies when found (see `policy_text`).
    The condition `headroom` sends each call through headroom-ai's proxy (contextd_lab/headroom.py)."""
    results = into or Results(gap=gap)
    with HeadroomProxy() if HEADROOM in conditions else nullcontext() as peer:
        for trace in traces:
            results.traces.append(trace)
            results.at_risk[trace["id"]] = [_only_in_outputs(trace, p["answer"]) for p in probes.get(trace["id"], ())]
            for condition in [RAW, *(c for c in conditions if c != RAW)]:
                if condition == "F-oracle" and "labels" not in trace:
                    continue
                metadata = oracle_metadata(trace["labels"]) if condition == "F-oracle" else None
                policy = policy_text(RAW if condition == HEADROOM else condition, trace.get("tools"), at_once=at_once)
                results.runs[trace["id"], condition] = replay(
                    client,
                    trace,
                    condition,
                    policy,
                    probes=probes.get(trace["id"], ()),
                    gap=gap,
                    metadata=metadata,
                    place_breakpoint=condition not in CALLER_BREAKPOINT and condition != HEADROOM,
                    peer=peer if condition == HEADROOM else None,
                )
    return results


def _only_in_outputs(trace: Mapping[str, Any], answer: str) -> bool:
    escaped = json.dumps(answer)[1:-1]  # as it stands inside JSON arguments
    return not any(
        answer in text or escaped in text
        for text in (message_text(m) for m in trace["messages"] if m["role"] != "tool")
    )


# ------------------------------------------------------------------ tables


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _probes(counts: Mapping[str, int]) -> str:
    return f"{counts.get('visible', 0)} / {counts.get('recoverable', 0)} / {counts.get('lost', 0)}"


def _dollars(value: float) -> str:
    return f"${value:.3f}"


def records(results: Results) -> list[dict[str, Any]]:
    """Every replay's figures as plain data (one record per trace and condition), for tools
    that track them from run to run."""
    out = []
    for trace in results.traces:
        for condition in results.conditions(trace["id"]):
            s = results.summary(trace["id"], condition)
            q = results.quality(trace["id"], condition)
            record: dict[str, Any] = {"trace": trace["id"], "condition": condition, **asdict(s)}
            record.update(probes=dict(s.probes), needed=dict(s.needed), cost=dict(s.cost), cache=dict(s.cache))
            if q is not None:
                record.update(
                    prunes=q.prunes,
                    false_prunes=list(q.false_prunes),
                    precision=q.precision,
                    recall=q.recall,
                    by_category=dict(q.by_category),
                )
            out.append(record)
    return out


def replay_table(results: Results) -> str:
    """One row per trace and condition: tokens, reduction, cost, cache, breaks, probes, render time."""
    rows = []
    for trace in results.traces:
        for condition in results.conditions(trace["id"]):
            s = results.summary(trace["id"], condition)
            q = results.quality(trace["id"], condition)
            rows.append(
                [trace["id"], condition, f"{s.sent:,}", f"{s.reduction:.1%}", _dollars(s.cost["anthropic"]),
                 _dollars(s.cost["openai"]), s.breaks, f"{s.abstention:.0%} / {s.no_gain:.0%}", _probes(s.probes),
                 f"{q.precision:.2f} / {q.recall:.2f} ({len(q.false_prunes)})" if q else "-",
                 f"{s.render_p50:.1f} / {s.render_p99:.1f}"]
            )  # fmt: skip
    header = [
        "trace", "condition", "tokens sent", "reduction", "Anthropic", "OpenAI", "prefix breaks",
        "abstained / no gain",
        "probes visible / recoverable / lost", "precision / recall (false prunes)", "render p50 / p99 ms",
    ]  # fmt: skip
    return _table(header, rows)


def _summed(results: Results, trace_ids: Sequence[str], condition: str) -> dict[str, Any]:
    """A condition's figures over several traces (sums; render times over all calls)."""
    out: dict[str, Any] = {"sent": 0, "raw": 0, "cost": Counter[str](), "raw_cost": Counter[str](), "breaks": 0}
    out.update(cache=Counter[str](), probes=Counter[str](), decisions=Counter[str](), renders=[], users=0)
    out.update(radius=0, divergence=0.0, saved=Counter[str](), risky=Counter[str](), compressed=0, full=0)
    out.update(needed=Counter[str](), used=0, hidden=0)
    for trace_id in trace_ids:
        if (trace_id, condition) not in results.runs:
            continue
        run, raw = results.runs[trace_id, condition], results.runs[trace_id, RAW]
        s = results.summary(trace_id, condition)
        out["sent"] += s.sent
        out["raw"] += raw.sent
        out["breaks"] += s.breaks
        out["radius"] += s.radius
        out["divergence"] += s.first_divergence * s.breaks
        out["saved"].update(run.saved_by_rule)
        out["users"] += s.user_turns_reduced
        out["probes"].update(s.probes)
        out["needed"].update(s.needed)
        out["used"] += s.used
        out["hidden"] += s.hidden
        out["risky"].update(results.risky(trace_id, condition))
        out["compressed"] += len(run.compressed)
        trace = next(t for t in results.traces if t["id"] == trace_id)
        if "labels" in trace:
            out["full"] += sum(1 for seq in run.compressed if trace["labels"][seq - 1]["keep"] == "full")
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
    if summed["probes"].get("lost") or summed["needed"].get("lost"):
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
        abstained = "-"
        if decided:
            abstained = (
                f"{summed['decisions']['abstain'] / decided:.0%} / {summed['decisions']['no_gain'] / decided:.0%}"
            )
        probes = f"{_probes(summed['probes'])} ({_probes(summed['risky'])})"
        if sum(summed["needed"].values()):
            probes += f"; when used: {_probes(summed['needed'])}"
        row = [condition, f"{summed['sent']:,}", f"{1 - summed['sent'] / summed['raw']:.1%}"]
        if labelled:  # what the rules find; their timing is off here, so no cost is shown
            qualities = _qualities(results, trace_ids, condition)
            prunes, false = _prunes(qualities)
            oracle, taken = sum(q.oracle for q in qualities), sum(q.taken for q in qualities)
            precision = f"{_precision(prunes, false):.2f}"
            categories: Counter[str] = Counter()
            for q in qualities:
                categories.update(q.by_category)
            pruned = ", ".join(f"{c} {n}" for c, n in sorted(categories.items())) or "-"
            recall = f"{taken / oracle:.2f}" if oracle else "-"
            rows.append([condition, prunes, false, precision, recall, pruned,
                         f"{summed['compressed']} ({summed['full']})", *row[1:], abstained, probes,
                         summed["users"]])  # fmt: skip
            continue
        row += [
            f"{_dollars(summed['cost']['anthropic'])} ({_relative(summed, 'anthropic')})",
            f"{_dollars(summed['cost']['openai'])} ({_relative(summed, 'openai')})",
            f"{summed['cache']['read']:,} / {summed['cache']['write']:,} / {summed['cache']['uncached']:,}",
            f"{summed['breaks']} ({summed['divergence'] / max(1, summed['breaks']):,.0f} / {summed['radius']:,})",
            abstained,
            probes,
            f"{summed['hidden']} / {summed['used']:,}",
        ]
        rows.append([*row, _flag(summed)])
    if labelled:
        header = ["condition", "prunes", "false prunes", "precision", "recall vs oracle", "pruned, by category"]
        header += ["compressed (labelled full)", "tokens sent", "reduction", "abstained / no gain", _PROBES]
        return _table([*header, "user turns not whole"], rows)
    header = ["condition", "tokens sent", "reduction", "Anthropic, cached (vs raw)", "OpenAI, cached (vs raw)"]
    header += ["Anthropic cache read / write / uncached", "prefix breaks (mean first divergence / radius, tokens)"]
    header += ["abstained / no gain", _PROBES, _USED]
    return _table([*header, "notes"], rows)


def frontier(points: Mapping[str, tuple[float, float]]) -> dict[str, list[str]]:
    """Per condition, those that dominate it on (cost, hidden): no worse on either and better on
    one. A condition none dominates sits on the Pareto frontier."""
    return {
        name: sorted(
            other
            for other, (cost, hidden) in points.items()
            if other != name
            and cost <= mine[0] + 1e-12
            and hidden <= mine[1]
            and (cost < mine[0] - 1e-12 or hidden < mine[1])
        )
        for name, mine in points.items()
    }


def _pareto_points(
    results: Results, ids: Sequence[str], conditions: Sequence[str], provider: str
) -> dict[str, tuple[float, float]]:
    """condition -> (priced cost, identifiers the next answer used that the view hid), over `ids`."""
    out = {}
    for condition in conditions:
        summed = _summed(results, ids, condition)
        if summed["raw"]:
            out[condition] = (summed["cost"][provider], float(summed["hidden"]))
    return out


def _pareto(results: Results, ids: Sequence[str], conditions: Sequence[str]) -> str:
    """Cost against hidden facts, per provider, with what dominates each condition."""
    rows: dict[str, list[str]] = {}
    for provider in PROVIDERS:
        points = _pareto_points(results, ids, conditions, provider)
        beaten = frontier(points)
        for condition, (cost, hidden) in points.items():
            row = rows.setdefault(condition, [condition, f"{hidden:,.0f}"])
            verdict = "**on the frontier**" if not beaten[condition] else "dominated by " + _names(beaten[condition])
            row += [_dollars(cost), verdict]
    header = ["condition", "identifiers hidden", "Anthropic", "Anthropic: frontier", "OpenAI", "OpenAI: frontier"]
    return _table(header, rows.values())


def _names(conditions: Iterable[str]) -> str:
    """Condition names in a cell: each in backticks, as some names hold commas."""
    return ", ".join(f"`{c}`" for c in conditions)


def _qualities(results: Results, ids: Sequence[str], condition: str) -> list[Quality]:
    return [q for t in ids if (t, condition) in results.runs and (q := results.quality(t, condition)) is not None]


def _prunes(qualities: Sequence[Quality]) -> tuple[int, int]:
    """Prunes and false prunes, over labelled replays."""
    return sum(q.prunes for q in qualities), sum(len(q.false_prunes) for q in qualities)


def _precision(prunes: int, false: int) -> float:
    """True prunes / prunes (1.0 when nothing was pruned)."""
    return 1 - false / prunes if prunes else 1.0


TARGET_SAVINGS = {"anthropic": -0.12, "openai": -0.15}
"""The default's priced cost over all traces against raw's, at most (the lab's targets)."""
TARGET_HIDDEN = 0.003
"""Identifiers the next answer used that the default's views hid, at most this share of those used."""
TARGET_PRECISION = ("B-duplicates", "C-errors", "D-superseded", "default")
"""The conditions whose prunes on the fixtures must all be right (precision 1.00)."""


def _targets(results: Results, trace_ids: Sequence[str], fixture_ids: Sequence[str], conditions: Sequence[str]) -> str:
    """Each target of the default on the real traces and the fixtures: the figure measured, met or
    not, and where one is not, how near the conditions the lab ran come within the others. Each
    verdict is of the figure as printed beside it (a ratio to two decimals of a percent)."""
    rows: list[list[str]] = []
    default = _summed(results, trace_ids, "default")
    for provider in PROVIDERS:
        dearer = []
        for t in trace_ids:
            cost, raw = results.summary(t, "default").cost[provider], results.runs[t, RAW].cost(provider)
            if cost > raw + 1e-9:
                dearer.append(f"`{t}` {_change(cost, raw)}")
        figure = ", ".join(dearer) if dearer else f"none of {len(trace_ids)}"
        rows.append([f"no trace above raw's cost ({_PROVIDER_NAMES[provider]})", figure, _met(not dearer)])
    untouched = [f"`{t}`" for t in trace_ids if _untouched(results, t)]
    if untouched:
        figure = ", ".join(untouched) + ": raw's prompts and raw's cost on both bills"
        rows.append(["a trace where nothing can be removed on evidence costs exactly raw's", figure, "said"])
    for provider in PROVIDERS:
        cost, raw, target = default["cost"][provider], default["raw_cost"][provider], TARGET_SAVINGS[provider]
        met = raw > 0 and round(cost / raw - 1, 4) <= target
        verdict = _met(met) if met else f"{_met(False)}: {_nearest(results, trace_ids, conditions, provider, target)}"
        figure = f"{_change(cost, raw)} ({_dollars(cost)} against {_dollars(raw)})"
        rows.append([f"all traces, {_PROVIDER_NAMES[provider]}: at most {target:.0%} against raw", figure, verdict])
    share = round(default["hidden"] / max(1, default["used"]), 4)
    figure = f"{default['hidden']} of {default['used']:,} ({share:.2%})"
    target_hidden = f"identifiers hidden: at most {TARGET_HIDDEN:.1%} of those used"
    rows.append([target_hidden, figure, _met(share <= TARGET_HIDDEN)])
    lost = default["probes"].get("lost", 0) + default["needed"].get("lost", 0)
    rows.append(["no probe lost (at the end and when used)", f"{lost} lost", _met(not lost)])
    for provider in PROVIDERS:
        points = _pareto_points(results, trace_ids, conditions, provider)
        if "default" not in points:
            continue
        cost, hidden = points["default"]
        better = [c for c, (k, h) in points.items() if k < cost - 1e-12 and h < hidden]
        figure = f"cheaper and hiding fewer: {_names(better)}" if better else "none"
        if not better and frontier(points)["default"]:
            figure += "; no dearer, hiding no more and better on one (the frontier's table): " + ", ".join(
                f"`{c}` (${cost - points[c][0]:.4f} cheaper, {points[c][1] - hidden:+.0f} hidden)"
                for c in frontier(points)["default"]
            )
        target_front = f"no condition both cheaper and hiding fewer than the default ({_PROVIDER_NAMES[provider]})"
        rows.append([target_front, figure, _met(not better)])
    for condition in TARGET_PRECISION:
        qualities = _qualities(results, fixture_ids, condition)
        prunes, false = _prunes(qualities)
        if qualities:
            figure = f"{false} false of {prunes} prunes" if prunes else "nothing pruned"
            rows.append([f"fixtures: precision 1.00 for `{condition}`", figure, _met(not false)])
    return _table(["target", "measured", "verdict"], rows)


def _change(cost: float, raw: float, places: int = 2) -> str:
    """`cost` against `raw`'s, as a signed percentage."""
    return f"{cost / raw - 1:+.{places}%}" if raw > 0 else "-"


def _untouched(results: Results, trace_id: str) -> bool:
    """Whether the default changed nothing of a trace: no rule found an edit it may make, and it
    sent raw's prompts at raw's cost."""
    run, raw = results.runs[trace_id, "default"], results.runs[trace_id, RAW]
    decided = run.decisions
    same = run.sent == raw.sent and all(abs(run.cost(p) - raw.cost(p)) < 1e-9 for p in PROVIDERS)
    return same and not decided["prune"] + decided["defer"] + decided["apply"]


def _met(met: bool) -> str:
    return "met" if met else "**not met**"


def _nearest(
    results: Results, trace_ids: Sequence[str], conditions: Sequence[str], provider: str, target: float
) -> str:
    """Why a savings target is not met, as far as the lab's conditions say: the cheapest that hides no
    more than the target allows and loses no probe, and the least hiding of those that reach it."""
    allowed, reaching = [], []
    for condition in conditions:
        summed = _summed(results, trace_ids, condition)
        if not summed["raw"] or condition == RAW:
            continue
        if not summed["raw_cost"][provider]:
            continue
        change = round(summed["cost"][provider] / summed["raw_cost"][provider] - 1, 4)
        hidden = round(summed["hidden"] / max(1, summed["used"]), 4)
        lost = summed["probes"].get("lost", 0) + summed["needed"].get("lost", 0)
        if hidden <= TARGET_HIDDEN and not lost:
            allowed.append((change, condition))
        if change <= target:
            reaching.append((hidden, condition, change))
    said = []
    if allowed:
        change, condition = min(allowed)
        said.append(f"within the bound on hidden identifiers the cheapest condition is `{condition}`, {change:+.2%}")
    if reaching:
        hidden, condition, change = min(reaching)
        said.append(f"of those that reach it, `{condition}` hides the fewest: {hidden:.2%} ({change:+.2%})")
    else:
        said.append("no condition reaches it")
    return "; ".join(said)


def _hidden_by_trace(results: Results, trace_ids: Sequence[str]) -> str:
    """Where the default policy hid an identifier the next answer used: trace, call, identifiers."""
    rows = []
    for trace_id in trace_ids:
        run = results.runs.get((trace_id, "default"))
        if run is None:
            continue
        by_call: dict[int, list[str]] = {}
        for call, term in run.hidden:
            by_call.setdefault(call, []).append(term)
        rows += [[trace_id, call, ", ".join(f"`{t}`" for t in terms)] for call, terms in sorted(by_call.items())]
    if not rows:
        return "\nThe default policy hid none.\n"
    return "\nThose the default policy hid, by call:\n\n" + _table(["trace", "call", "identifiers"], rows) + "\n"


def _relative(summed: Mapping[str, Any], provider: str) -> str:
    return _change(summed["cost"][provider], summed["raw_cost"][provider], places=1)


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


def _horizon() -> str:
    """The calls the default policy's rewrites must pay back within, in words."""
    cache = default_policy().cache
    if cache.expected_calls_auto:
        return f"as many calls as the session has made so far (at least {cache.expected_calls})"
    return f"{cache.expected_calls} calls"


def _versus_masking(results: Results, trace_ids: Sequence[str]) -> str:
    rows = []
    for trace_id in trace_ids:
        default, masking = results.runs[trace_id, "default"], results.runs[trace_id, "masking"]
        raw = results.runs[trace_id, RAW]
        d, m = results.summary(trace_id, "default"), results.summary(trace_id, "masking")
        if default.sent == masking.sent:
            why = "the same tokens: neither prunes anything here"
        elif default.sent < masking.sent:
            why = "fewer tokens"
        else:
            hidden = {seq for seq, shown, _, _ in masking.final if shown != "full"}
            kept = {seq for seq, shown, _, _ in default.final if shown == "full"} & hidden
            why = (
                f"more tokens: masking hides {len(hidden)} tool outputs on their age alone, {len(kept)} of which "
                f"the default still shows whole at the end (it prunes only on evidence); masking leaves "
                f"{m.probes.get('recoverable', 0)} probes only behind handles (the default "
                f"{d.probes.get('recoverable', 0)}), and hid {m.hidden} identifiers the next answer used (the "
                f"default {d.hidden})"
            )
        if d.cost["anthropic"] > raw.cost("anthropic") + 1e-9:
            breaks = [n for n, c in enumerate(default.calls) if c.divergence is not None]
            left = ", ".join(str(len(default.calls) - n) for n in breaks)
            why += (
                f"; **the default costs more than raw here** (Anthropic): it rewrote the cached prefix at "
                f"{len(breaks)} calls, each priced to pay back over {_horizon()}, with {left} calls left"
            )
        rows.append(
            [trace_id, f"{default.sent:,}", f"{masking.sent:,}", _dollars(d.cost["anthropic"]),
             _dollars(m.cost["anthropic"]), _dollars(raw.cost("anthropic")), _probes(d.probes), _probes(m.probes), why]
        )  # fmt: skip
    header = ["trace", "default tokens", "masking tokens", "default $ (Anthropic)", "masking $", "raw $"]
    return _table([*header, "default probes", "masking probes", "verdict"], rows)


def _against_raw(results: Results, trace_ids: Sequence[str], conditions: Sequence[str]) -> str:
    """Each trace's Anthropic bill under each condition against raw's: where a guess pays, where it does not."""
    rows = []
    for trace_id in trace_ids:
        raw = results.runs[trace_id, RAW].cost("anthropic")
        cells = []
        for condition in conditions:
            summary = results.summary(trace_id, condition)
            cost = summary.cost["anthropic"]
            change = f"{cost / raw - 1:+.1%}" if raw else "-"
            decided = results.runs[trace_id, condition].decisions
            if not summary.reduction and not decided["prune"] + decided["defer"] + decided["apply"]:
                change += " (nothing to edit: raw's prompts)"  # no rule found anything it may change
            elif not summary.reduction:
                change += " (every edit found waited)"
            cells.append(f"**{change}**" if cost > raw + 1e-9 else change)
        rows.append([trace_id, _dollars(raw), *cells])
    return _table(["trace", "raw (Anthropic)", *conditions], rows)


def _by_rule(results: Results, trace_ids: Sequence[str], conditions: Sequence[str]) -> str:
    rows = []
    for condition in conditions:
        summed = _summed(results, trace_ids, condition)
        if summed["raw"] and summed["saved"]:
            cell = ", ".join(f"{rule} {n:,} ({n / summed['raw']:.1%})" for rule, n in summed["saved"].most_common())
            rows.append([condition, cell])
    return _table(["condition", "tokens not sent over all calls, net of what stands in, by rule (share of raw)"], rows)


def _prediction(results: Results, trace_ids: Sequence[str], conditions: Sequence[str]) -> str:
    """What the service predicted for each call (GetStatus), against the lab's Anthropic bill of
    it, which the replay reported (ReportUsage), summed over the traces."""
    rows = []
    for condition in conditions:
        summaries = [results.runs[t, condition].usage for t in trace_ids]
        if any(s is None for s in summaries):
            continue
        names = ("cache_read", "cache_write", "uncached", "input")
        predicted = [sum(getattr(s, f"predicted_{n}_tokens") for s in summaries if s) for n in names[:3]]
        billed = [sum(getattr(s, f"reported_{n}_tokens") for s in summaries if s) for n in (*names[:2], names[3])]
        cells = [
            f"{p:,} / {b:,} ({p / b - 1:+.1%})" if b else f"{p:,} / 0" for p, b in zip(predicted, billed, strict=True)
        ]
        rows.append([condition, sum(s.reported_calls for s in summaries if s), *cells])
    header = ["condition", "calls", "cache read, predicted / billed", "cache write", "uncached"]
    return _table(header, rows)


def _placements(results: Results, trace_ids: Sequence[str]) -> str:
    """How often the default's view placed the breakpoint before its end."""
    calls = [c for t in trace_ids for c in results.runs[t, "default"].calls]
    early = sum(c.through is not None for c in calls)
    return (
        f"The default's view placed the breakpoint before its end at {early:,} of {len(calls):,} calls "
        "(engine/breakpoint.py: when the outputs after it are expected to shrink enough to pay for "
        "sending them uncached once, within half the expected calls)."
    )


def _read_anywhere(results: Results, trace_ids: Sequence[str], conditions: Sequence[str]) -> str:
    """Each condition's Anthropic bill as replayed, and the same prompts (each cached up to its
    breakpoint) priced as if the cache were read up to wherever a prompt first differs from an
    earlier one (a breakpoint also just before every change): what more breakpoints could save
    at most."""
    anywhere = replace(RULES["anthropic"], breakpoints=False)
    rows = []
    for condition in conditions:
        billed = ideal = 0.0
        for trace_id in trace_ids:
            cache = PromptCache("anthropic", rules=anywhere)
            for number, call in enumerate(results.runs[trace_id, condition].calls):
                billed += call.billed["anthropic"].dollars
                ideal += cache.call(call.prompt, number * results.gap, call.through).dollars
        rows.append([condition, _dollars(billed), _dollars(ideal), f"{ideal / billed - 1:+.1%}" if billed else "-"])
    return _table(["condition", "Anthropic, as billed", "read up to every change", "difference"], rows)


def _overhead(results: Results, trace_id: str) -> str:
    rows = []
    for condition in results.conditions(trace_id):
        renders = [c.render_ms for c in results.runs[trace_id, condition].calls]
        rows.append([condition, len(renders), f"{percentile(renders, 50):.1f}", f"{percentile(renders, 99):.1f}"])
    return _table(["condition", "calls", "RenderView p50 ms", "p99 ms"], rows)


# ------------------------------------------------------------------- plots


def _plots(
    results: Results,
    out: Path,
    longest: str,
    trace_ids: Sequence[str],
    fixture_ids: Sequence[str],
    timed: Results,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    for condition in ran(results, TRACE_CONDITIONS):
        calls = results.runs[longest, condition].calls
        axes.plot(range(1, len(calls) + 1), [c.tokens for c in calls], label=condition, linewidth=1.2)
    axes.set(xlabel="model call", ylabel="tokens sent", title=f"Tokens per call: {longest}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "tokens-per-call.png", dpi=110)
    plt.close(figure)

    if trace_ids:
        _cost_plot(plt, results, out, trace_ids)
    sets = {
        "traces": (results, trace_ids, ran(results, [*TRACE_CONDITIONS, *DEFAULT_VARIANTS])),
        "fixtures": (timed, fixture_ids, ran(timed, FIXTURE_CONDITIONS)),
    }
    _pareto_plot(plt, out, {k: v for k, v in sets.items() if v[1]})

    figure, axes = plt.subplots(figsize=(9, 5))
    names = [c for c in FIXTURE_CONDITIONS if c != RAW]
    precision, recall = [], []
    for condition in names:
        qualities = _qualities(results, fixture_ids, condition)
        precision.append(_precision(*_prunes(qualities)))
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


def _pareto_plot(plt: Any, out: Path, sets: Mapping[str, tuple[Results, Sequence[str], Sequence[str]]]) -> None:
    """Cost against identifiers hidden, per provider (columns) and per set of runs (rows), the
    frontier drawn through the conditions none dominates."""
    figure, panels = plt.subplots(len(sets), len(PROVIDERS), figsize=(12, 5 * len(sets)), squeeze=False)
    for row, (title, (results, ids, conditions)) in zip(panels, sets.items(), strict=True):
        for provider, axes in zip(PROVIDERS, row, strict=True):
            points = _pareto_points(results, ids, conditions, provider)
            beaten = frontier(points)
            for n, (condition, (cost, hidden)) in enumerate(points.items()):
                axes.scatter(hidden, cost, marker="o" if beaten[condition] else "D")
                axes.annotate(
                    condition, (hidden, cost), fontsize=7, xytext=(5, 8 - 8 * (n % 3)), textcoords="offset points"
                )
            best = sorted((hidden, cost) for condition, (cost, hidden) in points.items() if not beaten[condition])
            axes.plot([h for h, _ in best], [c for _, c in best], color="grey", linewidth=0.8, drawstyle="steps-post")
            axes.set(xlabel="identifiers the next answer used that the view hid", ylabel="priced cost with caching ($)")
            axes.set_title(f"{title}: {_PROVIDER_NAMES[provider]} (diamonds: on the frontier)", fontsize=9)
    figure.tight_layout()
    figure.savefig(out / "pareto.png", dpi=110)
    plt.close(figure)


def _cost_plot(plt: Any, results: Results, out: Path, trace_ids: Sequence[str]) -> None:
    figure, panels = plt.subplots(1, 2, figsize=(12, 5))
    for provider, axes in zip(PROVIDERS, panels, strict=True):
        raw = _summed(results, trace_ids, RAW)["cost"][provider]
        axes.axhline(raw, color="grey", linestyle="--", linewidth=0.8)
        for n, condition in enumerate(ran(results, TRACE_CONDITIONS)):
            summed = _summed(results, trace_ids, condition)
            point = (summed["raw"] - summed["sent"], summed["cost"][provider])
            axes.scatter(*point)
            axes.annotate(condition, point, fontsize=8, xytext=(5, 10 - 9 * (n % 3)), textcoords="offset points")
        axes.set(xlabel="tokens saved over all calls, vs raw", ylabel="priced cost with caching ($)")
        axes.set_title(f"{_PROVIDER_NAMES[provider]} (dashed: raw)")
    figure.suptitle("Cost vs tokens saved, all traces")
    figure.tight_layout()
    figure.savefig(out / "cost-vs-saved.png", dpi=110)
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
    peers: Sequence[str] = (),
) -> Results:
    """The report; `peers`: the known systems run in the loop beside the conditions (`headroom`)."""
    results = run(client, fixtures, probes, [*FIXTURE_CONDITIONS, *peers], gap, at_once=True)
    run(client, traces, probes, [*TRACE_CONDITIONS, *peers, *DEFAULT_VARIANTS], gap, into=results)
    # The fixtures again, each condition with its own timing (its policy's cache pricing), for
    # the frontier: applied at once, every edit's cost to the cache is the lab's doing.
    timed = run(client, fixtures, probes, [*FIXTURE_CONDITIONS, *peers], gap)
    trace_ids, fixture_ids = [t["id"] for t in traces], [f["id"] for f in fixtures]
    longest = max(traces or fixtures, key=lambda t: len(t["messages"]))["id"]
    plots = out.parent / "lab"
    plots.mkdir(parents=True, exist_ok=True)
    _plots(results, plots, longest, trace_ids, fixture_ids, timed)
    out.write_text(_document(results, command, trace_ids, fixture_ids, longest, plots.name, timed))
    return results


def _document(
    results: Results,
    command: str,
    trace_ids: Sequence[str],
    fixture_ids: Sequence[str],
    longest: str,
    plots: str,
    timed: Results,
) -> str:
    prices = "; ".join(
        f"{_PROVIDER_NAMES[name]}: input ${p.input}, cache write ${p.cache_write}, cache read ${p.cache_read} "
        f"per M tokens, TTL {p.ttl_seconds:g} s"
        for name, p in PROVIDER_PRICES.items()
        if name in PROVIDERS
    )
    calls = len(results.runs[longest, "default"].calls)
    return f"""# Context Lab

Generated by `{command}`; do not edit by hand. Every figure below was measured by replaying
each trace call by call through a `contextd` service over gRPC (append the turns, render the
view before each assistant turn, as an agent does), once per condition
([bench/contextd_lab/conditions.py](../bench/contextd_lab/conditions.py)). The prompt cache is modelled
from the messages each call sent ([bench/contextd_lab/cache.py](../bench/contextd_lab/cache.py)): Anthropic
caches each call up to its breakpoint, reads back only a whole earlier prompt so cached, and
pays a write premium; OpenAI reads the longest shared prefix in 128-token steps; nothing under
1,024 tokens is cached; calls are {results.gap:g} s apart (the cache stays warm). The raw
agent and the known baselines put the breakpoint at the end of each call, as agents do;
contextd's conditions let the view place it (RenderView's `place_cache_breakpoint`: before
the newest outputs the next call will reduce, when that pays, else at the end). Prices: {prices}.
Token figures are the service's own (cl100k_base). Render times are whole RenderView calls
seen by the client, on a shared 2-core machine.

Probes are facts needed late: **visible** in the last view, **recoverable** through a handle
the last view shows (fetched back with Retrieve), or **lost**. In brackets, the same for the
probes whose answer is only in tool outputs (the others also sit in user, system or assistant
text, which no tool-output rule touches, so they say little). *When used*: the same in the
view of the model call that used the fact (the call that wrote its last sighting, when that
is an assistant turn): a deletion is safe only relative to the use that follows it.

{_targets_section(results, trace_ids, fixture_ids)}## Fixtures: correctness against ground truth

{len(fixture_ids)} generated fixtures (`contextd-lab fixtures`, seeds in the command), every
message labelled (what a view must keep of it, what it needs, its category) with probes, and
traps an aggressive rule falls into: the same command with another output, two ranges of a
file with an edit between, an old output holding an id needed late. A prune is false when
the label keeps the item whole, keeps a residue and the item went behind a placeholder, or
keeps nothing but what it needs was pruned too ([bench/contextd_lab/metrics.py](../bench/contextd_lab/metrics.py)).
Here every condition applies what it finds at once (its policy prices the cache as saving
nothing), so precision and recall measure what the rules find, not when their timing lets
them apply; what the timing saves and costs is measured on the real traces below. Recall is
against the oracle's prunes (a duplicate pair counts once, whichever copy went).

{_condition_table(results, fixture_ids, FIXTURE_CONDITIONS, labelled=True)}

False prunes, by the category of what was pruned:

{_false_prunes(results, fixture_ids, FIXTURE_CONDITIONS)}

What the rules took out, over all calls:

{_by_rule(results, fixture_ids, FIXTURE_CONDITIONS)}

![precision and recall]({plots}/precision-recall.png)

{_traces_section(results, trace_ids, plots)}
## Cost against hidden facts: the Pareto frontier

Tokens sent are not the objective; the priced cost with the prompt cache, and the facts a view
hides, are. For every condition, its cost and the identifiers the next answer used that its
views hid (*identifiers the next answer wrote*, above), and the conditions that dominate it:
no dearer and hiding no more, better on one. One that none dominates is on the frontier. On
the real traces (each condition with its own timing):

{_pareto(results, trace_ids, ran(results, [*TRACE_CONDITIONS, *DEFAULT_VARIANTS])) if trace_ids else "None given."}

On the fixtures, replayed again for this with each condition's own timing (above, every
condition applied what it found at once, to measure what it finds), the oracle included:

{_pareto(timed, fixture_ids, ran(timed, FIXTURE_CONDITIONS)) if fixture_ids else "None given."}

![cost against hidden facts]({plots}/pareto.png)

## The service's overhead per model call

The longest trace, `{longest}` ({calls} calls): every RenderView call timed by the client.

{_overhead(results, longest)}

## Every replay

{replay_table(results)}
"""


def _targets_section(results: Results, trace_ids: Sequence[str], fixture_ids: Sequence[str]) -> str:
    if not trace_ids:
        return ""
    table = _targets(results, trace_ids, fixture_ids, ran(results, [*TRACE_CONDITIONS, *DEFAULT_VARIANTS]))
    return f"""## The targets

The default policy against its targets, on the real traces (and, for precision, the fixtures),
from the figures below. Where a savings target is not met, the verdict says how near the
conditions the lab ran come to it without hiding more than the target on identifiers allows,
and which of them reaches it and what that one hides: the trade the frontier below draws.
The frontier's target is that no condition is both cheaper and hiding fewer; the frontier's
table below holds the default to more (no condition no dearer, hiding no more and better on
one), and this table names any condition that beats it so. Where the default's cost goes and
what was tried to lower it: [docs/benchmarks.md](benchmarks.md#the-context-lab-service-every-condition).
The compressors' targets (every planted fact kept; at most one tokenisation's time per output)
are measured by `bench/compress.py`, not here: [docs/benchmarks.md](benchmarks.md#the-compressors-against-headroom-ai).

{table}

"""


def _traces_section(results: Results, trace_ids: Sequence[str], plots: str) -> str:
    if not trace_ids:
        return "## Real traces\n\nNone given (`--traces` named a folder without traces): only the fixtures ran.\n"
    default = _summed(results, trace_ids, "default")
    return f"""## Real traces: what each condition sends and costs

The {len(trace_ids)} traces given (`--traces`: by default `../shared/traces/`, real agent
trajectories) with their probes (`--probes`: by default `bench/probes/`).
Tokens and priced cost differ: an edit to what the cache holds makes the next call pay for
the rest of the prompt again, so a condition can send fewer tokens and cost more.

{_condition_table(results, trace_ids, ran(results, TRACE_CONDITIONS), labelled=False)}

*Identifiers the next answer wrote*: at each call, the identifier-like words of the model's
answer in the trace (its text and its calls' arguments: `queryset.filter`, `rel_obj`, a
path) that the history before the call held; *hidden*, those the view of that call did not
show. The agent in the trace saw its whole history; an agent shown that view would have had
to fetch each hidden one back (a Retrieve, or running its command again) or do without. The
probes check a few chosen facts; this checks every identifier the agent went on to use.
{_hidden_by_trace(results, trace_ids)}

The default policy over all traces: {default["sent"]:,} tokens sent against {default["raw"]:,}
raw; Anthropic {_dollars(default["cost"]["anthropic"])} against {_dollars(default["raw_cost"]["anthropic"])} raw,
OpenAI {_dollars(default["cost"]["openai"])} against {_dollars(default["raw_cost"]["openai"])}.

### The default policy against observation masking, trace by trace

{_versus_masking(results, trace_ids)}

### What the default guesses about the cache

The default policy keeps an output whole for the call that reads it (`protection.last_turns`,
1) and applies an edit to what the cache holds only when it pays for itself within
{_horizon()} (`cache.expected_calls`) and, should the session end after the next call, would
lose no more than the session's calls have saved so far against its whole history sent
(`cache.stakes: banked`): a session's end is not known, and a rewrite just before it is a
loss, which the bank bounds. It prices the rewrite from where Anthropic reads
its cache back: the end of the last earlier prompt before the change (`cache.reads:
breakpoints`), and lets the view place that breakpoint: a call caches up to the newest
outputs the next call will compress, so that compression rewrites nothing cached. The same
policy paying back over a fixed number of calls (12: the default until 2026-12-04, with its
stakes unlimited until then too), with its stakes unlimited, with two turns protected and 20
calls (the default until 2026-11-30), priced as if the cache were read up to the change itself
(`reads: prefix`, as OpenAI reads; the bill is still Anthropic's), with nothing protected
(`protection.last_turns: 0`: every new output is compressed when it first enters the view,
file reads and code included, before any cache holds it, as headroom-ai's proxy does, and the
call that reads it reads the compressed form), with none compressed on entry (the default takes
outputs that are not file reads, code or diffs so: `compress`'s `params.on_entry`; the default
until 2026-12-03 took none), and with the agent putting the breakpoint at the end of each call
itself (the default until 2026-11-30):

{_condition_table(results, trace_ids, ["default", *DEFAULT_VARIANTS], labelled=False)}

{_placements(results, trace_ids)}

Trace by trace, the Anthropic bill against raw's (in bold where it is higher; where a policy
sent exactly what raw sent, whether its rules found nothing they may edit, or what they found
waited for the cache until the trace ended):

{_against_raw(results, trace_ids, ["default", *DEFAULT_VARIANTS])}

### What the service predicted for each call, against the bill

Every render stores the usage the engine expects the call made with its view to be billed
(its policy's provider: here Anthropic's cache, read back to the last earlier breakpoint,
written up to this call's), and the replay reported the lab's bill of each call to the service
(ReportUsage), as a client reports the provider's; GetStatus sums both. The tokens are the
same on both sides (the service's), so they compare directly:

{_prediction(results, trace_ids, [c for c in ["default", *DEFAULT_VARIANTS] if c != ANY_PREFIX])}

(Not the variant priced as if the cache were read up to any change: it predicts another
cache than the one billed. The service's clock is the real one, its renders milliseconds
apart, while the lab bills calls {results.gap:g} s apart: an earlier breakpoint unused for
the cache's lifetime is gone from the lab's cache and not from the service's; that, and the
framing the lab spreads evenly over messages, is the difference where there is one.)

### What each rule saved

{_by_rule(results, trace_ids, TRACE_CONDITIONS)}

### What reading the cache up to every change would save

Anthropic reads its cache back only to an earlier call's breakpoint, so an edit makes the next
call write again from there, not from the edit; the view places one breakpoint per call, before
what it expects the next call to reduce. The same prompts priced as if the cache were read up
to wherever each prompt first differs from an earlier one (a breakpoint just before every
change, as many as it takes: the most that placing breakpoints could give):

{_read_anywhere(results, trace_ids, ran(results, TRACE_CONDITIONS))}

![tokens per call]({plots}/tokens-per-call.png)

![cost vs tokens saved]({plots}/cost-vs-saved.png)
"""
