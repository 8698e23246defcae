"""The known systems' pruning rules, written as transforms so the lab can run them through the
same service as contextd's own (issue 6, conditions). Each is a heuristic: level 4, so a policy
must allow it (``evidence: {max_level: 4}``). Observation masking needs none of its own: it is
the built-in `mask` with an age (``when: {age_turns: {min: N}}``).

* ``baseline_latest_call``: of the tool outputs whose call had the same tool and the same
  arguments, only the latest stays; the earlier ones become placeholders. (The trap it falls
  into: a test run again after an edit has the same call and another output.)
* ``baseline_clear_tool_uses``: Anthropic's server-side tool-result clearing
  (``clear_tool_uses_20250919``), as its public documentation describes it. The API edits each
  request afresh from the whole history the client sends: once the request's input tokens
  (before editing) pass `params.trigger_tokens` (100,000 by default), every tool result but
  those of the last `params.keep` tool uses (3) is cleared, oldest first, tools named in
  `params.exclude_tools` never; if that clears fewer than `params.clear_at_least` tokens (0),
  nothing is; with `params.clear_tool_inputs`, the calls' inputs are cleared too. Past the
  trigger every later request clears the results of all but its last `keep` uses, so each new
  tool use moves the cleared boundary, and the cache is written again from there (as Anthropic
  prices a cleared request: the lab's cache model reads what was sent).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from contextd.engine.model import Representation, ToolUseBlock
from contextd.engine.types import Entry, Proposal, Remove, Replace, TransformContext, prunable


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


CLEARED_INPUT = json.dumps({"contextd": "tool input cleared"})
"""A cleared call's input: the engine lets a call's input be replaced only by such a stand-in."""


class ClearToolUses:
    name: ClassVar[str] = "baseline_clear_tool_uses"
    version: ClassVar[str] = "2"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        keep = int(params.get("keep", 3))
        requested = sum(entry.item.token_count for entry in context.entries)  # as the client sends it
        if requested <= int(params.get("trigger_tokens", 100_000)):
            return
        index = context.observations
        excluded = set(params.get("exclude_tools", ()))
        uses = [seq for seq in sorted(index.by_seq) if index.by_seq[seq].tool not in excluded]
        cleared = uses[:-keep] if keep > 0 else uses
        inputs = bool(params.get("clear_tool_inputs", False))
        # What this request clears, counted on the history as sent (what earlier ones cleared too).
        worth = sum(context.by_seq[seq].item.token_count for seq in cleared if seq in context.by_seq)
        if inputs:
            worth += sum(context.by_seq[index.by_seq[s].call_seq].item.token_count for s in cleared)
        if not cleared or worth < int(params.get("clear_at_least", 0)):
            return
        targets = set(cleared)
        calls: dict[int, set[str]] = {}  # the assistant turn -> the ids of its calls whose inputs go
        for seq in cleared if inputs else ():
            calls.setdefault(index.by_seq[seq].call_seq, set()).add(index.by_seq[seq].call_id)
        for entry in candidates:
            if not prunable(entry):
                continue
            if entry.seq in targets:
                yield Proposal(Remove(entry.seq), 4, "cleared", f"not among the last {keep} tool uses")
            elif entry.seq in calls and entry.representation is Representation.FULL:
                ids = calls[entry.seq]
                content = tuple(
                    replace(b, input_json=CLEARED_INPUT) if isinstance(b, ToolUseBlock) and b.id in ids else b
                    for b in entry.item.content
                )
                yield Proposal(Replace(entry.seq, content), 4, "cleared_input", "its tool use was cleared")
