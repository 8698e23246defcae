"""ViewState: the decisions that stay in force for a session, and what its
previous render in each format sent (DESIGN section 3).

Applied edits are sticky: once a render shows an item reduced, every later
render shows it the same way, so the bytes a provider cached stay valid.
Deferred edits wait here for a cache-safe point. The state serializes to
JSON for storage; the view is a pure function of (history, policy, state).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any, NamedTuple

from contextd.engine.codec import blocks_from_json, blocks_to_json, canonical_json, compact_json
from contextd.engine.memo import shared_prefix
from contextd.engine.model import Block, ItemContent, Role
from contextd.engine.types import Edit, Insert, PatchRequest, Proposal, Remove, Reorder, Replace


class ControlMode(StrEnum):
    RULE = "rule"
    AGENT = "agent"
    OPERATOR = "operator"
    CLIENT = "client"
    """The client itself: a retraction (RetractItems)."""


class Counted:
    """The offsets a render counted (view.py's assembly): the map is the render's until a later
    render takes the assembly over and counts its own in it (`taken`)."""

    __slots__ = ("offsets", "taken")

    def __init__(self, offsets: dict[int, int]) -> None:
        self.offsets = offsets
        self.taken = False


class Segment(NamedTuple):
    """One entry of a rendered view, in order."""

    seq: int
    """The item's seq; negative for content a transform inserted."""
    digest: str
    """Identifies the representation: empty for the full item."""
    tokens: int


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    """An edit in force, with the representation it produced."""

    edit: Edit
    rule: str
    reason: str
    content: tuple[Block, ...] = ()
    """The item's new blocks (replace, remove with placeholder) or the inserted blocks."""
    tokens: int = 0
    """Tokens of `content`."""
    evidence_seqs: tuple[int, ...] = ()
    """Items the decision rested on: they stay in full while this edit is in force."""
    control: ControlMode = ControlMode.RULE


@dataclass(frozen=True, slots=True)
class PendingEdit:
    """An eligible edit waiting for a cache-safe point."""

    proposal: Proposal
    rule: str
    control: ControlMode


@dataclass(frozen=True, slots=True)
class PreviousRender:
    """What the latest render in one format sent: the prompt a provider may have cached."""

    rendered_at: float
    """Seconds since the epoch."""
    segments: Sequence[Segment]
    view_tokens: int = 0
    """The view's `total_tokens` (message framing included), as RenderView said it."""
    budget_tokens: int = 0
    """The budget the render was asked to fit (0: none)."""
    cached_ends: tuple[tuple[int, float], ...] = ()
    """Where earlier prompts that are, whole, a prefix of this one ended (token offsets,
    ascending), with when the provider last read or wrote each: the points a provider that
    caches at breakpoints can read this render back from, besides its own end."""
    cached_through: int | None = None
    """Where the render asked a provider that caches at breakpoints to end its own cache entry
    (the breakpoint the view placed, a token offset); None: at the render's end."""
    early: tuple[float, float] = (0.0, 0.0)
    """The record of early breakpoints in this format so far (breakpoint.py, `judged`): how many
    the next render judged, and how many of them paid (it changed what followed the breakpoint)."""
    history_tokens: int = 0
    """Tokens of the whole history at this render, framed as the view's messages were: the prompt
    an agent sending its history unedited would have sent."""
    banked: float = 0.0
    """Dollars the session's calls in this format so far are expected to have saved against
    sending the history whole, each call caching its prompt (timing.py, `banked`): what a
    rewrite of the cached prompt may stake."""
    counted: Counted | None = field(default=None, compare=False, repr=False)
    """What the render that made it counted its offsets in, while that holds them (not stored);
    for a record read or caught up, what `offsets` counted from the segments at its first use."""
    known_total: int | None = field(default=None, compare=False, repr=False)
    """`total_tokens`, likewise."""

    # A record read back or caught up by another replica's changes (changes.py) has neither:
    # each render from it asked for them several times, each a walk over every segment (at
    # 10,000 items about 0.3 ms for the total, 0.9 for the offsets). The segments do not change,
    # so what is counted from them once holds.

    @property
    def total_tokens(self) -> int:
        if self.known_total is not None:
            return self.known_total
        total: int = sum(map(attrgetter("tokens"), self.segments))
        object.__setattr__(self, "known_total", total)  # (frozen: a slot set once, as counted)
        return total

    @property
    def cached_tokens(self) -> int:
        """Tokens of the render the provider cached (to its breakpoint): what an edit can cost."""
        return self.total_tokens if self.cached_through is None else self.cached_through

    def offsets(self) -> Mapping[int, int]:
        """seq -> token offset where the item started (not to be changed)."""
        counted = self.counted
        if counted is not None and not counted.taken:
            return counted.offsets
        offset, found = 0, dict[int, int]()
        for segment in self.segments:
            found.setdefault(segment.seq, offset)
            offset += segment.tokens
        # This record's own: no assembly takes it over (`taken` stays False).
        object.__setattr__(self, "counted", Counted(found))
        return found


def _no_renders() -> Mapping[str, PreviousRender]:
    return {}


@dataclass(frozen=True, slots=True)
class ViewState:
    """The view state of a session: one set of decisions for every format, and
    per format what its latest render sent (each format is its own cache)."""

    view_version: int = 0
    """Renders of the session so far, in any format; 0 before the first."""
    policy_version: str = ""
    """The policy the decisions in force were made under."""
    renders: Mapping[str, PreviousRender] = field(default_factory=_no_renders)
    """By view format."""
    applied: tuple[AppliedEdit, ...] = ()
    pending: tuple[PendingEdit, ...] = ()
    decided: frozenset[str] = field(default_factory=frozenset)
    """Keys of KEEP and ABSTAIN decisions already certified, so a rule that
    proposes the same thing on every render is certified once."""


def first_divergence(
    previous: Sequence[Segment], current: Sequence[Segment], total: int | None = None, same: int | None = None
) -> int:
    """Tokens at the start of `current` identical to `previous` (where the two first differ);
    `total`: the tokens of `previous`, when known; `same`: the segments they share
    (`shared_prefix`), when known."""
    if same is None:  # a render that resumed the previous one shares its first segments
        same = shared_prefix(previous, current)
    if total is None:
        offset: int = sum(map(attrgetter("tokens"), previous[:same]))
    else:  # counted from the end: what follows the shared segments is the short part
        offset = total - sum(map(attrgetter("tokens"), previous[same:]))
    for old, new in zip(previous[same:], current[same:], strict=False):
        # Inserted content (negative seqs, numbered per render) is told apart by its digest alone.
        if old.digest != new.digest or (old.seq != new.seq and (old.seq > 0 or new.seq > 0)):
            return offset
        offset += old.tokens
    return offset


# ---------------------------------------------------------------- to JSON


def edit_to_json(edit: Edit) -> dict[str, Any]:
    match edit:
        case Replace(seq, content):
            return {"kind": "replace", "seq": seq, "content": blocks_to_json(content)}
        case Remove(seq, placeholder, note):
            removed: dict[str, Any] = {"kind": "remove", "seq": seq, "placeholder": placeholder}
            if note:
                removed["note"] = note
            return removed
        case Insert(after_seq, content):
            return {
                "kind": "insert",
                "after_seq": after_seq,
                "role": content.role.value,
                "content": blocks_to_json(content.content),
            }
        case Reorder(order):
            return {"kind": "reorder", "order": list(order)}
        case PatchRequest(name, value):
            return {"kind": "patch", "field": name, "value": value}
    raise TypeError(f"not an edit: {edit!r}")


def edit_key(edit: Edit) -> str:
    """The edit's identity: equal edits have equal keys."""
    return canonical_json(edit_to_json(edit)).decode()


Slot = int | str
"""What an edit occupies: an item (its seq), or a string naming something else."""


def slot_of(edit: Edit) -> Slot:
    """At most one edit per item, one reorder, one patch per request field; inserts are
    told apart by what they insert."""
    match edit:
        case Replace(seq) | Remove(seq):
            return seq
        case Reorder():
            return "reorder"
        case PatchRequest(name):
            return f"patch:{name}"
    return edit_key(edit)


def _edit_from_json(data: dict[str, Any]) -> Edit:
    kind = data["kind"]
    if kind == "replace":
        return Replace(data["seq"], blocks_from_json(data["content"]))
    if kind == "remove":
        return Remove(data["seq"], data["placeholder"], data.get("note", ""))
    if kind == "insert":
        return Insert(
            data["after_seq"], ItemContent(role=Role(data["role"]), content=blocks_from_json(data["content"]))
        )
    if kind == "reorder":
        return Reorder(tuple(data["order"]))
    return PatchRequest(data["field"], data["value"])


def _proposal_to_json(p: Proposal) -> dict[str, Any]:
    # Only eligible proposals wait, so `abstain` is always false here.
    return {
        "edit": edit_to_json(p.edit),
        "level": p.level,
        "reason": p.reason,
        "evidence": p.evidence,
        "evidence_seqs": list(p.evidence_seqs),
        **({"compression": True} if p.compression else {}),
        **({"on_entry": True} if p.on_entry else {}),
    }


def _proposal_from_json(data: dict[str, Any]) -> Proposal:
    return Proposal(
        _edit_from_json(data["edit"]),
        data["level"],
        data["reason"],
        data["evidence"],
        tuple(data["evidence_seqs"]),
        compression=data.get("compression", False),
        on_entry=data.get("on_entry", False),
    )


def applied_to_json(applied: AppliedEdit) -> dict[str, Any]:
    return {
        "edit": edit_to_json(applied.edit),
        "rule": applied.rule,
        "reason": applied.reason,
        "content": blocks_to_json(applied.content),
        "tokens": applied.tokens,
        "evidence_seqs": list(applied.evidence_seqs),
        "control": applied.control.value,
    }


def applied_from_json(data: dict[str, Any]) -> AppliedEdit:
    return AppliedEdit(
        _edit_from_json(data["edit"]),
        data["rule"],
        data["reason"],
        blocks_from_json(data["content"]),
        data["tokens"],
        tuple(data["evidence_seqs"]),
        ControlMode(data["control"]),
    )


def pending_to_json(pending: PendingEdit) -> dict[str, Any]:
    return {"proposal": _proposal_to_json(pending.proposal), "rule": pending.rule, "control": pending.control.value}


def pending_from_json(data: dict[str, Any]) -> PendingEdit:
    return PendingEdit(_proposal_from_json(data["proposal"]), data["rule"], ControlMode(data["control"]))


def state_to_json(state: ViewState) -> str:
    """The whole state as stored (a render stores its change, changes.py; this, now and then)."""
    renders = {name: _render_to_json(r) for name, r in sorted(state.renders.items())}
    return compact_json(
        {
            "view_version": state.view_version,
            "policy_version": state.policy_version,
            "renders": renders,
            "applied": [applied_to_json(a) for a in state.applied],
            "pending": [pending_to_json(p) for p in state.pending],
            "decided": sorted(state.decided),
        }
    )


def _render_to_json(render: PreviousRender) -> dict[str, Any]:
    return {
        "rendered_at": render.rendered_at,
        "segments": [[s.seq, s.digest, s.tokens] for s in render.segments],
        "view_tokens": render.view_tokens,
        "budget_tokens": render.budget_tokens,
        **({"cached_ends": [list(end) for end in render.cached_ends]} if render.cached_ends else {}),
        **({"cached_through": render.cached_through} if render.cached_through is not None else {}),
        **({"early": list(render.early)} if render.early != (0.0, 0.0) else {}),
        **({"history_tokens": render.history_tokens} if render.history_tokens else {}),
        **({"banked": render.banked} if render.banked else {}),
    }


def early_from_json(value: Any) -> tuple[float, float]:
    """A stored record of early breakpoints (none in a state stored before it was kept)."""
    return (float(value[0]), float(value[1])) if value else (0.0, 0.0)


def state_from_json(text: str) -> ViewState:
    data = json.loads(text)
    return ViewState(
        view_version=data["view_version"],
        policy_version=data["policy_version"],
        renders={
            name: PreviousRender(
                r["rendered_at"],
                tuple(Segment(*s) for s in r["segments"]),
                r.get("view_tokens", 0),
                r.get("budget_tokens", 0),
                tuple((offset, used_at) for offset, used_at in r.get("cached_ends", ())),
                r.get("cached_through"),
                early_from_json(r.get("early")),
                r.get("history_tokens", 0),
                r.get("banked", 0.0),
            )
            for name, r in data["renders"].items()
        },
        applied=tuple(applied_from_json(a) for a in data["applied"]),
        pending=tuple(pending_from_json(p) for p in data["pending"]),
        decided=frozenset(data["decided"]),
    )
