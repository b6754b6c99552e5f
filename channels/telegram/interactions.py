"""Button presses on the bot's Telegram messages, delivered as commands from the presser.

A press (of a reply's Stop button, or of a sub-agent's Stop under `/agents`) arrives as a
`callback_query` update (the polls ask for those too) and is delivered as its command (`/stop`)
from the person who pressed it, so the access rules apply as to a typed command; the command's
answer ("Stopped.", or a stranger's refusal) is the callback's answer, shown to the presser alone
(`channels.presses`), and every press is answered, so the button never keeps spinning. Telegram
has no slash commands of its own: a typed `/stop` is a message (`channels.telegram.receiving`).
"""

import functools
import logging
from collections.abc import Sequence

from telegram import CallbackQuery
from telegram.constants import CallbackQueryLimit

from channels.calls import PlatformError, RateLimited
from channels.notices import send_notice
from channels.places import TelegramPlace
from channels.presses import Press, pressed_command, pressing
from channels.settings import TelegramSettings
from channels.telegram.transport import TelegramChats, mapped_errors
from core.channel import Button, ChannelMessage, Deliver

logger = logging.getLogger(__name__)

PRESS_ANSWER_LIMIT = CallbackQueryLimit.ANSWER_CALLBACK_QUERY_TEXT_LENGTH


class Presses:
    """The presses on one bot's messages."""

    def __init__(self, chats: TelegramChats, settings: TelegramSettings) -> None:
        self._bot = chats.bot
        self._chats = chats
        self._settings = settings

    async def pressed(self, query: CallbackQuery, deliver: Deliver) -> None:
        """A button pressed on a bot message: its command (`channels.presses`) in that chat from
        the presser. The press is answered whatever happens, with the command's answer if there
        is one."""
        chat = query.message.chat.id if query.message is not None else None
        place = TelegramPlace(chat).key if chat is not None else ""
        press = Press(place, functools.partial(self._answer_press, query, place))
        command = pressed_command(query.data)
        try:
            if command is not None and place:
                with pressing(press):
                    await deliver(
                        ChannelMessage(
                            platform=TelegramPlace.platform,
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
        with mapped_errors("answerCallbackQuery"):
            await self._bot.answer_callback_query(query.id, text=text if fits else None)
        if not fits:
            transport = self._chats.transport(TelegramPlace.of(place).chat)
            await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def _answer_quietly(self, query: CallbackQuery) -> None:
        """End a press's spinner; an answer Telegram will not take (the press is too old, or
        rate limited) is only logged."""
        try:
            with mapped_errors("answerCallbackQuery"):
                await self._bot.answer_callback_query(query.id)
        except (PlatformError, RateLimited) as exc:
            logger.info("Telegram: a button press was not answered: %s", exc)
