"""Model-backed summaries of tool outputs: an optional plugin, off by default.

Named in a policy (``transform: model_summary``) and allowed by it
(``evidence: {max_level: 4}``: a summary is a prediction of what matters,
level 4), it asks an OpenAI-compatible endpoint (``POST {endpoint}/chat/completions``)
for a short summary of each candidate output, and proposes the summary in the
output's place, under a header naming the handle of the whole and what the
summary cost.

Renders never wait for the model: a render that finds no summary yet asks for
one in the background and proposes nothing; a later render finds it in the
plugin's cache (by endpoint, model, prompt and content hash) and proposes it.
A failed request (the endpoint down, a timeout, a malformed answer) is counted
and asked again after a pause, never raised into a render.

Its own cost is accounted: the tokens each summary took (the endpoint's
``usage``) are in the certificate's evidence, and totals by model are kept
(`ModelSummary.costs`) and exported as the OpenTelemetry counter
``contextd.model_summary.tokens`` (attributes: model, kind = input|output).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from opentelemetry import metrics

from contextd.engine.model import Representation, TextBlock
from contextd.engine.placeholders import PREFIX, describe, handle_of
from contextd.engine.types import Entry, Proposal, Replace, TransformContext

log = logging.getLogger(__name__)

PROMPT = (
    "Summarize this tool output for the agent that ran the tool, in at most {words} words. "
    "Keep verbatim every error message, failing test id, file path, identifier and number "
    "that a later step could need; say what the output shows, not what to do next."
)
PROMPT_VERSION = "1"
RETRY_AFTER_SECONDS = 60.0
"""A failed request is not asked again before this."""
CACHE_SIZE = 10_000
MIN_TOKENS = 400
MAX_INPUT_CHARS = 200_000
"""Longer outputs are not sent to the model (params.max_input_chars)."""
MAX_PENDING = 64
"""Requests waiting at once; past this, candidates wait for a later render."""

_tokens_counter = metrics.get_meter("contextd").create_counter(
    "contextd.model_summary.tokens", unit="{token}", description="Tokens the model-backed summaries cost"
)


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Settings:
    endpoint: str
    model: str
    api_key_env: str = ""
    words: int = 120
    timeout_seconds: float = 30.0
    min_tokens: int = MIN_TOKENS
    max_input_chars: int = MAX_INPUT_CHARS

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Settings:
        return cls(
            endpoint=str(params["endpoint"]).rstrip("/"),
            model=str(params["model"]),
            api_key_env=str(params.get("api_key_env", "")),
            words=int(params.get("words", 120)),
            timeout_seconds=float(params.get("timeout_seconds", 30.0)),
            min_tokens=int(params.get("min_tokens", MIN_TOKENS)),
            max_input_chars=int(params.get("max_input_chars", MAX_INPUT_CHARS)),
        )


class ModelSummary:
    name: ClassVar[str] = "model_summary"
    version: ClassVar[str] = PROMPT_VERSION

    def __init__(self, workers: int = 2) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="contextd-summary")
        # Queued requests must not hold the interpreter at exit.
        atexit.register(self.close)
        self._lock = threading.Lock()
        self._summaries: OrderedDict[tuple[str, str, str], Summary] = OrderedDict()
        self._pending: dict[tuple[str, str, str], Future[None]] = {}
        self._failed_at: dict[tuple[str, str, str], float] = {}
        self.costs: Counter[tuple[str, str]] = Counter()
        """(model, input|output) -> tokens spent on summaries by this process."""
        self.failures = 0

    def check(self, params: Mapping[str, Any]) -> list[tuple[str, str]]:
        problems = [(key, "required") for key in ("endpoint", "model") if not params.get(key)]
        endpoint = str(params.get("endpoint", ""))
        if endpoint and not endpoint.startswith(("http://", "https://")):
            problems.append(("endpoint", "must be an http:// or https:// URL"))
        for key, low in (("words", 10), ("timeout_seconds", 0.1), ("min_tokens", 1), ("max_input_chars", 100)):
            value = params.get(key)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < low):
                problems.append((key, f"must be a number of at least {low}"))
        return problems

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        settings = Settings.of(params)
        for entry in candidates:
            result = entry.item.tool_result
            if entry.representation is not Representation.FULL or entry.tokens < settings.min_tokens or result is None:
                continue
            text = "\n".join(p.text for p in result.content if isinstance(p, TextBlock))
            if not text or len(text) > settings.max_input_chars:
                continue  # nothing to summarize, or more than the model is asked to read
            key = (settings.endpoint, settings.model, hashlib.sha256(f"{PROMPT_VERSION}\0{text}".encode()).hexdigest())
            found = self._cached(key)
            if found is None:
                self._ask(key, settings, text)
                continue
            header = (
                f"{PREFIX} {describe(entry.item)} summarized by {settings.model} (a model's summary, not the "
                f"output: its words may be wrong); retrieve the whole with handle {handle_of(entry.item)}]"
            )
            yield Proposal(
                Replace(entry.seq, (TextBlock(f"{header}\n{found.text}"),)),
                4,
                "model_summary",
                f"summary by {settings.model}; it cost {found.input_tokens:,} input and "
                f"{found.output_tokens:,} output tokens",
            )

    def wait(self, timeout: float = 10.0) -> None:
        """Until the requests asked so far are answered (tests, benchmarks)."""
        with self._lock:
            pending = list(self._pending.values())
        concurrent.futures.wait(pending, timeout=timeout)

    def _cached(self, key: tuple[str, str, str]) -> Summary | None:
        with self._lock:
            found = self._summaries.get(key)
            if found is not None:
                self._summaries.move_to_end(key)
            return found

    def _ask(self, key: tuple[str, str, str], settings: Settings, text: str) -> None:
        now = time.monotonic()
        with self._lock:
            if key in self._pending or len(self._pending) >= MAX_PENDING:
                return  # asked already, or the model is behind: a later render asks again
            if now - self._failed_at.get(key, -RETRY_AFTER_SECONDS) < RETRY_AFTER_SECONDS:
                return
            try:
                self._pending[key] = self._executor.submit(self._fetch, key, settings, text)
            except RuntimeError:  # shutting down
                return

    def _fetch(self, key: tuple[str, str, str], settings: Settings, text: str) -> None:
        try:
            summary = _request(settings, text)
        except Exception as exc:  # whatever the endpoint does, it is counted, never raised into a render
            log.warning("model summary from %s failed: %s", settings.endpoint, exc)
            with self._lock:
                self.failures += 1
                self._failed_at[key] = time.monotonic()
                if len(self._failed_at) > CACHE_SIZE:
                    self._failed_at.pop(next(iter(self._failed_at)))
            return
        finally:
            with self._lock:
                self._pending.pop(key, None)
        _tokens_counter.add(summary.input_tokens, {"model": settings.model, "kind": "input"})
        _tokens_counter.add(summary.output_tokens, {"model": settings.model, "kind": "output"})
        with self._lock:
            self.costs[(settings.model, "input")] += summary.input_tokens
            self.costs[(settings.model, "output")] += summary.output_tokens
            self._summaries[key] = summary
            if len(self._summaries) > CACHE_SIZE:
                self._summaries.popitem(last=False)
            self._failed_at.pop(key, None)

    def close(self) -> None:
        """Stop asking: requests not started are dropped (the process is leaving)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _request(settings: Settings, text: str) -> Summary:
    body = {
        "model": settings.model,
        "messages": [
            {"role": "system", "content": PROMPT.format(words=settings.words)},
            {"role": "user", "content": text},
        ],
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{settings.endpoint}/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout_seconds) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection
        raise OSError(f"HTTP {exc.code} {exc.reason}") from None
    content = answer["choices"][0]["message"]["content"]
    if not isinstance(content, str) or not content.strip():
        raise ValueError("the endpoint answered without a summary")
    usage = answer.get("usage") or {}
    return Summary(content.strip(), int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
