"""The budget (DESIGN section 4, after apply): a view still over its token budget after every
other step offloads its oldest unprotected turns until it fits, each item to a placeholder with
its handle, then, if that is not enough, whole turns behind one marker (`_Offload`), down to the
cache's low water, and says so (BUDGET_OFFLOADED). What cannot be offloaded stays, and the view
says it is over (OVER_BUDGET, view.py).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.eligibility import Protections
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Block, Representation, Role, TextBlock
from contextd.engine.placeholders import turns_note, turns_text
from contextd.engine.render.base import ViewWarning
from contextd.engine.stages.certify import certificate
from contextd.engine.stages.draft import BUDGET, BudgetWalk, Draft, is_compression, new_representation
from contextd.engine.stages.messages import count_messages
from contextd.engine.state import AppliedEdit, ControlMode, Slot, slot_of
from contextd.engine.timing import PromptCache, value_now
from contextd.engine.tokens import TokenCounter, blocks_tokens
from contextd.engine.types import Entry, Proposal, Remove
from contextd.engine.view import FRAMING_TOKENS_PER_MESSAGE, REPLY_PRIMING_TOKENS, ViewFormat, ViewRequest


@dataclass(frozen=True, slots=True)
class Fitted:
    applied: tuple[AppliedEdit, ...]
    """This render's edits applied now, the offloads last (a compression just made that an
    offload took over is not among them)."""
    warnings: tuple[ViewWarning, ...]
    certificates: tuple[CertificateBody, ...]
    """PRUNE, rule and reason `budget`, for each item offloaded."""
    remarked: frozenset[Slot] = frozenset()
    """Items an earlier render's offload holds (a placeholder, a run's marker) that this render
    took into a run of whole turns: the edit in force there gives way to this one's (in
    `applied`)."""


def fit_budget(
    draft: Draft,
    applied: Sequence[AppliedEdit],
    compressed: AbstractSet[Slot],
    request: ViewRequest,
    counter: TokenCounter,
    protected: Protections,
    relied: Mapping[int, int],
    cache: PromptCache,
    in_force: Mapping[int, int],
) -> Fitted:
    """Offload what the budget needs from the draft, to which the edits in force and
    `applied` (this render's) are applied. An item shown whole or compressed (`compressed`:
    the slots a compression in force holds; or one of `applied`) is offloaded; one reduced
    otherwise stays as it is; so does a protected one, and one a reduction rests on
    (`relied`; `in_force`: those the edits in force rest on, of them)."""
    just = {slot_of(a.edit) for a in applied if is_compression(a)}  # (the others grow with the session)
    offloaded, warnings, certificates, remarked = _offload(
        draft, compressed, just, request, counter, protected, relied, cache, in_force
    )
    if not offloaded:
        return Fitted(tuple(applied), (), ())
    gone = {slot_of(a.edit) for a in offloaded}
    kept = [a for a in applied if slot_of(a.edit) not in gone]  # (a compression just made)
    return Fitted((*kept, *offloaded), warnings, certificates, frozenset(remarked))


def _offload(
    draft: Draft,
    compressed: AbstractSet[Slot],
    just: set[Slot],
    request: ViewRequest,
    counter: TokenCounter,
    protected: Protections,
    relied: Mapping[int, int],
    cache: PromptCache,
    in_force: Mapping[int, int],
) -> tuple[list[AppliedEdit], tuple[ViewWarning, ...], tuple[CertificateBody, ...], set[Slot]]:
    budget = request.budget_tokens
    # At most a message per entry: a view under that bound fits without counting messages.
    if (
        budget <= 0
        or draft.view_tokens + FRAMING_TOKENS_PER_MESSAGE * len(draft.entries) + REPLY_PRIMING_TOKENS <= budget
    ):
        return [], (), (), set()
    walk = _Offload(draft, compressed, just, request, counter, protected, relied, cache, in_force)
    if walk.estimate() <= budget:
        return [], (), (), set()
    walk.each_item()
    if not walk.within(budget):  # (else it fits, if with less room than the low water's)
        walk.whole_turns()
    if not walk.applied:
        return [], (), (), set()
    saved, runs = walk.start - walk.estimate(), len(walk.runs)
    whole = f", {runs} run{'s' if runs != 1 else ''} of whole turns behind one marker each" if runs else ""
    note = (
        f"{len(walk.applied)} items of {len(walk.turns)} turns ({saved:,} tokens) offloaded to fit the budget of "
        f"{budget:,} tokens, down to {walk.goal:,} so that the calls after this one read the prompt from the cache"
        f"{whole}; their handles or seqs retrieve them"
    )
    return walk.applied, (ViewWarning("BUDGET_OFFLOADED", note),), tuple(walk.certificates), walk.remarked


class _Offload:
    """One walk of the budget, in two passes, oldest turns first, down to the cache's low water
    (`CachePolicy.low_water`: the room left lets the calls after it read the rewritten prompt):

    * each item to a placeholder with its handle (`each_item`): a turn keeps its calls, which
      the placeholders of their results need (pairs go together);
    * then, if the view does not fit even so, whole turns (`whole_turns`): calls and results
      leave together, placeholders made before included, behind one marker for each run of
      turns left out one after another. The calls of a long session alone outgrow any budget;
      a short one keeps each call beside its result's handle.
    """

    def __init__(
        self,
        draft: Draft,
        compressed: AbstractSet[Slot],
        just: AbstractSet[Slot],
        request: ViewRequest,
        counter: TokenCounter,
        protected: Protections,
        relied: Mapping[int, int],
        cache: PromptCache,
        in_force: Mapping[int, int],
    ) -> None:
        self.draft, self.compressed, self.just, self.request, self.counter = draft, compressed, just, request, counter
        self.protected, self.relied, self.cache, self.in_force = protected, relied, cache, in_force
        # A placeholder leaves its message in place; a turn left out whole takes its messages.
        self.framing = FRAMING_TOKENS_PER_MESSAGE * count_messages(draft, request.format) + REPLY_PRIMING_TOKENS
        self.left_out = 0
        """Entries left out since `framing` was counted: a message fewer each in Chat Completions,
        at least that in Responses; in the formats that merge a side's items into one message,
        perhaps none (those are counted again before the walk stops)."""
        self.merged = request.format in (ViewFormat.ANTHROPIC_MESSAGES, ViewFormat.BEDROCK_CONVERSE)
        budget = request.budget_tokens
        self.start = self.estimate()
        self.goal = min(budget, int(budget * cache.pricing.low_water))
        self.offsets = cache.previous.offsets() if cache.previous is not None else {}
        self.why = (
            f"the view was {self.start:,} tokens, over its budget of {budget:,}, after every other step: "
            f"the oldest unprotected turns go first, down to {self.goal:,} tokens (the cache's low water)"
        )
        self.applied: list[AppliedEdit] = []
        self.certificates: list[CertificateBody] = []
        self.placed: dict[int, int] = {}
        """seq -> where this walk's edit of it is among `applied`."""
        self.certified: dict[int, int] = {}
        """seq -> where its certificate is among `certificates`."""
        self.shown: dict[int, Entry] = {}
        """What this walk changed, as shown before it."""
        self.remarked: set[Slot] = set()
        """Items an earlier render's offload holds (a placeholder, a marker) that this walk took
        into a run: certified then, their edits give way to this walk's."""
        self.runs: list[_Run] = []
        self.waiting: list[list[int]] = []
        """Turns one after another that may begin a run, until there are enough of them."""
        self.turns: set[int] = set()

    def estimate(self) -> int:
        return self.draft.view_tokens + self.framing - FRAMING_TOKENS_PER_MESSAGE * self.left_out

    def within(self, tokens: int) -> bool:
        """Whether the view is down to `tokens` (its messages counted again where merged)."""
        if self.estimate() > tokens:
            return False
        if self.merged and self.left_out:
            self.framing = FRAMING_TOKENS_PER_MESSAGE * count_messages(self.draft, self.request.format)
            self.framing += REPLY_PRIMING_TOKENS
            self.left_out = 0
        return self.estimate() <= tokens

    def offloadable(self, entry: Entry) -> bool:
        """Shown whole or compressed (a compression gives way to the budget)."""
        shown = entry.representation
        return shown is Representation.FULL or (
            shown is Representation.REDUCED and (entry.seq in self.compressed or entry.seq in self.just)
        )

    def put(self, entry: Entry, edit: Remove, content: tuple[Block, ...], tokens: int) -> None:
        """Apply `edit` to `entry`'s item (in place of this walk's earlier edit of it) and
        certify it, unless an earlier render's offload holds the item."""
        seq = entry.seq
        done = AppliedEdit(edit, BUDGET, BUDGET, content, tokens, (), ControlMode.RULE)
        if seq in self.placed:
            self.applied[self.placed[seq]] = done
        else:
            self.shown[seq] = entry
            self.placed[seq] = len(self.applied)
            self.applied.append(done)
            if seq in self.draft.offloaded or seq in self.draft.runs:
                self.remarked.add(seq)
        self.draft.apply(done)
        if seq in self.remarked:
            return
        before = self.shown[seq]
        position = self.offsets.get(seq, self.cache.state.previous_tokens)
        radius = max(0, self.cache.state.previous_tokens - self.cache.state.read_until(position))
        body = certificate(
            before,
            Decision.PRUNE,
            BUDGET,
            BUDGET,
            self.why,
            proposal=Proposal(edit, 4, BUDGET, self.why),
            new_tokens=tokens,
            position=position,
            radius=radius,
            value=value_now(before.tokens - tokens, radius, self.cache.pricing),
        )
        if seq in self.certified:
            self.certificates[self.certified[seq]] = body
        else:
            self.certified[seq] = len(self.certificates)
            self.certificates.append(body)

    # ------------------------------------------------------------ each item

    def placeholder(self, entry: Entry) -> tuple[tuple[Block, ...], int]:
        edit = Remove(entry.seq, True, _OFFLOADED)
        return _offloaded.get((entry.item, self.counter), partial(_placeholder_of, entry, edit, self.counter))

    def worth(self, entry: Entry) -> bool:
        # (an item the size of its placeholder stays: asked again on every render, so remembered)
        return self.offloadable(entry) and self.placeholder(entry)[1] < entry.tokens

    def each_item(self) -> None:
        draft, protected = self.draft, self.protected
        walk = _Walk(draft, self.counter)
        for seqs in walk.turns():
            if self.within(self.goal):
                break
            entries = [draft.entries[s] for s in seqs]
            if any(map(self.worth, entries)) and not any(protected.of(s) or s in self.relied for s in seqs):
                self.turns.add(entries[0].turn)
                for entry in entries:
                    if self.worth(entry):  # (else reduced otherwise, its slot taken; out; or small)
                        content, tokens = self.placeholder(entry)
                        self.put(entry, Remove(entry.seq, True, _OFFLOADED), content, tokens)
            entries = [draft.entries[s] for s in seqs]
            walk.visited(
                seqs, not any(map(self.worth, entries)) or any(protected.lasting(s) or s in self.in_force for s in seqs)
            )
        if draft.kept_turns and draft.touched:  # the walk of whole turns resumes before what changed
            del draft.kept_turns[bisect_right(draft.kept_turns, min(draft.touched)) :]
        draft.budget_walk, draft.touched = walk.found(), set()

    # ------------------------------------------------------------ whole turns

    def whole_turns(self) -> None:
        """Oldest first, past the runs left out before, turns whose every item may go.

        A turn kept for good (`kept_for_good`) ends whatever run came before it, and what
        follows it starts afresh: a walk that found every turn it kept before one kept for good
        kept for good resumes from there the next time (`Draft.kept_turns`; each item's walk
        takes them back to before an entry an edit changed since). Before it, every turn is
        left out, kept for good, or among too few turns between two kept for good to make a
        run, and stays so: the walk leaves out what a walk from the first turn would, in a
        time that grows with the turns after it, not with the session."""
        draft = self.draft
        kept = draft.kept_turns if draft.kept_turns is not None else []
        natural = draft.natural
        i = bisect_left(natural, kept[-1]) if kept else 0
        for_good = True  # (every turn kept so far is kept for good)
        while i < len(natural) and not self.within(self.goal):
            last = draft.run_starts.get(natural[i])
            if last is not None:
                i = bisect_left(natural, last) + 1
                continue
            seqs = _turn_at(draft, i)
            i += len(seqs)
            if not self.leave_out(seqs):
                for_good = for_good and self.kept_for_good(seqs)
                if for_good and (not kept or kept[-1] < seqs[0]):
                    kept.append(seqs[0])
        draft.kept_turns = kept
        draft.touched = set()  # (every turn it changed is left out: settled for the next walk)

    def kept_for_good(self, seqs: list[int]) -> bool:
        """Whether the turn of `seqs`, kept, is kept for as long as the draft is followed (the
        session's pins and policy stand): an item of it protected for good or the evidence of
        an edit in force, its opening not a user or assistant item, or an item reduced by an
        edit in force that the budget does not take over."""
        return self.stays(seqs, lambda s: self.protected.lasting(s) or s in self.in_force)

    def stays(self, seqs: list[int], held: Callable[[int], bool]) -> bool:
        """Whether the turn of `seqs` may not leave whole: an item of it `held`, its opening not a
        user or assistant item, or an item of it that may not go."""
        entries = [self.draft.entries[s] for s in seqs]
        return any(map(held, seqs)) or entries[0].role not in _OPENS or not all(map(self.goes, entries))

    def goes(self, entry: Entry) -> bool:
        """Whether an item may leave with its turn: shown whole or compressed, left out already,
        or behind the budget's own placeholder."""
        return (
            self.offloadable(entry)
            or entry.representation is Representation.OMITTED
            or entry.seq in self.draft.offloaded
        )

    def holds(self, entry: Entry) -> bool:
        """Whether an item may hold a run's marker (no other rule's edit holds it)."""
        return entry.role in _OPENS and (self.offloadable(entry) or entry.seq in self.draft.offloaded)

    def leave_out(self, seqs: list[int]) -> bool:
        """Take the turn of `seqs` into a run, if every item of it may go: the run it follows,
        or a new one once `MIN_RUN_TURNS` turns one after another may begin it. False when
        the turn is kept (an item of it may not go)."""
        draft = self.draft
        if self.stays(seqs, lambda s: bool(self.protected.of(s)) or s in self.relied):
            self.waiting = []
            return False
        entries = [draft.entries[s] for s in seqs]
        run = self.joins(seqs)
        if run is not None:
            self.take(run, seqs)
            return True
        if self.waiting and bisect_left(draft.natural, seqs[0]) != bisect_left(draft.natural, self.waiting[-1][-1]) + 1:
            self.waiting = []
        if not self.waiting and not self.holds(entries[0]):
            return True  # (a run opens with an item its marker may stand on)
        self.waiting.append(seqs)
        if len(self.waiting) < MIN_RUN_TURNS:
            return True
        waiting, self.waiting = self.waiting, []
        run = _Run(waiting[0][0], waiting[0][-1])
        self.runs.append(run)
        for turn in waiting:
            self.take(run, turn)
        return True

    def take(self, run: _Run, seqs: list[int]) -> None:
        """Leave the turn of `seqs` out with `run`, whose marker moves to the turn's opening
        (right before the turns still shown: a run that grows changes the view from there, not
        from where it begins), unless another edit holds that item."""
        draft = self.draft
        entries = [draft.entries[s] for s in seqs]
        at = entries[0] if self.holds(entries[0]) else run.marker
        assert at is not None
        self.turns.add(entries[0].turn)
        moved = [run.marker] if run.marker is not None and run.marker.seq != at.seq else []
        for entry in (*moved, *entries):
            if entry.seq != at.seq and entry.representation is not Representation.OMITTED:
                self.left_out += 1
                self.put(entry, Remove(entry.seq, False), (), 0)
        run.last, run.marker = seqs[-1], draft.entries[at.seq]
        turns = draft.entries[run.last].turn - draft.entries[run.first].turn + 1
        content: tuple[Block, ...] = (TextBlock(turns_text(run.first, run.last, turns, BUDGET, _OFFLOADED)),)
        marker = Remove(at.seq, True, turns_note(run.first, run.last))
        self.put(at, marker, content, blocks_tokens(content, self.counter))

    def joins(self, seqs: list[int]) -> _Run | None:
        """The run, this walk's or an earlier one's, that the turn of `seqs` follows with
        nothing shown between."""
        natural, entries = self.draft.natural, self.draft.entries
        k = bisect_left(natural, seqs[0]) - 1
        while k >= 0:
            marker = self.draft.run_ends.get(natural[k])
            if marker is not None:
                for run in self.runs:
                    if run.marker is not None and run.marker.seq == marker:
                        return run
                self.runs.append(_Run(self.draft.runs[marker][0], natural[k], entries[marker]))
                return self.runs[-1]
            if entries[natural[k]].representation is not Representation.OMITTED:
                return None
            k -= 1
        return None


