"""Log lines: text by default, JSON on request, each with the ids of the span it was logged in."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from contextd.logs import TraceIds
from contextd_lab.service import ServerProcess


def _record() -> logging.LogRecord:
    record = logging.LogRecord("contextd.api", logging.WARNING, __file__, 1, "something happened", None, None)
    assert TraceIds().filter(record)
    return record


def test_a_record_carries_the_current_span_ids() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("call") as span:
        record = _record()
    context = span.get_span_context()
    assert record.trace_id == format(context.trace_id, "032x") and len(record.trace_id) == 32
    assert record.span_id == format(context.span_id, "016x")
    outside = _record()
    assert (outside.trace_id, outside.span_id) == ("", "")


def test_json_lines_from_the_server(tmp_path: Path) -> None:
    server = ServerProcess("--log-format", "json", cwd=tmp_path).wait_serving()
    server.stop()
    lines = [json.loads(line) for line in server.log if line.strip()]
    assert lines and all({"time", "level", "logger", "message", "trace_id", "span_id"} <= set(line) for line in lines)
    assert any(line["message"].startswith("contextd serving on") for line in lines), lines
