"""contextd's compressors against headroom-ai's, side by side on the same payloads.

    python bench/compress.py [--repeat 30] [--no-headroom] [--show NAME]

Per payload type (a service log, a pytest run, a JSON API response, a Python
module and a JavaScript one, grep results, a git diff, a file listing, a
built documentation page, a file read three times in one conversation) it prints the input tokens, the
median time of one tokenisation of the input (the natural floor of a
compressor: it reads its input at least once), the output tokens, the
reduction, the median time of one compression and its ratio to that floor,
and how many of the payload's facts are still there verbatim, for contextd and, in
the same run, for headroom-ai (bench/headroom_env.py installs it into its own
virtual environment, .venv-headroom; bench/headroom_runner.py runs it there):
its default `compress()` and its specialised compressor for the type.

The facts are what an agent comes back for: the error line, the exception,
the failing test ids and assertion, the anomalous JSON row, the body of the
function the focus names, the definition line of the searched symbol, the
hunk on the focus, the file asked about. Every payload is built here,
deterministically (generated, or read from this Python's standard library).
Tokens are counted with cl100k_base for both sides.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.headroom_env import headroom_python  # noqa: E402
from bench.traces import contents  # noqa: E402
from contextd.engine.compress import Focus, compress  # noqa: E402
from contextd.engine.compress.code import PARSED  # noqa: E402
from contextd.engine.compress.router import SNIFFED  # noqa: E402
from contextd.engine.compress.search import READ as SEARCHES_READ  # noqa: E402
from contextd.engine.pipeline import RenderInput, render  # noqa: E402
from contextd.engine.policy import default_policy  # noqa: E402
from contextd.engine.state import ViewState  # noqa: E402
from contextd.engine.tokens import TiktokenCounter  # noqa: E402
from contextd.engine.transforms import TransformRegistry  # noqa: E402
from contextd.engine.view import ViewFormat, ViewRequest  # noqa: E402
from tests.helpers import make_session, to_item  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@dataclass
class Payload:
    name: str
    kind: str
    text: str
    focus: list[str]
    facts: list[str]
    command: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """A conversation, for the payloads about what repeats across turns."""


# ---------------------------------------------------------------- payloads


def service_log() -> Payload:
    rng = random.Random(11)
    lines = []
    for i in range(700):
        at = f"2026-11-29T08:{i // 60 % 60:02d}:{i % 60:02d}.{rng.randint(0, 999):03d}Z"
        what = rng.choice(
            [
                f"GET /api/v1/orders/{rng.randint(1000, 9999)} 200 {rng.randint(3, 80)}ms",
                f"worker-{rng.randint(1, 6)} picked job {rng.randint(10_000, 99_999)} from queue billing",
                f"cache hit ratio {rng.uniform(0.80, 0.99):.3f} over the last 60s",
                f"POST /api/v1/invoices 201 {rng.randint(20, 140)}ms",
            ]
        )
        lines.append(f"{at} INFO  {what}")
    lines[311] = "2026-11-29T08:05:11.204Z WARN  pool db-primary at 92% of max connections (46/50)"
    lines[402] = "2026-11-29T08:06:42.017Z WARN  pool db-primary at 94% of max connections (47/50)"
    lines[610] = "2026-11-29T08:10:40.550Z ERROR payment gateway rejected charge ch_7Hq2Lw: card_declined (req r-5521)"
    lines += [
        "2026-11-29T08:15:00.001Z ERROR job 88213 crashed",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.11/site-packages/rq/worker.py", line 1431, in perform_job',
        "    rv = job.perform()",
        '  File "/usr/local/lib/python3.11/site-packages/rq/job.py", line 1280, in perform',
        "    self._result = self._execute()",
        '  File "/srv/billing/jobs/invoices.py", line 57, in render_invoice',
        "    total = totals.compute_total(order.lines)",
        '  File "/srv/billing/totals.py", line 23, in compute_total',
        "    return sum(line.amount for line in lines) / len(lines)",
        "ZeroDivisionError: division by zero",
        "2026-11-29T08:15:00.090Z INFO  worker-2 shutting down after 1 failed job",
    ]
    return Payload(
        "service log",
        "log",
        "\n".join(lines),
        ["compute_total"],
        [
            "ERROR payment gateway rejected charge ch_7Hq2Lw: card_declined (req r-5521)",
            "ZeroDivisionError: division by zero",
            '  File "/srv/billing/totals.py", line 23, in compute_total',
            "WARN  pool db-primary at 94% of max connections (47/50)",
        ],
        "journalctl -u billing --since today",
    )


def pytest_run() -> Payload:
    rng = random.Random(5)
    progress = []
    for i in range(60):
        marks = "".join(rng.choice("....s") for _ in range(rng.randint(20, 60)))
        progress.append(f"tests/unit/test_module_{i:02d}.py {marks}")
    progress[17] = "tests/unit/test_module_17.py ......F......................"
    progress[42] = "tests/unit/test_module_42.py ...........F......"
    progress[51] = "tests/unit/test_module_51.py ....F......"
    library = "\n".join(
        f"/usr/local/lib/python3.11/site-packages/_pytest/python.py:{1700 + k}: in runtest\n    self.ihook.x()"
        for k in range(12)
    )

    def failure(name: str, path: str, line: int, assertion: str, detail: str) -> str:
        return (
            f"{'_' * 30} {name} {'_' * 30}\n\n"
            f"    def {name}():\n        order = make_order(lines=[])\n"
            f">       {assertion}\nE       {detail}\n\n{path}:{line}: AssertionError\n"
        )

    def deep_failure() -> str:
        """pytest's long report of a failure 14 frames deep: the project's own frames (each
        location on a line of its own, nothing after it), then a library's, where it was raised."""
        frames = [
            ("tests/unit/test_module_51.py", 40, "test_invoice_pdf", "render_invoice(order)"),
            *((f"src/billing/pdf/stage_{n}.py", 20 + n, f"stage_{n}", f"return stage_{n + 1}(doc)") for n in range(8)),
            ("src/billing/invoice.py", 204, "embed_logo", "return images.load(settings.LOGO_PATH)"),
            *(
                (f"/usr/local/lib/python3.11/site-packages/imagelib/io_{n}.py", 300 + n, f"read_{n}", "return inner()")
                for n in range(4)
            ),
        ]
        report = [f"{'_' * 30} test_invoice_pdf {'_' * 30}", ""]
        for n, (path, line, function, source) in enumerate(frames):
            report += [f"    def {function}(doc):", "        doc.check()", f">       {source}", ""]
            if n == len(frames) - 1:
                report += ["E       FileNotFoundError: [Errno 2] No such file: 'static/logo@2x.png'", ""]
                report.append(f"{path}:{line}: FileNotFoundError")
            else:
                report += [f"{path}:{line}: ", "_ " * 40, ""]
        return "\n".join(report)

    text = "\n".join(
        [
            "=" * 30 + " test session starts " + "=" * 30,
            "platform linux -- Python 3.11.7, pytest-8.3.4, pluggy-1.5.0",
            "rootdir: /srv/billing",
            "collected 2214 items",
            "",
            *progress,
            "",
            "=" * 35 + " FAILURES " + "=" * 35,
            failure(
                "test_total_of_empty_order",
                "tests/unit/test_module_17.py",
                88,
                "assert compute_total(order.lines) == Decimal(0)",
                "ZeroDivisionError: division by zero",
            ),
            library,
            failure(
                "test_currency_rounding",
                "tests/unit/test_module_42.py",
                131,
                'assert fmt(Decimal("2.675")) == "2.68"',
                "AssertionError: assert '2.67' == '2.68'",
            ),
            deep_failure(),
            "=" * 28 + " short test summary info " + "=" * 28,
            "FAILED tests/unit/test_module_17.py::test_total_of_empty_order - ZeroDivisionError: division by zero",
            "FAILED tests/unit/test_module_42.py::test_currency_rounding - AssertionError: assert '2.67' == '2.68'",
            "FAILED tests/unit/test_module_51.py::test_invoice_pdf - FileNotFoundError: [Errno 2] No such file",
            "=" * 20 + " 3 failed, 2186 passed, 25 skipped in 41.62s " + "=" * 20,
        ]
    )
    return Payload(
        "pytest run",
        "test",
        text,
        [],
        [
            "FAILED tests/unit/test_module_17.py::test_total_of_empty_order",
            "FAILED tests/unit/test_module_42.py::test_currency_rounding",
            "E       AssertionError: assert '2.67' == '2.68'",
            "E       ZeroDivisionError: division by zero",
            "FAILED tests/unit/test_module_51.py::test_invoice_pdf",
            "E       FileNotFoundError: [Errno 2] No such file: 'static/logo@2x.png'",
            # The root cause's location: the deepest frame in the project's own code, where to look.
            "src/billing/invoice.py:204: ",
            ">       return images.load(settings.LOGO_PATH)",
            "3 failed, 2186 passed, 25 skipped in 41.62s",
        ],
        "python -m pytest tests",
    )


