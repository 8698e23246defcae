"""The lab through the real service: conditions on the fixtures, and `contextd-lab` end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from contextd_client import Client
from contextd_lab import fixtures, report
from contextd_lab.cli import main
from tests.conftest import SQLITE_ONLY

CONDITIONS = ["B-duplicates", "C-errors", "D-superseded", "E-aggressive", "F-oracle", "latest-call", "default"]


@SQLITE_ONLY  # the lab is a client of the service (gRPC): the backend is not what this measures
def test_b_to_d_prune_only_what_is_unnecessary_and_lose_no_probe(client: Client) -> None:
    # Each kind of episode once per fixture: enough for every rule to act, small enough for seconds.
    traces = [fixtures.generate(seed, len(fixtures.EPISODES)).trace() for seed in (0, 1)]
    results = report.run(client, traces, {t["id"]: t["probes"] for t in traces}, CONDITIONS, 30, at_once=True)
    recall = {}
    for condition in CONDITIONS:
        qualities = [results.quality(t["id"], condition) for t in traces]
        assert all(q is not None for q in qualities)
        prunes = sum(q.prunes for q in qualities if q)
        false = [seq for q in qualities if q for seq in q.false_prunes]
        recall[condition] = sum(q.taken for q in qualities if q) / sum(q.oracle for q in qualities if q)
        lost = [
            (t["id"], n) for t in traces for n, o in enumerate(results.runs[t["id"], condition].probes) if o == "lost"
        ]
        assert not lost, (condition, lost)  # every original stays one handle away, whatever the condition
        if condition in {"B-duplicates", "C-errors", "D-superseded", "F-oracle", "default"}:
            assert prunes and not false, (condition, false)
        else:
            assert false, condition  # the traps catch the level-4 rules: counted, not hidden
    assert recall["F-oracle"] == 1.0
    assert recall["B-duplicates"] < recall["C-errors"] < recall["D-superseded"] < 1.0
    # The shipped default finds every prune the oracle makes: a read it compressed while old
    # still gives way to a placeholder once a whole re-read supersedes it.
    assert recall["default"] == 1.0
    # Reduction is counted on the same service: each condition sends less than raw.
    for trace in traces:
        raw = results.runs[trace["id"], "A-raw"].sent
        assert all(results.runs[trace["id"], c].sent < raw for c in CONDITIONS)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["embedded", "postgres+redis"])
def test_contextd_lab_report_runs_end_to_end(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    # A generated trace stands in for a real one. Two episodes each (trace and fixture) are enough
    # for every section, row and plot looked for below, and keep the report's many replays short.
    trace = fixtures.generate(7, episodes=2).trace()
    del trace["labels"]
    (traces / "t.json").write_text(json.dumps(trace))
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / f"{trace['id']}.json").write_text(json.dumps({"probes": trace.pop("probes")}))
    (traces / "t.json").write_text(json.dumps(trace))
    args = [
        "report",
        "--traces",
        str(traces),
        "--probes",
        str(probes),
        "--seeds",
        "0",
        "--episodes",
        "2",
        "--out",
        str(tmp_path / "lab.md"),
    ]
    if backend != "embedded":
        args += ["--database-url", request.getfixturevalue("postgres_url")]
        args += ["--redis-url", request.getfixturevalue("redis_url")]
    monkeypatch.chdir(tmp_path)
    assert main(args) == 0
    text = (tmp_path / "lab.md").read_text()
    for heading in ("## Fixtures", "## Real traces", "### The default policy against observation masking"):
        assert heading in text
    assert "## Cost against hidden facts: the Pareto frontier" in text and "| context-editing-30k | " in text
    assert "| F-oracle | " in text and "| masking | " in text and f"| {trace['id']} | " in text
    # The targets, measured: the default's savings over the traces read as the traces' table reads them.
    targets = text.split("## The targets", 1)[1].split("\n## ", 1)[0]
    for row in ("no trace above raw's cost (Anthropic)", "no condition both cheaper and hiding fewer", "no probe lost"):
        assert f"| {row}" in targets
    assert re.search(
        r"\| fixtures: precision 1\.00 for `default` \| (0 false of \d+ prunes|nothing pruned) \| met \|", targets
    )
    default = next(line for line in text.splitlines() if line.startswith("| default | ") and "$" in line)
    table = [float(p) for p in re.findall(r"\$[\d.]+ \(([-+][\d.]+)%\)", default)]  # Anthropic's, then OpenAI's
    for provider, percent in zip(("Anthropic", "OpenAI"), table, strict=True):
        saving = next(line for line in targets.splitlines() if line.startswith(f"| all traces, {provider}"))
        assert abs(float(saving.split(" | ")[1].split("%")[0]) - percent) <= 0.05  # to two decimals, and one
    for plot in ("tokens-per-call", "cost-vs-saved", "precision-recall", "pareto"):
        assert (tmp_path / "lab" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_traces_the_report_covers_the_fixtures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    args = ["report", "--traces", str(empty), "--seeds", "2", "--episodes", "2", "--out", str(tmp_path / "lab.md")]
    assert main(args) == 0
    assert "no traces in" in capsys.readouterr().err
    text = (tmp_path / "lab.md").read_text()
    assert "| F-oracle | " in text and "None given" in text and "fixture-002" in text
    assert (tmp_path / "lab" / "precision-recall.png").exists()


def test_contextd_lab_replay_prints_and_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "fixture.json"
    trace.write_text(json.dumps(fixtures.generate(5, episodes=10).trace()))
    out = tmp_path / "figures.json"
    args = ["replay", str(trace), "--condition", "B-duplicates", "--condition", "masking", "--at-once"]
    assert main([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| fixture-005 | B-duplicates |" in printed and "| fixture-005 | A-raw |" in printed
    records = {r["condition"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"A-raw", "B-duplicates", "masking"}
    assert records["B-duplicates"]["precision"] == 1.0 and records["B-duplicates"]["prunes"] > 0
    assert records["masking"]["false_prunes"]  # the traps, counted
    assert records["A-raw"]["sent"] > records["masking"]["sent"]
    assert set(records["masking"]["cost"]) == {"anthropic", "openai"}


def test_the_frontier_names_what_dominates_each_condition() -> None:
    points = {"raw": (10.0, 0.0), "cheap": (6.0, 4.0), "dear": (8.0, 5.0), "tie": (6.0, 4.0), "best": (5.0, 0.0)}
    beaten = report.frontier(points)
    assert beaten["best"] == [] and beaten["raw"] == ["best"]
    assert beaten["dear"] == ["best", "cheap", "tie"]
    assert beaten["cheap"] == ["best"] and beaten["tie"] == ["best"]  # equals do not dominate each other
