"""Telegram updates as `ChannelMessage`s: which messages are for the bot, and their keys.

Updates come in unparsed (`channels.telegram.channel` fetches them so), one at a time here, so
that one update python-telegram-bot cannot parse fails only itself: `Updates.receive` raises
`StoreError` alone (the message could not be recorded, and the update is fetched again), and
anything else wrong with an update is logged in one line with its id (at most one such line every
few seconds: `ThrottledLog`) and let go, so the update is confirmed and never blocks the ones
behind it. A message with nothing the bot can read (a sticker) is handed over with empty text,
so the core can say what it takes; one with a file and no words is handed over with its file
(`channels.telegram.files` says what a message's files are, and fetches its pictures). A
caption is the message's text, and a mention of the bot in it counts as one in a text.

A conversation is a chat: `telegram:<chat_id>`; `/new` starts a fresh one in the same chat. The
platform id used for deduplication is `<chat_id>:<message_id>` (message ids are per chat), so an
update Telegram redelivers after a restart (it was never confirmed) is recognised and not
answered twice. In a private chat every message is for the bot; in a group (when
`[channels.telegram].groups` is on) only one that mentions it or replies to it.
"""

import logging
from typing import Any

from telegram import Message, MessageEntity, Update
from telegram.constants import ChatType

from channels.places import TelegramPlace
from channels.settings import TelegramSettings
from channels.telegram.files import TelegramFiles, attachments_of
from channels.telegram.interactions import Presses
from channels.telegram.transport import TelegramChats
from channels.throttled_log import ThrottledLog
from core.channel import ChannelMessage, Deliver
from core.errors import StoreError

logger = logging.getLogger(__name__)


class Updates:
    """One bot's updates, each handed to the dispatcher: a message, or a press (`Presses`)."""

    def __init__(
        self, chats: TelegramChats, settings: TelegramSettings, files: TelegramFiles
    ) -> None:
        self._bot = chats.bot
        self._settings = settings
        self._files = files
        self._presses = Presses(chats, settings)
        self._unreadable = ThrottledLog(logger)

    async def receive(self, raw: dict[str, Any], deliver: Deliver) -> None:
        """Hand one update's message to the dispatcher; raises `StoreError` if it could not be
        recorded. Anything else wrong with the update is logged, and the update is let go."""
        try:
            await self._deliver_update(raw, deliver)
        except StoreError:
            raise
        except Exception as exc:
            self._unreadable.warning(
                "Telegram update %s could not be read or handled (%s: %s); skipped",
                raw.get("update_id"),
                type(exc).__name__,
                exc,
            )

    async def _deliver_update(self, raw: dict[str, Any], deliver: Deliver) -> None:
        update = Update.de_json(raw, self._bot)
        if update is not None and update.callback_query is not None:
            await self._presses.pressed(update.callback_query, deliver)
            return
        message = update.effective_message if update is not None else None
        if message is None or message.from_user is None:
            return
        text = self._addressed_text(message)
        if text is None:
            return
        images, attachments = await self._files.pictures(attachments_of(message))
        await deliver(
            ChannelMessage(
                platform=TelegramPlace.platform,
                place=TelegramPlace(message.chat_id).key,
                message_id=f"{message.chat_id}:{message.message_id}",
                author_id=str(message.from_user.id),
                author_name=message.from_user.full_name,
                text=text,
                images=images,
                redeliverable=True,
                attachments=attachments,
            )
        )

    def _addressed_text(self, message: Message) -> str | None:
        """The text meant for the bot, or None when the message is not for it."""
        text = message.text or message.caption or ""
        if message.chat.type == ChatType.PRIVATE:
            return text
        if not self._settings.groups:
            return None
        mention = f"@{self._bot.username}"
        mentions = (
            message.parse_caption_entities([MessageEntity.MENTION])
            if message.caption
            else message.parse_entities([MessageEntity.MENTION])
        )
        mentioned = mention in mentions.values()
        replied = message.reply_to_message is not None and (
            message.reply_to_message.from_user is not None
            and message.reply_to_message.from_user.id == self._bot.id
        )
        if not (mentioned or replied):
            return None
        return " ".join(text.replace(mention, " ").split())
