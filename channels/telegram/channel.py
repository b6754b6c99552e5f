"""The Telegram adapter: starting, polling or taking webhook posts, and sending.

Built on python-telegram-bot's `Bot`, inside our own event loop, with our own long-polling loop
instead of the library's `Updater`: Telegram forgets an update only once a later `getUpdates`
confirms it (its `offset`), and the updater confirms everything it fetched whatever became of it.
Here an update is confirmed only once the dispatcher has recorded its message, so a message that
arrives while the database is away is fetched again later instead of being lost. An update that
cannot be parsed or handled is confirmed, so it never blocks the ones behind it (what is read
from an update, and how one that cannot be is logged: `channels.telegram.receiving`).
A batch's chats are handed over side by side, each chat's messages in order; handing a message
over only records it and queues its turn, so one chat's long reply never delays another and
`/stop` is read while a reply streams.

Webhook mode (`mode = "webhook"`): Telegram posts each update to `webhook_url`, which reaches
the server `run` starts (any worker of a cluster behind a load balancer: no lease is needed). A
request without the secret token Kaiwa registered gets 401; an update is answered 200 once its
message is recorded, and 500 when it could not be, so Telegram delivers it again.

Stopping never cancels a request in flight (a cancelled httpx request can keep its pooled
connection taken for good): the long poll is awaited through a shield, so `stop_receiving`
returns at once and the poll itself ends when Telegram answers it or `close` shuts the
connections. `connected` follows the polls: cleared, with `problem` saying why, while Telegram
cannot be reached; `run` can be called again after it raised.

Replies and notices go out through `channels.telegram.transport`; attached files are fetched
through `channels.telegram.files`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from telegram import Bot, BotCommand, Update
from telegram.error import InvalidToken, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from channels.calls import PlatformError
from channels.connection import ConnectionState, unreachable
from channels.notices import replace_notice, send_notice
from channels.places import TelegramPlace
from channels.presses import answered_privately
from channels.rendering import RenderSettings, StreamingReply
from channels.settings import TelegramSettings
from channels.telegram.files import TelegramFiles
from channels.telegram.receiving import Updates
from channels.telegram.transport import TelegramChats, retry_seconds
from core.channel import COMMANDS, Attachment, Button, ChannelTraits, Deliver, OnPost, Reply
from core.errors import ChannelError, StoreError
from core.metrics import PLATFORM_API_ERRORS, PLATFORM_RATE_LIMITS

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger(__name__)

PLATFORM = TelegramPlace.platform
CONNECTION_POOL_SIZE = 32
"""Connections to the Bot API for every call but the long poll. Telegram takes about 30 messages
a second from a bot, so more connections than this only wait; and httpcore checks every pooled
connection each time a request is assigned one (a socket poll each), which with the library's
default of 256 was a third of Kaiwa's CPU in a 300-chat burst (benchmarks/platform_burst.py)."""
POLL_PAUSE_SECONDS, MAX_POLL_PAUSE_SECONDS = 1.0, 30.0
CONFIRM_SECONDS = 5.0  # the wait for Telegram's answer to the confirming call at a stop
UPDATES = [Update.MESSAGE, Update.CALLBACK_QUERY]


