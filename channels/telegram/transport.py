"""How Telegram shows a reply: `TelegramTransport`, one chat as `channels.rendering` sees it.

Replies are written by `channels.rendering.StreamingReply` through `TelegramTransport`: Markdown
becomes Telegram HTML, and if Telegram still rejects the entities the same text goes out plain,
so nothing is lost to a formatting quirk. While a reply streams, its message carries a Stop
button (an inline keyboard); the final edit leaves the keyboard out, which takes it away. The
button is never sent with the post (`buttons_after_post`): it comes with the reply's next edit.
A bot can learn a message's id only from the answer to its post (the Bot API reads no chat's
messages back, and a bot's own messages come as no update), so a post whose answer was lost
can never be edited, and a Stop button sent with it would stay under it for ever.

Telegram's errors are mapped here (`mapped_errors`) and nowhere else, for every call of a reply,
a notice or a press's answer: 429 → `RateLimited`, "message is not modified" → nothing to do,
any other refusal or network failure → `PlatformError`, an answer without the message →
`LostMessage`, and so is a post whose answer never came (sent, then the connection failed or
timed out): it may be out, so it is not sent again. python-telegram-bot itself retries nothing.

Telegram's limits (`TelegramChats`, one budget per bot, `channels.budget`): about 30 calls a
second for the whole bot, about one a second in one chat with short bursts (kept as 3 in any 3
seconds), 20 a minute in a group (3 in any 9 seconds, and 20 in any minute). Every call a reply
or a notice makes to a chat counts against both, but "typing…" only against the bot's (it shows
no message).
"""

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta

import httpx
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, NetworkError, RetryAfter, TelegramError

from channels.budget import Action, Budget, Limit, Limits, Pace
from channels.calls import LostMessage, PlatformError, RateLimited, counted_refusals
from channels.formatting import telegram_html, utf16_len
from channels.presses import fitting, payload
from core.channel import Button

# python-telegram-bot 22 reports time periods (RetryAfter.retry_after, ...) as ints with a
# deprecation warning, even from inside its own RetryAfter constructor, unless this opts into the
# timedelta form its next major version uses.
os.environ.setdefault("PTB_TIMEDELTA", "true")

logger = logging.getLogger(__name__)

MESSAGE_LIMIT = 4096
CALLBACK_DATA_LIMIT = 64  # bytes, Telegram's limit on a button's callback data
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""The network failures that come before a request goes out."""
BOT_LIMIT = Limit("bot", 30, 1.0, shared=True)
PRIVATE_CALLS, PRIVATE_SECONDS = 3, 3.0
GROUP_CALLS, GROUP_SECONDS = 3, 9.0
GROUP_MINUTE_CALLS = 20
"""A group's 20 a minute, which its bursts of 3 in 9 s must also keep."""


def chat_limits(chat_id: int) -> Limits:
    """What one chat's calls count against: the bot's limit and the chat's own (a group's is
    slower, and kept over a minute too; Telegram's group ids are negative), "typing…" the bot's
    alone."""
    if chat_id < 0:
        own: tuple[Limit, ...] = (
            Limit(f"chat {chat_id}", GROUP_CALLS, GROUP_SECONDS),
            Limit(f"chat {chat_id} minute", GROUP_MINUTE_CALLS, 60.0),
        )
    else:
        own = (Limit(f"chat {chat_id}", PRIVATE_CALLS, PRIVATE_SECONDS),)
    limits = (BOT_LIMIT, *own)
    return lambda action: (BOT_LIMIT,) if action is Action.TYPING else limits


class TelegramChats:
    """The chats one bot writes to, sharing the Bot API's limits (`channels.budget`)."""

    def __init__(self, bot: Bot, *, paced: bool = True) -> None:
        self.bot = bot
        self._budget = Budget(paced=paced)

    def transport(self, chat_id: int, reply_to: int | None = None) -> "TelegramTransport":
        pace = self._budget.pace(chat_limits(chat_id))
        return TelegramTransport(self.bot, chat_id, reply_to, pace)


class TelegramTransport:
    """One Telegram chat as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = True
    buttons_after_post = True
    measure = staticmethod(utf16_len)

    def __init__(self, bot: Bot, chat_id: int, reply_to: int | None, pace: Pace) -> None:
        self._bot = bot
        self._chat_id = chat_id
        self._reply_to = reply_to
        self.pace = pace

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        reply = ReplyParameters(self._reply_to, allow_sending_without_reply=True)
        with mapped_errors("sendMessage", creates=True):
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
        with mapped_errors("editMessageText"):
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
        with mapped_errors("deleteMessage"):
            await self._bot.delete_message(self._chat_id, int(message_id))

    async def typing(self) -> None:
        with mapped_errors("sendChatAction"):
            await self._bot.send_chat_action(self._chat_id, ChatAction.TYPING)


@contextlib.contextmanager
def mapped_errors(method: str, *, creates: bool = False) -> Iterator[None]:
    """Telegram's errors as `channels.rendering` knows them; with `creates`, a call whose
    answer never came is a `LostMessage`."""
    with counted_refusals("telegram"):
        try:
            yield
        except RetryAfter as exc:
            raise RateLimited(retry_seconds(exc)) from exc
        except TelegramError as exc:
            failed = f"Telegram {method} failed: {exc}"
            if creates and _unanswered(exc):
                raise LostMessage(f"{failed}; it may have posted, so it is not sent again") from exc
            raise PlatformError(failed) from exc
        except (KeyError, TypeError, ValueError) as exc:  # the library could not read the answer
            raise LostMessage(
                f"Telegram answered {method} without a usable message ({exc})"
            ) from exc


def _unanswered(exc: TelegramError) -> bool:
    """Whether the request may have reached Telegram without its answer reaching Kaiwa: a
    network failure or a timeout, unless it happened before the request could go out (no
    connection, no free one in the pool)."""
    if not isinstance(exc, NetworkError) or isinstance(exc, BadRequest):  # TimedOut is one
        return False
    return not isinstance(exc.__cause__, NEVER_SENT)


def _keyboard(buttons: Sequence[Button]) -> InlineKeyboardMarkup | None:
    """The buttons as an inline keyboard, one to a row."""
    rows = [
        [InlineKeyboardButton(button.label, callback_data=payload(button))]
        for button in fitting(buttons, CALLBACK_DATA_LIMIT)
    ]
    return InlineKeyboardMarkup(rows) if rows else None


def retry_seconds(exc: RetryAfter) -> float:
    """The wait a 429 asks for, in seconds."""
    value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in exc.message.lower()


def _is_not_modified(exc: BadRequest) -> bool:
    return "message is not modified" in exc.message.lower()
