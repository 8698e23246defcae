"""The proxy's HTTP side: a Starlette app that takes a provider SDK's requests, puts
contextd's view in place of the conversation, forwards them, and relays the answers.

Per conversation request (`dialects.BY_PATH`):
1. the session: the `x-contextd-session` header (created on first use), else a fingerprint of
   the conversation's opening (`ledger.fingerprint`);
2. the session is made to hold the request's conversation (`ledger.sync`);
3. the view is rendered (budget: the `x-contextd-budget` header, else `--budget`, else the
   model's window less the answer's room and the lead) and sent upstream in place of the
   conversation, every other field as the caller sent it;
4. the answer is relayed as it comes (a stream event by event, each event's bytes as the
   upstream sent them); once it is complete, the assistant's turn is appended and the
   provider's usage reported, after the caller has it;
5. whatever fails on contextd's side (down, slow past `--timeout`, a request it cannot read,
   a view the provider refuses with 400) sends the caller's request upstream unchanged, and
   is counted. After contextd was down, the proxy does not ask it again for `--backoff`
   seconds, so an outage costs the agent one timeout, not one per call.

Every other path goes upstream as it came. The provider's key passes through in the caller's
headers (`Authorization`, `x-api-key`); the proxy keeps none. Requests go to the Anthropic
upstream when they are Messages calls or carry `anthropic-version`, else to the OpenAI one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx2
from opentelemetry import metrics
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from contextd.engine.tokens import TiktokenCounter
from contextd.proxy import ANTHROPIC, OPENAI
from contextd.proxy.dialects import BY_PATH, Accumulator, Dialect, Unsupported, window_of
from contextd.proxy.ledger import Known, Ledger, Moving, append, chains, fingerprint, sync
from contextd.proxy.sse import Events
from contextd.remote import Connection
from contextd_client import AsyncClient, ContextdError, DeadlineExceeded, Unavailable, VersionConflict, View

log = logging.getLogger(__name__)

SESSION_HEADER = "x-contextd-session"
"""Names the contextd session of a conversation (a client-chosen id, created on first use)."""
BUDGET_HEADER = "x-contextd-budget"
"""The view's budget in tokens, for this request."""
API_KEY_HEADER = "x-contextd-api-key"
"""contextd's API key for this request (its tenant's sessions), instead of `--api-key-file`."""
VIEW_VERSION_HEADER = "x-contextd-view-version"
"""On an answer made with a view: the view's version (what ExplainItem and Retrieve speak of)."""

# Not forwarded: the connection's own headers (RFC 9110 section 7.6.1), the body's length and
# encoding (the proxy sends its own body; httpx decodes what it receives), and the proxy's.
_HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host")
)
_NOT_FORWARDED = _HOP_BY_HOP | {"content-length", "accept-encoding"}
_NOT_RELAYED = _HOP_BY_HOP | {"content-length", "content-encoding"}
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_CLIENTS = 64
"""contextd clients kept, one per API key a request named."""
_RETIRE_AFTER = 120.0
"""Seconds a client put out of the cache stays open, for the calls under way on it."""
_RESTING = 1024
"""API keys whose requests rest from contextd, at most."""
_COUNTED = 1024
"""Leads and tool lists whose tokens are remembered."""

