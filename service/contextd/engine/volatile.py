"""Volatile content in the cache's hot zone: warned about, never rewritten
(DESIGN principle 5).

The system prompt and the tool schemas open every request, so the provider's
prompt cache holds them first: a value in them that changes from call to call
(today's date, the time, a fresh UUID, a request id) makes every call miss
the cache from its first token. contextd does not rewrite them (they are the
client's), it says what it found and where, so the client can move it after
the cached prefix.

Candidates are found by shape, then parsed: a date must be a real date, a
UUID a canonical UUID, so a version number or a commit hash is not taken for
either.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from contextd.engine.memo import IdentityMemo
from contextd.engine.model import Item, TextBlock
from contextd.engine.render.base import ViewWarning, to_json

_DATE = re.compile(
    r"(?<![\w.-])\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-]|\.\d)"
)
_TIME = re.compile(r"(?<![\w:.-])\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?![\w:-]|\.\d)")
_UUID = re.compile(
    r"(?<![0-9A-Fa-f-])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f-])"
)
_REQUEST_ID = re.compile(
    r"\b(?:req|request|trace|span|correlation)[-_ ]?id[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9][A-Za-z0-9_.-]{7,})"
    r"|\b(req_[A-Za-z0-9]{12,})\b",
    re.IGNORECASE,
)
MAX_FINDINGS = 5


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    """``date``, ``datetime``, ``time``, ``uuid`` or ``request id``."""
    value: str


def findings(texts: Iterable[str]) -> tuple[Finding, ...]:
    """The volatile values in `texts`, in order of appearance, each once (at most MAX_FINDINGS)."""
    found: dict[Finding, None] = {}
    for text in texts:
        for match in _DATE.finditer(text):
            kind = _date_kind(match.group(0))
            if kind:
                found.setdefault(Finding(kind, match.group(0)))
        for match in _TIME.finditer(text):
            if _parses(time.fromisoformat, match.group(0)):
                found.setdefault(Finding("time", match.group(0)))
        for match in _UUID.finditer(text):
            if _parses(uuid.UUID, match.group(0)):
                found.setdefault(Finding("uuid", match.group(0)))
        for match in _REQUEST_ID.finditer(text):
            value = match.group(1) or match.group(2)
            if Finding("uuid", value) not in found:  # a UUID is reported as one
                found.setdefault(Finding("request id", value))
    return tuple(found)[:MAX_FINDINGS]


def _date_kind(text: str) -> str:
    if len(text) == 10:
        return "date" if _parses(date.fromisoformat, text) else ""
    return "datetime" if _parses(datetime.fromisoformat, text.replace("Z", "+00:00")) else ""


def _parses(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def describe(where: str, found: tuple[Finding, ...]) -> str:
    values = ", ".join(f"{f.kind} {f.value!r}" for f in found)
    return (
        f"{where} holds values that change from call to call ({values}): every call misses the prompt "
        "cache from there on; move them after the cached prefix (e.g. into the latest user turn)"
    )


_scanned: IdentityMemo[tuple[Finding, ...]] = IdentityMemo(10_000)


def warnings_for(system: Iterable[Item], tools: tuple[Mapping[str, Any], ...]) -> list[ViewWarning]:
    """The warnings about the hot zone: the leading system items and the tool schemas
    (each scanned once, while it is the same object)."""
    out = []
    for item in system:
        texts = [b.text for b in item.content if isinstance(b, TextBlock)]
        found = _scanned.get((item,), lambda texts=texts: findings(texts))  # type: ignore[misc]
        if found:
            out.append(ViewWarning("VOLATILE_CONTENT", describe(f"the system prompt (seq {item.seq})", found)))
    if tools:
        found = _scanned.get((tools,), lambda: findings(to_json(t) for t in tools))
        if found:
            out.append(ViewWarning("VOLATILE_CONTENT", describe("the tool schemas", found)))
    return out
