"""Start-up checks shared by `kaiwa check` and `kaiwa run`: each problem comes with its fix."""

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.config import Config
from core.errors import ModelError
from core.model import ModelClient, model_is_available


async def find_problems(config: Config, model: ModelClient) -> list[str]:
    problems = _timezone_problems(config)
    try:
        available = await model.list_models()
    except ModelError as exc:
        return [*problems, str(exc)]
    wanted = sorted({agent.model for agent in config.agents.values()})
    problems += [
        f"model {name} not found: run `ollama pull {name}`"
        for name in wanted
        if not model_is_available(name, available)
    ]
    return problems


def _timezone_problems(config: Config) -> list[str]:
    zone = config.assistant.timezone
    if not zone:
        return []
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return [f"'assistant.timezone' is {zone!r}, not an IANA time zone such as 'Europe/Paris'"]
    return []
