"""Generated agent conversations for property tests: valid histories (every
call answered after it, in order) of user turns, assistant turns with text,
signed (or encrypted, with the Responses API's ids) reasoning and parallel tool calls, and
tool results, some errors."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from contextd.engine.model import (
    Block,
    Item,
    ItemContent,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import stored_items

words = st.text(alphabet="abcdefghij klmnop\nxyz", min_size=1, max_size=40).filter(lambda s: s.strip())


@st.composite
def conversations(draw: st.DrawFn, max_turns: int = 12) -> list[Item]:
    contents: list[ItemContent] = [ItemContent(role=Role.SYSTEM, content=(TextBlock("You are an agent."),))]
    contents.append(ItemContent(role=Role.USER, content=(TextBlock(draw(words)),)))
    call = 0
    for _ in range(draw(st.integers(1, max_turns))):
        kind = draw(st.sampled_from(["tools", "tools", "text", "user"]))
        if kind == "user":
            contents.append(ItemContent(role=Role.USER, content=(TextBlock(draw(words)),)))
            continue
        blocks: list[Block] = []
        # Reasoning signed as Anthropic signs it, or an OpenAI Responses turn's (ids that pair
        # the reasoning with the items it led to, and its encrypted content).
        responses = False
        if draw(st.booleans()):
            responses = draw(st.booleans())
            turn = len(contents)
            if responses:
                blocks.append(ReasoningBlock(draw(words), item_id=f"rs_{turn}", encrypted_content="enc"))
            else:
                blocks.append(ReasoningBlock(draw(words), signature="sig"))
        if kind == "text" or draw(st.booleans()):
            blocks.append(TextBlock(draw(words), item_id=f"msg_{len(contents)}" if responses else ""))
        ids = []
        if kind == "tools":
            for _ in range(draw(st.integers(1, 3))):
                call += 1
                ids.append(f"c{call}")
                name = draw(st.sampled_from(["read_file", "bash", "grep"]))
                arguments = json.dumps({"arg": draw(words)})
                blocks.append(ToolUseBlock(f"c{call}", name, arguments, item_id=f"fc_{call}" if responses else ""))
        contents.append(ItemContent(role=Role.ASSISTANT, content=tuple(blocks)))
        for call_id in ids:
            # Outputs from one line to dozens: some are worth a placeholder, some are not.
            output = (TextBlock((draw(words) + "\n") * draw(st.integers(1, 40))),)
            contents.append(
                ItemContent(role=Role.TOOL, content=(ToolResultBlock(call_id, output, is_error=draw(st.booleans())),))
            )
    return stored_items(contents)
