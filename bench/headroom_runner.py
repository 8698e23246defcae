"""Run headroom-ai's compressors over benchmark payloads: the headroom side of the side-by-side benchmark.

Runs with the python of headroom's own venv (bench/headroom_env.py creates it):

    "$(python3 bench/headroom_env.py)" bench/headroom_runner.py < payloads.json > headroom.json

stdin:  {"repeat": N, "payloads": [{"name", "kind", "text", "focus": [str], "messages": [...]}]}
        kind is log, test, json, code, search, diff, listing, html or repeated_reads; messages (OpenAI chat format) is
        optional, and is how repeated_reads payloads come.
stdout: {"headroom_version": str, "unavailable": {compressor: reason},
         "results": [{"name", "method", "output", "ms", "error"}]}

Each payload runs two methods:
- "compress": `headroom.compress()` with its defaults, on `messages` when given, else on a short conversation:
  the focus terms as the user's message, an assistant call to a `bash` tool (no arguments), and the payload text
  as that tool's output. Its `output` is the text of every message, joined by newlines.
- the specialised compressor of the payload's kind, with the focus terms as its query when it takes one:
  log, test       LogCompressor().compress(text)          (it takes a context argument but ignores it)
  json            SmartCrusher().crush(text, query=focus)
  code            CodeAwareCompressor().compress(text, context=focus)
  search          SearchCompressor().compress(text, context=focus)
  diff            DiffCompressor().compress(text, context=focus)
  listing         compact_lossless(text, "paths")          (its fold of path lists; it has no `ls -R` compressor)
  html            HTMLExtractor().extract(text)            (its page-to-text extraction, through trafilatura)
  repeated_reads  a ContentRouter with cross-turn dedup on (off in compress()), on the messages

`ms` is the median of `repeat` timed calls, after one untimed warm-up call (the first call loads headroom's
lazily-built parts); compress() keeps results in a per-process cache, emptied before every call so that each
call compresses. An exception in one method is reported in that result's `error` (with `ms` null).

Offline: headroom's own switch (HEADROOM_OFFLINE) and the HuggingFace ones are set, telemetry is off, tiktoken
reads the encodings litellm bundles, and any network connection fails at once and is named on stderr. Inherited
HEADROOM_* variables are dropped, so compress() runs with its defaults.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

# compress()'s defaults, also given to the dedup pipeline, which has none.
MODEL = "claude-sonnet-4-5-20250929"
MODEL_LIMIT = 200_000

# The encodings headroom counts tokens with: o200k_base for Claude models, cl100k_base for its Kompress payloads.
ENCODINGS = ("o200k_base", "cl100k_base")

# Headroom compressors that cannot run here, each with the reason.
UNAVAILABLE = {
    "KompressCompressor": (
        "ML text compressor: needs onnxruntime or torch and model weights (chopratejas/kompress-v2-base) from the "
        "HuggingFace Hub; compress() passes plain text (and code it cannot compress) through unchanged"
    ),
    "EmbeddingScorer": (
        "embedding relevance: needs sentence-transformers or fastembed and a model from the HuggingFace Hub; "
        "relevance scoring falls back to BM25"
    ),
}

Message = dict[str, Any]


class Payload(TypedDict):
    name: str
    kind: str
    text: str
    focus: list[str]
    messages: NotRequired[list[Message]]


class Result(TypedDict):
    name: str
    method: str
    output: str
    ms: float | None
    error: str | None


@dataclass(frozen=True)
class Method:
    """A named way of compressing a payload, with the reset to run before each call."""

    name: str
    compress: Callable[[Payload], str]
    reset: Callable[[], None]


def go_offline(workspace: str) -> None:
    """Set the offline switches (before headroom is imported) and refuse every network connection."""
    for key in [key for key in os.environ if key.startswith("HEADROOM_")]:
        del os.environ[key]
    os.environ.update(
        {
            "HEADROOM_OFFLINE": "1",  # headroom refuses its own egress: model downloads, telemetry, update checks
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HEADROOM_TELEMETRY": "off",
            "DO_NOT_TRACK": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's import would fetch its price table otherwise
            "TIKTOKEN_CACHE_DIR": bundled_encodings(),
            # Headroom's state (compression store, learned hints) in a directory of this run, not ~/.headroom.
            "HEADROOM_WORKSPACE_DIR": workspace,
            "HEADROOM_CONFIG_DIR": workspace,
        }
    )
    connect = socket.socket.connect

    def refuse(sock: Any, address: Any) -> None:
        if sock.family == socket.AF_UNIX:
            return connect(sock, address)
        print(f"headroom_runner: refused a network connection to {address!r}", file=sys.stderr)
        raise OSError(f"network access is disabled in the headroom runner (to {address!r})")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign,assignment]


def bundled_encodings() -> str:
    """The directory of the tiktoken encodings litellm ships, in tiktoken's cache layout."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        raise SystemExit("headroom_runner: litellm (a headroom-ai dependency) is not installed")
    directory = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
    for name in ENCODINGS:
        # tiktoken names a cached file by the SHA-1 of its download URL, and checks its SHA-256 on load.
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        if not (directory / hashlib.sha1(url.encode()).hexdigest()).exists():
            raise SystemExit(f"headroom_runner: litellm no longer bundles the {name} encoding in {directory}")
    return str(directory)


