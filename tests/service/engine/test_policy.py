"""Policy documents: parsing, validation with field paths, versions, defaults."""

from __future__ import annotations

import json
import time

import pytest

from contextd.engine.errors import InvalidArgument
from contextd.engine.model import Role, ToolEffectKind
from contextd.engine.policy import (
    MAX_DOCUMENT_BYTES,
    PROVIDER_PRICES,
    Prices,
    default_policy,
    parse_policy,
    schema,
)
from contextd.engine.transforms import TransformRegistry

REGISTRY = TransformRegistry.default()

FULL_YAML = """
protection:
  last_turns: 4
  user_items: false
  tools: ["memory_*"]
  sources: ["file:///repo/SPEC.md"]
evidence: {max_level: 2}
cache:
  provider: openai
  expected_calls: 5
  high_water: 0.8
  low_water: 0.6
tools:
  read_file: {effect: read, source_arg: path}
  bash: {effect: volatile}
rules:
  - name: mask-old-bash
    transform: mask
    when:
      roles: [tool]
      tools: {include: [bash], exclude: [bash_safe]}
      content_types: [tool_result]
      tokens: {min: 200}
      age_turns: {min: 3, max: 100}
      utilization: {min: 0.5}
      regex: "Traceback|Error"
      source_glob: "file:///*.py"
      pinned: false
    history: true
  - name: switched-off
    transform: mask
    enabled: false
"""


def violations(document: str) -> list[tuple[str, str]]:
    with pytest.raises(InvalidArgument) as refused:
        parse_policy(document, REGISTRY)
    return [(v.field, v.description) for v in refused.value.violations]


def test_an_empty_document_is_the_default_policy() -> None:
    assert parse_policy("", REGISTRY) is default_policy()
    assert parse_policy("  \n", REGISTRY) is default_policy()
    default = default_policy()
    assert (default.max_level, default.cache.provider) == (3, "anthropic")
    assert default.protection.last_turns == 1 and default.protection.latest_error_per_tool
    assert default.cache.expected_calls == 12
    # The built-in strategies, on the evidence they rest on; a bash tool read as a shell.
    assert [(r.name, r.transform) for r in default.rules] == [
        ("duplicates", "dedupe"),
        ("same-source", "same_source"),
        ("superseded-reads", "supersede"),
        ("snapshots", "snapshots"),
        ("old-errors", "errors"),
        ("errored-inputs", "errored_inputs"),
        ("completed-work", "completed"),
        ("compress-outputs", "compress"),
    ]
    assert default.compression
    assert default.tools["bash"].effect == "shell" and default.document.startswith("# The default policy")
    assert parse_policy(default.document, REGISTRY).version == default.version  # the shipped text is a policy


def test_every_field_is_read() -> None:
    policy = parse_policy(FULL_YAML, REGISTRY)
    assert policy.protection.last_turns == 4 and not policy.protection.user_items
    assert policy.protection.tools.patterns == ("memory_*",)
    assert policy.protection.sources.patterns == ("file:///repo/SPEC.md",)
    assert policy.max_level == 2
    assert (policy.cache.provider, policy.cache.expected_calls, policy.cache.high_water) == ("openai", 5, 0.8)
    assert policy.cache.low_water == 0.6 and default_policy().cache.low_water == 0.8
    assert policy.cache.prices == PROVIDER_PRICES["openai"]
    assert policy.tools["read_file"].effect is ToolEffectKind.READ and policy.tools["read_file"].source_arg == "path"
    assert [r.name for r in policy.rules] == ["mask-old-bash"]  # the disabled rule is left out
    rule = policy.rules[0]
    assert rule.history and rule.transform == "mask"
    when = rule.when
    assert when.roles == frozenset({Role.TOOL}) and when.tools_include.patterns == ("bash",)
    assert when.tools_exclude.patterns == ("bash_safe",) and when.content_types == frozenset({"tool_result"})
    assert when.tokens is not None and when.tokens.holds(200) and not when.tokens.holds(199)
    assert when.age_turns is not None and when.age_turns.holds(100) and not when.age_turns.holds(101)
    assert when.regex is not None and when.regex.search("a Traceback")
    assert (when.source_glob.patterns, when.pinned) == (("file:///*.py",), False)
    assert policy.document == FULL_YAML


def test_the_version_is_a_hash_of_the_content_not_of_its_spelling() -> None:
    as_yaml = parse_policy("evidence: {max_level: 2}\nprotection: {last_turns: 3}\n", REGISTRY)
    as_json = parse_policy(json.dumps({"protection": {"last_turns": 3}, "evidence": {"max_level": 2}}), REGISTRY)
    assert as_yaml.version == as_json.version and as_yaml.version.startswith("sha256:")
    assert parse_policy("evidence: {max_level: 1}", REGISTRY).version != as_yaml.version
    assert default_policy().version != as_yaml.version


