"""What the fuzzer sends: hostile requests for every RPC of contextd.v1.ContextService.

tests/service/api/test_fuzz.py sends them for seconds in CI, scripts/fuzz.py for
minutes (docs/fuzz.md); tests/service/api/fuzzing.py sends them and judges the
answers. Requests are built field by field from the protobuf descriptors,
so a new RPC or field is fuzzed without a change here:

* `requests(rpc, targets)`: mostly a baseline request the server accepts
  with one field (drawn, at any depth) set to a hostile value, so the value
  is what the server judges rather than a missing field before it; also the
  baseline itself and fully random messages;
* `sweep(rpc, targets)`: every hand-written hostile value in every field
  that takes it, once, so a short run covers them whatever hypothesis draws;
* `raw_requests(rpc, targets)`: bytes no protobuf library encodes (invalid
  UTF-8 in a string, truncation, garbage, nesting past the decoder's limit);
* two scenarios that need state: a session created under a drawn policy and
  rendered (`policy_renders`, `policy_sweep`), and a history of hostile tool
  outputs rendered, searched and retrieved (`history_renders`,
  `history_sweep`).

Requests aim at `Targets`: sessions `prepare_targets` fills with history,
views, handles and certificates, so sometimes a real id, sometimes garbage.

The hostile values are hand-written for the fields that carry documents
(policies, tools JSON, tool arguments), patterns (grep, a regex search, a
policy rule), ids and page tokens, and generic by type for the rest: huge,
negative and past-the-column integers, unknown enum values, empty, NUL and
megabyte strings, repeated fields past the batch and bind-parameter limits.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import grpc
import yaml
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc

SERVICE = api.DESCRIPTOR.services_by_name["ContextService"]
METHODS: dict[str, MethodDescriptor] = {m.name: m for m in SERVICE.methods}
RPCS = tuple(METHODS)

MAX_REQUEST_BYTES = 4_000_000
"""A generated request stays under this, in serialized bytes (the server takes 16 MiB)."""
MAX_FIELD_BYTES = 2_000_000
"""One huge string, map or repeated field stays under this, in bytes."""
MAX_ITEM_BYTES = 1_000_000
"""A hostile tool output stays under the server's default item limit (1 MiB), so it is stored and rendered."""
MAX_DEPTH = 3
"""Nested messages generated below a request (ContentBlock -> ToolResultBlock -> ContentBlock ...)."""
SETUP_SECONDS = 20.0
"""Deadline of the calls that prepare the targets."""
SWEEP_NESTED_BYTES = 1_000
"""Below the request's own fields, the sweep sends only values up to this size (bytes, or characters)."""
SHORT_SWEEP_NESTED_VALUES = 2
"""A short sweep's values per field below the request's own (the first of each list: the likeliest)."""
SWEEP_EVERY_VARIANT = frozenset({("SearchRequest", "query")})
"""Fields swept with every baseline variant (a pattern in every search mode); the rest take turns."""

# ----------------------------------------------------------------- hostile values

LABELS: dict[str | bytes, str] = {}
"""Hand-written hostile value -> what it is, so a finding names its shape instead of quoting megabytes."""


def hostile(label: str, value: str) -> str:
    LABELS.setdefault(value, label)
    return value


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).decode()


DEEP_JSON_OBJECT = hostile("JSON object nested 10,000 deep", '{"a":' * 10_000 + "1" + "}" * 10_000)
DEEP_JSON_ARRAY = hostile("JSON array nested 100,000 deep", "[" * 100_000 + "]" * 100_000)

JSON_DOCUMENTS = (
    DEEP_JSON_OBJECT,
    DEEP_JSON_ARRAY,
    hostile("JSON array nested 1,000 deep", "[" * 1_000 + "]" * 1_000),
    hostile("unclosed JSON array 100,000 deep", "[" * 100_000),
    hostile("JSON integer of 5,000 digits", '{"n": ' + "9" * 5_000 + "}"),
    hostile("JSON array of one 5,000-digit integer", "[" + "9" * 5_000 + "]"),
    hostile("JSON float overflow 1e999999", '{"x": 1e999999}'),
    hostile("JSON NaN and -Infinity", '{"x": NaN, "y": -Infinity}'),
    hostile("JSON lone surrogate escape", '{"x": "\\ud800", "name": "\\udfff"}'),
    hostile("JSON NUL escape", '{"x": "\\u0000"}'),
    hostile("JSON object of 100,000 keys", "{" + ",".join(f'"k{i}":0' for i in range(100_000)) + "}"),
    hostile("JSON array of 200,000 empty objects", "[" + ",".join(["{}"] * 200_000) + "]"),
    hostile("JSON duplicate keys", '{"a": 1, "a": {"b": 2}}'),
    hostile("JSON with a BOM", '\ufeff{"a": 1}'),
    hostile("JSON with trailing garbage", '{"a": 1} trailing'),
    hostile("not JSON", "not json at all"),
    "",
    "null",
    "[]",
    "{}",
    '"a string"',
    "1",
    "true",
)

TOOLS_ARRAYS = (
    '[{"type": "function", "function": {"name": "bash", "description": "Run a command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]',
    '[{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}]',
    hostile(
        "tools array of 20,000 tools",
        json.dumps([{"type": "function", "function": {"name": f"tool_{i}", "parameters": {}}} for i in range(20_000)]),
    ),
    hostile("tools array with a 100,000-char name", json.dumps([{"name": "t" * 100_000, "input_schema": {}}])),
    '[{"type": "function"}]',
    '[{"function": null}, 1, "x", []]',
)

BACKTRACKING_PATTERNS = (
    r"(a+)+$",
    r"(?:a|a)*b",
    r"(a|aa)+$",
    r"^(\w+\s?)*$",
    r"(a*)*b",
    r"(x+x+)+y",
    r"(.*a){12}$",
    r"([a-z]+)*=",
)

RE2_INVALID_PATTERNS = (
    r"(a)\1",
    r"(?=a)",
    r"(?!a)b",
    r"(?<=a)b",
    r"(?<!a)b",
    r"(?>a+)",
    r"a++",
    r"(?P<n>a)(?P=n)",
    r"\C",
    r"[",
    r"(",
    r")",
    r"*",
    r"a{2,1}",
    "\\",
    r"(?i",
    r"a{1001}",
)

PATTERNS = (
    *BACKTRACKING_PATTERNS,
    *RE2_INVALID_PATTERNS,
    hostile("10,000 nested groups", "(" * 10_000 + "a" + ")" * 10_000),
    r"a{1000}{1000}",
    r"((a{100}){100}){100}",
    hostile("alternation of 100,000 words", "|".join(f"word{i}" for i in range(100_000))),
    hostile("'.*' 1,000 times", ".*" * 1_000),
    r"\x00",
    "\x00",
    "",
    r".*",
    r"x*",
    r"(?s).*",
    r"\p{Greek}+",
    r"[^\x00-\x{10FFFF}]",
    "é+",
    "😀",
    r"^$",
    r"(?m)^",
)

