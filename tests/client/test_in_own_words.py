"""in_own_words: a tool's anticipated error reaches the client in its own text, alone."""

from __future__ import annotations

import asyncio

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from gateway.client.mcp import in_own_words

pytestmark = pytest.mark.backend_independent


@in_own_words
async def tool(outcome: str) -> str:
    """A tool that answers, refuses or crashes as told."""
    if outcome == "refuse":
        raise ToolError("Payments are not configured: ask the operator")
    if outcome == "crash":
        raise KeyError("internal detail")
    return "sunny"


def test_an_answer_passes_unchanged() -> None:
    assert asyncio.run(tool("answer")) == "sunny"


def test_a_tool_error_becomes_the_error_result_in_its_own_words() -> None:
    result = asyncio.run(tool("refuse"))
    assert not isinstance(result, str)
    assert result.is_error
    assert [block.text for block in result.content] == [  # type: ignore[union-attr]
        "Payments are not configured: ask the operator"]


def test_a_crash_is_left_to_the_sdk_which_shows_none_of_it() -> None:
    with pytest.raises(KeyError):
        asyncio.run(tool("crash"))


def test_the_tool_keeps_its_name_and_signature_for_the_sdk() -> None:
    assert tool.__name__ == "tool"
    assert tool.__doc__ == "A tool that answers, refuses or crashes as told."
    assert tool.__annotations__["outcome"] == "str"
