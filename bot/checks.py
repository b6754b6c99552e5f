"""Start-up checks shared by `kaiwa check` and `kaiwa run`: each problem comes with its fix."""

from collections.abc import Sequence
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.config import Config
from core.agent.model import ModelClient, model_is_available
from core.errors import ModelError


class Checkable(Protocol):
    async def problems(self) -> list[str]: ...


async def find_problems(
    config: Config, model: ModelClient, channels: Sequence[Checkable] = ()
) -> list[str]:
    """Every problem that would stop Kaiwa from working, each with its fix."""
    problems = _timezone_problems(config) + await _model_problems(config, model)
    for channel in channels:
        problems += await channel.problems()
    return problems


async def _model_problems(config: Config, model: ModelClient) -> list[str]:
    try:
        available = await model.list_models()
    except ModelError as exc:
        return [str(exc)]
    critic = config.workflows.plan.critic_model
    wanted = sorted({agent.model for agent in config.agents.values()} | ({critic} - {""}))
    return [
        f"model {name} not found: run `ollama pull {name}`"
        for name in wanted
        if not model_is_available(name, available)
    ]


def _timezone_problems(config: Config) -> list[str]:
    zone = config.assistant.timezone
    if not zone:
        return []
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return [f"'assistant.timezone' is {zone!r}, not an IANA time zone such as 'Europe/Paris'"]
    return []