INVALID_UTF8 = (b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80", b"\xf4\x90\x80\x80")
"""Not UTF-8: stray bytes, an overlong NUL, an encoded surrogate, a truncated sequence, past U+10FFFF."""

HOSTILE_SESSION_IDS = (
    "",
    " ",
    hostile("session id of 129 chars", "a" * 129),
    hostile("session id of 257 chars", "a" * 257),
    hostile("session id of 100,000 chars", "s" * 100_000),
    "x\x00y",
    "../../etc/passwd",
    "é",
    "😀",
    "with space",
    "'; DROP TABLE sessions; --",
    "%s%n%x",
    "\u202eevil",
    "\n",
)

FORGED_NUMBERS = ("18446744073709551616", "9223372036854775808", "-1", "9" * 5_000, "1e5", " 1", "+5", "1_0", "²")
"""What a forged page token's number may be: past uint64 and BIGINT, negative, past Python's int() digit
limit, and spellings int() takes or refuses."""

HOSTILE_PAGE_TOKENS = (
    "",
    "garbage",
    "²",
    "¹²³",
    "١٢",
    "0",
    "-1",
    "999999999",
    "9999999999",
    "===",
    "\x00",
    hostile("page token of 10,000 chars", "x" * 10_000),
    _b64(b"\xff\xfe"),
    # This service's token formats (`after:<key>` for sessions, `certificate:<number>`), forged.
    *(_b64(f"{kind}:{number}") for kind in ("after", "certificate") for number in FORGED_NUMBERS),
)

SPECIAL_TEXT = (
    "",
    "\x00",
    "😀" * 8,
    " ",
    "a\x00b",
    "é",
    "\u202eevil",
    "\ufeff",
    "\r\n",
    "null",
    "{}",
    "${jndi:ldap://127.0.0.1/x}",
    "\\u0000",
    "' OR 1=1 --",
)

TOOL_NAMES = ("bash", "read_file", "write_file", "", "memory_*", "*", "t" * 300, "name\x00nul")
URIS = ("file:///repo/src/parse.py", "http://169.254.169.254/latest/meta-data/", "data:,x", "", "not a uri", "file://")
MEDIA_TYPES = ("image/png", "application/pdf", "text/plain", "", "x/" + "y" * 300)
PROVIDERS = ("anthropic", "openai", "google", "", "x" * 300)
TRANSFORMS = ("mask", "dedupe", "same_source", "supersede", "snapshots", "errors", "errored_inputs", "completed")
# model_summary is left out: a policy naming it makes the server call a model endpoint in the background.

# The special values of each type, the likeliest to break something first (a short sweep takes the first few).
U64_SPECIALS = (2**64 - 1, 2**63, 0, 2**63 - 1, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1)
U32_SPECIALS = (2**32 - 1, 2**31, 0, 2**31 - 1, 1)
I32_SPECIALS = (-(2**31), -1, 2**31 - 1, 0, 1)
I64_SPECIALS = (-(2**63), -1, 2**63 - 1, 0, 2**31)
MANY_COUNTS = (1_001, 40_000, 100_000)
"""Counts of a huge repeated field (each capped by MAX_FIELD_BYTES): past the batch limit, past SQL's
bind-parameter limits."""


def _regex_policy(pattern: str) -> str:
    rule = {"name": "hostile", "transform": "mask", "when": {"regex": pattern}}
    document = {"protection": {"last_turns": 0, "user_items": False}, "evidence": {"max_level": 4}, "rules": [rule]}
    return hostile(f"policy rule when.regex {pattern[:30]!r}", yaml.safe_dump(document, width=1_000_000))


def _alias_bomb() -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    return "\n".join(lines) + "\nprotection: {tools: *a8}\n"


POLICY_DOCUMENTS = (
    DEEP_JSON_OBJECT,
    DEEP_JSON_ARRAY,
    hostile("YAML block mappings nested 1,000 deep", "\n".join(" " * n + "a:" for n in range(1_000)) + " 1"),
    hostile("YAML sequences nested 10,000 deep on one line", "- " * 10_000 + "1"),
    hostile("YAML flow mappings nested 10,000 deep", "{a: " * 10_000 + "1" + "}" * 10_000),
    hostile("YAML alias bomb (9^9)", _alias_bomb()),
    hostile("YAML merge key", "base: &b {last_turns: 1}\nprotection: {<<: *b}\n"),
    hostile("YAML python tag", '!!python/object/apply:os.system ["true"]'),
    hostile("YAML custom tag", "protection: !custom {last_turns: 1}"),
    hostile("YAML binary tag", "rules: [{name: !!binary AAAA, transform: mask}]"),
    hostile("YAML timestamp", "rules: [{name: 2001-12-14t21:59:43.10-05:00, transform: mask}]"),
    hostile("YAML two documents", "protection: {last_turns: 1}\n---\nevidence: {max_level: 1}\n"),
    hostile("YAML integer of 5,000 digits", "evidence: {max_level: " + "9" * 5_000 + "}"),
    hostile("YAML .nan and .inf", "cache: {high_water: .nan, expected_calls: .inf}"),
    hostile("a low water of nothing", "cache: {low_water: 0}"),
    hostile("a low water past the budget", "cache: {low_water: 1.5}"),
    hostile("YAML expected_calls 1e300", "cache: {expected_calls: 1e300}"),
    hostile("YAML expected_calls 10**30", "cache: {expected_calls: 1000000000000000000000000000000}"),
    hostile(
        "prices out of range",
        "cache: {prices: {input: 1e400, cache_write: -1, cache_read: 1e-400, ttl_seconds: 1e308}}",
    ),
    hostile("last_turns 2**63", "protection: {last_turns: 9223372036854775808}"),
    hostile("YAML duplicate keys", "protection: {last_turns: 1}\nprotection: {last_turns: 2}\n"),
    hostile("policy of 3 MB (a comment)", "# " + "x" * 3_000_000 + "\nprotection: {last_turns: 1}\n"),
    hostile(
        "policy of 20,000 rules",
        "rules:\n" + "".join(f"  - {{name: r{n}, transform: mask}}\n" for n in range(20_000)),
    ),
    hostile("policy with a NUL", "protection: {last_turns: 1}\x00"),
    hostile("policy with a tab indent", "protection:\n\tlast_turns: 1\n"),
    "[1, 2, 3]",
    "12",
    "null",
    "",
    *(_regex_policy(p) for p in (*BACKTRACKING_PATTERNS, *RE2_INVALID_PATTERNS[:6])),
    _regex_policy("(" * 10_000 + "a" + ")" * 10_000),
)

# ------------------------------------------------------------------------ targets


@dataclass(frozen=True)
class Targets:
    """What fuzzed requests point at on the live server, so they reach past the not-found checks.

    `session_id` has history, views, handles, certificates and a reported call; it is read and steered,
    never updated or deleted. `scratch_id` takes appends, policy updates, retractions and deletes (and is created
    again after one). Neither is rendered under a fuzzed policy: a stalling pattern there would stall
    every later render (the policy scenario uses sessions of its own).
    """

    session_id: str
    scratch_id: str
    handles: tuple[str, ...]
    seqs: tuple[int, ...]
    view_versions: tuple[int, ...]
    tool_use_ids: tuple[str, ...]
    page_tokens: tuple[str, ...]


MAIN_POLICY = (
    "cache: {prices: {input: 3, cache_write: 3.75, cache_read: 0.3, ttl_seconds: 0.000001}}\n"
    "protection: {last_turns: 1}\nevidence: {max_level: 4}\n"
    "rules: [{name: mask-old-outputs, transform: mask, when: {roles: [tool]}}]\n"
)
"""Masks older tool outputs at once (the cache is always cold), so renders leave handles."""


def text_item(role: int, text: str) -> pb.Item:
    return pb.Item(role=role, content=[pb.ContentBlock(text=pb.TextBlock(text=text))])  # type: ignore[arg-type]


def call_item(call_id: str, name: str, arguments: object) -> pb.Item:
    use = pb.ToolUseBlock(id=call_id, name=name, input_json=json.dumps(arguments))
    return pb.Item(role=pb.ROLE_ASSISTANT, content=[pb.ContentBlock(tool_use=use)])


def result_item(call_id: str, output: str, *, is_error: bool = False, source: str = "") -> pb.Item:
    block = pb.ToolResultBlock(
        tool_use_id=call_id, content=[pb.ContentBlock(text=pb.TextBlock(text=output))], is_error=is_error
    )
    item = pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=block)])
    if source:
        item.source.CopyFrom(pb.Source(uri=source, version="v1"))
    return item


