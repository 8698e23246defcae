"""Retraction: a client withdraws items from the conversation (a framework popping its
latest item, or redacting it for safety).

The history stays append-only: a retraction is a durable edit (a mutation event,
like a history-mode rule's) naming the item, in force in every later view whatever
the pins. A retracted item is left out of the view; a retracted tool result leaves
its call answered by a marker that names no handle (the providers need every call
answered; retract the assistant turn too to remove both), and the results of a
retracted call go with it (repair). A retracted item is no evidence for any rule
(stages/draft.py leaves it out of what the rules see), and an edit that rested on it
is undone (stages/load.py).

A redaction is a retraction whose content is also withheld from every read (the
service refuses Retrieve, leaves it out of Search and ExplainItem, and drops it from
the stash); the history still holds it until the session is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.model import Block, Item, TextBlock, ToolResultBlock
from contextd.engine.placeholders import PREFIX, describe, handle_of
from contextd.engine.state import AppliedEdit, ControlMode
from contextd.engine.tokens import TokenCounter, blocks_tokens
from contextd.engine.types import Remove, target_of

RULE = "retraction"
RETRACTED = "retracted"
REDACTED = "redacted"


def retraction(item: Item, redact: bool, counter: TokenCounter) -> AppliedEdit:
    """The durable edit that retracts `item` (and withholds it, with `redact`)."""
    reason = REDACTED if redact else RETRACTED
    result = item.tool_result
    if result is None:
        return AppliedEdit(Remove(item.seq, placeholder=False), RULE, reason, control=ControlMode.CLIENT)
    marker = TextBlock(f"{PREFIX} {describe(item)} {reason} by the client]")
    content: tuple[Block, ...] = (ToolResultBlock(result.tool_use_id, (marker,), False, result.name),)
    tokens = blocks_tokens(content, counter)
    return AppliedEdit(Remove(item.seq, placeholder=True), RULE, reason, content, tokens, control=ControlMode.CLIENT)


def certificate_of(item: Item, applied: AppliedEdit, why: str) -> CertificateBody:
    """The PRUNE certificate of a retraction: what it took out of the view, and the handle
    that gets the original back (none for a redaction: nothing does)."""
    return CertificateBody(
        seq=item.seq,
        decision=Decision.PRUNE,
        level=0,
        rule=RULE,
        reason=applied.reason,
        evidence="",
        rationale=why or f"{applied.reason} by the client",
        handle="" if applied.reason == REDACTED else handle_of(item),
        protection="",
        tokens_removed=item.token_count,
        placeholder_tokens=applied.tokens,
        first_divergence_tokens=0,
        mutation_radius_tokens=0,
        cost_effect=0.0,
        control=ControlMode.CLIENT,
    )


def is_retraction(applied: AppliedEdit) -> bool:
    return applied.rule == RULE and applied.control is ControlMode.CLIENT


def retracted(durable: Iterable[AppliedEdit]) -> frozenset[int]:
    """The seqs the durable edits retract."""
    return frozenset(seq for a in durable if is_retraction(a) and (seq := target_of(a.edit)) is not None)
