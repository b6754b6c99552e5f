"""Telegram: private chats (and, when enabled, group messages addressed to the bot).

Built on python-telegram-bot's `Bot`, inside our own event loop, with our own long-polling loop
instead of the library's `Updater`: Telegram forgets an update only once a later `getUpdates`
confirms it (its `offset`), and the updater confirms everything it fetched whatever became of it.
Here an update is confirmed only once the dispatcher has recorded its message, so a message that
arrives while the database is away is fetched again later instead of being lost. An update that
cannot be parsed or handled is logged and confirmed, so it never blocks the ones behind it.
A batch's chats are handed over side by side, each chat's messages in order; handing a message
over only records it and queues its turn, so one chat's long reply never delays another and
`/stop` is read while a reply streams.

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
import json
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from telegram import Bot, BotCommand, Message, MessageEntity, ReplyParameters, Update
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, InvalidToken, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from channels.formatting import telegram_html, utf16_len
from channels.rendering import RateLimited, RenderSettings, StreamingReply, send_notice
from channels.settings import TelegramSettings
from core.channel import ChannelMessage, ChannelTraits, Deliver, Reply
from core.commands import COMMANDS
from core.errors import ChannelError, StoreError

# python-telegram-bot 22 reports time periods (RetryAfter.retry_after, ...) as ints with a
# deprecation warning, even from inside its own RetryAfter constructor, unless this opts into the
# timedelta form its next major version uses.
os.environ.setdefault("PTB_TIMEDELTA", "true")

logger = logging.getLogger(__name__)

PLATFORM = "telegram"
MESSAGE_LIMIT = 4096
CONNECTION_POOL_SIZE = 256  # python-telegram-bot's Application default, for many chats at once
POLL_PAUSE_SECONDS, MAX_POLL_PAUSE_SECONDS = 1.0, 30.0


class TelegramTransport:
    """One Telegram chat as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = False  # no Stop control: `live` changes nothing
    measure = staticmethod(utf16_len)

    def __init__(self, bot: Bot, chat_id: int, reply_to: int | None) -> None:
        self._bot = bot
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
        self._updates_request = HTTPXRequest(read_timeout=settings.poll_timeout + 10)
        self._bot = Bot(
            token,
            base_url=settings.base_url,
            base_file_url=settings.base_file_url,
            request=HTTPXRequest(connection_pool_size=CONNECTION_POOL_SIZE),
            get_updates_request=self._updates_request,
        )
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self.problem: str | None = None
        self._offset: int | None = None
        """The first update not yet confirmed to Telegram (None: none seen yet)."""

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Telegram: a token Telegram does not accept."""
        try:
            async with asyncio.timeout(30):
                await self._bot.initialize()  # asks getMe; `run` will not ask again
        except InvalidToken:
            return [_token_problem(self._settings)]
        except (TelegramError, TimeoutError) as exc:
            return [f"cannot reach Telegram at {self._settings.base_url}: {exc}"]
        return []

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        try:
            await self._bot.initialize()
        except InvalidToken as exc:
            raise ChannelError(_token_problem(self._settings)) from exc
        await self._bot.set_my_commands([BotCommand(n, s) for n, s in COMMANDS])
        await self._bot.delete_webhook()  # a webhook left set would refuse every getUpdates
        logger.info("Telegram: polling as @%s", self._bot.username)
        self.connected.set()
        polling = asyncio.create_task(self._poll(), name="telegram polling")
        stopping = asyncio.create_task(self._stopping.wait(), name="telegram stopping")
        try:
            await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (polling, stopping):
                task.cancel()  # a long poll in flight is abandoned: the bot closes soon after
            await asyncio.gather(polling, stopping, return_exceptions=True)
        if polling.done() and not polling.cancelled() and polling.exception() is not None:
            raise polling.exception()  # type: ignore[misc]
        await self._confirm()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        await self._bot.shutdown()

    def open_reply(self, place: str, reply_to: str | None, posted: Sequence[str] = ()) -> Reply:
        chat_id = _chat_id(place)
        message_id = int(reply_to.rsplit(":", 1)[1]) if reply_to else None
        transport = TelegramTransport(self._bot, chat_id, message_id)
        return StreamingReply(transport, self._render, place, posted)

    async def notify(self, place: str, text: str) -> None:
        await send_notice(TelegramTransport(self._bot, _chat_id(place), None), text)

    # -- receiving -----------------------------------------------------------------------------

    async def _poll(self) -> None:
        """Fetch updates and hand each over in order; confirm an update only once it is recorded
        (or will never be: ignored, unparseable). A message the store could not record stops the
        batch there, and after a pause it and those after it are fetched again."""
        pause = POLL_PAUSE_SECONDS
        while True:
            try:
                batch = await self._get_updates(timeout=self._settings.poll_timeout)
            except InvalidToken as exc:
                raise ChannelError(_token_problem(self._settings)) from exc
            except RetryAfter as exc:
                await asyncio.sleep(_seconds(exc))
                continue
            except TelegramError as exc:
                logger.warning("Telegram: fetching updates failed (%s); again in %g s", exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_POLL_PAUSE_SECONDS)
                continue
            pause = POLL_PAUSE_SECONDS
            if batch and not await self._hand_over(batch):
                await asyncio.sleep(POLL_PAUSE_SECONDS)  # the store already waited its turn

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

    async def _get_updates(self, **parameters: object) -> list[dict[str, Any]]:
        """`getUpdates`, unparsed (the library's own method parses the whole batch at once, so
        one update it cannot parse would fail them all)."""
        query = {"offset": self._offset, **parameters, "allowed_updates": [Update.MESSAGE]}
        encoded = urlencode({k: json.dumps(v) for k, v in query.items() if v is not None})
        result = await self._updates_request.post(
            f"{self._settings.base_url}{self._bot.token}/getUpdates?{encoded}"
        )
        return list(result) if isinstance(result, list) else []

    async def _confirm(self) -> None:
        """Tell Telegram which updates were handled, so a restart does not fetch them again."""
        if self._offset is None:
            return
        with contextlib.suppress(TelegramError, TimeoutError):
            async with asyncio.timeout(5):
                await self._get_updates(timeout=0, limit=1)

    async def _receive(self, raw: dict[str, Any]) -> None:
        """Hand one update's message to the dispatcher; raises `StoreError` if it could not be
        recorded. Anything else wrong with the update is logged, and the update is let go."""
        try:
            update = Update.de_json(raw, self._bot)
            message = update.effective_message if update is not None else None
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
                    redeliverable=True,
                )
            )
        except StoreError:
            raise
        except Exception:
            logger.exception("Telegram update %s could not be handled; skipped", raw["update_id"])

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
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except RetryAfter as exc:
        raise RateLimited(_seconds(exc)) from exc


def _chat_of(raw: dict[str, Any]) -> object:
    """The chat an unparsed update belongs to (its own id when it has none we can read)."""
    message = raw.get("message")
    chat = message.get("chat") if isinstance(message, dict) else None
    return chat.get("id", raw["update_id"]) if isinstance(chat, dict) else raw["update_id"]


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
