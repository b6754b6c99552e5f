"""Slack's Socket Mode, made to report to the channel: slack_sdk's client and bolt's handler.

slack_sdk's client asks `apps.connections.open` for a websocket URL at every (re)connection,
and on its own would retry a URL it cannot have forever and never say when it is connected;
bolt's handler would open a stock client with a session of its own. Here the client asks the
channel for each URL (`Connecting.socket_url`, which may hand over one it kept) and tells it
when the socket is up, and `serve_socket_mode` runs one such client until the channel stops or
the client is lost, then closes it, whatever it was doing.

slack_sdk says why a connection failed only in its own log, with a traceback, at every pause
between tries (`PING_SECONDS`). Here its log goes through `LibraryLog`: a failure Kaiwa says
itself is kept to debug level, and a connection failure is said by `ConnectionTrouble` instead,
in one line per cause (what failed, why, that it is tried again), repeated at most once per
`REPEAT_SECONDS`, and set as the channel's `problem`. A failed connection asks for a new URL at
the next try, as Slack hands out each one for a single, short-lived use.
"""

import asyncio
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from channels.calls import PlatformError
from channels.throttled_log import ThrottledLog
from core.errors import ChannelError

logger = logging.getLogger(__name__)

FRESH_URL_SECONDS = 10.0  # a Socket Mode URL kept from `problems` is used only this soon
PING_SECONDS = 10.0  # Socket Mode keepalive, and the library's pause between failed connects
REPEAT_SECONDS = 300.0  # the same connection failure is said again at most this often
SAID_BY_KAIWA = (ChannelError, PlatformError)
"""Failures the channel says itself (a Socket Mode URL Slack would not give)."""
CONNECTION_FAILURES = (aiohttp.ClientError, OSError, TimeoutError)
TICKET = re.compile(r"ticket=[^&\s'\"]+")


class Connecting(Protocol):
    """What the client reports to: the channel."""

    connected: asyncio.Event

    async def socket_url(self) -> str:
        """A URL for the next connection; raises `ChannelError` or `PlatformError` when Slack
        will not give one."""
        ...

    def socket_connected(self) -> None:
        """The socket is up."""
        ...

    def lost(self, problem: str) -> None:
        """Not connected, for the reason given (the client tries again)."""
        ...


class ConnectionTrouble:
    """Socket Mode connection failures, said in Kaiwa's words: one line per cause at once, then
    at most one per `REPEAT_SECONDS` (counting those left out); forgotten once connected, so
    the next outage is said at once."""

    def __init__(self, channel: Connecting, pause: float) -> None:
        self._channel = channel
        self._pause = pause
        self._said: dict[str, ThrottledLog] = {}

    def failed(self, failure: BaseException) -> None:
        cause = _cause(failure)
        problem = (
            f"the Slack Socket Mode connection failed ({cause}); it is tried again every "
            f"{self._pause:g} s"
        )
        self._channel.lost(problem)
        said = self._said.setdefault(cause, ThrottledLog(logger, REPEAT_SECONDS))
        said.warning("Slack: %s", problem)

    def connected(self) -> None:
        self._said.clear()


class LibraryLog(logging.LoggerAdapter[logging.Logger]):
    """slack_sdk's Socket Mode log, without what Kaiwa says itself: a record written while
    handling a failure of `SAID_BY_KAIWA` or `CONNECTION_FAILURES` goes to debug level (its
    traceback with it), and a connection failure to `on_failure`."""

    def __init__(self, library: logging.Logger, on_failure: Callable[[BaseException], None]):
        super().__init__(library, {})
        self._on_failure = on_failure

    @property
    def level(self) -> int:
        """bolt's Socket Mode handler reads its client's `logger.level`."""
        return self.logger.getEffectiveLevel()

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        failure = sys.exc_info()[1] if level >= logging.ERROR else None
        if isinstance(failure, SAID_BY_KAIWA + CONNECTION_FAILURES):
            if isinstance(failure, CONNECTION_FAILURES):
                self._on_failure(failure)
            level, kwargs["exc_info"] = logging.DEBUG, failure
        super().log(level, msg, *args, **kwargs)


