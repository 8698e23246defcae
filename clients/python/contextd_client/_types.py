"""Plain result types. Protobuf messages stay inside the client."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api


class ViewFormat(StrEnum):
    OPENAI_CHAT = "openai_chat"
    ANTHROPIC_MESSAGES = "anthropic_messages"
    OPENAI_RESPONSES = "openai_responses"
    BEDROCK_CONVERSE = "bedrock_converse"

    def to_proto(self) -> api.ViewFormat.ValueType:
        return _TO_PROTO[self]


_TO_PROTO: dict[ViewFormat, api.ViewFormat.ValueType] = {
    ViewFormat.OPENAI_CHAT: api.VIEW_FORMAT_OPENAI_CHAT,
    ViewFormat.ANTHROPIC_MESSAGES: api.VIEW_FORMAT_ANTHROPIC_MESSAGES,
    ViewFormat.OPENAI_RESPONSES: api.VIEW_FORMAT_OPENAI_RESPONSES,
    ViewFormat.BEDROCK_CONVERSE: api.VIEW_FORMAT_BEDROCK_CONVERSE,
}
_FORMATS = {value: fmt.value for fmt, value in _TO_PROTO.items()}


def _time(ts: Any) -> datetime:
    dt: datetime = ts.ToDatetime(tzinfo=UTC)
    return dt


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    tenant: str
    version: int
    """Items appended so far; the seq of the last one."""
    token_count: int
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, str]
    policy_version: str
    policy: str
    """The policy document; empty for the default policy."""

    @classmethod
    def from_proto(cls, message: api.Session) -> Session:
        return cls(
            id=message.id,
            tenant=message.tenant,
            version=message.version,
            token_count=message.token_count,
            created_at=_time(message.created_at),
            updated_at=_time(message.updated_at),
            metadata=dict(message.metadata),
            policy_version=message.policy_version,
            policy=message.policy,
        )


@dataclass(frozen=True, slots=True)
class ItemReceipt:
    seq: int
    content_hash: str
    token_count: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_seq: int
    last_seq: int
    version: int
    receipts: tuple[ItemReceipt, ...]
    replayed: bool
    """True when the service returned the stored result of an earlier try."""

    @classmethod
    def from_proto(cls, message: api.AppendItemsResponse) -> AppendResult:
        return cls(
            first_seq=message.first_seq,
            last_seq=message.last_seq,
            version=message.version,
            receipts=tuple(ItemReceipt(r.seq, r.content_hash, r.token_count) for r in message.receipts),
            replayed=message.replayed,
        )


@dataclass(frozen=True, slots=True)
class ViewItem:
    seq: int
    representation: str
    """"full", "reduced", "placeholder" or "omitted"."""
    tokens: int
    message_index: int
    handle: str


@dataclass(frozen=True, slots=True)
class ViewWarning:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class View:
    """A rendered view: pass `messages` (and `system`) to the provider as they are."""

    session_id: str
    version: int
    format: ViewFormat
    encoding: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None
    """Anthropic's top-level ``system``; None when absent (and always for OpenAI)."""
    items: tuple[ViewItem, ...]
    item_tokens: int
    framing_tokens: int
    total_tokens: int
    budget_tokens: int
    over_budget: bool
    warnings: tuple[ViewWarning, ...]
    messages_json: str
    """The exact bytes the service rendered, for callers that forward JSON untouched."""
    view_version: int = 0
    stable_prefix_tokens: int = 0
    """Tokens at the start identical to the previous render (what a prompt cache can reuse)."""
    request_patch: dict[str, Any] = field(default_factory=dict)
    """Provider request fields the view asks to set."""
    certificates: tuple[Certificate, ...] = ()
    """The decisions this render took, in order: all of them, or the first 1,000 when it took
    more (``certificates_total``; ``list_certificates(session, view_version=...)`` lists every one)."""
    certificates_total: int = 0
    """How many decisions this render took, listed in ``certificates`` or not."""
    policy_version: str = ""
    """The version of the policy the view was produced with."""
    cache_breakpoint_seq: int = 0
    """With ``place_cache_breakpoint``: the last item the call should cache (the view placed the
    breakpoint before the items after it, which the next render expects to reduce); 0: at the end."""
    retracted_items: int = 0
    """How many of the session's items a client retracted: ``version`` less it is how many items
    a view may show (a retraction leaves ``version`` as it is)."""

    def anthropic_kwargs(self) -> dict[str, Any]:
        """``messages`` and, when present, ``system``, to splat into ``messages.create``."""
        kwargs: dict[str, Any] = {"messages": self.messages}
        if self.system is not None:
            kwargs["system"] = self.system
        return kwargs

    def converse_kwargs(self) -> dict[str, Any]:
        """``messages`` and, when present, ``system``, to splat into a Bedrock ``converse`` call
        (boto3's ``bedrock-runtime``, Strands): the view's base64 text turned back into the bytes
        the SDKs take (image and document ``source.bytes``, ``redactedContent``)."""
        messages = [{**m, "content": [_converse_bytes(b) for b in m["content"]]} for m in self.messages]
        kwargs: dict[str, Any] = {"messages": messages}
        if self.system is not None:
            kwargs["system"] = self.system
        return kwargs

    @classmethod
    def from_proto(cls, message: api.View, shared: tuple[str, tuple[ViewItem, ...]] | None = None) -> View:
        """The view of `message`; `shared`: its messages JSON and items whole when the message
        left out what the caller held (`_held.py`), put back by the caller."""
        fmt = ViewFormat(_FORMATS[message.format])
        messages_json, items = shared or (message.messages_json, _items(message))
        return cls(
            session_id=message.session_id,
            version=message.version,
            format=fmt,
            encoding=message.encoding,
            messages=json.loads(messages_json),
            system=json.loads(message.system_json) if message.system_json else None,
            items=items,
            item_tokens=message.item_tokens,
            framing_tokens=message.framing_tokens,
            total_tokens=message.total_tokens,
            budget_tokens=message.budget_tokens,
            over_budget=message.over_budget,
            warnings=tuple(ViewWarning(w.code, w.message) for w in message.warnings),
            messages_json=messages_json,
            view_version=message.view_version,
            stable_prefix_tokens=message.stable_prefix_tokens,
            cache_breakpoint_seq=message.cache_breakpoint_seq,
            retracted_items=message.retracted_items,
            request_patch=json.loads(message.request_patch_json or "{}"),
            certificates=tuple(Certificate.from_proto(c) for c in message.certificates),
            certificates_total=max(message.certificates_total, len(message.certificates)),
            policy_version=message.policy_version,
        )


