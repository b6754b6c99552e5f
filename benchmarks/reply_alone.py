"""Reply alone: one person, one message at a time, on each platform, from the message to the
whole reply shown, for a real `kaiwa` process beside a bare bot on the same fakes, in one run.

What a person alone feels is the time from sending a message to reading the whole answer, its
final text with no Stop button under it. Kaiwa ships with `post_grace` (0.3 s: a reply complete
by then is one message) and `edit_interval` (1 s between edits of a streaming reply, never before
its final text); the bare bots (`bare_telegram_bot.py`, `bare_slack_bot.py`,
`bare_discord_bot.py`, on `benchmarks/_bare.py`) post at the first word, edit at most once an
interval, and send the final text the moment the stream ends: what any bot on Ollama pays.

Each side has a fake platform of its own (the same code: `tests.fakes.telegram`, `.slack`,
`.discord`, in this process) and both share one fake Ollama (its own process). Both processes run
at once and the messages alternate between them, so drift in this machine's speed hits both.
Each platform, each stream shape (`--streams`: chunks x ms apart; the default pair is a reply the
model gives at once and one that streams for a second), `--messages` messages per side, each in a
chat of its own; the first of each side is a warm-up. Kaiwa runs on its shipped defaults (only
where to reach the fakes is set); its Slack takes events by Socket Mode, as the bare bot's.

Printed per platform and stream: message → first text and message → whole reply (median, p90),
calls per message, and the ratio of Kaiwa's median to the bare bot's. Targets (issue 36): whole
reply ≤ 1.1× the bare bot's and ≤ 50 ms on a reply the model gives at once.

Run from the repository root:
    .venv/bin/python benchmarks/reply_alone.py [--messages 20] [--platforms telegram,slack,discord]
                                              [--streams 20x0,20x50] [--kaiwa-from DIR]

`--kaiwa-from DIR` runs the kaiwa side from another checkout (same virtualenv), so two commits
meet the same bare bots and fakes.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import itertools
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from benchmarks import _common as bench  # clears the proxy variables
from tests.fakes import discord as discord_fake
from tests.fakes import slack as slack_fake
from tests.fakes import telegram as telegram_fake
from tests.fakes.ollama import BENCHMARK_REPLY

READY_SECONDS = 60.0
REPLY_SECONDS = 30.0
SIDES = ("kaiwa", "bare")
_PEOPLE = itertools.count(1)


@dataclass
class Seen:
    """What the fake showed of one reply: when its first text and its whole form came."""

    first: float | None = None
    whole: float | None = None
    calls: int = 0


@dataclass
class Platform:
    """One side's fake platform: how a person writes, what the reply looks like there, and how
    each bot is pointed at it."""

    name: str
    fake: Any
    send: Callable[[int], str]
    seen: Callable[[str], Seen]
    kaiwa_config: str
    env: dict[str, str]
    bare: list[str]


def telegram(fake: telegram_fake.FakeTelegram) -> Platform:
    def send(person: int) -> str:
        fake.user_message(person, "Hello there")
        return str(person)

    def seen(chat: str) -> Seen:
        shown = [c for c in fake.calls if str(c.params.get("chat_id")) == chat and c.error is None]
        posts = [c.at for c in shown if c.method.lower() == "sendmessage"]
        sent = fake.sent(int(chat))
        whole = bool(sent) and sent[-1].visible.strip() == BENCHMARK_REPLY and not sent[-1].buttons
        edits = [c.at for c in shown if c.method.lower() in ("sendmessage", "editmessagetext")]
        return Seen(posts[0] if posts else None, edits[-1] if whole else None, len(shown))

    config = (
        f'[channels.telegram]\nbase_url = "{fake.base_url}"\n'
        f'base_file_url = "{fake.base_file_url}"\nanyone = true\n'
    )
    bare = ["benchmarks.bare_telegram_bot", "--token", telegram_fake.BOT_TOKEN]
    bare += ["--base-url", fake.base_url]
    env = {"KAIWA_TELEGRAM_TOKEN": telegram_fake.BOT_TOKEN}
    return Platform("telegram", fake, send, seen, config, env, bare)


def slack(fake: slack_fake.FakeSlack) -> Platform:
    def send(person: int) -> str:
        channel = f"D{person}"
        fake.dm(channel, "Hello there", user=f"U{person}")
        return channel

    def seen(channel: str) -> Seen:
        shown = [c for c in fake.calls if c.params.get("channel") == channel and c.error is None]
        shown = [c for c in shown if c.method in ("chat.postMessage", "chat.update")]
        posted = fake.posted(channel)
        last = posted[-1] if posted else None
        whole = last is not None and last.text.strip() == BENCHMARK_REPLY and not _buttons(last)
        first = shown[0].at if shown else None
        return Seen(first, shown[-1].at if whole else None, len(shown))

    config = f'[channels.slack]\napi_url = "{fake.api_url}"\nanyone = true\n'
    env = {
        "KAIWA_SLACK_BOT_TOKEN": slack_fake.BOT_TOKEN,
        "KAIWA_SLACK_APP_TOKEN": slack_fake.APP_TOKEN,
    }
    bare = ["benchmarks.bare_slack_bot", "--bot-token", slack_fake.BOT_TOKEN]
    bare += ["--app-token", slack_fake.APP_TOKEN, "--api-url", fake.api_url]
    return Platform("slack", fake, send, seen, config, env, bare)


def _buttons(posted: Any) -> bool:
    return any(block.get("type") == "actions" for block in posted.blocks or [])


def discord(fake: discord_fake.FakeDiscord) -> Platform:
    def send(person: int) -> str:
        user = discord_fake.USER_ID + person
        fake.dm(user, "Hello there")
        return str(fake.dm_channel(user))

    def seen(channel: str) -> Seen:
        path = f"/channels/{channel}/messages"
        shown = [c for c in fake.calls if c.path.startswith(path) and c.status < 300]
        messages = fake.messages(int(channel))
        last = messages[-1] if messages else None
        whole = last is not None and last.content.strip() == BENCHMARK_REPLY
        whole = whole and last is not None and not last.components
        first = shown[0].at if shown else None
        return Seen(first, shown[-1].at if whole else None, len(shown))

    config = (
        f'[channels.discord]\napi_base = "{fake.api_base}"\n'
        f'gateway_url = "{fake.gateway_url}"\nanyone = true\n'
    )
    env = {"KAIWA_DISCORD_TOKEN": discord_fake.BOT_TOKEN}
    bare = ["benchmarks.bare_discord_bot", "--token", discord_fake.BOT_TOKEN]
    bare += ["--api-base", fake.api_base, "--gateway", fake.gateway_url]
    return Platform("discord", fake, send, seen, config, env, bare)


FAKES: dict[str, tuple[Callable[[], Any], Callable[[Any], Platform]]] = {
    "telegram": (telegram_fake.FakeTelegram, telegram),
    "slack": (slack_fake.FakeSlack, slack),
    "discord": (discord_fake.FakeDiscord, discord),
}


# -- the two processes -----------------------------------------------------------------------


@asynccontextmanager
async def bot(
    side: str, platform: Platform, ollama_url: str, folder: Path, kaiwa_from: Path | None
) -> AsyncIterator[None]:
    env = {**os.environ, **platform.env, "KAIWA_CONFIG": ""}
    cwd = bench.ROOT
    if side == "kaiwa":
        config = folder / "kaiwa.toml"
        config.write_text(
            f'[ollama]\nurl = "{ollama_url}"\n\n'
            f'[agents.assistant]\nmodel = "{bench.MODEL}"\n'
            f'system_prompt = "{bench.SYSTEM_PROMPT}"\ntools = []\n\n'
            f'[storage]\ndata_dir = "{folder / "state"}"\n\n'
            f"[channels.terminal]\nenabled = false\n\n{platform.kaiwa_config}"
        )
        command = [sys.executable, "-m", "bot", "--config", str(config), "run"]
        cwd = kaiwa_from or bench.ROOT  # another checkout of Kaiwa, for a before and after
    else:
        command = [sys.executable, "-m", *platform.bare, "--ollama", ollama_url]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        process.kill()
        await process.wait()


async def one_message(platform: Platform) -> Seen:
    sent_at = time.time()
    where = platform.send(next(_PEOPLE))
    await platform.fake.wait_until(
        lambda: platform.seen(where).whole is not None, timeout=REPLY_SECONDS, what="a whole reply"
    )
    seen = platform.seen(where)
    assert seen.whole is not None
    return Seen((seen.first or seen.whole) - sent_at, seen.whole - sent_at, seen.calls)


@dataclass
class Figures:
    first: list[float] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)

    def add(self, seen: Seen) -> None:
        assert seen.first is not None and seen.whole is not None
        self.first.append(seen.first)
        self.whole.append(seen.whole)
        self.calls.append(seen.calls)


async def measure(name: str, ollama_url: str, args: argparse.Namespace) -> dict[str, Figures]:
    make_fake, describe = FAKES[name]
    figures = {side: Figures() for side in SIDES}
    async with AsyncExitStack() as stack:
        platforms: dict[str, Platform] = {}
        for side in SIDES:
            fake = await stack.enter_async_context(make_fake())
            platforms[side] = describe(fake)
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kaiwa-alone-")))
            running = bot(side, platforms[side], ollama_url, folder, args.kaiwa_from)
            await stack.enter_async_context(running)
        warm = [one_message(platforms[side]) for side in SIDES]
        await _within(asyncio.gather(*warm), READY_SECONDS)
        for index in range(args.messages):
            order = SIDES if index % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                figures[side].add(await one_message(platforms[side]))
    return figures


async def _within(awaitable: Awaitable[Any], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        await awaitable


# -- the report --------------------------------------------------------------------------------


def report(name: str, stream: str, figures: dict[str, Figures]) -> list[list[object]]:
    kaiwa, bare = figures["kaiwa"], figures["bare"]
    ratio = bench.median(kaiwa.whole) / bench.median(bare.whole)
    rows = []
    for side in SIDES:
        f = figures[side]
        rows.append(
            [
                name,
                stream,
                side,
                bench.ms(bench.median(f.first)),
                bench.ms(bench.median(f.whole)),
                bench.ms(bench.percentile(f.whole, 90)),
                f"{sum(f.calls) / len(f.calls):.2f}",
                f"{ratio:.2f}×" if side == "kaiwa" else "",
            ]
        )
    return rows


async def main(args: argparse.Namespace) -> None:
    rows: list[list[object]] = []
    for stream in args.streams.split(","):
        chunks, delay_ms = (float(part) for part in stream.split("x"))
        with bench.fake_ollama(int(chunks), delay_ms) as ollama_url:
            for name in args.platforms.split(","):
                figures = await measure(name, ollama_url, args)
                rows += report(name, f"{int(chunks)} chunks {delay_ms:g} ms apart", figures)
    bench.print_table(
        f"message → whole reply, one person alone, {args.messages} messages per side "
        "(target: Kaiwa ≤ 1.1× the bare bot, ≤ 50 ms for a reply given at once)",
        ["platform", "stream", "side", "first text", "whole p50", "whole p90", "calls", "ratio"],
        rows,
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20, help="messages per side")
    parser.add_argument("--platforms", default="telegram,slack,discord")
    parser.add_argument("--streams", default="20x0,20x50", help="chunks x ms apart, ...")
    parser.add_argument(
        "--kaiwa-from", type=Path, default=None, help="run the kaiwa side from this checkout"
    )
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
