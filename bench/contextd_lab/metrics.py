"""What a replay measured, never collapsed into one number (issue 6, metrics).

Pure functions over a `Run` (and a fixture's labels), so each is checked on tiny
hand-computed cases (tests/bench/test_metrics.py).

A **prune** here is an item a rule took out of a view at some call: a placeholder,
a reduced form (a residue) or omitted; a compression (the item stays, its facts
verbatim) is counted apart. Against a fixture's labels (seq = index + 1):

* a prune is **false** when the label keeps the item ``full``; when it keeps a
  ``residue`` and the item went behind a placeholder; when it keeps ``none`` but,
  at the render that pruned it, an item it ``needs`` was not there yet or was
  pruned by then, or in the same render (of two copies of a duplicate pruned in
  one render, only the later one is the false prune);
* **precision** = true prunes / prunes (1.0 when nothing was pruned: nothing was
  wrong);
* **recall** = the oracle's prunes the condition also made / the oracle's prunes;
  a duplicate pair counts once, whichever copy went.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextd_lab.replay import Run


@dataclass(frozen=True)
class Quality:
    prunes: int
    false_prunes: tuple[int, ...]
    """The seqs wrongly pruned."""
    oracle: int
    """Prunes the oracle makes."""
    taken: int
    """Of those, how many the condition made too."""
    by_category: Mapping[str, int] = field(default_factory=dict)
    """Prunes by the label's category."""

    @property
    def precision(self) -> float:
        return 1.0 if not self.prunes else 1 - len(self.false_prunes) / self.prunes

    @property
    def recall(self) -> float:
        return 1.0 if not self.oracle else self.taken / self.oracle


def quality(
    pruned: Mapping[int, str],
    labels: Sequence[Mapping[str, Any]],
    pruned_at: Mapping[int, int] | None = None,
    shown_at: Mapping[int, int] | None = None,
) -> Quality:
    """`pruned`: seq → the least the item was shown as ("reduced", "placeholder", "omitted");
    `pruned_at`: seq → the render that first showed it pruned; `shown_at`: seq → the first
    render that had it (without them, every prune counts as made in one render)."""
    label_of = {label["index"] + 1: label for label in labels}
    when = pruned_at or dict.fromkeys(pruned, 0)
    first = shown_at or {}

    def carried(seq: int, need: int) -> bool:
        """Whether `need` carried what `seq` held when `seq` was pruned."""
        if first.get(need, 0) > when[seq]:
            return False  # not there yet
        if need not in pruned or when[need] > when[seq]:
            return True
        # Two copies, each the other's carrier, pruned in one render: the later one is the false prune.
        mutual = seq - 1 in label_of[need]["needs"]
        return mutual and when[need] == when[seq] and need > seq

    false: list[int] = []
    categories: Counter[str] = Counter()
    for seq, shown in sorted(pruned.items()):
        label = label_of[seq]
        categories[label["category"]] += 1
        keep = label["keep"]
        if (
            keep == "full"
            or (keep == "residue" and shown != "reduced")
            or (keep == "none" and not all(carried(seq, n + 1) for n in label["needs"]))
        ):
            false.append(seq)
    oracle = [seq for seq, label in label_of.items() if label.get("oracle")]
    correct = set(pruned) - set(false)

    def taken(seq: int) -> bool:
        if seq in correct:
            return True
        # A copy the condition chose instead: an item that needs this one, pruned rightly, not the oracle's.
        return any(
            other in correct and not label_of[other].get("oracle") and seq - 1 in label_of[other]["needs"]
            for other in correct
        )

    return Quality(len(pruned), tuple(false), len(oracle), sum(1 for s in oracle if taken(s)), dict(categories))


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least 1
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class Summary:
    """One replay's figures."""

    calls: int
    sent: int
    reduction: float
    """1 - sent / the raw condition's sent, on the same trace."""
    cost: Mapping[str, float]
    """Dollars by provider, with the prompt cache."""
    cache: Mapping[str, tuple[int, int, int]]
    """Cache read, cache write, uncached tokens by provider."""
    breaks: int
    """Calls whose prompt did not extend the previous one as it was."""
    radius: int
    """Tokens the provider read again because of those breaks, over all calls."""
    first_divergence: float
    """Mean position (tokens) of the first difference, over the calls that broke the prefix."""
    abstention: float
    """Certificates saying ABSTAIN because safety could not be established / all certificates."""
    no_gain: float
    """Certificates saying ABSTAIN because the edit would not make the item smaller / all certificates."""
    render_p50: float
    render_p99: float
    probes: Mapping[str, int]
    """visible / recoverable / lost, in the last view."""
    needed: Mapping[str, int]
    """The same in the view of the call that used each probe (those with such a call)."""
    user_turns_reduced: int
    """Protected items (user turns) not shown whole at the end: 0 unless a policy allowed it."""
    used: int = 0
    """Identifiers the model's answers wrote that the history before each call held."""
    hidden: int = 0
    """Of those, the ones the call's view did not show (the model would have had to ask)."""


def summarize(run: Run, raw: Run, user_seqs: set[int]) -> Summary:
    breaks = [c for c in run.calls if c.divergence is not None]
    decided = sum(run.decisions.values())
    renders = [c.render_ms for c in run.calls]
    return Summary(
        calls=len(run.calls),
        sent=run.sent,
        reduction=1 - run.sent / raw.sent if raw.sent else 0.0,
        cost={p: run.cost(p) for p in ("anthropic", "openai")},
        cache={p: run.cached(p) for p in ("anthropic", "openai")},
        breaks=len(breaks),
        radius=sum(c.radius for c in breaks),
        first_divergence=sum(c.divergence or 0 for c in breaks) / len(breaks) if breaks else 0.0,
        abstention=run.decisions["abstain"] / decided if decided else 0.0,
        no_gain=run.decisions["no_gain"] / decided if decided else 0.0,
        render_p50=percentile(renders, 50),
        render_p99=percentile(renders, 99),
        probes=Counter(run.probes),
        needed=Counter(o for o in run.needed if o),
        user_turns_reduced=sum(1 for seq, shown, _, _ in run.final if seq in user_seqs and shown != "full"),
        used=run.used,
        hidden=len(run.hidden),
    )
