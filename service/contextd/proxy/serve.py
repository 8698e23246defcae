"""Running the proxy: its metrics (the server's readers: OTLP, a Prometheus endpoint) and its
HTTP server."""

from __future__ import annotations

import logging
import socket

from contextd.config import Settings
from contextd.metrics import configure_metrics, serve_prometheus
from contextd.proxy.app import Proxy
from contextd.proxy.app import Settings as ProxySettings
from contextd.remote import serve_asgi, url_of

log = logging.getLogger(__name__)


async def serve(settings: Settings, proxy: ProxySettings, listening: socket.socket) -> None:
    """Answer on `listening` until SIGINT or SIGTERM."""
    provider = configure_metrics(settings)
    scrape = serve_prometheus(settings.metrics_listen) if settings.metrics_listen else None
    if scrape is not None:
        log.info("metrics for Prometheus on http://%s:%d/metrics", *scrape.server_address[:2])
    app = Proxy(proxy).app()
    log.info(
        "contextd proxy serving on %s (contextd at %s; upstreams %s, %s)",
        url_of(listening),
        proxy.connection.target,
        proxy.openai_upstream,
        proxy.anthropic_upstream,
    )
    try:
        await serve_asgi(app, listening, proxy.grace)
    finally:
        if scrape is not None:
            scrape.shutdown()
        if provider is not None:
            provider.shutdown()
