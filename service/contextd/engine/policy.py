"""Policies are data: a JSON or YAML document, validated against a schema,
versioned by content hash (DESIGN section 4).

A session's policy says what is protected, which rung of the evidence
ladder a prune may rest on, how the prompt cache is priced, what each tool
does to the world, and which rules run in which order. Fields left out
take the built-in values (the default policy's); the tool declarations and
rules are the policy's own: the default policy's strategies run for sessions
that name no policy (`default_policy.yaml`). Unknown fields are errors,
reported with the path of the field (``rules[1].when.tokenz``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import yaml

from contextd.engine.codec import canonical_json
from contextd.engine.errors import FieldViolation, InvalidArgument
from contextd.engine.model import Role, ToolEffectKind
from contextd.engine.patterns import PatternError, compile_linear
from contextd.engine.transforms import BUILT_IN_STRATEGIES, TransformRegistry, UnknownTransform

if TYPE_CHECKING:
    import jsonschema

MAX_DOCUMENT_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Prices:
    """Provider prices per million input tokens, and the cache's lifetime."""

    input: float
    cache_write: float
    cache_read: float
    ttl_seconds: float


# Published list prices of a mid-tier model of each provider (2025), used
# when a policy names the provider without its own prices:
# Anthropic Claude Sonnet 4: $3 input, $3.75 5-minute cache write, $0.30 cache hit,
#   5-minute TTL refreshed on use (docs.anthropic.com, "Prompt caching").
# OpenAI GPT-4o: $2.50 input, $1.25 cached input, no write premium; cached
#   prefixes live 5-10 minutes idle (platform.openai.com, "Prompt caching").
# Google Gemini 2.5 Pro: $1.25 input, cached input at a 75% discount, 1-hour
#   default TTL for explicit caches (ai.google.dev, "Context caching").
PROVIDER_PRICES: Mapping[str, Prices] = {
    "anthropic": Prices(input=3.00, cache_write=3.75, cache_read=0.30, ttl_seconds=300),
    "openai": Prices(input=2.50, cache_write=2.50, cache_read=1.25, ttl_seconds=300),
    "google": Prices(input=1.25, cache_write=1.25, cache_read=0.3125, ttl_seconds=3600),
}

# Where a later call can read each provider's cache from. Anthropic caches a prompt at
# its explicit breakpoints (an agent puts one at the end of each call) and a later call
# reads the longest such earlier prompt that is, whole, a prefix of its own; OpenAI and
# Gemini cache automatically whatever prefix two prompts share. Neither caches a prompt
# shorter than 1,024 tokens on the models priced above (same documentation pages): the
# engine counts no shorter earlier prompt as a breakpoint (with prefix reads it keeps the
# change as the read point whatever its offset: a rewrite that short costs next to nothing).
BREAKPOINTS, PREFIX = "breakpoints", "prefix"
BANKED, UNLIMITED = "banked", "unlimited"  # what a rewrite may stake (`CachePolicy.stakes`)
PROVIDER_READS: Mapping[str, str] = {"anthropic": BREAKPOINTS, "openai": PREFIX, "google": PREFIX}
MIN_CACHED_TOKENS = 1024
# Past the minimum, OpenAI caches prefixes in steps of 128 tokens (same page); the others
# cache whatever length the breakpoint or the shared prefix gives.
CACHE_STEPS: Mapping[str, int] = {"openai": 128}


@dataclass(frozen=True, slots=True)
class Globs:
    """Glob patterns (``memory_*``, ``file:///repo/*.md``), compiled once into one expression."""

    patterns: tuple[str, ...] = ()
    _compiled: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.patterns:
            expression = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)
            object.__setattr__(self, "_compiled", re.compile(expression))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def match(self, text: str) -> str | None:
        """The first pattern `text` matches, or None."""
        if self._compiled is None or not self._compiled.match(text):
            return None
        return next(p for p in self.patterns if fnmatch.fnmatchcase(text, p))

    def matches_any(self, texts: Sequence[str]) -> bool:
        compiled = self._compiled
        return compiled is not None and any(compiled.match(t) for t in texts)


