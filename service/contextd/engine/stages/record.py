"""The new view state (DESIGN section 4, last): the decisions in force after this render and
what it sent, the view stamped with its versions, and how the provider is expected to bill
the call made with it. The certificates are the stages' own, in their order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from operator import attrgetter

from contextd.engine.changes import StateChange, change_of
from contextd.engine.policy import Policy
from contextd.engine.stages.show import Shown
from contextd.engine.state import AppliedEdit, PendingEdit, PreviousRender, Slot, ViewState, slot_of
from contextd.engine.timing import PromptCache, Usage, banked, ends_after, predicted_usage
from contextd.engine.view import FRAMING_TOKENS_PER_MESSAGE, Assembly, View, ViewRequest


@dataclass(frozen=True, slots=True)
class Recorded:
    view: View
    """Stamped with the view version, the stable prefix, the policy and the breakpoint."""
    state: ViewState
    change: StateChange
    """How `state` follows from the state before (what is stored)."""
    predicted: Usage


def record(
    shown: Shown,
    state: ViewState,
    policy: Policy,
    request: ViewRequest,
    now: float,
    cache: PromptCache,
    *,
    in_force: Sequence[AppliedEdit],
    compressed: AbstractSet[Slot],
    applied: Sequence[AppliedEdit],
    durable: Sequence[AppliedEdit],
    pending: Sequence[PendingEdit],
    decided: frozenset[str],
    items: int,
    history_tokens: int,
) -> Recorded:
    """The state after a render that kept `in_force` (`compressed`: the slots an edit of this
    render may have taken over: its compressions', and the budget's earlier offloads it took
    into a run of whole turns),
    applied `applied` (`durable`: in history mode) and deferred `pending`; `decided`: the
    refusals certified so far; `items`: the history version rendered, of `history_tokens`
    tokens."""
    superseded = compressed & {slot_of(a.edit) for a in (*applied, *durable)}
    if superseded:
        in_force = [a for a in in_force if slot_of(a.edit) not in superseded]
    view, assembly, point, stable = shown.view, shown.assembly, shown.point, shown.stable
    previous = cache.previous
    cached = point.offset if point is not None else None
    predicted = predicted_usage(cache.state, stable, cached, view.total_tokens, cache.pricing, _framing(assembly))
    history = history_tokens + view.total_tokens - assembly.offset  # framed as the view's messages are
    new_state = ViewState(
        view_version=state.view_version + 1,
        policy_version=policy.version,
        renders={
            **state.renders,
            request.format.value: PreviousRender(
                now,
                shown.segments,
                view.total_tokens,
                request.budget_tokens,
                ends_after(previous, stable, point.offset if point else assembly.offset, now, policy.cache),
                cached,
                shown.early,
                history,
                banked(previous, cache.state, history, predicted, cache.pricing),
                counted=assembly.counted,
                known_total=assembly.offset,
            ),
        },
        applied=(*in_force, *applied),
        pending=tuple(pending),
        decided=decided,
    )
    view = replace(
        view,
        view_version=new_state.view_version,
        stable_prefix_tokens=stable,
        policy_version=policy.version,
        cache_breakpoint_seq=point.through if point is not None else 0,
    )
    change = change_of(state, new_state, request.format.value, items, in_force, applied, shown.shared)
    return Recorded(view, new_state, change, predicted)


def _framing(assembly: Assembly) -> Callable[[int], int]:
    """The view's tokens up to an offset of its items' tokens (an item's start): with the
    framing of each message that ends before it, and of Anthropic's system field. Read off the
    marks the assembly keeps before each entry: no pass over the view."""
    marks, rendered = assembly.marks, assembly.rendered
    system = 1 if rendered.system is not None else 0

    def framed(tokens: int) -> int:
        at = bisect_left(marks, tokens, key=attrgetter("offset"))
        if at == len(marks):
            closed = len(rendered.messages)
        else:  # the messages before the entry there, less the one it joins
            closed = marks[at].messages - (0 if marks[at].opens or not marks[at].messages else 1)
        return tokens + FRAMING_TOKENS_PER_MESSAGE * (closed + (system if tokens else 0))

    return framed
