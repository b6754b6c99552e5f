"""What the web chat's tests share: the channel serving on a free port of 127.0.0.1, delivering
into a bot on the fake Ollama (`web`), and Playwright's chromium (`tests.browser`)."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.settings import WebSettings
from channels.web.channel import WebChannel
from core.dispatch.dispatcher import Allowed
from tests.browser import browser, page  # noqa: F401
from tests.channels.platforms import running
from tests.fakes.patience import deadline
from tests.harness import Bot, BotFactory


@pytest.fixture
async def web(
    make_bot: BotFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Bot, WebChannel]]:
    """The channel and its bot; a test's `bot(...)` marker adds to what the bot is built with
    (`tests.harness.make_bot`'s settings: `images=True`, `approvals=...`)."""
    said: list[str] = []
    channel = WebChannel(WebSettings(enabled=True, port=0), tmp_path, announce=said.append)
    marker = request.node.get_closest_marker("bot")
    settings = marker.kwargs if marker else {}
    bot = make_bot(channel=channel, access=Allowed(users=None), **settings)
    async with running(channel, bot):
        await asyncio.wait_for(channel.connected.wait(), deadline())
        assert said == [said[0]] and said[0].startswith(f"web chat: {channel.url}/login?key=")
        yield bot, channel
