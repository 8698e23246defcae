"""Protobuf messages to domain values and back. The only module that knows both."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from contextd.engine.certificates import Certificate, Decision
from contextd.engine.errors import FieldViolation, InvalidArgument
from contextd.engine.model import (
    AppendResult,
    Block,
    DocumentBlock,
    ImageBlock,
    Item,
    ItemContent,
    ReasoningBlock,
    Representation,
    ResultPart,
    Role,
    Session,
    Source,
    TextBlock,
    ToolEffect,
    ToolEffectKind,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.state import ControlMode
from contextd.engine.timing import Usage
from contextd.engine.view import View, ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_storage.events import Event
from contextd_storage.views import UsageSummary

ROLES = {
    pb.ROLE_SYSTEM: Role.SYSTEM,
    pb.ROLE_USER: Role.USER,
    pb.ROLE_ASSISTANT: Role.ASSISTANT,
    pb.ROLE_TOOL: Role.TOOL,
}
ROLE_TO_PROTO = {v: k for k, v in ROLES.items()}
EFFECTS = {
    pb.TOOL_EFFECT_KIND_READ: ToolEffectKind.READ,
    pb.TOOL_EFFECT_KIND_WRITE: ToolEffectKind.WRITE,
    pb.TOOL_EFFECT_KIND_PURE: ToolEffectKind.PURE,
    pb.TOOL_EFFECT_KIND_VOLATILE: ToolEffectKind.VOLATILE,
}
EFFECT_TO_PROTO = {v: k for k, v in EFFECTS.items()}
FORMAT_TO_PROTO: dict[ViewFormat, api.ViewFormat.ValueType] = {
    ViewFormat.OPENAI_CHAT: api.VIEW_FORMAT_OPENAI_CHAT,
    ViewFormat.ANTHROPIC_MESSAGES: api.VIEW_FORMAT_ANTHROPIC_MESSAGES,
    ViewFormat.OPENAI_RESPONSES: api.VIEW_FORMAT_OPENAI_RESPONSES,
    ViewFormat.BEDROCK_CONVERSE: api.VIEW_FORMAT_BEDROCK_CONVERSE,
}
FORMATS: dict[int, ViewFormat] = {v: k for k, v in FORMAT_TO_PROTO.items()}
REPRESENTATION_TO_PROTO = {
    Representation.FULL: api.REPRESENTATION_FULL,
    Representation.REDUCED: api.REPRESENTATION_REDUCED,
    Representation.PLACEHOLDER: api.REPRESENTATION_PLACEHOLDER,
    Representation.OMITTED: api.REPRESENTATION_OMITTED,
}


# ------------------------------------------------------------------ inbound


def items_from_proto(messages: Sequence[pb.Item]) -> list[ItemContent]:
    """Map request items to the domain; InvalidArgument names every field that cannot map."""
    violations: list[FieldViolation] = []
    items = [_item(m, f"items[{i}]", violations) for i, m in enumerate(messages)]
    if violations:
        raise InvalidArgument(violations)
    return items


def _item(message: pb.Item, path: str, violations: list[FieldViolation]) -> ItemContent:
    role = ROLES.get(message.role)
    if role is None:
        unset = message.role == pb.ROLE_UNSPECIFIED
        violations.append(
            FieldViolation(f"{path}.role", "role is not set" if unset else f"unknown role {message.role}")
        )
        role = Role.USER  # placeholder so mapping can continue and report every problem at once
    blocks = tuple(
        b
        for j, block in enumerate(message.content)
        if (b := _block(block, f"{path}.content[{j}]", violations)) is not None
    )
    return ItemContent(
        role=role,
        content=blocks,
        source=_source(message, path, violations),
        tool_effect=_effect(message, path, violations),
        name=message.name,
        metadata=dict(message.metadata),
    )


def _block(block: pb.ContentBlock, path: str, violations: list[FieldViolation]) -> Block | None:
    kind = block.WhichOneof("block")
    if kind == "text":
        return TextBlock(block.text.text, block.text.item_id)
    if kind == "tool_use":
        use = block.tool_use
        return ToolUseBlock(use.id, use.name, use.input_json, use.item_id)
    if kind == "tool_result":
        result = block.tool_result
        parts: list[ResultPart] = []
        for k, part in enumerate(result.content):
            mapped = _block(part, f"{path}.tool_result.content[{k}]", violations)
            if mapped is None:
                continue
            if not isinstance(mapped, TextBlock | ImageBlock | DocumentBlock):
                violations.append(
                    FieldViolation(
                        f"{path}.tool_result.content[{k}]", "a tool result holds text, image or document blocks"
                    )
                )
                continue
            parts.append(mapped)
        return ToolResultBlock(result.tool_use_id, tuple(parts), result.is_error, result.name)
    if kind == "image":
        image = block.image
        image_source = image.WhichOneof("source")
        return ImageBlock(
            image.media_type,
            data=image.data if image_source == "data" else None,
            uri=image.uri if image_source == "uri" else None,
            detail=image.detail,
        )
    if kind == "document":
        doc = block.document
        source = doc.WhichOneof("source")
        return DocumentBlock(
            doc.media_type,
            data=doc.data if source == "data" else None,
            uri=doc.uri if source == "uri" else None,
            text=doc.text if source == "text" else None,
            title=doc.title,
        )
    if kind == "reasoning":
        r = block.reasoning
        return ReasoningBlock(r.text, r.signature, r.redacted_data, r.item_id, r.encrypted_content)
    violations.append(FieldViolation(path, "the block has no kind set (text, tool_use, tool_result, ...)"))
    return None


def _source(message: pb.Item, path: str, violations: list[FieldViolation]) -> Source | None:
    if not message.HasField("source"):
        return None
    source = message.source
    if not source.uri:
        violations.append(FieldViolation(f"{path}.source.uri", "a source needs a uri"))
    observed = None
    if source.HasField("observed_at"):
        try:
            observed = source.observed_at.ToDatetime(tzinfo=UTC)
        except (ValueError, OverflowError) as exc:
            violations.append(FieldViolation(f"{path}.source.observed_at", f"not a valid time: {exc}"))
    return Source(source.uri, source.version, observed)


def _effect(message: pb.Item, path: str, violations: list[FieldViolation]) -> ToolEffect | None:
    if not message.HasField("tool_effect"):
        return None
    kind = EFFECTS.get(message.tool_effect.kind)
    if kind is None:
        violations.append(
            FieldViolation(f"{path}.tool_effect.kind", f"unknown or unset kind {message.tool_effect.kind}")
        )
        return None
    return ToolEffect(kind, message.tool_effect.source_arg)


def view_format(value: int) -> ViewFormat:
    fmt = FORMATS.get(value)
    if fmt is None:
        names = ", ".join(api.ViewFormat.Name(value) for value in FORMAT_TO_PROTO.values())
        raise InvalidArgument.at("format", f"set a view format: one of {names}")
    return fmt


# ----------------------------------------------------------------- outbound


def timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


def session_to_proto(session: Session) -> api.Session:
    return api.Session(
        id=session.id,
        tenant=session.tenant,
        version=session.version,
        token_count=session.token_count,
        created_at=timestamp(session.created_at),
        updated_at=timestamp(session.updated_at),
        metadata=dict(session.metadata),
        policy_version=session.policy_version,
        policy=session.policy,
    )


def append_result_to_proto(result: AppendResult) -> api.AppendItemsResponse:
    return api.AppendItemsResponse(
        first_seq=result.first_seq,
        last_seq=result.last_seq,
        version=result.version,
        receipts=[
            api.ItemReceipt(seq=r.seq, content_hash=r.content_hash, token_count=r.token_count) for r in result.receipts
        ],
        replayed=result.replayed,
    )


RESPONSE_CERTIFICATES = 1000
"""The most certificates a view carries: a render's first ones, in order (the rest are
stored as every one is, and ListCertificates lists them by view version). A first render of a
long session under a budget decides about every item, and its certificates (about 250 bytes
each) outweighed the view: at 50,000 items they made a response over the message limit, so
the session could not be rendered at all."""


def view_to_proto(view: View, certificates: Sequence[Certificate] = ()) -> api.View:
    return api.View(
        session_id=view.session_id,
        version=view.version,
        format=FORMAT_TO_PROTO[view.format],
        encoding=view.encoding,
        messages_json=view.messages_json,
        system_json=view.system_json,
        items=[
            api.ViewItem(
                seq=v.seq,
                representation=REPRESENTATION_TO_PROTO[v.representation],
                tokens=v.tokens,
                message_index=v.message_index,
                handle=v.handle,
            )
            for v in view.items
        ],
        item_tokens=view.item_tokens,
        framing_tokens=view.framing_tokens,
        total_tokens=view.total_tokens,
        budget_tokens=view.budget_tokens,
        over_budget=view.over_budget,
        warnings=[api.ViewWarning(code=w.code, message=w.message) for w in view.warnings],
        policy_version=view.policy_version,
        request_patch_json=view.request_patch_json,
        view_version=view.view_version,
        stable_prefix_tokens=view.stable_prefix_tokens,
        cache_breakpoint_seq=view.cache_breakpoint_seq,
        retracted_items=view.retracted_items,
        certificates=[
            certificate_to_proto(c, view.session_id, view.format) for c in certificates[:RESPONSE_CERTIFICATES]
        ],
        certificates_total=len(certificates),
    )


DECISIONS = {
    Decision.KEEP: api.DECISION_KEEP,
    Decision.PRUNE: api.DECISION_PRUNE,
    Decision.DEFER: api.DECISION_DEFER,
    Decision.ABSTAIN: api.DECISION_ABSTAIN,
    Decision.APPLY: api.DECISION_APPLY,
}
DECISIONS_FROM_PROTO: dict[int, Decision] = {v: k for k, v in DECISIONS.items()}
CONTROLS = {
    ControlMode.RULE: api.CONTROL_MODE_RULE,
    ControlMode.AGENT: api.CONTROL_MODE_AGENT,
    ControlMode.OPERATOR: api.CONTROL_MODE_OPERATOR,
    ControlMode.CLIENT: api.CONTROL_MODE_CLIENT,
}


def certificate_to_proto(
    cert: Certificate, session_id: str, view_format: ViewFormat | None, created_at: datetime | None = None
) -> api.Certificate:
    """`view_format`: the format of the render that made it (None: made outside a render)."""
    body = cert.body
    message = api.Certificate(
        id=str(cert.number) if cert.number else "",
        session_id=session_id,
        seq=body.seq,
        decision=DECISIONS[body.decision],
        level=body.level,
        rule=body.rule,
        reason=body.reason,
        evidence=body.evidence,
        handle=body.handle,
        protection=body.protection,
        tokens_removed=body.tokens_removed,
        placeholder_tokens=body.placeholder_tokens,
        first_divergence_tokens=body.first_divergence_tokens,
        mutation_radius_tokens=body.mutation_radius_tokens,
        estimated_cost_effect=body.cost_effect,
        applied_at_view_version=cert.view_version,
        policy_version=cert.policy_version,
        control_mode=CONTROLS[body.control],
        previous_hash=cert.previous_hash,
        hash=cert.hash,
        rationale=body.rationale,
        view_format=FORMAT_TO_PROTO[view_format] if view_format is not None else api.VIEW_FORMAT_UNSPECIFIED,
    )
    if created_at is not None:
        message.created_at.CopyFrom(timestamp(created_at))
    return message


def item_to_proto(item: Item) -> pb.Item:
    """A stored item as the API returns it (for ExplainItem and friends)."""
    message = pb.Item(
        seq=item.seq,
        role=ROLE_TO_PROTO[item.role],
        content=[_block_to_proto(b) for b in item.content],
        name=item.name,
        metadata=dict(item.metadata),
        content_hash=item.content_hash,
        token_count=item.token_count,
        author=item.author,
        created_at=timestamp(item.created_at),
    )
    if item.source is not None:
        message.source.uri = item.source.uri
        message.source.version = item.source.version
        if item.source.observed_at is not None:
            message.source.observed_at.CopyFrom(timestamp(item.source.observed_at))
    if item.tool_effect is not None:
        message.tool_effect.kind = EFFECT_TO_PROTO[item.tool_effect.kind]
        message.tool_effect.source_arg = item.tool_effect.source_arg
    return message


def _block_to_proto(block: Block) -> pb.ContentBlock:
    match block:
        case TextBlock(text, item_id):
            return pb.ContentBlock(text=pb.TextBlock(text=text, item_id=item_id))
        case ToolUseBlock(id, name, input_json, item_id):
            return pb.ContentBlock(tool_use=pb.ToolUseBlock(id=id, name=name, input_json=input_json, item_id=item_id))
        case ToolResultBlock(tool_use_id, content, is_error, name):
            return pb.ContentBlock(
                tool_result=pb.ToolResultBlock(
                    tool_use_id=tool_use_id, content=[_block_to_proto(p) for p in content], is_error=is_error, name=name
                )
            )
        case ImageBlock(media_type, data, uri, detail):
            image = pb.ImageBlock(media_type=media_type, detail=detail)
            if data is not None:
                image.data = data
            elif uri is not None:
                image.uri = uri
            return pb.ContentBlock(image=image)
        case DocumentBlock(media_type, data, uri, text, title):
            doc = pb.DocumentBlock(media_type=media_type, title=title)
            if data is not None:
                doc.data = data
            elif uri is not None:
                doc.uri = uri
            elif text is not None:
                doc.text = text
            return pb.ContentBlock(document=doc)
        case ReasoningBlock(text, signature, redacted_data, item_id, encrypted_content):
            return pb.ContentBlock(
                reasoning=pb.ReasoningBlock(
                    text=text,
                    signature=signature,
                    redacted_data=redacted_data,
                    item_id=item_id,
                    encrypted_content=encrypted_content,
                )
            )
    raise TypeError(f"not a content block: {block!r}")


def usage_to_proto(summary: UsageSummary) -> api.UsageSummary:
    predicted, reported = summary.predicted, summary.reported_usage
    return api.UsageSummary(
        renders=summary.renders,
        reported_calls=summary.reported,
        predicted_cache_read_tokens=predicted.cache_read,
        predicted_cache_write_tokens=predicted.cache_write,
        predicted_uncached_tokens=predicted.uncached,
        reported_cache_read_tokens=reported.cache_read,
        reported_cache_write_tokens=reported.cache_write,
        reported_input_tokens=reported.uncached,
        reported_output_tokens=summary.output_tokens,
        predicted_cache_read_share=_share(predicted),
        reported_cache_read_share=_share(reported),
    )


def _share(usage: Usage) -> float:
    total = usage.cache_read + usage.cache_write + usage.uncached
    return usage.cache_read / total if total else 0.0


# ------------------------------------------------------------------ events

_EVENT_KINDS = frozenset(f.name for f in api.WatchSessionResponse.DESCRIPTOR.oneofs_by_name["event"].fields)


def event_to_proto(event: Event) -> api.WatchSessionResponse | None:
    """A stored event as watchers get it; None for a kind this version does not know (a newer
    replica's, mid-upgrade: skipped rather than sent half-read)."""
    if event.kind not in _EVENT_KINDS or event.kind == "heartbeat":
        return None
    response = api.WatchSessionResponse(
        cursor=event.cursor.encode(), session_id=event.session_id, time=timestamp(event.time)
    )
    body = dict(event.body)
    if event.kind == "view_rendered":
        body["format"] = FORMAT_TO_PROTO[ViewFormat(body["format"])]
    elif event.kind == "decisions_made":
        body["decisions"] = [d | {"outcome": DECISIONS[Decision(d["outcome"])]} for d in body["decisions"]]
    detail = getattr(response, event.kind)
    detail.SetInParent()
    json_format.ParseDict(body, detail, ignore_unknown_fields=True)
    return response


def heartbeat_to_proto(cursor: str, at: datetime) -> api.WatchSessionResponse:
    return api.WatchSessionResponse(cursor=cursor, time=timestamp(at), heartbeat=api.Heartbeat())
