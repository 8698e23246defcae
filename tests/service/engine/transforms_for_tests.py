"""Small transforms that exercise the engine's machinery (the real strategies
are their own issue). Each proposes what its params say, on every candidate."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from contextd.engine.model import Block, ImageBlock, ItemContent, Representation, Role, TextBlock, ToolUseBlock
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import (
    Entry,
    Insert,
    PatchRequest,
    Proposal,
    Remove,
    Reorder,
    Replace,
    TransformContext,
)


class Drop:
    """Remove every candidate, claiming `level` (default 2) and citing `evidence_seqs`."""

    name: ClassVar[str] = "drop"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            if entry.representation is Representation.FULL:
                yield Proposal(
                    Remove(entry.seq, placeholder=params.get("placeholder", True)),
                    level=params.get("level", 2),
                    reason=params.get("reason", "superseded"),
                    evidence=f"test evidence for {entry.seq}",
                    evidence_seqs=tuple(params.get("evidence_seqs", ())),
                )


class FirstLine:
    """Replace every candidate's text with its first line (`reason`: the reason code, "reduced")."""

    name: ClassVar[str] = "first_line"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            texts = [b.text for b in entry.content if isinstance(b, TextBlock)]
            if entry.item.tool_result is not None:
                texts = [p.text for p in entry.item.tool_result.content if isinstance(p, TextBlock)]
            if texts:
                first = texts[0].split("\n", 1)[0] or "(empty)"
                reason = params.get("reason", "reduced")
                yield Proposal(Replace(entry.seq, (TextBlock(first),)), level=params.get("level", 2), reason=reason)


class ClaimCopies:
    """Level 0: an item whose content hash an earlier item shares is a copy of it
    (or, with `lie`, claims a copy where there is none)."""

    name: ClassVar[str] = "claim_copies"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        first: dict[str, int] = {}
        for entry in context.entries:
            first.setdefault(entry.item.content_hash, entry.seq)
        for entry in candidates:
            original = first[entry.item.content_hash]
            if original != entry.seq:
                yield Proposal(Remove(entry.seq), 0, "duplicate", f"identical to seq {original}", (original,))
            elif params.get("lie"):  # claims a copy where there is none
                yield Proposal(Remove(entry.seq), 0, "duplicate", "not really", (context.entries[0].seq,))


class Unsure:
    name: ClassVar[str] = "unsure"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            yield Proposal(Remove(entry.seq), 2, "superseded", "could not tell which read is newer", abstain=True)


class Annotate:
    """Insert a note after the first candidate (or item `after`), and patch the request."""

    name: ClassVar[str] = "annotate"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        if candidates:
            note = ItemContent(role=Role(params.get("role", "user")), content=(TextBlock(params.get("note", "note")),))
            yield Proposal(Insert(params.get("after", candidates[0].seq), note), 0, "note")
        yield Proposal(PatchRequest("temperature", 0), 0, "patch")


class Reverse:
    """Show the history backwards after the system prompts and the opening turn
    (which keep their place unless `keep` is false)."""

    name: ClassVar[str] = "reverse"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        history = [e for e in context.entries if e.seq > 0]
        systems = [e.seq for e in history if e.role is Role.SYSTEM]
        others = [e.seq for e in history if e.role is not Role.SYSTEM]
        order = systems + others[:1] + others[:0:-1] if params.get("keep", True) else [e.seq for e in history][::-1]
        if params.get("identity"):
            order = [e.seq for e in history]
        yield Proposal(Reorder(tuple(order)), 0, "reorder")


class ReplaceWith:
    """Replace every candidate with the blocks `params` name: {text: ...}, {image: true} and/or
    {call: ID, input: JSON} (a tool call `bash` with that id); {compression: true} claims the
    proposal is a compression."""

    name: ClassVar[str] = "replace_with"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        blocks: list[Block] = []
        if "text" in params:
            blocks.append(TextBlock(params["text"]))
        if params.get("image"):
            blocks.append(ImageBlock("image/png", uri="https://example.com/a.png"))
        if "call" in params:
            blocks.append(ToolUseBlock(params["call"], "bash", params.get("input", "{}")))
        for entry in candidates:
            yield Proposal(
                Replace(entry.seq, tuple(blocks)), 2, "replaced", compression=params.get("compression", False)
            )


def registry() -> TransformRegistry:
    registry = TransformRegistry.default()
    for transform in (Drop(), FirstLine(), ClaimCopies(), Unsure(), Annotate(), Reverse(), ReplaceWith()):
        registry.register(transform)
    return registry
