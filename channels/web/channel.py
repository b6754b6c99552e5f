"""The web chat as a channel: a browser conversation is a place like a Telegram chat.

`WebChannel` serves the page and its API (`channels.web.api`) on the shared HTTP server of its
address (`channels.http_server`), keeps every bubble on its board (`channels.web.board`), and
writes replies through the same `channels.rendering.StreamingReply` as the platforms, over
`WebTransport`: a post, then edits at `[channels.web].edit_interval`, the Stop button under a
reply being written; `channels.web.reply` shows beside the words what a platform folds into
them (the status line, the thinking, sub-agents' cards). A press of a button, or a message
typed, reaches the dispatcher as a `ChannelMessage` from the person signed in; commands are the
same as everywhere, and a press's answer is the presser's alone, as on the platforms. The files
a message came with are kept on the board too (`channels.web.uploads`), so `download` reads
them from web.db, in this process or in another after a restart.

The process owns the work, not the page: a reply goes on when its tab closes, is on the board
when a page opens again, and every open page of the person (two tabs, two browsers) sees each
change as it happens. Who may sign in is `channels.web.security`'s: the operator, by a one-time
link printed at start (`web chat: <url>`) or by `kaiwa web-link`, and with
`[channels.web].user_header` a team, each person named by a trusted reverse proxy; a host other
machines can reach is refused at start unless such a proxy is in front.
"""

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from channels.connection import ConnectionState
from channels.notices import replace_notice, send_notice
from channels.places import WebPlace
from channels.presses import answered_privately
from channels.rendering import RenderSettings
from channels.settings import WebSettings
from channels.web import security
from channels.web.api import WebApi
from channels.web.board import Board
from channels.web.reply import WebReply
from channels.web.transport import WebTransport
from core.channel import Attachment, Button, ChannelTraits, Deliver, OnPost, Reply
from core.errors import ChannelError, DownloadError

logger = logging.getLogger(__name__)

NOTICE_SECONDS = 5.0
"""A notice is a row on this process's own board: if it cannot be written, waiting won't help."""


class WebChannel(ConnectionState):
    platform = WebPlace.platform

    def __init__(
        self,
        settings: WebSettings,
        data_dir: Path,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        security.check_settings(settings)
        self._settings = settings
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings(
            settings.show_thinking, settings.show_tools, min_interval=settings.edit_interval
        )
        self._announce = announce or _say
        """Where the sign-in link is said: standard output, at once (never the log)."""
        self.board = Board(data_dir / "web.db")
        self.people = security.People(security.Keys(data_dir / "web.key"), settings)
        self.links = security.Links(data_dir / "web.links")
        self._stopping = asyncio.Event()
        self.url = ""
        """Where the page is served, once `run` listens: `http://127.0.0.1:8765`."""

    async def run(self, deliver: Deliver) -> None:
        from channels.http_server import mounted

        settings = self._settings
        async with AsyncExitStack() as serving:
            api = WebApi(self.board, self.people, self.links, settings.host, settings.allowed_hosts)
            try:
                port = await serving.enter_async_context(
                    mounted(settings.host, settings.port, api.routes(deliver))
                )
            except (OSError, ValueError) as exc:  # the port is taken, or a path on it
                problem = (
                    f"cannot serve the web chat on {settings.host}:{settings.port} ({exc}): set "
                    "[channels.web].port to a free port (0 picks one)"
                )
                raise self.cannot_connect(ChannelError(problem)) from exc
            api.port = port
            self.url = _served_at(settings.host, port)
            self.now_connected()
            self._announce(f"web chat: {self.sign_in_link()}")
            await self._stopping.wait()
            self.connected.clear()

    def sign_in_link(self) -> str:
        """A fresh one-time link that signs the operator in (never written to the log)."""
        return f"{self.url}/login?key={self.links.make()}"

    async def problems(self) -> list[str]:
        return []

    async def stop_receiving(self) -> None:
        self._stopping.set()
        self.board.streams.end()  # an open page must not hold the server open

    async def open_for_sending(self) -> None:
        self.now_connected()

    async def close(self) -> None:
        self.board.close()

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        conversation = WebPlace.of(place).conversation
        return WebReply(self.board, conversation, self._render, place, posted, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()  # in the press's own answer, to the page that pressed
        transport = WebTransport(self.board, WebPlace.of(place).conversation, role="notice")
        return await send_notice(transport, text, NOTICE_SECONDS, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        transport = WebTransport(self.board, WebPlace.of(place).conversation, role="notice")
        await replace_notice(transport, message_id, text, NOTICE_SECONDS)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """A file a person sent, from the board: at most `limit` bytes (a larger one is
        refused before it is read), a `DownloadError` in words for them otherwise."""
        try:
            return self.board.uploads.fetch(attachment, limit)
        except DownloadError as exc:
            logger.warning("web chat: file %s not handed over: %s", attachment.source, exc)
            raise


def link_for(settings: WebSettings, data_dir: Path) -> str:
    """A fresh one-time sign-in link for the web chat served with `settings` (another process
    may be serving it: the link file is shared through the data folder)."""
    if not settings.port:
        raise ChannelError(
            "[channels.web].port is 0, so the port is chosen at each start: open the link the "
            "running Kaiwa printed (web chat: …), or set a port"
        )
    secret = security.Links(data_dir / "web.links").make()
    return f"{_served_at(settings.host, settings.port)}/login?key={secret}"


def _say(line: str) -> None:
    print(line, flush=True)


def _served_at(host: str, port: int) -> str:
    """The page's address (an IPv6 host in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
