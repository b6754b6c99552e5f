"""One MCP server's session, held open by a supervisor task of its own (the `mcp` SDK).

Loaded only when a server is configured (`core.features.mcp.servers`).
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from core.agent.tools import Tool
from core.features.mcp.servers import McpError, McpServerSettings

logger = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MOST = 1.0, 30.0
HTTP_TIMEOUT = httpx.Timeout(30.0, read=300.0)
"""An HTTP server's requests: 30 s to connect and send; a reply may stream for 5 minutes."""
START_SECONDS = 10.0
"""How long start-up waits for a server's first tool list before going on without it."""


class McpServer:
    def __init__(self, name: str, settings: McpServerSettings) -> None:
        self.name = name
        self.settings = settings
        self.prefix = settings.prefix or name
        self.tools: dict[str, Tool] = {}
        self.problem: str | None = None
        self._session: ClientSession | None = None
        self._answered = asyncio.Event()
        """Set once the first connection either listed its tools or failed."""
        self.connected = asyncio.Event()
        """Set while a session is open and its tools listed."""
        self._restart = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the supervisor; return once the tools are listed, it failed, or it took
        `START_SECONDS` (it goes on trying)."""
        self._task = asyncio.create_task(self._supervise(), name=f"mcp {self.name}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), START_SECONDS)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _supervise(self) -> None:
        backoff = BACKOFF_FIRST
        while True:
            try:
                async with self._connected() as session:
                    listed = await session.list_tools()
                    self.tools = {tool.name: self._tool(tool) for tool in listed.tools}
                    self._session, self.problem, backoff = session, None, BACKOFF_FIRST
                    self._answered.set()
                    self.connected.set()
                    logger.info("MCP %s: %d tools", self.name, len(self.tools))
                    await self._restart.wait()
                    logger.warning("MCP %s: restarting after a failed call", self.name)
            except Exception as exc:
                self.problem = _plainly(exc)
                self._answered.set()
                logger.warning(
                    "MCP %s: %s; trying again in %.0f s", self.name, self.problem, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MOST)
            finally:
                self._session = None
                self.connected.clear()
                self._restart.clear()

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[ClientSession]:
        settings = self.settings
        async with contextlib.AsyncExitStack() as stack:
            if settings.command:
                parameters = StdioServerParameters(
                    command=settings.command, args=list(settings.args), env=dict(os.environ)
                )
                streams = await stack.enter_async_context(stdio_client(parameters))
            else:
                headers = {
                    key: os.environ.get(env, "") for key, env in settings.headers_env.items()
                }
                client = await stack.enter_async_context(
                    httpx.AsyncClient(headers=headers, timeout=HTTP_TIMEOUT, follow_redirects=True)
                )
                streams = await stack.enter_async_context(
                    streamable_http_client(settings.url, http_client=client)
                )
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            yield session

    def _tool(self, listed: mcp_types.Tool) -> Tool:
        name = f"{self.prefix}.{listed.name}"
        schema = dict(listed.inputSchema or {})
        parameters = {
            **schema,
            "type": "object",
            "properties": schema.get("properties", {}),
            "required": schema.get("required", []),
        }

        async def call(**arguments: Any) -> str:
            return await self.call(listed.name, arguments)

        description = listed.description or f"{listed.name} from the {self.name} MCP server"
        return Tool(name, description.strip(), call, parameters)

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        session = self._session
        if session is None:
            why = f" ({self.problem})" if self.problem else ""
            raise McpError(f"the {self.name} MCP server is not running{why}; it is restarting")
        try:
            result = await session.call_tool(tool, dict(arguments))
        except asyncio.CancelledError:
            self._start_again()  # given up on mid-call: the next call gets a fresh server
            raise
        except Exception as exc:
            self._start_again()
            raise McpError(f"{self.prefix}.{tool} failed: {_plainly(exc)}") from exc
        text = "\n".join(_described(part) for part in result.content)
        if result.isError:
            raise McpError(f"{self.prefix}.{tool}: {text or 'the server reported an error'}")
        return text

    def _start_again(self) -> None:
        self._session = None
        self.connected.clear()
        self._restart.set()


def _described(part: Any) -> str:
    """One piece of a result as text: text as it is, anything else by its kind and size."""
    if isinstance(part, mcp_types.TextContent):
        return part.text
    if isinstance(part, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(part, mcp_types.ImageContent) else "audio"
        return f"[{kind}: {part.mimeType}, {len(part.data) * 3 // 4:,} bytes, not shown]"
    if isinstance(part, mcp_types.EmbeddedResource):
        return f"[resource {part.resource.uri}]"
    return f"[{getattr(part, 'type', 'content')}]"


def _plainly(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_plainly(each) for each in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
