"""`kaiwa check` and `kaiwa status`: what an operator asks of Kaiwa without running it.

`check` tries everything a start needs (the database, Ollama and its models, each channel's
token, the MCP servers) and prints what is fine, then every problem with its fix: a problem in
one part hides nothing of the others. `status` reads the store (and,
with several workers, who is alive and who holds each platform's connection) without starting a
channel or asking Ollama, then asks the running worker for its live figures (`bot.figures`).
"""

import sys
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from bot.adapters import Adapter, TerminalIO, configured, no_lines
from bot.checks import Models, check_models, nothing_to_serve, timezone_problems
from bot.config import Config
from bot.figures import live_figures
from bot.wiring import access_rules, assemble, features, turn_settings
from core.agent.context import SCHEMA_SHARE_WARNING, SchemaShare, schema_share
from core.agent.model import ModelClient
from core.errors import ModelError, StoreError
from core.features.attachments.transcription import ServerCheck, Transcriber
from core.features.mcp.servers import McpServers
from core.features.schedule.timing import describe_tasks
from core.store import Store
from core.turns.parts import OpenTurn
from core.turns.turn import TurnRequest


async def check(config: Config, output: TextIO = sys.stdout) -> int:
    """`kaiwa check`: print what is fine, then every problem with its fix; non-zero exit if
    there is any. A warning (tools whose schemas crowd a small window) is printed among what is
    fine, and fails nothing."""
    turn_settings(config)
    model = ModelClient(config.ollama)
    opened = configured(config, TerminalIO(lines=no_lines()))
    servers = McpServers(config.mcp, once=True)  # a restart's backoff would only slow it
    await servers.start()
    store, problems = await _opened_store(config)
    try:
        models = await check_models(config, model)
        ready, unready = await _channels(config, opened)
        problems += timezone_problems(config) + models.problems + models.routing + unready
        problems += servers.problems()
        fine = [*_ollama_line(config, models), *ready]
        windows = await agent_windows(config, model, models.found)
        fine += [f"context window: {window.line}" for window in windows]
        if store is not None:
            crowded = await _crowded_windows(config, store, servers, model, windows)
            fine += [f"warning: {line}" for line in crowded]
            fine.append(f"tasks: {await _tasks_line(config, store)}")
        heard = await _transcription(config)
        fine, problems = fine + heard.fine, problems + heard.problems
        fine += [f"mcp: {line}" for line in servers.describe()]
    finally:
        await servers.close()
        await model.close()
        for adapter in opened:
            await adapter.close()
        if store is not None:
            await store.close()
    output.writelines(f"{line}\n" for line in fine)
    output.writelines(f"problem: {problem}\n" for problem in problems)
    return 1 if problems else 0


def _ollama_line(config: Config, models: Models) -> list[str]:
    if models.found:
        has = ", ".join(models.found)
        return [f"ok: Ollama at {config.ollama.url} is reachable and has {has}"]
    return [f"ok: Ollama at {config.ollama.url} is reachable"] if models.reachable else []


async def _channels(config: Config, opened: list[Adapter]) -> tuple[list[str], list[str]]:
    """The line naming the channels that would start, and the problems of the others."""
    if not opened:
        return [], [nothing_to_serve(config)]
    ready, problems = [], []
    for adapter in opened:
        found = await adapter.problems()
        problems += found
        if not found:
            ready.append(adapter.platform)
    return ([f"ok: channels ready: {', '.join(ready)}"] if ready else []), problems


async def _transcription(config: Config) -> ServerCheck:
    """Whether the speech-to-text server answers and has its model (voice notes off: one line)."""
    transcriber = Transcriber(config.transcription)
    try:
        return await transcriber.check()
    finally:
        await transcriber.aclose()


async def _opened_store(config: Config) -> tuple[Store | None, list[str]]:
    """The store, opened and taking a write as a start needs it; otherwise why not."""
    try:
        store = await Store.open(config.database_url(), config.storage.store_settings())
    except StoreError as exc:
        return None, [str(exc)]
    try:
        await store.ping()
    except StoreError as exc:
        await store.close()
        return None, [f"the database does not take a write: {exc}"]
    return store, []


