"""Write probe files for the development traces: facts from early turns needed late.

    python bench/make_probes.py [--traces ../shared/traces] [--out bench/probes]

A fact is a string of one of these kinds, first seen in the first third of a
trace's messages and seen again in its last third (so a late turn needed
it): file paths, exception messages (``SomeError: ...`` lines), test names
(``test_...``), identifiers the task statement names (code spans and
CamelCase or snake_case names of the first user message), and the commands
the agent ran more than once; and, apart, up to four facts (paths, exception
messages, test names) that a tool output brought in, first seen there in the
first third and seen again in the last. Each is written in the probe format of
../shared/traces/README.md. The selection is mechanical and deterministic:
the same traces give the same files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

KINDS = {
    "file_path": re.compile(r"(?<![\w/.-])(?:[\w.-]+/)+[\w.-]+\.(?:py|rst|txt|cfg|toml|ini|json|yaml|yml|c|h|js|ts)\b"),
    "error_message": re.compile(r"\b[A-Z]\w*(?:Error|Exception|Warning): [^\n<]{8,120}"),
    "test_name": re.compile(r"\btest_\w{4,}\b"),
    "identifier": re.compile(
        r"`([A-Za-z_][\w.]{3,60})`|\b([A-Z][a-z]+(?:[A-Z][a-z0-9]+)+|[a-z]+(?:_[a-z0-9]+){1,5})\b"
    ),
}
MAX_PER_KIND = 4


def texts(message: dict[str, Any]) -> str:
    calls = " ".join(json.dumps(c["arguments"]) for c in message.get("tool_calls") or ())
    return f"{message.get('content') or ''}\n{calls}"


def probes_for(trace: dict[str, Any]) -> list[dict[str, Any]]:
    messages = [texts(m) for m in trace["messages"]]
    n = len(messages)
    early, late = max(2, n // 3), n - max(1, n // 3)
    out: list[dict[str, Any]] = []
    for kind, pattern in KINDS.items():
        found: dict[str, int] = {}
        scope = messages[1:2] if kind == "identifier" else messages[:early]  # identifiers: from the task
        for index, text in enumerate(scope, start=1 if kind == "identifier" else 0):
            for match in pattern.finditer(text):
                answer = next((g for g in match.groups() if g), match.group(0)) if match.groups() else match.group(0)
                found.setdefault(answer.strip(), index)
        chosen = 0
        for answer, first in found.items():
            seen = [i for i, text in enumerate(messages) if answer in text]
            if not seen or seen[-1] < late or len(answer) < 4:
                continue
            out.append(
                {
                    "trace_id": trace["id"],
                    "kind": kind,
                    "question": f"Which {kind.replace('_', ' ')} from message {first} "
                    f"is needed again at message {seen[-1]}?",
                    "answer": answer,
                    "message_index": first,
                    "role_at_index": trace["messages"][first]["role"],
                    "last_seen_index": seen[-1],
                    "n_messages": n,
                    "occurrences": len(seen),
                }
            )
            chosen += 1
            if chosen == MAX_PER_KIND:
                break
    return out + output_facts(trace, messages, early, late, {p["answer"] for p in out})


def output_facts(
    trace: dict[str, Any], messages: list[str], early: int, late: int, taken: set[str]
) -> list[dict[str, Any]]:
    """Facts a tool output brought in early (first seen in one), needed again late: the probes
    that say most about pruning, since the rules act on tool outputs."""
    out: list[dict[str, Any]] = []
    for index in range(early):
        if trace["messages"][index]["role"] != "tool":
            continue
        for kind in ("error_message", "test_name", "file_path"):
            for match in KINDS[kind].finditer(messages[index]):
                answer = match.group(0).strip()
                seen = [i for i, text in enumerate(messages) if answer in text]
                if answer in taken or len(answer) < 4 or seen[0] != index or seen[-1] < late:
                    continue
                taken.add(answer)
                out.append(
                    {
                        "trace_id": trace["id"],
                        "kind": kind,
                        "question": f"Which {kind.replace('_', ' ')} did the tool output of message {index} "
                        f"show, needed again at message {seen[-1]}?",
                        "answer": answer,
                        "message_index": index,
                        "role_at_index": "tool",
                        "last_seen_index": seen[-1],
                        "n_messages": len(messages),
                        "occurrences": len(seen),
                    }
                )
                if len(out) == MAX_PER_KIND:
                    return out
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "probes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in sorted(args.traces.glob("*.json")):
        trace = json.loads(path.read_text())
        probes = probes_for(trace)
        document = {
            "description": f"Facts of {trace['id']} first seen early and needed late (bench/make_probes.py).",
            "probes": probes,
        }
        (args.out / f"{trace['id']}.json").write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
        print(f"{trace['id']}: {len(probes)} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
