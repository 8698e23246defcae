"""Provider message formats to contextd items.

The service renders views back into these formats; together they round-trip
a conversation (docs/formats.md lists what each format cannot carry).
"""

from contextd_client.formats.anthropic import items_from_anthropic
from contextd_client.formats.converse import items_from_converse
from contextd_client.formats.openai import items_from_openai
from contextd_client.formats.responses import items_from_responses

__all__ = ["items_from_anthropic", "items_from_converse", "items_from_openai", "items_from_responses"]
