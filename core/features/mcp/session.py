"""One MCP server's session, held open by a supervisor task of its own (the `mcp` SDK).

Loaded only when a server is configured (`core.features.mcp.servers`).

The SDK's session says nothing when its server goes away: a call after a crash fails on a closed
stream. So every message from the server passes through a watch (`_Link`) that sees the stream
end the moment it does: the server is marked not running at once, before any call can reach the
dead session, the exit is logged once, and the supervisor starts it again after the backoff
(reset once a server has run for `STEADY_SECONDS`). A stdio server's stderr is read into the log
line by line, and its last line is the reason it gives when it exits, or fails to start.
"""

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, BinaryIO

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError as SessionError
from mcp.shared.message import SessionMessage

from core.agent.tools import Tool
from core.features.mcp.servers import START_SECONDS, McpError, McpServerSettings, Pause

logger = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MOST = 1.0, 30.0
STEADY_SECONDS = BACKOFF_MOST
"""A server that ran this long before it exited starts again after the first backoff."""
HTTP_TIMEOUT = httpx.Timeout(30.0, read=300.0)
"""An HTTP server's requests: 30 s to connect and send; a reply may stream for 5 minutes."""
LAST_WORDS_SECONDS = 2.0
"""How long an exited stdio server's stderr is read to its end for the reason it gives."""
STDERR_LINE_LIMIT = 64 * 1024
"""A longer line of a server's stderr is skipped."""


class McpServer:
    def __init__(
        self,
        name: str,
        settings: McpServerSettings,
        pause: Pause = asyncio.sleep,
        *,
        once: bool = False,
    ) -> None:
        self.name = name
        self._once = once
        """Tried once, never restarted (`kaiwa check`)."""
        self.settings = settings
        self.prefix = settings.prefix or name
        self.tools: dict[str, Tool] = {}
        self.problem: str | None = None
        """Why it is not running: its exit or the error that keeps it from starting."""
        self._pause = pause
        """How the supervisor waits out a backoff (a test holds it to call meanwhile)."""
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
            link = _Link(self.name, stdio=bool(self.settings.command), on_end=self._lost)
            try:
                ran = await self._run(link)
            except Exception as exc:
                self.problem = link.failure(exc)
                self._answered.set()
                if self._once:
                    return
                logger.warning(
                    "MCP %s: %s; trying again in %.0f s", self.name, self.problem, backoff
                )
            else:
                if self._once:
                    return
                if ran is None:
                    logger.warning("MCP %s: restarting after a failed call", self.name)
                    continue
                backoff = BACKOFF_FIRST if ran >= STEADY_SECONDS else backoff
                logger.warning(
                    "MCP %s stopped (%s); starting it again in %.0f s",
                    self.name,
                    self.problem,
                    backoff,
                )
            finally:
                self._session = None
                self.connected.clear()
                self._restart.clear()
            await self._pause(backoff)
            backoff = min(backoff * 2, BACKOFF_MOST)

    async def _run(self, link: "_Link") -> float | None:
        """Connect, serve calls until a failed call asks for a restart (None) or the server's
        side ends; then how long it ran, `problem` saying why it ended."""
        async with self._connected(link) as session:
            await self._serve(session, link)
            began = time.monotonic()
            await _first_of(self._restart, link.ended)
            if not link.ended.is_set():
                return None
            self.problem = await link.why_ended()
            return time.monotonic() - began

    async def _serve(self, session: ClientSession, link: "_Link") -> None:
        listed = await session.list_tools()
        if link.ended.is_set():  # gone as it answered: never offered to a call
            raise McpError("it stopped as it listed its tools")
        self.tools = {tool.name: self._tool(tool) for tool in listed.tools}
        self._session, self.problem = session, None
        self._answered.set()
        self.connected.set()
        logger.info("MCP %s: %d tools", self.name, len(self.tools))

    def _lost(self, why: str) -> None:
        """The server's side of the session ended: no call may reach it from now on."""
        self._session, self.problem = None, why
        self.connected.clear()

    @contextlib.asynccontextmanager
    async def _connected(self, link: "_Link") -> AsyncIterator[ClientSession]:
        settings = self.settings
        async with contextlib.AsyncExitStack() as stack:
            if settings.command:
                parameters = StdioServerParameters(
                    command=settings.command, args=list(settings.args), env=settings.environment()
                )
                streams = await stack.enter_async_context(link.spawning(parameters))
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
            incoming = await stack.enter_async_context(link.watching(streams[0]))
            session = await stack.enter_async_context(ClientSession(incoming, streams[1]))
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
        """Call `tool`; its result in words. Raises `McpError` at once while the server is not
        running, and for a failed call (the server is then started again)."""
        session = self._session
        if session is None:
            raise McpError(self._down(f"{self.name} is not running"))
        try:
            result = await session.call_tool(tool, dict(arguments))
        except asyncio.CancelledError:
            self._start_again(session)  # given up on mid-call: the next call gets a fresh server
            raise
        except Exception as exc:
            stopped = self._session is not session or _connection_closed(exc)
            self._start_again(session)
            if stopped:
                what = f"{self.prefix}.{tool} failed: {self.name} stopped during the call"
                raise McpError(self._down(what)) from exc
            raise McpError(
                f"{self.prefix}.{tool} failed: {_plainly(exc)}; {self.name} is restarting"
            ) from exc
        text = described(result)
        if result.isError:
            raise McpError(f"{self.prefix}.{tool}: {text or 'the server reported an error'}")
        return text

    def _down(self, what: str) -> str:
        why = f" ({self.problem})" if self.problem else ""
        return f"{what}{why}; restarting, try again shortly"

    def _start_again(self, session: ClientSession) -> None:
        """Restart the server a call failed on, unless it has been restarted meanwhile."""
        if self._session is session:
            self._session = None
            self.connected.clear()
            self._restart.set()


