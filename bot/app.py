"""Wiring: builds every long-lived part from the config, runs the channels, shuts down in order.

Start and stop are pairs, in reverse order of each other:
  model client → (checks) → store (what an earlier process left is read) → runner, dispatcher
  → channels (each supervised: restarted when it fails) → recovery of the leftovers → the
  scheduler (once the channels are up)
  channels stop reading → the scheduler fires no more → every live turn is stopped and stores
  its partial state (a firing's too) → store closes (its queued writes first) → model client
  closes.
Platform libraries are imported only when their channel is configured, so a terminal-only start
stays fast.
"""

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TextIO

from bot import kaiwa_version
from bot.checks import find_problems
from bot.config import Config
from bot.logs import PRINTED, setup_logging
from bot.supervision import Leased, Supervised
from channels.places import space_of
from channels.settings import DiscordSettings, SlackSettings
from channels.terminal import TerminalChannel, stdin_lines
from core.agent.model import ModelClient
from core.agent.tools import ToolRegistry, builtin_tools
from core.channel import Channel, Deliver
from core.cluster.leases import Coordinator, cluster_view, worker_name
from core.cluster.owners import Owners
from core.dispatch.dispatcher import AccessRules, Allowed, Dispatcher
from core.dispatch.recovery import Leftovers, Recovery, leftovers
from core.errors import ConfigError, ModelError, StoreError
from core.features.approvals.questions import Approvals
from core.features.archive import archive_tools
from core.features.fetch import fetch_tool
from core.features.mcp import McpServers
from core.features.memory import MEMORY_TOOLS, Memory, memory_tools
from core.features.schedule.scheduler import TASK_TOOLS, Scheduler, describe_tasks, task_tools
from core.store import Store
from core.store.tables import utc_now
from core.text import plural
from core.turns.runner import AgentProfile, TurnRunner, TurnSettings
from workflows.plan import PlanWorkflow

logger = logging.getLogger(__name__)

CHANNEL_STOP_SECONDS = 10.0
CONNECT_ANNOUNCE_SECONDS = 15.0


@dataclass(frozen=True)
class TerminalIO:
    """Where the terminal channel reads and writes; stdin/stdout unless a test says otherwise."""

    lines: AsyncIterator[str] | None = None
    output: TextIO | None = None


TURN_ITERATIONS, RUN_ITERATIONS = 10, 30
"""Model calls an agent gets when its max_iterations is 0: in a conversation's turn, in a run."""


def turn_settings(config: Config, store: Store | None = None) -> TurnSettings:
    """Every agent's profile with its tools (an unknown tool name fails here), the default one,
    and the agent each channel gives a new conversation. `store`: the one the tools that read
    conversations use (None to check the config only)."""

    def opened() -> Store:
        if store is None:
            raise RuntimeError("the store is not open")  # only a config check builds these
        return store

    registry = ToolRegistry(
        [
            *builtin_tools(config.assistant.timezone),
            fetch_tool(config.fetch),
            *archive_tools(opened, space_of),
        ]
    )
    servers = {*config.mcp, *(each.prefix for each in config.mcp.values() if each.prefix)}
    known = {*registry.names(), *MEMORY_TOOLS, *TASK_TOOLS, *servers}
    for name in config.approvals.ask:
        if name not in known and name.partition(".")[0] not in servers:
            raise ConfigError(
                f"approvals.ask: unknown tool '{name}'; valid tools: {', '.join(sorted(known))}"
            )

    def served(name: str) -> bool:
        return name in servers or name.partition(".")[0] in servers

    for name in config.workflows.plan.critic_tools:
        if name not in registry.names():
            raise ConfigError(
                f"workflows.plan.critic_tools: unknown tool '{name}'; valid tools: "
                f"{', '.join(sorted(registry.names()))}"
            )

    profiles = {
        name: AgentProfile(
            name=name,
            model=agent.model,
            system_prompt=agent.system_prompt,
            tools=registry.select(
                [each for each in agent.tools if not served(each)],
                config_key=f"agents.{name}.tools",
            ),
            mcp=tuple(each for each in agent.tools if served(each)),
            think=agent.think,
            max_iterations=agent.max_iterations or TURN_ITERATIONS,
            run_iterations=agent.max_iterations or RUN_ITERATIONS,
            images=agent.images,
            context_window=agent.context_window,
            description=agent.description,
            delegates_to=tuple(agent.delegates_to),
        )
        for name, agent in config.agents.items()
    }
    channel_agents = {
        platform: settings.agent
        for platform, settings in vars(config.channels).items()
        if settings.agent
    }
    return TurnSettings(
        agent=profiles[config.assistant.agent],
        agents=profiles,
        channel_agents=channel_agents,
        tool_timeout=config.limits.tool_timeout,
        tool_grace=config.limits.tool_grace,
        max_cached_conversations=config.limits.max_cached_conversations,
        context=config.context,
        subagents=config.subagents,
    )


