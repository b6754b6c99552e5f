"""Whether a channel can receive now, and why not: the `connected` and `problem` of
`core.channel.Channel`, kept the same way by every platform adapter.

`connected` is set while events can arrive; `problem` is why the channel last could not connect,
in words with the fix, and is cleared once it connects. An adapter is a `ConnectionState`: it calls
`now_connected` when its connection is up, `lost` when it drops with a reason, and raises
`cannot_connect(error)` when it gives up, so the supervisor and the start line show the words the
exception carries. The state is plain attributes, since the supervisor sets them too when a
channel's `run` fails in a way the channel could not describe.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from core.errors import ChannelError

if TYPE_CHECKING:
    from aiohttp import web

E = TypeVar("E", bound=Exception)


class ConnectionState:
    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.problem: str | None = None

    def now_connected(self) -> None:
        self.problem = None
        self.connected.set()

    def lost(self, problem: str) -> None:
        """Not connected, for the reason given (a reconnect may be under way)."""
        self.connected.clear()
        self.problem = problem

    def cannot_connect(self, error: E) -> E:
        """Record why the channel cannot connect; returns `error`, for the caller to raise."""
        self.lost(str(error))
        return error

    @asynccontextmanager
    async def receiving_posts(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        address: tuple[str, int, str],
        what: str,
        setting: str,
    ) -> AsyncIterator[None]:
        """`handler` answers POSTs to (host, port, path) for the block, with the channel
        connected meanwhile (a platform posting its events: Slack's HTTP mode, Telegram's
        webhook). A port that cannot be had is a `ChannelError` naming `setting`."""
        host, port, path = address
        from channels.http_server import mounted  # aiohttp's server loads only when it serves

        async with AsyncExitStack() as serving:
            try:
                await serving.enter_async_context(mounted(host, port, {("POST", path): handler}))
            except OSError as exc:
                problem = (
                    f"cannot listen for {what} on {host}:{port} ({exc}): set {setting} to a free "
                    "port"
                )
                raise self.cannot_connect(ChannelError(problem)) from exc
            except ValueError as exc:  # another listener of this process has the path there
                raise self.cannot_connect(ChannelError(f"cannot listen for {what}: {exc}")) from exc
            self.now_connected()
            try:
                yield
            finally:
                self.connected.clear()


def unreachable(service: str, url: str, setting: str, error: BaseException) -> str:
    """Why a platform could not be reached, and what to check: the network and `setting`."""
    return f"cannot reach {service} at {url} ({error}): check the network and {setting}"
