"""Telegram edits: how often a streaming reply edits its message, and how soon its text shows.

Everything runs the real path: python-telegram-bot in `TelegramChannel` long-polls the fake Bot
API (`tests.fakes.telegram.FakeTelegram`, an aiohttp server on 127.0.0.1 in this process), hands
each message to the real `Dispatcher` and `TurnRunner` (SQLite store in a temporary folder, real
`ModelClient`), and the reply streams from the fake Ollama in its own process. The benchmark only
queues updates on the fake Telegram and reads the calls it recorded; nothing in Kaiwa is patched.
Every timestamp compared with the fake's records is `time.time()`, the clock `Call.at` uses (the
fake stamps a call once it has applied it, just before it answers).

1. Edit rate. N chats (1, then 10) each receive one message at the same instant; each reply
   streams 175 chunks 20 ms apart (~3.5 s). The reply text is 175 characters, so every chunk adds
   one character and the text changes for the whole stream (with more chunks than characters the
   extra chunks are empty and the text stops changing early). Per chat, from the fake's records:
   - edits/s = editMessageText calls ÷ the time from the reply's sendMessage (its first visible
     text) to its last editMessageText; at most 1 / edit_interval if the interval is kept;
   - the smallest gap between consecutive calls that change the reply (its sendMessage and every
     editMessageText), which must be ≥ edit_interval; printed twice: over all of them, and
     without each reply's last edit (usually the one `finish` makes once the stream has ended),
     so a short final gap is told apart from frames that come too fast.
   Median and max over the chats (each round uses new chats; `--rounds` rounds per N).
2. First visible text. The moment the model client receives its first chunk happens inside Kaiwa
   and cannot be seen from outside without patching it, so this is measured in two halves on one
   fake Ollama (20 chunks 5 ms apart) and compared: Kaiwa end to end, from the update queued on
   the fake Telegram to the fake receiving the reply's first sendMessage (long-poll delivery,
   python-telegram-bot, dispatcher, store, model request, frame pump, sendMessage), against a bare
   `ollama.AsyncClient` from its request to its first chunk. The difference is the time Kaiwa and
   the Telegram path add before the first model token is visible. One chat at a time, a new chat
   each round, Kaiwa and the bare client alternating (and swapping which goes first each round).

Figures are printed with PASS/MISS for information; nothing exits non-zero on a miss.

Run from the repository root:
    .venv/bin/python benchmarks/telegram_edits.py [--rounds 3] [--first-rounds 20]
                                                  [--edit-interval 1.0]
or  .venv/bin/python -m benchmarks.telegram_edits
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import ollama

from benchmarks import _common as bench  # clears the proxy variables
from channels.settings import TelegramSettings
from channels.telegram.channel import PLATFORM, TelegramChannel
from core.turns.runner import TurnRunner
from tests.fakes.ollama import BENCHMARK_REPLY
from tests.fakes.telegram import BOT_TOKEN, Call, FakeTelegram

CHUNKS, DELAY_MS = 175, 20
FIRST_CHUNKS, FIRST_DELAY_MS = 20, 5
CHAT_COUNTS = (1, 10)
WAIT = 60.0
SHOWN = ("sendmessage", "editmessagetext")
_CHATS = itertools.count(5001)  # every reply gets a chat (a conversation) of its own


# -- the bot: real Telegram channel and turn path on the fake Bot API -------------------------


@dataclass
class TelegramBot:
    fake: FakeTelegram
    runner: TurnRunner

    async def answer(self, text: str = "Hello there") -> tuple[int, float]:
        """A message in a new chat; returns the chat and when the update was queued, once the
        reply's turn has ended (its final text shown)."""
        chat = next(_CHATS)
        queued = time.time()
        self.fake.user_message(chat, text)
        await self.fake.wait_until(lambda: self.fake.sent(chat), WAIT, what=f"a reply in {chat}")
        await self.runner.wait_idle(f"{PLATFORM}:{chat}")
        return chat, queued

    def shown_calls(self, chat: int) -> list[Call]:
        """The calls that changed what `chat` shows (sendMessage, editMessageText), in order."""
        calls = [
            call
            for call in self.fake.calls
            if call.method.lower() in SHOWN and int(call.params.get("chat_id", 0)) == chat
        ]
        return sorted(calls, key=lambda call: call.at)


