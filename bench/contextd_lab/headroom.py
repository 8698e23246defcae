"""headroom-ai in the lab's loop: each model call's request as its proxy would forward it.

`HeadroomProxy` runs bench/headroom_proxy.py in headroom's own virtual environment (created by
bench/headroom_env.py on first use) and asks it, call by call, what the proxy forwards of the
request an agent sends: the whole conversation so far, in OpenAI's chat format. Its cache mode
forwards what it forwarded before byte for byte and compresses only the newest output, so the
forwarded conversation only grows; the lab appends each forwarded message once to a session
that prunes nothing (the raw condition's policy), and the service renders, counts and prices
it exactly as it does raw's. A fact behind one of headroom's markers is recoverable when its
store gives the original back, as the proxy's retrieve tool would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONDITION = "headroom"


class HeadroomProxy:
    def __init__(self) -> None:
        spec = importlib.util.spec_from_file_location("headroom_env", ROOT / "bench" / "headroom_env.py")
        assert spec is not None and spec.loader is not None
        environment = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(environment)  # a script beside the lab's package, not part of it
        self._process = subprocess.Popen(
            [str(environment.headroom_python(ROOT)), str(ROOT / "bench" / "headroom_proxy.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        self.originals: dict[str, str] = {}
        """Every original a marker forwarded so far in this conversation named, by its hash."""

    def new_conversation(self) -> None:
        self._ask({"session": True})
        self.originals = {}

    def forward(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """What the proxy forwards of a request holding `messages` (OpenAI chat format)."""
        answer = self._ask({"messages": list(messages)})
        self.originals.update(answer["originals"])
        forwarded: list[dict[str, Any]] = answer["messages"]
        return forwarded

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"bench/headroom_proxy.py stopped (exit {self._process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    def __enter__(self) -> HeadroomProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def to_chat(message: Mapping[str, Any]) -> dict[str, Any]:
    """A trace message (../shared/traces/README.md) as an OpenAI chat message."""
    role = message["role"]
    if role == "tool":
        return {"role": "tool", "tool_call_id": message["tool_call_id"], "content": message.get("content") or ""}
    out: dict[str, Any] = {"role": role, "content": message.get("content")}
    calls = message.get("tool_calls") or ()
    if calls:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in calls
        ]
    return out


def from_chat(forwarded: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """The trace message `original` as headroom forwarded it: its text (and its calls' arguments)
    replaced by what was forwarded."""
    out = dict(original)
    out["content"] = _text(forwarded.get("content"))
    calls = forwarded.get("tool_calls")
    if calls and original.get("tool_calls"):
        by_id = {c["id"]: c for c in calls}
        out["tool_calls"] = [
            {**c, "arguments": _arguments(by_id[c["id"]]["function"]["arguments"])} if c["id"] in by_id else c
            for c in original["tool_calls"]
        ]
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"_raw": text}
