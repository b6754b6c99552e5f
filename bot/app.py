"""`kaiwa run`: starts every long-lived part from the config, runs the channels, shuts down in
order. What is built comes from bot/wiring.py (the turn path and its features) and
bot/adapters.py (the channels).

Start and stop are pairs, in reverse order of each other:
  model client → (checks) → store → the turn path assembled (what an earlier process left is
  read, before anything runs) → MCP servers → channels (each supervised: restarted when it
  fails) → recovery of the leftovers → the scheduler (once the channels are up)
  channels stop reading → the scheduler fires no more → every live turn is stopped and stores
  its partial state (a firing's too) → MCP servers close → store closes (its queued writes
  first) → model client closes.
Platform libraries are imported only when their channel is configured, so a terminal-only start
stays fast.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from bot import kaiwa_version
from bot.adapters import Adapter, TerminalIO, configured
from bot.checks import NothingToServe, find_problems, nothing_to_serve
from bot.config import Config
from bot.logs import PRINTED, setup_logging
from bot.supervision import Leased, Supervised
from bot.wiring import access_rules, assemble, features, turn_settings
from channels.terminal import TerminalChannel
from core.agent.model import ModelClient
from core.channel import Channel, Deliver
from core.cluster.settings import worker_name
from core.dispatch.recovery import Leftovers, Recovery, leftovers
from core.errors import StoreError
from core.features.mcp.servers import McpServers
from core.features.schedule.scheduler import Scheduler
from core.store import Store
from core.text import plural
from core.turns.runner import TurnRunner
from core.turns.turn import TurnSettings

if TYPE_CHECKING:
    from core.cluster.leases import Coordinator

logger = logging.getLogger(__name__)

CHANNEL_STOP_SECONDS = 10.0

CONNECT_ANNOUNCE_SECONDS = 15.0


async def run(
    config: Config, stop_requested: asyncio.Event, terminal: TerminalIO, *, debug: bool = False
) -> int:
    """`kaiwa run`: check, start the channels, serve until input ends or a stop is requested.
    Returns the exit status: 0, or 1 when a problem stopped Kaiwa. With no channel to serve,
    raises `NothingToServe` before anything starts."""
    worker = worker_name(config.cluster) if config.cluster.enabled else ""
    setup_logging(config.logging, config.data_dir, config.secrets(), debug=debug, worker=worker)
    turn_settings(config)  # a config error stops Kaiwa before anything starts
    cluster = _coordinator(config) if worker else None
    model = ModelClient(config.ollama)
    adapters = configured(config, terminal)
    if not adapters:
        await model.close()
        raise NothingToServe(nothing_to_serve(config))
    try:
        problems, routing = await find_problems(config, model, adapters)
        if problems:
            for problem in problems:  # in the log file; on stderr once, in the command's words
                logger.error("cannot start: %s", problem, extra=PRINTED)
            sys.stderr.write("".join(f"kaiwa: cannot start: {p}\n" for p in problems))
            return 1
        if routing:  # never a run that fails on a missing model: each runs its profile's
            config = _without_routing(config, routing)
        store = await Store.open(config.database_url(), config.storage.store_settings())
        settings = turn_settings(config, store)
        try:
            described = await store.describe()
            if cluster is not None:
                await cluster.start()
            return await _serve(
                config, store, described, model, settings, adapters, stop_requested, cluster
            )
        finally:
            if cluster is not None:
                await cluster.close()
            await store.close()
    finally:
        for adapter in adapters:
            await adapter.close()
        await model.close()


def _without_routing(config: Config, problems: list[str]) -> Config:
    """`config` with sub-agent routing off, said once (in the log, and on stderr), with why."""
    why = "; ".join(problems)
    logger.warning("sub-agent routing is off, each sub-agent runs its profile's model: %s", why)
    routing = config.subagents.routing.off()
    return replace(config, subagents=replace(config.subagents, routing=routing))


def _coordinator(config: Config) -> Coordinator:
    """The cluster's leases and notifications: PostgreSQL's client loads only for a worker."""
    from core.cluster.leases import Coordinator

    return Coordinator(config.database_url(), config.cluster)


async def _serve(
    config: Config,
    store: Store,
    described: str,
    model: ModelClient,
    settings: TurnSettings,
    adapters: list[Adapter],
    stop_requested: asyncio.Event,
    cluster: Coordinator | None = None,
) -> int:
    """Run every channel (a failing one is restarted, `bot.supervision`) until one ends by
    itself, one needs a person, or a stop is requested; meanwhile resolve what an earlier
    process left. Then stop receiving, let every turn finish its last edit (invariant 7), and
    only then let the caller close the channels."""
    channels = {adapter.platform: adapter for adapter in adapters}
    servers = McpServers(config.mcp)
    kaiwa = assemble(
        store,
        model,
        channels,
        settings,
        access_rules(config),
        features(config, servers),
        max_message_chars=config.limits.max_message_chars,
        cluster=cluster,
    )
    runner, scheduler, owners = kaiwa.runner, kaiwa.scheduler, kaiwa.owners
    health = None
    if config.metrics.enabled:  # first: a port in use stops the start before anything runs
        from bot.health import HealthServer, Readiness  # aiohttp loads only when it serves

        readiness = Readiness(store, model, adapters, cluster)
        health = HealthServer(readiness, config.metrics.host, config.metrics.port)
        await health.start()
    if owners is None:  # before anything of this process runs: all that runs then is left over
        left = await leftovers(store, runner.parts)
    else:  # what dead workers left is resolved place by place, as each is taken over
        left = Leftovers()
    await servers.start()  # before any turn: its tools are there from the first message
    if owners is not None:
        await owners.start()
    handle = kaiwa.dispatcher.handle
    supervised = [_supervised(adapter, handle, cluster, config) for adapter in adapters]
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
    scheduling = asyncio.create_task(_once_connected(scheduler, adapters), name="scheduler")
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
        if health is not None:
            await health.close()
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


async def _once_connected(scheduler: Scheduler | None, adapters: list[Adapter]) -> None:
    """Once every channel is up (or has had its time to come up), start firing, so a firing
    due while Kaiwa was down finds its channel connected."""
    if scheduler is None:
        return
    waits = [asyncio.create_task(adapter.connected.wait()) for adapter in adapters]
    await asyncio.wait(waits, timeout=CONNECT_ANNOUNCE_SECONDS)
    for wait in waits:
        wait.cancel()
    try:
        count = await scheduler.start()
        logger.info("scheduler started: %d %s", count, plural(count, "task"))
    except StoreError as exc:
        logger.error("after start-up: the store could not be read: %s", exc)


async def _answer_what_was_typed(
    runner: TurnRunner, terminal: Channel, stop_wait: asyncio.Task[object]
) -> None:
    """The terminal's input ended (Ctrl-D, or the end of a pipe): answer what was sent before
    leaving, as `echo hi | kaiwa run` expects; a stop (Ctrl-C) still ends it at once."""
    assert isinstance(terminal, TerminalChannel)
    answered = asyncio.create_task(runner.wait_idle(terminal.place), name="answering the terminal")
    await asyncio.wait([answered, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    answered.cancel()


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
