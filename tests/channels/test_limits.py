"""Each remote platform's replies against a fake that keeps the platform's published limits.

The fakes answer calls past a platform's limits as the platform does (``limits=True``: a 429
and a wait, tests/fakes/rate_limits.py); here Kaiwa runs with its shipped pacing (`paced`, the
shipped `post_grace`) through the real adapter and client library, and a burst of chats, each
with a reply streamed over several frames, must come through whole, once each, with next to no
429s: Kaiwa's own numbers (`channels.budget`) are meant to fit inside the platform's.

The bot is open to anyone (a burst is many people), so the harness's factories are called here
rather than through the `platform` fixture, whose bots answer two people; its `edit_interval`
stays the harness's fast one, so every reply offers the budget as many partial edits as it can
take. The web chat is left out: its platform is this process's own board, with no limits.

Run first, these cases found three ways Kaiwa's budget did not fit (issue 36), each now a test
of its own in tests/channels/test_budget.py: calls granted together reached Telegram up to
190 ms apart, so a slow one landed inside the next second's window (a call now counts from its
answer); partial edits spent Slack's minute of chat.update before the last replies' final texts
(a live reply now keeps room for its final text in the shared windows); and discord.py's own
calls at start-up met Discord's global limit beside a burst (replies now keep to 40 of the 50).
"""

import functools
from collections.abc import AsyncIterator

import pytest

from channels.settings import PlatformSettings
from core.dispatch.dispatcher import Allowed
from tests.channels.platforms import (
    DiscordPlatform,
    SlackPlatform,
    TelegramPlatform,
    discord_platform,
    slack_platform,
    telegram_platform,
)
from tests.fakes.ollama import ChunkDelay, Text
from tests.harness import BotFactory

CROWD = 40
"""Chats that each send one message at once."""
FIRST_CHAT = 2001
MOST_REFUSED = 0.01
"""The share of the platform calls that may be answered 429."""
ANYONE = Allowed(users=None)
SHIPPED = PlatformSettings()

Limited = TelegramPlatform | SlackPlatform | DiscordPlatform


@pytest.fixture(params=["telegram", "slack", "discord"])
async def limited(request: pytest.FixtureRequest, make_bot: BotFactory) -> AsyncIterator[Limited]:
    """The platform on a fake keeping its limits, Kaiwa pacing itself as shipped."""
    shipped = {"limits": True, "post_grace": SHIPPED.post_grace}
    if request.param == "discord":
        running = discord_platform(make_bot, access=ANYONE, **shipped)
    else:
        factory = telegram_platform if request.param == "telegram" else slack_platform
        running = factory(functools.partial(make_bot, access=ANYONE), **shipped)
    async with running as platform:
        yield platform


def answer(chat: int) -> str:
    return f"Chat {chat} gets its own answer, streamed word by word over several frames."


@pytest.mark.model_slots(CROWD)
async def test_a_burst_of_chats_is_answered_whole_within_the_platforms_limits(
    limited: Limited,
) -> None:
    """Guards issue 36: the fakes never refused a call, so nothing showed whether a burst of
    replies keeps within the platform's real limits or runs into its 429s."""
    chats = range(FIRST_CHAT, FIRST_CHAT + CROWD)
    for chat in chats:
        limited.bot.ollama.script_for(f"<{chat}>", ChunkDelay(0.05), Text(answer(chat), chunks=8))

    for chat in chats:
        limited.say(chat, f"question <{chat}>")
    await limited.wait_until(
        lambda: all(limited.shown(chat) == [answer(chat)] for chat in chats), "every reply whole"
    )

    assert all(limited.shown(chat) == [answer(chat)] for chat in chats), "each once, whole"
    refusals = limited.fake.refused_429
    calls = len(refusals) + len(limited.fake.rate_limits.admitted)
    full = sorted({refusal.window.key for refusal in refusals})
    assert len(refusals) <= MOST_REFUSED * calls, f"{len(refusals)} of {calls} calls: 429 ({full})"
