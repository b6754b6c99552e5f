"""Telegram: private chats (and, when enabled, group messages addressed to the bot).

Built on python-telegram-bot's `Bot`, inside our own event loop, with our own long-polling loop
instead of the library's `Updater`: Telegram forgets an update only once a later `getUpdates`
confirms it (its `offset`), and the updater confirms everything it fetched whatever became of it.
Here an update is confirmed only once the dispatcher has recorded its message, so a message that
arrives while the database is away is fetched again later instead of being lost. An update that
cannot be parsed or handled is confirmed, so it never blocks the ones behind it, and logged in one
line with its id (at most one such line every few seconds: `ThrottledLog`). A message with
nothing the bot can read (a sticker, a voice note) is handed over with empty text, so the core
can say what it takes.
A batch's chats are handed over side by side, each chat's messages in order; handing a message
over only records it and queues its turn, so one chat's long reply never delays another and
`/stop` is read while a reply streams.

A conversation is a chat: `telegram:<chat_id>`; `/new` starts a fresh one in the same chat. The
platform id used for deduplication is `<chat_id>:<message_id>` (message ids are per chat), so an
update Telegram redelivers after a restart (it was never confirmed) is recognised and not
answered twice.

Replies are written by `channels.rendering.StreamingReply` through `TelegramTransport`: Markdown
becomes Telegram HTML, and if Telegram still rejects the entities the same text goes out plain,
so nothing is lost to a formatting quirk. While a reply streams, its message carries a Stop
button (an inline keyboard); the final edit leaves the keyboard out, which takes it away. A
press (of that button, or of a sub-agent's Stop under `/agents`) arrives as a `callback_query`
update (the polls ask for those too) and is delivered as its command (`/stop`) from the person
who pressed it, so the access rules apply as to a typed command; the command's answer
("Stopped.", or a stranger's refusal) is the callback's answer, shown to the presser alone
(`channels.presses`), and every press is answered, so the button never keeps spinning.

Telegram's errors are mapped here and nowhere else: 429 → `RateLimited`, "message is not
modified" → nothing to do, any other refusal or network failure → `PlatformError`, an answer
without the message → `LostMessage`.

Webhook mode (`mode = "webhook"`): Telegram posts each update to `webhook_url`, which reaches
the server `run` starts (any worker of a cluster behind a load balancer: no lease is needed). A
request without the secret token Kaiwa registered gets 401; an update is answered 200 once its
message is recorded, and 500 when it could not be, so Telegram delivers it again.

Stopping never cancels a request in flight (a cancelled httpx request can keep its pooled
connection taken for good): the long poll is awaited through a shield, so `stop_receiving`
returns at once and the poll itself ends when Telegram answers it or `close` shuts the
connections. `connected` follows the polls: cleared, with `problem` saying why, while Telegram
cannot be reached; `run` can be called again after it raised.
"""

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from telegram import (
    Bot,
    BotCommand,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    ReplyParameters,
    Update,
)
from telegram.constants import CallbackQueryLimit, ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, InvalidToken, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from channels.connection import ConnectionState, unreachable
from channels.formatting import telegram_html, utf16_len
from channels.places import TelegramPlace
from channels.presses import Press, answered_privately, fitting, payload, pressed_command, pressing
from channels.rendering import (
    LostMessage,
    PlatformError,
    RateLimited,
    RenderSettings,
    StreamingReply,
    replace_notice,
    send_notice,
)
from channels.settings import TelegramSettings
from channels.throttled_log import ThrottledLog
from core.channel import COMMANDS, Button, ChannelMessage, ChannelTraits, Deliver, Reply
from core.errors import ChannelError, StoreError

# python-telegram-bot 22 reports time periods (RetryAfter.retry_after, ...) as ints with a
# deprecation warning, even from inside its own RetryAfter constructor, unless this opts into the
# timedelta form its next major version uses.
os.environ.setdefault("PTB_TIMEDELTA", "true")

logger = logging.getLogger(__name__)