@dataclass(frozen=True, slots=True)
class Protection:
    last_turns: int = 1
    user_items: bool = True
    latest_error_per_tool: bool = True
    tools: Globs = Globs()
    """Tool names."""
    sources: Globs = Globs()
    """Source URIs."""


@dataclass(frozen=True, slots=True)
class CachePolicy:
    provider: str = "anthropic"
    prices: Prices = PROVIDER_PRICES["anthropic"]
    expected_calls: int = 12
    """Calls a rewrite of the cached prompt must pay for itself within (a session's calls to come
    are not known: the shorter this, the less a rewrite just before its end can cost)."""
    high_water: float = 0.9
    low_water: float = 0.8
    """When a view over its token budget must offload turns, it offloads down to this share of the
    budget: the offload rewrites the cached prompt from the oldest turn it takes on, and the room it
    leaves lets the calls after it read that prompt from the cache instead of rewriting it each
    time (1: exactly down to the budget, a rewrite at every call that goes over it)."""
    expected_calls_auto: bool = False
    """Expect as many further calls as the session has made so far (at least `expected_calls`)."""
    stakes: str = BANKED
    """What a rewrite of the cached prompt may put at risk: `banked`, no more than the session's
    calls have saved so far against sending the whole history (timing.py, `banked`), so that a
    session that ends just after a rewrite costs no more than the history sent whole; or
    `unlimited`."""
    reads: str = BREAKPOINTS
    """Where a later call reads the cache from: `breakpoints` (only up to the end of an earlier
    prompt, cached whole) or `prefix` (up to wherever two prompts first differ)."""

    def for_session(self, calls_so_far: int) -> CachePolicy:
        """The pricing for a session that has made `calls_so_far` calls."""
        if not self.expected_calls_auto or calls_so_far <= self.expected_calls:
            return self
        return replace(self, expected_calls=calls_so_far)


@dataclass(frozen=True, slots=True)
class ToolDeclaration:
    effect: ToolEffectKind
    source_arg: str = ""
    command_arg: str = "command"
    """For a shell tool: the argument holding the command."""
    content: str = ""
    """What the tool's outputs hold (a compressor kind), when declared."""


@dataclass(frozen=True, slots=True)
class Range:
    min: float | None = None
    max: float | None = None

    def holds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


@dataclass(frozen=True, slots=True)
class When:
    """A rule's conditions on a candidate; all that are set must hold."""

    roles: frozenset[Role] | None = None
    tools_include: Globs = Globs()
    tools_exclude: Globs = Globs()
    content_types: frozenset[str] | None = None
    tokens: Range | None = None
    age_turns: Range | None = None
    utilization: Range | None = None
    regex: Any = None
    """Compiled by RE2 (engine/patterns.py): linear time, whoever wrote the policy."""
    source_glob: Globs = Globs()
    pinned: bool | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    transform: str
    params: Mapping[str, Any] = field(default_factory=dict)
    when: When = When()
    history: bool = False
    """Applied edits become durable (archived pre-image, mutation appended to the history)."""


@dataclass(frozen=True, slots=True)
class Policy:
    version: str
    """Content hash of the document: certificates name the policy they were made under."""
    document: str
    """The document as given (empty for the default policy)."""
    rules: tuple[Rule, ...] = ()
    protection: Protection = Protection()
    max_level: int = 3
    compression: bool = True
    """Compressions apply whatever `max_level` says (see docs/policy.md)."""
    cache: CachePolicy = CachePolicy()
    tools: Mapping[str, ToolDeclaration] = field(default_factory=dict)


@cache
def schema() -> dict[str, Any]:
    """The policy JSON Schema (also published for editors)."""
    loaded: dict[str, Any] = json.loads(files("contextd.engine").joinpath("policy.schema.json").read_text())
    return loaded