def api_response() -> Payload:
    rng = random.Random(3)
    rows: list[dict[str, Any]] = []
    for i in range(220):
        rows.append(
            {
                "id": f"inv_{i:05d}",
                "customer": f"cus_{rng.randint(10_000, 99_999)}",
                "currency": "EUR",
                "status": "paid",
                "amount_cents": rng.randint(1_000, 9_000),
                "created": f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:00Z",
                "region": "eu-west-1",
            }
        )
    rows[87] = {**rows[87], "status": "failed", "error": {"code": "card_declined", "message": "insufficient funds"}}
    rows[150] = {**rows[150], "amount_cents": 4_800_000}
    rows[199] = {**rows[199], "customer": "cus_42424"}
    text = json.dumps({"object": "list", "has_more": False, "data": rows}, indent=2)
    return Payload(
        "JSON API response",
        "json",
        text,
        ["cus_42424"],
        # Values, not their formatting: each compressor writes rows its own way.
        ["card_declined", "insufficient funds", "4800000", "cus_42424"],
        "curl -s https://api.example.test/v1/invoices?limit=220",
    )


def python_module() -> Payload:
    source = (STDLIB / "textwrap.py").read_text()
    tree = ast.parse(source)
    dedent = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "dedent")
    body = ast.get_source_segment(source, dedent, padded=True) or ""
    return Payload(
        "Python module (textwrap.py)",
        "code",
        source,
        ["dedent"],
        [body, "def wrap(text, width=70, **kwargs):", "class TextWrapper:", "import re"],
        "cat Lib/textwrap.py",
    )


