"""headroom-ai's proxy, per request, for the lab: what it would forward of each model call of a trace.

Runs with the python of headroom's own venv (bench/headroom_env.py creates it), as a child of
the lab (contextd_lab/headroom.py), one JSON object per line each way:

    {"session": true}                        a new conversation (a new trace or condition)
    {"messages": [OpenAI chat messages]}     one request -> {"messages": [what the proxy forwards],
                                                             "originals": {hash: original},
                                                             "transforms": [...]}

The proxy is not run itself (its web stack is not in its wheel's extras); what its OpenAI
chat-completions handler does to a request in its default mode is done here with the same
objects, as headroom-ai 0.42.0's source has it (headroom/proxy/server.py, handlers/openai.py,
cache/prefix_tracker.py, proxy/session_engine.py, agent_savings.py):

* the defaults its entry points set: the "coding" savings profile seeded into the environment
  before anything is built (`seed_proxy_env_defaults`), cache mode;
* its pipeline: `TransformPipeline([CacheAligner (off), ContentRouter(config)])` with the
  router configured as the proxy configures it (code-aware, the read lifecycle, at most the
  profile's items after a JSON crush, compaction, CCR markers, the disk result cache), and the
  keyword arguments of `proxy_pipeline_kwargs` for the profile;
* per request, in cache mode: every message but the last frozen when the last is a user or
  tool message (so only the newest output is compressed, when it first arrives), the request's
  query as context, `prefix_replay_guaranteed`, and the bytes forwarded last time replayed
  over the prefix (`finalize_turn`): an earlier message is forwarded byte for byte as before.

Its CCR store (`get_compression_store`, SQLite in this run's workspace) keeps each original a
marker names; the answer carries the originals of the markers in what was forwarded, so the
lab counts a fact behind one as recoverable, as the proxy's `headroom_retrieve` tool would
fetch it. Offline as bench/headroom_runner.py is: Kompress (its ML text compressor) cannot
load its weights, so plain prose passes through.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from headroom_runner import go_offline

MODEL = "gpt-4o"
_MARKERS = (re.compile(r"<<ccr:([0-9a-f]{12,64})"), re.compile(r"hash=([0-9a-f]{12,64})"))


def main() -> int:
    go_offline(tempfile.mkdtemp(prefix="headroom-proxy-"))
    from headroom.agent_savings import proxy_pipeline_kwargs, seed_proxy_env_defaults

    seed_proxy_env_defaults()  # what `headroom proxy` does before it builds anything

    from headroom.cache.compression_store import get_compression_store
    from headroom.config import CacheAlignerConfig, ReadLifecycleConfig
    from headroom.providers.openai import OpenAIProvider
    from headroom.proxy.session_engine import finalize_turn
    from headroom.transforms import CacheAligner, ContentRouter, ContentRouterConfig, TransformPipeline
    from headroom.transforms.compression_policy import resolve_policy
    from headroom.utils import extract_user_query

    # The proxy's configuration as its command line builds it by default (the fields read here).
    settings = SimpleNamespace(
        savings_profile="coding",
        min_tokens_to_crush=500,
        max_items_after_crush=50,
        compress_user_messages=None,
        compress_system_messages=None,
        protect_recent=None,
        protect_analysis_context=None,
        target_ratio=None,
        smart_crusher_with_compaction=None,
    )
    arguments = proxy_pipeline_kwargs(settings)
    router = ContentRouterConfig(
        enable_code_aware=True,
        prefer_code_aware_for_code=True,
        tool_profiles=None,
        read_lifecycle=ReadLifecycleConfig(enabled=True),
        smart_crusher_max_items_after_crush=arguments.get("max_items_after_crush"),
        smart_crusher_with_compaction=arguments.get("smart_crusher_with_compaction", True),
        ccr_inject_marker=True,
        force_kompress_all=False,
        lossless=False,
    )
    router.result_cache_disk = True
    router.active_external_compressors = None
    if arguments.get("compress_user_messages"):
        router.skip_user_messages = False
    provider = OpenAIProvider()
    pipeline = TransformPipeline(
        transforms=[CacheAligner(CacheAlignerConfig(enabled=False)), ContentRouter(router)], provider=provider
    )
    store = get_compression_store()
    limit = provider.get_context_limit(MODEL)
    previous: tuple[list[Any], list[Any]] = ([], [])  # what the last request held, and what was forwarded

    for line in sys.stdin:
        request = json.loads(line)
        if request.get("session"):
            previous = ([], [])
            _answer({"ok": True})
            continue
        messages = request["messages"]
        last = messages[-1].get("role") if messages else None
        frozen = len(messages) - 1 if last in ("user", "tool", "function") else len(messages)
        done = pipeline.apply(
            messages=messages,
            model=MODEL,
            model_limit=limit,
            context=extract_user_query(messages),
            frozen_message_count=frozen,
            prefix_replay_guaranteed=True,
            biases=None,
            protect=None,
            compression_policy=resolve_policy(None),
            cross_turn_dedup_recoverable=True,
            **arguments,
        )
        forwarded = done.messages
        replayed = finalize_turn(
            forwarded, messages, previous[0] or None, previous[1] or None, confirmed_frozen_count=frozen
        )
        if replayed.replayed:
            forwarded = replayed.messages
        previous = (copy.deepcopy(messages), copy.deepcopy(forwarded))
        originals: dict[str, str] = {}
        for key in _markers(forwarded):
            entry = store.retrieve(key)
            if entry is not None:
                originals[key] = entry.original_content
        _answer({"messages": forwarded, "originals": originals, "transforms": list(done.transforms_applied)})
    return 0


def _markers(messages: list[dict[str, Any]]) -> set[str]:
    text = json.dumps(messages)
    return {m.group(1) for pattern in _MARKERS for m in pattern.finditer(text)}


def _answer(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
