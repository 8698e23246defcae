"""How the fuzzer sends requests and judges the answers (tests/fuzzing.py builds them).

A call passes when it succeeds or fails with a status a client can act on
(`ACTIONABLE`). INTERNAL, UNKNOWN, an answer that does not decode and a
call that outlives its deadline are failures, deduplicated by RPC, status
and cause: for INTERNAL the exception and the line of contextd's code the
server logged for the answer's reference. The first request of each failure
is shrunk (fields cleared, repeated fields cut to one element) while it
still fails the same way. A call slower than `slow_seconds` is reported,
never asserted: timing on a loaded machine is noise.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from tests.fuzzing import (
    LABELS,
    METHODS,
    SERVICE,
    HistoryRender,
    PolicyRender,
    RawCase,
    Targets,
    bait_items,
    prepare_scratch,
)

ACTIONABLE = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "ABORTED",
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "UNIMPLEMENTED",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "OUT_OF_RANGE",
    }
)
"""Statuses a client can act on. DEADLINE_EXCEEDED is not one: under a 20 s deadline it is a stall."""
DEADLINE_SECONDS = 20.0
STREAM_SECONDS = 2.0
"""How long a server stream is read before the client cancels it (a live one never ends)."""
SLOW_SECONDS = 2.0
"""A call slower than this is reported: hostile input should be refused before expensive work."""


@dataclass(frozen=True)
class Outcome:
    rpc: str
    case: str
    """What was sent: "message", a raw-bytes case's label, or a scenario's step."""
    request: bytes
    code: str
    """OK, a gRPC status name, or UNDECODABLE_RESPONSE."""
    details: str
    seconds: float
    message: Message | None = None
    """The request as a message, when it was one (a scenario's render: what its hostile input came in)."""
    response: bytes = b""
    """The (first) answer's bytes, on success."""


class Caller:
    """Sends request bytes as they are (identity serializers) and times the answer."""

    def __init__(self, target: str, deadline: float = DEADLINE_SECONDS) -> None:
        limit = 64 * 1_048_576
        options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
        self.channel = grpc.insecure_channel(target, options=options)
        self.deadline = deadline
        prefix = f"/{SERVICE.full_name}/"
        self._unary: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {
            name: self.channel.unary_unary(prefix + name, request_serializer=None, response_deserializer=None)
            for name, method in METHODS.items()
            if not method.server_streaming
        }
        self._stream: dict[str, grpc.UnaryStreamMultiCallable[bytes, bytes]] = {
            name: self.channel.unary_stream(prefix + name, request_serializer=None, response_deserializer=None)
            for name, method in METHODS.items()
            if method.server_streaming
        }

    def close(self) -> None:
        self.channel.close()

    def call(self, rpc: str, data: bytes, case: str = "message", message: Message | None = None) -> Outcome:
        response_type = message_factory.GetMessageClass(METHODS[rpc].output_type)
        started = time.perf_counter()
        code, details, answers = "OK", "", []
        try:
            if rpc in self._stream:
                answers = self._read_stream(rpc, data)
            else:
                answers = [self._unary[rpc](data, timeout=self.deadline)]
            for answer in answers:
                response_type.FromString(answer)
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        except DecodeError as exc:
            code, details = "UNDECODABLE_RESPONSE", str(exc)
        seconds = time.perf_counter() - started
        return Outcome(rpc, case, data, code, details, seconds, message, answers[0] if answers else b"")

    def _read_stream(self, rpc: str, data: bytes) -> list[bytes]:
        call = self._stream[rpc](data, timeout=self.deadline)
        timer = threading.Timer(STREAM_SECONDS, call.cancel)
        timer.start()
        answers = []
        try:
            for answer in call:
                answers.append(answer)
                call.cancel()  # it answered: the request was taken (a watch then waits for events)
                break
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.CANCELLED:  # cancelled: by us, the stream was open
                raise
        finally:
            timer.cancel()
        return answers


# ------------------------------------------------------------- the server's side


@dataclass(frozen=True)
class ServerError:
    """What the server logged for one INTERNAL reference."""

    cause: str
    """The exception type and the innermost frame of contextd's own code: the same bug, whatever its message."""
    explanation: str
    """The exception and its message, that frame, and the one it was raised in when that is elsewhere."""


def _short(path: str) -> str:
    for marker in ("/contextd/", "/site-packages/"):
        at = path.rfind(marker)
        if at >= 0:
            return path[at + 1 :] if marker == "/contextd/" else path[at + len(marker) :]
    return path


def _server_error(kind: str, message: str, frames: Sequence[tuple[str, int]]) -> ServerError:
    own: list[str] = []
    for path, line in frames:
        here = f"{_short(path)}:{line}"
        if "/contextd/" in path and "site-packages" not in path and (not own or own[-1] != here):
            own.append(here)  # a recursion's frames once
    where = own[-1] if own else "?"
    raised = f"{_short(frames[-1][0])}:{frames[-1][1]}" if frames else "?"
    also = f", raised in {raised}" if raised != where else ""
    calls = " <- ".join(reversed(own[-4:-1]))
    via = f" (via {calls}{also})" if calls else f" ({also[2:]})" if also else ""
    first_line = message.strip().splitlines()[0][:160] if message.strip() else ""
    return ServerError(f"{kind} at {where}", f"{kind}: {first_line} at {where}{via}")


class ServerErrors(logging.Filter):
    """The server's log entry of each INTERNAL reference. In process, add it as a filter of the
    `contextd.api` logger: it keeps what it needs and drops the record, whose traceback (thousands of
    lines for a deep input) would otherwise fill pytest's captured log. For a child process, `feed` it
    the log lines."""

    REFERENCE = re.compile(r"failed \(reference ([0-9a-f]+)\)")
    FRAME = re.compile(r'\s+File "([^"]+)", line (\d+)')

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, ServerError] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        match = self.REFERENCE.search(record.getMessage())
        if not (match and record.exc_info and record.exc_info[1] is not None):
            return True
        exc = record.exc_info[1]
        frames = [(frame.filename, frame.lineno or 0) for frame in traceback.extract_tb(exc.__traceback__)]
        self.found[match.group(1)] = _server_error(type(exc).__name__, str(exc), frames)
        return False

    def feed(self, lines: Sequence[str]) -> None:
        """Read `contextd serve` log lines: each reference line, then its traceback up to the exception."""
        reference, frames = "", list[tuple[str, int]]()
        for line in lines:
            match = self.REFERENCE.search(line)
            frame = self.FRAME.match(line)
            if match:
                reference, frames = match.group(1), []
            elif reference and frame:
                frames.append((frame.group(1), int(frame.group(2))))
            elif reference and frames and line and not line.startswith((" ", "Traceback")):
                kind, _, message = line.partition(": ")
                if " " not in kind:  # an exception line, not a chaining note or the next log record
                    self.found[reference] = _server_error(kind.rpartition(".")[2], message, frames)

    def lookup(self, details: str) -> ServerError | None:
        match = re.search(r"reference ([0-9a-f]+)", details)
        return self.found.get(match.group(1)) if match else None


