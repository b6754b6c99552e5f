"""The channels a config asks for: each platform whose secret is set, the terminal, and the web
chat when it is on.

A platform without its token is not started, and its library is not even imported (a
terminal-only start stays fast). The terminal is a chat (line editing, history, Markdown) when
a person sits at it, and plain lines for a pipe, a file or a test.
"""

import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, TextIO

from bot.config import Config
from channels.settings import DiscordSettings, SlackSettings
from channels.terminal import TerminalChannel, stdin_lines
from core.channel import Channel
from core.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TerminalIO:
    """Where the terminal channel reads and writes; stdin/stdout unless a test says otherwise."""

    lines: AsyncIterator[str] | None = None
    output: TextIO | None = None


class Adapter(Channel, Protocol):
    """A channel as the composition root sees it: it can also say what stops it from working."""

    async def problems(self) -> list[str]: ...


def configured(config: Config, terminal: TerminalIO) -> list[Adapter]:
    """The configured channels. A platform without its token is not started (and its library
    is not even imported)."""
    adapters: list[Adapter] = []
    if config.channels.terminal.enabled and config.cluster.enabled:
        logger.info("the terminal channel is off: a worker of a cluster is a service")
    elif config.channels.terminal.enabled:
        adapters.append(_terminal(config, terminal))
    telegram = config.channels.telegram
    token = os.environ.get(telegram.token_env)
    if telegram.enabled and token:
        from channels.telegram.channel import TelegramChannel

        if not telegram.anyone and not telegram.allowed_users:
            logger.warning(
                "Telegram is on but nobody may use it: set [channels.telegram].allowed_users "
                "(user ids) or anyone = true"
            )
        if telegram.mode == "webhook" and not os.environ.get(telegram.webhook_secret_env):
            raise ConfigError(
                f"Telegram webhooks need a secret token: set ${telegram.webhook_secret_env} "
                "(any 1-256 letters, digits, _ or -); Telegram sends it with every update"
            )
        adapters.append(TelegramChannel(telegram, token))
    slack = config.channels.slack
    if slack.enabled and os.environ.get(slack.bot_token_env):
        adapters.append(_slack(slack))
    discord = config.channels.discord
    if discord.enabled and os.environ.get(discord.token_env):
        adapters.append(_discord(discord))
    if config.channels.web.enabled:
        from channels.web.channel import WebChannel

        adapters.append(WebChannel(config.channels.web, config.data_dir))
    return adapters


def _terminal(config: Config, terminal: TerminalIO) -> TerminalChannel:
    """A chat (line editing, history, Markdown) when a person sits at a terminal; plain lines
    for a pipe or a file, and when a test hands the lines over."""
    settings = config.channels.terminal
    if terminal.lines is None and sys.stdin.isatty() and sys.stdout.isatty():
        from channels.chat_console import ChatConsole

        console = ChatConsole(settings, history=config.data_dir / "terminal_history")
        return TerminalChannel(console, settings)
    lines = terminal.lines or stdin_lines()
    return TerminalChannel.plain(lines, terminal.output or sys.stdout, settings)


def _slack(settings: SlackSettings) -> Adapter:
    from channels.slack.channel import SlackChannel, SlackTokens

    if not settings.anyone and not settings.allowed_users:
        logger.warning(
            "Slack is on but nobody may use it: set [channels.slack].allowed_users (member "
            "ids such as U0123ABCD) or anyone = true"
        )
    tokens = SlackTokens(
        bot=os.environ[settings.bot_token_env],
        app=os.environ.get(settings.app_token_env, ""),
        signing_secret=os.environ.get(settings.signing_secret_env, ""),
    )
    return SlackChannel(settings, tokens)


def _discord(settings: DiscordSettings) -> Adapter:
    from channels.discord.channel import DiscordChannel

    if not (settings.anyone or settings.allowed_users or settings.allowed_roles):
        logger.warning(
            "Discord is on but nobody may use it: set [channels.discord].allowed_users or "
            "allowed_roles (ids; Developer Mode → Copy ID), or anyone = true"
        )
    return DiscordChannel(settings, os.environ[settings.token_env])


async def no_lines() -> AsyncIterator[str]:
    """`kaiwa check` reads nothing."""
    return
    yield