PLATFORM = TelegramPlace.platform
MESSAGE_LIMIT = 4096
CONNECTION_POOL_SIZE = 256  # python-telegram-bot's Application default, for many chats at once
POLL_PAUSE_SECONDS, MAX_POLL_PAUSE_SECONDS = 1.0, 30.0
CONFIRM_SECONDS = 5.0  # the wait for Telegram's answer to the confirming call at a stop
CALLBACK_DATA_LIMIT = 64  # bytes, Telegram's limit on a button's callback data
PRESS_ANSWER_LIMIT = CallbackQueryLimit.ANSWER_CALLBACK_QUERY_TEXT_LENGTH
UPDATES = [Update.MESSAGE, Update.CALLBACK_QUERY]


class TelegramTransport:
    """One Telegram chat as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = True
    measure = staticmethod(utf16_len)

    def __init__(self, bot: Bot, chat_id: int, reply_to: int | None) -> None:
        self._bot = bot
        self._chat_id = chat_id
        self._reply_to = reply_to

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        reply = ReplyParameters(self._reply_to, allow_sending_without_reply=True)
        with _mapped_errors("sendMessage"):
            try:
                sent = await self._bot.send_message(
                    self._chat_id,
                    telegram_html(text),
                    parse_mode=ParseMode.HTML,
                    reply_parameters=reply if self._reply_to else None,
                    reply_markup=_keyboard(buttons),
                )
            except BadRequest as exc:
                if not _is_parse_error(exc):
                    raise
                logger.warning("Telegram rejected the formatting (%s); sending plain text", exc)
                sent = await self._bot.send_message(
                    self._chat_id, text, reply_markup=_keyboard(buttons)
                )
        self._reply_to = None  # only the first message of a reply answers the person's message
        return str(sent.message_id)

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        with _mapped_errors("editMessageText"):
            try:
                await self._bot.edit_message_text(
                    telegram_html(text),
                    chat_id=self._chat_id,
                    message_id=int(message_id),
                    parse_mode=ParseMode.HTML,
                    reply_markup=_keyboard(buttons),
                )
            except BadRequest as exc:
                if _is_not_modified(exc):
                    return
                if not _is_parse_error(exc):
                    raise
                logger.warning("Telegram rejected the formatting (%s); editing as plain text", exc)
                await self._bot.edit_message_text(
                    text,
                    chat_id=self._chat_id,
                    message_id=int(message_id),
                    reply_markup=_keyboard(buttons),
                )

    async def delete(self, message_id: str) -> None:
        with _mapped_errors("deleteMessage"):
            await self._bot.delete_message(self._chat_id, int(message_id))

    async def typing(self) -> None:
        with _mapped_errors("sendChatAction"):
            await self._bot.send_chat_action(self._chat_id, ChatAction.TYPING)


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
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self._offset: int | None = None
        """The first update not yet confirmed to Telegram (None: none seen yet)."""
        self._fetch: asyncio.Future[list[dict[str, Any]]] | None = None
        """The `getUpdates` in flight, if any: shielded, never cancelled."""
        self._unreadable = ThrottledLog(logger)

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
        self._deliver = deliver
        if self._settings.mode == "webhook":
            await self._serve_webhook()
            return
        await self._start()
        polling = asyncio.create_task(self._poll(), name="telegram polling")
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
        try:
            await self._bot.initialize()
        except InvalidToken as exc:
            raise self.cannot_connect(ChannelError(_token_problem(self._settings))) from exc
        except TelegramError as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc
        self.now_connected()

    async def close(self) -> None:
        """Close the connections; a long poll still in flight ends with them."""
        await self._bot.shutdown()
        if self._fetch is not None:
            await asyncio.gather(self._fetch, return_exceptions=True)

    def open_reply(self, place: str, reply_to: str | None, posted: Sequence[str] = ()) -> Reply:
        message_id = int(reply_to.rsplit(":", 1)[1]) if reply_to else None
        transport = TelegramTransport(self._bot, TelegramPlace.of(place).chat, message_id)
        return StreamingReply(transport, self._render, place, posted)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        transport = TelegramTransport(self._bot, TelegramPlace.of(place).chat, None)
        return await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        transport = TelegramTransport(self._bot, TelegramPlace.of(place).chat, None)
        await replace_notice(transport, message_id, text, self._settings.final_edit_seconds)

    # -- connecting ----------------------------------------------------------------------------

    async def _start(self) -> None:
        """Log in, register the commands, take over from any webhook. A token Telegram refuses
        raises `ChannelError` (a person must fix it); a Telegram that cannot be reached raises
        `PlatformError` (trying again later may do); either sets `problem`."""
        try:
            await self._bot.initialize()
            await self._bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
            await self._bot.delete_webhook()  # a webhook left set would refuse every getUpdates
        except InvalidToken as exc:
            raise self.cannot_connect(ChannelError(_token_problem(self._settings))) from exc
        except TelegramError as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc
        self.now_connected()
        logger.info("Telegram: polling as @%s", self._bot.username)

    async def _serve_webhook(self) -> None:
        """Register the webhook (with its secret), then take the updates Telegram posts until
        the channel stops. The webhook is left set: other workers may still serve it."""
        settings, secret = self._settings, os.environ.get(self._settings.webhook_secret_env, "")
        try:
            await self._bot.initialize()
            await self._bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
            await self._bot.set_webhook(
                settings.webhook_url, secret_token=secret, allowed_updates=list(UPDATES)
            )
        except InvalidToken as exc:
            raise self.cannot_connect(ChannelError(_token_problem(settings))) from exc
        except TelegramError as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc
        address = (settings.webhook_host, settings.webhook_port, settings.webhook_path)
        posted = functools.partial(self._posted, secret)
        setting = "[channels.telegram].webhook_port"
        async with self.receiving_posts(posted, address, "Telegram updates", setting):
            logger.info("Telegram: receiving updates at %s", settings.webhook_url)
            await self._stopping.wait()

    async def _posted(self, secret: str, request: web.Request) -> web.Response:
        """One update Telegram posted: 200 once recorded, 500 when it could not be (Telegram
        posts it again), 401 without our secret, 400 for a body that is no update."""
        if request.headers.get("X-Telegram-Bot-Api-Secret-Token", "") != secret:
            return web.Response(status=401)
        try:
            raw = await request.json()
        except ValueError:
            return web.Response(status=400)
        if not isinstance(raw, dict) or "update_id" not in raw:
            return web.Response(status=400)
        try:
            await self._receive(raw)
        except StoreError:
            return web.Response(status=500)
        return web.Response(status=200)

    def _unreachable(self, exc: Exception) -> str:
        return unreachable("Telegram", self._settings.base_url, "[channels.telegram].base_url", exc)

    # -- receiving -----------------------------------------------------------------------------

    async def _poll(self) -> None:
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
                raise self.cannot_connect(ChannelError(_token_problem(self._settings))) from exc
            except RetryAfter as exc:
                await self._pause(_seconds(exc))
                continue
            except TelegramError as exc:
                self.lost(self._unreachable(exc))
                logger.warning("Telegram: fetching updates failed (%s); again in %g s", exc, pause)
                await self._pause(pause)
                pause = min(pause * 2, MAX_POLL_PAUSE_SECONDS)
                continue
            pause = POLL_PAUSE_SECONDS
            self.now_connected()
            if batch and not self._stopping.is_set() and not await self._hand_over(batch):
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

    async def _hand_over(self, batch: list[dict[str, Any]]) -> bool:
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
                    await self._receive(raw)
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

    async def _receive(self, raw: dict[str, Any]) -> None:
        """Hand one update's message to the dispatcher; raises `StoreError` if it could not be
        recorded. Anything else wrong with the update is logged, and the update is let go."""
        try:
            await self._deliver_update(raw)
        except StoreError:
            raise
        except Exception as exc:
            self._unreadable.warning(
                "Telegram update %s could not be read or handled (%s: %s); skipped",
                raw.get("update_id"),
                type(exc).__name__,
                exc,
            )

    async def _deliver_update(self, raw: dict[str, Any]) -> None:
        update = Update.de_json(raw, self._bot)
        if update is not None and update.callback_query is not None:
            await self._pressed(update.callback_query)
            return
        message = update.effective_message if update is not None else None
        if message is None or message.from_user is None or self._deliver is None:
            return
        text = self._addressed_text(message)
        if text is None:
            return
        await self._deliver(
            ChannelMessage(
                platform=PLATFORM,
                place=TelegramPlace(message.chat_id).key,
                message_id=f"{message.chat_id}:{message.message_id}",
                author_id=str(message.from_user.id),
                author_name=message.from_user.full_name,
                text=text,
                images=await self._images(message),
                redeliverable=True,
            )
        )

    async def _pressed(self, query: CallbackQuery) -> None:
        """A button pressed on a bot message: its command (`channels.presses`) in that chat from
        the presser. The press is answered whatever happens, with the command's answer if there
        is one."""
        chat = query.message.chat.id if query.message is not None else None
        place = TelegramPlace(chat).key if chat is not None else ""
        press = Press(place, functools.partial(self._answer_press, query, place))
        command = pressed_command(query.data)
        try:
            if command is not None and place and self._deliver is not None:
                with pressing(press):
                    await self._deliver(
                        ChannelMessage(
                            platform=PLATFORM,
                            place=place,
                            message_id=f"press:{query.id}",
                            author_id=str(query.from_user.id),
                            author_name=query.from_user.full_name,
                            text=command,
                        )
                    )
        finally:
            if not press.answered:
                await self._answer_quietly(query)

    async def _answer_press(
        self, query: CallbackQuery, place: str, text: str, buttons: Sequence[Button]
    ) -> None:
        """Show `text` to the person who pressed: as the callback's answer if it fits in one
        (and has no buttons: an answer is a line of text), else in the chat (and the callback
        answered without text)."""
        fits = len(text) <= PRESS_ANSWER_LIMIT and not buttons
        with _mapped_errors("answerCallbackQuery"):
            await self._bot.answer_callback_query(query.id, text=text if fits else None)
        if not fits:
            transport = TelegramTransport(self._bot, TelegramPlace.of(place).chat, None)
            await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def _answer_quietly(self, query: CallbackQuery) -> None:
        """End a press's spinner; an answer Telegram will not take (the press is too old, or
        rate limited) is only logged."""
        try:
            with _mapped_errors("answerCallbackQuery"):
                await self._bot.answer_callback_query(query.id)
        except (PlatformError, RateLimited) as exc:
            logger.info("Telegram: a button press was not answered: %s", exc)

    def _addressed_text(self, message: Message) -> str | None:
        """The text meant for the bot, or None when the message is not for it."""
        text = message.text or message.caption or ""
        if message.chat.type == ChatType.PRIVATE:
            return text
        if not self._settings.groups:
            return None
        mention = f"@{self._bot.username}"
        mentioned = mention in message.parse_entities([MessageEntity.MENTION]).values()
        replied = message.reply_to_message is not None and (
            message.reply_to_message.from_user is not None
            and message.reply_to_message.from_user.id == self._bot.id
        )
        if not (mentioned or replied):
            return None
        return " ".join(text.replace(mention, " ").split())

    async def _images(self, message: Message) -> tuple[bytes, ...]:
        if not message.photo:
            return ()
        largest = max(message.photo, key=lambda size: size.width * size.height)
        file = await largest.get_file()
        return (bytes(await file.download_as_bytearray()),)


@contextlib.contextmanager
def _mapped_errors(method: str) -> Iterator[None]:
    try:
        yield
    except RetryAfter as exc:
        raise RateLimited(_seconds(exc)) from exc
    except TelegramError as exc:
        raise PlatformError(f"Telegram {method} failed: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:  # the library could not read the answer
        raise LostMessage(f"Telegram answered {method} without a usable message ({exc})") from exc


def _chat_of(raw: dict[str, Any]) -> object:
    """The chat an unparsed update (a message, or a press on one) belongs to; its own id when
    it has none we can read."""
    query = raw.get("callback_query")
    message = query.get("message") if isinstance(query, dict) else raw.get("message")
    chat = message.get("chat") if isinstance(message, dict) else None
    return chat.get("id", raw["update_id"]) if isinstance(chat, dict) else raw["update_id"]


def _keyboard(buttons: Sequence[Button]) -> InlineKeyboardMarkup | None:
    """The buttons as an inline keyboard, one to a row."""
    rows = [
        [InlineKeyboardButton(button.label, callback_data=payload(button))]
        for button in fitting(buttons, CALLBACK_DATA_LIMIT)
    ]
    return InlineKeyboardMarkup(rows) if rows else None


def _seconds(exc: RetryAfter) -> float:
    value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in exc.message.lower()


def _is_not_modified(exc: BadRequest) -> bool:
    return "message is not modified" in exc.message.lower()


def _token_problem(settings: TelegramSettings) -> str:
    return (
        f"Telegram rejected the bot token in ${settings.token_env} (401 Unauthorized): copy the "
        "token @BotFather gave you into that variable"
    )
