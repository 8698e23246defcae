"""The lab's conditions, each a policy the service runs as it runs any other (issue 6).

* ``A-raw``: nothing pruned.
* ``B-duplicates``: exact duplicates only (level 0).
* ``C-errors``: B, and failed calls reduced to their failure's evidence and their bulky inputs left
  out, once a later run of the same check succeeded.
* ``D-superseded``: C, and superseded observations (a source read again, a test run again).
* ``E-aggressive``: D, and level-4 heuristics (the same call keeps its latest output; tool outputs
  older than 4 turns masked): placeholders only, never summaries. The upper-risk condition.
* ``F-oracle``: exactly what the fixture labels unnecessary (its labels ride on the items'
  metadata; only fixtures have them).
* ``default``: the shipped default policy (strategies and compressions).
* The known baselines, from their public descriptions: ``masking`` (tool outputs older than
  10 turns replaced by a placeholder; a turn as the engine counts them: each user or assistant
  message), ``latest-call`` (same tool and arguments: only the latest output stays),
  and Anthropic's server-side tool-result clearing (`clear_tool_uses_20250919`, baselines.py):
  ``context-editing`` with its published defaults (past 100,000 input tokens, the results of
  all but the last three tool uses cleared; the traces here stay under it),
  ``context-editing-30k`` configured for traces of this size (past 30,000 tokens, and only when
  that clears at least 10,000, so that each clearing is worth the cache it rewrites, as the
  documentation advises) and ``context-editing-eager`` (from the first call, the cleared calls'
  inputs too). They act at once, as they do where they come from: their policies price the
  cache as saving nothing, so the service never waits for a cache-safe point, and protect only
  user turns.

Conditions B–F keep the default protection and cache pricing: contextd's own timing decides
when their edits apply. Like the default, they let the view place the prompt-cache breakpoint;
the raw agent and the baselines put it at the end of each call (`CALLER_BREAKPOINT`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import yaml

from contextd.engine.model import TextBlock, ToolUseBlock
from contextd.engine.placeholders import handle_of
from contextd.engine.policy import default_policy_text
from contextd.engine.types import Entry, Proposal, Remove, Replace, TransformContext, prunable

ORACLE = "lab.oracle"
"""Item metadata: what the oracle does with the item (``placeholder`` or ``residue``)."""
RESIDUE = "lab.residue"
"""Item metadata: the residue the oracle leaves of a tool output."""
NEEDS = "lab.needs"
"""Item metadata: the seqs (comma-separated) that carry what the item held; the oracle waits for them."""

SHELL_TOOLS = {"bash": {"effect": "shell", "command_arg": "command"}}

_AGE = {"roles": ["tool"], "age_turns": {"min": 4}}
_B = [{"name": "duplicates", "transform": "dedupe", "when": {"roles": ["tool"]}}]
_C = [
    *_B,
    {"name": "old-errors", "transform": "errors", "when": _AGE},
    {"name": "errored-inputs", "transform": "errored_inputs", "when": {**_AGE, "roles": ["assistant"]}},
]
_SNAPSHOT_COMMANDS = ["pytest*", "python -m pytest*", "python3 -m pytest*", "git status*", "git diff*"]
_D = [
    *_C,
    {"name": "same-source", "transform": "same_source", "when": {"roles": ["tool"]}},
    {"name": "superseded-reads", "transform": "supersede", "when": {"roles": ["tool"]}},
    {
        "name": "snapshots",
        "transform": "snapshots",
        "params": {"commands": _SNAPSHOT_COMMANDS},
        "when": {"roles": ["tool"]},
    },
]
_E = [
    *_D,
    {"name": "same-call", "transform": "baseline_latest_call", "when": {"roles": ["tool"]}},
    {"name": "mask-old", "transform": "mask", "when": _AGE},
]
_NO_WAITING = {"provider": "anthropic", "prices": {"input": 3, "cache_write": 3, "cache_read": 3, "ttl_seconds": 300}}
_BASELINE = {
    "protection": {"last_turns": 0, "latest_error_per_tool": False},
    "cache": _NO_WAITING,
    "evidence": {"max_level": 4},
}

CONDITIONS: dict[str, dict[str, Any] | None] = {
    "A-raw": {"rules": []},
    "B-duplicates": {"rules": _B},
    "C-errors": {"rules": _C},
    "D-superseded": {"rules": _D},
    "E-aggressive": {"evidence": {"max_level": 4}, "rules": _E},
    "F-oracle": {"evidence": {"max_level": 4}, "rules": [{"name": "oracle", "transform": "lab_oracle"}]},
    "default": None,
    "masking": {
        **_BASELINE,
        "rules": [{"name": "masking", "transform": "mask", "when": {"roles": ["tool"], "age_turns": {"min": 10}}}],
    },
    "latest-call": {
        **_BASELINE,
        "rules": [{"name": "latest-call", "transform": "baseline_latest_call", "when": {"roles": ["tool"]}}],
    },
    "context-editing": {
        **_BASELINE,
        "rules": [{"name": "context-editing", "transform": "baseline_clear_tool_uses"}],
    },
    "context-editing-30k": {
        **_BASELINE,
        "rules": [
            {
                "name": "context-editing-30k",
                "transform": "baseline_clear_tool_uses",
                "params": {"trigger_tokens": 30_000, "keep": 3, "clear_at_least": 10_000},
            }
        ],
    },
    "context-editing-eager": {
        **_BASELINE,
        "rules": [
            {
                "name": "context-editing-eager",
                "transform": "baseline_clear_tool_uses",
                "params": {"trigger_tokens": 0, "keep": 3, "clear_tool_inputs": True},
            }
        ],
    },
}
"""Each condition's policy (None: the shipped default), before the trace's tools are added."""

TRANSFORMS = ("compress", "dedupe", "same_source")
"""A variant's sections that patch the params of the default's rules of that transform."""
ANY_PREFIX = "default, priced as read to any prefix"
ON_ENTRY = "default, nothing compressed on entry"
ENTRY_RATIO = "default, compressed on entry only to 0.7 of the output"
WHOLE_READS = "default, whole-file reads kept whole on entry"
OPENAI_TIMING = "default, timed by OpenAI's cache"
DEFAULT_VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "default, expected_calls 8": {"cache": {"expected_calls": 8}},
    "default, expected_calls 12": {"cache": {"expected_calls": 12}},
    "default, expected_calls 12, stakes unlimited": {"cache": {"expected_calls": 12, "stakes": "unlimited"}},
    "default, expected_calls 20": {"cache": {"expected_calls": 20}},
    "default, expected_calls 40": {"cache": {"expected_calls": 40}},
    "default, stakes unlimited": {"cache": {"stakes": "unlimited"}},
    "default, two turns protected, expected_calls 20": {
        "protection": {"last_turns": 2},
        "cache": {"expected_calls": 20},
    },
    ANY_PREFIX: {"cache": {"reads": "prefix"}},
    "default, compressed on entry": {"protection": {"last_turns": 0}},
    ON_ENTRY: {"compress": {"on_entry": []}},
    "default, copies kept for the call that made them": {
        "dedupe": {"on_entry": False},
        "same_source": {"on_entry": False},
    },
    "default, the caller's breakpoint": {},
    ENTRY_RATIO: {"compress": {"on_entry_max_ratio": 0.7}},
    WHOLE_READS: {"compress": {"on_entry_reads": []}},
    OPENAI_TIMING: {"cache": {"provider": "openai"}},
}
"""The shipped default with a fixed number of calls a cache rewrite must pay for itself within
(the default's is as many as the session has made so far, at least 12; 12 until 2026-12-04),
with a rewrite's stake not held to what the session has saved so far (`stakes: unlimited`: the
default until 2026-12-04 had that with 12 calls), with the last two turns protected rather than one and 20 calls (the
default until 2026-11-30), or pricing a rewrite as if the provider read its cache up to the
change (it reads only whole earlier prompts), or with the agent putting the cache breakpoint
at the end of each call itself (the view places none), or with nothing protected, so that a
new output is compressed when it first enters the view, before any cache holds it (as
headroom-ai's proxy does; the call that reads it reads the compressed form), or with no output
compressed on entry (`compress`'s `params.on_entry` empty: the default until 2026-12-03), or with
a copy of an output shown whole before it kept for the call that made it (`dedupe`'s and
`same_source`'s `params.on_entry` false: the default until 2026-12-04), or with a compression on
entry held to the share of the output a later rewrite must leave out (`compress`'s
`params.on_entry_max_ratio` 0.7, as `max_ratio`: the default until 2026-12-06), or with a read
of a whole file of code kept whole for the call that made it (`compress`'s
`params.on_entry_reads` empty: the default until 2026-12-06, later), or with its rewrites timed
by OpenAI's cache (`cache.provider: openai`: its prices, no write premium, a prefix read in
128-token steps; the default times them by Anthropic's, whatever the view's format): the
report's sensitivity to them, on the real traces. Each patches sections of the default policy."""

CALLER_BREAKPOINT = (
    "A-raw",
    "masking",
    "latest-call",
    "context-editing",
    "context-editing-30k",
    "context-editing-eager",
    "default, the caller's breakpoint",
)
"""The conditions whose agent puts the prompt-cache breakpoint at the end of each call itself, as
agents do: the raw agent, the known baselines (what they do where they come from) and the variant
that measures what placing it saves. The others, contextd's, let the view place it
(RenderView's `place_cache_breakpoint`)."""


def policy_text(condition: str, tools: Mapping[str, Any] | None = None, *, at_once: bool = False) -> str:
    """The policy document of `condition` for a trace whose tools are `tools` ("" for the shipped
    default). `at_once`: its edits apply as soon as they are found (the cache priced as saving
    nothing), so what a condition finds is measured apart from when its timing lets it apply."""
    policy = CONDITIONS.get(condition)
    if policy is None:
        variant = DEFAULT_VARIANTS.get(condition)
        if not at_once and tools is None and variant is None:
            return ""
        policy = yaml.safe_load(default_policy_text())
        policy["tools"] = {**policy["tools"], **(tools or {})}
        for section, patch in (variant or {}).items():
            if section in TRANSFORMS:  # the params of that transform's rules
                policy["rules"] = [
                    {**r, "params": {**r.get("params", {}), **patch}} if r["transform"] == section else r
                    for r in policy["rules"]
                ]
            else:
                policy[section] = {**policy.get(section, {}), **patch}
    else:
        policy = {**policy, "tools": dict(tools or SHELL_TOOLS)}
    if at_once:
        policy = {**policy, "cache": _NO_WAITING}
    return json.dumps(policy, sort_keys=True)


def oracle_metadata(labels: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The fixture's labels as the item metadata the oracle reads (condition F only)."""
    out = []
    for label in labels:
        if label.get("oracle"):
            needs = ",".join(str(n + 1) for n in label.get("needs", ()))
            out.append({ORACLE: label["oracle"], RESIDUE: label.get("residue", ""), NEEDS: needs})
        else:
            out.append({})
    return out


class Oracle:
    """Condition F: what the labels say, nothing else. A tool output labelled ``residue`` is shown as
    its residue; an assistant turn so labelled keeps its text and calls, its inputs left out; a
    ``placeholder`` goes behind one, once the items that carry what it held are in the session.
    Level 4: it rests on labels, not on evidence the engine checks."""

    name: ClassVar[str] = "lab_oracle"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            what = entry.item.metadata.get(ORACLE)
            if what is None or not prunable(entry):
                continue
            needs = [int(n) for n in entry.item.metadata.get(NEEDS, "").split(",") if n]
            if not all(n in context.by_seq for n in needs):
                continue  # unnecessary once what carries it is there, not before
            if what == "placeholder":
                yield Proposal(Remove(entry.seq), 4, "oracle", "labelled unnecessary")
            elif entry.item.tool_uses:
                stand_in = json.dumps({"contextd": f"input left out; handle {handle_of(entry.item)}"})
                content = tuple(
                    replace(b, input_json=stand_in) if isinstance(b, ToolUseBlock) else b for b in entry.item.content
                )
                yield Proposal(Replace(entry.seq, content), 4, "oracle", "labelled: its input is not needed")
            else:
                residue = entry.item.metadata.get(RESIDUE, "")
                text = f"[contextd: residue; handle {handle_of(entry.item)}]\n{residue}"
                yield Proposal(Replace(entry.seq, (TextBlock(text),)), 4, "oracle", "labelled: its residue is enough")
