"""discord.py's client as Kaiwa runs it: its gateway events, and the buttons it routes clicks of.

The client is discord.py's `Client` with its event handlers (`on_message`, `on_ready`, ...) and
nothing else: what an event means is the channel's (`Listener`), so this module knows only what
discord.py asks of a subclass. `new_client` sets what a client is built with: the intents Kaiwa
needs (Message Content among them: without it, messages arrive blank), mentions in the bot's text
that never ping anyone (`AllowedMentions.none`), the longest rate limit discord.py waits out
by itself, and a trace of its HTTP calls that counts every 429 for the operators.

An event discord.py cannot parse (a server's MESSAGE_CREATE without `author`, say) raises inside
its gateway loop and would end it: every parser of the client's connection state is wrapped
(`DiscordClient._get_state`) so such an event is reported to the channel, which logs it in one
line with its name and id, at most one such line every few seconds, and skips it.

`connected` follows READY/RESUMED and disconnects.
"""

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from channels.discord.library import discord
from channels.presses import PAYLOAD_PREFIX, pressed_command
from core.metrics import PLATFORM_RATE_LIMITS

logger = logging.getLogger(__name__)

LONGEST_LIBRARY_WAIT = 30.0  # seconds; a longer rate limit raises instead (discord.py's minimum)
INTENT_FIX = (
    "turn on the Message Content intent: Discord Developer Portal → your application → Bot → "
    "Privileged Gateway Intents → Message Content Intent"
)


class Listener(Protocol):
    """What the client reports its events to: the channel."""

    connected: asyncio.Event

    def now_connected(self) -> None: ...

    def unreadable_event(self, event: str, data: Any, exc: Exception) -> None:
        """A gateway event discord.py could not parse."""
        ...

    async def received(self, message: discord.Message) -> None:
        """A MESSAGE_CREATE."""
        ...

    async def clicked(self, interaction: discord.Interaction, command: str) -> None:
        """A click on a button that is `command`."""
        ...


class CommandButton(
    discord.ui.DynamicItem[discord.ui.Button], template=re.escape(PAYLOAD_PREFIX) + r"(?s:.+)"
):
    """A button that is a command (`channels.presses`): a Stop button, an agent's Stop. A
    dynamic item: discord.py routes a click on any message carrying one here, across restarts,
    without keeping a view per message."""

    def __init__(self, label: str, custom_id: str) -> None:
        super().__init__(
            discord.ui.Button(label=label, style=discord.ButtonStyle.secondary, custom_id=custom_id)
        )

    @classmethod
    async def from_custom_id(
        cls,
        interaction: discord.Interaction,
        item: discord.ui.Item,
        match: re.Match[str],
    ) -> "CommandButton":
        return cls(str(getattr(item, "label", "") or ""), match.string)

    async def callback(self, interaction: discord.Interaction) -> None:
        client, command = interaction.client, pressed_command(self.custom_id)
        if isinstance(client, DiscordClient) and command is not None:
            await client.channel.clicked(interaction, command)


class DiscordClient(discord.Client):
    """discord.py's client, with the gateway events Kaiwa listens to."""

    def __init__(self, channel: Listener, **options: Any) -> None:
        self.channel = channel  # before the library's constructor, which calls `_get_state`
        super().__init__(**options)

    def _get_state(self, **options: Any) -> Any:
        """The library's connection state, every gateway event parser contained: one that raises
        is reported to the channel instead of ending the gateway task. (`_get_state` and the
        state's `parsers` are the library's only seam for this.)"""
        state = super()._get_state(**options)
        for event, parse in list(state.parsers.items()):
            state.parsers[event] = _contained(event, parse, self.channel.unreadable_event)
        return state

    async def setup_hook(self) -> None:
        self.add_dynamic_items(CommandButton)

    async def on_message(self, message: discord.Message) -> None:
        await self.channel.received(message)

    async def on_ready(self) -> None:
        self.channel.now_connected()
        logger.info(
            "Discord: connected as %s (%s) in %d servers", self.user, self.user.id, len(self.guilds)
        )

    async def on_resumed(self) -> None:
        self.channel.now_connected()
        logger.info("Discord: gateway session resumed")

    async def on_disconnect(self) -> None:
        self.channel.connected.clear()


def new_client(channel: Listener, guild_ready_timeout: float) -> DiscordClient:
    """A client reporting to `channel`, built as Kaiwa needs it (see the module docstring)."""
    intents = discord.Intents.none()
    intents.guilds = intents.guild_messages = intents.dm_messages = True
    intents.message_content = True
    return DiscordClient(
        channel,
        intents=intents,
        allowed_mentions=discord.AllowedMentions.none(),
        max_ratelimit_timeout=LONGEST_LIBRARY_WAIT,
        guild_ready_timeout=guild_ready_timeout,
        http_trace=_rate_limits_counted(),
    )


def _rate_limits_counted() -> aiohttp.TraceConfig:
    """Every 429 Discord answers, counted for the operators (`core.metrics`): discord.py waits
    most of them out itself, so no error of Kaiwa's ever shows them."""

    async def answered(_: object, __: object, request: aiohttp.TraceRequestEndParams) -> None:
        if request.response.status == 429:
            PLATFORM_RATE_LIMITS.labels("discord").inc()

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(answered)
    return trace


def _contained(
    event: str,
    parse: Callable[[Any], None],
    report: Callable[[str, Any, Exception], None],
) -> Callable[[Any], None]:
    def parse_or_report(data: Any) -> None:
        try:
            parse(data)
        except Exception as exc:
            report(event, data, exc)

    return parse_or_report