def parse_policy(document: str, registry: TransformRegistry, field_name: str = "policy") -> Policy:
    """Parse and validate a policy document (JSON or YAML); an empty one is the default policy.

    Raises InvalidArgument whose violations name each bad field by path
    under `field_name`.
    """
    if not document.strip():
        return default_policy()
    if len(document.encode()) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument.at(field_name, f"the document is over {MAX_DOCUMENT_BYTES:,} bytes")
    try:
        data = _load(document)  # YAML is a superset of JSON: one parser reads both
    except yaml.YAMLError as exc:
        raise InvalidArgument.at(field_name, f"not valid JSON or YAML: {exc}") from None
    except ValueError as exc:  # a scalar the loader cannot make: an integer of 5,000 digits, say
        raise InvalidArgument.at(field_name, f"not plain data: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument.at(field_name, f"must be a mapping, not {type(data).__name__}")
    _check_plain(data, field_name)
    import jsonschema  # 0.1 s of CPU to import: when a document is checked, not when a server starts

    violations = [
        FieldViolation(_path(field_name, error.absolute_path), error.message)
        for error in sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data), key=_error_order)
    ]
    if violations:
        raise InvalidArgument(violations)
    return _build(data, document, registry, field_name)


# libyaml's parser when PyYAML has it (the wheels do): ten times faster than PyYAML's own.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _PolicyLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """Plain data only: no timestamps (what looks like a date stays the string it was
    written as). Aliases and nesting are refused before loading (`_load`)."""


_PolicyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists in a policy (the schema's deepest is 5)."""

_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _load(document: str) -> Any:
    """The document's data, read in two passes: its events first (no aliases: a few bytes
    of them expand to gigabytes; no nesting past MAX_DEPTH, which the loader would follow
    by recursion), then the data."""
    depth = 0
    for event in yaml.parse(document, Loader=_PolicyLoader):
        if isinstance(event, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event)
        elif isinstance(event, _CLOSES):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            raise _Refused("aliases are not allowed in a policy", event)
    return yaml.load(document, Loader=_PolicyLoader)


class _Refused(yaml.YAMLError):
    def __init__(self, problem: str, event: yaml.Event) -> None:
        mark = event.start_mark
        super().__init__(f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem)


