"""The compress strategy: a transform proposing a compressor's form of a tool output (not a
prune: the output stays in the view with its fact lines verbatim, what was left out said by
line range, and the handle named). What the focus names stays whole, and so does what the
call that made the output was made for (`_reason`). Certified at level 0 when only
repetition was folded, else 4; the policy's ``compression`` switch allows it whatever the
maximum level.

`params.on_entry` names the kinds an output may be read as compressed by the very call that
made it, unless the output is a read of a file (what that call works from), and
`params.on_entry_reads` the kinds a read of a whole file may be (`cat f.py`: the call reads a
skeleton of the module that keeps what an agent writes new code from, code.py's `examples`; a
read of a range of lines is what the agent asked to see, and stays whole): such a
compression applies while the output is protected only for being among the latest turns
(never past a pin, a user turn or its tool's latest error), so the whole is never written to
the cache nor rewritten there. The focus is then that call's own: its arguments, what it
searched for, the reason the agent gave.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from itertools import pairwise
from typing import Any, ClassVar, TypeVar

from contextd.engine.compress.router import compress, envelope, names_read, unread
from contextd.engine.compress.text import WORD, Compressed, Focus, TextWords, identifiers, matters, term_words
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, Representation, TextBlock, ToolUseBlock
from contextd.engine.observations import Observation
from contextd.engine.placeholders import PREFIX, describe, handle_of
from contextd.engine.shell import WHOLE
from contextd.engine.strategies import Strategy, output_text
from contextd.engine.types import Concerned, Entry, FocusChange, Proposal, Replace, TransformContext

log = logging.getLogger(__name__)


class Compress(Strategy):
    name: ClassVar[str] = "compress"

    def proposal(
        self, context: TransformContext, entry: Entry, seen: Observation, params: Mapping[str, Any]
    ) -> Proposal | None:
        result = entry.item.tool_result
        if entry.representation is not Representation.FULL:
            return None  # compressed already
        if result is None or not all(isinstance(p, TextBlock) for p in result.content):
            return None  # images and documents are not read here
        text = output_text(entry)
        focus = Focus(
            (*context.requested_focus, *context.searched),
            (*_reason(context, seen), *context.focus),
            _read_again(context, entry, seen, text),
        )
        declared, path = _declared(context, entry, seen), seen.reads[0].path if seen.reads else ""
        if "\\" not in text:  # (escapes, as in JSON, hide words from this reading: `_words_in`)
            # Only the focus terms that may occur in the output change its compression: the key.
            focus = focus.within(TextWords(text), lambda: _names_read(entry, seen, declared))
        held = _compressions.get((entry.item,), dict)
        ratio = params.get("max_ratio", MAX_RATIO)
        # A read of a file is what the call that made it works from: read whole by that call,
        # whatever a compressor would read its lines as (a cut range of code reads as lines),
        # but a whole file of the kinds `on_entry_reads` names.
        whole = bool(seen.reads) and all(read.span == WHOLE for read in seen.reads)
        kinds = "on_entry_reads" if whole else "" if seen.reads else "on_entry"
        on_entry = tuple(params.get(kinds, ())) if kinds else ()
        # A compression the call that made the output reads (the output of the latest turn) costs
        # the cache nothing: any saving pays, and `on_entry_max_ratio` may let it keep more than a
        # later rewrite of what the provider cached must.
        new = context.turns - 1 - entry.turn <= 0
        entry_ratio = max(ratio, params.get("on_entry_max_ratio", ratio)) if new else ratio
        # The call that read a whole file and reads its compression instead has seen none of it.
        examples = whole and new and bool(on_entry)
        key = (focus.terms, focus.lines, ratio, declared, seen.command, path, on_entry, entry_ratio, examples)
        if key not in held:
            cleared = len(held) >= HELD_PER_ITEM
            if cleared:
                held.clear()  # an output asked under many foci: the recent ones matter
            try:
                found = compress(text, focus, declared=declared, command=seen.command, path=path, examples=examples)
            except Exception:  # a compressor's bug must not fail the render: the output stays whole
                log.exception("compressing the output at seq %d failed; it is left whole", entry.seq)
                found = None
            at_entry = found is not None and found.kind in on_entry
            held[key] = (
                _compressed(entry, found, at_entry)
                if found is not None and len(found.text) <= (entry_ratio if at_entry else ratio) * len(text)
                else None
            )
            if cleared:
                _compressions.reweigh((entry.item,))
            else:
                _compressions.grew((entry.item,), held, (key, held[key]))
        return held[key]

    @staticmethod
    def check(params: Mapping[str, Any]) -> list[tuple[str, str]]:
        """`on_entry`: the kinds (of those a compressor reads an output as) whose compression the
        call that reads the output may read in its place, but for reads of files; `on_entry_reads`:
        the same, for reads of whole files; `on_entry_max_ratio`: the share of the output's
        characters such a compression may keep (`max_ratio`, 0.7, for the others)."""
        problems = []
        for name in ("on_entry", "on_entry_reads"):
            kinds = params.get(name, [])
            if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
                problems.append((name, "must be a list of kinds"))
            elif unknown := sorted(set(kinds) - set(READ_AS)):
                problems.append((name, f"unknown kinds {unknown} (known: {', '.join(READ_AS)})"))
        bar = params.get("on_entry_max_ratio", MAX_RATIO)
        if isinstance(bar, bool) or not isinstance(bar, (int, float)) or not 0 < bar <= 1:
            problems.append(("on_entry_max_ratio", "must be a number in (0, 1]"))
        return problems

    def rests_on(self, entry: Entry, seen: Observation, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        result = entry.item.tool_result
        if entry.representation is not Representation.FULL or result is None:
            return ()
        return (("focus",),) if all(isinstance(p, TextBlock) for p in result.content) else ()

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        """An output no compressor reads whatever the focus (`router.unread`: a `git status`, a
        short output) rests on nothing but itself: a focus term it holds changes nothing, and
        asking it again at each one would cost, at every call, as many outputs as hold the term."""
        found = super().keys(context, entry, params)
        if found:
            seen = context.observations.by_seq[entry.seq]  # (there: the entry has keys)
            declared = _declared(context, entry, seen)

            def read_by_none() -> tuple[str, bool]:
                path = seen.reads[0].path if seen.reads else ""
                return declared, unread(output_text(entry), declared=declared, command=seen.command, path=path)

            if _as_declared(_unread, entry, declared, read_by_none):
                return ()
        return found

    def concerned(self, context: TransformContext, change: FocusChange) -> Concerned:
        """The focus reaches an output through the terms a compressor reads (`Focus.terms`) that
        may occur in it (`Focus.within`), and through the lines a recent call read again of the
        file it shows (`_read_again`: those whose ranges changed, and, as a write since may move
        lines, those read again now). Only an output holding the words of a term's last part,
        or showing one of those files, may be concerned: the ledger looks for them by those
        (`Concerned.reach`)."""
        terms = Focus(tuple(change.given), tuple(change.derived)).terms
        words = [term_words(t) for t in terms]
        if frozenset() in words:
            return Concerned(_every)  # a term of no word is within every output
        paths = change.paths | {path for path, _, _ in context.read_again}
        by_seq = context.observations.by_seq
        needed = frozenset().union(*words)

        def concerns(entry: Entry) -> bool:
            held = _words_of(entry)
            if held is None:
                return True
            if not held.isdisjoint(needed):

                def names() -> frozenset[str] | None:
                    seen = by_seq.get(entry.seq)
                    return None if seen is None else _names_read(entry, seen, _declared(context, entry, seen))

                if any(matters(term, held, names) for term in terms):
                    return True
            seen = by_seq.get(entry.seq) if paths else None
            return seen is not None and any(read.path in paths for read in seen.reads)

        def handles(entry: Entry) -> frozenset[Hashable] | None:
            held = _words_of(entry)
            seen = by_seq.get(entry.seq)
            if held is None or seen is None or not seen.reads:
                return held
            return held | {(_PATH, read.path) for read in seen.reads}

        reach = (*dict.fromkeys(words), *(frozenset({(_PATH, path)}) for path in paths))
        return Concerned(concerns, reach, handles)


def _declared(context: TransformContext, entry: Entry, seen: Observation) -> str:
    """What the output is declared to hold (a compressor's kind), by its item or its tool."""
    declared = entry.item.metadata.get(CONTENT_KEY, "")
    if not declared and seen.tool in context.tool_effects:
        declared = getattr(context.tool_effects[seen.tool], "content", "")
    return declared


def _every(entry: Entry) -> bool:
    return True


_PATH = "path"
"""With a path, the handle of an output showing that file (`Concerned.handles`; a word is its own)."""


def _read_again(context: TransformContext, entry: Entry, seen: Observation, text: str) -> frozenset[int]:
    """The lines of this output (numbered from 1, as a compressor's `first_line`) that a recent
    call read again by a range of the same file (`sed -n 120,160p f` after `cat f`, or before
    it): those the output shows, unless a write between the two reads, or in either's own
    command, may have moved them. Only a shell command's read says which lines it shows (a
    declared read tool's is taken as the whole file, whatever its arguments); one whose tool
    cut it to a head and a tail says it of its head only."""
    spec = context.tool_effects.get(seen.tool)
    shell = entry.item.tool_effect is None and getattr(spec, "effect", "") == "shell"
    if not shell or len(seen.reads) != 1 or seen.reads[0].span is None:
        return frozenset()
    path, shown = seen.reads[0].path, seen.reads[0].span
    if any(a[1] >= b[0] for a, b in pairwise(shown)):
        return frozenset()  # sed prints in the file's order, an overlapped line once per range
    ranges = [
        span
        for read_path, seq, span in context.read_again
        if read_path == path
        and seq != seen.seq
        and not context.observations.may_have_moved_lines(path, min(seq, seen.seq) - 1, max(seq, seen.seq) + 1)
    ]
    if not ranges:
        return frozenset()
    first = envelope(text)[0].count("\n") + 1  # the file's lines start after a tool's wrapping
    cut = text.find("</output_head>")
    count = text.count("\n", 0, cut) if cut >= 0 else text.count("\n") + 1  # (the cut line: neither)
    lines: set[int] = set()
    at = first  # the output's line showing the first line of each range it shows
    for low, high in shown:
        for wanted_low, wanted_high in (r for span in ranges for r in span):
            start, stop = max(low, wanted_low), min(high, wanted_high, low + count)
            lines.update(range(at + start - low, at + stop - low + 1))
        at += high - low + 1
        if at > count:
            break
    return frozenset(n for n in lines if n <= count)


def _compressed(entry: Entry, found: Compressed, on_entry: bool) -> Proposal:
    header = (
        f"{PREFIX} {describe(entry.item)} compressed as {found.kind}: {found.summary}; "
        f"retrieve the whole with handle {handle_of(entry.item)}]"
    )
    return Proposal(
        Replace(entry.seq, (TextBlock(header + "\n" + found.text),)),
        0 if found.lossless else 4,
        f"{COMPRESSED}{found.kind}",
        found.summary,
        compression=True,
        on_entry=on_entry,
    )


READ_AS = ("log", "test", "text", "json", "code", "search", "diff", "listing", "html")
"""What a compressor reads an output as (`Compressed.kind`)."""
COMPRESSED = "compressed_"
"""The reason codes of compressions start with this: the item stays, its facts verbatim (not a prune)."""
CONTENT_KEY = "contextd.content_type"
"""Item metadata declaring what a tool output holds (a compressor kind: log, json, code ...)."""
MAX_RATIO = 0.7
"""A compression is proposed only when it keeps at most this share of the output's characters."""
HELD_PER_ITEM = 8
_compressions: IdentityMemo[dict[tuple[Any, ...], Proposal | None]] = IdentityMemo(20_000)
"""Per item, its compression under each focus (and ratio) asked (None: none worth having); the same
proposal object each render, so what follows from it is remembered too."""
_unread: IdentityMemo[tuple[str, bool]] = IdentityMemo(20_000)
"""Per item, whether no compressor reads its output whatever the focus (`router.unread`), with
the kind it was declared to hold when asked (another policy may declare another)."""
_words: IdentityMemo[frozenset[str] | None] = IdentityMemo(20_000)
"""Per item, the words of its output (None: it holds escapes)."""


_names: IdentityMemo[tuple[str, frozenset[str] | None]] = IdentityMemo(20_000)
"""Per item, the names in its output by which its compressor finds a focus term that does not
occur in it whole (`router.names_read`), with the kind it was declared to hold when asked."""


def _names_read(entry: Entry, seen: Observation, declared: str) -> frozenset[str] | None:
    """`router.names_read` of the output of `entry`, asked once an item (and again for another
    declared kind)."""

    def read() -> tuple[str, frozenset[str] | None]:
        path = seen.reads[0].path if seen.reads else ""
        try:
            return declared, names_read(output_text(entry), declared=declared, command=seen.command, path=path)
        except Exception:  # a reader's bug must not fail the render (as in `proposal`): any word, then
            log.exception("reading the names in the output at seq %d failed; any word is taken for one", entry.seq)
            return declared, None

    return _as_declared(_names, entry, declared, read)


T = TypeVar("T")


def _as_declared(
    memo: IdentityMemo[tuple[str, T]], entry: Entry, declared: str, read: Callable[[], tuple[str, T]]
) -> T:
    """What `read` says of the output of `entry` (with the kind it was declared to hold), remembered
    per item in `memo`, and read again, not remembered, for another declared kind (another policy)."""
    said = memo.get((entry.item,), read)
    return (said if said[0] == declared else read())[1]


def _words_of(entry: Entry) -> frozenset[str] | None:
    """The words of the output of `entry`; None when escapes (as in JSON) hide words from this
    reading, and the whole focus concerns it."""
    return _words.get((entry.item,), lambda: _words_in(output_text(entry)))


def _words_in(text: str) -> frozenset[str] | None:
    return None if "\\" in text else frozenset(WORD.findall(text))


def _reason(context: TransformContext, seen: Observation) -> tuple[str, ...]:
    """The identifiers the agent wrote with the call that made an output: what it ran, and why
    (``let's look at `get_prefetch_queryset` around line 722``). An output keeps what it was
    asked for, whatever the agent has turned to since: on the development traces, agents
    quote a read's code two or three turns after it."""
    caller = context.by_seq.get(seen.call_seq)
    if caller is None:
        return ()
    item = caller.item
    call = next((b for b in item.tool_uses if b.id == seen.call_id), None)
    return _reasons.get((item, call), lambda: _said_with(item, call))


def _said_with(item: Item, call: ToolUseBlock | None) -> tuple[str, ...]:
    """The identifiers of a call's own arguments, then of its item's text (not of the calls
    made beside it: each output keeps what was asked of it)."""
    said = "\n".join(b.text for b in item.content if isinstance(b, TextBlock))
    return identifiers(f"{call.argument_text() if call else ''}\n{said}")


_reasons: IdentityMemo[tuple[str, ...]] = IdentityMemo(20_000)