def _history(prefix: str) -> list[pb.Item]:
    pytest_output = "\n".join(f"tests/test_parse.py::test_case_{n} PASSED" for n in range(60))
    code = "\n".join(f"def parse_{n}(text):\n    return text.split({n})" for n in range(40))
    return [
        text_item(pb.ROLE_SYSTEM, "You fix bugs in the parser."),
        text_item(pb.ROLE_USER, "test_parse fails; fix it."),
        call_item(f"{prefix}-1", "bash", {"command": "pytest -q tests/test_parse.py"}),
        result_item(
            f"{prefix}-1", pytest_output + "\nFAILED tests/test_parse.py::test_parse - AssertionError", is_error=True
        ),
        call_item(f"{prefix}-2", "read_file", {"path": "src/parse.py"}),
        result_item(f"{prefix}-2", code, source="file:///repo/src/parse.py"),
        call_item(f"{prefix}-3", "write_file", {"path": "src/parse.py", "content": "fixed"}),
        result_item(f"{prefix}-3", "written"),
        call_item(f"{prefix}-4", "bash", {"command": "pytest -q tests/test_parse.py"}),
        result_item(f"{prefix}-4", pytest_output + "\n61 passed"),
        text_item(pb.ROLE_ASSISTANT, "Fixed: parse splits on the separator again."),
        text_item(pb.ROLE_USER, "Thanks; now the lexer."),
    ]


def prepare_scratch(stub: contextd_pb2_grpc.ContextServiceStub, scratch_id: str) -> None:
    """The scratch session, created (again) with a user turn and one open tool call."""
    try:
        stub.CreateSession(api.CreateSessionRequest(session_id=scratch_id), timeout=SETUP_SECONDS)
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.ALREADY_EXISTS:
            raise
    items = [text_item(pb.ROLE_USER, "Scratch work."), call_item(f"{scratch_id}-call", "bash", {"command": "ls"})]
    request = api.AppendItemsRequest(session_id=scratch_id, items=items, idempotency_key=f"{scratch_id}-setup")
    try:
        stub.AppendItems(request, timeout=SETUP_SECONDS)
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.ALREADY_EXISTS:  # the key was used by a fuzzed append
            raise


def prepare_targets(channel: grpc.Channel) -> Targets:
    """Sessions for the fuzzer to aim at, with every kind of state a request can name."""
    stub = contextd_pb2_grpc.ContextServiceStub(channel)
    prefix = f"fuzz-{uuid.uuid4().hex[:10]}"
    main, scratch = f"{prefix}-main", f"{prefix}-scratch"
    stub.CreateSession(
        api.CreateSessionRequest(session_id=main, policy=MAIN_POLICY, metadata={"agent": "fuzz"}),
        timeout=SETUP_SECONDS,
    )
    history = _history(f"{prefix}-call")
    handles: set[str] = set()
    versions = []
    # Two renders with appends before each, so there are outputs masked at each and handles to both.
    for items, view_format in (
        (history[:8], api.VIEW_FORMAT_OPENAI_CHAT),
        (history[8:], api.VIEW_FORMAT_ANTHROPIC_MESSAGES),
    ):
        stub.AppendItems(api.AppendItemsRequest(session_id=main, items=items), timeout=SETUP_SECONDS)
        render = api.RenderViewRequest(session_id=main, format=view_format)
        view = stub.RenderView(render, timeout=SETUP_SECONDS).view
        handles.update(item.handle for item in view.items if item.handle)
        versions.append(view.view_version)
    stub.ReportUsage(
        api.ReportUsageRequest(session_id=main, view_version=versions[0], provider="anthropic", input_tokens=10),
        timeout=SETUP_SECONDS,
    )
    tokens = [
        stub.ListSessions(api.ListSessionsRequest(page_size=1), timeout=SETUP_SECONDS).next_page_token,
        stub.ListCertificates(
            api.ListCertificatesRequest(session_id=main, page_size=1), timeout=SETUP_SECONDS
        ).next_page_token,
        stub.Search(
            api.SearchRequest(session_id=main, query="parse", page_size=1), timeout=SETUP_SECONDS
        ).next_page_token,
    ]
    prepare_scratch(stub, scratch)
    version = stub.GetSession(api.GetSessionRequest(session_id=main), timeout=SETUP_SECONDS).session.version
    return Targets(
        session_id=main,
        scratch_id=scratch,
        handles=tuple(sorted(handles)),
        seqs=tuple(range(1, version + 1)),
        view_versions=tuple(versions),
        tool_use_ids=(*(f"{prefix}-call-{n}" for n in range(1, 5)), f"{scratch}-call"),
        page_tokens=tuple(t for t in tokens if t),
    )


HOSTILE_OUTPUTS = (
    DEEP_JSON_OBJECT,
    DEEP_JSON_ARRAY,
    hostile("JSON array of 50,000 empty objects", "[" + ",".join(["{}"] * 50_000) + "]"),
    hostile("Python nested 1,000 deep", "x = " + "[" * 1_000 + "]" * 1_000 + "\n"),
    hostile("Python of 5,000 functions", "\n".join(f"def f{n}(a, b):\n    return a + b\n" for n in range(5_000))),
    hostile("JavaScript nested 10,000 deep", "function f() {" + "{" * 10_000 + "}" * 10_000 + "}\n"),
    hostile("HTML nested 10,000 deep", "<html><body>" + "<div>" * 10_000 + "x" + "</div>" * 10_000),
    hostile("log of 5,000 lines", "\n".join(f"2025-01-01T00:00:00Z INFO worker {n} step done" for n in range(5_000))),
    hostile("one line of 300,000 chars", "x" * 300_000),
    hostile("diff of 5,000 hunks", "".join(f"@@ -{n},1 +{n},1 @@\n-old {n}\n+new {n}\n" for n in range(5_000))),
    hostile(
        "grep output of 5,000 matches", "\n".join(f"src/m{n % 97}.py:{n}:    match = find()" for n in range(5_000))
    ),
    hostile(
        "pytest output of 3,000 failures",
        "\n".join(f"FAILED tests/t.py::test_{n} - AssertionError" for n in range(3_000)),
    ),
    hostile("ANSI escapes and control characters", "\x1b[31mred\x1b[0m\x07\x08\r" * 5_000),
    hostile("100,000 NULs", "\x00" * 100_000),
    hostile("backtracking bait", "a" * 25 + "!"),
    hostile("an exit status of 5,000 digits", "make: *** [all] Error 1\nexit code " + "9" * 5_000 + "\n"),
)
"""Tool outputs for the compressors and strategies a render runs on older outputs: hostile by structure
(nesting, line counts, one endless line), a few hundred kilobytes at most, so counting their tokens at
append stays cheap (megabyte strings are swept elsewhere)."""

HOSTILE_COMMANDS = (
    "head -n " + "9" * 5_000 + " src/a.py",
    "sed -n '1," + "9" * 5_000 + "p' src/a.py",
    "nl -ba src/a.py | sed -n '" + "9" * 5_000 + "p'",
    "head -n \u00b2 src/a.py",
)
"""Shell commands whose numbers are no line count: past `int()`'s 4,300 digits, or a digit it does not read."""

