"""A big tool output leaves the view and comes back: by handle, a page or a grep at a time, and by Search.

python3 dev.py serve                           # in another terminal
.venv/bin/python examples/retrieve_and_search.py [--target HOST:PORT] [--api-key KEY]
"""

from __future__ import annotations

import argparse

from contextd_client import Client

BUDGET_TOKENS = 200
"""A small budget for the view, in tokens: the test run's output cannot stay in it."""


def test_run_output() -> str:
    """What `pytest` printed: 800 passing tests, one failure and its traceback (~10,000 tokens)."""
    lines = [f"tests/test_mod{n // 20}.py::test_case_{n} PASSED" for n in range(800)]
    lines[517] = "tests/test_parser.py::test_parse FAILED"
    lines += [
        "=================================== FAILURES ===================================",
        "    def test_parse():",
        ">       assert parse('2024-13-01') == date(2024, 12, 1)",
        "E       ValueError: month must be in 1..12",
        "src/parser.py:42: ValueError",
        "FAILED tests/test_parser.py::test_parse - ValueError: month must be in 1..12",
        "1 failed, 799 passed in 12.31s",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="contextd's address (default: %(default)s)")
    parser.add_argument("--api-key", help="an API key, when the server has --api-keys")
    args = parser.parse_args()

    with Client(args.target, api_key=args.api_key) as ctx:
        session = ctx.create_session(metadata={"example": "retrieve_and_search"}).id
        print(f"session {session}")
        run = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"command": "pytest"}'}}
        appended = ctx.append_openai(
            session,
            [
                {"role": "system", "content": "You fix bugs."},
                {"role": "user", "content": "Run the tests."},
                {"role": "assistant", "content": None, "tool_calls": [run]},
                {"role": "tool", "tool_call_id": "call_1", "content": test_run_output()},
                {"role": "assistant", "content": "One test fails: test_parse."},
                {"role": "user", "content": "Why does it fail?"},
            ],
        )
        output = appended.receipts[3]
        print(
            f"appended seqs {appended.first_seq}-{appended.last_seq}; the test run is seq {output.seq}, "
            f"{output.token_count:,} tokens"
        )

        view = ctx.render_view(session, "openai_chat", budget_tokens=BUDGET_TOKENS)
        print(f"view: {view.total_tokens:,} tokens for a budget of {BUDGET_TOKENS}")
        for item in view.items:
            print(f"  seq {item.seq}: {item.representation}, {item.tokens} tokens")
        placeholder = next(item for item in view.items if item.representation == "placeholder")
        print(f"the model reads: {view.messages[placeholder.message_index]['content']}")
        handle = placeholder.handle

        page = ctx.retrieve(session, handle, page_unit="lines", page_size=3)
        print(f"retrieve {handle}, first 3 of {page.total_lines} lines (next offset {page.next_offset}):")
        print("  " + page.content.rstrip("\n").replace("\n", "\n  "))

        matches = ctx.retrieve(session, handle, grep="FAILED|Error", context_lines=0)
        print(f"retrieve {handle}, grep 'FAILED|Error' (line numbers of the original):")
        print("  " + matches.content.rstrip("\n").replace("\n", "\n  "))

        results = ctx.search(session, "month must be", only_out_of_view=True)
        print(f"search 'month must be' among the items out of the view: {len(results.hits)} hit(s)")
        for hit in results.hits:
            print(f"  seq {hit.seq} ({hit.role}, {hit.tool_name}), handle {hit.handle}: {hit.snippet[:70]}…")

        status = ctx.get_status(session)
        print(f"status: {len(status.offloaded)} item(s) out of the view")
        for gone in status.offloaded:
            print(f"  seq {gone.seq}: {gone.tool_name}, {gone.tokens:,} tokens, {gone.reason}; handle {gone.handle}")

        ctx.delete_session(session)


if __name__ == "__main__":
    main()
