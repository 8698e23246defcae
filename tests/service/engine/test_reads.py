"""Reads superseded by later reads (strategies.Supersede) found through the index of the spans
read (spans.py): the same proposals as looking at every later observation of the path, and
paging through a file costs in proportion to its reads, not their square."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine import strategies
from contextd.engine.observations import Observation
from contextd.engine.pipeline import render
from contextd.engine.strategies import Supersede, _rereads, shown_in_full, worth
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import Entry, Proposal, Remove, TransformContext
from tests.service.engine.test_strategies import BODY, policy_input, pruned, seq_of, session

PATHS = ("src/app.py", "/repo/src/app.py", "app.py")


def every_later_read(context: TransformContext, entry: Entry, seen: Observation) -> Proposal | None:
    """Supersede's proposal by looking at every later observation of the path, in order."""
    if not seen.reads or seen.writes or seen.unknown or seen.listing:
        return None
    index = context.observations
    ordered = [index.by_seq[s] for s in sorted(index.by_seq)]
    newer = []
    for read in seen.reads:
        later = next(
            (
                o
                for o in ordered
                if read.path in {*(r.path for r in o.reads), *o.writes}
                and o.seq > entry.seq
                and not o.failed
                and _rereads(o, read, seen, index)
                and shown_in_full(context, o.seq)
            ),
            None,
        )
        if later is None:
            return None
        newer.append(later)
    shown = ", ".join(f"call {o.call_id} (seq {o.seq})" for o in dict.fromkeys(newer))
    note = f"read again later by {shown}"
    return Proposal(Remove(entry.seq, True, note), 2, "superseded", note, tuple(sorted({o.seq for o in newer})))


class Checked:
    """Supersede, checked against looking at every later read on each render."""

    name: ClassVar[str] = "checked_supersede"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        found = list(Supersede().propose(context, candidates, params))
        expected = []
        for entry in candidates:
            seen = context.observations.by_seq.get(entry.seq)
            if seen is not None and worth(entry, params):
                proposal = every_later_read(context, entry, seen)
                if proposal is not None:
                    expected.append(proposal)
        assert found == expected
        yield from found


POLICY = """
protection: {last_turns: 0}
tools: {bash: {effect: shell}}
rules: [{name: reads, transform: checked_supersede, when: {roles: [tool]}}]
"""


def call(draw: st.DrawFn) -> tuple[str, str, bool]:
    path = draw(st.sampled_from(PATHS))
    first = draw(st.integers(1, 60))
    last = first + draw(st.integers(0, 40))
    command = draw(
        st.sampled_from(
            [
                f"sed -n '{first},{last}p' {path}",
                f"nl -ba {path} | sed -n '{first},{last}p'",
                f"cat {path}",
                f"sed -i 's/old/new/' {path}",
                f"sed -i '{first}d' {path}",
                "python3 fix.py",
                "cd src",
                f"cat {path}",
                f"cd src && cat {path}",
                f"export LANG=C && cat {path}",
                f"cd /repo && sed -n '{first},{last}p' {path}",
            ]
        )
    )
    failed = command.startswith("cat") and draw(st.booleans()) and draw(st.booleans())
    output = f"cat: {path}: No such file or directory" if failed else f"{command}\n{BODY}"
    return command, output, failed


calls = st.composite(call)


@settings(max_examples=120, deadline=None)
@given(st.lists(calls(), min_size=2, max_size=24), st.data())
def test_the_index_finds_what_looking_at_every_later_read_finds(
    made: list[tuple[str, str, bool]], data: st.DataObject
) -> None:
    registry = TransformRegistry.default()
    registry.register(Checked())
    items = session(*made)
    first = data.draw(st.integers(1, len(items)))
    earlier = render(policy_input(items[:first], POLICY, registry=registry))
    render(policy_input(items, POLICY, state=earlier.state, now=60.0, registry=registry))


def test_paging_through_a_file_looks_at_each_read_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    looked = 0
    covers = strategies.covers

    def counted(newer: Any, older: Any) -> bool:
        nonlocal looked
        looked += 1
        return covers(newer, older)

    monkeypatch.setattr(strategies, "covers", counted)
    pages = [(f"sed -n '{k},{k + 40}p' src/app.py", f"page {k}\n" + BODY) for k in range(1, 401)]
    assert pruned(render(policy_input(session(*pages), POLICY.replace("checked_", "")))) == {}
    assert looked <= len(pages)  # every page is covered by none that follows: none is compared
    whole = session(*pages, ("cat src/app.py", "all of it\n" + BODY))
    assert set(pruned(render(policy_input(whole, POLICY.replace("checked_", ""))))) == {
        seq_of(k) for k in range(1, 401)
    }
