"""Telegram: private chats (and, when enabled, group messages addressed to the bot).

Built on python-telegram-bot's `Application`, run inside our own event loop (`async with app`,
`start`, `updater.start_polling`; never `run_polling`, which wants to own the loop). Updates are
handled concurrently, so one chat's long reply never delays another chat and `/stop` is read
while a reply streams; the dispatcher only queues turns, so handling an update is quick.

A conversation is a chat: `telegram:<chat_id>`; `/new` starts a fresh one in the same chat. The
platform id used for deduplication is `<chat_id>:<message_id>` (message ids are per chat), so an
update Telegram redelivers after a restart (it was never confirmed) is recognised and not
answered twice.

Replies are written by `channels.rendering.StreamingReply` through `TelegramTransport`: Markdown
becomes Telegram HTML, and if Telegram still rejects the entities the same text goes out plain,
so nothing is lost to a formatting quirk. Telegram's errors are mapped here and nowhere else:
429 → `RateLimited`, "message is not modified" → nothing to do.
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from datetime import timedelta

from telegram import BotCommand, Message, MessageEntity, ReplyParameters, Update
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, InvalidToken, RetryAfter, TelegramError
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from channels.formatting import telegram_html, utf16_len
from channels.rendering import RateLimited, RenderSettings, StreamingReply, send_notice
from channels.settings import TelegramSettings
from core.channel import ChannelMessage, ChannelTraits, Deliver, Reply
from core.commands import COMMANDS
from core.errors import ChannelError

# python-telegram-bot 22 reports time periods (RetryAfter.retry_after, ...) as ints with a
# deprecation warning, even from inside its own RetryAfter constructor, unless this opts into the
# timedelta form its next major version uses.
os.environ.setdefault("PTB_TIMEDELTA", "true")

logger = logging.getLogger(__name__)

PLATFORM = "telegram"
MESSAGE_LIMIT = 4096


class TelegramTransport:
    """One Telegram chat as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = False  # no Stop control: `live` changes nothing
    measure = staticmethod(utf16_len)

    def __init__(self, app: Application, chat_id: int, reply_to: int | None) -> None:
        self._bot = app.bot
        self._chat_id = chat_id
        self._reply_to = reply_to

    async def send(self, text: str, *, live: bool) -> str:
        reply = ReplyParameters(self._reply_to, allow_sending_without_reply=True)
        with _mapped_errors():
            try:
                sent = await self._bot.send_message(
                    self._chat_id,
                    telegram_html(text),
                    parse_mode=ParseMode.HTML,
                    reply_parameters=reply if self._reply_to else None,
                )
            except BadRequest as exc:
                if not _is_parse_error(exc):
                    raise
                logger.warning("Telegram rejected the formatting (%s); sending plain text", exc)
                sent = await self._bot.send_message(self._chat_id, text)
        self._reply_to = None  # only the first message of a reply answers the person's message
        return str(sent.message_id)

    async def edit(self, message_id: str, text: str, *, live: bool) -> None:
        with _mapped_errors():
            try:
                await self._bot.edit_message_text(
                    telegram_html(text),
                    chat_id=self._chat_id,
                    message_id=int(message_id),
                    parse_mode=ParseMode.HTML,
                )
            except BadRequest as exc:
                if _is_not_modified(exc):
                    return
                if not _is_parse_error(exc):
                    raise
                logger.warning("Telegram rejected the formatting (%s); editing as plain text", exc)
                await self._bot.edit_message_text(
                    text, chat_id=self._chat_id, message_id=int(message_id)
                )

    async def typing(self) -> None:
        with _mapped_errors():
            await self._bot.send_chat_action(self._chat_id, ChatAction.TYPING)


class TelegramChannel:
    platform = PLATFORM

    def __init__(self, settings: TelegramSettings, token: str) -> None:
        self._settings = settings
        self._render = RenderSettings(
            settings.show_thinking, settings.show_tools, min_interval=settings.edit_interval
        )
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._app = (
            Application.builder()
            .token(token)
            .base_url(settings.base_url)
            .base_file_url(settings.base_file_url)
            .concurrent_updates(True)
            .get_updates_read_timeout(settings.poll_timeout + 10)
            .build()
        )
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self._app.add_handler(MessageHandler(filters.ALL, self._on_message))
        self._app.add_error_handler(self._on_error)

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Telegram: a token Telegram does not accept."""
        try:
            async with asyncio.timeout(30):
                await self._app.bot.initialize()  # asks getMe; `run` will not ask again
        except InvalidToken:
            return [_token_problem(self._settings)]
        except (TelegramError, TimeoutError) as exc:
            return [f"cannot reach Telegram at {self._settings.base_url}: {exc}"]
        return []

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        try:
            await self._app.initialize()
        except InvalidToken as exc:
            raise ChannelError(_token_problem(self._settings)) from exc
        await self._app.bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
        await self._app.start()
        assert self._app.updater is not None
        await self._app.updater.start_polling(
            timeout=timedelta(seconds=self._settings.poll_timeout),
            allowed_updates=[Update.MESSAGE],
        )
        logger.info("Telegram: polling as @%s", self._app.bot.username)
        await self._stopping.wait()
        await self._app.updater.stop()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        with contextlib.suppress(TelegramError, RuntimeError):
            if self._app.updater is not None and self._app.updater.running:
                await self._app.updater.stop()
            if self._app.running:
                await self._app.stop()
        await self._app.shutdown()
        await self._app.bot.shutdown()  # an app that never initialized leaves this to us

    def open_reply(self, place: str, reply_to: str | None) -> Reply:
        chat_id = _chat_id(place)
        message_id = int(reply_to.rsplit(":", 1)[1]) if reply_to else None
        transport = TelegramTransport(self._app, chat_id, message_id)
        return StreamingReply(transport, self._render)

    async def notify(self, place: str, text: str) -> None:
        await send_notice(TelegramTransport(self._app, _chat_id(place), None), text)

    async def _on_message(self, update: Update, _: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if message is None or message.from_user is None or self._deliver is None:
            return
        text = self._addressed_text(message)
        if text is None:
            return
        await self._deliver(
            ChannelMessage(
                platform=PLATFORM,
                place=f"{PLATFORM}:{message.chat_id}",
                message_id=f"{message.chat_id}:{message.message_id}",
                author_id=str(message.from_user.id),
                author_name=message.from_user.full_name,
                text=text,
                images=await self._images(message),
            )
        )

    def _addressed_text(self, message: Message) -> str | None:
        """The text meant for the bot, or None when the message is not for it."""
        text = message.text or message.caption or ""
        if message.chat.type == ChatType.PRIVATE:
            return text
        if not self._settings.groups:
            return None
        mention = f"@{self._app.bot.username}"
        mentioned = mention in message.parse_entities([MessageEntity.MENTION]).values()
        replied = message.reply_to_message is not None and (
            message.reply_to_message.from_user is not None
            and message.reply_to_message.from_user.id == self._app.bot.id
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

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        logger.error("Telegram update could not be handled", exc_info=context.error)


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except RetryAfter as exc:
        raise RateLimited(_seconds(exc)) from exc


def _seconds(exc: RetryAfter) -> float:
    value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in exc.message.lower()


def _is_not_modified(exc: BadRequest) -> bool:
    return "message is not modified" in exc.message.lower()


def _chat_id(place: str) -> int:
    return int(place.split(":", 1)[1])


def _token_problem(settings: TelegramSettings) -> str:
    return (
        f"Telegram rejected the bot token in ${settings.token_env} (401 Unauthorized): copy the "
        "token @BotFather gave you into that variable"
    )