def _items(message: api.View) -> tuple[ViewItem, ...]:
    """The items `message` lists."""
    return tuple(
        ViewItem(
            seq=i.seq,
            representation=_representation(i.representation),
            tokens=i.tokens,
            message_index=i.message_index,
            handle=i.handle,
        )
        for i in message.items
    )


def _converse_bytes(block: dict[str, Any]) -> dict[str, Any]:
    """A Converse content block with its base64 text as bytes (a copy where it changes)."""
    for kind in ("image", "document"):
        if kind in block and "bytes" in block[kind]["source"]:
            source = {"bytes": base64.b64decode(block[kind]["source"]["bytes"])}
            return {kind: {**block[kind], "source": source}}
    if "toolResult" in block:
        result = block["toolResult"]
        return {"toolResult": {**result, "content": [_converse_bytes(p) for p in result["content"]]}}
    reasoning = block.get("reasoningContent")
    if reasoning is not None and "redactedContent" in reasoning:
        return {"reasoningContent": {"redactedContent": base64.b64decode(reasoning["redactedContent"])}}
    return block


_DECISIONS = {
    api.DECISION_KEEP: "keep",
    api.DECISION_PRUNE: "prune",
    api.DECISION_DEFER: "defer",
    api.DECISION_ABSTAIN: "abstain",
    api.DECISION_APPLY: "apply",
}
_CONTROLS = {
    api.CONTROL_MODE_RULE: "rule",
    api.CONTROL_MODE_AGENT: "agent",
    api.CONTROL_MODE_OPERATOR: "operator",
    api.CONTROL_MODE_CLIENT: "client",
}