class _Link:
    """How one connection ends: the server's messages pass through `watching`, which tells the
    moment they stop (`ended`, and `on_end` at once); a stdio server's stderr is read into the
    log, its last line kept."""

    def __init__(self, name: str, *, stdio: bool, on_end: Callable[[str], None]) -> None:
        self.name = name
        self.stdio = stdio
        self.ended = asyncio.Event()
        self._on_end = on_end
        self._last_line = ""
        self._stderr: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def spawning(self, parameters: StdioServerParameters) -> AsyncIterator[tuple[Any, Any]]:
        """The SDK's stdio transport, the server's stderr read through a pipe of ours until the
        transport has ended the process."""
        reading, writing = os.pipe()
        with os.fdopen(reading, "rb", buffering=0) as source:
            try:
                with os.fdopen(writing, "w") as errlog:
                    async with stdio_client(parameters, errlog=errlog) as streams:
                        errlog.close()  # the process holds its own copy: its exit ends the pipe
                        self._stderr = asyncio.create_task(self._read_stderr(source))
                        yield streams
            finally:  # the process has ended: its stderr is read to the end, or given up on
                if self._stderr is not None:
                    await self._last_words()
                    self._stderr.cancel()
                    await asyncio.gather(self._stderr, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def watching(
        self, incoming: MemoryObjectReceiveStream[SessionMessage | Exception]
    ) -> AsyncIterator[MemoryObjectReceiveStream[SessionMessage | Exception]]:
        """`incoming` passed on, noticing when the server ends it."""
        sender, receiver = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        forwarding = asyncio.create_task(self._forward(incoming, sender))
        try:
            yield receiver
        finally:
            forwarding.cancel()
            for stream in (incoming, sender, receiver):  # whoever would have, may never have
                stream.close()  # started: the forwarder, the session's receiving
            with anyio.CancelScope(shield=True):  # left as a transport fails: awaits still end
                await asyncio.gather(forwarding, return_exceptions=True)

    async def _forward(
        self,
        incoming: MemoryObjectReceiveStream[SessionMessage | Exception],
        sender: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        async with sender:
            try:
                async for message in incoming:
                    await sender.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # closed from our side: the session is being left
            self.ended.set()
            self._on_end(self._exit())

    async def why_ended(self) -> str:
        """Why the server's side ended, once a stdio server's stderr is read to its end."""
        await self._last_words()
        return self._exit()

    def failure(self, exc: Exception) -> str:
        """Why connecting failed: a stdio server that exited in its own last words, anything
        else as it was raised. Read once the connection is left, its stderr read to the end."""
        if self.stdio and (self.ended.is_set() or _connection_closed(exc)):
            return self._exit()
        return _plainly(exc)

    async def _last_words(self) -> None:
        """Wait until the server's stderr ends (it has exited), for `LAST_WORDS_SECONDS` at
        most (a process it started may hold the pipe open)."""
        if self._stderr is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stderr), LAST_WORDS_SECONDS)

    def _exit(self) -> str:
        if not self.stdio:
            return "its connection ended"
        if self._last_line:
            return f"it exited: {self._last_line}"
        return "it exited without a word on stderr"

    async def _read_stderr(self, source: BinaryIO) -> None:
        reader = asyncio.StreamReader(limit=STDERR_LINE_LIMIT)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), source
        )
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the limit: skipped
                    continue
                if not line:
                    return
                if text := line.decode(errors="replace").strip():
                    self._last_line = text
                    logger.info("MCP %s says: %s", self.name, text)
        finally:
            transport.close()


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def described(result: mcp_types.CallToolResult) -> str:
    """A tool's result in words for the model: each piece of its content, or, with none, its
    structured content as JSON."""
    if not result.content and result.structuredContent is not None:
        return json.dumps(result.structuredContent, ensure_ascii=False)
    return "\n".join(_piece(part) for part in result.content)