class Adapter(Channel, Protocol):
    """A channel as the composition root sees it: it can also say what stops it from working."""

    async def problems(self) -> list[str]: ...


async def check(config: Config, output: TextIO = sys.stdout) -> int:
    """`kaiwa check`: print every problem with its fix; non-zero exit if there is any."""
    turn_settings(config)
    model = ModelClient(config.ollama)
    adapters = _adapters(config, TerminalIO(lines=_no_lines()))
    try:
        problems = await find_problems(config, model, adapters)
        windows = [] if problems else await context_windows(config, model)
    finally:
        await model.close()
        for adapter in adapters:
            await adapter.close()
    for problem in problems:
        output.write(f"problem: {problem}\n")
    if not problems:
        models = ", ".join(sorted({agent.model for agent in config.agents.values()}))
        names = ", ".join(adapter.platform for adapter in adapters)
        output.write(f"ok: Ollama at {config.ollama.url} is reachable and has {models}\n")
        output.write(f"ok: channels ready: {names or 'none'}\n")
        output.writelines(f"context window: {line}\n" for line in windows)
        output.write(f"tasks: {await _tasks_line(config)}\n")
        output.writelines(f"mcp: {line}\n" for line in await _mcp_lines(config))
    return 1 if problems else 0


async def _mcp_lines(config: Config) -> list[str]:
    """Each MCP server with its tools, or why it does not start."""
    servers = McpServers(config.mcp)
    await servers.start()
    try:
        return servers.describe()
    finally:
        await servers.close()


async def _tasks_line(config: Config) -> str:
    if not config.schedule.enabled:
        return "off ([schedule].enabled = false)"
    store = await Store.open(config.database_url(), config.storage.store_settings())
    try:
        return describe_tasks(await store.tasks())
    finally:
        await store.close()


async def context_windows(config: Config, model: ModelClient) -> list[str]:
    """Each agent's context window, and where it comes from."""
    lines = []
    for name, agent in config.agents.items():
        if agent.context_window:
            lines.append(f"{name}: {agent.context_window:,} tokens (agents.{name}.context_window)")
            continue
        try:
            length = await model.context_length(agent.model)
        except ModelError as exc:
            length, why = None, f"the model's own length is unknown: {exc}"
        else:
            why = f"{agent.model} takes up to {length:,}" if length else "the model does not say"
        ceiling = config.context.max_window
        window = config.context.window(0, length)
        lines.append(f"{name}: {window:,} tokens ({why}; context.max_window is {ceiling:,})")
    return lines


async def status(config: Config, output: TextIO = sys.stdout) -> int:
    """`kaiwa status`: what the store says, without starting a channel or asking Ollama."""
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
    return 0


async def _cluster_status(config: Config, output: TextIO) -> None:
    platforms = ("telegram", "slack", "discord")
    workers, holders = await cluster_view(
        config.database_url(), config.cluster, [f"channel:{p}" for p in platforms]
    )
    output.write(f"workers: {', '.join(workers) or 'none running'}\n")
    for platform in platforms:
        if f"channel:{platform}" in holders:
            output.write(f"  {platform} connection: held by {holders[f'channel:{platform}']}\n")


