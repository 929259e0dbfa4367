"""A user's MCP client: the official SDK's ``Client`` over streamable HTTP, with a bearer token.

Playwright's synchronous API owns the test's thread, so each tool call runs
on its own event loop in a worker thread while the test drives the browser.
What the client would show its user (the URL elicitation) and what the
server tells it (``notifications/elicitation/complete``) come back to the
test through thread-safe queues.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Final

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import (
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    TextContent,
)

LEGACY: Final = "legacy"  # the initialize handshake: protocol 2025-11-25
MODERN: Final = "2026-07-28"
# Any one wait of a test: long enough for a cold browser and a busy machine.
WAIT: Final = 30.0
# A whole tool call, however many rounds it takes; a stuck call ends itself.
CALL_LIMIT: Final = 120.0


class ToolCall:
    """One tool call in flight, as its user's MCP client makes it."""

    def __init__(self, url: str, token: str, mode: str, tool: str,
                 arguments: dict[str, Any]) -> None:
        self.url, self.token, self.mode = url, token, mode
        self.tool, self.arguments = tool, arguments
        # URL elicitations as the client shows them; None once the call has ended.
        self._links: queue.Queue[ElicitRequestURLParams | None] = queue.Queue()
        self._notified: tuple[MemoryObjectSendStream[str], MemoryObjectReceiveStream[str]]
        self.completions: list[str] = []  # elicitationIds the server said were completed
        self._outcome: Future[CallToolResult] = Future()
        self._thread = threading.Thread(target=self._run, name=f"mcp-{tool}", daemon=True)
        self._thread.start()

    # --- what the test sees -------------------------------------------------------

    def next_link(self, timeout: float = WAIT) -> ElicitRequestURLParams:
        """The URL elicitation the client was asked to show its user (and accepted)."""
        try:
            link = self._links.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no URL elicitation within {timeout} s") from None
        if link is None:
            raise AssertionError(f"the call ended without a link: {self._describe()}")
        return link

    def result(self, timeout: float = WAIT) -> CallToolResult:
        """The tool's final result (raises what the call raised)."""
        try:
            return self._outcome.result(timeout=timeout)
        except TimeoutError:
            if self._outcome.done():
                raise  # the call's own error
            raise AssertionError(f"{self.tool} did not return within {timeout} s") from None

    @property
    def done(self) -> bool:
        return self._outcome.done()

    def _describe(self) -> str:
        error = self._outcome.exception()
        return repr(error) if error is not None else repr(self._outcome.result())

    # --- the client ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            result = anyio.run(self._call)
        except BaseException as error:
            self._outcome.set_exception(error)
        else:
            self._outcome.set_result(result)
        finally:
            self._links.put(None)

    async def _call(self) -> CallToolResult:
        self._notified = send, receive = anyio.create_memory_object_stream[str](16)
        # The server may hold a response open while it long-polls the gateway.
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"},
                                  timeout=httpx2.Timeout(WAIT, read=CALL_LIMIT))
        with anyio.fail_after(CALL_LIMIT):
            async with send, receive, http, Client(
                streamable_http_client(self.url, http_client=http), mode=self.mode,
                elicitation_callback=self._elicited, message_handler=self._received,
            ) as client:
                if self.mode != LEGACY:
                    # 2026-07-28: the SDK shows inputRequests to the callback and retries.
                    return await client.call_tool(self.tool, self.arguments)
                return await self._legacy_call(client)

    async def _legacy_call(self, client: Client) -> CallToolResult:
        """2025-11-25: -32042 names the links; retry once the server says they are done."""
        try:
            return await client.call_tool(self.tool, self.arguments)
        except MCPError as error:
            if error.code != URL_ELICITATION_REQUIRED:
                raise
            required = UrlElicitationRequiredError.from_error(error.error)
        waiting = set()
        for params in required.elicitations:
            self._links.put(params)
            waiting.add(params.elicitation_id)
        _, notified = self._notified
        while waiting:
            waiting.discard(await notified.receive())
        return await client.call_tool(self.tool, self.arguments)

    async def _elicited(self, _context: ClientRequestContext,
                        params: ElicitRequestParams) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams), params
        self._links.put(params)
        return ElicitResult(action="accept")

    async def _received(self, message: IncomingMessage) -> None:
        if isinstance(message, ElicitCompleteNotification):
            self.completions.append(message.params.elicitation_id)
            self._notified[0].send_nowait(message.params.elicitation_id)


def text_of(result: CallToolResult) -> str:
    """The single text of a successful tool result."""
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text
