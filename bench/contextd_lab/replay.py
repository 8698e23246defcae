"""Replay a trace through a running contextd, call by call, and record what each call sent.

An agent's loop, reproduced from a trace (the neutral format of
``../shared/traces/README.md``): the messages up to each assistant message
are appended over gRPC, then the view is rendered, as the agent would before
its model call; the assistant message is the model's answer, appended with
what follows it. Each call's prompt (the rendered messages) goes through the
prompt-cache model of both providers (`contextd_lab.cache`), ``gap`` seconds
after the previous one, and is priced. At the end the probes are checked: a
fact is visible in the last view, recoverable through a handle that view
shows (fetched back with Retrieve, from the service), or lost; and the same in
the view of the model call that used it, where the probe says one did. At
every call, besides, the identifiers the model's answer in the trace wrote
are looked for in the history before the call and in the call's view: those
the history held and the view did not show were hidden from a model that went
on to use them (`used_and_hidden`).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextd.engine.compress.strategy import COMPRESSED
from contextd.engine.compress.text import identifiers
from contextd.engine.model import strings_in
from contextd.engine.stages.eligible import NOT_SMALLER
from contextd_client import Client, Usage, UsageSummary, View, ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_lab.cache import Billed, PromptCache, Segment
from contextd_lab.headroom import HeadroomProxy, from_chat, to_chat

PROVIDERS = ("anthropic", "openai")
LAB_MODEL = "the lab's cache model"


@dataclass
class Call:
    """One model call of a replay."""

    tokens: int
    render_ms: float
    billed: dict[str, Billed]
    prompt: tuple[Segment, ...]
    divergence: int | None = None
    """Tokens before the first message that differs from the previous call's prompt, when this
    call does not extend that prompt as it was (a prefix broken); None when it does."""
    radius: int = 0
    """Tokens of the previous prompt past the divergence: what the change made the provider read again."""
    through: int | None = None
    """Messages cached, when the view placed the cache breakpoint before its end (None: at its end)."""


@dataclass
class Run:
    trace_id: str
    condition: str
    calls: list[Call] = field(default_factory=list)
    item_tokens: dict[int, int] = field(default_factory=dict)
    """Each item's own tokens (as the service counted them at append)."""
    worst: dict[int, str] = field(default_factory=dict)
    """Per item taken out of a view at some call (placeholder, reduced, omitted), by a prune:
    the least it was ever shown as."""
    pruned_at: dict[int, int] = field(default_factory=dict)
    """Per item in `worst`: the render (0, 1, ...) that first showed it pruned."""
    shown_at: dict[int, int] = field(default_factory=dict)
    """Per item: the first render that had it."""
    rule_of: dict[int, str] = field(default_factory=dict)
    compressed: set[int] = field(default_factory=set)
    saved_by_rule: Counter[str] = field(default_factory=Counter)
    """Tokens not sent, over all calls, net of what stands in for them."""
    decisions: Counter[str] = field(default_factory=Counter)
    final: list[tuple[int, str, int, str]] = field(default_factory=list)
    """The last view's items: seq, representation, tokens, handle."""
    probes: list[str] = field(default_factory=list)
    """Each probe's outcome in the last view, in the order given: visible, recoverable or lost."""
    needed: list[str | None] = field(default_factory=list)
    """Each probe's outcome in the view of the call that used it (the model call that wrote its
    last sighting, when that is an assistant turn after the first); None for the others."""
    used: int = 0
    """Over all calls, the identifiers the model's answer wrote that the history before it held
    (`used_and_hidden`)."""
    hidden: list[tuple[int, str]] = field(default_factory=list)
    """Of those, the ones the call's view did not show: (call number, identifier)."""
    usage: UsageSummary | None = None
    """What the service predicted for the calls, beside the lab's Anthropic bill of them, which
    the replay reported to it (ReportUsage) as a client reports the provider's."""

    @property
    def sent(self) -> int:
        return sum(c.tokens for c in self.calls)

    def cost(self, provider: str) -> float:
        return sum(c.billed[provider].dollars for c in self.calls)

    def cached(self, provider: str) -> tuple[int, int, int]:
        """Cache read, cache write and uncached tokens over all calls."""
        bills = [c.billed[provider] for c in self.calls]
        return (
            sum(b.cache_read for b in bills),
            sum(b.cache_write for b in bills),
            sum(b.uncached for b in bills),
        )