def javascript_module() -> Payload:
    rng = random.Random(9)
    functions = []
    for i in range(40):
        statements = "\n".join(
            f"  const v{k} = items[{k}] ? items[{k}].{rng.choice(['price', 'qty', 'tax'])} * {rng.randint(2, 9)} : 0;"
            for k in range(rng.randint(6, 14))
        )
        functions.append(f"export function step{i}(items, options = {{}}) {{\n{statements}\n  return v0;\n}}\n")
    focus = (
        "export function applyDiscount(cart, code) {\n"
        "  const rule = DISCOUNTS[code];\n"
        "  if (!rule) throw new Error(`unknown discount ${code}`);\n"
        "  const off = Math.min(cart.total * rule.rate, rule.cap);\n"
        "  return { ...cart, total: cart.total - off, discount: code };\n"
        "}\n"
    )
    functions.insert(23, focus)
    text = "import { DISCOUNTS } from './discounts.js';\n\n" + "\n".join(functions)
    return Payload(
        "JavaScript module",
        "code",
        text,
        ["applyDiscount"],
        [focus, "export function step7(items, options = {}) {", "import { DISCOUNTS } from './discounts.js';"],
        "cat web/cart.js",
    )


def grep_results() -> Payload:
    rng = random.Random(17)
    hits = []
    for f in range(45):
        path = f"src/{rng.choice(['api', 'web', 'jobs', 'billing'])}/module_{f:02d}.py"
        for _ in range(rng.randint(3, 16)):
            line = rng.randint(10, 900)
            call = rng.choice(
                [
                    "    view = session.render_view(request, budget=budget)",
                    "        return self.render_view(req)",
                    "    # render_view is called once per model call",
                    "    result = await client.render_view(session_id, fmt=fmt)",
                    "    assert render_view(req).tokens <= budget",
                ]
            )
            hits.append(f"{path}:{line}:{call}")
    definition = "src/engine/pipeline.py:412:def render_view(session, request, *, budget=0):"
    hits.insert(130, definition)
    hits.insert(131, "src/engine/pipeline.py:398:    # render_view: the one entry point, see docs/engine.md")
    return Payload(
        "grep results",
        "search",
        "\n".join(hits),
        ["render_view"],
        [definition, "src/engine/pipeline.py", hits[0].split(":", 1)[0]],
        "grep -rn render_view src",
    )