async def run(
    config: Config, stop_requested: asyncio.Event, terminal: TerminalIO, *, debug: bool = False
) -> int:
    """`kaiwa run`: check, start the channels, serve until input ends or a stop is requested.
    Returns the exit status: 0, or 1 when a problem stopped Kaiwa."""
    worker = worker_name(config.cluster) if config.cluster.enabled else ""
    setup_logging(config.logging, config.data_dir, config.secrets(), debug=debug, worker=worker)
    turn_settings(config)  # a config error stops Kaiwa before anything starts
    cluster = Coordinator(config.database_url(), config.cluster) if worker else None
    model = ModelClient(config.ollama)
    adapters = _adapters(config, terminal)
    if not adapters:
        await model.close()
        raise ConfigError(
            "no channel to serve: set a platform's token variable ([channels.telegram].token_env, "
            "[channels.slack].bot_token_env, [channels.discord].token_env)"
            + ("" if config.cluster.enabled else " or keep [channels.terminal].enabled = true")
        )
    try:
        problems = await find_problems(config, model, adapters)
        if problems:
            for problem in problems:  # in the log file; on stderr once, in the command's words
                logger.error("cannot start: %s", problem, extra=PRINTED)
            sys.stderr.write("".join(f"kaiwa: cannot start: {p}\n" for p in problems))
            return 1
        store = await Store.open(config.database_url(), config.storage.store_settings())
        settings = turn_settings(config, store)
        try:
            described = await store.describe()
            if cluster is not None:  # what dead workers left is resolved place by place
                await cluster.start()
                left = Leftovers()
            else:
                left = await leftovers(store)  # before anything of this process runs
            return await _serve(
                config, store, described, model, settings, adapters, stop_requested, left, cluster
            )
        finally:
            if cluster is not None:
                await cluster.close()
            await store.close()
    finally:
        for adapter in adapters:
            await adapter.close()
        await model.close()