def message_text(message: Mapping[str, Any]) -> str:
    """A trace message's text and its calls' arguments (as JSON): where a fact in it can be found."""
    calls = [json.dumps(c["arguments"]) for c in message.get("tool_calls") or ()]
    return "\n".join([message.get("content") or "", *calls])


def written(message: Mapping[str, Any]) -> str:
    """A trace message's text and its calls' arguments, decoded (a command as the agent typed it)."""
    arguments = [s for call in message.get("tool_calls") or () for s in strings_in(call["arguments"])]
    return "\n".join([message.get("content") or "", *arguments])


def answer_terms(message: Mapping[str, Any]) -> tuple[str, ...]:
    """The identifiers a trace's assistant message writes, in its text and its calls' arguments
    (identifier-like words, as a focus takes them: ``queryset.filter``, ``rel_obj``, a path)."""
    return identifiers(written(message), limit=sys.maxsize)


def view_text(messages: Sequence[Mapping[str, Any]], system: Any = None) -> str:
    """The words of a rendered view (OpenAI chat messages, and a system prompt as text or
    blocks): contents, and the arguments of tool calls decoded from their JSON text."""
    parts = list(strings_in(system))
    for message in messages:
        parts.extend(strings_in(message.get("content")))
        for call in message.get("tool_calls") or ():
            arguments = call.get("function", {}).get("arguments", "")
            try:
                parts.extend(strings_in(json.loads(arguments)))
            except ValueError:
                parts.append(arguments)
    return "\n".join(parts)


def used_and_hidden(terms: Iterable[str], history: str, view: str) -> tuple[int, list[str]]:
    """Of the identifiers a model call's answer wrote (`terms`), how many the history before
    the call held (the model may have read them there), and which of those its view did not
    show: a fact the agent used that the view had left to a handle (or lost)."""
    used = [t for t in terms if _named(t, history)]
    return len(used), [t for t in used if not _named(t, view)]


def _named(term: str, text: str) -> bool:
    """Whether `text` holds `term` as a whole name (`rel_obj` is not in `rel_obj_attr`)."""
    return term in text and re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text) is not None


def trace_items(trace: Mapping[str, Any], metadata: Sequence[Mapping[str, str]] | None = None) -> list[pb.Item]:
    """The trace's messages as items (reasoning text is left out: providers do not take it back).
    `metadata`, one mapping per message, adds to what a message carries itself."""
    out = []
    for index, message in enumerate(trace["messages"]):
        role, text = message["role"], message.get("content") or ""
        blocks: list[pb.ContentBlock] = []
        if role == "tool":
            result = pb.ToolResultBlock(
                tool_use_id=message["tool_call_id"],
                content=[pb.ContentBlock(text=pb.TextBlock(text=text))] if text else [],
                is_error=bool(message.get("is_error")),
                name=message.get("name", ""),
            )
            blocks.append(pb.ContentBlock(tool_result=result))
        else:
            if text:
                blocks.append(pb.ContentBlock(text=pb.TextBlock(text=text)))
            for call in message.get("tool_calls") or ():
                use = pb.ToolUseBlock(id=call["id"], name=call["name"], input_json=json.dumps(call["arguments"]))
                blocks.append(pb.ContentBlock(tool_use=use))
            if not blocks:
                blocks.append(pb.ContentBlock(text=pb.TextBlock(text="(empty)")))
        extra = {**(message.get("metadata") or {}), **(metadata[index] if metadata else {})}
        out.append(pb.Item(role=_ROLES[role], content=blocks, metadata=extra))
    return out


_ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}


def replay(
    client: Client,
    trace: Mapping[str, Any],
    condition: str,
    policy: str,
    *,
    probes: Iterable[Mapping[str, Any]] = (),
    gap: float = 30.0,
    metadata: Sequence[Mapping[str, str]] | None = None,
    place_breakpoint: bool = False,
    peer: HeadroomProxy | None = None,
) -> Run:
    """Replay `trace` under `policy` (its text; "" for the default policy) on a new session.
    `place_breakpoint`: the agent lets the view place the prompt-cache breakpoint (where the
    view says, Anthropic's cache ends; else at the end of each call, as agents put it).
    `peer`: each call's request goes through headroom's proxy first (contextd_lab/headroom.py),
    and the session receives what it forwards."""
    items = trace_items(trace, metadata)
    if peer is not None:
        peer.new_conversation()
    forwarded: list[dict[str, Any]] = []
    run = Run(trace["id"], condition)
    probes = list(probes)
    run.needed = [None] * len(probes)
    used_at: dict[int, list[int]] = {}  # message index -> the probes its model call used
    for n, probe in enumerate(probes):
        last = probe.get("last_seen_index", -1)
        if last > probe.get("message_index", last) and trace["messages"][last]["role"] == "assistant":
            used_at.setdefault(last, []).append(n)
    originals: dict[str, str] = {}
    caches = {provider: PromptCache(provider) for provider in PROVIDERS}
    session = client.create_session(policy=policy).id
    try:
        ends = [i for i, m in enumerate(trace["messages"]) if m["role"] == "assistant"] + [len(items)]
        appended, previous = 0, None
        for number, end in enumerate(ends):
            if end > appended:
                new = items[appended:end]
                if peer is not None:
                    forwarded = _forwarded(peer, trace["messages"][:end], forwarded)
                    messages = [
                        from_chat(f, o)
                        for f, o in zip(forwarded[appended:end], trace["messages"][appended:end], strict=True)
                    ]
                    new = trace_items({"messages": messages})
                result = client.append_items(session, new)
                run.item_tokens.update((r.seq, r.token_count) for r in result.receipts)
                appended = end
            started = time.perf_counter()
            view = client.render_view(session, ViewFormat.OPENAI_CHAT, place_cache_breakpoint=place_breakpoint)
            elapsed = (time.perf_counter() - started) * 1000
            for certificate in view.certificates:
                no_gain = certificate.decision == "abstain" and certificate.rationale == NOT_SMALLER
                run.decisions["no_gain" if no_gain else certificate.decision] += 1
                if certificate.decision == "prune":
                    if certificate.reason.startswith(COMPRESSED):
                        run.compressed.add(certificate.seq)
                    else:
                        run.rule_of[certificate.seq] = certificate.rule
            for shown in view.items:
                run.shown_at.setdefault(shown.seq, number)
                if shown.representation == "full":
                    continue
                saved = run.item_tokens.get(shown.seq, shown.tokens) - shown.tokens
                if end < len(items):
                    run.saved_by_rule[run.rule_of.get(shown.seq, "compressions")] += saved
                if shown.seq in run.rule_of:
                    run.worst[shown.seq] = _worse(run.worst.get(shown.seq), shown.representation)
                    run.pruned_at.setdefault(shown.seq, number)
            if end < len(items):
                history = "\n".join(written(m) for m in trace["messages"][:end])
                text = view_text(view.messages, view.system)
                used, hidden = used_and_hidden(answer_terms(trace["messages"][end]), history, text)
                run.used += used
                run.hidden += [(number, term) for term in hidden]
            behind = peer.originals if peer is not None else {}
            for n in used_at.get(end, ()):
                run.needed[n] = probe_outcome(client, session, probes[n]["answer"], view, originals, behind)
            if end == len(items):  # the view after the last message: what the probes are checked on
                run.final = [(s.seq, s.representation, s.tokens, s.handle) for s in view.items]
                run.probes = [probe_outcome(client, session, p["answer"], view, originals, behind) for p in probes]
                break
            prompt = _segments(view.messages, view.items, view.framing_tokens)
            at = number * gap
            through = cached_messages(view)
            billed = {p: caches[p].call(prompt, at, through) for p in PROVIDERS}
            call = Call(view.total_tokens, elapsed, billed, prompt, through=through)
            bill = billed["anthropic"]
            client.report_usage(
                session,
                view.view_version,
                Usage("anthropic", LAB_MODEL, bill.uncached, 0, bill.cache_read, bill.cache_write),
            )
            if previous is not None:
                shared = _shared(previous.prompt, prompt)
                if shared < len(previous.prompt):
                    call.divergence = sum(s.tokens for s in prompt[:shared])
                    call.radius = sum(s.tokens for s in previous.prompt[shared:])
            run.calls.append(call)
            previous = call
        run.usage = client.get_status(session).usage
    finally:
        client.delete_session(session)
    return run


