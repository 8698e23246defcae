"""The budget (DESIGN section 4, after apply): a view still over its token budget after every
other step offloads its oldest unprotected whole turns to placeholders (a call and its
results together) until it fits, and says so (BUDGET_OFFLOADED). What cannot be offloaded
stays, and the view says it is over (OVER_BUDGET, view.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.eligibility import Protections
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Block, Representation, Role, TextBlock
from contextd.engine.render.base import ViewWarning
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import Draft, is_compression, new_representation
from contextd.engine.state import AppliedEdit, ControlMode, Slot, slot_of
from contextd.engine.timing import PromptCache, value_now
from contextd.engine.tokens import TokenCounter, blocks_tokens
from contextd.engine.types import Entry, Proposal, Remove
from contextd.engine.view import FRAMING_TOKENS_PER_MESSAGE, REPLY_PRIMING_TOKENS, ViewFormat, ViewRequest

BUDGET = "budget"
"""The rule and reason of what is offloaded to fit a view's token budget."""


@dataclass(frozen=True, slots=True)
class Fitted:
    applied: tuple[AppliedEdit, ...]
    """This render's edits applied now, the offloads last (a compression just made that an
    offload took over is not among them)."""
    warnings: tuple[ViewWarning, ...]
    certificates: tuple[CertificateBody, ...]
    """PRUNE, rule and reason `budget`, for each item offloaded."""


def fit_budget(
    draft: Draft,
    applied: Sequence[AppliedEdit],
    compressed: frozenset[Slot],
    request: ViewRequest,
    counter: TokenCounter,
    protected: Protections,
    relied: Mapping[int, int],
    cache: PromptCache,
) -> Fitted:
    """Offload what the budget needs from the draft, to which the edits in force and
    `applied` (this render's) are applied. An item shown whole or compressed (`compressed`:
    the slots a compression in force holds; or one of `applied`) is offloaded; one reduced
    otherwise stays as it is; so does a protected one, and one a reduction rests on
    (`relied`)."""
    compressed_now = compressed | {slot_of(a.edit) for a in applied if is_compression(a)}
    offloaded, warnings, certificates = _offload(draft, compressed_now, request, counter, protected, relied, cache)
    if not offloaded:
        return Fitted(tuple(applied), (), ())
    gone = {slot_of(a.edit) for a in offloaded}
    kept = [a for a in applied if slot_of(a.edit) not in gone]  # (a compression just made)
    return Fitted((*kept, *offloaded), warnings, certificates)


