"""Start-up checks shared by `kaiwa check` and `kaiwa run`: each problem comes with its fix.

No channel to serve is a configuration error of its own (`NothingToServe`), with its own exit
status: a service manager that restarts Kaiwa with the same environment cannot change it, and
`kaiwa check` reports it too, so that it can stand in front of the workers (deploy/).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.config import Config
from core.agent.model import ModelClient, model_is_available
from core.errors import ConfigError, ModelError


class NothingToServe(ConfigError):
    """No channel would start: no platform has its token, and the terminal is off."""


class Checkable(Protocol):
    async def problems(self) -> list[str]: ...


async def find_problems(
    config: Config, model: ModelClient, channels: Sequence[Checkable] = ()
) -> tuple[list[str], list[str]]:
    """Every problem that would stop Kaiwa from working, each with its fix; and those of
    sub-agent routing, which only turn routing off."""
    models = await check_models(config, model)
    problems = timezone_problems(config) + models.problems
    for channel in channels:
        problems += await channel.problems()
    return problems, models.routing


@dataclass(frozen=True)
class Models:
    """What Ollama says of the models the config names."""

    reachable: bool
    found: list[str]
    problems: list[str]
    routing: list[str] = field(default_factory=list)
    """What keeps `[subagents.routing]` from working: `kaiwa check` fails on it, but `kaiwa
    run` starts with routing off (each sub-agent on its profile's model)."""


def nothing_to_serve(config: Config) -> str:
    """Why no channel would start, naming each variable whose token would start one."""
    channels = config.channels
    tokens = [
        (channels.telegram.enabled, channels.telegram.token_env, "telegram].token_env"),
        (channels.slack.enabled, channels.slack.bot_token_env, "slack].bot_token_env"),
        (channels.discord.enabled, channels.discord.token_env, "discord].token_env"),
    ]
    missing = [f"${name} ([channels.{key})" for enabled, name, key in tokens if enabled]
    terminal = "" if config.cluster.enabled else "; or keep [channels.terminal].enabled = true"
    if not missing:
        return f"no channel to serve: every platform is off (enabled = false){terminal}"
    return f"no channel to serve: set a platform's token variable: {', '.join(missing)}{terminal}"


async def check_models(config: Config, model: ModelClient) -> Models:
    """Whether Ollama answers, and which of the agents' and the critic's models it has."""
    try:
        available = await model.list_models()
    except ModelError as exc:
        return Models(reachable=False, found=[], problems=[str(exc)])
    critic = config.workflows.plan.critic_model
    wanted = sorted({agent.model for agent in config.agents.values()} | ({critic} - {""}))
    found = [name for name in wanted if model_is_available(name, available)]
    missing = [name for name in wanted if name not in found]
    problems = [f"model {name} not found: run `ollama pull {name}`" for name in missing]
    routing = config.subagents.routing.problems(available)
    return Models(reachable=True, found=found, problems=problems, routing=routing)


def timezone_problems(config: Config) -> list[str]:
    zone = config.assistant.timezone
    if not zone:
        return []
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return [f"'assistant.timezone' is {zone!r}, not an IANA time zone such as 'Europe/Paris'"]
    return []