@dataclass(slots=True)
class _Run:
    """Whole turns left out together, one after another, behind one marker."""

    first: int
    last: int
    """The seqs the run begins and ends with."""
    marker: Entry | None = None
    """The item that holds the marker (None until it is placed)."""


MIN_RUN_TURNS = 8
"""The fewest turns a run begins with. A marker stands in for its turns' calls, what the agent did:
worth it when the budget's pressure is the count of turns (a long session), where turns go by the
hundred; a short session over its budget keeps each call beside its result's handle (the view's
shape that agents and their frameworks read), over budget if it must be."""

_OPENS = (Role.USER, Role.ASSISTANT)
"""Who may open a turn that goes whole: its marker is a message of theirs."""


def _turn_at(draft: Draft, i: int) -> list[int]:
    """The seqs of the turn that opens at index `i` of the draft's history."""
    natural, entries = draft.natural, draft.entries
    turn, seqs = entries[natural[i]].turn, []
    while i < len(natural) and entries[natural[i]].turn == turn:
        seqs.append(natural[i])
        i += 1
    return seqs


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

    def turns(self) -> Iterator[list[int]]:
        natural = self.draft.natural
        for start in self.starts:
            yield _turn_at(self.draft, bisect_left(natural, start))
        i = self.tail
        while i < len(natural):
            seqs = _turn_at(self.draft, i)
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
