"""The bare bot `platform_burst.py` and `reply_alone.py` measure Kaiwa against on Telegram:
python-telegram-bot and the ollama client, nothing else, making the platform calls any bot on
Ollama makes for a short reply.

For each message: "typing…" (`sendChatAction`), the model's stream (one `ollama.AsyncClient` for
every chat, at most `--slots` requests at once, as Kaiwa's `[ollama].max_concurrent_requests`),
and the reply as `benchmarks/_bare.py` streams it: posted with its first text and a Stop button
(`sendMessage`), edited as it grows no more than once per `--edit-interval`, the final text
without the button (`editMessageText`) the moment the stream ends. Updates are handled side by
side (`concurrent_updates`), with python-telegram-bot's own polling.

    python -m benchmarks.bare_telegram_bot --token T --base-url URL --ollama URL
                                           [--edit-interval 1.0] [--slots 1]

prints `READY` once it polls; it runs until killed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.constants import ChatAction
from telegram.ext import Application, ContextTypes, MessageHandler, filters
from telegram.request import HTTPXRequest

from benchmarks import _common as bench  # clears the proxy variables
from benchmarks._bare import BareReply, stream_into

POOL = 32  # channels.telegram.channel.CONNECTION_POOL_SIZE (not imported: no Kaiwa in this bot)
STOP = InlineKeyboardMarkup([[InlineKeyboardButton("Stop", callback_data="stop")]])


def build(
    token: str, base_url: str, model_url: str, edit_interval: float, slots: int
) -> Application:  # type: ignore[type-arg]
    client = bench.bare_client(model_url, connections=POOL)
    model_slots = asyncio.Semaphore(slots)  # as many model requests at once as Kaiwa sends

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_chat is not None and update.message is not None
        chat, bot = update.effective_chat.id, context.bot
        await bot.send_chat_action(chat, ChatAction.TYPING)

        async def post(text: str, live: bool) -> Message:
            return await bot.send_message(chat, text, reply_markup=STOP if live else None)

        async def edit(message: Message, text: str, live: bool) -> None:
            await message.edit_text(text, reply_markup=STOP if live else None)

        reply = BareReply(post, edit, edit_interval)
        await stream_into(client, model_slots, update.message.text or "", reply)

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
