"""What each rule did in a render, kept for the next render from its state (the carry), so
that proposing costs what changed since, not the session.

A rule's proposals come from its transform over its candidates: the open entries its
conditions on the entry alone hold for (its pool), of those the ones its conditions that
change with time hold for now. A transform that is `Incremental` (types.py) says, for each
candidate, what its proposal rests on besides the entry (keys). The next render then asks
it only about:

* the entries appended since, and those shown otherwise since (the previous render's edits);
* the entries whose keys something since touched (`touched`: a new observation, an entry
  shown otherwise, a new span of completed work, a new focus: of a transform that
  `ReadsFocusTerms`, only those the focus's change concerns);
* the entries its time conditions did not hold for yet;
* the entries of the latest turn then (what the call that made an output reads may differ
  from what later calls read: compress-on-entry).

For every other entry of its pool nothing its proposal rests on has changed: it would
propose nothing again, or, for an entry it proposed for, the same again, which is taken as
it stands (a proposal refused or deferred is decided again at every render: the entries an
edit in force rests on as its evidence are refused at every render, as many as such edits,
and asking the rules about them again cost a render time in proportion to the session). Of
those, a proposal whose refusal is certified and stands as long as the edits in force do is
let go (`let_go`): not a candidate again until its entry is asked about again.

A transform that is not incremental (one an installed package registers, say) sees its whole
pool each render, as without a carry. Either way the proposals are those of a render without
the carry, in the same order, but for those let go, which that render's judge passes over
unjudged (`tests/service/engine/test_pipeline.py` holds the two renders to each other).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from contextd.engine.memo import Claim
from contextd.engine.observations import Observation, ObservationIndex
from contextd.engine.policy import When
from contextd.engine.rules import holds_for
from contextd.engine.shell import WHOLE
from contextd.engine.types import (
    Concerned,
    Entry,
    FocusChange,
    Incremental,
    Proposal,
    ReadAgain,
    ReadsFocusTerms,
    TransformContext,
    target_of,
)

FocusSeen = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], ReadAgain]
"""The request's focus, what the recent calls searched for, the render's focus and the ranges
the recent calls read, as the transforms saw them."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """One rule's work in one render."""

    pool: dict[int, Entry]
    """seq -> the open entry its conditions on the entry alone hold for, as shown then."""
    waiting: frozenset[int]
    """Seqs of the pool its conditions that change with time did not hold for (and still may)."""
    proposed: dict[int, tuple[Proposal, ...]]
    """seq -> what it proposed for the entry, taken as it stands by the next render when nothing
    it rests on changed (`to_ask`; empty for a transform that is not incremental)."""
    by_key: dict[Hashable, set[int]] | None
    """key -> seqs of the pool whose proposal rests on it (and of entries that have left the
    pool since, dropped once they outnumber it: `to_ask`); None when the transform is not
    incremental. Updated in place by the render that takes the ledger over."""
    reach: Reach = field(default_factory=lambda: Reach(), compare=False, repr=False)
    """The entries resting on the focus by what of a change may reach them (a transform that
    `ReadsFocusTerms`); likewise updated in place."""


