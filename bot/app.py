"""Wiring: builds every long-lived part from the config, runs the channels, shuts down in order.

Start and stop are pairs, in reverse order of each other:
  model client → (checks) → store → runner, dispatcher → channels
  channels stop reading → every live turn is stopped and stores its partial state → store closes
  → model client closes.
Platform libraries are imported only when their channel is configured, so a terminal-only start
stays fast.
"""

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TextIO

from bot.checks import find_problems
from bot.config import Config
from bot.logs import setup_logging
from channels.terminal import TerminalChannel, TerminalSettings, stdin_lines
from core.channel import Channel
from core.dispatcher import AccessRules, Dispatcher
from core.model import ModelClient
from core.store import Store
from core.tools import ToolRegistry, builtin_tools
from core.turns import AgentProfile, TurnRunner, TurnSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TerminalIO:
    """Where the terminal channel reads and writes; stdin/stdout unless a test says otherwise."""

    lines: AsyncIterator[str] | None = None
    output: TextIO | None = None


def turn_settings(config: Config) -> TurnSettings:
    """The assistant's agent profile with its tools; an unknown tool name fails here."""
    registry = ToolRegistry(builtin_tools(config.assistant.timezone))
    name = config.assistant.agent
    agent = config.agents[name]
    profile = AgentProfile(
        name=name,
        model=agent.model,
        system_prompt=agent.system_prompt,
        tools=registry.select(agent.tools, config_key=f"agents.{name}.tools"),
        think=agent.think,
        max_iterations=agent.max_iterations,
    )
    for other, spec in config.agents.items():
        registry.select(spec.tools, config_key=f"agents.{other}.tools")
    return TurnSettings(
        agent=profile,
        tool_timeout=config.limits.tool_timeout,
        max_cached_conversations=config.limits.max_cached_conversations,
    )


async def check(config: Config, output: TextIO = sys.stdout) -> int:
    """`kaiwa check`: print every problem with its fix; non-zero exit if there is any."""
    turn_settings(config)
    model = ModelClient(config.ollama)
    try:
        problems = await find_problems(config, model)
    finally:
        await model.close()
    for problem in problems:
        output.write(f"problem: {problem}\n")
    if not problems:
        models = ", ".join(sorted({agent.model for agent in config.agents.values()}))
        output.write(f"ok: Ollama at {config.ollama.url} is reachable and has {models}\n")
    return 1 if problems else 0


async def run(config: Config, stop_requested: asyncio.Event, terminal: TerminalIO) -> int:
    """`kaiwa run`: check, start the channels, serve until input ends or a stop is requested."""
    setup_logging(config.logging, config.data_dir, config.secrets())
    settings = turn_settings(config)
    model = ModelClient(config.ollama)
    try:
        problems = await find_problems(config, model)
        if problems:
            for problem in problems:
                logger.error("cannot start: %s", problem)
            sys.stderr.write("".join(f"kaiwa: cannot start: {p}\n" for p in problems))
            return 1
        store = Store(config.database_url())
        interrupted = store.close_interrupted_turns()
        if interrupted:
            logger.warning(
                "marked %d turns left running by an earlier process interrupted", interrupted
            )
        try:
            await _serve(config, store, model, settings, stop_requested, terminal)
        finally:
            store.close()
    finally:
        await model.close()
    return 0


async def _serve(
    config: Config,
    store: Store,
    model: ModelClient,
    settings: TurnSettings,
    stop_requested: asyncio.Event,
    terminal: TerminalIO,
) -> None:
    channels = _channels(config, terminal)
    runner = TurnRunner(store, model, {c.platform: c for c in channels}, settings)
    access = AccessRules({"terminal": None})
    dispatcher = Dispatcher(
        store,
        runner,
        {c.platform: c for c in channels},
        access,
        max_message_chars=config.limits.max_message_chars,
    )
    readers = [
        asyncio.create_task(channel.run(dispatcher.handle), name=f"channel {channel.platform}")
        for channel in channels
    ]
    stop_wait = asyncio.create_task(stop_requested.wait(), name="stop requested")
    for channel in channels:
        if isinstance(channel, TerminalChannel):
            channel.say(
                f"Kaiwa is ready: {settings.agent.name} on {settings.agent.model}. "
                "Type a message; /help lists commands; Ctrl-D quits."
            )
    try:
        done, _ = await asyncio.wait([*readers, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stop_wait}:
            if task.exception() is not None:
                logger.error("channel %s failed", task.get_name(), exc_info=task.exception())
    finally:
        for channel in channels:
            await channel.stop()
        for task in [*readers, stop_wait]:
            task.cancel()
        await asyncio.gather(*readers, stop_wait, return_exceptions=True)
        await runner.shutdown()


def _channels(config: Config, terminal: TerminalIO) -> list[Channel]:
    channels: list[Channel] = []
    settings = config.channels.terminal
    if settings.enabled:
        channels.append(
            TerminalChannel(
                terminal.lines or stdin_lines(),
                terminal.output or sys.stdout,
                TerminalSettings(
                    session=settings.session,
                    show_thinking=settings.show_thinking,
                    show_tools=settings.show_tools,
                ),
            )
        )
    return channels