def _piece(part: mcp_types.ContentBlock) -> str:
    """Text as it is, an embedded text resource with its URI, and anything else (an image,
    audio, binary data) by its kind, type and size; a link to a resource by what it says of
    it."""
    if isinstance(part, mcp_types.TextContent):
        return part.text
    if isinstance(part, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(part, mcp_types.ImageContent) else "audio"
        return f"[{kind}: {part.mimeType}, {_decoded_size(part.data):,} bytes, not shown]"
    if isinstance(part, mcp_types.EmbeddedResource):
        return _resource(part.resource)
    if isinstance(part, mcp_types.ResourceLink):
        return _link(part)
    return f"[{getattr(part, 'type', 'content')}: not shown]"


def _resource(
    resource: mcp_types.TextResourceContents | mcp_types.BlobResourceContents,
) -> str:
    kind = resource.mimeType or "unknown type"
    if isinstance(resource, mcp_types.TextResourceContents):
        return f"[resource {resource.uri} ({kind})]\n{resource.text}"
    size = _decoded_size(resource.blob)
    return f"[resource {resource.uri}: {kind}, {size:,} bytes, not shown]"


def _link(link: mcp_types.ResourceLink) -> str:
    named = f"{link.name} ({link.title})" if link.title else link.name
    said = [f"link to a resource: {named}"]
    if link.description:
        said.append(link.description)
    said.append(str(link.uri))
    if link.mimeType:
        said.append(link.mimeType)
    if link.size is not None:
        said.append(f"{link.size:,} bytes")
    return f"[{'; '.join(said)}]"


def _decoded_size(data: str) -> int:
    """The size of what base64 `data` encodes, without decoding it."""
    data = data.strip()
    return len(data) * 3 // 4 - data[-2:].count("=")


def _connection_closed(exc: BaseException) -> bool:
    """An error of a connection found gone: its server exited."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_closed(each) for each in exc.exceptions)
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError):
        return True
    return isinstance(exc, SessionError) and exc.error.code == mcp_types.CONNECTION_CLOSED


def _plainly(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_plainly(each) for each in exc.exceptions)
    if isinstance(exc, McpError):  # already in words
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
