"""The tools an agent hands its model, so the model can get back what left its context and
steer it (DESIGN section 4, control modes): retrieve, search, pin, unpin, propose a prune,
status. One definition each, written in the provider's tool format; the thin client's
executor (`contextd_client.AgentTools`) answers the calls the model makes with them.
"""

from __future__ import annotations

import json
from typing import Any

from contextd.engine.view import ViewFormat
from contextd.recovery import MAX_HITS, MAX_PAGE_TOKENS

PREFIX = "contextd_"

_SEQS = {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": 100}

TOOLS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "retrieve",
        "Get back the original of an item that left your context: the placeholders and compressed outputs "
        "you see name a handle ('retrieve with handle ...'), and status and search name each item's seq; "
        "give exactly one of handle or seq. Returns a page of at most "
        f"{MAX_PAGE_TOKENS:,} tokens with the total size; ask again with the next offset for more, or narrow "
        "it with a line range or a regular expression.",
        {
            # Exactly one of handle and seq, said in words and checked by the executor: a
            # oneOf at the top of a tool's schema is refused by Anthropic's API.
            "type": "object",
            "properties": {
                "handle": {
                    "type": "string",
                    "pattern": "^[0-9a-f]{16}$",
                    "description": "The handle to get back (or give seq instead).",
                },
                "seq": {"type": "integer", "minimum": 1, "description": "The item's seq (or give handle instead)."},
                "offset": {"type": "integer", "minimum": 0, "description": "Where the page starts (see page_unit)."},
                "page_unit": {"type": "string", "enum": ["tokens", "lines"], "description": "Default: tokens."},
                "line_start": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
                "line_end": {"type": "integer", "minimum": 1, "description": "Last line to return (inclusive)."},
                "grep": {"type": "string", "description": "Only the lines matching this regular expression."},
                "context_lines": {"type": "integer", "minimum": 0, "maximum": 50},
            },
            "additionalProperties": False,
        },
    ),
    (
        "search",
        "Search everything this conversation has seen, including what left your context, each item's whole "
        "text: full text by default (every word required), or an exact substring, or a regular expression. "
        "Returns matching items with a snippet and "
        f"the handle to retrieve each (at most {MAX_HITS} per page).",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "mode": {"type": "string", "enum": ["full_text", "substring", "regex"]},
                "only_out_of_view": {"type": "boolean", "description": "Only items no longer shown in full."},
                "page_token": {"type": "string", "description": "From the previous page, for the next one."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    (
        "pin",
        "Keep items (by seq) in your context in full from now on: they will never be pruned.",
        {"type": "object", "properties": {"seqs": _SEQS}, "required": ["seqs"], "additionalProperties": False},
    ),
    (
        "unpin",
        "Let pinned items (by seq) be pruned again by the usual rules.",
        {"type": "object", "properties": {"seqs": _SEQS}, "required": ["seqs"], "additionalProperties": False},
    ),
    (
        "propose_prune",
        "Say that items (by seq) are no longer needed; they leave your context at the next cache-safe "
        "point and stay retrievable by handle. Protected items (user instructions, recent turns) are refused.",
        {
            "type": "object",
            "properties": {"seqs": _SEQS, "reason": {"type": "string", "maxLength": 1000}},
            "required": ["seqs", "reason"],
            "additionalProperties": False,
        },
    ),
    (
        "status",
        "What your context holds now: its size against the whole conversation's, and every item out of it "
        "with its handle, tool and size.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
)


def definitions(view_format: ViewFormat) -> list[dict[str, Any]]:
    """The tools, written as the provider's `tools` expects them (Converse: its
    ``toolConfig.tools``)."""
    if view_format is ViewFormat.ANTHROPIC_MESSAGES:
        return [{"name": PREFIX + name, "description": text, "input_schema": schema} for name, text, schema in TOOLS]
    if view_format is ViewFormat.OPENAI_RESPONSES:
        return [
            {"type": "function", "name": PREFIX + name, "description": text, "parameters": schema}
            for name, text, schema in TOOLS
        ]
    if view_format is ViewFormat.BEDROCK_CONVERSE:
        return [
            {"toolSpec": {"name": PREFIX + name, "description": text, "inputSchema": {"json": schema}}}
            for name, text, schema in TOOLS
        ]
    return [
        {"type": "function", "function": {"name": PREFIX + name, "description": text, "parameters": schema}}
        for name, text, schema in TOOLS
    ]


def definitions_json(view_format: ViewFormat) -> str:
    return json.dumps(definitions(view_format), separators=(",", ":"))
