"""Strands Agents on contextd: a session manager that keeps each agent's conversation in a contextd
session, and a conversation manager that shows the model contextd's view of it.

    from contextd_client import Client
    from contextd_client.integrations.strands import ContextdConversationManager, ContextdSessionManager

    sessions = ContextdSessionManager(Client("127.0.0.1:50051"), "ticket-4521")
    agent = Agent(model=model, tools=[*my_tools, *sessions.tools()], session_manager=sessions,
                  conversation_manager=ContextdConversationManager(sessions, budget_tokens=100_000))

What they replace:

- `ContextdSessionManager` for `FileSessionManager` / `S3SessionManager`, which write each message to
  ``message_<index>.json`` and leave concurrency to the caller (Strands' advice: a distributed lock
  keyed by the session id): two processes continuing one session (a Lambda retry, a redelivered
  request) both write the next index, and the last write wins. Here each message is one atomic append
  that names the session version it follows, so a second writer is refused (`SessionException`,
  ``VERSION_CONFLICT``), never interleaved or lost; and its idempotency key is the message's
  ``tracking_id`` (Strands' durable id), so a re-sent message is stored once: the retry of an append
  whose answer was lost (re-sent on the next hook), or the same prompt run again, in this process or
  another, with the tracking id the caller gave it. A new agent with the session id, in any process,
  starts from what contextd holds. `redact_latest_message` (Strands' guardrail redaction) is a contextd
  redaction: the original never comes back, in a view, Retrieve (``ITEM_REDACTED``) or Search.
- `ContextdConversationManager` for `SlidingWindowConversationManager` and
  `SummarizingConversationManager`, which lose what they drop or summarize: before every model call,
  ``agent.messages`` becomes contextd's view (budgeted; the history stays whole in contextd), where what
  left is a placeholder naming its handle and every decision has a certificate; the model gets the
  originals back with contextd's tools (`ContextdSessionManager.tools`).

How the two fit together. Strands adds each new message to ``agent.messages`` and fires
`MessageAddedEvent`: the session manager appends that message, and nothing else, to contextd. Before
each model call (`BeforeModelCallEvent`) the conversation manager renders the view and puts it in
``agent.messages``, in place, as Strands' own managers trim that list; that fires no event, so the
view's placeholders never go back into the history. The view's messages get tracking ids of their own,
recorded with what they hold, so when Strands extends the last message (input continuing a turn is
merged into it, a copy keeping its id) only the new blocks are appended. `apply_management` (after each
invocation) does nothing: the next call renders afresh, and a render no model call follows would be
counted as a call's. `reduce_context`, after a context-window overflow, halves the budget (from the
tokens of the view that overflowed) and Strands retries; when the view cannot get smaller, it raises.
So between calls ``agent.messages`` is the last view and what was added since; the whole history is
contextd's (`render_view`, `retrieve`, `search`). The session manager also works without the
conversation manager, under Strands' own managers (the first messages it loads are then unbudgeted).

Not kept: ``agent.state``, the interrupt state and the conversation manager's state, which
`FileSessionManager` writes beside the messages (contextd holds the conversation: keep the state an
application needs across processes in its own store; a non-empty ``agent.state`` is logged once), and
multi-agent state (`sync_multi_agent`). The system prompt is Strands' to send, not a message: budgets
count the messages only. A tool call's ``reasoningSignature`` has no field in contextd. Each agent of a
session has its own contextd session: the session id itself for Strands' default agent id,
``"<session id>:<agent id>"`` for another.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from strands import Agent
from strands.agent.conversation_manager import ConversationManager
from strands.hooks import BeforeModelCallEvent, HookRegistry
from strands.session import SessionManager
from strands.tools import PythonAgentTool
from strands.types.content import ContentBlock, Message
from strands.types.exceptions import ContextWindowOverflowException, SessionException
from strands.types.tools import AgentTool, ToolResult, ToolSpec, ToolUse

from contextd_client import AgentTools, AlreadyExists, Client, ContextdError, VersionConflict, View, ViewFormat
from contextd_client.formats import items_from_converse
from contextd_client.v1 import content_pb2 as pb

__all__ = ["ContextdConversationManager", "ContextdSessionManager"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

DEFAULT_AGENT_ID = "default"
_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"})
"""Strands' agent id when none is given: its contextd session is the session id itself."""
_VIEW_IDS = uuid.UUID("5d1f0f63-4c55-4a8e-9a52-6c1b0e9f3a17")
"""The namespace of the tracking ids a view's messages get (stable from one render to the next)."""