async def _serve(
    config: Config,
    store: Store,
    described: str,
    model: ModelClient,
    settings: TurnSettings,
    adapters: list[Adapter],
    stop_requested: asyncio.Event,
    left: Leftovers,
    cluster: Coordinator | None = None,
) -> int:
    """Run every channel (a failing one is restarted, `bot.supervision`) until one ends by
    itself, one needs a person, or a stop is requested; meanwhile resolve what an earlier
    process left. Then stop receiving, let every turn finish its last edit (invariant 7), and
    only then let the caller close the channels."""
    channels = {adapter.platform: adapter for adapter in adapters}
    runner = TurnRunner(store, model, channels, settings)
    servers = McpServers(config.mcp)
    await servers.start()  # before any turn: its tools are there from the first message
    runner.serve_mcp(servers)
    approvals = Approvals(store, channels, config.approvals)
    runner.require_approvals(approvals)
    planning = PlanWorkflow(store, approvals, config.workflows.plan)
    if config.workflows.plan.enabled:
        runner.workflows["plan"] = planning
    scheduler = _scheduler(config, store, runner, channels)
    memory = Memory(store, config.memory) if config.memory.enabled else None
    if memory is not None:
        runner.shared_tools.update({each.name: each for each in memory_tools(memory)})
    owners = Owners(cluster, store, runner, channels) if cluster is not None else None
    dispatcher = Dispatcher(
        store,
        runner,
        channels,
        access_rules(config),
        max_message_chars=config.limits.max_message_chars,
        scheduler=scheduler,
        memory=memory,
        owners=owners,
    )
    if owners is not None:
        owners.recovered = _place_recovery(store, approvals, planning, channels)
        if scheduler is not None:
            scheduler.serve_cluster(owners)
        await owners.start()
    supervised = [_supervised(adapter, dispatcher.handle, cluster, config) for adapter in adapters]
    for adapter in adapters:
        if isinstance(adapter, TerminalChannel):  # before its prompt, so it reads first
            adapter.say(await _terminal_banner(adapter, settings, store))
    running = [
        asyncio.create_task(each.run(), name=f"channel {each.channel.platform}")
        for each in supervised
    ]
    stop_wait = asyncio.create_task(_stop_or_lost(stop_requested, cluster), name="stop requested")
    recovering = asyncio.create_task(
        Recovery(store, runner, channels).resolve(left), name="recovering after a restart"
    )
    announcing = asyncio.create_task(
        _announce_ready(adapters, settings, described), name="start line"
    )
    scheduling = asyncio.create_task(
        _once_connected(
            scheduler, approvals, adapters, lambda: planning.show_interrupted(left.plans, channels)
        ),
        name="after connecting",
    )
    status = 0
    try:
        done, _ = await asyncio.wait([*running, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if cluster is not None and cluster.lost.is_set():
            lost = "the cluster's database connection was lost (other workers take over)"
            logger.error("stopping: %s", lost, extra=PRINTED)
            sys.stderr.write(f"kaiwa: stopping: {lost}\n")
            status = 1
        for task in done - {stop_wait}:
            ended = task.result()
            if ended.error is not None:
                logger.error("stopping: %s: %s", ended.platform, ended.error, extra=PRINTED)
                sys.stderr.write(f"kaiwa: stopping: {ended.platform}: {ended.error}\n")
                status = 1
            elif ended.platform == TerminalChannel.platform:
                await _answer_what_was_typed(runner, channels[ended.platform], stop_wait)
    finally:
        for each in supervised:
            await each.stop()
        stop_wait.cancel()
        _, stuck = await asyncio.wait(running, timeout=CHANNEL_STOP_SECONDS)
        for task in [*stuck, recovering, announcing, scheduling]:
            task.cancel()
        await asyncio.gather(
            *running, stop_wait, recovering, announcing, scheduling, return_exceptions=True
        )
        if scheduler is not None:
            scheduler.stop()  # no firing into a closing runner
        if owners is not None:
            await owners.stop()
        stopped = await runner.shutdown()
        await servers.close()
        if scheduler is not None:
            await scheduler.settled()  # the firings the shutdown stopped store how they ended
        logger.info(
            "stopped: %d %s stopped, %d queued %s kept for the next start",
            stopped.running,
            plural(stopped.running, "reply", "replies"),
            stopped.dropped,
            plural(stopped.dropped, "message"),
        )
    return status


def _scheduler(
    config: Config, store: Store, runner: TurnRunner, channels: dict[str, Channel]
) -> Scheduler | None:
    """The scheduler, its task tools given to every conversation's agent; None when off."""
    if not config.schedule.enabled:
        return None
    scheduler = Scheduler(store, runner, channels, config.schedule, zone=config.assistant.timezone)

    def agent_of(place: str, platform: str) -> str:
        return runner.agent_for(place, platform).name

    runner.shared_tools = {t.name: t for t in task_tools(scheduler, agent_of)}
    return scheduler


def _supervised(
    adapter: Adapter, deliver: Deliver, cluster: Coordinator | None, config: Config
) -> Supervised | Leased:
    """A channel under supervision; in a cluster, one whose connection must be single also
    under its lease (Slack's HTTP Events and Telegram's webhook are served by every worker)."""
    supervised = Supervised(adapter, deliver)
    served_by_all = (adapter.platform == "slack" and config.channels.slack.mode == "http") or (
        adapter.platform == "telegram" and config.channels.telegram.mode == "webhook"
    )
    if cluster is None or served_by_all:
        return supervised
    return Leased(supervised, cluster)


def _place_recovery(
    store: Store, approvals: Approvals, planning: PlanWorkflow, channels: dict[str, Adapter]
) -> Callable[[str], Awaitable[None]]:
    """What a cluster's new owner of a place resolves there, besides its turns and runs: the
    plans and questions a dead worker left."""

    async def recover(place: str) -> None:
        plans = await store.close_unfinished_plans(utc_now(), place)
        await planning.show_interrupted(plans, channels)
        await approvals.expire_leftovers(place)

    return recover


async def _stop_or_lost(stop_requested: asyncio.Event, cluster: Coordinator | None) -> None:
    """A stop was asked for, or (in a cluster) the lease connection was lost: every lease is
    gone, and another worker may be running this one's conversations already."""
    waits = [asyncio.ensure_future(stop_requested.wait())]
    if cluster is not None:
        waits.append(asyncio.ensure_future(cluster.lost.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _once_connected(
    scheduler: Scheduler | None,
    approvals: Approvals,
    adapters: list[Adapter],
    show_interrupted_plans: Callable[[], Awaitable[None]],
) -> None:
    """Once every channel is up (or has had its time to come up): mark the questions a dead
    process left unanswered expired, on the platform too, show its plans interrupted, and start
    firing, so a firing due while Kaiwa was down finds its channel connected."""
    waits = [asyncio.create_task(adapter.connected.wait()) for adapter in adapters]
    await asyncio.wait(waits, timeout=CONNECT_ANNOUNCE_SECONDS)
    for wait in waits:
        wait.cancel()
    try:
        if expired := await approvals.expire_leftovers():
            logger.info("%d unanswered %s marked expired", expired, plural(expired, "question"))
        await show_interrupted_plans()
        if scheduler is not None:
            count = await scheduler.start()
            logger.info("scheduler started: %d %s", count, plural(count, "task"))
    except StoreError as exc:
        logger.error("after start-up: the store could not be read: %s", exc)


async def _answer_what_was_typed(
    runner: TurnRunner, terminal: Channel, stop_wait: "asyncio.Task[object]"
) -> None:
    """The terminal's input ended (Ctrl-D, or the end of a pipe): answer what was sent before
    leaving, as `echo hi | kaiwa run` expects; a stop (Ctrl-C) still ends it at once."""
    assert isinstance(terminal, TerminalChannel)
    answered = asyncio.create_task(runner.wait_idle(terminal.place), name="answering the terminal")
    await asyncio.wait([answered, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    answered.cancel()


def access_rules(config: Config) -> AccessRules:
    telegram, slack, discord = (
        config.channels.telegram,
        config.channels.slack,
        config.channels.discord,
    )
    return AccessRules(
        {
            "terminal": Allowed(users=None),
            "telegram": Allowed(users=_people(telegram.allowed_users, telegram.anyone)),
            "slack": Allowed(
                users=_people(slack.allowed_users, slack.anyone),
                rooms=_ids(slack.allowed_channels),
            ),
            "discord": Allowed(
                users=_people(discord.allowed_users, discord.anyone),
                roles=_ids(discord.allowed_roles),
                spaces=_ids(discord.allowed_guilds),
                rooms=_ids(discord.allowed_channels),
            ),
        }
    )


def _people(ids: Sequence[int | str], anyone: bool) -> frozenset[str] | None:
    return None if anyone else _ids(ids)


def _ids(ids: Sequence[int | str]) -> frozenset[str]:
    return frozenset(map(str, ids))


async def _terminal_banner(terminal: TerminalChannel, settings: TurnSettings, store: Store) -> str:
    """Who answers, and whether this continues a conversation (and how long it is)."""
    stored = await store.conversation_of(terminal.place)
    turns = stored.turns
    where = (
        f"Continuing your conversation ({turns} {plural(turns, 'turn')} so far; /new starts a "
        "fresh one)."
        if stored.conversation is not None
        else "A new conversation."
    )
    return (
        f"Kaiwa is ready: {settings.agent.name} on {settings.agent.model}. {where} "
        "/help lists commands; Ctrl-D quits."
    )


async def _announce_ready(adapters: list[Adapter], settings: TurnSettings, described: str) -> None:
    """The start line, once every channel has connected or had a while to (naming those still
    trying, and why)."""
    waits = [asyncio.ensure_future(adapter.connected.wait()) for adapter in adapters]
    if waits:
        await asyncio.wait(waits, timeout=CONNECT_ANNOUNCE_SECONDS)
    for wait in waits:
        wait.cancel()
    connected = [a.platform for a in adapters if a.connected.is_set()]
    trying = [
        f"{a.platform} ({a.problem or 'connecting'})" for a in adapters if not a.connected.is_set()
    ]
    logger.info(
        "ready: kaiwa %s; %s on %s; store: %s; channels connected: %s%s",
        kaiwa_version(),
        settings.agent.name,
        settings.agent.model,
        described,
        ", ".join(connected) or "none",
        f"; still trying: {', '.join(trying)}" if trying else "",
    )
    for line in trying:
        logger.warning("not connected yet: %s", line)


def _adapters(config: Config, terminal: TerminalIO) -> list[Adapter]:
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
        from channels.telegram import TelegramChannel

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
    from channels.slack import SlackChannel, SlackTokens

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
    from channels.discord import DiscordChannel

    if not (settings.anyone or settings.allowed_users or settings.allowed_roles):
        logger.warning(
            "Discord is on but nobody may use it: set [channels.discord].allowed_users or "
            "allowed_roles (ids; Developer Mode → Copy ID), or anyone = true"
        )
    return DiscordChannel(settings, os.environ[settings.token_env])


async def _no_lines() -> AsyncIterator[str]:
    """`kaiwa check` reads nothing."""
    return
    yield