def _check_plain(data: Any, path: str) -> None:
    """JSON's data model only: string keys (YAML allows any), finite numbers, and none
    of the types YAML tags can make (``!!binary``, ``!!set``, ``!!timestamp`` ...)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                raise InvalidArgument.at(path, f"the key {key!r} is not a string")
            _check_plain(value, f"{path}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _check_plain(value, f"{path}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        raise InvalidArgument.at(path, f"{data} is not a finite number")
    elif data is not None and not isinstance(data, str | int | float):
        raise InvalidArgument.at(path, f"a {type(data).__name__} is not plain data (JSON types only)")


def _error_order(error: jsonschema.ValidationError) -> list[str]:
    return [str(p) for p in error.absolute_path]


def _path(root: str, parts: Any) -> str:
    path = root
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def version_of(data: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()[:16]


def _build(data: dict[str, Any], document: str, registry: TransformRegistry, root: str) -> Policy:
    violations: list[FieldViolation] = []
    rules: list[Rule] = []
    names: set[str] = set()
    for i, raw in enumerate(data.get("rules", [])):
        path = f"{root}.rules[{i}]"
        if raw["name"] in names:
            violations.append(FieldViolation(f"{path}.name", f"rule name {raw['name']!r} is used twice"))
        names.add(raw["name"])
        try:
            transform = registry.get(raw["transform"])
        except UnknownTransform:
            known = ", ".join(registry.names()) or "none"
            violations.append(FieldViolation(f"{path}.transform", f"unknown transform {raw['transform']!r} ({known})"))
        else:
            # A transform may check its params (optional `check(params) -> [(field, problem)]`).
            check = getattr(transform, "check", None)
            if check is not None:
                for name, problem in check(raw.get("params", {})):
                    violations.append(FieldViolation(f"{path}.params{'.' + name if name else ''}", problem))
        when, problems = _when(raw.get("when", {}), f"{path}.when")
        violations.extend(problems)
        if raw.get("enabled", True):
            rules.append(
                Rule(raw["name"], raw["transform"], raw.get("params", {}), when, bool(raw.get("history", False)))
            )
    tools: dict[str, ToolDeclaration] = {}
    for name, raw in data.get("tools", {}).items():
        effect = ToolEffectKind(raw["effect"])
        if effect in (ToolEffectKind.READ, ToolEffectKind.WRITE) and "source_arg" not in raw:
            violations.append(
                FieldViolation(f"{root}.tools.{name}.source_arg", f"a {effect.value} tool names its source argument")
            )
        tools[name] = ToolDeclaration(
            effect, raw.get("source_arg", ""), raw.get("command_arg", "command"), raw.get("content", "")
        )
    if violations:
        raise InvalidArgument(violations)
    default = Policy(version="", document="")  # what a field left out is
    protection = data.get("protection", {})
    cache_data = data.get("cache", {})
    provider = cache_data.get("provider", default.cache.provider)
    prices = Prices(**cache_data["prices"]) if "prices" in cache_data else PROVIDER_PRICES[provider]
    return Policy(
        version=version_of(data),
        document=document,
        rules=tuple(rules),
        protection=Protection(
            last_turns=protection.get("last_turns", default.protection.last_turns),
            user_items=protection.get("user_items", default.protection.user_items),
            latest_error_per_tool=protection.get("latest_error_per_tool", default.protection.latest_error_per_tool),
            tools=Globs(tuple(protection.get("tools", ()))),
            sources=Globs(tuple(protection.get("sources", ()))),
        ),
        max_level=data.get("evidence", {}).get("max_level", default.max_level),
        compression=data.get("evidence", {}).get("compression", default.compression),
        cache=CachePolicy(
            provider=provider,
            prices=prices,
            expected_calls=_expected_calls(cache_data, default.cache.expected_calls),
            expected_calls_auto=cache_data.get("expected_calls") == "auto",
            high_water=cache_data.get("high_water", default.cache.high_water),
            low_water=cache_data.get("low_water", default.cache.low_water),
            stakes=cache_data.get("stakes", default.cache.stakes),
            reads=cache_data.get("reads", PROVIDER_READS[provider]),
        ),
        tools=tools,
    )


def _expected_calls(cache_data: Mapping[str, Any], default: int) -> int:
    given = cache_data.get("expected_calls", default)
    return default if given == "auto" else int(given)


def _when(raw: Mapping[str, Any], path: str) -> tuple[When, list[FieldViolation]]:
    problems: list[FieldViolation] = []
    pattern = None
    if "regex" in raw:
        try:
            pattern = compile_linear(raw["regex"])
        except PatternError as exc:
            problems.append(FieldViolation(f"{path}.regex", f"not a regular expression RE2 reads: {exc}"))
    ranges = {}
    for name in ("tokens", "age_turns", "utilization"):
        if name in raw:
            low, high = raw[name].get("min"), raw[name].get("max")
            if low is not None and high is not None and low > high:
                problems.append(FieldViolation(f"{path}.{name}", f"min {low} is above max {high}"))
            ranges[name] = Range(low, high)
    tools = raw.get("tools", {})
    when = When(
        roles=frozenset(Role(r) for r in raw["roles"]) if "roles" in raw else None,
        tools_include=Globs(tuple(tools.get("include", ()))),
        tools_exclude=Globs(tuple(tools.get("exclude", ()))),
        content_types=frozenset(raw["content_types"]) if "content_types" in raw else None,
        tokens=ranges.get("tokens"),
        age_turns=ranges.get("age_turns"),
        utilization=ranges.get("utilization"),
        regex=pattern,
        source_glob=Globs((raw["source_glob"],)) if "source_glob" in raw else Globs(),
        pinned=raw.get("pinned"),
    )
    return when, problems


def default_policy_text() -> str:
    """The shipped default policy's document (YAML)."""
    return files("contextd.engine").joinpath("default_policy.yaml").read_text()


@cache
def default_policy() -> Policy:
    """The shipped default (`default_policy.yaml`): protection on, evidence up to
    level 3, Anthropic prices, the built-in strategies."""
    document = default_policy_text()
    data = _load(document)
    return _build(data, document, TransformRegistry(BUILT_IN_STRATEGIES), "default policy")
