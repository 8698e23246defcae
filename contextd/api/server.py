"""Server lifecycle: build, start, serve until a signal, drain, stop.

Shutdown order on SIGTERM or SIGINT: health turns NOT_SERVING (load
balancers stop sending), the server stops accepting calls and gives
in-flight ones `grace_seconds` to finish, then the database pool closes
and buffered spans are flushed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from contextd_client.v1 import contextd_pb2, contextd_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from redis.asyncio import Redis
from redis.exceptions import RedisError

from contextd.api.interceptors import ServiceInterceptor
from contextd.api.servicer import ContextServicer
from contextd.config import Settings
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.validation import Limits
from contextd.sessions import SessionService
from contextd.storage import migrate
from contextd.storage.database import Database
from contextd.storage.history import HistoryStore
from contextd.telemetry import configure_tracing

log = logging.getLogger("contextd")

SERVICE_NAME = contextd_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    db: Database
    port: int

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await self.db.close()


async def start(settings: Settings, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> RunningServer:
    """Start serving on `settings.listen`; the chosen port is in the result (useful with port 0).

    `interceptors` run outside contextd's own (auth, tracing, error mapping),
    first one outermost.
    """
    if settings.migrate_on_start:
        await migrate.upgrade(settings.database_url)
    db = Database(settings.database_url, pool_size=settings.db_pool_size, lock_timeout_ms=settings.lock_timeout_ms)
    await db.ping()
    if settings.redis_url:
        await _check_redis(settings.redis_url)
    limits = Limits(max_batch_items=settings.max_batch_items, max_item_bytes=settings.max_item_bytes)
    sessions = SessionService(HistoryStore(db), TiktokenCounter(), limits)

    server = grpc.aio.server(
        interceptors=[
            *interceptors,
            ServiceInterceptor(settings.tenant_keys(), max_request_bytes=settings.max_message_bytes),
        ],
        options=[
            # gRPC's own ceiling sits above the configured limit, so a request
            # between the two gets INVALID_ARGUMENT naming the limit rather
            # than a bare RESOURCE_EXHAUSTED.
            ("grpc.max_receive_message_length", 2 * settings.max_message_bytes),
            ("grpc.max_send_message_length", 2 * settings.max_message_bytes),
        ],
    )
    contextd_pb2_grpc.add_ContextServiceServicer_to_server(ContextServicer(sessions), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if settings.reflection:
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise RuntimeError(f"could not listen on {settings.listen}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = settings.listen.rsplit(":", 1)[0]
    log.info("contextd serving on %s:%d (database: %s)", host, port, db.dialect)
    return RunningServer(server, health_servicer, db, port)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    provider = configure_tracing(settings)
    running = await start(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("shutting down: draining calls for up to %.1f s", settings.grace_seconds)
    await running.stop(settings.grace_seconds)
    if provider is not None:
        provider.shutdown()
    log.info("stopped")


async def _check_redis(url: str) -> None:
    # The stash (Redis with a TTL) is not built yet; until it is, the server
    # only reports whether the configured Redis answers.
    client = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        await client.ping()
        log.info("redis reachable at %s", client.connection_pool.connection_kwargs.get("host", url))
    except (RedisError, OSError) as exc:
        log.warning("redis unreachable (%s): the stash will not be available", exc)
    finally:
        await client.aclose()