@dataclass(slots=True)
class _Stored:
    """A message contextd holds: its tracking id, its role, how many blocks it has, and its items."""

    tracking_id: str
    role: str
    blocks: int
    seqs: list[int]
    tool_results: bool


@dataclass(slots=True)
class _Append:
    """An append on its way: re-sent with the same key until contextd acknowledges it."""

    key: str
    items: list[pb.Item]
    message: _Stored


@dataclass(slots=True)
class _Conversation:
    """One agent's contextd session, as this process knows it."""

    session_id: str
    version: int
    latest: _Stored | None = None
    """The message appended last (what `redact_latest_message` redacts)."""
    shown: dict[str, _Stored] = field(default_factory=dict)
    """The messages of the view in ``agent.messages``, by tracking id."""
    pending: list[_Append] = field(default_factory=list)
    warned_state: bool = False


class ContextdSessionManager(SessionManager[Agent]):
    """Keeps each agent's conversation in a contextd session (created when missing, with `metadata`
    and `policy`), appending every message Strands adds exactly once, and restores it on agent
    initialization from contextd's view of it. `author` is stored with every append."""

    def __init__(
        self,
        client: Client,
        session_id: str,
        *,
        metadata: Mapping[str, str] | None = None,
        policy: str = "",
        author: str = "strands",
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.metadata = dict(metadata or {})
        self.policy = policy
        self.author = author
        self._conversations: dict[str, _Conversation] = {}

    def contextd_session_id(self, agent_id: str = DEFAULT_AGENT_ID) -> str:
        """The contextd session that holds the conversation of the agent `agent_id`."""
        return self.session_id if agent_id == DEFAULT_AGENT_ID else f"{self.session_id}:{agent_id}"

    # ------------------------------------------------------- the interface

    def initialize(self, agent: Agent, **kwargs: Any) -> None:
        """Open the agent's contextd session: a new one gets the agent's initial messages; one that
        exists replaces them with its view (budgeted as the agent's `ContextdConversationManager` says)."""
        if agent.agent_id in self._conversations:
            raise SessionException("The `agent_id` of an agent must be unique in a session.")
        manager = agent.conversation_manager
        views = manager if isinstance(manager, ContextdConversationManager) else None
        if views is not None and views.sessions is not self:
            raise SessionException("the agent's ContextdConversationManager shows another session manager's views")
        session_id = self.contextd_session_id(agent.agent_id)
        metadata = {"framework": "strands", "strands_agent_id": agent.agent_id, **self.metadata}
        try:
            try:
                version = self.client.create_session(session_id, metadata=metadata, policy=self.policy).version
            except AlreadyExists:
                version = self.client.get_session(session_id).version
        except ContextdError as exc:
            raise SessionException(f"contextd session {session_id}: {exc.message}") from exc
        conversation = self._conversations[agent.agent_id] = _Conversation(session_id, version)
        if version == 0:
            for i, message in enumerate(agent.messages):
                # The key is the position: two processes starting one session with the same messages write them once.
                self._queue(conversation, message, f"initial:{i}")
            self._flush(conversation)
        elif not agent.model.stateful:
            self.show_view(agent, views.budget_tokens if views is not None else 0)

    def append_message(self, message: Message, agent: Agent, **kwargs: Any) -> None:
        """Append what `message` adds to the conversation (nothing when contextd holds it already)."""
        conversation = self._conversation(agent)
        tracking_id = _tracking_id(message)
        known = conversation.latest if conversation.latest and conversation.latest.tracking_id == tracking_id else None
        known = known or conversation.shown.get(tracking_id)
        if known is None:
            self._queue(conversation, message, tracking_id)
        elif known.role == message["role"] and len(message["content"]) > known.blocks:
            # Strands merged input into the last message (a copy keeping its tracking id): append the new blocks.
            self._queue(conversation, message, f"{tracking_id}:+{known.blocks}", extends=known)
        self._flush(conversation)

    def redact_latest_message(self, redact_message: Message, agent: Agent, **kwargs: Any) -> None:
        """Redact the message appended last: its items leave every view and are never read again
        (a redacted tool result leaves its call answered by contextd's marker); a message without
        tool results is replaced by the redaction text of `redact_message`."""
        conversation = self._conversation(agent)
        self._flush(conversation)
        latest = conversation.latest
        if latest is None:
            raise SessionException("No message to redact.")
        if latest.seqs:
            reason = "redacted by the agent (Strands redact_latest_message)"
            self._call(lambda: self.client.retract(conversation.session_id, latest.seqs, reason=reason, redact=True))
        conversation.latest = None
        text = _redaction_text(redact_message)
        if not latest.tool_results and text:
            replacement = cast(Message, {"role": latest.role, "content": [{"text": text}]})
            replacement["tracking_id"] = latest.tracking_id
            self._queue(conversation, replacement, f"{latest.tracking_id}:redacted")
            self._flush(conversation)

    def sync_agent(self, agent: Agent, **kwargs: Any) -> None:
        """Re-send appends contextd has not acknowledged. Agent state is not stored (see the module)."""
        conversation = self._conversation(agent)
        self._flush(conversation)
        if not conversation.warned_state and agent.state.get():
            conversation.warned_state = True
            logger.warning("agent_id=<%s> | agent.state is not kept by contextd across processes", agent.agent_id)

    # ------------------------------------------------------------ the view

    def show_view(self, agent: Agent, budget_tokens: int = 0) -> View:
        """Render the agent's view (`budget_tokens` in contextd's tokens; 0: no budget) and make it the
        agent's messages, in place. Returns the view (its items, tokens, warnings, certificates)."""
        conversation = self._conversation(agent)
        self._flush(conversation)
        view = self._call(
            lambda: self.client.render_view(
                conversation.session_id, ViewFormat.BEDROCK_CONVERSE, budget_tokens=budget_tokens
            )
        )
        seqs: dict[int, list[int]] = {}
        for item in view.items:
            seqs.setdefault(item.message_index, []).append(item.seq)
        messages: list[Message] = []
        shown: dict[str, _Stored] = {}
        for index, rendered in enumerate(view.converse_kwargs()["messages"]):
            held = seqs.get(index, [])
            tracking_id = str(uuid.uuid5(_VIEW_IDS, f"{conversation.session_id}/{held[0] if held else 0}"))
            content = [_strands_block(block) for block in rendered["content"]]
            message = cast(Message, {"role": rendered["role"], "content": content, "tracking_id": tracking_id})
            messages.append(message)
            shown[tracking_id] = _Stored(tracking_id, message["role"], len(content), held, _has_results(content))
        conversation.shown = shown
        agent.messages[:] = messages
        return view

    def tools(self) -> list[AgentTool]:
        """contextd's agent tools (retrieve, search, pin, unpin, propose_prune, status) as Strands
        tools, answering for the calling agent's session; a failed call is an error result."""
        definitions = AgentTools(self.client, self.session_id, ViewFormat.BEDROCK_CONVERSE).definitions()
        return [
            PythonAgentTool(d["toolSpec"]["name"], cast(ToolSpec, d["toolSpec"]), self._run_tool) for d in definitions
        ]

    def _run_tool(self, tool_use: ToolUse, **invocation_state: Any) -> ToolResult:
        agent = invocation_state.get("agent")
        agent_id = agent.agent_id if isinstance(agent, Agent) else DEFAULT_AGENT_ID
        tools = AgentTools(self.client, self.contextd_session_id(agent_id), ViewFormat.BEDROCK_CONVERSE)
        return cast(ToolResult, tools.execute({"toolUse": tool_use})["toolResult"])

    # ------------------------------------------------------------ plumbing

    def _conversation(self, agent: Agent) -> _Conversation:
        conversation = self._conversations.get(agent.agent_id)
        if conversation is None:
            raise SessionException(
                f"agent {agent.agent_id!r} has not been initialized by this ContextdSessionManager "
                "(pass it as the agent's session_manager)"
            )
        return conversation

    def _queue(self, conversation: _Conversation, message: Message, key: str, extends: _Stored | None = None) -> None:
        """Convert `message` (its blocks after those `extends` holds) and queue its append."""
        start = extends.blocks if extends else 0
        blocks = message["content"][start:]
        try:
            items = items_from_converse([{"role": message["role"], "content": blocks}])
        except ValueError as exc:
            raise SessionException(f"contextd cannot store this message: {exc}") from exc
        stored = _Stored(
            _tracking_id(message),
            message["role"],
            start + len(blocks),
            list(extends.seqs) if extends else [],
            _has_results(blocks) or bool(extends and extends.tool_results),
        )
        if items:
            conversation.pending.append(_Append(_key(key), items, stored))
        else:  # nothing contextd keeps (blank text): nothing to write, but it is the latest message
            conversation.latest = stored

    def _flush(self, conversation: _Conversation) -> None:
        """Send the queued appends in order, each following the version this process knows: a retry
        (same key) is answered with the first try's result, another writer's append is a conflict."""
        while conversation.pending:
            append = conversation.pending[0]
            try:
                result = self.client.append_items(
                    conversation.session_id,
                    append.items,
                    idempotency_key=append.key,
                    expected_version=conversation.version,
                    author=self.author,
                )
            except (VersionConflict, AlreadyExists) as exc:
                conversation.pending.clear()  # they follow a version that is gone: none can be written
                why = (
                    f"another writer appended to it after version {conversation.version}"
                    if isinstance(exc, VersionConflict)
                    else f"message {append.message.tracking_id} was stored before with other content"
                )
                raise SessionException(
                    f"contextd session {conversation.session_id} refused the append ({exc.reason}): {why}; "
                    "this agent's messages are stale: create the agent again to continue from contextd"
                ) from exc
            except ContextdError as exc:
                if exc.code in _TRANSIENT:  # the answer may have been lost: the same key goes again next time
                    raise SessionException(
                        f"contextd session {conversation.session_id}: {exc} (the append is re-sent next time)"
                    ) from exc
                conversation.pending.pop(0)  # refused for what it is: no retry will take it
                raise SessionException(f"contextd session {conversation.session_id} refused the append: {exc}") from exc
            conversation.pending.pop(0)
            conversation.version = max(conversation.version, result.last_seq)
            append.message.seqs.extend(range(result.first_seq, result.last_seq + 1))
            conversation.latest = append.message

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except ContextdError as exc:
            raise SessionException(f"contextd: {exc.message}") from exc


class ContextdConversationManager(ConversationManager):
    """Shows the model contextd's view of the conversation: before every model call, the view (at
    most `budget_tokens` of contextd's tokens; 0: no budget) replaces ``agent.messages``. Needs the
    agent's session manager to be `sessions`. `last_view` is the view the model was last given."""

    def __init__(self, sessions: ContextdSessionManager, *, budget_tokens: int = 0) -> None:
        super().__init__()
        self.sessions = sessions
        self.budget_tokens = budget_tokens
        self.last_view: View | None = None
        self._overflowed_at: int | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        super().register_hooks(registry, **kwargs)
        registry.add_callback(BeforeModelCallEvent, self._show_view)

    def _show_view(self, event: BeforeModelCallEvent) -> None:
        self.last_view = self.sessions.show_view(event.agent, self.budget_tokens)

    def apply_management(self, agent: Agent, **kwargs: Any) -> None:
        """Nothing: the view is rendered before each model call (a render after the invocation,
        which no model call follows, would be counted as a call's)."""

    def reduce_context(self, agent: Agent, e: Exception | None = None, **kwargs: Any) -> None:
        """After a context-window overflow (`e`), halve the budget: the next call's view is at most
        half the tokens of the one that overflowed. Raises ContextWindowOverflowException when the
        view did not get smaller since the last overflow. Without `e` (proactive), nothing."""
        if e is None:
            return
        shown = self.last_view.total_tokens if self.last_view is not None else 0
        if shown <= 1 or (self._overflowed_at is not None and shown >= self._overflowed_at):
            raise ContextWindowOverflowException(
                f"contextd's view ({shown:,} tokens) cannot get smaller: what it keeps whole (the newest "
                "output, pinned and protected items) overflows the model's context window"
            ) from e
        self._overflowed_at = shown
        self.budget_tokens = shown // 2


def _tracking_id(message: Message) -> str:
    """The message's tracking id, given one if it has none (as Strands does on appending)."""
    if not message.get("tracking_id"):
        message["tracking_id"] = str(uuid.uuid4())
    return message["tracking_id"]


def _key(key: str) -> str:
    return f"strands:{key}"[:256]


def _has_results(blocks: Sequence[ContentBlock] | Sequence[dict[str, Any]]) -> bool:
    return any("toolResult" in block for block in blocks)


def _redaction_text(message: Message) -> str:
    """The text a guardrail put in place of the input: a text block, or a tool result's text."""
    for block in message["content"]:
        if "text" in block:
            return block["text"]
        for part in block.get("toolResult", {}).get("content", []):
            if "text" in part:
                return part["text"]
    return ""


def _strands_block(block: dict[str, Any]) -> ContentBlock:
    """A Converse content block as Strands keeps it: an S3 source as ``location``, a text document as
    bytes (Strands' sources are bytes or a location), a tool result with its ``status``."""
    for kind in ("image", "document"):
        if kind in block:
            media = block[kind]
            source = media["source"]
            if "s3Location" in source:
                source = {"location": {"type": "s3", "uri": source["s3Location"]["uri"]}}
            elif "text" in source:
                source = {"bytes": source["text"].encode()}
            return cast(ContentBlock, {kind: {**media, "source": source}})
    if "toolResult" in block:
        result = block["toolResult"]
        content = [_strands_block(part) for part in result["content"]]
        status = result.get("status", "success")
        return cast(
            ContentBlock, {"toolResult": {"toolUseId": result["toolUseId"], "content": content, "status": status}}
        )
    return cast(ContentBlock, block)
