"""Eligibility (DESIGN section 4): which candidates may happen, judged in order by the
protections and the evidence ladder (eligibility.py), at most one per slot, and only if
what would replace an item is smaller than it. Each refusal is certified (KEEP or
ABSTAIN), a rule's the first time it is made, the agent's every time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from contextd.engine.certificates import CertificateBody, Decision
from contextd.engine.eligibility import Judge
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Block, Role
from contextd.engine.policy import Policy
from contextd.engine.stages.certify import certificate, refusal_key
from contextd.engine.stages.draft import new_representation
from contextd.engine.stages.load import Loaded
from contextd.engine.stages.propose import Candidate
from contextd.engine.state import AppliedEdit, ControlMode, Slot, slot_of
from contextd.engine.tokens import TokenCounter, blocks_tokens
from contextd.engine.types import Edit, Entry, Insert, Proposal, Remove, Reorder, target_of

NOT_SMALLER = "what would replace it is not smaller"
"""Why an edit that would not shrink its item is refused (ABSTAIN): no gain, not a doubt about safety."""


@dataclass(frozen=True, slots=True)
class Eligible:
    candidate: Candidate
    edit: Edit
    """The proposal's edit, normalized (`_normalized`)."""
    content: tuple[Block, ...]
    """What the edit gives its target (or inserts)."""
    tokens: int
    """Tokens of `content`."""
    saving: int
    """Tokens fewer in the view once applied (negative when it grows the view)."""


@dataclass(frozen=True, slots=True)
class Judged:
    eligible: tuple[Eligible, ...]
    """In the candidates' order."""
    certificates: tuple[CertificateBody, ...]
    """The refusals (KEEP, ABSTAIN)."""
    decided: frozenset[str]
    """The refusals certified so far, this render's included (`ViewState.decided`)."""
    relied: Mapping[int, int]
    """What the edits in force and those eligible now rest on: evidence seq -> the seq reduced."""
    shrinks: Mapping[int, int] | None
    """The items protected only until the next render that a rule's edit would reduce, with
    their tokens once reduced (None unless asked for)."""
    standing: tuple[tuple[str, Proposal], ...] = ()
    """(rule, proposal) of the rules' proposals whose refusal stands: passed over unjudged for as
    long as the edits in force do (`Judge.stands`), or judged no smaller than their entry as it
    is shown (what an edit gives its target is the same for the same entry). The rules' ledgers
    let them go (`ledger.let_go`), and a render that follows asks for them again only with their
    entry (shown otherwise since, or a key it rests on touched)."""


def judge(
    candidates: Sequence[Candidate],
    loaded: Loaded,
    policy: Policy,
    counter: TokenCounter,
    look_ahead: bool = False,
    settled: Sequence[Eligible] = (),
) -> Judged:
    """The candidates that may happen, at most one per slot: the first eligible one wins.
    Proposals for a taken slot are dropped unseen, but for a slot held by a compression,
    which any edit but another compression may take over. With `look_ahead`, the shrinks
    are found too (for the cache breakpoint: show.py). `settled`: deferred edits the render
    before judged eligible, which nothing done since bears on (`still_eligible`): taken as
    judged when they come back waiting."""
    draft = loaded.draft
    before = {id(e.candidate.proposal): e for e in settled}
    judging = Judge(draft.entries, draft.natural, loaded.protected, policy, loaded.relied)
    # What this render takes and decides, beside what the edits in force took and the state
    # decided (those sets grow with the session: they are read, not copied).
    taken, compressed, decided = loaded.taken, loaded.compressed, loaded.decided
    claimed: set[Slot] = set()
    certified: set[str] = set()
    shrinks: dict[int, int] | None = {} if look_ahead else None
    out: list[Eligible] = []
    certificates: list[CertificateBody] = []
    standing: list[tuple[str, Proposal]] = []
    for candidate in candidates:
        proposal = candidate.proposal
        slot = slot_of(proposal.edit)  # (normalizing keeps the slot: a proposal passed over is not normalized)
        if slot in claimed or (slot in taken and (slot not in compressed or proposal.compression)):
            continue
        if candidate.pending and (e := before.get(id(proposal))) is not None and e.candidate.proposal is proposal:
            claimed.add(slot)
            judging.accept(proposal)
            out.append(Eligible(candidate, e.edit, e.content, e.tokens, e.saving))
            continue
        edit = _normalized(proposal.edit, draft.entries)
        if candidate.control is not ControlMode.AGENT and (refused := judging.refused(proposal)):
            key = refusal_key(Decision(refused.lower()), edit, candidate.rule, proposal.reason)
            if key in decided or key in certified:
                if (
                    candidate.control is ControlMode.RULE
                    and not candidate.pending
                    and judging.stands(proposal, refused)
                ):
                    standing.append((candidate.rule, proposal))
                continue  # (as below, unjudged)
        seq = target_of(edit)
        entry = draft.entries.get(seq) if seq is not None else None
        verdict = judging.judge(proposal, candidate.control)
        content: tuple[Block, ...] = ()
        tokens = saving = 0
        if verdict.eligible:
            content, tokens = _represent(proposal, edit, entry, draft.entries, counter)
            saving = entry.tokens - tokens if entry is not None else -tokens if isinstance(edit, Insert) else 0
            if entry is not None and saving <= 0:
                verdict = replace(verdict, eligible=False, decision="ABSTAIN", why=NOT_SMALLER)
                if candidate.control is ControlMode.RULE and not candidate.pending:
                    standing.append((candidate.rule, proposal))  # (for as long as the entry is shown so)
        elif (
            shrinks is not None
            and entry is not None
            and candidate.control is ControlMode.RULE
            and judging.lapses(entry.seq)
            and judging.judge(proposal, candidate.control, protection=False).eligible
        ):
            after = _represent(proposal, edit, entry, draft.entries, counter)[1]
            if entry.seq not in shrinks and after < entry.tokens:  # the first eligible is what would apply
                shrinks[entry.seq] = after
        if not verdict.eligible:
            decision = Decision(verdict.decision.lower())
            if candidate.control is not ControlMode.AGENT:  # (the agent asked: it hears back every time)
                key = refusal_key(decision, edit, candidate.rule, proposal.reason)
                if key in decided or key in certified:
                    continue  # certified before: a rule proposes the same on every render
                certified.add(key)
            certificates.append(
                certificate(
                    entry,
                    decision,
                    candidate.rule,
                    proposal.reason,
                    verdict.why,
                    proposal=proposal,
                    control=candidate.control,
                    protection=verdict.protection,
                )
            )
            continue
        claimed.add(slot)
        judging.accept(proposal)
        out.append(Eligible(candidate, edit, content, tokens, saving))
    return Judged(
        tuple(out),
        tuple(certificates),
        decided | certified if certified else decided,
        judging.relied_on,
        shrinks,
        tuple(standing),
    )