@asynccontextmanager
async def telegram_bot(
    url: str, data_dir: Path, edit_interval: float, max_concurrent: int
) -> AsyncIterator[TelegramBot]:
    """Started as the app starts it, stopped as the app stops it."""
    async with FakeTelegram() as fake:
        channel = TelegramChannel(
            TelegramSettings(
                base_url=fake.base_url,
                base_file_url=fake.base_file_url,
                edit_interval=edit_interval,
                poll_timeout=1,
                anyone=True,
            ),
            BOT_TOKEN,
        )
        kaiwa = await bench.build_kaiwa(url, data_dir, max_concurrent, channel=channel)
        reading = asyncio.create_task(channel.run(kaiwa.dispatcher.handle))
        try:
            await fake.wait_until(lambda: fake.calls_to("getUpdates"), WAIT, what="the first poll")
            yield TelegramBot(fake, kaiwa.runner)
        finally:
            await channel.stop_receiving()
            await asyncio.wait_for(reading, 10)
            await kaiwa.close()
            await channel.close()


# -- 1. edit rate -------------------------------------------------------------------------------


@dataclass
class ChatFigures:
    edits: int
    refused: int  # edits the fake answered with an error
    rate: float  # edits per second, first visible text to last edit
    min_gap: float  # between consecutive sendMessage/editMessageText calls of the chat
    min_gap_frames: float  # the same without the chat's last edit
    first_visible: float  # update queued -> first sendMessage
    problem: str  # "" when the reply ended showing the whole text in one message


def chat_figures(bot: TelegramBot, chat: int, queued: float) -> ChatFigures:
    calls = bot.shown_calls(chat)
    sends = [call for call in calls if call.method.lower() == "sendmessage"]
    edits = [call for call in calls if call.method.lower() == "editmessagetext"]
    times = [call.at for call in calls]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    span = edits[-1].at - sends[0].at if edits and sends else float("nan")
    shown = [message.visible for message in bot.fake.sent(chat)]
    problem = "" if shown == [BENCHMARK_REPLY] else f"shown {shown!r}"
    return ChatFigures(
        edits=len(edits),
        refused=sum(call.error is not None for call in edits),
        rate=len(edits) / span if span > 0 else float("nan"),
        min_gap=min(gaps, default=float("nan")),
        min_gap_frames=min(gaps[:-1], default=float("nan")),
        first_visible=sends[0].at - queued if sends else float("nan"),
        problem=problem,
    )


async def edit_rates(
    url: str, edit_interval: float, chat_counts: tuple[int, ...], rounds: int
) -> dict[int, list[ChatFigures]]:
    """Per N: the figures of every chat of every round (N chats streaming at once)."""
    results: dict[int, list[ChatFigures]] = {}
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        async with telegram_bot(url, Path(tmp), edit_interval, max(chat_counts)) as bot:
            await bot.answer()  # warm-up: connections to both fakes, first conversation
            for count in chat_counts:
                figures = results.setdefault(count, [])
                for _ in range(rounds):
                    answered = await asyncio.gather(*(bot.answer() for _ in range(count)))
                    figures += [chat_figures(bot, chat, queued) for chat, queued in answered]
    return results


# -- 2. first visible text ----------------------------------------------------------------------


async def bare_first_chunk(client: ollama.AsyncClient) -> float:
    """Seconds from the request to its first chunk; the rest of the stream is consumed too."""
    messages = [
        {"role": "system", "content": bench.SYSTEM_PROMPT},
        {"role": "user", "content": "Hello there"},
    ]
    started = time.time()
    first: float | None = None
    stream = await client.chat(model=bench.MODEL, messages=messages, stream=True)
    async for _ in stream:
        if first is None:
            first = time.time() - started
    assert first is not None, "the stream had no chunk"
    return first


async def kaiwa_first_visible(bot: TelegramBot) -> float:
    chat, queued = await bot.answer()
    return chat_figures(bot, chat, queued).first_visible