@dataclass(frozen=True, slots=True)
class Certificate:
    """One decision of the view engine and why it was taken."""

    number: int
    """1, 2, 3 ... within the session (0 in a dry run)."""
    seq: int
    decision: str
    """"keep", "prune", "defer", "abstain" or "apply"."""
    level: int
    rule: str
    reason: str
    evidence: str
    rationale: str
    handle: str
    protection: str
    tokens_removed: int
    placeholder_tokens: int
    first_divergence_tokens: int
    mutation_radius_tokens: int
    estimated_cost_effect: float
    view_version: int
    policy_version: str
    control: str
    """"rule", "agent" or "operator"."""
    previous_hash: str
    hash: str
    view_format: str
    """The format of the render that made the decision ("openai_chat", "anthropic_messages", ...);
    empty for a decision made outside a render (a retraction)."""
    created_at: datetime | None
    """When it was stored (None in a dry run)."""

    @classmethod
    def from_proto(cls, message: api.Certificate) -> Certificate:
        return cls(
            number=int(message.id or 0),
            seq=message.seq,
            decision=_DECISIONS.get(message.decision, ""),
            level=message.level,
            rule=message.rule,
            reason=message.reason,
            evidence=message.evidence,
            rationale=message.rationale,
            handle=message.handle,
            protection=message.protection,
            tokens_removed=message.tokens_removed,
            placeholder_tokens=message.placeholder_tokens,
            first_divergence_tokens=message.first_divergence_tokens,
            mutation_radius_tokens=message.mutation_radius_tokens,
            estimated_cost_effect=message.estimated_cost_effect,
            view_version=message.applied_at_view_version,
            policy_version=message.policy_version,
            control=_CONTROLS.get(message.control_mode, ""),
            previous_hash=message.previous_hash,
            hash=message.hash,
            view_format=_FORMATS.get(message.view_format, ""),
            created_at=_time(message.created_at) if message.HasField("created_at") else None,
        )


@dataclass(frozen=True, slots=True)
class Retraction:
    """What RetractItems did: the items it retracted (those already retracted are left out)
    and one certificate each."""

    seqs: list[int]
    certificates: tuple[Certificate, ...]


