"""contextd as the OpenAI Agents SDK's session, and the view as what its model is sent.

`ContextdSession` implements the SDK's `Session` protocol (``get_items``, ``add_items``,
``pop_item``, ``clear_session``) over a contextd session, and its `call_model_input_filter`
(for ``RunConfig``) replaces what the SDK would send the model with contextd's view: the
session in the Responses format, fitted to a budget, with each pruning decision certified
and every original that left it recoverable by handle. Adopting it:

    from contextd_client import AsyncClient
    from contextd_client.integrations.openai_agents import ContextdSession

    session = ContextdSession(AsyncClient("127.0.0.1:50051"), "support-42", budget_tokens=100_000)
    config = RunConfig(call_model_input_filter=session.call_model_input_filter)
    result = await Runner.run(agent, "Why does the build fail?", session=session, run_config=config)

and, to let the model get back what left its view, ``Agent(tools=[*tools, *await
session.agent_tools()])``. The SDK's own sessions (`SQLiteSession`, in one process's file
or memory; Redis, SQLAlchemy) store the items and hand all of them, or the last N, to every
model call: a long conversation grows until the provider refuses it, and keeping it short
is each application's own input filter, which forgets what it cut. Here the history stays
whole in contextd, for any process to continue; the model gets a view within the budget,
whose placeholders name the handles that get the originals back (``contextd_retrieve``),
each decision with its certificate; and a popped item is retracted, not deleted.

Needs ``openai-agents`` (``pip install "contextd-client[openai-agents]"``).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agents import FunctionTool
from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.run_config import CallModelData, ModelInputData
from agents.tool_context import ToolContext

from contextd_client import AlreadyExists, AsyncAgentTools, AsyncClient, NotFound, View, ViewFormat
from contextd_client.formats import items_from_responses
from contextd_client.v1 import content_pb2 as pb

__all__ = ["ContextdSession"]

POPPED = "popped by the OpenAI Agents SDK session"
"""The reason a popped item's retraction certificate gives (with the pop's own token)."""
_WITHDRAWN = ("retracted", "redacted")
"""How GetStatus says an item was retracted."""


class ContextdSession:
    """An Agents SDK session whose items live in contextd session `session_id` (created on
    first use, with `policy` and `metadata`; an existing one is used as it is).

    `budget_tokens` is the most tokens the view `call_model_input_filter` sends may hold
    (0: no budget; the session's rules still compress); the instructions and tool
    definitions the SDK sends beside it are not counted. `last_view` is the view the latest
    model call was sent (its items, tokens, certificates and warnings). Without the filter,
    the SDK sends what `get_items` returns and the run's items after it, with no budget.
    """

    def __init__(
        self,
        client: AsyncClient,
        session_id: str,
        *,
        budget_tokens: int = 0,
        policy: str = "",
        metadata: Mapping[str, str] | None = None,
        session_settings: SessionSettings | None = None,
        author: str = "openai-agents",
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.budget_tokens = budget_tokens
        self.session_settings = session_settings
        self.last_view: View | None = None
        self._policy, self._metadata, self._author = policy, dict(metadata or {}), author
        self._lock = asyncio.Lock()
        self._version: int | None = None
        """The session's version as last seen here; None until the session is opened."""
        self._known: Counter[bytes] = Counter()
        """Fingerprints of the SDK items the service holds, as read or written here."""
        self._ahead: Counter[bytes] = Counter()
        """Items the input filter stored before the SDK's own add_items of them (which skips them)."""
        self._read = False
        """Whether `_known` has the history (read here, or a session created empty here)."""
        self._unanswered: tuple[str, str] | None = None
        """(what, key) of an append that failed without an answer: the same items again reuse
        its key, so if it was committed after all, they are not written twice."""

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items in the Responses format, oldest first; the last `limit` of them
        (or of ``session_settings.limit``) when given.

        This is the history as contextd keeps it (RenderView ``as_stored``), not a view within
        the budget (that is what `call_model_input_filter` sends): every item the SDK added,
        whole, less the ones popped. The read decides and records nothing (no certificates, no
        model call counted). One stored assistant turn is as many items as the SDK added for it.
        """
        async with self._lock:
            await self._open()
            items = [item for _, shown in await self._shown() for item in shown]
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit >= 0:  # a negative limit is none, as in the SDK's sessions
            items = items[max(len(items) - limit, 0) :] if limit else []
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` to the session, once: the idempotency key is derived from the session's
        version and the items, so a retry after a lost answer writes nothing new; items the
        input filter already stored for this model call are not appended again. Raises
        ValueError for an item the Responses converter refuses (built-in tool calls)."""
        if not items:
            return
        async with self._lock:
            await self._open()
            fresh = []
            for item in items:
                mark = _fingerprint(item)
                if mark is not None and self._ahead[mark] > 0:
                    self._ahead[mark] -= 1
                    continue
                fresh.append(item)
            await self._append(fresh)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item and return it as `get_items` showed it; None when there is none.

        contextd's history is append-only: the stored item holding it is retracted (no later
        view shows it; it gets a certificate, and Retrieve still returns it), and when that
        item was an assistant turn of several SDK items, the rest of the turn is appended
        again, as it was stored. A popped tool output leaves its call answered, in views, by a
        marker without a handle (the API needs every call answered); pop the call too to
        remove both.
        """
        async with self._lock:
            await self._open()
            token = uuid.uuid4().hex
            while True:
                shown = await self._shown()
                if not shown:
                    return None
                seq, items = shown[-1]
                popped = items[-1]
                rest = await self._rest_of_turn(seq, popped) if _assistant_side(popped) else None
                done = await self.client.retract(self.session_id, [seq], reason=f"{POPPED} ({token})")
                if done.seqs or await self._retracted_by(seq, token):  # else another process popped it
                    break
            if rest is not None:
                result = await self.client.append_items(
                    self.session_id, [rest], idempotency_key=f"openai-agents:pop:{seq}", author=self._author
                )
                self._version = result.version
            mark = _fingerprint(popped)
            if mark is not None and self._known[mark] > 0:
                self._known[mark] -= 1
            return cast(TResponseInputItem, popped)

    async def clear_session(self) -> None:
        """Delete the contextd session and create it again, empty, with the same policy and
        metadata. Its history, certificates, pins and stashed originals go with it (to keep
        the record instead, retract the items: ``client.retract``). Another process using the
        session meanwhile may find it missing."""
        async with self._lock:
            try:
                current = await self.client.get_session(self.session_id)
                self._policy, self._metadata = current.policy, current.metadata
                await self.client.delete_session(self.session_id)
            except NotFound:
                pass
            self._version, self._unanswered, self.last_view = None, None, None
            self._known.clear()
            self._ahead.clear()
            await self._open()

    async def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """For ``RunConfig(call_model_input_filter=...)``: the model is sent contextd's view of
        the session within `budget_tokens` in place of the SDK's input, with the SDK's
        instructions unchanged.

        The SDK adds each turn's items to the session before the next model call, but a
        streamed run adds its new input only after the first call is prepared: input items at
        the end of what the SDK is about to send that the session does not hold yet are
        appended first (and `add_items` skips them later), so the view holds them. The view
        replaces the input whatever a handoff's input filter did to it.
        """
        async with self._lock:
            await self._open()
            if not self._read:  # used without the session (no get_items): what is held already
                await self._shown()
            unseen = self._unseen_tail(data.model_data.input)
            await self._append(unseen)
            self._ahead.update(mark for mark in map(_fingerprint, unseen) if mark is not None)
            view = await self.client.render_view(
                self.session_id, ViewFormat.OPENAI_RESPONSES, budget_tokens=self.budget_tokens
            )
            self._version = view.version
        self.last_view = view
        return ModelInputData(
            input=cast(list[TResponseInputItem], view.messages), instructions=data.model_data.instructions
        )

    async def agent_tools(self) -> list[FunctionTool]:
        """contextd's tools for the model (``contextd_retrieve``, ``contextd_search``,
        ``contextd_pin``, ``contextd_unpin``, ``contextd_propose_prune``, ``contextd_status``)
        as SDK function tools on this session: add them to the agent's ``tools``. A failed call
        is a result the model reads (`AsyncAgentTools`), never an exception in the run."""
        async with self._lock:
            await self._open()
        tools = AsyncAgentTools(self.client, self.session_id, ViewFormat.OPENAI_RESPONSES)
        return [_function_tool(tools, definition) for definition in await tools.definitions()]

    # ------------------------------------------------------------------ internals (under the lock)

    async def _open(self) -> None:
        if self._version is not None:
            return
        try:
            session = await self.client.create_session(self.session_id, metadata=self._metadata, policy=self._policy)
            self._read = True  # empty
        except AlreadyExists:
            session = await self.client.get_session(self.session_id)
        self._version = session.version

    async def _append(self, items: Sequence[TResponseInputItem]) -> None:
        stored = items_from_responses(items)
        if not stored:
            return
        what = hashlib.sha256(b"".join(item.SerializeToString(deterministic=True) for item in stored)).hexdigest()
        if self._unanswered is not None and self._unanswered[0] == what:
            key = self._unanswered[1]
        else:
            at = hashlib.sha256(f"{self.session_id}\0{self._version}\0{what}".encode()).hexdigest()
            key = f"openai-agents:{at[:40]}"
        try:
            result = await self.client.append_items(self.session_id, stored, idempotency_key=key, author=self._author)
        except BaseException:  # no answer (or an error): perhaps committed all the same
            self._unanswered = (what, key)
            raise
        self._version, self._unanswered = result.version, None
        self._known.update(mark for mark in map(_fingerprint, items) if mark is not None)

    async def _shown(self) -> list[tuple[int, list[dict[str, Any]]]]:
        """Each stored item as the history holds it, with the input items it shows as, in
        order; popped (retracted) items left out. Remembers the items as known."""
        view, status = await asyncio.gather(
            self.client.render_view(self.session_id, ViewFormat.OPENAI_RESPONSES, as_stored=True),
            self.client.get_status(self.session_id),
        )
        self._version = view.version
        withdrawn = {o.seq for o in status.offloaded if o.reason in _WITHDRAWN}
        starts = sorted((i.message_index, i.seq) for i in view.items if i.message_index >= 0)
        ends = [start for start, _ in starts[1:]] + [len(view.messages)]
        shown = [
            (seq, view.messages[start:end])
            for (start, seq), end in zip(starts, ends, strict=False)  # no items: one end, no start
            if seq not in withdrawn and end > start
        ]
        seen = Counter(mark for _, items in shown for mark in map(_fingerprint, items) if mark is not None)
        self._known |= seen  # the larger count of each: what was read and what was written
        self._read = True
        return shown

    async def _rest_of_turn(self, seq: int, popped: Mapping[str, Any]) -> pb.Item | None:
        """Stored assistant item `seq` as it was, less the blocks `popped` shows; None when none
        is left, or none is its (the view showed a stand-in for the whole item)."""
        stored = pb.Item()
        stored.CopyFrom((await self.client.explain_item(self.session_id, seq)).item)
        rest = [block for block in stored.content if not _shows(popped, block)]
        if not rest or len(rest) == len(stored.content):
            return None
        del stored.content[:]
        stored.content.extend(rest)
        return stored  # its output-only fields (seq, hash, ...) are ignored by an append

    async def _retracted_by(self, seq: int, token: str) -> bool:
        """Whether item `seq` was retracted by this pop (a retry whose first try's answer was lost)."""
        async for certificate in self.client.list_certificates(self.session_id, seq=seq):
            if certificate.rule == "retraction" and token in certificate.rationale:
                return True
        return False

    def _unseen_tail(self, items: Sequence[TResponseInputItem]) -> list[TResponseInputItem]:
        """The items at the end of `items` that the session does not hold: counted back from
        the end, up to the first it holds (an item's k-th occurrence is held when k of it are)."""
        marks = [_fingerprint(item, lenient=True) for item in items]
        later: Counter[bytes] = Counter()
        total = Counter(mark for mark in marks if mark is not None)
        tail: list[TResponseInputItem] = []
        for item, mark in zip(reversed(items), reversed(marks), strict=True):
            if mark is None:  # converts to nothing: nothing to store
                continue
            occurrence = total[mark] - later[mark]
            later[mark] += 1
            if occurrence <= self._known[mark]:
                break
            tail.append(item)
        return tail[::-1]


def _fingerprint(item: Mapping[str, Any], *, lenient: bool = False) -> bytes | None:
    """What tells `item` apart among a session's items, however a view showed it: a call or its
    output by its call id (unique in a session; the output may be shown compressed), anything
    else by what it stores as, without provider ids (the SDK may strip reasoning ids on the way
    back, and a view leaves ids out where their reasoning cannot be sent). None when it stores
    nothing (or, `lenient`, cannot be stored)."""
    kind, call_id = item.get("type"), item.get("call_id")
    if kind in ("function_call", "function_call_output") and isinstance(call_id, str):
        return hashlib.blake2b(f"{kind}\0{call_id}".encode(), digest_size=16).digest()
    try:
        stored = items_from_responses([item])
    except ValueError:
        if lenient:
            return None
        raise
    if not stored:
        return None
    for block in stored[0].content:
        if block.HasField("text"):
            block.text.item_id = ""
        elif block.HasField("reasoning"):
            block.reasoning.item_id = ""
    return hashlib.blake2b(stored[0].SerializeToString(deterministic=True), digest_size=16).digest()


def _assistant_side(item: Mapping[str, Any]) -> bool:
    return item.get("type") in ("reasoning", "function_call") or item.get("role") == "assistant"


def _shows(popped: Mapping[str, Any], block: pb.ContentBlock) -> bool:
    """Whether input item `popped` (as a view renders an assistant item) shows `block`."""
    kind = popped.get("type", "message")
    if kind == "function_call":
        return block.HasField("tool_use") and block.tool_use.id == str(popped.get("call_id"))
    if kind == "reasoning":
        return block.HasField("reasoning") and block.reasoning.item_id == str(popped.get("id"))
    if not block.HasField("text"):
        return False
    if popped.get("id"):  # a message with its id: all its text parts
        return block.text.item_id == str(popped["id"])
    return block.text.text == str(popped.get("content"))  # a text sent without its id (a string)


def _function_tool(tools: AsyncAgentTools, definition: Mapping[str, Any]) -> FunctionTool:
    name = str(definition["name"])

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        call = {"type": "function_call", "call_id": context.tool_call_id, "name": name, "arguments": arguments}
        return str((await tools.execute(call))["output"])

    return FunctionTool(
        name=name,
        description=str(definition["description"]),
        params_json_schema=dict(definition["parameters"]),
        on_invoke_tool=invoke,
        strict_json_schema=False,  # optional arguments and patterns, which strict mode refuses
    )