async def first_visible(
    url: str, edit_interval: float, rounds: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Seconds to the first visible text (Kaiwa) and to the first chunk (bare), interleaved."""
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        async with telegram_bot(url, Path(tmp), edit_interval, 1) as bot:
            client = bench.bare_client(url, connections=1)
            try:
                for _ in range(warmup):
                    await kaiwa_first_visible(bot)
                    await bare_first_chunk(client)
                kaiwa: list[float] = []
                bare: list[float] = []
                for index in range(rounds):
                    if index % 2:
                        bare.append(await bare_first_chunk(client))
                        kaiwa.append(await kaiwa_first_visible(bot))
                    else:
                        kaiwa.append(await kaiwa_first_visible(bot))
                        bare.append(await bare_first_chunk(client))
            finally:
                await client.close()
    return kaiwa, bare


# -- report -------------------------------------------------------------------------------------


def seconds(value: float) -> str:
    return f"{value:.3f} s"


def report_edits(results: dict[int, list[ChatFigures]], edit_interval: float) -> None:
    rows, verdicts = [], []
    for count, figures in results.items():
        rates = [f.rate for f in figures]
        gaps = [f.min_gap for f in figures]
        frame_gaps = [f.min_gap_frames for f in figures]
        visible = [f.first_visible for f in figures]
        rows.append((
            f"{count} at once",
            len(figures),
            f"{bench.median([f.edits for f in figures]):g}",
            sum(f.refused for f in figures),
            f"{bench.median(rates):.3f} / {max(rates):.3f}",
            f"{seconds(bench.median(gaps))} / {seconds(min(gaps))}",
            f"{seconds(bench.median(frame_gaps))} / {seconds(min(frame_gaps))}",
            f"{bench.ms(bench.median(visible))} / {bench.ms(max(visible))}",
        ))  # fmt: skip
        limit = 1 / edit_interval
        verdicts += [
            (f"max edits/s, {count} at once", f"{max(rates):.3f}", f"<= {limit:g}",
             bench.verdict(max(rates), limit)),
            (f"min gap, {count} at once", seconds(min(gaps)), f">= {edit_interval:g} s",
             bench.verdict(-min(gaps), -edit_interval)),
            (f"min gap without last edit, {count} at once", seconds(min(frame_gaps)),
             f">= {edit_interval:g} s", bench.verdict(-min(frame_gaps), -edit_interval)),
        ]  # fmt: skip
        for index, figure in enumerate(figures):
            if figure.problem:
                print(f"  reply check failed: {count} at once, chat {index}: {figure.problem}")
    bench.print_table(
        f"Edits per chat (edit_interval {edit_interval:g} s; median / max, gaps median / min)",
        ("chats", "replies", "edits", "refused", "edits/s", "min gap", "min gap w/o last edit",
         "message in -> first text"),
        rows,
    )  # fmt: skip
    bench.print_table(
        "Edit interval kept (information only)", ("figure", "value", "target", "verdict"), verdicts
    )


def report_first_visible(kaiwa: list[float], bare: list[float]) -> None:
    rows = []
    for side, times in (
        ("kaiwa: update queued -> first sendMessage", kaiwa),
        ("bare client: request -> first chunk", bare),
    ):
        p50, p99 = bench.median(times), bench.percentile(times, 99)
        rows.append((side, len(times), bench.ms(p50), bench.ms(p99), bench.ms(max(times))))
    added = [
        ("median", bench.ms(bench.median(kaiwa) - bench.median(bare))),
        ("p99", bench.ms(bench.percentile(kaiwa, 99) - bench.percentile(bare, 99))),
    ]
    bench.print_table("Time to the first token", ("side", "n", "p50", "p99", "max"), rows)
    bench.print_table(
        "Added before the first token is visible (kaiwa - bare, same statistic)",
        ("statistic", "added"),
        added,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per number of chats")
    parser.add_argument("--first-rounds", type=int, default=20, help="first-text rounds per side")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first-text rounds")
    parser.add_argument("--edit-interval", type=float, default=1.0, help="Telegram edit_interval")
    parser.add_argument("--chunks", type=int, default=CHUNKS, help="chunks per streamed reply")
    parser.add_argument("--delay-ms", type=float, default=DELAY_MS, help="between chunks")
    args = parser.parse_args()
    print(
        f"telegram edits: {args.chunks} chunks {args.delay_ms:g} ms apart, "
        f"edit_interval {args.edit_interval:g} s, {args.rounds} rounds of {CHAT_COUNTS} chats; "
        f"first text: {args.first_rounds} rounds per side on {FIRST_CHUNKS} chunks "
        f"{FIRST_DELAY_MS} ms apart"
    )
    with bench.fake_ollama(args.chunks, args.delay_ms) as url:
        results = asyncio.run(edit_rates(url, args.edit_interval, CHAT_COUNTS, args.rounds))
    with bench.fake_ollama(FIRST_CHUNKS, FIRST_DELAY_MS) as url:
        kaiwa, bare = asyncio.run(
            first_visible(url, args.edit_interval, args.first_rounds, args.warmup)
        )
    report_edits(results, args.edit_interval)
    report_first_visible(kaiwa, bare)


if __name__ == "__main__":
    main()