class TelegramChannel(ConnectionState):
    platform = PLATFORM

    def __init__(
        self,
        settings: TelegramSettings,
        token: str,
        *,
        connection_pool_size: int = CONNECTION_POOL_SIZE,
    ) -> None:
        """`connection_pool_size`: connections for every call but the long poll (tests make
        it small, so that one connection never given back would soon show). `connected` is
        set while polls reach Telegram."""
        super().__init__()
        self._settings = settings
        self._render = RenderSettings.of(settings)
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._updates_request = HTTPXRequest(read_timeout=settings.poll_timeout + 10)
        self._bot = Bot(
            token,
            base_url=settings.base_url,
            base_file_url=settings.base_file_url,
            request=HTTPXRequest(connection_pool_size=connection_pool_size),
            get_updates_request=self._updates_request,
        )
        self._files = TelegramFiles(self._bot, settings)
        self._chats = TelegramChats(self._bot, paced=settings.paced)
        self._updates = Updates(self._chats, settings, self._files)
        self._stopping = asyncio.Event()
        self._offset: int | None = None
        """The first update not yet confirmed to Telegram (None: none seen yet)."""
        self._fetch: asyncio.Future[list[dict[str, Any]]] | None = None
        """The `getUpdates` in flight, if any: shielded, never cancelled."""

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Telegram: a token Telegram does not accept, or a
        Telegram it cannot reach."""
        try:
            await self._bot.initialize()  # asks getMe (within the library's timeouts) once
        except InvalidToken:
            return [_token_problem(self._settings)]
        except TelegramError as exc:
            return [self._unreachable(exc)]
        return []

    async def run(self, deliver: Deliver) -> None:
        if self._settings.mode == "webhook":
            await self._serve_webhook(deliver)
            return
        await self._start()
        polling = asyncio.create_task(self._poll(deliver), name="telegram polling")
        stopping = asyncio.create_task(self._stopping.wait(), name="telegram stopping")
        try:
            await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await self._stop_polling(polling)
            self.connected.clear()
        await self._confirm()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def open_for_sending(self) -> None:
        with self._connecting():
            await self._bot.initialize()
        self.now_connected()

    async def close(self) -> None:
        """Close the connections; a long poll still in flight ends with them."""
        await self._bot.shutdown()
        # `shutdown` skips a bot never initialized, whose connections a download may have used
        await self._bot.request.shutdown()
        await self._files.close()
        if self._fetch is not None:
            await asyncio.gather(self._fetch, return_exceptions=True)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """`core.channel.Files.download`: an attached file by its file id
        (`channels.telegram.files`)."""
        return await self._files.download(attachment, limit)

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        message_id = int(reply_to.rsplit(":", 1)[1]) if reply_to else None
        transport = self._chats.transport(TelegramPlace.of(place).chat, message_id)
        return StreamingReply(transport, self._render, place, posted, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        transport = self._chats.transport(TelegramPlace.of(place).chat)
        return await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        transport = self._chats.transport(TelegramPlace.of(place).chat)
        await replace_notice(transport, message_id, text, self._settings.final_edit_seconds)

    # -- connecting ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connecting(self) -> Iterator[None]:
        """Telegram's refusals while connecting, in words with the fix: a token Telegram refuses
        raises `ChannelError` (a person must fix it); a Telegram that cannot be reached raises
        `PlatformError` (trying again later may do); either sets `problem`."""
        try:
            yield
        except InvalidToken as exc:
            raise self.cannot_connect(ChannelError(_token_problem(self._settings))) from exc
        except TelegramError as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc

    async def _start(self) -> None:
        """Log in, register the commands, take over from any webhook (`_connecting` says what
        a failure raises)."""
        with self._connecting():
            await self._bot.initialize()
            await self._bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
            await self._bot.delete_webhook()  # a webhook left set would refuse every getUpdates
        self.now_connected()
        logger.info("Telegram: polling as @%s", self._bot.username)

    async def _serve_webhook(self, deliver: Deliver) -> None:
        """Register the webhook (with its secret), then take the updates Telegram posts until
        the channel stops. The webhook is left set: other workers may still serve it."""
        settings, secret = self._settings, os.environ.get(self._settings.webhook_secret_env, "")
        with self._connecting():
            await self._bot.initialize()
            await self._bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
            await self._bot.set_webhook(
                settings.webhook_url, secret_token=secret, allowed_updates=list(UPDATES)
            )
        address = (settings.webhook_host, settings.webhook_port, settings.webhook_path)
        posted = functools.partial(self._posted, secret, deliver)
        setting = "[channels.telegram].webhook_port"
        async with self.receiving_posts(posted, address, "Telegram updates", setting):
            logger.info("Telegram: receiving updates at %s", settings.webhook_url)
            await self._stopping.wait()

    async def _posted(self, secret: str, deliver: Deliver, request: web.Request) -> web.Response:
        """One update Telegram posted: 200 once recorded, 500 when it could not be (Telegram
        posts it again), 401 without our secret, 400 for a body that is no update."""
        from aiohttp import web  # loaded with the webhook server (`receiving_posts`)

        if request.headers.get("X-Telegram-Bot-Api-Secret-Token", "") != secret:
            return web.Response(status=401)
        try:
            raw = await request.json()
        except ValueError:
            return web.Response(status=400)
        if not isinstance(raw, dict) or "update_id" not in raw:
            return web.Response(status=400)
        try:
            await self._updates.receive(raw, deliver)
        except StoreError:
            return web.Response(status=500)
        return web.Response(status=200)

    def _unreachable(self, exc: Exception) -> str:
        return unreachable("Telegram", self._settings.base_url, "[channels.telegram].base_url", exc)

    # -- polling -------------------------------------------------------------------------------

    async def _poll(self, deliver: Deliver) -> None:
        """Fetch updates and hand each over in order; confirm an update only once it is recorded
        (or will never be: ignored, unreadable). A message the store could not record stops the
        batch there, and after a pause it and those after it are fetched again. Stops between
        two polls once `stop_receiving` was called; a batch fetched after that is left to the
        next start."""
        pause = POLL_PAUSE_SECONDS
        while not self._stopping.is_set():
            try:
                batch = await self._fetch_updates()
            except InvalidToken as exc:
                PLATFORM_API_ERRORS.labels(self.platform).inc()
                raise self.cannot_connect(ChannelError(_token_problem(self._settings))) from exc
            except RetryAfter as exc:
                PLATFORM_RATE_LIMITS.labels(self.platform).inc()
                await self._pause(retry_seconds(exc))
                continue
            except TelegramError as exc:
                PLATFORM_API_ERRORS.labels(self.platform).inc()
                self.lost(self._unreachable(exc))
                logger.warning("Telegram: fetching updates failed (%s); again in %g s", exc, pause)
                await self._pause(pause)
                pause = min(pause * 2, MAX_POLL_PAUSE_SECONDS)
                continue
            pause = POLL_PAUSE_SECONDS
            self.now_connected()
            if batch and not self._stopping.is_set() and not await self._hand_over(batch, deliver):
                await self._pause(POLL_PAUSE_SECONDS)  # the store already waited its turn

    async def _fetch_updates(self) -> list[dict[str, Any]]:
        """One long poll, shielded: cancelling the wait for it never cancels the request."""
        self._fetch = asyncio.ensure_future(self._get_updates(timeout=self._settings.poll_timeout))
        return await asyncio.shield(self._fetch)

    async def _stop_polling(self, polling: asyncio.Task[None]) -> None:
        """Let the polling loop end: a batch being handed over is finished first; a long poll
        is left in flight (only the wait for it is cancelled). Raise what ended the loop."""
        if not polling.done() and self._fetch is not None and not self._fetch.done():
            polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        if not polling.cancelled() and polling.exception() is not None:
            raise polling.exception()  # type: ignore[misc]

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less if the channel stops meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _hand_over(self, batch: list[dict[str, Any]], deliver: Deliver) -> bool:
        """Hand a batch to the dispatcher: each chat's updates in order, chats side by side (a
        message waits for its record, and records of many chats share a transaction). Move the
        offset past every update up to the first that could not be recorded; False if one
        could not."""
        chats: dict[object, list[dict[str, Any]]] = {}
        for raw in batch:
            chats.setdefault(_chat_of(raw), []).append(raw)
        unrecorded: list[int] = []

        async def in_order(updates: list[dict[str, Any]]) -> None:
            for raw in updates:
                try:
                    await self._updates.receive(raw, deliver)
                except StoreError:
                    unrecorded.append(raw["update_id"])
                    return  # this chat's later updates wait for the same redelivery

        await asyncio.gather(*(in_order(updates) for updates in chats.values()))
        self._offset = min(unrecorded) if unrecorded else batch[-1]["update_id"] + 1
        return not unrecorded

    async def _get_updates(
        self, read_timeout: float | None = None, **parameters: object
    ) -> list[dict[str, Any]]:
        """`getUpdates`, unparsed (the library's own method parses the whole batch at once, so
        one update it cannot parse would fail them all). `read_timeout`: the library's wait for
        the answer, if not the long poll's."""
        query = {"offset": self._offset, **parameters, "allowed_updates": UPDATES}
        encoded = urlencode({k: json.dumps(v) for k, v in query.items() if v is not None})
        url = f"{self._settings.base_url}{self._bot.token}/getUpdates?{encoded}"
        if read_timeout is None:
            result = await self._updates_request.post(url)
        else:
            result = await self._updates_request.post(url, read_timeout=read_timeout)
        return list(result) if isinstance(result, list) else []

    async def _confirm(self) -> None:
        """Tell Telegram which updates were handled, so a restart does not fetch them again."""
        if self._offset is None:
            return
        with contextlib.suppress(TelegramError):
            await self._get_updates(CONFIRM_SECONDS, timeout=0, limit=1)


def _chat_of(raw: dict[str, Any]) -> object:
    """The chat an unparsed update (a message, or a press on one) belongs to; its own id when
    it has none we can read."""
    query = raw.get("callback_query")
    message = query.get("message") if isinstance(query, dict) else raw.get("message")
    chat = message.get("chat") if isinstance(message, dict) else None
    return chat.get("id", raw["update_id"]) if isinstance(chat, dict) else raw["update_id"]


def _token_problem(settings: TelegramSettings) -> str:
    return (
        f"Telegram rejected the bot token in ${settings.token_env} (401 Unauthorized): copy the "
        "token @BotFather gave you into that variable"
    )
