"""The bare bot `reply_alone.py` measures Kaiwa against on Discord: discord.py and the ollama
client, nothing else.

For each direct message: "typing…" once, the model's stream (one `ollama.AsyncClient`, at most
`--slots` requests at once) into the reply `benchmarks/_bare.py` streams: posted with its first
text and a Stop button, edited as it grows no more than once per `--edit-interval`, the final
text without the button the moment the stream ends. discord.py keeps Discord's rate-limit
buckets itself, as for any bot.

    python -m benchmarks.bare_discord_bot --token T --api-base URL --gateway URL --ollama URL
                                          [--edit-interval 1.0] [--slots 1]

prints `READY` once the gateway says so; it runs until killed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio

import discord
import yarl

from benchmarks import _common as bench  # clears the proxy variables
from benchmarks._bare import BareReply, stream_into


class StopView(discord.ui.View):
    def __init__(self) -> None:
        super().__init__(timeout=None)
        self.add_item(discord.ui.Button(label="Stop", custom_id="stop"))


def build(args: argparse.Namespace) -> discord.Client:
    discord.http.Route.BASE = args.api_base.rstrip("/")
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(args.gateway)
    intents = discord.Intents.default()
    intents.message_content = True
    bot = discord.Client(intents=intents)
    client = bench.bare_client(args.ollama, connections=32)
    model_slots = asyncio.Semaphore(args.slots)

    @bot.event
    async def on_ready() -> None:
        print("READY gateway", flush=True)

    @bot.event
    async def on_message(message: discord.Message) -> None:
        if message.author.bot or message.guild is not None:
            return
        channel = message.channel
        async with channel.typing():
            pass  # one "typing…", as a reply's start

        async def post(text: str, live: bool) -> discord.Message:
            return await channel.send(text, view=StopView() if live else None)

        async def edit(sent: discord.Message, text: str, live: bool) -> None:
            await sent.edit(content=text, view=StopView() if live else None)

        reply = BareReply(post, edit, args.edit_interval)
        await stream_into(client, model_slots, message.content, reply)

    return bot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token", required=True)
    parser.add_argument("--api-base", required=True, help="the (fake) REST API's base")
    parser.add_argument("--gateway", required=True, help="the (fake) gateway's URL")
    parser.add_argument("--ollama", required=True, help="the (fake) Ollama's URL")
    parser.add_argument("--edit-interval", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=1, help="model requests at once")
    args = parser.parse_args()
    build(args).run(args.token, log_handler=None)


if __name__ == "__main__":
    main()