meter = metrics.get_meter("contextd.proxy")
API = "contextd.proxy.api"
OUTCOME = "contextd.proxy.outcome"
requests_counted = meter.create_counter(
    "contextd.proxy.requests",
    unit="{request}",
    description="Requests the proxy forwarded, by API and outcome: viewed (sent with contextd's view), "
    "passthrough (no conversation to view), unsupported, failed (contextd failed: sent unchanged), "
    "bypassed (contextd failed a moment ago: sent unchanged), view_rejected (the provider refused "
    "the view: sent again unchanged).",
)
items_counted = meter.create_counter(
    "contextd.proxy.items", unit="{item}", description="Items the proxy appended or retracted, by action."
)
added = meter.create_histogram(
    "contextd.proxy.added.duration",
    unit="s",
    description="Time spent on contextd before a request went upstream.",
    explicit_bucket_boundaries_advisory=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
recording_failures = meter.create_counter(
    "contextd.proxy.recording.failures",
    unit="{answer}",
    description="Answers whose turn or usage could not be recorded in contextd.",
)


def _forwarded(header: str) -> bool:
    """Whether a request header goes upstream: not the connection's, not the proxy's own (the
    contextd API key above all: the provider has no business with it)."""
    name = header.lower()
    return name not in _NOT_FORWARDED and not name.startswith("x-contextd-")


def _caller(request: Request) -> str:
    """Who calls the provider, as a digest of their key: conversations of different callers
    that open alike never share a session by fingerprint."""
    credential = request.headers.get("authorization", "") + "\x00" + request.headers.get("x-api-key", "")
    return hashlib.sha256(credential.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Settings:
    """`budget`: the view's budget when the request names none (0: from the model's window);
    `backoff`: seconds contextd is left alone after it failed."""

    connection: Connection
    openai_upstream: str = OPENAI
    anthropic_upstream: str = ANTHROPIC
    budget: int = 0
    backoff: float = 5.0
    upstream_timeout: float = 600.0
    grace: float = 25.0
    """Seconds answers under way (a model's stream can be long) have to finish after SIGTERM."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A request that goes upstream with a view, and what recording its answer needs."""

    dialect: Dialect
    client: AsyncClient
    session_id: str
    key: str
    known: Known
    view: View
    body: dict[str, Any]
    strip_usage: bool


class Proxy:
    def __init__(self, settings: Settings, http: httpx2.AsyncClient | None = None) -> None:
        self.settings = settings
        self.ledger = Ledger()
        self.http = http or httpx2.AsyncClient(
            # As many connections as callers: a model's answer can stream for minutes.
            timeout=httpx2.Timeout(settings.upstream_timeout, connect=10.0, pool=10.0),
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=256),
            # Callers share this client: a cookie one caller's upstream sets is never another's.
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        )
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        self._retired: set[AsyncClient] = set()
        self._down_until = 0.0
        """Until when no request asks contextd: it could not be reached."""
        self._slow_until: OrderedDict[str, float] = OrderedDict()
        """Per contextd API key, until when its requests do not ask contextd: it was too slow."""
        self._counter = TiktokenCounter()
        self._counted: OrderedDict[bytes, int] = OrderedDict()
        self._background: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self.http.aclose()
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()

    def app(self) -> Starlette:
        async def health(_: Request) -> Response:
            return PlainTextResponse("ok\n")

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            yield
            await self.close()

        routes = [Route("/healthz", health, methods=["GET"]), Route("/{path:path}", self.handle, methods=_METHODS)]
        return Starlette(routes=routes, lifespan=lifespan)

    # ------------------------------------------------------------------ requests

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        dialect = BY_PATH.get(request.url.path) if request.method == "POST" else None
        upstream = self._upstream(request)
        if dialect is None:
            return await self._forward(request, upstream, raw, None)
        plan, outcome = await self._plan(request, dialect, raw)
        response = await self._forward(request, upstream, raw, plan)
        if plan is not None and response.status_code != 502 and VIEW_VERSION_HEADER not in response.headers:
            outcome = "view_rejected"
        requests_counted.add(1, {API: dialect.name, OUTCOME: outcome})
        return response

    async def _plan(self, request: Request, dialect: Dialect, raw: bytes) -> tuple[Plan | None, str]:
        """The view to send, or None and why not."""
        try:
            body = json.loads(raw)
        except ValueError:
            return None, "passthrough"
        if not isinstance(body, dict):
            return None, "passthrough"
        api_key = request.headers.get(API_KEY_HEADER) or ""
        now = time.monotonic()
        if now < self._down_until or now < self._slow_until.get(api_key, 0.0):
            return None, "bypassed"
        started = time.perf_counter()
        try:
            plan = await self._prepare(request, dialect, body, api_key)
        except Unsupported as exc:
            log.info("%s sent unchanged: %s", dialect.path, exc)
            return None, "unsupported"
        except Unavailable as exc:
            if not exc.reason:  # unreachable, not busy: no request of anyone's should wait on it
                self._down_until = time.monotonic() + self.settings.backoff
            log.warning("contextd unavailable (%s); %s sent unchanged", exc, dialect.path)
            return None, "failed"
        except (DeadlineExceeded, TimeoutError) as exc:
            # Too slow for this tenant's request: its next ones go unchanged for a while, not
            # other tenants' (a slow session of one is no outage of all).
            self._rest(api_key)
            log.warning("contextd too slow (%s); %s sent unchanged", str(exc) or type(exc).__name__, dialect.path)
            return None, "failed"
        except ContextdError as exc:  # this request's (a bad session id, a tenant's limit): its own
            log.warning("contextd refused (%s); %s sent unchanged", exc, dialect.path)
            return None, "failed"
        except Moving as exc:
            log.warning("%s; %s sent unchanged", exc, dialect.path)
            return None, "failed"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request is being cancelled (the caller left, the server stops)
            log.warning("a call to contextd was cancelled; %s sent unchanged", dialect.path)
            return None, "failed"
        except Exception:
            # The agent must not fail because of contextd, the proxy's own faults included.
            log.exception("preparing the view failed; %s sent unchanged", dialect.path)
            return None, "failed"
        added.record(time.perf_counter() - started, {API: dialect.name})
        return plan, "viewed"

    def _rest(self, api_key: str) -> None:
        self._slow_until[api_key] = time.monotonic() + self.settings.backoff
        self._slow_until.move_to_end(api_key)
        while len(self._slow_until) > _RESTING:
            self._slow_until.popitem(last=False)

    async def _prepare(self, request: Request, dialect: Dialect, body: dict[str, Any], api_key: str) -> Plan:
        split = dialect.split(body)
        if not split.items:
            raise Unsupported("no conversation to view")
        request_chains = chains(split.items)
        lead = dialect.lead_text(body, split.lead)
        session_id = request.headers.get(SESSION_HEADER) or fingerprint(
            dialect.name, _caller(request), lead, request_chains[0]
        )
        client = self._client(api_key)
        key = hashlib.sha256(f"{api_key}\x00{session_id}".encode()).hexdigest()
        # The timeout counts contextd's time for this request, not its wait for the same
        # session's earlier requests.
        async with self.ledger.lock(key), asyncio.timeout(self.settings.connection.timeout):
            known = self.ledger.get(key)
            while True:
                synced = await sync(client, session_id, dialect.format, split.items, request_chains, known)
                self.ledger.put(key, synced.known)
                for action, count in (("appended", synced.appended), ("retracted", synced.retracted)):
                    if count:
                        items_counted.add(count, {API: dialect.name, "contextd.proxy.action": action})
                view = await client.render_view(
                    session_id,
                    dialect.format,
                    budget_tokens=self._budget(request, dialect, body, lead),
                    place_cache_breakpoint=dialect.place_breakpoint(body),
                )
                if view.version != synced.known.version:  # another writer, between the sync and the render
                    self.ledger.drop(key)
                    raise Moving(f"session {session_id} changed while its view was rendered")
                if synced.located or view.version - view.retracted_items == synced.known.length:
                    break
                # The session shows fewer items than the conversation it holds: another writer
                # retracted some since this proxy last saw it (a retraction leaves the version).
                # Read where the request parts from it now (once: a session that holds items of
                # other writers than the proxy never adds up).
                known = Known(view.version, -1, "")
        upstream = {**dialect.with_view(body, split.lead, view), **view.request_patch}
        strip = bool(upstream.get("stream")) and dialect.stream_request(upstream)
        return Plan(dialect, client, session_id, key, synced.known, view, upstream, strip)

    def _budget(self, request: Request, dialect: Dialect, body: Mapping[str, Any], lead: str) -> int:
        named = request.headers.get(BUDGET_HEADER, "")
        if named.isdigit():
            return int(named)
        if self.settings.budget:
            return self.settings.budget
        window = window_of(str(body.get("model", "")))
        if not window:
            return 0
        tools = json.dumps(body.get("tools")) if body.get("tools") else ""
        return max(1, window - dialect.output_limit(body) - self._tokens(lead) - self._tokens(tools))

    def _tokens(self, text: str) -> int:
        """Tokens of a lead or a tool list, each counted once (they repeat from call to call),
        remembered by digest."""
        digest = hashlib.sha256(text.encode()).digest()
        count = self._counted.get(digest)
        if count is None:
            count = self._counted[digest] = self._counter.count(text)
            while len(self._counted) > _COUNTED:
                self._counted.popitem(last=False)
        return count

    def _client(self, api_key: str | None) -> AsyncClient:
        name = api_key or ""
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.settings.connection.client(api_key)
            while len(self._clients) > _CLIENTS:
                _, oldest = self._clients.popitem(last=False)
                # Calls may be under way on it (a request's, an answer's recording): closed later.
                self._retired.add(oldest)
                asyncio.get_running_loop().call_later(_RETIRE_AFTER, self._retire, oldest)
        self._clients.move_to_end(name)
        return client

    def _upstream(self, request: Request) -> str:
        anthropic = request.url.path.startswith("/v1/messages") or "anthropic-version" in request.headers
        return self.settings.anthropic_upstream if anthropic else self.settings.openai_upstream

    # ------------------------------------------------------------------ upstream

    async def _forward(self, request: Request, upstream: str, raw: bytes, plan: Plan | None) -> Response:
        headers = {k: v for k, v in request.headers.items() if _forwarded(k)}
        url = upstream.rstrip("/") + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        content = json.dumps(plan.body, ensure_ascii=False).encode() if plan is not None else raw
        body = b""
        try:
            answer = await self._send(request.method, url, headers, content)
            if plan is not None and answer.status_code == 400:
                # The provider refused the request with the view in it: the agent must not
                # fail because of contextd, so the request goes again as the caller sent it.
                refusal = (await answer.aread())[:500]
                await answer.aclose()
                log.warning("%s refused the view of session %s: %r", url, plan.session_id, refusal)
                plan = None
                answer = await self._send(request.method, url, headers, raw)
            streamed = answer.headers.get("content-type", "").startswith("text/event-stream")
            if plan is not None and not streamed:  # the whole answer, to record its turn from
                body = await answer.aread()
                await answer.aclose()
        except httpx2.HTTPError as exc:
            log.warning("upstream %s unreachable: %s", url, exc)
            message = f"contextd proxy: upstream {upstream} unreachable: {exc}"
            return JSONResponse({"error": {"type": "upstream_unreachable", "message": message}}, status_code=502)
        answered = answer.status_code == 200
        response: Response
        if plan is not None and not streamed:
            done = BackgroundTask(self._record_body, plan, body) if answered else None
            response = Response(body, answer.status_code, background=done)
        else:
            accumulator = plan.dialect.stream() if plan is not None and answered else None
            done = BackgroundTask(self._finish, plan, accumulator) if accumulator is not None else None
            events = self._relay(answer, accumulator, plan is not None and plan.strip_usage)
            response = StreamingResponse(events, answer.status_code, background=done)
        # Every header as the upstream sent it, repeated ones (Set-Cookie) one by one.
        relayed = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in _NOT_RELAYED]
        if plan is not None:
            relayed += [(SESSION_HEADER, plan.session_id), (VIEW_VERSION_HEADER, str(plan.view.view_version))]
        response.raw_headers.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in relayed)
        return response

    async def _send(self, method: str, url: str, headers: Mapping[str, str], content: bytes) -> httpx2.Response:
        outgoing = self.http.build_request(method, url, headers=headers, content=content)
        return await self.http.send(outgoing, stream=True)

    async def _relay(
        self, answer: httpx2.Response, accumulator: Accumulator | None, strip_usage: bool
    ) -> AsyncIterator[bytes]:
        """The stream's events as they come, each one's bytes as sent (less the usage event the
        proxy asked for, when the caller did not), fed to `accumulator` on the way."""
        events = Events()
        try:
            async for chunk in answer.aiter_bytes():
                if accumulator is None:
                    yield chunk
                    continue
                for event in events.feed(chunk):
                    if self._read(accumulator, event.name, event.data) and strip_usage:
                        continue
                    yield event.raw
            if events.rest:
                yield events.rest
        finally:
            await answer.aclose()

    @staticmethod
    def _read(accumulator: Accumulator, name: str, data: str) -> bool:
        """Feed one event; True when it carried only the usage."""
        if not data:
            return False
        try:
            accumulator.feed(name, data)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("an event the proxy cannot read: %.200r", data)
            return False
        return accumulator.usage_only

    # ------------------------------------------------------------------ recording

    async def _finish(self, plan: Plan | None, accumulator: Accumulator | None) -> None:
        answer = accumulator.answer() if accumulator is not None else None
        if plan is not None and answer is not None:
            await self._record(plan, answer)

    async def _record_body(self, plan: Plan, body: bytes) -> None:
        try:
            answer = json.loads(body)
        except ValueError:
            return
        if isinstance(answer, dict):
            await self._record(plan, answer)

    async def _record(self, plan: Plan, answer: Mapping[str, Any]) -> None:
        """Append the answer's assistant turn (unless another request has moved the session
        since: it carried the turn, or the caller dropped it) and report the usage."""
        try:
            async with asyncio.timeout(self.settings.connection.timeout):
                reply = plan.dialect.reply(answer)
                async with self.ledger.lock(plan.key):
                    if reply and self.ledger.get(plan.key) is plan.known:
                        after = chains(reply, after=plan.known.last)
                        try:
                            known = await append(plan.client, plan.session_id, plan.known, reply, after)
                        except VersionConflict:  # another writer since: read the session again next time
                            self.ledger.drop(plan.key)
                        else:
                            self.ledger.put(plan.key, known)
                            items_counted.add(len(reply), {API: plan.dialect.name, "contextd.proxy.action": "answer"})
                usage = plan.dialect.usage(answer)
                if usage is not None:
                    await plan.client.report_usage(plan.session_id, plan.view.view_version, usage)
        except Exception:
            recording_failures.add(1, {API: plan.dialect.name})
            log.warning("recording the answer in session %s failed", plan.session_id, exc_info=True)

    def _retire(self, client: AsyncClient) -> None:
        if client in self._retired:  # (not closed already, at shutdown)
            self._retired.discard(client)
            self._spawn(client.close())

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