def _forwarded(
    peer: HeadroomProxy, messages: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """What headroom's proxy forwards of a request holding `messages`, checked to keep what it
    forwarded of the previous request (`before`) as it was: the session can only grow."""
    forwarded = peer.forward([to_chat(m) for m in messages])
    if len(forwarded) != len(messages) or forwarded[: len(before)] != list(before):
        raise RuntimeError("headroom's proxy changed a message it had forwarded before: the lab cannot replay that")
    return forwarded


def cached_messages(view: View) -> int | None:
    """How many of the view's messages the call caches: through the one holding the item the view
    placed the breakpoint after (None: all of them)."""
    if not view.cache_breakpoint_seq:
        return None
    return next(s.message_index for s in view.items if s.seq == view.cache_breakpoint_seq) + 1


_ORDER = {"reduced": 0, "placeholder": 1, "omitted": 2}


def _worse(a: str | None, b: str) -> str:
    return b if a is None or _ORDER.get(b, 0) > _ORDER.get(a, 0) else a


def _segments(messages: Sequence[Mapping[str, Any]], items: Iterable[Any], framing: int) -> tuple[Segment, ...]:
    """One segment per rendered message: a digest of its bytes, and its tokens (its items'
    tokens and an even share of the framing)."""
    tokens = Counter[int]()
    for shown in items:
        tokens[shown.message_index] += shown.tokens
    share, left = divmod(framing, max(1, len(messages)))
    out = []
    for index, message in enumerate(messages):
        digest = hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()
        out.append(Segment(digest, tokens[index] + share + (index < left)))
    return tuple(out)


def _shared(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x.digest != y.digest:
            break
        n += 1
    return n


def probe_outcome(
    client: Client,
    session: str,
    answer: str,
    view: View,
    originals: dict[str, str],
    behind: Mapping[str, str] | None = None,
) -> str:
    """Visible in `view`, recoverable through a handle it shows (the original fetched back from
    the service, page by page, kept in `originals`) or behind a marker a peer put in what it sent
    (`behind`: the originals its own store gives back), or lost."""
    if json.dumps(answer)[1:-1] in view.messages_json + (json.dumps(view.system) if view.system else ""):
        return "visible"
    if behind and any(answer in original for original in behind.values()):
        return "recoverable"
    for shown in view.items:
        if shown.representation == "full" or not shown.handle:
            continue
        if shown.handle not in originals:
            originals[shown.handle] = _original(client, session, shown.handle)
        if answer in originals[shown.handle]:
            return "recoverable"
    return "lost"


def _original(client: Client, session: str, handle: str) -> str:
    pages, offset = [], 0
    while True:
        page = client.retrieve(session, handle, offset=offset)
        pages.append(page.content)
        if page.next_offset <= offset or page.next_offset >= page.total_tokens:
            return "".join(pages)
        offset = page.next_offset