# --------------------------------------------------------------------- strategies

_U64 = frozenset({FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64})
_U32 = frozenset({FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32})
_I32 = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32})
_I64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64})
_INTEGERS: tuple[tuple[frozenset[int], tuple[int, ...], int, int], ...] = (
    (_U64, U64_SPECIALS, 0, 2**64 - 1),
    (_U32, U32_SPECIALS, 0, 2**32 - 1),
    (_I32, I32_SPECIALS, -(2**31), 2**31 - 1),
    (_I64, I64_SPECIALS, -(2**63), 2**63 - 1),
)

SCRATCH_RPCS = frozenset({"AppendItems", "UpdateSession", "DeleteSession", "RetractItems"})
"""RPCs whose real target is the scratch session; the rest aim at the main one (CreateSession at none)."""


def real_session(rpc: str, targets: Targets) -> str:
    if rpc == "CreateSession":
        return ""  # the server picks an id
    return targets.scratch_id if rpc in SCRATCH_RPCS else targets.session_id


def _fresh(prefix: str) -> st.SearchStrategy[str]:
    return st.uuids().map(lambda u: f"{prefix}-{u.hex[:16]}")


def _huge_text(unit: str, count: int) -> str:
    return unit * min(count, MAX_FIELD_BYTES // len(unit.encode()))


def _size(element: Any) -> int:
    """Bytes `element` takes in a request, roughly."""
    if isinstance(element, dict):
        return sum(_size(k) + _size(v) for k, v in element.items())
    if isinstance(element, Message):
        return element.ByteSize() + 4
    if isinstance(element, str):
        return len(element.encode()) + 4
    if isinstance(element, bytes):
        return len(element) + 4
    return 11


def _many(element: Any, count: int) -> list[Any]:
    """`count` copies of `element`, fewer when they would pass MAX_FIELD_BYTES."""
    return [element] * min(count, MAX_FIELD_BYTES // _size(element))


def _numbered(element: Any, count: int) -> list[Any]:
    """`count` distinct values like `element` (names with a number after them, consecutive integers)."""
    if isinstance(element, str):
        return [f"{element}{n}" for n in range(min(count, MAX_FIELD_BYTES // (_size(element) + 6)))]
    if isinstance(element, int) and not isinstance(element, bool):
        return list(range(count))
    return _many(element, count)


def plain_texts() -> st.SearchStrategy[str]:
    return st.text(max_size=40)


def hostile_texts() -> st.SearchStrategy[str]:
    """Special characters, and megabytes of one character."""
    units = st.sampled_from(["a", "é", "\x00", "😀", "\n", "a\n", "ab"])
    huge = st.builds(_huge_text, units, st.sampled_from([10_000, 300_000, 1_000_000]))
    return st.one_of(st.sampled_from(SPECIAL_TEXT), huge)


def json_texts() -> st.SearchStrategy[str]:
    leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    values = st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    )
    return values.map(json.dumps)


def patterns() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(PATTERNS), st.text(max_size=20))


def policies() -> st.SearchStrategy[str]:
    """Policy documents: hand-written hostile ones, and ones built from the schema's keys with any values."""
    junk = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    )
    numbers = st.one_of(st.integers(-(2**64), 2**64), st.floats(), st.sampled_from([0, -1, 10**30, 1e308]))
    globs = st.lists(st.sampled_from(["*", "bash", "memory_*", "[", "**/*", "file:///*"]) | st.text(max_size=8))
    interval = st.fixed_dictionaries({}, optional={"min": numbers, "max": numbers})
    when = st.fixed_dictionaries(
        {},
        optional={
            "roles": st.lists(st.sampled_from(["system", "user", "assistant", "tool", "robot"])),
            "tools": st.fixed_dictionaries({}, optional={"include": globs, "exclude": globs}),
            "content_types": st.lists(st.sampled_from(["text", "tool_use", "tool_result", "image", "x"])),
            "tokens": interval,
            "age_turns": interval,
            "utilization": interval,
            "regex": patterns(),
            "source_glob": st.sampled_from(["file:///*", "[", "*"]),
            "pinned": st.booleans(),
        },
    )
    rule = st.fixed_dictionaries(
        {"name": st.text(max_size=12) | st.just("r"), "transform": st.sampled_from(TRANSFORMS) | st.text(max_size=8)},
        optional={"params": st.dictionaries(st.text(max_size=8), junk, max_size=3), "when": when | junk},
    )
    tool = st.fixed_dictionaries(
        {},
        optional={
            "effect": st.sampled_from(["read", "write", "pure", "volatile", "shell", "x"]),
            "source_arg": st.text(max_size=8),
            "command_arg": st.text(max_size=8),
            "content": st.sampled_from(["log", "test", "json", "code", "x"]),
        },
    )
    prices = st.dictionaries(st.sampled_from(["input", "cache_write", "cache_read", "ttl_seconds"]), numbers)
    document = st.fixed_dictionaries(
        {},
        optional={
            "protection": st.fixed_dictionaries(
                {}, optional={"last_turns": numbers, "user_items": st.booleans(), "tools": globs, "sources": globs}
            ),
            "evidence": st.fixed_dictionaries({}, optional={"max_level": numbers, "compression": junk}),
            "cache": st.fixed_dictionaries(
                {},
                optional={
                    "provider": st.sampled_from(["anthropic", "openai", "google", "x"]),
                    "prices": prices,
                    "expected_calls": numbers | st.just("auto"),
                    "high_water": numbers,
                    "low_water": numbers,
                    "reads": st.sampled_from(["breakpoints", "prefix", "x"]),
                },
            ),
            "tools": st.dictionaries(st.sampled_from(TOOL_NAMES) | st.text(max_size=8), tool | junk, max_size=3),
            "rules": st.lists(rule, max_size=4),
        },
    )
    spelled = st.one_of(
        document.map(json.dumps), document.map(lambda d: yaml.safe_dump(d, allow_unicode=True, width=1_000_000))
    )
    hand_written = st.sampled_from(POLICY_DOCUMENTS)
    return st.one_of(hand_written, hand_written, spelled, plain_texts())


def _owner(field: FieldDescriptor) -> Descriptor:
    owner = field.containing_type
    assert owner is not None
    return owner


def _named(field: FieldDescriptor) -> tuple[str, str]:
    """(message name, field name): how the tables here name a field."""
    return _owner(field).name, field.name


def _message_type(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None, field.full_name
    return field.message_type


def _enum_numbers(field: FieldDescriptor) -> list[int]:
    assert field.enum_type is not None, field.full_name
    return [v.number for v in field.enum_type.values]


def request_type(rpc: str) -> Descriptor:
    descriptor = METHODS[rpc].input_type
    assert descriptor is not None
    return descriptor


HUGE_TEXTS = ("a" * 1_000_000, "😀" * 250_000)
"""The megabyte strings every string field is swept with (the generated ones vary the character and size)."""
HOSTILE_BYTES = (b"", b"\xff\xfe", b"\x00" * 16, b"\xff" * 1_000_000)
HOSTILE_FLOATS = (float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324)


def _huge_maps() -> tuple[dict[str, str], ...]:
    return (
        {"": ""},
        {"\x00": "x"},
        {"k" * 100_000: "v"},
        {f"k{n}": "v" for n in range(10_000)},
        {"k": "v" * 1_000_000},
    )


Choices = tuple[tuple[Any, ...], st.SearchStrategy[Any] | None]
"""The hand-written hostile values of a field (elements, for a repeated one), and a strategy of more."""


@cache
def hostile_choices(rpc: str, field: FieldDescriptor, targets: Targets) -> Choices:
    """What a leaf field (not a nested message) is fuzzed with: by its name where it carries meaning,
    by its type otherwise."""
    owner, name = _named(field)
    named: dict[tuple[str, str], Choices] = {
        ("*", "session_id"): ((*HOSTILE_SESSION_IDS, "fuzz-missing-session"), plain_texts()),
        ("*", "policy"): (POLICY_DOCUMENTS, None),
        ("*", "tools_json"): ((*JSON_DOCUMENTS, *TOOLS_ARRAYS[2:]), None),
        ("*", "input_json"): (JSON_DOCUMENTS, json_texts()),
        ("*", "grep"): (PATTERNS, st.text(max_size=20)),
        ("SearchRequest", "query"): (PATTERNS, st.text(max_size=20)),
        ("*", "page_token"): (HOSTILE_PAGE_TOKENS, None),
        ("*", "tool_use_id"): ((*targets.tool_use_ids, *SPECIAL_TEXT, "call-unknown"), hostile_texts()),
        ("ToolUseBlock", "id"): ((*targets.tool_use_ids, *SPECIAL_TEXT), hostile_texts()),
        ("ToolUseBlock", "name"): (TOOL_NAMES, hostile_texts()),
        ("ToolResultBlock", "name"): (TOOL_NAMES, hostile_texts()),
        ("SearchRequest", "tools"): (TOOL_NAMES, hostile_texts()),
        ("TextBlock", "text"): ((*HOSTILE_OUTPUTS, *SPECIAL_TEXT), hostile_texts()),
        ("DocumentBlock", "text"): ((*HOSTILE_OUTPUTS, *SPECIAL_TEXT), hostile_texts()),
        ("*", "uri"): ((*URIS, *HUGE_TEXTS[:1]), hostile_texts()),
        ("*", "media_type"): (MEDIA_TYPES, None),
        ("*", "provider"): ((*PROVIDERS, *HUGE_TEXTS[:1]), hostile_texts()),
    }
    found = named.get((owner, name)) or named.get(("*", name))
    if found is not None:
        return found
    if _is_map(field):
        return _huge_maps(), None
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return (*SPECIAL_TEXT, *HUGE_TEXTS), hostile_texts()
    if kind == FieldDescriptor.TYPE_BYTES:
        return HOSTILE_BYTES, None
    if kind == FieldDescriptor.TYPE_BOOL:
        return (True,), None  # not hostile, but a flag opens code paths the baseline does not take
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return HOSTILE_FLOATS, None
    if kind == FieldDescriptor.TYPE_ENUM:
        known = _enum_numbers(field)
        unknown = st.integers(-(2**31), 2**31 - 1).filter(lambda n: n not in known)
        return (max(known) + 1, -1, 2**31 - 1, -(2**31)), unknown
    for kinds, specials, low, high in _INTEGERS:
        if kind in kinds:
            return specials, st.integers(low, high)
    raise TypeError(f"no hostile values for {field.full_name} (type {kind})")


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_message(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field)


def _real_oneofs(descriptor: Descriptor) -> list[Any]:
    """The declared oneofs, without the synthetic ones proto3 `optional` makes (`_policy` for `policy`)."""
    return [o for o in descriptor.oneofs if not (len(o.fields) == 1 and o.name == "_" + o.fields[0].name)]


def _new(descriptor: Any) -> Message:
    built: Message = message_factory.GetMessageClass(descriptor)()
    return built


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    """Set one field of `message` to `value`, whatever its kind (a oneof member clears the others)."""
    if _is_map(field):
        target = getattr(message, field.name)
        target.clear()
        target.update(value)
    elif field.is_repeated:
        target = getattr(message, field.name)
        del target[:]
        target.extend(value)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _with(base: Message, field: FieldDescriptor, value: Any) -> Message:
    built = _new(base.DESCRIPTOR)
    built.CopyFrom(base)
    _set(built, field, value)
    return built


def _plain_scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return plain_texts()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, allow_infinity=False, width=64 if kind == FieldDescriptor.TYPE_DOUBLE else 32)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from(_enum_numbers(field))
    for kinds, _, low, high in _INTEGERS:
        if kind in kinds:
            return st.integers(max(low, 0), min(high, 10_000))
    raise TypeError(f"no strategy for {field.full_name} (type {kind})")


def _plain_override(rpc: str, field: FieldDescriptor, targets: Targets) -> st.SearchStrategy[Any] | None:
    """Realistic values of the fields a generic value would rarely get right (an element, for a repeated one)."""
    owner, name = _named(field)
    if name == "session_id" and rpc == "CreateSession":  # new ids, and one in use (ALREADY_EXISTS)
        return st.one_of(st.just(""), _fresh("fuzz-new"), st.just(targets.session_id))
    if name == "session_id":
        return st.just(real_session(rpc, targets))
    if name == "policy":
        return policies()
    if name in ("tools_json", "input_json"):
        return st.one_of(st.sampled_from(TOOLS_ARRAYS[:2]), json_texts())
    if name == "grep" or (owner, name) == ("SearchRequest", "query"):
        return patterns()
    if (owner, name) == ("RetrieveRequest", "handle"):
        return st.sampled_from(targets.handles or ("",))
    if name == "page_token":
        return st.sampled_from(targets.page_tokens or ("",))
    if field.type in _U64 | _U32 and name in ("seq", "seqs", "min_seq", "max_seq"):
        return st.sampled_from(targets.seqs)
    if field.type in _U64 and name in ("view_version", "since_version", "expected_version"):
        return st.sampled_from((*targets.view_versions, len(targets.seqs)))
    if name == "tool_use_id":
        return st.sampled_from(targets.tool_use_ids)
    if (owner, name) == ("ToolUseBlock", "id"):
        return _fresh("call")
    if (owner, name) in (("ToolUseBlock", "name"), ("ToolResultBlock", "name"), ("SearchRequest", "tools")):
        return st.sampled_from(TOOL_NAMES[:3])
    if name in ("uri", "media_type", "provider"):
        return st.sampled_from({"uri": URIS, "media_type": MEDIA_TYPES, "provider": PROVIDERS}[name][:3])
    return None


def _good(rpc: str, descriptor: Descriptor, targets: Targets) -> dict[str, Any]:
    """Field values that make a message of `descriptor` one the server accepts (by message and field name)."""
    text = pb.ContentBlock(text=pb.TextBlock(text="More work on the parser."))
    values: dict[tuple[str, str], Any] = {
        ("SearchRequest", "query"): "parse",
        ("RetrieveRequest", "handle"): targets.handles[0] if targets.handles else "",
        ("ReportUsageRequest", "provider"): "anthropic",
        ("ReportUsageRequest", "view_version"): targets.view_versions[-1],
        ("ReportUsageRequest", "input_tokens"): 100,
        ("ExplainItemRequest", "seq"): 1,
        ("PinRequest", "seqs"): [2],
        ("UnpinRequest", "seqs"): [2],
        ("ProposePruneRequest", "seqs"): [4],
        ("RetractItemsRequest", "seqs"): [1],
        ("ListSessionsRequest", "page_size"): 5,
        ("AppendItemsRequest", "items"): [text_item(pb.ROLE_USER, "More work on the parser.")],
        ("Item", "role"): pb.ROLE_USER,
        ("Item", "content"): [text],
        ("ContentBlock", "text"): text.text,
        ("TextBlock", "text"): "More work on the parser.",
        ("ToolUseBlock", "id"): f"call-{uuid.uuid4().hex[:12]}",
        ("ToolUseBlock", "name"): "bash",
        ("ToolUseBlock", "input_json"): '{"command": "ls"}',
        ("ToolResultBlock", "tool_use_id"): targets.tool_use_ids[-1],
        ("ToolResultBlock", "content"): [text],
        ("ImageBlock", "media_type"): "image/png",
        ("ImageBlock", "data"): b"\x89PNG\r\n\x1a\n",
        ("DocumentBlock", "media_type"): "text/plain",
        ("DocumentBlock", "text"): "A document.",
        ("ReasoningBlock", "text"): "Thinking it over.",
        ("Source", "uri"): "file:///repo/src/parse.py",
        ("ToolEffect", "kind"): pb.TOOL_EFFECT_KIND_READ,
        ("ToolEffect", "source_arg"): "path",
    }
    good = {}
    for f in descriptor.fields:
        if (descriptor.name, f.name) in values:
            good[f.name] = values[descriptor.name, f.name]
        elif f.name == "session_id":
            good[f.name] = real_session(rpc, targets)
    return good


def _enum_variants(descriptor: Descriptor, good: dict[str, Any]) -> list[dict[str, int]]:
    """The known non-zero values of each enum field `good` leaves open: one dict per value of the
    enum with the most, the others cycling."""
    enums = {
        f.name: [n for n in _enum_numbers(f) if n] or [0]
        for f in descriptor.fields
        if f.type == FieldDescriptor.TYPE_ENUM and not f.is_repeated and f.name not in good
    }
    count = max((len(values) for values in enums.values()), default=1)
    return [{name: values[n % len(values)] for name, values in enums.items()} for n in range(count)]


@cache
def baseline_variants(rpc: str, descriptor: Descriptor, targets: Targets) -> tuple[Message, ...]:
    """Messages of `descriptor` the server accepts: the good values, with each enum at each of its known
    values in turn (a regex search and a full-text one, an OpenAI view and an Anthropic one)."""
    good = _good(rpc, descriptor, targets)
    variants = []
    for enums in _enum_variants(descriptor, good):
        built = _new(descriptor)
        for name, value in {**good, **enums}.items():
            _set(built, descriptor.fields_by_name[name], value)
        variants.append(built)
    return tuple(variants)


def baselines(rpc: str, descriptor: Descriptor, targets: Targets) -> st.SearchStrategy[Message]:
    return st.sampled_from(baseline_variants(rpc, descriptor, targets))


def _repeat_counts(plain: Any) -> list[list[Any]]:
    """A repeated field past the batch limit (the same element) and past the bind-parameter limits
    (distinct elements where the type has a way to number them)."""
    return [_many(plain, MANY_COUNTS[0]), _numbered(plain, MANY_COUNTS[1])]


@cache
def hostile_value(rpc: str, field: FieldDescriptor, targets: Targets, depth: int) -> st.SearchStrategy[Any] | None:
    """Hostile values of one field (a list for a repeated one, a dict for a map); None: none to give."""
    if _is_message(field):
        if depth >= MAX_DEPTH:
            return None
        element = st.one_of(
            hostile_message(rpc, _message_type(field), targets, depth + 1),
            message(rpc, _message_type(field), targets, depth + 1),
        )
        if _named(field) == ("AppendItemsRequest", "items"):
            element = st.one_of(st.sampled_from(hostile_items(targets)), element)
    else:
        listed, more = hostile_choices(rpc, field, targets)
        element = st.sampled_from(listed) if more is None else st.one_of(st.sampled_from(listed), more)
    if _is_map(field) or not field.is_repeated:
        return element
    counts = st.sampled_from(MANY_COUNTS)
    plain = _plain_element(rpc, field, targets)
    return st.one_of(
        st.lists(element, min_size=1, max_size=3),
        st.builds(_many, element, counts),
        st.builds(_many, plain, counts),
        st.builds(_numbered, plain, counts),
    )


def _plain_element(rpc: str, field: FieldDescriptor, targets: Targets) -> st.SearchStrategy[Any]:
    override = _plain_override(rpc, field, targets)
    if override is not None:
        return override
    if _is_message(field):
        return baselines(rpc, _message_type(field), targets)
    if _is_map(field):
        key, value = (_message_type(field).fields_by_name[n] for n in ("key", "value"))
        return st.dictionaries(_plain_scalar(key), _plain_scalar(value), max_size=3)
    return _plain_scalar(field)


@cache
def hostile_message(rpc: str, descriptor: Descriptor, targets: Targets, depth: int = 0) -> st.SearchStrategy[Message]:
    """A baseline message of `descriptor` with one field set to a hostile value (for a nested message field,
    a baseline of its own with one hostile field, and so on down)."""
    choices = [(f, hostile_value(rpc, f, targets, depth)) for f in descriptor.fields]
    fields = [(f, values) for f, values in choices if values is not None]
    if not fields:
        return baselines(rpc, descriptor, targets)
    pick = st.sampled_from(fields).flatmap(lambda fv: st.tuples(st.just(fv[0]), fv[1]))
    return st.builds(lambda base, fv: _with(base, *fv), baselines(rpc, descriptor, targets), pick)


@cache
def message(rpc: str, descriptor: Descriptor, targets: Targets, depth: int = 0) -> st.SearchStrategy[Message]:
    """Fully random messages of `descriptor`: each field set or not, to a plain or a hostile value, at most
    one member of each oneof."""
    oneof_members = {f.name for o in _real_oneofs(descriptor) for f in o.fields}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in descriptor.fields:
        if _is_message(f) and depth >= MAX_DEPTH:
            continue
        plain = _plain_element(rpc, f, targets)
        if f.is_repeated and not _is_map(f):
            plain = st.lists(plain, max_size=3)
        hostile_values = hostile_value(rpc, f, targets, depth)
        values = plain if hostile_values is None else st.one_of(plain, hostile_values)
        if f.name in oneof_members:
            key = f"oneof:{f.containing_oneof.name}"  # type: ignore[union-attr]  # a member of one
            optional[key] = optional.get(key, st.nothing()) | st.tuples(st.just(f), values)
        else:
            optional[f.name] = values

    def build(drawn: dict[str, Any]) -> Message:
        built = _new(descriptor)
        for name, value in drawn.items():
            if name.startswith("oneof:"):
                _set(built, *value)
            else:
                _set(built, descriptor.fields_by_name[name], value)
        return built

    return st.fixed_dictionaries({}, optional=optional).map(build)


@cache
@cache
def hostile_items(targets: Targets, short: bool = False) -> tuple[pb.Item, ...]:
    """Items a real agent could send, one part hostile: a text, a call's arguments, name or id, a result's
    call id or output. `short`: the first few special strings only."""
    special = SPECIAL_TEXT[:SHORT_SWEEP_NESTED_VALUES] if short else SPECIAL_TEXT
    outputs = (*special, HOSTILE_OUTPUTS[-1])  # the hostile outputs proper are history_renders' business
    return (
        *(text_item(pb.ROLE_USER, text) for text in (*special, *HUGE_TEXTS[:1])),
        *(_call(f"call-{n}", "bash", arguments) for n, arguments in enumerate(JSON_DOCUMENTS)),
        *(_call(f"call-name-{n}", name, "{}") for n, name in enumerate(TOOL_NAMES)),
        *(_call(call_id, "bash", "{}") for call_id in (*targets.tool_use_ids, *special)),
        *(result_item(targets.tool_use_ids[-1], output, is_error=n % 2 == 1) for n, output in enumerate(outputs)),
        *(result_item(call_id, "ok") for call_id in (*targets.tool_use_ids[:-1], *special, "call-unknown")),
    )


def _call(call_id: str, name: str, arguments: str) -> pb.Item:
    use = pb.ToolUseBlock(id=call_id, name=name, input_json=arguments)
    return pb.Item(role=pb.ROLE_ASSISTANT, content=[pb.ContentBlock(tool_use=use)])


def _fit(request: Message) -> Message:
    """`request` with its largest fields cleared until it is under MAX_REQUEST_BYTES."""
    while request.ByteSize() > MAX_REQUEST_BYTES:
        sizes = []
        for field_descriptor, _ in request.ListFields():
            trial = _new(request.DESCRIPTOR)
            trial.CopyFrom(request)
            trial.ClearField(field_descriptor.name)
            sizes.append((trial.ByteSize(), field_descriptor.name))
        request.ClearField(min(sizes)[1])
    return request


def requests(rpc: str, targets: Targets) -> st.SearchStrategy[Message]:
    """Request messages of `rpc`, each under MAX_REQUEST_BYTES: mostly a baseline with one hostile field,
    sometimes the baseline alone or a fully random message."""
    descriptor = request_type(rpc)
    one_hostile = hostile_message(rpc, descriptor, targets)
    return st.one_of(
        one_hostile, one_hostile, one_hostile, baselines(rpc, descriptor, targets), message(rpc, descriptor, targets)
    ).map(_fit)


# -------------------------------------------------------------------------- sweep


def _sweep_values(rpc: str, field: FieldDescriptor, targets: Targets, depth: int, short: bool) -> Iterator[Any]:
    """Every hand-written hostile value of one field (a list for a repeated one), then its nested
    messages' values, each inside a baseline of its own."""
    if _is_message(field):
        if depth >= MAX_DEPTH:
            return
        if _named(field) == ("AppendItemsRequest", "items"):
            yield from ([item] for item in hostile_items(targets, short))
        for nested in sweep_message(rpc, _message_type(field), targets, depth + 1, short):
            yield [nested] if field.is_repeated else nested
        plain: Any = baseline_variants(rpc, _message_type(field), targets)[0]
    else:
        listed, _ = hostile_choices(rpc, field, targets)
        if depth > 0:  # the big documents go in at the top, and in hostile_items; nested, the cheap ones
            listed = tuple(v for v in listed if _size(v) <= SWEEP_NESTED_BYTES)
            listed = listed[:SHORT_SWEEP_NESTED_VALUES] if short else listed
        yield from ([value] if field.is_repeated and not _is_map(field) else value for value in listed)
        plain = _plain_repeated_element(rpc, field, targets) if field.is_repeated else None
    if field.is_repeated and not _is_map(field):
        yield from _repeat_counts(plain)


def _plain_repeated_element(rpc: str, field: FieldDescriptor, targets: Targets) -> Any:
    """An element the server would take in a repeated scalar field, to repeat past the limits."""
    good = _good(rpc, _owner(field), targets).get(field.name)
    if good:
        return good[0]
    if field.type == FieldDescriptor.TYPE_ENUM:
        return next((n for n in _enum_numbers(field) if n), 0)
    return {FieldDescriptor.TYPE_STRING: "bash", FieldDescriptor.TYPE_BYTES: b"x"}.get(field.type, 1)


def sweep_message(
    rpc: str, descriptor: Descriptor, targets: Targets, depth: int = 0, short: bool = False
) -> Iterator[Message]:
    """Baselines of `descriptor`, each with one field set to one hand-written hostile value: every value
    of every field, nested ones included, the baseline's enum variants taking turns."""
    variants = baseline_variants(rpc, descriptor, targets)
    turn = 0
    for field in descriptor.fields:
        every_variant = (descriptor.name, field.name) in SWEEP_EVERY_VARIANT
        for value in _sweep_values(rpc, field, targets, depth, short):
            for base in variants if every_variant else [variants[turn % len(variants)]]:
                yield _with(base, field, value)
            turn += 1


def sweep(rpc: str, targets: Targets, short: bool = False) -> Iterator[Message]:
    """`sweep_message` for `rpc`'s request: what a small run must cover whatever hypothesis draws.

    `short` (the CI test) sends every value of the request's own fields but only the first few of the
    fields of the messages inside it."""
    for request in sweep_message(rpc, request_type(rpc), targets, short=short):
        yield _fit(request)


# ---------------------------------------------------------------- raw wire bytes

FieldPath = tuple[FieldDescriptor, ...]


@dataclass(frozen=True)
class RawCase:
    label: str
    data: bytes


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        if not number:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


def _nest(path: Sequence[FieldDescriptor], payload: bytes) -> bytes:
    """`payload` as the content of the last field of `path`, inside the messages of the fields before it."""
    for f in reversed(path):
        payload = _delimited(f.number, payload)
    return payload


def string_paths(descriptor: Descriptor, depth: int = MAX_DEPTH) -> list[FieldPath]:
    """Every path of fields from `descriptor` to a string field, map keys and values included."""
    paths: list[FieldPath] = []
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            paths.append((f,))
        elif f.type == FieldDescriptor.TYPE_MESSAGE and depth > 0:
            paths.extend((f, *sub) for sub in string_paths(_message_type(f), depth - 1))
    return paths


def recursive_path(descriptor: Descriptor) -> tuple[FieldPath, FieldPath] | None:
    """(prefix, loop): the fields from `descriptor` to a message type that contains itself, and the loop."""

    def search(node: Descriptor, trail: FieldPath, seen: tuple[str, ...]) -> tuple[FieldPath, FieldPath] | None:
        for f in node.fields:
            if f.type != FieldDescriptor.TYPE_MESSAGE or _is_map(f):
                continue
            name = _message_type(f).full_name
            if name in seen:
                start = seen.index(name)
                return trail[:start], (*trail[start:], f)
            found = search(_message_type(f), (*trail, f), (*seen, name))
            if found:
                return found
        return None

    return search(descriptor, (), (descriptor.full_name,))


def path_name(path: Sequence[FieldDescriptor]) -> str:
    return ".".join(f.name for f in path)


GARBAGE = (
    b"\xff" * 16,
    b"\x0a\xff\xff\xff\xff\x0f",  # field 1, length 4 GiB
    b"\x08" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
    b"\x0b",  # an unclosed group
    b"\x0c",  # an end-group without a start
    b"\x0f",  # wire type 7
    b"\x00\x00",  # field number 0
    b"\x0b" * 100_000 + b"\x0c" * 100_000,  # groups nested 100,000 deep
)

UNKNOWN_FIELDS = b"".join(
    [
        _tag(1000, 0) + _varint(2**64 - 1),
        _tag(1001, 1) + b"\x00" * 8,
        _delimited(1002, b"x" * 1000),
        _tag(1003, 3) + _tag(1, 0) + b"\x01" + _tag(1003, 4),
        _tag(1004, 5) + b"\x00" * 4,
    ]
)
"""Fields the API does not declare, one of each wire type (a group included): a decoder skips them."""


def _truncated(data: bytes, cut: int) -> RawCase:
    return RawCase(f"truncated at {cut} of {len(data)} bytes", data[:cut])


def _invalid_utf8(data: bytes, path: FieldPath, bad: bytes) -> RawCase:
    return RawCase(f"invalid UTF-8 {bad!r} in {path_name(path)}", data + _nest(path, bad))


def _varint_for_string(data: bytes, path: FieldPath) -> RawCase:
    wrong = _nest(path[:-1], _tag(path[-1].number, 0) + b"\x01")
    return RawCase(f"a varint where {path_name(path)} (a string) goes", data + wrong)


def _garbage(data: bytes) -> RawCase:
    return RawCase(f"garbage {data[:12]!r}{'...' if len(data) > 12 else ''}", data)


def raw_requests(rpc: str, targets: Targets) -> st.SearchStrategy[RawCase]:
    """Bytes for `rpc` that no protobuf library would encode, each labelled with what was done.

    A field appended after a valid message's bytes wins over (or, repeated, adds to) the one inside, so an
    invalid field reaches the decoder whatever else the message holds."""
    descriptor = request_type(rpc)
    valid = baselines(rpc, descriptor, targets).map(lambda m: m.SerializeToString())
    cases = [
        st.builds(
            lambda data, cut: _truncated(data, 1 + cut % (len(data) - 1)),
            valid.filter(lambda data: len(data) > 1),
            st.integers(0, 10**6),
        ),
        st.builds(lambda data: RawCase(f"{len(data)} random bytes", data), st.binary(min_size=1, max_size=256)),
        st.sampled_from([_garbage(g) for g in GARBAGE]),
        valid.map(lambda data: RawCase("unknown fields of every wire type", data + UNKNOWN_FIELDS)),
    ]
    paths = string_paths(descriptor)
    if paths:
        cases.append(st.builds(_invalid_utf8, valid, st.sampled_from(paths), st.sampled_from(INVALID_UTF8)))
        cases.append(st.builds(_varint_for_string, valid, st.sampled_from(paths)))
    loop = recursive_path(descriptor)
    if loop:
        prefix, cycle = loop

        def nested(times: int) -> RawCase:
            payload = b""
            for _ in range(times):
                payload = _nest(cycle, payload)
            return RawCase(f"{path_name(cycle)} nested {times} times", _nest(prefix, payload))

        cases.append(st.builds(nested, st.sampled_from([10, 40, 60, 200, 10_000])))
    return st.one_of(*cases)


# --------------------------------------------------------------------- scenarios

BAIT_RUN = 25
"""Length of the run of 'a' before a '!' in a bait output: `(a+)+$` takes ~2**25 steps on it (seconds
with Python's `re`, not forever), so a stalling policy shows as a slow render without hanging the
process (an in-process server holds the GIL while it backtracks)."""


def bait_items() -> list[pb.Item]:
    """A short session whose outputs give backtracking patterns something to chew on."""
    failure = "FAILED tests/test_parse.py::test_parse\nx=aaaa, y=bbbb\n" + "a" * BAIT_RUN + "!"
    return [
        text_item(pb.ROLE_USER, "Fix the parser."),
        call_item("bait-1", "bash", {"command": "pytest -q"}),
        result_item("bait-1", failure, is_error=True),
        call_item("bait-2", "read_file", {"path": "src/parse.py"}),
        result_item("bait-2", "def parse(text):\n    return text.split(',')\n", source="file:///repo/src/parse.py"),
        text_item(pb.ROLE_ASSISTANT, "The split is wrong."),
        text_item(pb.ROLE_USER, "Go on."),
    ]


@dataclass(frozen=True)
class PolicyRender:
    """CreateSession under `policy`, the bait items appended, then RenderView."""

    policy: str
    view_format: int
    budget_tokens: int


def policy_renders() -> st.SearchStrategy[PolicyRender]:
    return st.builds(
        PolicyRender,
        policies(),
        st.sampled_from([api.VIEW_FORMAT_OPENAI_CHAT, api.VIEW_FORMAT_ANTHROPIC_MESSAGES]),
        st.sampled_from([0, 50, 100_000, 2**63 - 1]),
    )


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    output: str
    is_error: bool


@dataclass(frozen=True)
class HistoryRender:
    """A session (default policy) of hostile tool calls and outputs, rendered in both formats, searched with
    `pattern` in every mode, and its originals retrieved by handle with `grep`; its first output then proposed
    for pruning and retracted, each with `reason` (stored with what it explains, on a fresh item each time)."""

    calls: tuple[ToolCall, ...]
    budget_tokens: int
    pattern: str
    grep: str
    reason: str = "done"

    def items(self) -> list[pb.Item]:
        items = [text_item(pb.ROLE_USER, "Look into the failures.")]
        for n, call in enumerate(self.calls, 1):
            use = pb.ToolUseBlock(id=f"h-{n}", name=call.name, input_json=call.arguments)
            items.append(pb.Item(role=pb.ROLE_ASSISTANT, content=[pb.ContentBlock(tool_use=use)]))
            items.append(result_item(f"h-{n}", call.output, is_error=call.is_error))
        # Later turns, so the hostile outputs are old enough for the strategies and compressors to act on.
        items.append(call_item("h-last", "bash", {"command": "git status"}))
        items.append(result_item("h-last", "nothing to commit"))
        items.append(text_item(pb.ROLE_USER, "Go on."))
        return items


def history_renders() -> st.SearchStrategy[HistoryRender]:
    arguments = st.one_of(
        st.builds(lambda path: json.dumps({"path": path, "command": path}), st.sampled_from(["src/a.py", "x" * 5_000])),
        st.sampled_from(JSON_DOCUMENTS),
        st.sampled_from([json.dumps({"command": c}) for c in HOSTILE_COMMANDS]),
    )
    calls = st.builds(
        ToolCall,
        st.sampled_from(["bash", "read_file", "grep", "fetch"]),
        arguments,
        st.one_of(st.sampled_from(HOSTILE_OUTPUTS), hostile_texts().map(lambda t: t[: MAX_ITEM_BYTES // 4])),
        st.booleans(),
    )
    return st.builds(
        HistoryRender,
        st.lists(calls, min_size=1, max_size=3).map(tuple),
        st.sampled_from([0, 200, 2_000, 2**63 - 1]),
        patterns(),
        patterns(),
        st.one_of(st.sampled_from(SPECIAL_TEXT), hostile_texts().map(lambda t: t[:2_000])),
    )


def policy_sweep() -> Iterator[PolicyRender]:
    """Each hand-written hostile policy, once (formats and budgets taking turns)."""
    formats = (api.VIEW_FORMAT_OPENAI_CHAT, api.VIEW_FORMAT_ANTHROPIC_MESSAGES)
    for n, policy in enumerate(POLICY_DOCUMENTS):
        yield PolicyRender(policy, formats[n % 2], (0, 100_000)[n // 2 % 2])


def history_sweep() -> Iterator[HistoryRender]:
    """Each hostile tool output, once, with the patterns and tools taking turns."""
    tools = ("bash", "read_file", "grep", "fetch")
    for n, output in enumerate(HOSTILE_OUTPUTS):
        call = ToolCall(tools[n % len(tools)], json.dumps({"command": "run", "path": "src/a.py"}), output, n % 2 == 1)
        reason = SPECIAL_TEXT[n % len(SPECIAL_TEXT)]
        yield HistoryRender(
            (call,), (0, 2_000)[n % 2], PATTERNS[n % len(PATTERNS)], PATTERNS[-1 - n % len(PATTERNS)], reason
        )
    for n, command in enumerate(HOSTILE_COMMANDS):
        call = ToolCall("bash", json.dumps({"command": command}), "value = 1\n" * 40, False)
        yield HistoryRender((call,), 0, PATTERNS[n % len(PATTERNS)], PATTERNS[-1 - n % len(PATTERNS)])