class Reach:
    """The seqs of a rule's entries resting on the focus by their handles (`Concerned.handles`),
    kept with its ledgers from render to render and brought up to date at each (`among`): a
    change to the focus is looked for where it may reach, not over every output resting on it.
    A carry is written with it: built again after a read back, it cost the first renders there
    (at 10,000 items of bench/scale.py's mixed workload, the memos empty, the first render after
    a read back 11.5 ms, 6.5 with it; it is 0.06 MB of a 9.5 MB carry)."""

    __slots__ = ("_anything", "_by_handle", "_entries", "_pairs")

    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {}
        """seq -> the entry as indexed (a seq resting on the focus out of the pool is not: it is
        looked at again at each render, and indexed once it is back in the pool)."""
        self._by_handle: dict[Hashable, int | set[int]] = {}
        """handle -> the seq holding it, or the set of them when more than one does (most words
        of an output are its own: a set each would be most of what the index holds)."""
        self._anything: set[int] = set()
        """Seqs that any change may reach (handles None)."""
        self._pairs = 0
        """(handle, seq) pairs held, for `footprint`."""

    def footprint(self) -> int:
        """About how many bytes it holds (`Carry.footprint`)."""
        return REACH_BYTES_PER_PAIR * self._pairs + REACH_BYTES_PER_ENTRY * len(self._entries)

    def among(
        self,
        resting: set[int],
        pool: Mapping[int, Entry],
        asked: set[int],
        handles: Callable[[Entry], frozenset[Hashable] | None],
        reach: tuple[frozenset[Hashable], ...],
    ) -> set[int]:
        """Of `resting` (the seqs resting on the focus), those whose handles hold all of one of
        the sets of `reach`, those any change reaches, and those not indexed yet (past
        `INDEXED_PER_RENDER`); `asked`: the seqs asked about anyway (appended, shown otherwise
        since: indexed again, as they are now)."""
        entries = self._entries
        for seq in asked & entries.keys():
            self._drop(seq, handles)
        for seq in entries.keys() - resting:
            self._drop(seq, handles)
        new = [seq for seq in resting - entries.keys() if seq in pool]
        out = set(new[INDEXED_PER_RENDER:])  # indexed by a later render: looked at as they are
        by_handle = self._by_handle
        for seq in new[:INDEXED_PER_RENDER]:
            entry = entries[seq] = pool[seq]
            held = handles(entry)
            if held is None:
                self._anything.add(seq)
                continue
            self._pairs += len(held)
            for handle in held:
                found = by_handle.get(handle)
                if found is None:
                    by_handle[handle] = seq
                elif isinstance(found, int):
                    by_handle[handle] = {found, seq}
                else:
                    found.add(seq)
        out |= self._anything
        for wanted in reach:
            held_by = [by_handle.get(h) for h in wanted]
            if None in held_by or not held_by:
                continue
            sets = sorted(({s} if isinstance(s, int) else s for s in held_by if s is not None), key=len)
            out |= sets[0].intersection(*sets[1:])
        return out

    def _drop(self, seq: int, handles: Callable[[Entry], frozenset[Hashable] | None]) -> None:
        held = handles(self._entries.pop(seq))
        if held is None:
            self._anything.discard(seq)
            return
        by_handle = self._by_handle
        for handle in held:
            found = by_handle.get(handle)
            if isinstance(found, int):
                if found == seq:
                    del by_handle[handle]
                    self._pairs -= 1
            elif found is not None and seq in found:
                found.discard(seq)
                self._pairs -= 1
                if len(found) == 1:
                    by_handle[handle] = next(iter(found))


REACH_BYTES_PER_PAIR = 60
REACH_BYTES_PER_ENTRY = 40
"""What a `Reach` holds, about: per (handle, seq) pair (a dict slot for a word one output holds,
a set's slot and its share of the set for the others), per entry (its dict slot). By
`sys.getsizeof` on bench/scale.py's mixed workload: 0.24 MB for 5,801 pairs at 3,000 items,
0.91 MB for 13,848 at 10,000 (dicts and sets grow by doubling); a set a word held it 2.1 MB."""
INDEXED_PER_RENDER = 64
"""Entries a render adds to a `Reach` at most (about 10 µs each, for an output of a few dozen
words): after a render that derived the session whole, every entry resting on the focus is new
to it (480 at 10,000 items of bench/scale.py's mixed workload, 5 ms), and those left for the
renders that follow are looked at one by one, as they were before there was an index."""


@dataclass(frozen=True, slots=True)
class Ledgers:
    """Every rule's work in one render, for the next render from its state."""

    rules: tuple[Ledger, ...]
    """In policy order."""
    items: int
    """How many of the history's items they were made over."""
    focus: FocusSeen
    completions: int
    """How many spans of completed work there were."""
    turns: int
    """How many turns the history had: the entries of the latest one are asked about again."""
    changed: frozenset[int] = frozenset()
    """The items the render's own edits showed otherwise after its rules proposed."""
    claim: Claim = field(default_factory=Claim, compare=False, repr=False)
    """Taken by the next render (`memo.take_over`), which updates the pools and key maps in
    place rather than copying maps as long as the session: a second render from the same
    carry proposes over everything."""


def pick(when: When, entries: Iterable[Entry], context: TransformContext) -> tuple[list[Entry], list[int]]:
    """Of `entries`, those the rule's conditions that change with time hold for now, and the
    seqs of those they do not hold for yet (an entry too old for an age maximum never comes
    back: it is in neither)."""
    age, utilization = when.age_turns, when.utilization
    if age is None and utilization is None:
        return list(entries), []
    if utilization is not None and not utilization.holds(context.utilization):
        return [], [e.seq for e in entries]  # none now; any may be when the view fills up
    picked, waiting = [], []
    for entry in entries:
        old = context.turns - 1 - entry.turn
        if age is None or age.holds(old):
            picked.append(entry)
        elif age.max is None or old <= age.max:
            waiting.append(entry.seq)
    return picked, waiting


