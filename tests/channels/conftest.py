"""The `platform` fixture: every platform adapter, for the conformance suite.

A contract marked `platforms(*names, why=...)` runs on those platforms alone, and is skipped on
the others with `why` (tests/channels/test_conformance.py says which and why). One marked
`channel(**settings)` gets a channel built with those platform settings (the web chat, which
has none of a platform's, is built as always).
"""

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.channels.platforms import Platform, discord_platform, slack_platform, telegram_platform
from tests.channels.web_platform import web_platform
from tests.harness import BotFactory


@pytest.fixture(params=["telegram", "slack", "discord", "web"])
async def platform(
    request: pytest.FixtureRequest, make_bot: BotFactory, tmp_path: Path
) -> AsyncIterator[Platform]:
    only = request.node.get_closest_marker("platforms")
    if only is not None and request.param not in only.args:
        pytest.skip(f"not on {request.param}: {only.kwargs['why']}")
    factories = {
        "telegram": telegram_platform,
        "slack": slack_platform,
        "discord": discord_platform,
        "web": functools.partial(web_platform, data_dir=tmp_path),
    }
    marked = request.node.get_closest_marker("bot")
    factory = functools.partial(make_bot, **marked.kwargs) if marked else make_bot
    channel = request.node.get_closest_marker("channel")
    settings = channel.kwargs if channel and request.param != "web" else {}
    async with factories[request.param](factory, **settings) as running:
        yield running