def git_diff() -> Payload:
    rng = random.Random(21)
    parts = []
    for f in range(14):
        path = f"src/billing/module_{f:02d}.py"
        parts.append(
            f"diff --git a/{path} b/{path}\nindex {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644\n"
            f"--- a/{path}\n+++ b/{path}"
        )
        for h in range(3):
            start = 40 * h + 10
            parts.append(f"@@ -{start},14 +{start},15 @@ def handler_{h}(request):")
            parts += [f"     value_{k} = compute(request, {k})" for k in range(5)]
            parts += [f"-    result = old_path_{h}(value_{k})" for k in range(2)]
            parts += [f"+    result = new_path_{h}(value_{k}, strict=True)" for k in range(3)]
            parts += [f"     log.debug('step {k}')" for k in range(5)]
    parts[40:40] = [
        "diff --git a/src/billing/totals.py b/src/billing/totals.py",
        "index 1a2b3c4..5d6e7f8 100644",
        "--- a/src/billing/totals.py",
        "+++ b/src/billing/totals.py",
        "@@ -20,6 +20,8 @@ from decimal import Decimal",
        " def compute_total(lines):",
        "-    return sum(line.amount for line in lines) / len(lines)",
        "+    if not lines:",
        "+        return Decimal(0)",
        "+    return sum(line.amount for line in lines) / len(lines)",
        " ",
    ]
    return Payload(
        "git diff",
        "diff",
        "\n".join(parts),
        ["compute_total"],
        ["+        return Decimal(0)", "diff --git a/src/billing/totals.py b/src/billing/totals.py"]
        + [f"diff --git a/src/billing/module_{f:02d}.py" for f in (0, 7, 13)],
        "git diff",
    )


def listing() -> Payload:
    paths = []
    for directory in ("email", "json", "unittest", "asyncio", "importlib"):
        paths += [f"./{p.relative_to(STDLIB)}" for p in sorted((STDLIB / directory).rglob("*")) if p.is_file()]
    return Payload(
        "file listing (find)",
        "listing",
        "\n".join(paths),
        ["_header_value_parser.py"],
        ["_header_value_parser.py", "./email/mime/", "./importlib/metadata/"],
        "find email json unittest asyncio importlib -type f",
    )


