"""Discord stops: how soon a reply shows "(stopped)" after a person stops it, each of three ways.

Everything runs the real path: discord.py in `DiscordChannel` on the fake Discord
(`tests.fakes.discord.FakeDiscord`: REST and the gateway websocket, an aiohttp server on
127.0.0.1 in this process), the real `Dispatcher`, `TurnRunner`, SQLite store and `ModelClient`,
and a long reply streaming from the fake Ollama in its own process (2,000 chunks 5 ms apart, so
every stop lands mid-stream). Nothing in Kaiwa is patched; times are `time.time()`, the clock the
fake stamps its records with.

Each round, a mention opens a new thread; 0 to 1.5 × edit_interval after the reply's first text
shows (a seeded random pause, so stops land at every point of the edit cycle), the person stops
it, rotating through typed "/stop", the /stop slash command and the Stop button. Measured: from the
fake dispatching the person's action to the fake applying the edit that shows "(stopped)". A
reply keeps `edit_interval` between two of its edits, the final one included, so part of that
time is waiting out the interval since the reply's previous edit. "Beyond the interval" is the
time from the later of the action and (previous edit + interval) to the "(stopped)" edit, from
the fake's records: what the stop itself costs.

Baseline, same run: a bare discord.py `Client` on a fake of its own that answers each message
with `channel.send`: the time from the fake dispatching a message to receiving that send, the
gateway-to-REST round trip any discord.py bot pays. (The two cannot share one fake, and
discord.py's URL seams are process-wide, so the sides run one after the other, bare first.)

Figures are printed with PASS/MISS for information (target: beyond the interval, p99 ≤ 50 ms,
the loaded target of stop_latency.py); nothing exits non-zero on a miss.

Run from the repository root:
    .venv/bin/python benchmarks/discord_stop.py [--rounds 20] [--warmup 2] [--edit-interval 1.0]
or  .venv/bin/python -m benchmarks.discord_stop
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import random
import tempfile
import time
import warnings

from benchmarks import _common as bench  # clears the proxy variables
from channels.discord.channel import DiscordChannel
from channels.presses import STOP, payload
from channels.settings import DiscordSettings
from tests.fakes.discord import BOT_TOKEN, CHANNEL_ID, FakeDiscord

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop (3.11)
    import discord

CHUNKS, DELAY_MS = 2000, 5
WAYS = ("typed /stop", "slash command", "Stop button")
WAIT = 30.0
STOPPED = "(stopped)"
TARGET = 0.050  # seconds beyond the interval, p99
SEED = 5


async def kaiwa_stops(
    url: str, rounds: int, warmup: int, edit_interval: float
) -> dict[str, list[tuple[float, float]]]:
    """Per way: (action -> "(stopped)" shown, the part of that beyond the interval's wait)."""
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as folder:
        async with FakeDiscord() as fake:
            settings = DiscordSettings(
                api_base=fake.api_base,
                gateway_url=fake.gateway_url,
                edit_interval=edit_interval,
                anyone=True,
            )
            channel = DiscordChannel(settings, BOT_TOKEN, guild_ready_timeout=0.01)
            kaiwa = await bench.build_kaiwa(url, Path(folder), 8, channel=channel)
            reading = asyncio.create_task(channel.run(kaiwa.dispatcher.handle))
            await asyncio.wait_for(channel.connected.wait(), WAIT)
            try:
                pauses = random.Random(SEED)
                for index in range((warmup + rounds) * len(WAYS)):
                    way = WAYS[index % len(WAYS)]
                    pause = pauses.uniform(0, 1.5 * edit_interval)
                    measured = await stop_one(fake, way, edit_interval, pause)
                    if index >= warmup * len(WAYS):
                        results[way].append(measured)
            finally:
                await channel.stop_receiving()
                await asyncio.wait_for(reading, 10)
                await kaiwa.close()
                await channel.close()
    return results


async def stop_one(
    fake: FakeDiscord, way: str, edit_interval: float, pause: float
) -> tuple[float, float]:
    """One reply stopped one way: (action -> "(stopped)" shown, beyond the interval)."""
    thread = int(fake.user_message(CHANNEL_ID, "tell me a long story", mentions_bot=True)["id"])
    await fake.wait_until(lambda: fake.messages(thread), WAIT, what="the first text")
    await asyncio.sleep(pause)
    reply = fake.messages(thread)[0]
    acted = time.time()
    if way == "typed /stop":
        fake.user_message(thread, "/stop")
    elif way == "slash command":
        fake.slash_command("stop", channel_id=thread)
    else:
        fake.button_click(reply.id, payload(STOP))
    await fake.wait_until(
        lambda: fake.messages(thread)[0].content.endswith(STOPPED), WAIT, what="(stopped)"
    )
    changes = [
        call.at
        for call in fake.calls
        if call.status == 200
        and call.path.startswith(f"/channels/{thread}/messages")
        and call.method in ("POST", "PATCH")
    ]
    shown, previous = changes[-1], changes[-2]
    allowed_from = max(acted, previous + edit_interval)  # the interval since the last change
    return shown - acted, shown - allowed_from


async def bare_round_trips(rounds: int, warmup: int) -> list[float]:
    """A plain discord.py bot that answers every message: dispatch -> its channel.send."""
    answered = asyncio.Event()

    class Echo(discord.Client):
        async def on_message(self, message: discord.Message) -> None:
            if message.author != self.user:
                await message.channel.send("pong")
                answered.set()

    times = []
    async with FakeDiscord(echo_bot_messages=False) as fake:
        with fake.installed():
            intents = discord.Intents.default()
            intents.message_content = True
            client = Echo(intents=intents, guild_ready_timeout=0.01)
            await client.login(BOT_TOKEN)
            connection = asyncio.create_task(client.connect())
            await asyncio.wait_for(client.wait_until_ready(), WAIT)
            for _ in range(warmup + rounds * len(WAYS)):
                answered.clear()
                sent = time.time()
                fake.user_message(CHANNEL_ID, "ping")
                await asyncio.wait_for(answered.wait(), WAIT)
                (*_, answer) = fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages")
                times.append(answer.at - sent)
            await client.close()
            await connection
    return times[warmup:]


def report(
    stops: dict[str, list[tuple[float, float]]], bare: list[float], edit_interval: float
) -> None:
    rows, verdicts = [], []
    rows.append(("bare discord.py: message -> its send", len(bare), *figures(bare), "-"))
    for way, pairs in stops.items():
        total = [shown for shown, _ in pairs]
        beyond = [net for _, net in pairs]
        rows.append((f"kaiwa {way}: action -> (stopped)", len(total), *figures(total), "total"))
        rows.append((f"kaiwa {way}: beyond the interval", len(beyond), *figures(beyond), "net"))
        p99 = bench.percentile(beyond, 99)
        verdicts.append((way, bench.ms(p99), f"<= {bench.ms(TARGET)}", bench.verdict(p99, TARGET)))
    bench.print_table(
        f"Stopping a streaming reply (edit_interval {edit_interval:g} s)",
        ("path", "n", "p50", "p99", "max", "figure"),
        rows,
    )
    bench.print_table(
        "Beyond the interval, p99 (information only)",
        ("way", "p99", "target", "verdict"),
        verdicts,
    )


def figures(values: list[float]) -> tuple[str, str, str]:
    return (
        bench.ms(bench.median(values)),
        bench.ms(bench.percentile(values, 99)),
        bench.ms(max(values)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per way of stopping")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds per way")
    parser.add_argument("--edit-interval", type=float, default=1.0, help="Discord edit_interval")
    args = parser.parse_args()
    print(
        f"discord stops: {args.rounds} rounds per way, edit_interval {args.edit_interval:g} s, "
        f"reply of {CHUNKS} chunks {DELAY_MS} ms apart"
    )
    bare = asyncio.run(bare_round_trips(args.rounds, args.warmup))
    with bench.fake_ollama(CHUNKS, DELAY_MS) as url:
        stops = asyncio.run(kaiwa_stops(url, args.rounds, args.warmup, args.edit_interval))
    report(stops, bare, args.edit_interval)


if __name__ == "__main__":
    main()