def recorded(
    transform: object,
    context: TransformContext,
    params: Mapping[str, Any],
    pool: dict[int, Entry],
    asked: Sequence[Entry],
    waiting: Iterable[int],
    proposals: Sequence[Proposal],
    earlier: Ledger | None = None,
    touched: Iterable[Hashable] = (),
) -> Ledger:
    """The ledger of a rule that proposed `proposals` over its `pool`, its transform asked about
    `asked` (`earlier`: the ledger of the render this one followed, taken over: its key map is
    updated in place). Under the keys `touched` since, the entries asked again are named as
    they rest on them now: an entry shown otherwise since it was asked (compressed) may rest on
    a key no longer, and would else be asked again at every change to it (the focus, at every
    call) for as long as it stays in the pool. Under the focus they are named as they rest on it
    now whether or not it was touched: a change to it asks again only the entries it concerns
    (`to_ask`), and tests every other one named under it at each change, for as long as it
    stays in the pool (the render that reduces a hundred outputs asks about them again as it
    leaves them, the focus unchanged: `pipeline.SETTLED_FROM`)."""
    if not _incremental(transform):
        return Ledger(pool, frozenset(waiting), {}, None)
    proposed: dict[int, tuple[Proposal, ...]] = {}
    for proposal in proposals:
        seq = target_of(proposal.edit)
        if seq is not None:
            proposed[seq] = (*proposed.get(seq, ()), proposal)
    adding: dict[Hashable, list[int]] = {}
    for entry in asked:
        for key in transform.keys(context, entry, params):
            adding.setdefault(key, []).append(entry.seq)
    if earlier is None or earlier.by_key is None:
        return Ledger(pool, frozenset(waiting), proposed, {k: set(v) for k, v in adding.items()})
    by_key = earlier.by_key
    seqs = {entry.seq for entry in asked}
    for key in {*touched, FOCUS}:
        found = by_key.get(key)
        if found:
            found -= found & seqs  # (at the cost of the smaller of the two)
    for key, named in adding.items():
        found = by_key.get(key)
        if found is None:
            by_key[key] = set(named)
        else:
            found.update(named)
    return Ledger(pool, frozenset(waiting), proposed, by_key, earlier.reach)


_KINDS: dict[tuple[type, type], bool] = {}


def _incremental(transform: object) -> TypeGuard[Incremental]:
    """Whether `transform` is `Incremental`."""
    return _is(transform, Incremental)


def reads_focus_terms(transform: object) -> TypeGuard[ReadsFocusTerms]:
    """Whether `transform` is `ReadsFocusTerms`."""
    return _is(transform, ReadsFocusTerms)


def _is(transform: object, protocol: type) -> bool:
    """Whether `transform` is `protocol`, asked once per class (a protocol's isinstance reads
    every member, 40 µs, for each rule of every render; a transform's class defines them)."""
    kind = (type(transform), protocol)
    found = _KINDS.get(kind)
    if found is None:
        found = _KINDS[kind] = isinstance(transform, protocol)
    return found


def to_ask(
    ledger: Ledger,
    pool: Mapping[int, Entry],
    fresh: Iterable[int],
    touched: set[Hashable],
    concerned: Concerned | None = None,
) -> tuple[list[Entry], dict[int, tuple[Proposal, ...]]]:
    """The entries of `pool` a rule's transform is asked about again, in seq order (the view's
    order while nothing is reordered), and of the others those it proposed for, with what it
    proposed (taken as it stands: nothing it rests on changed). All of them are asked about
    unless the transform is incremental. `concerned`: of the entries resting on the focus,
    which the focus's change concerns (the transform's `ReadsFocusTerms.concerned`)."""
    if ledger.by_key is None:
        return [pool[s] for s in sorted(pool)], {}
    asked = set(fresh)
    seqs = asked | ledger.waiting
    by_key = ledger.by_key
    for key in touched:
        found = by_key.get(key)
        if not found:
            continue
        if len(found) > 2 * len(pool) + STALE_SLACK:
            # Most of what the key names has left the pool (shown otherwise, say: compressed),
            # for good unless it comes back, and what comes back is asked about as new. A key
            # every entry rests on (the focus) would otherwise be read whole at each render.
            found.intersection_update(pool)
        if key == FOCUS and concerned is not None:
            test, reach, handles = concerned.test, concerned.reach, concerned.handles
            if reach is not None and handles is not None:
                found = ledger.reach.among(found, pool, asked, handles, reach)
            seqs.update(s for s in found if s in pool and test(pool[s]))
        else:
            seqs |= found
    kept = {seq: made for seq, made in ledger.proposed.items() if seq in pool and seq not in seqs}
    return [pool[s] for s in sorted(seqs) if s in pool], kept


