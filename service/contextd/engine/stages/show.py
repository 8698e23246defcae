"""Repair, render, count (DESIGN section 4): the draft in view order, its invariants
repaired (repair.py), rendered to the provider format and counted (view.py), with the
prompt-cache breakpoint marked where the view may place it (breakpoint.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import takewhile
from typing import Any

from contextd.engine import volatile
from contextd.engine.breakpoint import Breakpoint, judged, paid_share, place
from contextd.engine.memo import shared_prefix
from contextd.engine.model import Session
from contextd.engine.policy import BANKED, BREAKPOINTS, Policy
from contextd.engine.render.anthropic import mark_breakpoint
from contextd.engine.render.base import ViewWarning
from contextd.engine.repair import RepairRun, repair
from contextd.engine.stages.draft import Draft
from contextd.engine.state import Segment, first_divergence
from contextd.engine.timing import PromptCache
from contextd.engine.tokens import TokenCounter
from contextd.engine.view import Assembly, View, ViewFormat, ViewRequest, assemble_view


@dataclass(frozen=True, slots=True)
class Shown:
    view: View
    """As sent, its breakpoint marked; not yet stamped with the render's versions."""
    assembly: Assembly
    """What a later render in the same format resumes."""
    repaired: RepairRun
    """What a later render's repair resumes."""
    segments: Sequence[Segment]
    shared: int
    """Segments it shares with the previous render in its format (`memo.shared_prefix`)."""
    stable: int
    """Tokens it shares with the previous render in its format."""
    point: Breakpoint | None
    """Where the view ends the call's cache entry; None: at its end."""
    early: tuple[float, float] = (0.0, 0.0)
    """The session's record of early breakpoints in this format (breakpoint.py, `judged`)."""


def looks_ahead(request: ViewRequest, policy: Policy) -> bool:
    """Whether this render may end the cache entry before what the next one reduces: the caller
    lets the view place the breakpoint, for a provider that caches at breakpoints (one that
    caches any prefix caches it all: the breakpoint, if the format has one, goes at the end)."""
    return request.place_breakpoint and policy.cache.reads == BREAKPOINTS


def show(
    session: Session,
    draft: Draft,
    request: ViewRequest,
    counter: TokenCounter,
    tools: tuple[Mapping[str, Any], ...],
    warnings: Sequence[ViewWarning],
    cache: PromptCache,
    shrinks: Mapping[int, int] | None,
    repaired: RepairRun | None = None,
    assembled: Assembly | None = None,
    staked: float = 0.0,
) -> Shown:
    """The view of the draft (`warnings`: the budget's; `shrinks`: what the next render is
    expected to reduce, for the breakpoint; `staked`: what this render's rewrite already put at
    risk of the session's bank). `repaired` and `assembled`: the last render's, from the same
    state, which repair and rendering resume where the entries are the same."""
    # What each step resumes it compares with what it is given now: blocks, block by block.
    ordered, repair_warnings, run = repair(draft.ordered(), counter, repaired)
    view, assembly = assemble_view(
        session,
        ordered,
        request,
        counter,
        [*volatile.warnings_for(draft.leading_system(), tools), *warnings, *repair_warnings],
        draft.patches,
        assembled,
        run.kept if repaired is not None and assembled is not None and assembled.entries is repaired.out else 0,
    )
    segments = assembly.shown = assembly.segment_blocks.blocks(assembly.segments)
    previous = cache.previous
    shared = 0
    if previous is not None:  # (the segments the assembly took over are those of this record's)
        took_over = assembled is not None and previous.segments is assembled.shown
        shared = shared_prefix(previous.segments, segments, assembly.kept if took_over else 0)
    stable = first_divergence(previous.segments, segments, previous.total_tokens, shared) if previous else 0
    point = None
    early = judged(previous, stable)
    if request.place_breakpoint:
        read = cache.state.read_until(stable) if previous is not None else 0
        paid = paid_share(early)
        bank = previous.banked if previous is not None else 0.0
        stake = bank - staked if cache.pricing.stakes == BANKED else None
        point = place(segments, shrinks, cache.pricing, read, assembly.offset, paid, stake) if shrinks else None
        view, point = _with_breakpoint(view, assembly, draft, point)
    return Shown(view, assembly, run, segments, shared, stable, point, early)


def _with_breakpoint(
    view: View, assembly: Assembly, draft: Draft, point: Breakpoint | None
) -> tuple[View, Breakpoint | None]:
    """The view with its cache breakpoint marked where `point` says (None: at its end), in
    the Messages format's JSON; and the point, None when the format cannot mark it there."""
    if view.format is not ViewFormat.ANTHROPIC_MESSAGES:
        return view, point
    rendered = assembly.rendered
    marked = None
    if point is not None:
        through = point.through
        index = rendered.message_index.get(through)
        after = takewhile(lambda seq: seq != through, (s.seq for s in reversed(assembly.segments)))
        shared = index is not None and index >= 0 and any(rendered.message_index.get(s) == index for s in after)
        marked = mark_breakpoint(rendered, draft.entries[through], shared)
    if marked is None:
        point, marked = None, mark_breakpoint(rendered)
    if marked is None:
        return view, point
    message_parts, system_json = marked
    return replace(view, message_parts=message_parts, system_json=system_json), point