def html_page() -> Payload:
    """A built documentation page: a head of links and scripts, an inline style, a sidebar of
    links, the content (the facts are there, text and markup), a script and a footer."""
    rng = random.Random(23)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "  <head>",
        '    <meta charset="utf-8" />',
        '    <meta name="viewport" content="width=device-width, initial-scale=1.0" />',
        "    <title>billing.invoices &#8212; Billing 4.2 documentation</title>",
        *(f'    <link rel="stylesheet" href="../_static/{n}.css" />' for n in ("base", "theme", "code")),
        *(f'    <script src="../_static/{n}.js"></script>' for n in ("jquery", "underscore", "doctools", "search")),
        "    <style>",
        *(f"      .c{n} {{ color: #{rng.randrange(16**6):06x}; margin: {n % 7}px {n % 5}px; }}" for n in range(60)),
        "    </style>",
        "  </head>",
        "  <body>",
    ]
    sidebar = ['    <div class="sphinxsidebar" role="navigation" aria-label="main navigation">', "      <ul>"]
    sidebar += [f'        <li><a href="../api/mod{n}.html">billing.mod{n}</a></li>' for n in range(80)]
    sidebar += ["      </ul>", "    </div>"]
    alias = (
        '<p>alias of <code class="xref py py-class docutils literal notranslate"><span class="pre">Dict</span>'
        '</code>[<code class="xref py py-class docutils literal notranslate"><span class="pre">str</span></code>]</p>'
    )
    content = ['    <div class="body" role="main">', '<section id="billing-invoices">', "<h1>billing.invoices</h1>"]
    for n in range(30):
        content += [
            f'<dl class="py function"><dt id="billing.invoices.op{n}">op{n}(invoice, *, dry_run=False)</dt>',
            f"<dd><p>Applies step {n}; raises <code>InvoiceError</code> when the invoice is closed.</p></dd></dl>",
        ]
    content += [
        '<dl class="py data"><dt id="billing.invoices.Options">Options</dt>',
        f"<dd><p>Refunds above the ceiling of 4800 EUR need a second approval.</p>{alias}</dd></dl>",
        "</section>",
        "    </div>",
    ]
    script = ["    <script>", *(f"      var opt{n} = {{key: 'k{n}', rank: {n % 3}}};" for n in range(40))]
    script += ["      $(document).ready(function () { init(opt0); });", "    </script>"]
    footer = ['    <div class="footer">&copy;2026, Billing team. Built with Sphinx 7.2.6.</div>']
    footer += ["  </body>", "</html>"]
    text = "\n".join([*head, *content, *sidebar, *script, *footer])
    return Payload(
        "HTML page (docs build)",
        "html",
        text,
        ["Options"],
        [
            "billing.invoices &#8212; Billing 4.2 documentation",
            "Refunds above the ceiling of 4800 EUR need a second approval.",
            alias,
            "Built with Sphinx 7.2.6.",
        ],
        "cat _build/html/api/billing.invoices.html",
    )


def repeated_reads() -> Payload:
    source = (STDLIB / "textwrap.py").read_text()
    tree = ast.parse(source)
    dedent = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "dedent")
    body = ast.get_source_segment(source, dedent, padded=True) or ""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool."},
        {"role": "user", "content": "dedent() mishandles tabs; find out why and fix it."},
    ]
    for i, thought in enumerate(
        ["Let me read textwrap.py.", "Reading it again to check the regexes.", "Once more, around dedent."]
    ):
        call = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": thought,
                "tool_calls": [{"id": call, "name": "bash", "arguments": {"command": "cat Lib/textwrap.py"}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call, "name": "bash", "content": source})
    for i in range(3):  # the work goes on: the reads are no longer the latest turns
        call = f"call_x{i}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Running the tests ({i}).",
                "tool_calls": [{"id": call, "name": "bash", "arguments": {"command": f"python -m test test_{i}"}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call, "name": "bash", "content": f"ok {i}"})
    return Payload(
        "file read 3 times",
        "repeated_reads",
        "\n".join(m["content"] for m in messages if m["role"] == "tool"),
        ["dedent"],
        [body],
        messages=messages,
    )


PAYLOADS: list[Callable[[], Payload]] = [
    service_log,
    pytest_run,
    api_response,
    python_module,
    javascript_module,
    grep_results,
    git_diff,
    listing,
    html_page,
    repeated_reads,
]


# ---------------------------------------------------------------- contextd


def contextd_output(payload: Payload, repeat: int) -> tuple[str, float]:
    """What contextd sends for the payload, and the median ms it took."""
    times: list[float] = []
    out = payload.text
    for _ in range(repeat):
        SNIFFED.clear()  # each run classifies, parses and compresses: nothing remembered from the last
        PARSED.clear()
        SEARCHES_READ.clear()
        started = time.perf_counter()
        if payload.messages:
            out = _engine_view(payload)
        else:
            found = compress(payload.text, Focus(tuple(payload.focus)), command=payload.command)
            out = found.text if found is not None else payload.text
        times.append((time.perf_counter() - started) * 1000)
    return out, statistics.median(times)


