"""The Prometheus scrape endpoint of a real `contextd serve`: what a dashboard reads."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from contextd_client import Client, ViewFormat
from contextd_lab.service import ServerProcess

METRICS = re.compile(r"metrics for Prometheus on (http://[\d.]+:\d+/metrics)")


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, ()) if all(found.get(k) == w for k, w in labels.items()))


def test_a_scrape_shows_the_calls_appends_and_renders(tmp_path: Path) -> None:
    server = ServerProcess("--metrics-listen", "127.0.0.1:0", cwd=tmp_path).wait_serving()
    try:
        url = next(m.group(1) for line in server.log if (m := METRICS.search(line)))
        with Client(server.target) as client:
            session = client.create_session("scraped").id
            client.append_openai(
                session, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
            )
            view = client.render_view(session, ViewFormat.OPENAI_CHAT)
        samples = scrape(url)
    finally:
        server.stop()
    method = "contextd.v1.ContextService/AppendItems"
    assert (
        value(samples, "rpc_server_call_duration_seconds_count", rpc_method=method, rpc_response_status_code="OK") == 1
    )
    assert value(samples, "contextd_items_appended_total", contextd_tenant="default") == 2
    assert value(samples, "contextd_view_tokens_total", contextd_tenant="default") == view.total_tokens
    assert value(samples, "contextd_render_duration_seconds_count", contextd_stage="all") == 1
    assert value(samples, "contextd_sessions_active", contextd_tenant="default") == 1
    assert "process_resident_memory_bytes" in samples  # the client library's own process metrics


def test_a_taken_metrics_port_stops_start_up_with_one_line(tmp_path: Path) -> None:
    first = ServerProcess("--metrics-listen", "127.0.0.1:0", cwd=tmp_path).wait_serving()
    try:
        taken = next(m.group(1) for line in first.log if (m := METRICS.search(line))).split("/")[2]
        second = ServerProcess("--metrics-listen", taken, cwd=tmp_path)
        second.process.wait(timeout=60)
        second._reader.join(timeout=10)
    finally:
        first.stop()
    assert second.process.returncode != 0
    assert any(f"cannot serve metrics on {taken}" in line for line in second.log), second.log
    assert not any("Traceback" in line for line in second.log)


def test_render_processes_are_scraped_on_their_own_ports_and_calls_counted_once(tmp_path: Path) -> None:
    """The serving process measures every call, the one it hands on included; the render
    process measures the render (an instance of its own), not the call a second time."""
    server = ServerProcess("--metrics-listen", "127.0.0.1:0", "--render-processes", "1", cwd=tmp_path).wait_serving()
    try:
        urls = [m.group(1) for line in server.log if (m := METRICS.search(line))]
        rendering = [line for line in server.log if "(render process" in line and METRICS.search(line)]
        assert len(urls) == 2 and len(rendering) == 1, server.log
        worker_url = METRICS.search(rendering[0]).group(1)  # type: ignore[union-attr]
        parent_url = next(u for u in urls if u != worker_url)
        with Client(server.target) as client:
            session = client.create_session("scraped").id
            client.append_openai(session, [{"role": "user", "content": "hello"}])
            view = client.render_view(session, ViewFormat.OPENAI_CHAT)
        parent, worker = scrape(parent_url), scrape(worker_url)
    finally:
        server.stop()
    method = "contextd.v1.ContextService/RenderView"
    calls = "rpc_server_call_duration_seconds_count"
    assert value(parent, calls, rpc_method=method, rpc_response_status_code="OK") == 1
    assert value(worker, calls, rpc_method=method) == 0
    assert value(worker, "contextd_render_duration_seconds_count", contextd_stage="all") == 1
    assert value(worker, "contextd_view_tokens_total", contextd_tenant="default") == view.total_tokens
    assert value(parent, "contextd_render_duration_seconds_count", contextd_stage="all") == 0
    assert value(worker, "target_info", contextd_process="render") == 1
