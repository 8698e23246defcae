"""Views: a session's history rendered for one model call (DESIGN section 4).

This is the identity pipeline: every item appears in full. The transforms,
eligibility, cache timing and repair stages slot in between loading the
items and rendering them, and report through the same View.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contextd.engine.model import Item, Representation, Session
from contextd.engine.render.anthropic import render_anthropic
from contextd.engine.render.base import Rendered, ViewWarning
from contextd.engine.render.openai import render_openai
from contextd.engine.tokens import TokenCounter, block_tokens

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


@dataclass(frozen=True, slots=True)
class ViewItem:
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


_RENDERERS: dict[ViewFormat, Callable[[Sequence[Item]], Rendered]] = {
    ViewFormat.OPENAI_CHAT: render_openai,
    ViewFormat.ANTHROPIC_MESSAGES: render_anthropic,
}


def _view_item(item: Item, rendered: Rendered, counter: TokenCounter) -> ViewItem:
    """How `item` appears in the view, with the tokens of what the view actually carries."""
    index = rendered.message_index[item.seq]
    if item.seq in rendered.omitted:
        return ViewItem(item.seq, Representation.OMITTED, 0, index)
    dropped = rendered.dropped.get(item.seq)
    if not dropped:
        return ViewItem(item.seq, Representation.FULL, item.token_count, index)
    # Counting only what was left out keeps the common, complete case free.
    tokens = max(0, item.token_count - sum(block_tokens(b, counter) for b in dropped))
    return ViewItem(item.seq, Representation.REDUCED, tokens, index)


def to_json(value: Any) -> str:
    """The exact text a view carries: compact, key order as rendered, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def build_view(session: Session, items: Sequence[Item], request: ViewRequest, counter: TokenCounter) -> View:
    """Render `items` (the session's history up to `session.version`) as a view."""
    rendered = _RENDERERS[request.format](items)
    view_items = tuple(_view_item(item, rendered, counter) for item in items)
    item_tokens = sum(v.tokens for v in view_items)
    frames = len(rendered.messages) + (1 if rendered.system is not None else 0)
    framing = frames * FRAMING_TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS if frames else 0
    total = item_tokens + framing
    warnings = list(rendered.warnings)
    over = request.budget_tokens > 0 and total > request.budget_tokens
    if over:
        warnings.append(
            ViewWarning(
                "OVER_BUDGET",
                f"the view is {total:,} tokens, {total - request.budget_tokens:,} over the budget of "
                f"{request.budget_tokens:,}; no reducing transform is enabled for this session",
            )
        )
    return View(
        session_id=session.id,
        version=session.version,
        format=request.format,
        encoding=counter.encoding,
        messages_json=to_json(rendered.messages),
        system_json=to_json(rendered.system) if rendered.system is not None else "",
        items=view_items,
        item_tokens=item_tokens,
        framing_tokens=framing,
        total_tokens=total,
        budget_tokens=request.budget_tokens,
        over_budget=over,
        warnings=tuple(warnings),
        policy_version=session.policy_version,
    )
