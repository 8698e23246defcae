"""The generated fixtures: deterministic, every message labelled, probes that point at their facts."""

from __future__ import annotations

import json

from contextd_lab import fixtures


def test_a_seed_gives_the_same_fixture_byte_for_byte_and_seeds_differ() -> None:
    one, again = fixtures.generate(3).trace(), fixtures.generate(3).trace()
    assert json.dumps(one) == json.dumps(again)
    assert json.dumps(fixtures.generate(4).trace()) != json.dumps(one)


def test_every_message_is_labelled_and_every_call_answered() -> None:
    for seed in range(5):
        trace = fixtures.generate(seed).trace()
        messages, labels = trace["messages"], trace["labels"]
        assert [label["index"] for label in labels] == list(range(len(messages)))
        assert all(label["keep"] in {"full", "residue", "none"} for label in labels)
        calls = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
        answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert sorted(calls) == sorted(answers) and len(set(calls)) == len(calls)
        for label in labels:
            assert all(0 <= n < len(messages) for n in label["needs"])
            if label["keep"] == "none":
                assert label["needs"], label  # nothing kept of it: something else must carry it
            if label["oracle"]:
                assert label["keep"] != "full"


def test_each_kind_of_episode_and_trap_is_there() -> None:
    trace = fixtures.generate(0).trace()
    categories = {label["category"] for label in trace["labels"]}
    wanted = {"duplicate", "changed_output", "errored", "errored_input", "superseded", "partial_range", "snapshot"}
    assert wanted | {"completed", "outcome", "constraint", "identifier", "rejected"} <= categories


def test_probes_point_at_the_message_that_first_holds_their_answer() -> None:
    for seed in range(5):
        fixture = fixtures.generate(seed)
        assert len(fixture.probes) >= 10
        for probe in fixture.probes:
            message = fixture.messages[probe["message_index"]]
            assert probe["answer"] in json.dumps(message) or probe["answer"] in (message.get("content") or "")
            assert probe["occurrences"] >= 1 and probe["last_seen_index"] >= probe["message_index"]
            assert probe["n_messages"] == len(fixture.messages)


def test_the_traps_hold_facts_a_later_output_does_not() -> None:
    """Same command, other output: the first run's pending migration is in the first output only."""
    fixture = fixtures.generate(1)
    for probe in fixture.probes:
        label = fixture.labels[probe["message_index"]]
        if label["category"] in {"changed_output", "partial_range", "identifier"}:
            assert label["keep"] == "full"
            holders = [m for m in fixture.messages if m["role"] == "tool" and probe["answer"] in m["content"]]
            assert len(holders) == 1, probe


def test_a_pruned_observation_is_carried_by_what_it_needs() -> None:
    """Subsumption is checkable: a range read is inside the whole read that needs it; a duplicate
    is byte-identical to its partner; a completed span's outcome names what the span found."""
    for seed in range(5):
        trace = fixtures.generate(seed).trace()
        messages = trace["messages"]
        for label in trace["labels"]:
            if label["keep"] != "none" or messages[label["index"]]["role"] != "tool":
                continue
            mine = messages[label["index"]]["content"]
            carriers = [messages[n] for n in label["needs"]]
            if label["category"] == "duplicate":
                assert [c["content"] for c in carriers] == [mine]
            elif label["category"] == "superseded" and mine.startswith("<returncode>"):
                body = mine.split("<output>\n", 1)[1].rsplit("\n</output>", 1)[0]
                assert body in carriers[0]["content"]
            elif label["category"] == "completed":
                assert carriers[0]["metadata"]["contextd.completes"]


def test_the_only_repeated_calls_with_other_outputs_are_the_designed_traps() -> None:
    """A call made again with another output is a trap for same-call rules; only the episodes
    built as such (a check run again, a test run after a fix, a file read again after its edit)
    may do it, and probes are distinct."""
    for seed in range(40):
        trace = fixtures.generate(seed).trace()
        messages, labels = trace["messages"], trace["labels"]
        outputs: dict[str, set[str]] = {}
        categories: dict[str, set[str]] = {}
        calls = {c["id"]: c for m in messages for c in m.get("tool_calls") or ()}
        for message, label in zip(messages, labels, strict=True):
            if message["role"] == "tool":
                key = json.dumps([message["name"], calls[message["tool_call_id"]]["arguments"]], sort_keys=True)
                outputs.setdefault(key, set()).add(message["content"])
                categories.setdefault(key, set()).add(label["category"])
        for key, seen in outputs.items():
            if len(seen) > 1:
                assert categories[key] <= {"changed_output", "snapshot", "superseded"}, key
        answers = [p["answer"] for p in trace["probes"]]
        assert len(set(answers)) == len(answers)