def _offload(
    draft: Draft,
    compressed: frozenset[Slot],
    request: ViewRequest,
    counter: TokenCounter,
    protected: Protections,
    relied: Mapping[int, int],
    cache: PromptCache,
) -> tuple[list[AppliedEdit], tuple[ViewWarning, ...], tuple[CertificateBody, ...]]:
    def offloadable(entry: Entry) -> bool:
        shown = entry.representation
        return shown is Representation.FULL or (shown is Representation.REDUCED and entry.seq in compressed)

    budget = request.budget_tokens
    # At most a message per entry: a view under that bound fits without counting messages.
    if (
        budget <= 0
        or draft.view_tokens + FRAMING_TOKENS_PER_MESSAGE * len(draft.entries) + REPLY_PRIMING_TOKENS <= budget
    ):
        return [], (), ()
    # Offloading leaves a placeholder in each place: the messages, and their framing, stay.
    framing = FRAMING_TOKENS_PER_MESSAGE * _messages(draft.ordered(), request.format) + REPLY_PRIMING_TOKENS

    def estimate() -> int:
        return draft.view_tokens + framing

    if estimate() <= budget:
        return [], (), ()
    start = estimate()
    turns: dict[int, list[int]] = {}
    for seq in draft.natural:
        turns.setdefault(draft.entries[seq].turn, []).append(seq)
    offsets = cache.previous.offsets() if cache.previous is not None else {}
    total = cache.state.previous_tokens
    why = (
        f"the view was {start:,} tokens, over its budget of {budget:,}, after every other step: "
        "the oldest unprotected turns go first"
    )
    applied: list[AppliedEdit] = []
    certificates: list[CertificateBody] = []
    offloaded_turns = 0
    for seqs in turns.values():
        if estimate() <= budget:
            break
        if not any(offloadable(draft.entries[s]) for s in seqs) or any(protected.of(s) or s in relied for s in seqs):
            continue  # nothing left to offload in it, or it must stay
        offloaded_turns += 1
        for seq in seqs:
            entry = draft.entries[seq]
            if not offloadable(entry):
                continue  # reduced otherwise (its slot is taken) or out
            edit = Remove(seq, True, _OFFLOADED)
            content, tokens = _offloaded.get((entry.item, counter), partial(_placeholder_of, entry, edit, counter))
            if tokens >= entry.tokens:
                continue  # (an item the size of its placeholder: asked again on every render, so remembered)
            position = offsets.get(seq, total)
            radius = max(0, total - cache.state.read_until(position))
            certificates.append(
                certificate(
                    entry,
                    Decision.PRUNE,
                    BUDGET,
                    BUDGET,
                    why,
                    proposal=Proposal(edit, 4, BUDGET, why),
                    new_tokens=tokens,
                    position=position,
                    radius=radius,
                    value=value_now(entry.tokens - tokens, radius, cache.pricing),
                )
            )
            done = AppliedEdit(edit, BUDGET, BUDGET, content, tokens, (), ControlMode.RULE)
            draft.apply(done)
            applied.append(done)
    if not applied:
        return [], (), ()
    saved = start - estimate()
    note = (
        f"{len(applied)} items of {offloaded_turns} turns ({saved:,} tokens) offloaded to placeholders to fit "
        f"the budget of {budget:,} tokens; their handles retrieve them"
    )
    return applied, (ViewWarning("BUDGET_OFFLOADED", note),), tuple(certificates)


_OFFLOADED = "offloaded to fit the view's token budget"
_offloaded: IdentityMemo[tuple[tuple[Block, ...], int]] = IdentityMemo(100_000)


def _placeholder_of(entry: Entry, edit: Remove, counter: TokenCounter) -> tuple[tuple[Block, ...], int]:
    content = new_representation(entry, edit, BUDGET)
    return content, blocks_tokens(content, counter)


def _messages(entries: Sequence[Entry], fmt: ViewFormat) -> int:
    """How many messages (with the system field) the entries render to, for their framing:
    one per entry for Chat Completions; for Responses, one per item an assistant turn splits
    into; for Messages and Converse, the leading system items make one field and consecutive
    items of one side merge (in Messages, a lone text never takes more)."""
    shown = [e for e in entries if e.representation is not Representation.OMITTED]
    if fmt is ViewFormat.OPENAI_CHAT:
        return len(shown)
    if fmt is ViewFormat.OPENAI_RESPONSES:
        return sum(_turn_items(e.content) if e.role is Role.ASSISTANT else 1 for e in shown)
    merges_after_text = fmt is ViewFormat.BEDROCK_CONVERSE
    count, side, closed, leading = 0, None, True, True
    for entry in shown:
        if entry.role is Role.SYSTEM and leading:
            count += 1 if side != "system" else 0
            side = "system"
            continue
        leading = False
        this = "assistant" if entry.role is Role.ASSISTANT else "user"
        if this != side or closed:
            count += 1
        side = this
        closed = not merges_after_text and len(entry.content) == 1 and isinstance(entry.content[0], TextBlock)
    return count


def _turn_items(content: Sequence[Block]) -> int:
    """Responses items of an assistant turn: each reasoning and call, and each run of text."""
    count, texting = 0, False
    for block in content:
        text = isinstance(block, TextBlock)
        count += 0 if text and texting else 1
        texting = text
    return count
