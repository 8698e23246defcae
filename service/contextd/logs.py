"""Logging for the command line: lines of text (the default), or one JSON object a line
(`--log-format json`, for a log pipeline), each carrying the trace and span ids of the
call it was logged in, so a log line leads to its trace.

JSON is written by python-json-logger; only the filter that reads the current span is ours.
"""

from __future__ import annotations

import logging
import sys

from opentelemetry import trace

from contextd.config import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RENDER_PROCESS_FORMAT = "%(asctime)s %(levelname)s %(name)s (render process %(process)d): %(message)s"
"""A render process writes to its parent's stderr (contextd/render_processes.py): its lines say so."""


class TraceIds(logging.Filter):
    """Puts the current span's `trace_id` and `span_id` (hex; empty outside a span) on each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        record.span_id = format(context.span_id, "016x") if context.is_valid else ""
        return True


def configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "{asctime}{levelname}{name}{message}{trace_id}{span_id}"
                + ("{process}" if settings.render_worker else ""),
                style="{",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(RENDER_PROCESS_FORMAT if settings.render_worker else TEXT_FORMAT))
    handler.addFilter(TraceIds())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    if settings.log_level != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)