# ------------------------------------------------------------------- describing


def _is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def _shape(value: Any) -> str:
    if isinstance(value, str | bytes):
        if value in LABELS:
            return LABELS[value]
        if len(value) > 40:
            first = value[:1]
            if value.count(first) == len(value):  # type: ignore[arg-type]  # first is of value's type
                return f"{len(value):,} × {first!r}"
            return f"{len(value):,} {'chars' if isinstance(value, str) else 'bytes'} {value[:24]!r}..."
    return repr(value)


def describe(request: Message, limit: int = 600) -> str:
    """The fields `request` sets and the shape of each value (hand-written hostile ones by name)."""
    parts: list[str] = []

    def walk(node: Message, prefix: str) -> None:
        for f, value in node.ListFields():
            path = f"{prefix}{f.name}"
            if _is_map(f):
                parts.append(f"{path}={{{len(value):,} entries}}" if len(value) > 3 else f"{path}={dict(value)!r}")
            elif f.is_repeated and len(value) > 3:
                first = value[0]
                shape = describe(first, 120) if isinstance(first, Message) else _shape(first)
                parts.append(f"{path}=[{len(value):,} × {shape}]")
            elif f.is_repeated:
                for n, element in enumerate(value):
                    walk_value(f, element, f"{path}[{n}]")
            else:
                walk_value(f, value, path)

    def walk_value(f: FieldDescriptor, value: Any, path: str) -> None:
        if isinstance(value, Message):
            before = len(parts)
            walk(value, path + ".")
            if len(parts) == before:
                parts.append(f"{path}={{}}")
        elif f.type == FieldDescriptor.TYPE_ENUM:
            known = f.enum_type.values_by_number.get(value) if f.enum_type else None
            parts.append(f"{path}={known.name if known else f'unknown enum value {value}'}")
        else:
            parts.append(f"{path}={_shape(value)}")

    walk(request, "")
    text = ", ".join(parts) or "(empty message)"
    return text if len(text) <= limit else text[:limit] + "..."