def in_order(
    picked: Sequence[Entry], made: Sequence[Proposal], kept: Mapping[int, tuple[Proposal, ...]]
) -> list[Proposal] | None:
    """The proposals for `picked` in their order (that of a transform asked about all of them),
    from those the transform `made` now for the entries it was asked about (in order) and those
    `kept`; None when one made now is not about the entry it was asked about."""
    by_seq: dict[int, list[Proposal]] = {}
    for proposal in made:
        seq = target_of(proposal.edit)
        if seq is None or seq in kept:
            return None
        by_seq.setdefault(seq, []).append(proposal)
    out: list[Proposal] = []
    for entry in picked:
        out.extend(kept[entry.seq] if entry.seq in kept else by_seq.pop(entry.seq, ()))
    return out if not by_seq else None


def let_go(ledgers: Ledgers, rules: Sequence[str], standing: Iterable[tuple[str, Proposal]]) -> None:
    """Drop from the rules' proposals (in place: the ledgers are this render's) those whose
    refusal stands for as long as the edits in force do (`Judge.stands`), the rule's name with
    each (`rules`: the names in policy order). Taken as they stand, they would be made into
    candidates and passed over at every render that follows, as many as the evidence of the
    edits in force; a render asks for one again only with its entry (the entry changed, or a key
    it rests on), and the judge passes over it again (or certifies what changed)."""
    by_rule = dict(zip(rules, ledgers.rules, strict=True))
    for rule, proposal in standing:
        proposed = by_rule[rule].proposed
        seq = target_of(proposal.edit)
        if seq is None or seq not in proposed:
            continue
        left = tuple(p for p in proposed[seq] if p is not proposal)
        if left:
            proposed[seq] = left
        else:
            del proposed[seq]


STALE_SLACK = 64
"""Seqs that have left a rule's pool a key may name before they are dropped from it (at twice
the pool's size and this many more: dropping them costs the pool's size, once in a while)."""


def refreshed(
    ledger: Ledger, when: When, entries: Iterable[Entry], taken: frozenset[int | str]
) -> tuple[dict[int, Entry], list[int]]:
    """The rule's pool with `entries` (appended since, or shown otherwise since) matched
    afresh (in place: the ledger is taken over), and the seqs of those in it now."""
    pool = ledger.pool
    fresh = []
    for entry in entries:
        seq = entry.item.seq  # (read once: after a first render, every rule runs over thousands)
        pool.pop(seq, None)
        if seq > 0 and seq not in taken and holds_for(when, entry):
            pool[seq] = entry
            fresh.append(seq)
    return pool, fresh


def touched(
    context: TransformContext, ledgers: Ledgers, new: Sequence[Entry], changed: Sequence[Entry]
) -> set[Hashable]:
    """The keys (types.Incremental) that what happened since the ledgers' render touched."""
    index = context.observations
    keys: set[Hashable] = set()
    for entry in new:
        seen = index.by_seq.get(entry.seq)
        if seen is None:
            continue
        keys.add(("run", seen.tool, seen.command.strip()))
        keys.add(("answer", seen.call_id))
        if not seen.failed and seen.check is not None:
            keys.add(("fixed", seen.check.family))
        _covered(index, seen, keys)
    outcomes = {c.outcome for c in index.completions}
    for entry in changed:
        seen = index.by_seq.get(entry.seq)
        if seen is not None:
            keys.add(("shown output", seen.output_hash))
            _covered(index, seen, keys)
        if entry.seq in outcomes:
            keys.add(("completions",))
    if len(index.completions) != ledgers.completions:
        keys.add(("completions",))
    focus = (context.requested_focus, context.searched, context.focus, context.read_again)
    if focus != ledgers.focus:
        keys.add(FOCUS)
        keys.add(_focus_change(ledgers.focus, focus))
    return keys


FOCUS = ("focus",)


def _focus_change(before: FocusSeen, now: FocusSeen) -> FocusChange:
    """What changed of the focus, by its parts (among the keys touched: a transform that
    `ReadsFocusTerms` is asked again only about the entries it concerns)."""
    again = set(before[3]) ^ set(now[3])
    return FocusChange(
        frozenset({*before[0], *before[1]} ^ {*now[0], *now[1]}),
        frozenset(set(before[2]) ^ set(now[2])),
        frozenset(path for path, _, _ in again),
    )


def _covered(index: ObservationIndex, seen: Observation, keys: set[Hashable]) -> None:
    """("covered", s) for every read `seen`'s reads may cover."""
    for read in seen.reads:
        if read.span is None:
            continue  # lines not known: it shows nothing another read showed, as far as is known
        keys.update(("covered", s) for s in index.reads_within(read.path, read.span))
        if read.span == WHOLE:
            keys.update(("covered", s) for s in index.unlined(read.path))
