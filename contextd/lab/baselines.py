"""The known systems' pruning rules, written as transforms so the lab can run them through the
same service as contextd's own (issue 6, conditions). Each is a heuristic: level 4, so a policy
must allow it (``evidence: {max_level: 4}``). Observation masking needs none of its own: it is
the built-in `mask` with an age (``when: {age_turns: {min: N}}``).

* ``baseline_latest_call``: of the tool outputs whose call had the same tool and the same
  arguments, only the latest stays; the earlier ones become placeholders. (The trap it falls
  into: a test run again after an edit has the same call and another output.)
* ``baseline_keep_last``: only the last `params.keep` tool outputs (3 by default) stay; every
  earlier one becomes a placeholder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from contextd.engine.model import Representation
from contextd.engine.transforms import Entry, Proposal, Remove, TransformContext


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
            if seen is None or entry.representation is not Representation.FULL:
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
        outputs = sorted(context.observations.by_seq)
        kept = set(outputs[-keep:]) if keep > 0 else set()
        for entry in candidates:
            old = entry.seq in context.observations.by_seq and entry.seq not in kept
            if old and entry.representation is Representation.FULL:
                yield Proposal(Remove(entry.seq), 4, "not_recent", f"not among the last {keep} tool outputs")
