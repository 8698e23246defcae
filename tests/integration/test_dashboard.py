"""The dashboard against a real Prometheus: a running contextd under a small load (appends,
renders that prune, retrieves, usage reports, a failed call, a watch), scraped every half
second; then every query of deploy/grafana/contextd.json, asked through Prometheus's HTTP
API, must return numbers. A query that names a metric or a label the service does not
export returns nothing, and fails."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contextd_client import Client, ContextdError, Usage, ViewFormat
from contextd_lab.service import ServerProcess
from tests import backends
from tests.service.api.test_recovery import MASK_OLD
from tests.service.api.test_view_engine import conversation

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "contextd.json"
SCRAPES = 12
"""Scrapes of the load Prometheus must have before the queries (at half a second apart)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, with Grafana's variables given values."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "20s").replace("$tenant", ".*")
            found.append((panel["title"], expr))
    return found


def _ask(prometheus: str, path: str, **params: str) -> Any:
    url = f"{prometheus}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus of this test's own scraping a port the test then serves metrics on."""
    binary = shutil.which("prometheus")
    if binary is None:
        backends.unavailable_tool("Prometheus", "apt-get install prometheus (.ci/run does)")
    assert binary is not None
    metrics_port, web_port = _port(), _port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 500ms}\n"
        "scrape_configs:\n"
        f"  - job_name: contextd\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{web_port}",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    address = f"http://127.0.0.1:{web_port}"
    try:
        for _ in range(100):
            try:
                _ask(address, "/api/v1/status/buildinfo")
                break
            except OSError:
                time.sleep(0.1)
        yield address, metrics_port
    finally:
        process.terminate()
        process.wait(30)
        assert process.stderr is not None
        process.stderr.close()


def _load(target: str, stop: threading.Event) -> None:
    """What an agent platform does, in a loop: sessions that prune, retrieve and report usage."""
    with Client(target, timeout=30) as client:
        while not stop.is_set():
            session = client.create_session(policy=MASK_OLD).id
            conversation(client, session, rounds=3)
            view = client.render_view(session, ViewFormat.OPENAI_CHAT)
            for certificate in view.certificates:
                if certificate.decision == "prune":
                    client.retrieve(session, certificate.handle)
            client.report_usage(session, view.view_version, Usage("anthropic", "m", 100, 10, 500, 50))
            client.append_openai(session, [{"role": "user", "content": "and the next one"}])
            client.render_view(session, ViewFormat.OPENAI_CHAT)
            with contextlib.suppress(ContextdError):
                client.get_session("no-such-session")


def test_every_dashboard_query_returns_numbers_from_a_real_prometheus(
    prometheus: tuple[str, int], tmp_path: Path
) -> None:
    address, metrics_port = prometheus
    queries = _queries()
    assert len(queries) >= 20
    with ServerProcess("--metrics-listen", f"127.0.0.1:{metrics_port}", cwd=tmp_path) as server:
        stop = threading.Event()
        load = threading.Thread(target=_load, args=(server.target, stop), daemon=True)
        load.start()
        with Client(server.target) as watcher:
            watch = watcher.watch_session("", heartbeats=True)
            next(iter(watch))  # a watch stays open while Prometheus scrapes
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    scraped = _ask(address, "/api/v1/query", query="count_over_time(up[1m])")["data"]["result"]
                    if scraped and float(scraped[0]["value"][1]) >= SCRAPES:
                        break
                    time.sleep(0.5)
                else:
                    pytest.fail("Prometheus did not scrape contextd in a minute")
                empty = []
                for title, query in queries:
                    answer = _ask(address, "/api/v1/query", query=query)
                    assert answer["status"] == "success", (title, query, answer)
                    values = [float(r["value"][1]) for r in answer["data"]["result"]]
                    if not any(math.isfinite(v) for v in values):
                        empty.append(f"{title}: {query} -> {values}")
                assert not empty, "queries without data:\n" + "\n".join(empty)
                tenants = _ask(address, "/api/v1/label/contextd_tenant/values")["data"]
                assert "default" in tenants  # the dashboard's tenant variable has something to list
            finally:
                stop.set()
                watch.close()
                load.join(30)
