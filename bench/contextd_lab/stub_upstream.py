"""A stand-in for the OpenAI and Anthropic APIs, for the proxy's tests and benchmark: it
records every request it receives and answers like each API (Chat Completions, Responses,
Messages; JSON or server-sent events, with usage), playing a scripted tool-calling agent.

The script: while the conversation holds fewer than `turns` tool results, the answer calls
the `bash` tool (`run_tests {n}`, under an id of its own, as providers give); then it answers
in text. Usage counts a token per four
bytes of the request's conversation, and calls a share of it cached, as a provider would
report a cache read.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FINAL = "The failing test is test_parse: the parser drops the last field."
CACHED_SHARE = 0.5


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes


@dataclass
class Upstream:
    """The stub's record and script."""

    turns: int = 3
    reject: Any = None
    """A predicate on a request body: when true, the stub answers 400 (a refused request)."""
    cookies: tuple[str, ...] = ()
    """Set-Cookie headers every answer carries (a gateway's session, a CDN's)."""
    received: list[Received] = field(default_factory=list)

    def app(self) -> Starlette:
        async def cookies(request: Request, call_next: Any) -> Response:
            response: Response = await call_next(request)
            response.raw_headers.extend((b"set-cookie", c.encode()) for c in self.cookies)
            return response

        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=cookies)])

    async def _read(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        body = json.loads(raw)
        self.received.append(Received(request.url.path, dict(request.headers), body, raw))
        return dict(body)

    def _refused(self, body: Mapping[str, Any]) -> Response | None:
        if self.reject is not None and self.reject(body):
            error = {"type": "invalid_request_error", "message": "refused by the stub"}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        return None

    def _step(self, results: int) -> int | None:
        """The tool call to make next (its number), or None: answer in text."""
        return results if results < self.turns else None

    async def _models(self, _: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    # ------------------------------------------------------------ Chat Completions

    async def _chat(self, request: Request) -> Response:
        body = await self._read(request)
        if (refused := self._refused(body)) is not None:
            return refused
        messages = body["messages"]
        step = self._step(sum(1 for m in messages if m.get("role") == "tool"))
        usage = _openai_usage(messages, chat=True)
        message: dict[str, Any] = {"role": "assistant", "content": None if step is not None else FINAL}
        if step is not None:
            arguments = json.dumps({"command": f"run_tests {step}"})
            message["tool_calls"] = [
                {
                    "id": f"call_{step}_{len(self.received)}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": arguments},
                }
            ]
        finish = "tool_calls" if step is not None else "stop"
        head = {"id": f"chatcmpl-{len(self.received)}", "created": int(time.time()), "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "message": {**message, "refusal": None}, "finish_reason": finish, "logprobs": None}
            return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage})
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return _sse(_chat_events(head, message, finish, usage if include else None))

    # ------------------------------------------------------------ Responses

    async def _responses(self, request: Request) -> Response:
        body = await self._read(request)
        if (refused := self._refused(body)) is not None:
            return refused
        given = body["input"]
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        step = self._step(sum(1 for i in items if i.get("type") == "function_call_output"))
        number = len(self.received)
        if step is not None:
            arguments = json.dumps({"command": f"run_tests {step}"})
            output: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{number}",
                "call_id": f"call_{step}_{number}",
                "name": "bash",
                "arguments": arguments,
                "status": "completed",
            }
        else:
            text = {"type": "output_text", "text": FINAL, "annotations": [], "logprobs": []}
            output = {"type": "message", "id": f"msg_{number}", "role": "assistant", "status": "completed"}
            output["content"] = [text]
        response = {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": "completed",
            "output": [output],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            "usage": _openai_usage(items, chat=False),
        }
        if not body.get("stream"):
            return JSONResponse(response)
        return _sse(_responses_events(response))

    # ------------------------------------------------------------ Messages

    async def _messages(self, request: Request) -> Response:
        body = await self._read(request)
        if (refused := self._refused(body)) is not None:
            return refused
        messages = body["messages"]
        results = sum(
            1
            for m in messages
            if m.get("role") == "user" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        )
        step = self._step(results)
        if step is not None:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{step}_{len(self.received)}",
                "name": "bash",
                "input": {"command": f"run_tests {step}"},
            }
        else:
            block = {"type": "text", "text": FINAL}
        size = len(json.dumps(messages)) // 4
        cached = int(size * CACHED_SHARE)
        usage = {
            "input_tokens": size - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": 20,
        }
        message = {
            "id": f"msg_{len(self.received)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [block],
            "stop_reason": "tool_use" if step is not None else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(message)
        return _sse(_messages_events(message), named=True)


def _openai_usage(conversation: list[Any], *, chat: bool) -> dict[str, Any]:
    size = len(json.dumps(conversation)) // 4
    cached = int(size * CACHED_SHARE)
    if chat:
        return {
            "prompt_tokens": size,
            "completion_tokens": 20,
            "total_tokens": size + 20,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    return {
        "input_tokens": size,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": size + 20,
    }


def _sse(events: Iterator[dict[str, Any] | str], *, named: bool = False) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        for event in events:
            if isinstance(event, str):
                yield f"data: {event}\n\n".encode()
                continue
            name = f"event: {event['type']}\n" if named else ""
            yield f"{name}data: {json.dumps(event)}\n\n".encode()

    return StreamingResponse(frames(), media_type="text/event-stream")


def _chat_events(
    head: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, Any] | None
) -> Iterator[dict[str, Any] | str]:
    chunk = {**head, "object": "chat.completion.chunk"}

    def delta(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    yield delta({"role": "assistant", "content": "" if message["content"] else None})
    if message["content"]:
        text = message["content"]
        for start in range(0, len(text), 16):
            yield delta({"content": text[start : start + 16]})
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": index, "id": call["id"], "type": "function"}
        yield delta({"tool_calls": [{**first, "function": {"name": "bash", "arguments": arguments[:half]}}]})
        yield delta({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    yield delta({}, finish)
    if usage is not None:
        yield {**chunk, "choices": [], "usage": usage}
    yield "[DONE]"


def _responses_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "sequence_number": 0, "response": started}
    number = 1
    for index, item in enumerate(response["output"]):
        yield {"type": "response.output_item.added", "sequence_number": number, "output_index": index, "item": item}
        yield {"type": "response.output_item.done", "sequence_number": number + 1, "output_index": index, "item": item}
        number += 2
    yield {"type": "response.completed", "sequence_number": number, "response": response}


def _messages_events(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            for at in range(0, len(block["text"]), 16):
                piece = block["text"][at : at + 16]
                yield {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
        else:
            opened = {**block, "input": {}}
            yield {"type": "content_block_start", "index": index, "content_block": opened}
            arguments = json.dumps(block["input"])
            for at in (0, len(arguments) // 2):
                piece = arguments[at : at + len(arguments) // 2] if at == 0 else arguments[at:]
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    finished = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield {"type": "message_delta", "delta": finished, "usage": {"output_tokens": usage["output_tokens"]}}
    yield {"type": "message_stop"}


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve the ASGI `app` on a free loopback port in a thread; yields its base URL."""
    listening = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