@dataclass(frozen=True, slots=True)
class PruneOutcome:
    seq: int
    accepted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why an item is shown the way it is now."""

    seq: int
    representation: str
    pinned: bool
    protection: str
    certificates: tuple[Certificate, ...]
    item: pb.Item = field(default_factory=pb.Item)
    """The item as stored (a redacted one: its identity only, no content or metadata)."""

    @classmethod
    def from_proto(cls, message: api.ExplainItemResponse) -> Explanation:
        return cls(
            seq=message.item.seq,
            representation=_representation(message.representation),
            pinned=message.pinned,
            protection=message.protection,
            certificates=tuple(Certificate.from_proto(c) for c in message.certificates),
            item=message.item,
        )


@dataclass(frozen=True, slots=True)
class Retrieved:
    """A page of an original that left a view."""

    handle: str
    seq: int
    content: str
    total_lines: int
    total_tokens: int
    next_offset: int
    """Where the next page starts (in the unit asked); the total after the last page."""
    served_from: str
    """``stash`` or ``history``."""

    @classmethod
    def from_proto(cls, message: api.RetrieveResponse) -> Retrieved:
        return cls(
            handle=message.handle,
            seq=message.seq,
            content=message.content,
            total_lines=message.total_lines,
            total_tokens=message.total_tokens,
            next_offset=message.next_offset,
            served_from=message.served_from,
        )


@dataclass(frozen=True, slots=True)
class SearchHit:
    seq: int
    handle: str
    snippet: str
    """The match in its context, marked «like this» (full text and substring)."""
    score: float
    role: str
    tool_name: str

    @classmethod
    def from_proto(cls, message: api.SearchHit) -> SearchHit:
        return cls(
            seq=message.seq,
            handle=message.handle,
            snippet=message.snippet,
            score=message.score,
            role=pb.Role.Name(message.role).removeprefix("ROLE_").lower(),
            tool_name=message.tool_name,
        )


@dataclass(frozen=True, slots=True)
class SearchResults:
    hits: tuple[SearchHit, ...]
    next_page_token: str
    """Pass it back for the next page; empty after the last."""

    @classmethod
    def from_proto(cls, message: api.SearchResponse) -> SearchResults:
        return cls(tuple(SearchHit.from_proto(h) for h in message.hits), message.next_page_token)


@dataclass(frozen=True, slots=True)
class Offloaded:
    """An item out of the view, and how to get it back."""

    seq: int
    handle: str
    tool_name: str
    arguments_digest: str
    tokens: int
    reason: str


@dataclass(frozen=True, slots=True)
class UsageSummary:
    """The usage contextd predicted for a session's calls, beside the usage reported for them
    (summed over the reported calls; the predicted figures count contextd's tokens, the
    reported ones the provider's: compare the shares)."""

    renders: int
    reported_calls: int
    predicted_cache_read_tokens: int
    predicted_cache_write_tokens: int
    predicted_uncached_tokens: int
    reported_cache_read_tokens: int
    reported_cache_write_tokens: int
    reported_input_tokens: int
    reported_output_tokens: int
    predicted_cache_read_share: float
    reported_cache_read_share: float

    @classmethod
    def from_proto(cls, message: api.UsageSummary) -> UsageSummary:
        return cls(**{name: getattr(message, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Usage:
    """A model call's usage as its provider billed it, for `report_usage`. `input_tokens` is the
    input billed at the input price: neither read from the cache nor written to it."""

    provider: str
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @classmethod
    def from_anthropic(cls, usage: Any, model: str = "") -> Usage:
        """From a Messages response's ``usage`` (the SDK's object or its dict). Raises ValueError
        for anything else (a whole response, another provider's usage)."""
        if _field(usage, "input_tokens") is None:
            raise ValueError("not a Messages response's usage: no input_tokens")
        written = _field(usage, "cache_creation_input_tokens")
        if written is None:  # only the breakdown by cache lifetime
            by_ttl = _field(usage, "cache_creation")
            written = _count(by_ttl, "ephemeral_5m_input_tokens") + _count(by_ttl, "ephemeral_1h_input_tokens")
        return cls(
            "anthropic",
            model,
            _count(usage, "input_tokens"),
            _count(usage, "output_tokens"),
            _count(usage, "cache_read_input_tokens"),
            int(written or 0),
        )

    @classmethod
    def from_openai(cls, usage: Any, model: str = "") -> Usage:
        """From a Chat Completions response's ``usage`` (``prompt_tokens`` count the cached ones)
        or a Responses one's (``input_tokens``, likewise). Raises ValueError for anything else."""
        chat = _field(usage, "prompt_tokens") is not None
        if not chat and _field(usage, "input_tokens") is None:
            raise ValueError("not an OpenAI response's usage: no prompt_tokens or input_tokens")
        prompt, details, output = (
            ("prompt_tokens", "prompt_tokens_details", "completion_tokens")
            if chat
            else ("input_tokens", "input_tokens_details", "output_tokens")
        )
        cached = _count(_field(usage, details), "cached_tokens")
        return cls("openai", model, max(0, _count(usage, prompt) - cached), _count(usage, output), cached, 0)


def _field(value: Any, name: str) -> Any:
    if value is None:
        return None
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _count(value: Any, name: str) -> int:
    found = _field(value, name)
    return int(found) if found else 0


@dataclass(frozen=True, slots=True)
class Status:
    version: int
    history_tokens: int
    view_tokens: int
    """Tokens of the latest view (0 before the first render)."""
    budget_tokens: int
    """The budget that view was asked to fit (0: none)."""
    offloaded: tuple[Offloaded, ...]
    pending_deferred: int
    stash_hit_rate: float
    usage: UsageSummary | None = None
    """Predicted against reported usage of the session's calls (``report_usage``); None from a
    server that does not say."""

    @classmethod
    def from_proto(cls, message: api.GetStatusResponse) -> Status:
        return cls(
            version=message.version,
            history_tokens=message.history_tokens,
            view_tokens=message.view_tokens,
            budget_tokens=message.budget_tokens,
            offloaded=tuple(
                Offloaded(o.seq, o.handle, o.tool_name, o.arguments_digest, o.tokens, o.reason)
                for o in message.offloaded
            ),
            pending_deferred=message.pending_deferred,
            stash_hit_rate=message.stash_hit_rate,
            usage=UsageSummary.from_proto(message.usage) if message.HasField("usage") else None,
        )


def _representation(value: int) -> str:
    return api.Representation.Name(value).removeprefix("REPRESENTATION_").lower()  # type: ignore[arg-type]
