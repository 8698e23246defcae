"""The known systems' pruning rules, written as transforms so the lab can run them through the
same service as contextd's own (issue 6, conditions). Each is a heuristic: level 4, so a policy
must allow it (``evidence: {max_level: 4}``). Observation masking needs none of its own: it is
the built-in `mask` with an age (``when: {age_turns: {min: N}}``).

* ``baseline_latest_call``: of the tool outputs whose call had the same tool and the same
  arguments, only the latest stays; the earlier ones become placeholders. (The trap it falls
  into: a test run again after an edit has the same call and another output.)
* ``baseline_keep_last``: tool-result clearing as Anthropic's API publishes it: once the view
  holds more than `params.trigger_tokens` (100,000 by default), every tool output but the last
  `params.keep` (3) becomes a placeholder, provided that takes out at least
  `params.clear_at_least` tokens (0); what is cleared stays cleared.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from contextd.engine.types import Entry, Proposal, Remove, TransformContext, prunable


class LatestCall:
    name: ClassVar[str] = "baseline_latest_call"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        index = context.observations
        latest: dict[tuple[str, str], int] = {}
        for seq in sorted(index.by_seq):
            call = index.by_seq[seq]
            latest[(call.tool, call.command.strip())] = seq
        for entry in candidates:
            seen = index.by_seq.get(entry.seq)
            if seen is None or not prunable(entry):
                continue
            newer = latest.get((seen.tool, seen.command.strip()), entry.seq)
            if newer > entry.seq:
                note = f"the same call ran again at seq {newer}"
                yield Proposal(Remove(entry.seq, True, note), 4, "same_call", note)


class KeepLast:
    name: ClassVar[str] = "baseline_keep_last"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        keep = int(params.get("keep", 3))
        if context.view_tokens <= int(params.get("trigger_tokens", 100_000)):
            return
        outputs = sorted(context.observations.by_seq)
        kept = set(outputs[-keep:]) if keep > 0 else set()
        cleared = [
            entry
            for entry in candidates
            if entry.seq in context.observations.by_seq and entry.seq not in kept and prunable(entry)
        ]
        if sum(entry.tokens for entry in cleared) < int(params.get("clear_at_least", 0)):
            return
        for entry in cleared:
            yield Proposal(Remove(entry.seq), 4, "not_recent", f"not among the last {keep} tool outputs")
