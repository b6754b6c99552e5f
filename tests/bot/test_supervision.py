"""Supervised channels: one that fails is restarted while the others go on answering."""

import asyncio
import logging

import pytest

from bot.supervision import Supervised
from core.channel import ChannelMessage, Deliver
from core.errors import ChannelError
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Text
from tests.fakes.patience import deadline
from tests.harness import BotFactory

PAUSE = 0.01


class Flaky(RecordingChannel):
    """A channel whose receive loop raises the first `failures` times it runs (an event its
    library cannot parse, say), then receives until stopped."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        super().__init__("flaky")
        self.failures = failures
        self.error = error or ValueError("an event it could not parse")
        self.runs = 0
        self.tried = asyncio.Event()
        self.running = asyncio.Event()
        self._stop = asyncio.Event()

    async def run(self, deliver: Deliver) -> None:
        self.runs += 1
        self.tried.set()
        if self.runs <= self.failures:
            raise self.error
        self.running.set()
        await self._stop.wait()

    async def stop_receiving(self) -> None:
        self._stop.set()


async def test_a_channel_that_fails_is_restarted_and_the_others_go_on(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: one Discord event the library could not parse ended its task, and with it
    every channel, with exit status 0."""
    bot = make_bot()
    flaky = Flaky(failures=2)
    supervised = Supervised(flaky, bot.dispatcher.handle, first_pause=PAUSE)
    with caplog.at_level(logging.ERROR, logger="bot.supervision"):
        running = asyncio.create_task(supervised.run())
        bot.ollama.script(Text("Still here."))
        await bot.send("anyone?")
        await flaky.running.wait()
    (reply,) = await bot.channel.finished()
    assert reply.text == "Still here."
    assert flaky.runs == 3
    assert [r.getMessage() for r in caplog.records] == [
        "flaky stopped (ValueError: an event it could not parse); restarting it in 0.01 s, the "
        "other channels go on",
        "flaky stopped (ValueError: an event it could not parse); restarting it in 0.02 s, the "
        "other channels go on",
    ]
    assert flaky.connected.is_set() is False, "said not connected while it was down"
    await supervised.stop()
    ended = await running
    assert ended.error is None


async def test_a_channel_that_needs_a_person_ends_with_its_error() -> None:
    flaky = Flaky(failures=1, error=ChannelError("Telegram rejected the bot token"))

    ended = await Supervised(flaky, _nowhere, first_pause=PAUSE).run()

    assert (ended.platform, str(ended.error)) == ("flaky", "Telegram rejected the bot token")
    assert flaky.problem == "Telegram rejected the bot token"
    assert flaky.runs == 1, "not retried: a token needs a person"


async def test_stopping_during_the_pause_before_a_restart_is_prompt() -> None:
    flaky = Flaky(failures=1)
    supervised = Supervised(flaky, _nowhere, first_pause=3600)
    running = asyncio.create_task(supervised.run())
    await flaky.tried.wait()  # it failed at once, and now waits out its pause
    await supervised.stop()
    ended = await asyncio.wait_for(running, deadline())
    assert ended.error is None and flaky.runs == 1


async def _nowhere(message: ChannelMessage) -> None:
    raise AssertionError(f"nothing is delivered here: {message}")