def still_eligible(deferred: Iterable[Eligible], applied: Sequence[AppliedEdit]) -> tuple[Eligible, ...]:
    """Of the edits a render judged eligible and deferred, and the edits it applied, those the
    next render from its state would judge eligible again, the same: nothing since bears on
    them. They come back first, waiting, in the order they were judged in, and what is
    appended since changes no verdict (the items' protection only lapses as turns go by; the
    evidence an edit names is shown as it was, and no other edit rests on its target), but
    for the edits applied: an edit whose target or evidence an applied edit reduced, or whose
    target an applied edit rests on, is judged again; so is every one after a reorder. A
    deferred edit normalized afresh (`_normalized`) waits as another proposal: judged again."""
    if any(isinstance(a.edit, Reorder) for a in applied):
        return ()
    reduced = {seq for a in applied if (seq := target_of(a.edit)) is not None}
    rested = reduced.union(*(a.evidence_seqs for a in applied))
    return tuple(
        e
        for e in deferred
        if e.edit is e.candidate.proposal.edit
        and target_of(e.edit) not in rested
        and reduced.isdisjoint(e.candidate.proposal.evidence_seqs)
    )


def _normalized(edit: Edit, entries: Mapping[int, Entry]) -> Edit:
    """A removal that must leave something behind says so: a tool call and its result
    always go as a pair of placeholders (repair would put one back anyway)."""
    if isinstance(edit, Remove) and not edit.placeholder and edit.seq in entries:
        item = entries[edit.seq].item
        if item.role is Role.TOOL or item.tool_uses:
            return Remove(edit.seq, True, edit.note)
    return edit


def _represent(
    proposal: Proposal, edit: Edit, entry: Entry | None, entries: Mapping[int, Entry], counter: TokenCounter
) -> tuple[tuple[Block, ...], int]:
    """What `edit` gives its target, and its tokens."""
    if edit is not proposal.edit:  # normalized afresh each render: nothing to remember it by
        return _counted(edit, entries, proposal.reason, counter)
    # A deferred edit is proposed again at every render, often as the same object.
    sources = (proposal, edit, counter) if entry is None else (proposal, edit, counter, entry.item)
    return _represented.get(sources, partial(_counted, edit, entries, proposal.reason, counter))


_represented: IdentityMemo[tuple[tuple[Block, ...], int]] = IdentityMemo(50_000)
"""What an edit gives its target, and its tokens, per proposal, edit and item."""


def _counted(
    edit: Edit, entries: Mapping[int, Entry], reason: str, counter: TokenCounter
) -> tuple[tuple[Block, ...], int]:
    content = _content_of(edit, entries, reason)
    return content, blocks_tokens(content, counter)


def _content_of(edit: Edit, entries: Mapping[int, Entry], reason: str) -> tuple[Block, ...]:
    seq = target_of(edit)
    if seq is not None:
        return new_representation(entries[seq], edit, reason)
    if isinstance(edit, Insert):
        return edit.content.content
    return ()
