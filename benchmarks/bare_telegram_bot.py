"""The bare bot `platform_burst.py` measures Kaiwa against: python-telegram-bot and the ollama
client, nothing else, making the platform calls Kaiwa makes for a short reply.

For each message, as Kaiwa's Telegram reply does: "typing…" (`sendChatAction`), the model's
stream (one `ollama.AsyncClient` for every chat, at most `--slots` requests at once, as Kaiwa's
`[ollama].max_concurrent_requests`), the reply posted with its first text and a Stop button
(`sendMessage`), edited as the text grows no more than once per `--edit-interval`, then, no
sooner than that interval after the last change, the final text without the button
(`editMessageText`). No store, no history, no tools: what is left is
what any Telegram bot on Ollama pays for a message. Updates are handled side by side
(`concurrent_updates`), with python-telegram-bot's own polling.

    python -m benchmarks.bare_telegram_bot --token T --base-url URL --ollama URL
                                           [--edit-interval 1.0] [--slots 1]

prints `READY` once it polls; it runs until killed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import time

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.constants import ChatAction
from telegram.ext import Application, ContextTypes, MessageHandler, filters
from telegram.request import HTTPXRequest

from benchmarks import _common as bench  # clears the proxy variables

POOL = 32  # channels.telegram.channel.CONNECTION_POOL_SIZE (not imported: no Kaiwa in this bot)
STOP = InlineKeyboardMarkup([[InlineKeyboardButton("Stop", callback_data="stop")]])


class Reply:
    """One reply on Telegram, paced as Kaiwa's is: posted with the first text (and a Stop button),
    edited as it grows no more than once per interval, finished without the button no sooner
    than an interval after its last change; the stream never waits for a platform call."""

    def __init__(self, bot: Bot, chat: int, interval: float) -> None:
        self._bot, self._chat, self._interval = bot, chat, interval
        self._text, self._shown = "", ""
        self._message: Message | None = None
        self._changed_at = 0.0
        self._grown = asyncio.Event()
        self._done = False
        self._pacing = asyncio.create_task(self._pace())

    def grow(self, piece: str) -> None:
        self._text += piece
        self._grown.set()

    async def finish(self) -> None:
        self._done = True
        self._grown.set()
        await self._pacing
        if self._message is not None:
            await asyncio.sleep(max(0.0, self._changed_at + self._interval - time.monotonic()))
            await self._message.edit_text(self._text)

    async def _pace(self) -> None:
        while True:
            await self._grown.wait()
            self._grown.clear()
            text = self._text
            if text != self._shown and text.strip():
                if self._message is None:
                    self._message = await self._bot.send_message(
                        self._chat, text, reply_markup=STOP
                    )
                else:
                    await self._message.edit_text(text, reply_markup=STOP)
                self._shown, self._changed_at = text, time.monotonic()
            if self._done:
                return
            await asyncio.sleep(self._interval)


def build(
    token: str, base_url: str, model_url: str, edit_interval: float, slots: int
) -> Application:  # type: ignore[type-arg]
    client = bench.bare_client(model_url, connections=POOL)
    model_slots = asyncio.Semaphore(slots)  # as many model requests at once as Kaiwa sends

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_chat is not None and update.message is not None
        chat = update.effective_chat.id
        await context.bot.send_chat_action(chat, ChatAction.TYPING)
        messages = [
            {"role": "system", "content": bench.SYSTEM_PROMPT},
            {"role": "user", "content": update.message.text or ""},
        ]
        reply = Reply(context.bot, chat, edit_interval)
        async with model_slots:
            stream = await client.chat(model=bench.MODEL, messages=messages, stream=True)
            async for part in stream:
                reply.grow(part.message.content or "")
        await reply.finish()

    async def ready(application: Application) -> None:  # type: ignore[type-arg]
        print("READY polling", flush=True)

    application = (
        Application.builder()
        .token(token)
        .base_url(base_url)
        .request(HTTPXRequest(connection_pool_size=POOL))
        .concurrent_updates(True)
        .post_init(ready)
        .build()
    )
    application.add_handler(MessageHandler(filters.TEXT, answer))
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token", required=True, help="the bot token")
    parser.add_argument("--base-url", required=True, help="the (fake) Bot API, as base_url")
    parser.add_argument("--ollama", required=True, help="the (fake) Ollama's URL")
    parser.add_argument("--edit-interval", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=1, help="model requests at once")
    args = parser.parse_args()
    build(args.token, args.base_url, args.ollama, args.edit_interval, args.slots).run_polling(
        poll_interval=0.0, timeout=1, drop_pending_updates=False, stop_signals=None
    )


if __name__ == "__main__":
    main()