async def _crowded_windows(
    config: Config,
    store: Store,
    servers: McpServers,
    model: ModelClient,
    windows: list["AgentWindow"],
) -> list[str]:
    """For each agent whose offered tools' schemas take more than `SCHEMA_SHARE_WARNING` of
    its window: how much, and the fewest tools without which they would not."""
    settings = turn_settings(config, store)
    kaiwa = assemble(
        store,
        model,
        {},
        settings,
        access_rules(config),
        features(config, servers),
        max_message_chars=config.limits.max_message_chars,
    )
    lines = []
    for window in windows:
        agent = settings.agents.get(window.agent) or settings.agent
        turn = OpenTurn(TurnRequest("check", f"check:{window.agent}", ""), agent)
        offered = kaiwa.runner.parts.offered(agent, kaiwa.runner.parts.join(turn))
        share = schema_share(offered.values(), window.tokens)
        if share.share > SCHEMA_SHARE_WARNING:
            lines.append(_crowded(window.agent, share))
    return lines


def _crowded(agent: str, share: SchemaShare) -> str:
    largest = ", ".join(f"{name} ({tokens:,})" for name, tokens in share.by_tool[:5])
    return (
        f"{agent}: its tools' schemas take about {share.tokens:,} tokens, {share.share:.0%} of "
        f"its {share.window:,}-token window, before any message; offer fewer (without "
        f"{', '.join(share.to_drop())} they would fit in a quarter: [agents.{agent}].tools, "
        f"[schedule], [memory], delegates_to) or raise [agents.{agent}].context_window. "
        f"Largest: {largest}"
    )


async def _tasks_line(config: Config, store: Store) -> str:
    if not config.schedule.enabled:
        return "off ([schedule].enabled = false)"
    return describe_tasks(await store.tasks())


@dataclass(frozen=True)
class AgentWindow:
    agent: str
    tokens: int
    line: str
    """The window and where it comes from, in words."""


async def agent_windows(
    config: Config, model: ModelClient, available: Collection[str]
) -> list[AgentWindow]:
    """The context window of each agent whose model is `available`, and where it comes from."""
    windows = []
    for name, agent in config.agents.items():
        if agent.model not in available:
            continue
        if agent.context_window:
            line = f"{name}: {agent.context_window:,} tokens (agents.{name}.context_window)"
            windows.append(AgentWindow(name, agent.context_window, line))
            continue
        try:
            length = await model.context_length(agent.model)
        except ModelError as exc:
            length, why = None, f"the model's own length is unknown: {exc}"
        else:
            why = f"{agent.model} takes up to {length:,}" if length else "the model does not say"
        ceiling = config.context.max_window
        window = config.context.window(0, length)
        line = f"{name}: {window:,} tokens ({why}; context.max_window is {ceiling:,})"
        windows.append(AgentWindow(name, window, line))
    return windows


async def status(config: Config, output: TextIO = sys.stdout) -> int:
    """`kaiwa status`: what the store says, without starting a channel or asking Ollama, and
    what the running worker's metrics say."""
    store = await Store.open(config.database_url(), config.storage.store_settings())
    try:
        midnight = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        summary = await store.summary(since=midnight)
        output.write(f"store: {await store.describe()}\n")
    finally:
        await store.close()
    turns = summary.turns
    counted = sum(turns.values())
    outcomes = ", ".join(f"{turns[o]} {o}" for o in sorted(turns)) if turns else "none"
    output.write(
        f"conversations: {summary.conversations}\n"
        f"turns today: {counted} ({outcomes})\n"
        f"tokens today: {summary.prompt_tokens:,} in, {summary.output_tokens:,} out\n"
    )
    if config.cluster.enabled:
        await _cluster_status(config, output)
    if summary.failures:
        output.write("last errors:\n")
    for turn in summary.failures:
        when = turn.started_at.astimezone().strftime("%Y-%m-%d %H:%M")
        place = summary.places.get(turn.conversation_id, "?")
        output.write(f"  {when} {place}: {turn.error or 'failed'}\n")
    output.writelines(f"{line}\n" for line in await live_figures(config.metrics))
    return 0


async def _cluster_status(config: Config, output: TextIO) -> None:
    platforms = ("telegram", "slack", "discord")
    from core.cluster.leases import cluster_view  # PostgreSQL's client, for a cluster only

    workers, holders = await cluster_view(
        config.database_url(), config.cluster, [f"channel:{p}" for p in platforms]
    )
    output.write(f"workers: {', '.join(workers) or 'none running'}\n")
    for platform in platforms:
        if f"channel:{platform}" in holders:
            output.write(f"  {platform} connection: held by {holders[f'channel:{platform}']}\n")


def web_link(config: Config) -> str:
    """`kaiwa web-link`: a fresh one-time link that signs the operator in to the web chat a
    running Kaiwa serves with this config (the same data folder's link file)."""
    from channels.web.channel import link_for

    return link_for(config.channels.web, config.data_dir)
