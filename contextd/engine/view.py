"""Views: a session's history rendered for one model call (DESIGN section 3).

The pipeline (pipeline.py) decides how each item appears; this module turns
the result into the provider's format and counts it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter
from typing import Any, NamedTuple

from contextd.engine.codec import blocks_to_json, canonical_json
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Block, Representation, Session
from contextd.engine.placeholders import handle_of
from contextd.engine.render.anthropic import render_anthropic
from contextd.engine.render.base import Renderable, Rendered, ViewWarning, to_json
from contextd.engine.render.openai import render_openai
from contextd.engine.state import Segment
from contextd.engine.tokens import TokenCounter, block_tokens
from contextd.engine.transforms import Entry

FRAMING_TOKENS_PER_MESSAGE = 3
"""Role and separator tokens a provider wraps each message in (OpenAI's
published figure for its chat models; used as the estimate for both)."""

REPLY_PRIMING_TOKENS = 3
"""Tokens that prime the assistant's reply, once per request."""


class ViewFormat(StrEnum):
    OPENAI_CHAT = "openai_chat"
    ANTHROPIC_MESSAGES = "anthropic_messages"


@dataclass(frozen=True, slots=True)
class ViewRequest:
    format: ViewFormat
    budget_tokens: int = 0
    """0 means no budget."""
    focus: tuple[str, ...] = ()


class ViewItem(NamedTuple):
    seq: int
    representation: Representation
    tokens: int
    message_index: int
    handle: str = ""


@dataclass(frozen=True, slots=True)
class View:
    session_id: str
    version: int
    format: ViewFormat
    encoding: str
    messages_json: str
    system_json: str
    """Anthropic's ``system`` as JSON; empty when there is none."""
    items: tuple[ViewItem, ...]
    item_tokens: int
    framing_tokens: int
    total_tokens: int
    budget_tokens: int
    over_budget: bool
    warnings: tuple[ViewWarning, ...]
    policy_version: str = ""
    request_patch_json: str = "{}"
    """Provider request fields the view asks the client to set."""
    view_version: int = 0
    stable_prefix_tokens: int = 0
    """Tokens at the start identical to the previous render's (what a prompt cache can reuse)."""


_RENDERERS: dict[ViewFormat, Callable[[Sequence[Renderable]], Rendered]] = {
    ViewFormat.OPENAI_CHAT: render_openai,
    ViewFormat.ANTHROPIC_MESSAGES: render_anthropic,
}


_digests: IdentityMemo[str] = IdentityMemo(100_000)


def representation_digest(blocks: tuple[Block, ...]) -> str:
    """Identifies a representation; remembered, as edits in force come back on every render."""
    return _digests.get((blocks,), lambda: hashlib.sha256(canonical_json(blocks_to_json(blocks))).hexdigest()[:16])


def assemble_view(
    session: Session,
    entries: Sequence[Entry],
    request: ViewRequest,
    counter: TokenCounter,
    warnings: Sequence[ViewWarning] = (),
    patches: Mapping[str, Any] | None = None,
) -> tuple[View, tuple[Segment, ...]]:
    """Render the entries (in view order) and count; also the segments a later render compares against."""
    shown = [e for e in entries if e.representation is not Representation.OMITTED]
    rendered = _RENDERERS[request.format](shown)
    view_items, segments = _itemize(entries, rendered, counter)
    inserted = sum(e.tokens for e in shown if e.seq < 0)
    item_tokens = sum(v.tokens for v in view_items) + inserted
    frames = len(rendered.messages) + (1 if rendered.system is not None else 0)
    framing = frames * FRAMING_TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS if frames else 0
    total = item_tokens + framing
    notes = [*warnings, *rendered.warnings]
    over = request.budget_tokens > 0 and total > request.budget_tokens
    if over:
        notes.append(
            ViewWarning(
                "OVER_BUDGET",
                f"the view is {total:,} tokens, {total - request.budget_tokens:,} over the budget of "
                f"{request.budget_tokens:,}; the session's rules found nothing more they may remove",
            )
        )
    view = View(
        session_id=session.id,
        version=session.version,
        format=request.format,
        encoding=counter.encoding,
        messages_json=to_json(rendered.messages)
        if rendered.messages_json is None
        else "[" + ",".join(rendered.messages_json) + "]",
        system_json=to_json(rendered.system) if rendered.system is not None else "",
        items=view_items,
        item_tokens=item_tokens,
        framing_tokens=framing,
        total_tokens=total,
        budget_tokens=request.budget_tokens,
        over_budget=over,
        warnings=tuple(notes),
        policy_version=session.policy_version,
        request_patch_json=to_json(dict(patches or {})),
    )
    return view, segments


def _itemize(
    entries: Sequence[Entry], rendered: Rendered, counter: TokenCounter
) -> tuple[tuple[ViewItem, ...], tuple[Segment, ...]]:
    """The view items (in seq order) and the segments (in view order), in one pass.

    This runs over every item on every render: a plain loop, the common case
    (an item shown in full) first and inline.
    """
    full, omitted, index_of, dropped = Representation.FULL, rendered.omitted, rendered.message_index, rendered.dropped
    items: list[ViewItem] = []
    segments: list[Segment] = []
    in_order, last = True, 0
    for entry in entries:
        seq = entry.item.seq
        kind = entry.representation
        if kind is full:
            if seq not in omitted:
                # Inserted content has no history of its own to compare: its digest tells it apart.
                segments.append(Segment(seq, "" if seq > 0 else representation_digest(entry.content), entry.tokens))
        elif kind is not Representation.OMITTED and seq not in omitted:
            segments.append(Segment(seq, representation_digest(entry.content), entry.tokens))
        if seq <= 0:
            continue
        in_order, last = in_order and seq > last, seq
        index = index_of.get(seq, -1)
        if kind is full and index >= 0 and seq not in dropped:
            items.append(ViewItem(seq, full, entry.tokens, index))
        else:
            items.append(_view_item(entry, rendered, counter))
    if not in_order:
        items.sort(key=attrgetter("seq"))
    return tuple(items), tuple(segments)


def _view_item(entry: Entry, rendered: Rendered, counter: TokenCounter) -> ViewItem:
    """How an item appears in the view, with the tokens of what the view actually carries."""
    index = rendered.message_index.get(entry.seq, -1)
    full = entry.representation is Representation.FULL
    handle = "" if full else handle_of(entry.item)
    if entry.representation is Representation.OMITTED or entry.seq in rendered.omitted:
        return ViewItem(entry.seq, Representation.OMITTED, 0, -1, handle_of(entry.item))
    dropped = rendered.dropped.get(entry.seq)
    if not dropped:
        return ViewItem(entry.seq, entry.representation, entry.tokens, index, handle)
    # Counting only what the format left out keeps the common, complete case free.
    tokens = max(0, entry.tokens - sum(block_tokens(b, counter) for b in dropped))
    kind = Representation.REDUCED if entry.representation is Representation.FULL else entry.representation
    return ViewItem(entry.seq, kind, tokens, index, handle_of(entry.item))