def focus_text(payload: Payload) -> str:
    """The focus terms as one query string."""
    return " ".join(payload["focus"])


def conversation(payload: Payload) -> list[Message]:
    """The payload's messages, or its text as the output of a tool called after a user message of the focus."""
    if "messages" in payload:
        return payload["messages"]
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "user", "content": focus_text(payload)},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": payload["text"]},
    ]


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts (text, tool results)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(part) for part in content)
    if isinstance(content, dict):
        return text_of(content.get("text", content.get("content")))
    return ""


def joined(messages: list[Message]) -> str:
    """The text of all the messages, joined by newlines."""
    return "\n".join(text_of(message.get("content")) for message in messages)


def clear_result_caches(pipeline: Any) -> None:
    """Empty the result cache of each ContentRouter in a headroom TransformPipeline."""
    for transform in pipeline.transforms:
        cache = getattr(transform, "_cache", None)
        if cache is not None:
            cache.clear()


def build_methods() -> tuple[Method, dict[str, Method]]:
    """The default compress() method, and the specialised method of each payload kind."""
    from headroom import compress
    from headroom.compress import _get_pipeline
    from headroom.transforms import (
        CodeAwareCompressor,
        ContentRouter,
        ContentRouterConfig,
        DiffCompressor,
        HTMLExtractor,
        LogCompressor,
        SearchCompressor,
        SmartCrusher,
        TransformPipeline,
    )
    from headroom.transforms.lossless_compaction import compact_lossless
    from headroom.utils import extract_user_query

    default = Method(
        "compress",
        lambda p: joined(compress(conversation(p), model=MODEL, model_limit=MODEL_LIMIT).messages),
        lambda: clear_result_caches(_get_pipeline()),  # compress()'s pipeline: no public way to reach its cache
    )

    log, crusher, code = LogCompressor(), SmartCrusher(), CodeAwareCompressor()
    search, diff, page = SearchCompressor(), DiffCompressor(), HTMLExtractor()
    # Cross-turn dedup: a later tool output's spans that appeared verbatim in an earlier one become pointers to it.
    dedup = TransformPipeline(transforms=[ContentRouter(ContentRouterConfig(enable_cross_turn_dedup=True))])

    def read_dedup(payload: Payload) -> str:
        messages = conversation(payload)
        context = extract_user_query(messages)
        return joined(dedup.apply(messages=messages, model=MODEL, model_limit=MODEL_LIMIT, context=context).messages)

    def stateless() -> None:
        """Nothing to reset: these compressors keep no results between calls."""

    log_method = Method("LogCompressor", lambda p: log.compress(p["text"]).compressed, stateless)
    specialised = {
        "log": log_method,
        "test": log_method,
        "json": Method("SmartCrusher", lambda p: crusher.crush(p["text"], query=focus_text(p)).compressed, stateless),
        "code": Method(
            "CodeAwareCompressor", lambda p: code.compress(p["text"], context=focus_text(p)).compressed, stateless
        ),
        "search": Method(
            "SearchCompressor", lambda p: search.compress(p["text"], context=focus_text(p)).compressed, stateless
        ),
        "diff": Method(
            "DiffCompressor", lambda p: diff.compress(p["text"], context=focus_text(p)).compressed, stateless
        ),
        "listing": Method("compact_lossless:paths", lambda p: compact_lossless(p["text"], "paths"), stateless),
        "html": Method("HTMLExtractor", lambda p: page.extract(p["text"]).extracted, stateless),
        "repeated_reads": Method("ContentRouter:cross_turn_dedup", read_dedup, lambda: clear_result_caches(dedup)),
    }
    return default, specialised


def run(payload: Payload, method: Method, repeat: int) -> Result:
    """Compress the payload once untimed, then `repeat` times timed; any failure goes in `error`."""
    from headroom.offline import OfflineEgressBlocked

    try:
        method.reset()
        output = method.compress(payload)
        times = []
        for _ in range(repeat):
            method.reset()
            start = time.perf_counter()
            method.compress(payload)
            times.append((time.perf_counter() - start) * 1000)
    except OfflineEgressBlocked as exc:  # a BaseException, so named apart
        return Result(name=payload["name"], method=method.name, output="", ms=None, error=f"unavailable: {exc}")
    except Exception as exc:
        return Result(
            name=payload["name"], method=method.name, output="", ms=None, error=f"{type(exc).__name__}: {exc}"
        )
    return Result(name=payload["name"], method=method.name, output=output, ms=statistics.median(times), error=None)


def no_method(payload: Payload) -> Result:
    """The result for a payload whose kind has no specialised compressor."""
    error = f"no specialised headroom compressor for kind {payload['kind']!r}"
    return Result(name=payload["name"], method="specialised", output="", ms=None, error=error)


def main() -> None:
    request = json.load(sys.stdin)
    repeat = max(1, int(request.get("repeat", 1)))
    with tempfile.TemporaryDirectory(prefix="headroom-runner-") as workspace:
        go_offline(workspace)
        # Anything headroom prints goes to stderr: stdout carries the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            default, specialised = build_methods()
            results = []
            for payload in request["payloads"]:
                results.append(run(payload, default, repeat))
                method = specialised.get(payload["kind"])
                results.append(run(payload, method, repeat) if method else no_method(payload))
    report = {"headroom_version": importlib.metadata.version("headroom-ai"), "unavailable": UNAVAILABLE}
    json.dump({**report, "results": results}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
