"""Slack's Socket Mode, made to report to the channel: slack_sdk's client and bolt's handler.

slack_sdk's client asks `apps.connections.open` for a websocket URL at every (re)connection,
and on its own would retry a URL it cannot have forever and never say when it is connected;
bolt's handler would open a stock client with a session of its own. Here the client asks the
channel for each URL (`Connecting.socket_url`, which may hand over one it kept) and tells it
when the socket is up, and `serve_socket_mode` runs one such client until the channel stops or
the client is lost, then closes it, whatever it was doing.
"""

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from channels.rendering import PlatformError
from core.errors import ChannelError

FRESH_URL_SECONDS = 10.0  # a Socket Mode URL kept from `problems` is used only this soon
PING_SECONDS = 10.0  # Socket Mode keepalive, and the library's pause between failed connects


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
    `lost`."""

    def __init__(
        self,
        channel: Connecting,
        app_token: str,
        web_client: AsyncWebClient,
        sdk_logger: logging.Logger,
    ) -> None:
        super().__init__(
            app_token, logger=sdk_logger, web_client=web_client, ping_interval=PING_SECONDS
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
            self._channel.socket_connected()


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
