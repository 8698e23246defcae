"""The application core for views: rendering through the engine under the
session lock, and the controls around it (pins, the agent's prune
proposals, the certificate log, explanations). Nothing here knows gRPC.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from contextd import metrics
from contextd.engine.certificates import Certificate, Decision, Stamp, verify_chain
from contextd.engine.changes import StateChange, change_to_json
from contextd.engine.errors import InvalidArgument, LimitExceeded, Retryable, ViewTooLarge
from contextd.engine.model import Item, Representation, Session
from contextd.engine.pipeline import Carry, Laps, RenderInput, RenderOutput, identity_view, protection_map, render
from contextd.engine.policy import Policy
from contextd.engine.retraction import REDACTED, RETRACTED, certificate_of, retracted, retraction
from contextd.engine.state import AppliedEdit, ViewState, state_to_json
from contextd.engine.timing import call_costs
from contextd.engine.tokens import TokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.types import Remove, Replace, target_of
from contextd.engine.validation import MAX_NAME_LENGTH, load_json
from contextd.engine.view import View, ViewRequest
from contextd.render_workers import RenderWorkers
from contextd.sessions import check_session_id, parse_off_loop
from contextd.telemetry import annotate
from contextd_storage import certificate_log, events, views
from contextd_storage.events import NewEvent
from contextd_storage.history import HistoryStore
from contextd_storage.state_cache import MEMORY_PER_STORED_BYTE, StateCache

log = logging.getLogger("contextd.views")

if TYPE_CHECKING:
    from contextd_storage.kept_carries import KeptCarries

P = ParamSpec("P")
R = TypeVar("R")

MAX_PROPOSAL_REASON = 1000
MAX_SEQS = 1000
MAX_TOOLS = 1000
"""Tools in a RenderView's `tools_json`: far past what a provider takes in one call (OpenAI's
chat API takes 128), so a longer array is refused before the render reads it (200,000 empty
objects took 1.2-2.3 s of a render thread, docs/fuzz.md)."""


@dataclass(frozen=True, slots=True)
class RenderResult:
    view: View
    certificates: list[Certificate]
    """The decisions of this render, numbered and chained (a dry run numbers none: 0)."""


@dataclass(slots=True)
class _Progress:
    """Where a render is, for its caller to decide what its cancellation does (`ViewService.render`)."""

    engine_started: bool = False
    stored: bool = False
    """Its transaction committed (a render refused as too large to send is stored, then raises)."""
    gave_up: bool = False
    """The caller was cancelled: before the engine started, the render ends there; after, it is
    stored, as no model call unless its call was recorded already."""


@dataclass(frozen=True, slots=True)
class ProposalOutcome:
    seq: int
    accepted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Explanation:
    item: Item
    representation: Representation
    pinned: bool
    protection: str
    certificates: list[certificate_log.StoredCertificate]


class ViewService:
    def __init__(
        self,
        store: HistoryStore,
        counter: TokenCounter,
        registry: TransformRegistry,
        clock: Callable[[], float] = time.time,
        on_pruned: Callable[[str, int, list[Item]], Awaitable[None]] | None = None,
        on_redacted: Callable[[str, int, list[Item]], Awaitable[None]] | None = None,
        workers: RenderWorkers | None = None,
        states: StateCache | None = None,
        carries: KeptCarries | None = None,
    ) -> None:
        self.store = store
        self.counter = counter
        self.registry = registry
        self.clock = clock
        self.on_pruned = on_pruned
        """Told, after a render commits, the items it took out of the view (the stash keeps them)."""
        self.on_redacted = on_redacted
        """Told, after a redaction commits, the items it withheld (the stash forgets them)."""
        self.workers = workers
        """Where the engine runs (None: on the caller's thread, as the operator commands do)."""
        self._policies: dict[str, Policy] = {}
        self._states = states if states is not None else StateCache()
        """The states this process's renders saved (shared with the recovery service)."""
        self.carries = carries
        """Where the renders' carries are kept for other replicas and restarts (None: nowhere)."""
        self._warming: dict[tuple[str, str], asyncio.Event] = {}
        """Sessions (tenant, id) whose kept carries `warm` is reading: a render of one waits for it."""
        self._renders: set[asyncio.Task[RenderResult]] = set()
        """The renders under way (a render runs as a task of its own: `render`)."""
        self._rendering: Counter[tuple[str, str]] = Counter()
        """Sessions (tenant, id) with renders under way: `warm` leaves them to their renders."""
        self._copying: dict[int, asyncio.Task[None]] = {}
        """Full copies of view states being made after their renders, by session key (`_copy_later`)."""

    async def policy_of(self, session: Session) -> Policy:
        """The session's parsed policy, parsed once per version (a large document off the loop)."""
        policy = self._policies.get(session.policy_version)
        if policy is None:
            policy = await parse_off_loop(session.policy, self.registry)
            if len(self._policies) > 256:
                self._policies.clear()
            self._policies[session.policy_version] = policy
        return policy

    async def render(
        self,
        tenant: str,
        session_id: str,
        request: ViewRequest,
        *,
        tools_json: str = "",
        force: bool = False,
        dry_run: bool = False,
        check: Callable[[RenderResult], None] | None = None,
    ) -> RenderResult:
        """Render a view; the decisions and the new view state are stored unless `dry_run`.

        The engine's work runs on a render thread (render_workers.py) when the
        service has them, so the event loop goes on serving other calls.
        `check` sees the result before it is stored, on that thread too; if it
        raises ViewTooLarge (the response would be too large to send), the render is stored
        all the same, as no model call, and then that error is raised: the
        carry the engine resumed in place is kept, so the session's next render
        (with a budget, or refused again) costs what changed, not the whole
        session again. A caller cancelled (its deadline passed) once the engine
        has started ends at once, and the render is stored all the same, as no
        model call and without `check`.
        """
        check_session_id(session_id)
        tools = _tools(tools_json)
        progress = _Progress()
        work = asyncio.create_task(self._render(tenant, session_id, request, tools, force, dry_run, check, progress))
        self._renders.add(work)
        self._rendering[tenant, session_id] += 1
        work.add_done_callback(functools.partial(self._ended, (tenant, session_id), progress))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            progress.gave_up = True
            if not progress.engine_started or self.workers is None:
                # Nothing of the session taken yet (or no render thread: the engine runs on the
                # loop, with nothing done that is not undone): the render ends at its next wait.
                work.cancel()
                raise
        # The caller gave up (its deadline passed) while a render thread worked, which nothing can
        # stop. The render goes on to store what it worked out, as any render's: its carry, taken
        # by the engine and resumed in place, spares the session's next render deriving it again.
        # It sends no model anything; a server stopping waits for it (`wait_for_renders`).
        annotate(session_id=session_id, abandoned=True)  # (the call's span ends now)
        raise asyncio.CancelledError

    def _ended(self, named: tuple[str, str], progress: _Progress, work: asyncio.Task[RenderResult]) -> None:
        self._renders.discard(work)
        self._rendering[named] -= 1
        if not self._rendering[named]:
            del self._rendering[named]
        # What went wrong in a render whose caller gave up has no one else to tell (a caller
        # still waiting hears of its render's errors through the shield).
        # (One stored and then refused as too large to send has no one to refuse.)
        failed = work.exception() if progress.gave_up and not work.cancelled() else None
        if failed is not None and not isinstance(failed, ViewTooLarge):
            what = "failed after it was stored" if progress.stored else "was not stored"
            log.warning("a render whose caller gave up %s", what, exc_info=failed)

    async def wait_for_renders(self, seconds: float) -> None:
        """Wait up to `seconds` for the renders under way to end (a server stopping: those its
        callers gave up on store what they worked out before it closes what they store with),
        and the full copies made after renders, then cancel those still at work (one on its
        render thread ends with it, which the process's exit does not wait for; a copy not
        stored is made after the session's next render)."""
        await asyncio.sleep(0)  # (calls the stop cancelled: their renders are told so first)
        deadline = time.monotonic() + max(seconds, 0.0)
        # (Again while there are any: a render that ends during the wait may start a copy.)
        while at_work := {*self._renders, *self._copying.values()}:
            _, late = await asyncio.wait(at_work, timeout=max(deadline - time.monotonic(), 0.0))
            if late:
                for task in late:
                    task.cancel()
                for task in {*self._renders, *self._copying.values()} - at_work:
                    task.cancel()
                return

    def _copy_later(self, tenant: str, session_id: str, key: int, state: ViewState, after: int) -> None:
        """Make the full copy of `state` due after the render that stored it as a change, in a
        transaction of its own: the change made the render durable, the copy only spares later
        reads the changes. Renders that come while it is made store their changes, which catch
        it up (`views.save_copy`); `after`: the copy the render's state followed, which another
        copy stored meanwhile (another replica's) leaves this one unstored. One a session at a
        time in a process."""
        if key in self._copying:
            return
        task = asyncio.get_running_loop().create_task(self._copy(tenant, session_id, key, state, after))
        self._copying[key] = task
        task.add_done_callback(lambda _: self._copying.pop(key, None))

    async def _copy(self, tenant: str, session_id: str, key: int, state: ViewState, after: int) -> None:
        try:
            async with self._slot(tenant):  # (a render thread, taken as the tenant's renders take one)
                copy = await self._run(state_to_json, state)  # (before the session's lock: the state is its own)
            async with self.store.db.write(tenant, session_id) as conn:
                await views.save_copy(conn, key, copy, state.view_version, after)
        except asyncio.CancelledError:
            raise
        except Retryable as error:  # (the database unavailable or busy: said where the calls fail)
            log.info("a view state's full copy was not stored after its render (the next makes it): %s", error)
        except Exception:  # (the session's next render makes it)
            log.warning("a view state's full copy was not stored after its render", exc_info=True)

    async def _render(
        self,
        tenant: str,
        session_id: str,
        request: ViewRequest,
        tools: tuple[dict[str, Any], ...],
        force: bool,
        dry_run: bool,
        check: Callable[[RenderResult], None] | None,
        progress: _Progress,
    ) -> RenderResult:
        if (warming := self._warming.get((tenant, session_id))) is not None:
            await warming.wait()  # its kept carry is being read as the process starts (before its lock)
        async with self._slot(tenant), self.store.db.write(tenant, session_id) as conn:
            read = Laps()  # (what it read, as metrics.record_reads says)
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            read("history")
            key = row["key"]
            held = self._states.holds_carry(key)
            if self.carries is not None:
                await self.carries.settled(key)  # (a carry of it being written is taken over after)
            if self.carries is not None and not held:
                asked = self.carries.answering  # (else nothing is read: Redis rests after a failure)
                read.restart()
                await self._resume_kept(key, items)
                if asked:
                    read("carry")
            policy = await self.policy_of(session)
            read.restart()
            reads = await views.render_reads(conn, key, self._states)
            read("state")
            metrics.record_reads(read.stages)
            stored = reads.stored
            state = stored.state
            render_input = RenderInput(
                session=session,
                items=items,
                policy=policy,
                request=request,
                counter=self.counter,
                registry=self.registry,
                state=state,
                now=self.clock(),
                pins=reads.pins,
                agent_proposals=reads.proposals,
                force=force,
                tools=tools,
                durable=reads.durable,
                carry=self._states.carry(key, state),
            )
            # Another replica rendered since this one's last render: its carry, caught up.
            earlier = self._states.carry(key, stored.since) if stored.since is not None else None
            started = time.perf_counter()
            if progress.gave_up:  # (a wait that took a slot as it was cancelled may not say so)
                raise asyncio.CancelledError
            progress.engine_started = True
            out, change_json, carry_bytes, resumed = await self._run(_render, render_input, earlier, stored.changes)
            if self.carries is not None:
                self.carries.rendered(key, resumed)
            spent = time.perf_counter() - started
            model_call = not (dry_run or force)  # an operator's render and a dry run send no model anything
            stamp = Stamp(out.state.view_version, request.format.value, policy.version)
            stored_bytes, copy_due, copy = 0, False, None
            if dry_run:
                certificates = [Certificate(0, body, stamp, "", "") for body in out.certificates]
            else:
                certificates = await certificate_log.append_certificates(conn, key, out.certificates, stamp)
            shown = replace(out.view, retracted_items=len(retracted(render_input.durable)))
            result = RenderResult(shown, certificates)
            refused = await self._refusal(check, result) if check is not None and not progress.gave_up else None
            if dry_run and refused is not None:
                raise refused
            if not dry_run:
                await views.forget_proposals(conn, out.decided_proposals)
                await views.append_mutations(conn, key, out.durable)
                # A full copy of the state, when one is due, is made after the render (`_copy_later`):
                # 5.4 MB at 10,000 items, which made one render in 256 about 0.2 s. The first render
                # of a session, which has none, makes its own, as do an operator's commands (a
                # process of their own, which ends after them).
                copy_due = stored.copy_due(len(change_json))
                now = copy_due and (not stored.snapshot_version or self.workers is None)  # (an operator's command)
                copy = await self._run(state_to_json, out.state) if now else None
                # Nor one whose caller has given up, nor one refused: no model is sent either.
                model_call = model_call and not progress.gave_up and refused is None
                call = (
                    views.CallRecord(out.state.view_version, request.format.value, out.view.total_tokens, out.predicted)
                    if model_call
                    else None
                )
                told = _render_events(tenant, session, request, out, certificates, state, model_call)
                await views.save_render(conn, key, stored, change_json, copy, call, told)
                stored_bytes = stored.bytes_after(change_json, copy)
        progress.stored = not dry_run
        if not dry_run:
            if copy_due and copy is None:
                self._copy_later(tenant, session_id, key, out.state, stored.snapshot_version)
            in_memory = int(MEMORY_PER_STORED_BYTE * stored_bytes)
            self._states.put(key, out.state, out.carry, in_memory, carry_bytes)  # committed now
            derived = not held and not resumed
            if self.carries and out.carry is not None and self.carries.worth_keeping(key, len(items), derived):
                # What this render worked out is kept for any replica that renders the session
                # without it (restarted, new, or one that never did): at once when this replica
                # derived the session whole, holding nothing of it, and again from time to time
                # while the session goes on. (A session whose renders each derive it, its durable
                # edits changing, is kept on the clock only.)
                self.carries.keep_held(key, out.carry)
            pruned = [items[c.seq - 1] for c in out.certificates if c.decision is Decision.PRUNE and c.seq > 0]
            if pruned and self.on_pruned is not None:
                await self.on_pruned(tenant, key, pruned)
        view = out.view
        fmt = request.format.value
        costs = (
            call_costs(state.renders.get(fmt), out.state.renders[fmt], out.predicted, policy.cache)
            if model_call
            else None
        )
        metrics.record_render(
            tenant,
            spent,
            out.stages,
            view.total_tokens if model_call else 0,
            () if dry_run else out.certificates,
            len(out.state.pending),
            out.predicted if model_call else None,
            costs,
        )
        annotate(
            session_id=session_id,
            items=len(items),
            tokens=view.total_tokens,
            budget_tokens=request.budget_tokens,
            over_budget=view.over_budget,
            decisions=len(certificates),
            view_version=view.view_version,
            stable_prefix_tokens=view.stable_prefix_tokens,
            cache_breakpoint_seq=view.cache_breakpoint_seq,
            warnings=",".join(sorted({w.code for w in view.warnings})),
            volatile_content=sum(w.code == "VOLATILE_CONTENT" for w in view.warnings),
            abandoned=progress.gave_up,
            refused=refused is not None,
        )
        if refused is not None:
            raise refused
        return result

    async def _refusal(self, check: Callable[[RenderResult], None], result: RenderResult) -> ViewTooLarge | None:
        """What `check` refused `result` with (the response too large to send), or None. (Any
        other error of it fails the render: nothing is stored.)"""
        try:
            await self._run(check, result)
        except ViewTooLarge as refusal:
            return refusal
        return None

    async def _resume_kept(self, key: int, items: Sequence[Item]) -> Carry | None:
        """Hold the session's kept carry as if this process had made its render, unless this
        process holds a later state of the session: the render resumes from it, or catches
        it up by the changes stored since, as it would its own (views.render_reads)."""
        assert self.carries is not None
        carry = await self.carries.load(key, items, self._run)
        if carry is None:
            return None
        held = self._states.latest(key)
        if held is not None and held.view_version > carry.state.view_version:
            return None
        self._states.put(key, carry.state, carry)
        return carry

    async def warm(
        self, key: int, tenant: str, session_id: str, prepare: Callable[[Carry], None] | None = None
    ) -> bool:
        """Hold the history and kept carry of session `key`, as its first render on this process
        would read them (as the process starts, or as another replica keeps them: warm_start.py),
        and call `prepare` with the carry off the event loop; False when there is no carry to
        use, or the process holds one of the session already that a render made or used (one
        read back and not used since is read again: another replica may have kept a later one).
        A render of the session that comes meanwhile waits for it; one under way reads what it
        needs itself."""
        assert self.carries is not None
        named = (tenant, session_id)
        if self._worked_on(key) or named in self._warming or named in self._rendering:
            return False
        self._warming[named] = done = asyncio.Event()
        try:
            async with self._slot(tenant):  # (a render's slot: the reading runs where renders run)
                async with self.store.db.read() as conn:
                    row, _, items = await self.store.history_in(conn, tenant, session_id)
                if row["key"] != key or self._worked_on(key):  # deleted and made again; rendered
                    return False
                carry = await self._resume_kept(key, items)
                if carry is None:
                    return False
                if prepare is not None:
                    await self._run(prepare, carry)
            return True
        finally:
            del self._warming[named]
            done.set()

    def holds_carry(self, key: int) -> bool:
        """Whether this process holds the engine's work on session `key` (its carry)."""
        return self._states.holds_carry(key)

    def _worked_on(self, key: int) -> bool:
        """Whether this process holds a carry of session `key` that a render of its own made or used."""
        return self.holds_carry(key) and not (self.carries is not None and self.carries.unused(key))

    def hold_recent(self, keys: Sequence[int]) -> None:
        """Make the sessions `keys`, the most recent first, the most recently used of this
        process's caches in that order (the first of them the last to be let go of)."""
        for key in reversed(keys):
            self.store.cache.get(key, [])
            self._states.latest(key)

    def room_to_follow(self, tenant: str) -> bool:
        """`room_to_warm`, and a render slot to spare for a read of `tenant`'s (warm_start.follow
        reads between renders, never before one: renders of any tenant, this one's too, find a
        slot free as they would without it)."""
        return self.room_to_warm() and (self.workers is None or self.workers.slots.spare(tenant))

    def room_to_warm(self) -> bool:
        """Whether the process's memory for sessions is less than half taken: warming past it would
        soon let go of what was warmed (each carry let go of written back to Redis)."""
        items, states = self.store.cache, self._states
        return items.held_bytes < items.max_bytes // 2 and states.held_bytes < states.max_bytes // 2

    async def render_as_stored(self, tenant: str, session_id: str, request: ViewRequest) -> RenderResult:
        """The history as stored, in `request`'s format: every item in full but the durable edits
        (retractions, history mode's); no rule runs, nothing is stored (RenderViewRequest.as_stored)."""
        check_session_id(session_id)
        async with self._slot(tenant), self.store.db.read() as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            durable = await views.load_mutations(conn, row["key"])
        view = await self._run(identity_view, session, items, request, self.counter, durable)
        view = replace(view, retracted_items=len(retracted(durable)))
        view = replace(view, view_version=0)  # no view of the session's: nothing was recorded
        annotate(session_id=session_id, items=len(items), tokens=view.total_tokens, as_stored=True)
        return RenderResult(view, [])

    def _slot(self, tenant: str) -> AbstractAsyncContextManager[None]:
        return self.workers.slot(tenant) if self.workers is not None else nullcontext()

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self.workers is None:
            return fn(*args, **kwargs)
        return await self.workers.run(fn, *args, **kwargs)

    async def report_usage(self, tenant: str, session_id: str, view_version: int, usage: views.ReportedUsage) -> bool:
        """Record what the provider billed for the call made with render `view_version`, beside
        what the engine predicted for it; False when the same was recorded before (a retry)."""
        check_session_id(session_id)
        _check_usage(view_version, usage)
        async with self.store.db.write(tenant, session_id) as conn:
            key = (await self.store.session_row(conn, tenant, session_id))["key"]
            stored = await views.report_usage(conn, key, session_id, view_version, usage)
            if stored:
                reported = {"view_version": view_version, **asdict(usage)}
                await events.record(conn, NewEvent(tenant, session_id, "usage_reported", reported))
        if stored:
            metrics.record_cache(
                tenant, "reported", usage.cache_read_tokens, usage.cache_write_tokens, usage.input_tokens
            )
        annotate(
            session_id=session_id,
            view_version=view_version,
            provider=usage.provider,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            replayed=not stored,
        )
        return stored

    async def pin(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Pin items: never pruned, and shown in full again from the next render. Returns the seqs."""
        return await self._pins(tenant, session_id, seqs, views.pin, "items_pinned")

    async def unpin(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Unpin items: eligible again for the session's rules. Returns the seqs."""
        return await self._pins(tenant, session_id, seqs, views.unpin, "items_unpinned")

    async def _pins(
        self,
        tenant: str,
        session_id: str,
        seqs: Sequence[int],
        change: Callable[[AsyncConnection, int, Sequence[int]], Awaitable[None]],
        kind: str,
    ) -> list[int]:
        check_session_id(session_id)
        changed = sorted(set(seqs))
        async with self.store.db.write(tenant, session_id) as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            _check_seqs(seqs, row["version"])
            await change(conn, row["key"], seqs)
            await events.record(conn, NewEvent(tenant, session_id, kind, {"seqs": changed}))
        annotate(session_id=session_id, items=len(seqs))
        return changed

    async def propose_prune(
        self, tenant: str, session_id: str, seqs: Sequence[int], reason: str
    ) -> list[ProposalOutcome]:
        """Queue the agent's prunes for the next render. Refused now: protected items, items
        already pruned and items already queued."""
        check_session_id(session_id)
        _check_reason(reason)
        async with self.store.db.write(tenant, session_id) as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            _check_seqs(seqs, row["version"])
            key = row["key"]
            protected = protection_map(items, await self.policy_of(session), await views.pinned(conn, key))
            state = await views.load_state(conn, key, self._states)
            in_force = (*await views.load_mutations(conn, key), *state.applied)
            pruned = {target_of(a.edit) for a in in_force}
            evidence = {s: target_of(a.edit) for a in in_force for s in a.evidence_seqs}
            queued = {p.seq for p in await views.proposals(conn, key)} | {
                target_of(p.proposal.edit) for p in state.pending
            }
            outcomes = [_outcome(s, protected, pruned, queued, evidence) for s in dict.fromkeys(seqs)]
            queued_now = [o.seq for o in outcomes if o.accepted]
            await views.propose(conn, key, queued_now, reason)
            if queued_now:
                proposed = {"seqs": queued_now, "reason": reason}
                await events.record(conn, NewEvent(tenant, session_id, "prune_proposed", proposed))
        annotate(session_id=session_id, items=len(outcomes))
        return outcomes

    async def retract(
        self, tenant: str, session_id: str, seqs: Sequence[int], reason: str, redact: bool
    ) -> tuple[list[int], list[Certificate]]:
        """Withdraw items from every later view (engine/retraction.py), each with its certificate;
        with `redact`, their content is withheld from every read too. Returns the seqs this call
        retracted (items already retracted as asked are left as they are) and their certificates."""
        check_session_id(session_id)
        _check_reason(reason)
        async with self.store.db.write(tenant, session_id) as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            _check_seqs(seqs, row["version"])
            key = row["key"]
            before = await views.retractions(conn, key, seqs)
            wanted = REDACTED if redact else RETRACTED
            todo = [s for s in sorted(set(seqs)) if before.get(s) not in (wanted, REDACTED)]
            if not todo:
                return [], []
            edits = [retraction(items[s - 1], redact, self.counter) for s in todo]
            durable = await views.append_mutations(conn, key, edits)
            stamp = Stamp(await views.state_version(conn, key), "", session.policy_version)
            bodies = [certificate_of(items[s - 1], e, reason) for s, e in zip(todo, edits, strict=True)]
            certificates = await certificate_log.append_certificates(conn, key, bodies, stamp)
            retracted = {"seqs": todo, "reason": reason, "redacted": redact}
            await events.record(conn, NewEvent(tenant, session_id, "items_retracted", retracted))
        if redact and self.carries is not None:  # what renders worked out before shows the items
            await self.carries.drop(key, durable)
        if redact and self.on_redacted is not None:
            await self.on_redacted(tenant, key, [items[s - 1] for s in todo])
        annotate(session_id=session_id, items=len(todo))
        return todo, certificates

    async def list_certificates(
        self, tenant: str, session_id: str, where: certificate_log.CertificateFilter, page_size: int, page_token: str
    ) -> tuple[list[certificate_log.StoredCertificate], str]:
        check_session_id(session_id)
        if page_size > 1000:
            raise LimitExceeded.at("page_size", f"{page_size} is over the maximum of 1000")
        if page_size < 0:
            raise InvalidArgument.at("page_size", f"{page_size} is negative")
        for name, value in (("seq", where.seq), ("view_version", where.view_version)):
            if value is not None and value < 1:
                raise InvalidArgument.at(name, f"{value} is not a {name.replace('_', ' ')} (they start at 1)")
        if where.level is not None and not 0 <= where.level <= 4:
            raise InvalidArgument.at("level", f"{where.level} is not on the evidence ladder (0-4)")
        async with self.store.db.read() as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            return await certificate_log.list_certificates(conn, row["key"], where, page_size or 100, page_token)

    async def explain(self, tenant: str, session_id: str, seq: int) -> Explanation:
        """Why item `seq` is shown the way it is now, with its certificate history."""
        check_session_id(session_id)
        async with self.store.db.read() as conn:
            row, session, items = await self.store.history_in(conn, tenant, session_id)
            _check_seqs([seq], row["version"], field="seq")
            key = row["key"]
            pins = await views.pinned(conn, key)
            state = await views.load_state(conn, key, self._states)
            durable = await views.load_mutations(conn, key)
            history, _ = await certificate_log.list_certificates(
                conn, key, certificate_log.CertificateFilter(seq=seq), 1000, ""
            )
            redacted = (await views.retractions(conn, key, [seq])).get(seq) == REDACTED
        item = items[seq - 1]
        return Explanation(
            item=replace(item, content=(), metadata={}) if redacted else item,  # its identity, never its content
            representation=_representation(seq, durable, state.applied, pins),
            pinned=seq in pins,
            protection=protection_map(items, await self.policy_of(session), pins).get(seq, ""),
            certificates=history,
        )

    async def verify(self, tenant: str, session_id: str) -> tuple[int, int | None]:
        """(certificates checked, the number of the first broken one or None)."""
        check_session_id(session_id)
        async with self.store.db.read() as conn:
            row, _, _ = await self.store.history_in(conn, tenant, session_id)
            chain = await certificate_log.all_certificates(conn, row["key"])
        return len(chain), verify_chain(chain)


def _render(
    render_input: RenderInput, earlier: Carry | None = None, changes: Sequence[StateChange] = ()
) -> tuple[RenderOutput, str, int, bool]:
    """The engine's render, its change to the view state as stored, its carry's weight (bytes
    held), and whether it resumed from a carry (else it derived the session whole): the CPU
    work of a render, for a thread (`earlier`: this process's carry of the state `changes`,
    other replicas' renders, were made from)."""
    if earlier is not None and render_input.carry is None:
        render_input = replace(render_input, carry=earlier.advanced(changes, render_input.state, render_input.items))
    given = render_input.carry
    claimed = given is not None and given.finished.claim.taken
    out = render(render_input)
    assert out.change is not None
    resumed = given is not None and not claimed and given.finished.claim.taken
    return out, change_to_json(out.change), out.carry.footprint() if out.carry is not None else 0, resumed


MAX_LISTED_DECISIONS = 100


def _render_events(
    tenant: str,
    session: Session,
    request: ViewRequest,
    out: RenderOutput,
    certificates: Sequence[Certificate],
    before: ViewState,
    model_call: bool,
) -> list[NewEvent]:
    """What a committed render tells watchers: the view it made, its decisions, and the
    deferred edits it applied (edits that were waiting before it and are in force after)."""
    version, view = out.state.view_version, out.view
    rendered = {
        "view_version": version,
        "format": request.format.value,
        "tokens_sent": view.total_tokens,
        "history_tokens": session.token_count,
        "tokens_removed": sum(c.body.net_tokens_removed for c in certificates),
        "budget_tokens": request.budget_tokens,
        "over_budget": view.over_budget,
        "model_call": model_call,
    }
    found = [NewEvent(tenant, session.id, "view_rendered", rendered)]
    if certificates:
        listed = [
            {
                "certificate": c.number,
                "seq": c.body.seq,
                "outcome": c.body.decision.value,
                "reason": c.body.reason,
                "level": c.body.level,
                "rule": c.body.rule,
            }
            for c in certificates[:MAX_LISTED_DECISIONS]
        ]
        decided = {"view_version": version, "decisions": listed, "total": len(certificates)}
        found.append(NewEvent(tenant, session.id, "decisions_made", decided))
    # What this render added to the edits in force (its change's), not all of them: a long
    # session holds thousands, and this runs on the event loop.
    waiting = {target_of(p.proposal.edit) for p in before.pending}
    added = out.change.added if out.change is not None else out.state.applied
    candidates = [seq for a in added if (seq := target_of(a.edit)) in waiting and seq] if waiting else []
    applied = []
    if candidates:
        in_force = {target_of(a.edit) for a in before.applied}
        applied = sorted(seq for seq in candidates if seq not in in_force)
    if applied:
        found.append(NewEvent(tenant, session.id, "deferred_applied", {"view_version": version, "seqs": applied}))
    return found


def _outcome(
    seq: int,
    protected: Mapping[int, str],
    pruned: set[int | None],
    queued: set[int | None],
    evidence: Mapping[int, int | None],
) -> ProposalOutcome:
    if seq in protected:
        return ProposalOutcome(seq, False, f"protected: {protected[seq]}")
    if seq in pruned:
        return ProposalOutcome(seq, False, "already pruned")
    if seq in evidence:
        return ProposalOutcome(seq, False, f"item {seq} is the evidence for the reduction of item {evidence[seq]}")
    if seq in queued:
        return ProposalOutcome(seq, False, "already queued")
    return ProposalOutcome(seq, True, "queued: decided at the next render, applied at a cache-safe point")


def _representation(
    seq: int, durable: Sequence[AppliedEdit], applied: Sequence[AppliedEdit], pins: frozenset[int]
) -> Representation:
    """How the next render shows item `seq`: durable edits are history, whatever the pins;
    the other edits in force give way to a pin."""
    for edit in (*durable, *(() if seq in pins else applied)):
        if target_of(edit.edit) != seq:
            continue
        if isinstance(edit.edit, Replace):
            return Representation.REDUCED
        if isinstance(edit.edit, Remove):
            return Representation.PLACEHOLDER if edit.edit.placeholder else Representation.OMITTED
    return Representation.FULL


def _check_seqs(seqs: Sequence[int], version: int, field: str = "seqs") -> None:
    if not seqs:
        raise InvalidArgument.at(field, "name at least one item")
    if len(seqs) > MAX_SEQS:
        raise LimitExceeded.at(field, f"{len(seqs)} items, over the maximum of {MAX_SEQS}")
    for i, seq in enumerate(seqs):
        if not 1 <= seq <= version:
            where = field if field == "seq" else f"{field}[{i}]"
            raise InvalidArgument.at(where, f"no item {seq} in this session (its items are 1-{version})")


def _tools(tools_json: str) -> tuple[dict[str, Any], ...]:
    if not tools_json:
        return ()
    try:
        tools = load_json(tools_json)
    except ValueError as exc:
        raise InvalidArgument.at("tools_json", f"not valid JSON: {exc}") from None
    if not isinstance(tools, list):
        raise InvalidArgument.at("tools_json", "must be a JSON array of tool objects")
    if len(tools) > MAX_TOOLS:
        raise LimitExceeded.at("tools_json", f"{len(tools):,} tools, over the maximum of {MAX_TOOLS:,}")
    if not all(isinstance(t, dict) for t in tools):
        raise InvalidArgument.at("tools_json", "must be a JSON array of tool objects")
    return tuple(tools)


def _check_reason(reason: str) -> None:
    """A reason is stored with what it explains (a queued proposal, a certificate): bounded, and
    free of NUL, which no Postgres text holds (that answered INTERNAL, found by scripts/fuzz.py)."""
    if len(reason) > MAX_PROPOSAL_REASON:
        raise LimitExceeded.at("reason", f"{len(reason):,} characters, over the maximum of {MAX_PROPOSAL_REASON}")
    if "\x00" in reason:
        raise InvalidArgument.at("reason", "contains a NUL character")


MAX_TOKENS_REPORTED = 10**9
"""Per figure of one call: past any model's window (and the sums over a session stay in range)."""


def _check_usage(view_version: int, usage: views.ReportedUsage) -> None:
    if not 0 < view_version < 2**63:
        raise InvalidArgument.at("view_version", "names no render: view versions start at 1 (View.view_version)")
    for name, text, limit in (("provider", usage.provider, 64), ("model", usage.model, MAX_NAME_LENGTH)):
        if not text and name == "provider":
            raise InvalidArgument.at(name, "required: the provider that billed the call (anthropic, openai, ...)")
        if len(text) > limit or "\x00" in text:
            raise InvalidArgument.at(name, f"at most {limit} characters, without NUL")
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        if getattr(usage, name) > MAX_TOKENS_REPORTED:
            raise InvalidArgument.at(name, f"over {MAX_TOKENS_REPORTED:,} tokens: past any call")