def test_prices_can_be_given_outright() -> None:
    policy = parse_policy(
        "cache: {prices: {input: 1, cache_write: 1.25, cache_read: 0.1, ttl_seconds: 3600}}", REGISTRY
    )
    assert policy.cache.prices == Prices(1, 1.25, 0.1, 3600)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("protection: {last_turns: -1}", [("policy.protection.last_turns", "-1 is less than the minimum of 0")]),
        ("rules: [{name: a, transform: mask, when: {tokenz: {min: 1}}}]", [("policy.rules[0].when", "tokenz")]),
        ("cache: {provider: azure}", [("policy.cache.provider", "'azure' is not one of")]),
        ("evidence: {max_level: 5}", [("policy.evidence.max_level", "5 is greater than the maximum of 4")]),
        ("rules: [{name: a}]", [("policy.rules[0]", "'transform' is a required property")]),
        ("rules: [{name: a, transform: shrink}]", [("policy.rules[0].transform", "unknown transform 'shrink'")]),
        (
            "rules: [{name: a, transform: mask}, {name: a, transform: mask}]",
            [("policy.rules[1].name", "rule name 'a' is used twice")],
        ),
        ("rules: [{name: a, transform: mask, when: {regex: '(('}}]", [("policy.rules[0].when.regex", "RE2 reads")]),
        # RE2 has no backreferences or lookaround: what it reads, it matches in linear time.
        (r"rules: [{name: a, transform: mask, when: {regex: '(a)\1'}}]", [("policy.rules[0].when.regex", "RE2 reads")]),
        ("rules: [{name: a, transform: mask, when: {regex: 'x(?=y)'}}]", [("policy.rules[0].when.regex", "RE2 reads")]),
        (
            "rules: [{name: a, transform: mask, when: {tokens: {min: 9, max: 1}}}]",
            [("policy.rules[0].when.tokens", "min 9 is above max 1")],
        ),
        ("tools: {read_file: {effect: read}}", [("policy.tools.read_file.source_arg", "a read tool names")]),
        ("- a list", [("policy", "must be a mapping, not list")]),
        ("rules: [unclosed", [("policy", "not valid JSON or YAML")]),
        # Plain data only: no aliases, keys are strings.
        ("a: &x [1, 2]\nb: *x", [("policy", "aliases are not allowed in a policy")]),
        # Nesting is refused before it is loaded (the loader recurses), in JSON and YAML alike.
        ('{"a":' * 10_000 + "1" + "}" * 10_000, [("policy", "nested deeper than 32 levels")]),
        ("[" * 100_000 + "]" * 100_000, [("policy", "not valid JSON or YAML")]),
        ("rules:\n" + "".join("  " * n + "- a:\n" for n in range(1, 40)), [("policy", "nested deeper than 32 levels")]),
        ("protection: {sources: [" + ",".join(["a"] * 1001) + "]}", [("policy.protection.sources", "too long")]),
        ("protection: {1: 2}", [("policy.protection", "the key 1 is not a string")]),
        ("protection: {sources: !!set {a: null}}", [("policy.protection.sources", "a set is not plain data")]),
        ("protection: {sources: [!!binary aGk=]}", [("policy.protection.sources[0]", "a bytes is not plain data")]),
        ("cache: {expected_calls: .nan}", [("policy.cache.expected_calls", "nan is not a finite number")]),
    ],
)
def test_problems_name_the_field(document: str, expected: list[tuple[str, str]]) -> None:
    found = violations(document)
    assert [field for field, _ in found] == [field for field, _ in expected]
    for (_, description), (_, words) in zip(found, expected, strict=True):
        assert words in description


def test_several_problems_are_reported_together() -> None:
    found = violations("protection: {last_turns: x}\nevidence: {max_level: 9}\n")
    assert [field for field, _ in found] == ["policy.evidence.max_level", "policy.protection.last_turns"]


def test_oversized_documents_are_refused() -> None:
    assert violations("#" * (MAX_DOCUMENT_BYTES + 1)) == [
        ("policy", f"the document is over {MAX_DOCUMENT_BYTES:,} bytes")
    ]


def test_the_schema_is_published_json_schema() -> None:
    assert schema()["$schema"].startswith("https://json-schema.org/draft/2020-12")
    assert set(schema()["properties"]) == {"protection", "evidence", "cache", "tools", "rules"}


def test_what_looks_like_a_date_stays_a_string() -> None:
    policy = parse_policy("protection: {sources: [2024-01-01]}", TransformRegistry.default())
    assert policy.protection.sources.patterns == ("2024-01-01",)


def test_expected_calls_may_grow_with_the_session() -> None:
    auto = parse_policy('cache: {expected_calls: "auto"}', REGISTRY).cache
    assert (auto.expected_calls, auto.expected_calls_auto) == (12, True)
    assert auto.for_session(5).expected_calls == 12  # at least the default
    assert auto.for_session(140).expected_calls == 140  # as many more as it has made
    fixed = parse_policy("cache: {expected_calls: 30}", REGISTRY).cache
    assert fixed.for_session(140) is fixed
    with pytest.raises(InvalidArgument) as refused:
        parse_policy("cache: {expected_calls: many}", REGISTRY)
    assert refused.value.violations[0].field == "policy.cache.expected_calls"


def test_a_backtracking_pattern_matches_in_linear_time() -> None:
    """`(a+)+$` takes Python's `re` twice as long per extra character; RE2 reads a
    megabyte of it at once (a loose bound: it is milliseconds)."""
    when = parse_policy("rules: [{name: a, transform: mask, when: {regex: '(a+)+$'}}]", REGISTRY).rules[0].when
    started = time.perf_counter()
    assert when.regex.search("a" * 1_000_000 + "!") is None
    assert time.perf_counter() - started < 2.0


def test_hostile_documents_are_invalid_arguments() -> None:
    """Deep nesting in either syntax, and repetition past the schema's bounds: refused
    as the caller's mistake (never a RecursionError), within the size limit."""
    documents = [
        '{"a":' * 10_000 + "1" + "}" * 10_000,
        "[" * 120_000 + "]" * 120_000,
        "protection: {sources: [" + ",".join(f'"s{n}"' for n in range(20_000)) + "]}",
        "rules: [" + ",".join(f"{{name: r{n}, transform: mask}}" for n in range(300)) + "]",
    ]
    for document in documents:
        assert len(document.encode()) <= MAX_DOCUMENT_BYTES
        with pytest.raises(InvalidArgument):
            parse_policy(document, REGISTRY)