def tokenise_ms(text: str, repeat: int) -> float:
    """The median ms of one tokenisation of `text` (cl100k_base, as the service counts): the
    natural floor of a compressor, which must read its input at least once."""
    times: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        COUNTER.count(text)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _engine_view(payload: Payload) -> str:
    """The tool outputs as the view of the whole conversation shows them: one render by the
    engine with the default policy, no earlier render (what is eligible applies at once)."""
    items = [to_item(c, seq) for seq, c in enumerate(contents({"messages": payload.messages}), start=1)]
    request = ViewRequest(ViewFormat.OPENAI_CHAT)
    inp = RenderInput(make_session(len(items)), items, default_policy(), request, COUNTER, REGISTRY, ViewState(), 0.0)
    messages = json.loads(render(inp).view.messages_json)
    return "\n".join(_text(m["content"]) for m in messages if m.get("role") == "tool")


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


# ---------------------------------------------------------------- headroom


def headroom_results(payloads: list[Payload], repeat: int) -> tuple[str, dict[tuple[str, str], dict[str, Any]]]:
    python = headroom_python(ROOT)
    request = {
        "repeat": repeat,
        "payloads": [
            {
                "name": p.name,
                "kind": p.kind,
                "text": p.text,
                "focus": p.focus,
                **({"messages": p.messages} if p.messages else {}),
            }
            for p in payloads
        ],
    }
    done = subprocess.run(
        [str(python), str(ROOT / "bench" / "headroom_runner.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    answer = json.loads(done.stdout)
    # Each payload has two results: compress(), then its specialised compressor (named in `method`).
    return answer["headroom_version"], {
        (r["name"], "compress" if r["method"] == "compress" else "specialised"): r for r in answer["results"]
    }


# ---------------------------------------------------------------- report

COUNTER = TiktokenCounter()
REGISTRY = TransformRegistry.default()


@dataclass
class Measured:
    tokens: int
    ms: float | None
    kept: int
    error: str = ""


def measure(payload: Payload, output: str, ms: float | None, error: str = "") -> Measured:
    if error:
        return Measured(0, None, 0, error)
    return Measured(COUNTER.count(output), ms, sum(1 for fact in payload.facts if fact in output))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-headroom", action="store_true", help="contextd alone (no headroom venv)")
    parser.add_argument("--show", default="", help="print contextd's output for the payload of this name")
    args = parser.parse_args()
    payloads = [make() for make in PAYLOADS]
    version, theirs = ("", {}) if args.no_headroom else headroom_results(payloads, args.repeat)
    print("command: python bench/compress.py " + " ".join(sys.argv[1:]))
    print(f"tokens: cl100k_base; median of {args.repeat} runs" + (f"; headroom-ai {version}" if version else ""))
    print()
    head = "| payload | KB | input tokens | tokenise ms | contextd: out | reduction | ms | × tokenise | facts |"
    rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    if theirs:
        head += (
            " headroom compress(): out | reduction | ms | facts | headroom specialised | out | reduction | ms | facts |"
        )
        rule += " ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |"
    print(head)
    print(rule)
    for payload in payloads:
        tokens_in = COUNTER.count(payload.text)
        output, ms = contextd_output(payload, args.repeat)
        if args.show and args.show == payload.name:
            print(output, file=sys.stderr)
        size = f"{len(payload.text.encode()) / 1024:.1f}"
        floor = tokenise_ms(payload.text, args.repeat)
        ours = _cells(payload, measure(payload, output, ms), tokens_in)
        cells = [payload.name, size, f"{tokens_in:,}", f"{floor:.2f}", *ours[:3], f"{ms / floor:.1f}", ours[3]]
        if theirs:
            for method in ("compress", "specialised"):
                found = theirs.get((payload.name, method), {})
                got = measure(payload, found.get("output") or "", found.get("ms"), found.get("error") or "")
                cells += ([found.get("method", "")] if method == "specialised" else []) + _cells(
                    payload, got, tokens_in
                )
        print("| " + " | ".join(cells) + " |")
    return 0


def _cells(payload: Payload, got: Measured, tokens_in: int) -> list[str]:
    if got.error:
        return ["error", "", "", got.error[:60]]
    reduction = 1 - got.tokens / tokens_in if tokens_in else 0.0
    ms = f"{got.ms:.2f}" if got.ms is not None else ""
    return [f"{got.tokens:,}", f"{reduction:.0%}", ms, f"{got.kept}/{len(payload.facts)}"]


if __name__ == "__main__":
    sys.exit(main())