def hostile_labels(request: Message) -> tuple[str, ...]:
    """The hand-written hostile values `request` carries, by name."""
    found: set[str] = set()

    def walk(node: Message) -> None:
        for f, value in node.ListFields():
            values = list(value.values()) if _is_map(f) else list(value) if f.is_repeated else [value]
            for v in values[:4]:
                if isinstance(v, Message):
                    walk(v)
                elif isinstance(v, str | bytes) and v in LABELS:
                    found.add(LABELS[v])

    walk(request)
    return tuple(sorted(found))


# -------------------------------------------------------------------- findings

FailureKey = tuple[str, str, str]


@dataclass
class Failure:
    key: FailureKey
    first: Outcome
    smallest: Outcome
    """The shrunk request when the minimizer ran, else the shortest one seen."""
    explanation: str
    count: int = 1


@dataclass
class Findings:
    """Every call's outcome, tallied; failures deduplicated by (RPC, status, cause)."""

    lookup: Callable[[str], ServerError | None] = lambda details: None
    """The server's log entry for an INTERNAL answer's reference, when it can be read."""
    slow_seconds: float = SLOW_SECONDS
    calls: Counter[str] = field(default_factory=Counter)
    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    slowest: dict[str, Outcome] = field(default_factory=dict)
    failures: dict[FailureKey, Failure] = field(default_factory=dict)
    slow: dict[tuple[str, tuple[str, ...]], tuple[Outcome, int]] = field(default_factory=dict)

    @staticmethod
    def failed(outcome: Outcome) -> bool:
        return outcome.code != "OK" and outcome.code not in ACTIONABLE

    def key(self, outcome: Outcome) -> FailureKey:
        logged = self.lookup(outcome.details) if outcome.code == "INTERNAL" else None
        if logged is not None:
            return outcome.rpc, outcome.code, logged.cause
        details = re.sub(r"reference [0-9a-f]+", "reference R", outcome.details)
        return outcome.rpc, outcome.code, re.sub(r"\d+", "N", details)[:200]

    def record(self, outcome: Outcome) -> Failure | None:
        """Tally `outcome`; the new Failure when it fails in a way not seen before."""
        self.calls[outcome.rpc] += 1
        self.statuses.setdefault(outcome.rpc, Counter())[outcome.code] += 1
        if outcome.rpc not in self.slowest or outcome.seconds > self.slowest[outcome.rpc].seconds:
            self.slowest[outcome.rpc] = outcome
        if outcome.seconds > self.slow_seconds:
            labels = hostile_labels(outcome.message) if outcome.message is not None else ()
            if outcome.case.startswith(("search a history", "retrieve from a history")):
                labels = (*labels, outcome.case)
            slow_key = (outcome.rpc, labels or (re.sub(r"\d+", "N", outcome.case),))
            seen, count = self.slow.get(slow_key, (outcome, 0))
            self.slow[slow_key] = (outcome if outcome.seconds >= seen.seconds else seen, count + 1)
        if not self.failed(outcome):
            return None
        key = self.key(outcome)
        known = self.failures.get(key)
        if known is not None:
            known.count += 1
            return None
        logged = self.lookup(outcome.details) if outcome.code == "INTERNAL" else None
        explanation = f"{logged.explanation} [{outcome.details}]" if logged else outcome.details
        self.failures[key] = Failure(key, outcome, outcome, explanation)
        return self.failures[key]

    def check(self) -> None:
        """Fail the test with the report when any call failed (pytest's repr of the tallies says nothing)."""
        if self.failures:
            kinds = "; ".join(f"{rpc} {code} ({cause})" for rpc, code, cause in self.failures)
            pytest.fail(f"{len(self.failures)} kind(s) of failing call: {kinds}\n\n{self.report()}", pytrace=False)

    def table(self) -> str:
        lines = [f"{'RPC':<18}{'calls':>7}  {'slowest':>8}  statuses"]
        for rpc in sorted(self.calls):
            histogram = ", ".join(f"{code} {n}" for code, n in self.statuses[rpc].most_common())
            lines.append(f"{rpc:<18}{self.calls[rpc]:>7}  {self.slowest[rpc].seconds:>7.2f}s  {histogram}")
        return "\n".join(lines)

    def slowest_calls(self) -> str:
        lines = ["Slowest call of each RPC:"]
        for rpc, outcome in sorted(self.slowest.items(), key=lambda kv: -kv[1].seconds):
            sent = describe(outcome.message, 160) if outcome.message is not None else outcome.case
            lines.append(f"- {rpc} {outcome.seconds:.2f} s -> {outcome.code} ({outcome.case}): {sent}")
        return "\n".join(lines)

    def report(self, reproducer: Callable[[Failure], str] | None = None) -> str:
        lines = [self.table(), "", f"Failures (not an actionable status; deduplicated): {len(self.failures)}"]
        for n, failure in enumerate(self.failures.values(), 1):
            example = failure.smallest
            sent = describe(example.message) if example.message is not None else example.case
            lines.append(f"{n}. {example.rpc} -> {example.code} (x{failure.count}): {failure.explanation}")
            lines.append(
                f"   sent: {example.case}, {len(example.request):,} bytes, answered in {example.seconds:.2f} s"
            )
            lines.append(f"   request: {sent}")
            if reproducer is not None:
                lines.append(f"   reproducer: {reproducer(failure)}")
        lines += ["", f"Slow calls (> {self.slow_seconds:g} s), by RPC and hostile value: {len(self.slow)}"]
        for (rpc, labels), (outcome, count) in sorted(self.slow.items(), key=lambda kv: -kv[1][0].seconds):
            lines.append(f"- {rpc} x{count}, slowest {outcome.seconds:.2f} s -> {outcome.code}: {', '.join(labels)}")
            if outcome.message is not None:
                lines.append(f"  request: {describe(outcome.message, 300)}")
        return "\n".join(lines)