@dataclass(frozen=True)
class KeptUrl:
    url: str
    at: float

    @property
    def fresh(self) -> bool:
        return time.monotonic() - self.at < FRESH_URL_SECONDS


class SocketClient(SocketModeClient):
    """slack_sdk's Socket Mode client, reporting to its channel. Every (re)connection asks
    `issue_new_wss_url` first, so the channel is not connected from then until `connect`
    succeeds; a URL that cannot be had marks the client closed (its loops then end quietly
    instead of retrying the same failure forever), keeps the error in `failure` and sets
    `lost`. `ping_seconds` is the keepalive interval and the pause between failed connects."""

    def __init__(
        self,
        channel: Connecting,
        app_token: str,
        web_client: AsyncWebClient,
        ping_seconds: float = PING_SECONDS,
    ) -> None:
        self._trouble = ConnectionTrouble(channel, ping_seconds)
        library = LibraryLog(logging.getLogger("slack_sdk.socket_mode"), self._failed)
        super().__init__(
            app_token,
            logger=library,  # type: ignore[arg-type]
            web_client=web_client,
            ping_interval=ping_seconds,
        )
        self._channel = channel
        self.lost = asyncio.Event()
        self.failure: Exception | None = None
        self.asking = False
        """An `apps.connections.open` is in flight (and is let finish)."""

    async def issue_new_wss_url(self) -> str:
        self._channel.connected.clear()
        self.asking = True
        try:
            return await self._channel.socket_url()
        except (ChannelError, PlatformError) as exc:
            self.failure = exc
            self.lost.set()
            self.closed = True  # the connect loop ends quietly; the channel closes the client
            raise
        finally:
            self.asking = False

    async def connect(self) -> None:
        await super().connect()
        if await self.is_connected():
            self._trouble.connected()
            self._channel.socket_connected()

    def _failed(self, failure: BaseException) -> None:
        """The library's connection failed (it tries again after its pause): said, and the
        next try asks for a new URL."""
        self.wss_uri = None
        self._trouble.failed(failure)


class _SocketModeHandler(AsyncSocketModeHandler):
    """bolt's Socket Mode handler on a `SocketClient` (bolt's own constructor would open a
    stock client, with a session of its own, which is why it is not called)."""

    def __init__(self, app: AsyncApp, client: SocketClient) -> None:
        self.app = app
        self.app_token = client.app_token
        self.client = client
        client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]


async def serve_socket_mode(app: AsyncApp, client: SocketClient, stopping: asyncio.Event) -> None:
    """Take `app`'s events through `client` until `stopping` is set, or until the client is lost
    (then raise its failure)."""
    handler = _SocketModeHandler(app, client)
    connecting = asyncio.create_task(handler.connect_async(), name="slack socket mode")
    try:
        await _first_of(stopping, client.lost)
    finally:
        await handler.close_async()
        await _ended(connecting, client)
    if client.failure is not None and not stopping.is_set():
        raise client.failure


def _cause(failure: BaseException) -> str:
    """Why a connection failed, in a few words, without the URL's single-use ticket."""
    if isinstance(failure, aiohttp.WSServerHandshakeError):
        return f"Slack answered HTTP {failure.status}"
    if isinstance(failure, aiohttp.ClientConnectorError):
        why = failure.os_error.strerror or failure.os_error
        return f"cannot reach {failure.host}:{failure.port}: {why}"
    if isinstance(failure, TimeoutError):
        return "Slack did not answer in time"
    return TICKET.sub("ticket=…", f"{type(failure).__name__}: {failure}")


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _ended(connecting: asyncio.Task[None], client: SocketClient) -> None:
    """Let a closed client's connect task end: an `apps.connections.open` in flight is let
    finish; otherwise it is at most waiting to try again, which is cut short."""
    if not connecting.done() and not client.asking:
        connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
