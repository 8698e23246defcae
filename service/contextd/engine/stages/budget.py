"""The budget (DESIGN section 4, after apply): a view still over its token budget after every
other step offloads its oldest unprotected whole turns to placeholders (a call and its
results together) until it fits, and says so (BUDGET_OFFLOADED). What cannot be offloaded
stays, and the view says it is over (OVER_BUDGET, view.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.eligibility import Protections
from contextd.engine.memo import IdentityMemo, shared_prefix
from contextd.engine.model import Block, Representation, Role, TextBlock
from contextd.engine.render.base import ViewWarning
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import BudgetWalk, Draft, MessageCount, is_compression, new_representation
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
    compressed: AbstractSet[Slot],
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
    just = {slot_of(a.edit) for a in applied if is_compression(a)}  # (the others grow with the session)
    offloaded, warnings, certificates = _offload(draft, compressed, just, request, counter, protected, relied, cache)
    if not offloaded:
        return Fitted(tuple(applied), (), ())
    gone = {slot_of(a.edit) for a in offloaded}
    kept = [a for a in applied if slot_of(a.edit) not in gone]  # (a compression just made)
    return Fitted((*kept, *offloaded), warnings, certificates)


def _offload(
    draft: Draft,
    compressed: AbstractSet[Slot],
    just: set[Slot],
    request: ViewRequest,
    counter: TokenCounter,
    protected: Protections,
    relied: Mapping[int, int],
    cache: PromptCache,
) -> tuple[list[AppliedEdit], tuple[ViewWarning, ...], tuple[CertificateBody, ...]]:
    def offloadable(entry: Entry) -> bool:
        shown = entry.representation
        return shown is Representation.FULL or (
            shown is Representation.REDUCED and (entry.seq in compressed or entry.seq in just)
        )

    budget = request.budget_tokens
    # At most a message per entry: a view under that bound fits without counting messages.
    if (
        budget <= 0
        or draft.view_tokens + FRAMING_TOKENS_PER_MESSAGE * len(draft.entries) + REPLY_PRIMING_TOKENS <= budget
    ):
        return [], (), ()
    # Offloading leaves a placeholder in each place: the messages, and their framing, stay.
    framing = FRAMING_TOKENS_PER_MESSAGE * _messages(draft, request.format) + REPLY_PRIMING_TOKENS

    def estimate() -> int:
        return draft.view_tokens + framing

    if estimate() <= budget:
        return [], (), ()
    start = estimate()
    offsets = cache.previous.offsets() if cache.previous is not None else {}
    total = cache.state.previous_tokens
    why = (
        f"the view was {start:,} tokens, over its budget of {budget:,}, after every other step: "
        "the oldest unprotected turns go first"
    )
    applied: list[AppliedEdit] = []
    certificates: list[CertificateBody] = []
    offloaded_turns = 0

    def placeholder(entry: Entry) -> tuple[tuple[Block, ...], int]:
        edit = Remove(entry.seq, True, _OFFLOADED)
        return _offloaded.get((entry.item, counter), partial(_placeholder_of, entry, edit, counter))

    def worth(entry: Entry) -> bool:
        # (an item the size of its placeholder stays: asked again on every render, so remembered)
        return offloadable(entry) and placeholder(entry)[1] < entry.tokens

    walk = _Walk(draft, counter)
    for seqs in walk.turns():
        if estimate() <= budget:
            break
        if any(offloadable(draft.entries[s]) for s in seqs) and not any(protected.of(s) or s in relied for s in seqs):
            before = len(applied)
            for seq in seqs:
                entry = draft.entries[seq]
                if not worth(entry):
                    continue  # reduced otherwise (its slot is taken), out, or no larger than its placeholder
                content, tokens = placeholder(entry)
                edit = Remove(seq, True, _OFFLOADED)
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
            offloaded_turns += len(applied) > before
        entries = [draft.entries[s] for s in seqs]
        walk.visited(seqs, not any(map(worth, entries)) or any(protected.lasting(s) for s in seqs))
    draft.budget_walk, draft.touched = walk.found(), set()
    if not applied:
        return [], (), ()
    saved = start - estimate()
    note = (
        f"{len(applied)} items of {offloaded_turns} turns ({saved:,} tokens) offloaded to placeholders to fit "
        f"the budget of {budget:,} tokens; their handles retrieve them"
    )
    return applied, (ViewWarning("BUDGET_OFFLOADED", note),), tuple(certificates)


class _Walk:
    """The turns a budget walk visits, oldest first: every turn of the draft; or, when the draft
    follows one a walk went through (`Draft.budget_walk`, with the same counter), the turns that
    walk left unsettled, those holding an entry an edit changed since, and every turn from where
    it stopped. A turn left out is settled: the walk would not offload from it (draft.py,
    `BudgetWalk`), so the walk offloads what the walk of every turn offloads, in a time that
    grows with the turns it has left to weigh, not with the session."""

    def __init__(self, draft: Draft, counter: TokenCounter) -> None:
        self.draft, self.counter = draft, counter
        natural = draft.natural
        last = draft.budget_walk
        if last is None or last.counter is not counter:
            self.starts: list[int] = []
            self.tail = 0
        else:
            touched = {self._opening(s) for s in draft.touched if 0 < s < last.until}
            self.starts = sorted(touched.union(last.unsettled))
            self.tail = bisect_left(natural, last.until)
        self.left: list[int] = []
        """Visited turns found unsettled, by their first seq."""
        self.seen: set[int] = set()
        self.walked = self.tail
        """Where the turns not yet visited from `tail` on begin (an index into the natural order)."""

    def _opening(self, seq: int) -> int:
        """The first seq of the turn of history item `seq`."""
        natural, entries = self.draft.natural, self.draft.entries
        i = bisect_left(natural, seq)
        turn = entries[natural[i]].turn
        while i > 0 and entries[natural[i - 1]].turn == turn:
            i -= 1
        return natural[i]

    def _turn_at(self, i: int) -> list[int]:
        natural, entries = self.draft.natural, self.draft.entries
        turn, seqs = entries[natural[i]].turn, []
        while i < len(natural) and entries[natural[i]].turn == turn:
            seqs.append(natural[i])
            i += 1
        return seqs

    def turns(self) -> Iterator[list[int]]:
        natural = self.draft.natural
        for start in self.starts:
            yield self._turn_at(bisect_left(natural, start))
        i = self.tail
        while i < len(natural):
            seqs = self._turn_at(i)
            yield seqs
            i += len(seqs)

    def visited(self, seqs: list[int], settled: bool) -> None:
        """The walk went through the turn of `seqs`, which is `settled` now."""
        self.seen.add(seqs[0])
        if not settled:
            self.left.append(seqs[0])
        natural = self.draft.natural
        if self.walked < len(natural) and natural[self.walked] == seqs[0]:
            self.walked += len(seqs)

    def found(self) -> BudgetWalk:
        """What the next walk may start from. The last turn is left unsettled whatever it holds:
        the items appended next may join it."""
        natural = self.draft.natural
        if not natural:
            return BudgetWalk(self.counter, (), 0)
        until = natural[self.walked] if self.walked < len(natural) else self._opening(natural[-1])
        unsettled = {s for s in self.left if s < until}
        unsettled.update(s for s in self.starts if s not in self.seen)
        return BudgetWalk(self.counter, tuple(sorted(unsettled)), until)


_OFFLOADED = "offloaded to fit the view's token budget"
_offloaded: IdentityMemo[tuple[tuple[Block, ...], int]] = IdentityMemo(100_000)


def _placeholder_of(entry: Entry, edit: Remove, counter: TokenCounter) -> tuple[tuple[Block, ...], int]:
    content = new_representation(entry, edit, BUDGET)
    return content, blocks_tokens(content, counter)


def _messages(draft: Draft, fmt: ViewFormat) -> int:
    """How many messages (with the system field) the draft's entries render to, for their
    framing: one per entry shown for Chat Completions; for Responses, one per item an assistant
    turn splits into; for Messages and Converse, the leading system items make one field and
    consecutive items of one side merge (in Messages, a lone text never takes more). Counted on
    from where the entries first differ from those the last count of a draft this one follows
    counted (`Draft.message_count`): the count is a fold over the entries in order."""
    entries = draft.ordered()
    last = draft.message_count
    same = 0
    if last is not None and last.format is fmt:
        same = shared_prefix(last.entries, entries)
    after = last.after[:same] if last is not None and same else []
    state = after[-1] if after else _OPENING
    fold = (
        _fold_chat
        if fmt is ViewFormat.OPENAI_CHAT
        else _fold_responses
        if fmt is ViewFormat.OPENAI_RESPONSES
        else (partial(_fold_merged, merges_after_text=fmt is ViewFormat.BEDROCK_CONVERSE))
    )
    for entry in entries[same:]:
        state = fold(state, entry)
        after.append(state)
    draft.message_count = MessageCount(fmt, entries, after)
    return state[0]


_Fold = tuple[int, str | None, bool, bool]
"""After an entry: messages so far, the side of the last one, whether it is closed (a lone text
in Messages), whether only system items came before."""
_OPENING: _Fold = (0, None, True, True)


def _fold_chat(state: _Fold, entry: Entry) -> _Fold:
    return state if entry.representation is Representation.OMITTED else (state[0] + 1, None, True, False)


def _fold_responses(state: _Fold, entry: Entry) -> _Fold:
    if entry.representation is Representation.OMITTED:
        return state
    return (state[0] + (_turn_items(entry.content) if entry.role is Role.ASSISTANT else 1), None, True, False)


def _fold_merged(state: _Fold, entry: Entry, *, merges_after_text: bool) -> _Fold:
    if entry.representation is Representation.OMITTED:
        return state
    total, side, closed, leading = state
    if entry.role is Role.SYSTEM and leading:
        return (total + (1 if side != "system" else 0), "system", closed, True)
    this = "assistant" if entry.role is Role.ASSISTANT else "user"
    if this != side or closed:
        total += 1
    lone_text = len(entry.content) == 1 and isinstance(entry.content[0], TextBlock)
    return (total, this, not merges_after_text and lone_text, False)


def _turn_items(content: Sequence[Block]) -> int:
    """Responses items of an assistant turn: each reasoning and call, and each run of text."""
    count, texting = 0, False
    for block in content:
        text = isinstance(block, TextBlock)
        count += 0 if text and texting else 1
        texting = text
    return count