def simpler(request: Message) -> Iterator[Message]:
    """Copies of `request` with one part taken away: a field cleared, a repeated field cut to its first
    element, or the same inside a nested message."""

    def copy() -> Message:
        trial = type(request)()
        trial.CopyFrom(request)
        return trial

    for f, value in request.ListFields():
        trial = copy()
        trial.ClearField(f.name)
        yield trial
        if f.is_repeated and not _is_map(f) and len(value) > 1:
            trial = copy()
            del getattr(trial, f.name)[1:]
            yield trial
        if f.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(f):
            for smaller in simpler(value[0] if f.is_repeated else value):
                trial = copy()
                (getattr(trial, f.name)[0] if f.is_repeated else getattr(trial, f.name)).CopyFrom(smaller)
                yield trial


# ----------------------------------------------------------------------- fuzzer


class Fuzzer:
    """Sends generated requests through a Caller, keeps the targets usable, and tallies the outcomes."""

    MINIMIZE_CALLS = 40
    """Most calls spent shrinking one failure's request."""

    def __init__(
        self, caller: Caller, targets: Targets, findings: Findings, minimize: bool = True, max_stalls: int | None = 3
    ) -> None:
        """`max_stalls`: after that many calls past their deadline, send nothing more (a regression that
        stalls every render would otherwise cost a deadline per call); None: no limit."""
        self.caller = caller
        self.targets = targets
        self.findings = findings
        self.minimize = minimize
        self.max_stalls = max_stalls
        self.stalls = 0
        self._stub = contextd_pb2_grpc.ContextServiceStub(caller.channel)
        self._slow_policies: set[str] = set()
        self.last: Outcome | None = None
        """The latest call recorded (what a crash or a stall is blamed on)."""
        self.created: set[str] = set()
        """Ids of the sessions fuzzed CreateSession calls made, for `delete_sessions`."""

    @property
    def stalled_out(self) -> bool:
        return self.max_stalls is not None and self.stalls >= self.max_stalls

    def send(self, rpc: str, request: Message, case: str = "message", minimize: bool = True) -> Outcome | None:
        """Send `request`, record the outcome, and shrink it when it fails in a new way; None: not sent,
        the server stalled too often."""
        if self.stalled_out:
            return None
        outcome = self.caller.call(rpc, request.SerializeToString(), case, request)
        return self._record(outcome, minimize)

    def send_raw(self, rpc: str, raw: RawCase) -> Outcome | None:
        if self.stalled_out:
            return None
        return self._record(self.caller.call(rpc, raw.data, raw.label), minimize=False)

    def render_under(self, scenario: PolicyRender) -> None:
        """CreateSession under the drawn policy; when it is taken, append the bait items and render."""
        if scenario.policy in self._slow_policies or self.stalled_out:
            return  # once is enough: a backtracking render freezes an in-process server for seconds
        session_id = f"fuzz-policy-{uuid.uuid4().hex[:16]}"
        create = api.CreateSessionRequest(session_id=session_id, policy=scenario.policy)
        created = self.send("CreateSession", create, "create under a drawn policy", minimize=False)
        if created is None or created.code != "OK":
            return
        self.send("AppendItems", api.AppendItemsRequest(session_id=session_id, items=bait_items()), "bait")
        render = api.RenderViewRequest(
            session_id=session_id,
            format=scenario.view_format,  # type: ignore[arg-type]
            budget_tokens=scenario.budget_tokens,
        )
        rendered = self.caller.call("RenderView", render.SerializeToString(), "render under a drawn policy")
        self._record(replace(rendered, message=create), minimize=False)  # described by its policy
        if rendered.seconds > self.findings.slow_seconds:
            self._slow_policies.add(scenario.policy)
        self.caller.call("DeleteSession", api.DeleteSessionRequest(session_id=session_id).SerializeToString())

    def render_history(self, scenario: HistoryRender) -> None:
        """Append the drawn history to a new session; render it in both formats, search it in every mode,
        retrieve what the views took out."""
        if self.stalled_out:
            return
        session_id = f"fuzz-history-{uuid.uuid4().hex[:16]}"
        self.caller.call("CreateSession", api.CreateSessionRequest(session_id=session_id).SerializeToString())
        append = api.AppendItemsRequest(session_id=session_id, items=scenario.items())
        appended = self.send("AppendItems", append, "append a hostile history", minimize=False)
        if appended is None or appended.code != "OK":
            self.caller.call("DeleteSession", api.DeleteSessionRequest(session_id=session_id).SerializeToString())
            return
        handles: list[str] = []
        for view_format in (api.VIEW_FORMAT_OPENAI_CHAT, api.VIEW_FORMAT_ANTHROPIC_MESSAGES):
            render = api.RenderViewRequest(
                session_id=session_id, format=view_format, budget_tokens=scenario.budget_tokens
            )
            rendered = self.caller.call("RenderView", render.SerializeToString(), "render a hostile history")
            self._record(replace(rendered, message=append), minimize=False)  # described by its history
            if rendered.code == "OK":
                view = api.RenderViewResponse.FromString(rendered.response).view
                handles.extend(item.handle for item in view.items if item.handle)
        outputs = "; ".join(_shape(call.output) for call in scenario.calls)
        for mode in (api.SEARCH_MODE_FULL_TEXT, api.SEARCH_MODE_SUBSTRING, api.SEARCH_MODE_REGEX):
            search = api.SearchRequest(session_id=session_id, query=scenario.pattern, mode=mode)
            self.send("Search", search, f"search a history of outputs: {outputs}", minimize=False)
        for handle in dict.fromkeys(handles[:3]):
            retrieve = api.RetrieveRequest(session_id=session_id, handle=handle, grep=scenario.grep)
            self.send("Retrieve", retrieve, f"retrieve from a history of outputs: {outputs}", minimize=False)
        # The first output (seq 3), never proposed or retracted before: the reason is stored, not skipped.
        propose = api.ProposePruneRequest(session_id=session_id, seqs=[3], reason=scenario.reason)
        self.send("ProposePrune", propose, "propose pruning an output of a fresh session", minimize=False)
        retract = api.RetractItemsRequest(session_id=session_id, seqs=[3], reason=scenario.reason)
        self.send("RetractItems", retract, "retract an output of a fresh session", minimize=False)
        self.caller.call("DeleteSession", api.DeleteSessionRequest(session_id=session_id).SerializeToString())

    def delete_sessions(self) -> None:
        """Delete what the fuzzing left on the server: the sessions it created and the targets."""
        for session_id in {*self.created, self.targets.session_id, self.targets.scratch_id}:
            request = api.DeleteSessionRequest(session_id=session_id).SerializeToString()
            self.caller.call("DeleteSession", request)

    def _record(self, outcome: Outcome, minimize: bool) -> Outcome:
        self.last = outcome
        self.stalls += outcome.code == "DEADLINE_EXCEEDED"
        self._note_created(outcome)
        failure = self.findings.record(outcome)
        self._keep_scratch(outcome)
        # Not a stall: each try would cost a whole deadline.
        shrinkable = outcome.message is not None and outcome.code != "DEADLINE_EXCEEDED"
        if failure is not None and minimize and self.minimize and shrinkable:
            self._minimize(failure)
        return outcome

    def _note_created(self, outcome: Outcome) -> None:
        if outcome.rpc == "CreateSession" and outcome.code == "OK":
            self.created.add(api.CreateSessionResponse.FromString(outcome.response).session.id)

    def _keep_scratch(self, outcome: Outcome) -> None:
        """After a delete that may have taken the scratch session (raw bytes say nothing), create it again
        (a no-op when it is still there)."""
        if outcome.rpc == "DeleteSession" and outcome.code == "OK":
            prepare_scratch(self._stub, self.targets.scratch_id)

    def _minimize(self, failure: Failure) -> None:
        best = failure.first
        budget = self.MINIMIZE_CALLS
        improved = True
        while improved and budget > 0:
            improved = False
            assert best.message is not None
            for candidate in simpler(best.message):
                budget -= 1
                outcome = self.caller.call(best.rpc, candidate.SerializeToString(), best.case, candidate)
                self._note_created(outcome)
                self._keep_scratch(outcome)
                if self.findings.failed(outcome) and self.findings.key(outcome) == failure.key:
                    best, improved = outcome, True
                    break
                if budget <= 0:
                    break
        failure.smallest = best
