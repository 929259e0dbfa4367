"""A tool's anticipated errors, sent to the client in their own words alone.

The ``mcp`` SDK puts "Error executing tool <name>: " before the message of
every ``ToolError`` a tool raises. The gateway's helpers raise them with text
meant for the user ("Payments are not configured: ..."), and a tool may
raise its own; :func:`in_own_words` returns each as the tool's error result
instead, which the SDK passes on as it is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, TextContent

log = logging.getLogger(__name__)

Params = ParamSpec("Params")
Result = TypeVar("Result")


def in_own_words(
    tool: Callable[Params, Awaitable[Result]],
) -> Callable[Params, Awaitable[Result | CallToolResult]]:
    """Wrap a tool (below ``@server.tool()``) so that its ``ToolError`` is its error result.

    Anything else a tool raises is left to the SDK: a crash still reaches the
    client only as "Error executing tool <name>", and a URL elicitation
    (-32042) is still raised as the protocol error it is.
    """

    @functools.wraps(tool)
    async def run(*args: Params.args, **kwargs: Params.kwargs) -> Result | CallToolResult:
        try:
            return await tool(*args, **kwargs)
        except ToolError as error:
            if isinstance(error, UnexpectedToolError):
                raise
            log.info("tool %s failed: %r", tool.__name__, str(error))
            return _error_result(str(error))

    return run


def _error_result(text: str) -> CallToolResult:
    content: Any = [TextContent(type="text", text=text)]
    return CallToolResult(content=content, is_error=True)
