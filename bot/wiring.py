"""Assembly: the turn path with every feature plugged in, the one way Kaiwa is put together.

The turn runner names no feature, and the dispatcher only the turn path's own commands; this is
where they meet. Each feature is built from its settings and handed to the runner as a turn part
(`core.turns.parts`), to the dispatcher as its commands, and, with several workers, to the
cluster's owners. A feature that is off still answers its commands (how to turn it on) and, for
those whose rows outlive a process (plans, questions), still resolves what a dead process left.

`kaiwa run` assembles through here (bot/app.py), and so do the tests (tests/harness.py) and the
benchmarks (benchmarks/_common.py), so what they try and measure is what runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from bot.config import Config
from channels.places import space_of
from core.agent.loop import ChatModel
from core.agent.profile import AgentProfile
from core.agent.tools import ToolRegistry, builtin_tools
from core.channel import Channel
from core.dispatch.commands import Answer
from core.dispatch.dispatcher import AccessRules, Allowed, Dispatcher
from core.errors import ConfigError
from core.features.approvals.commands import AnswerCommand, GrantsCommand
from core.features.approvals.questions import Approvals, ApprovalSettings
from core.features.archive import archive_tools
from core.features.attachments.formats import DocumentLimits
from core.features.attachments.reading import Attachments
from core.features.attachments.transcription import TranscriptionSettings
from core.features.fetch import fetch_tool
from core.features.mcp.servers import McpServers
from core.features.memory import (
    MEMORY_OFF,
    MEMORY_TOOLS,
    Memory,
    MemoryCommand,
    MemorySettings,
    memory_tools,
)
from core.features.schedule.commands import TASKS_OFF, TasksCommand
from core.features.schedule.firing import CutFirings
from core.features.schedule.scheduler import Scheduler
from core.features.schedule.timing import ScheduleSettings
from core.features.schedule.tools import TASK_TOOLS, task_tools
from core.features.subagents.agents import Subagents
from core.features.subagents.commands import AgentsCommand
from core.features.subagents.runs import SubagentSettings
from core.store import Store
from core.store.tables import utc_now
from core.turns.parts import TurnTools
from core.turns.runner import TurnModel, TurnRunner
from core.turns.turn import TurnSettings
from workflows.plan.settings import PlanSettings
from workflows.plan.workflow import PLANS_OFF, PlansCommand, PlanWorkflow

if TYPE_CHECKING:
    from core.cluster.leases import Coordinator
    from core.cluster.owners import Owners


@dataclass(frozen=True)
class Features:
    """What a Kaiwa is built with besides its turn path (each off as its settings say)."""

    subagents: SubagentSettings = field(default_factory=SubagentSettings)
    approvals: ApprovalSettings = field(default_factory=ApprovalSettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    transcription: TranscriptionSettings = field(default_factory=TranscriptionSettings)
    documents: DocumentLimits = field(default_factory=DocumentLimits)
    mcp: McpServers | None = None
    """Started already: their tools are there from the first message."""
    zone: str = ""
    """The time zone of a task that names none (`[assistant].timezone`)."""
    clock: Callable[[], datetime] = utc_now
    """What "now" is for the scheduler (tests move it by hand)."""
    timers: bool = True
    """False: tasks fire only when `Scheduler.fire_due` is called (tests)."""


@dataclass(frozen=True)
class Assembly:
    """The assembled turn path and the features a caller may need to reach."""

    runner: TurnRunner
    dispatcher: Dispatcher
    subagents: Subagents
    approvals: Approvals
    planning: PlanWorkflow
    scheduler: Scheduler | None = None
    memory: Memory | None = None
    owners: Owners | None = None


def assemble(
    store: Store,
    model: TurnModel,
    channels: Mapping[str, Channel],
    settings: TurnSettings,
    access: AccessRules,
    features: Features,
    *,
    max_message_chars: int,
    cluster: Coordinator | None = None,
) -> Assembly:
    """Build the runner and the dispatcher, and plug every feature in. With `cluster`, the
    conversation owners too (not started: `Owners.start`)."""
    runner = TurnRunner(store, model, channels, settings)
    parts = runner.parts
    if features.mcp is not None:
        parts.add(features.mcp)
    approvals = Approvals(store, channels, features.approvals)
    parts.add(approvals)
    parts.guard = approvals
    planning = PlanWorkflow(store, approvals, features.plan)
    parts.add(planning)
    if features.plan.enabled:
        runner.workflows["plan"] = planning
    scheduler = _scheduler(store, runner, channels, features)
    memory = Memory(store, features.memory) if features.memory.enabled else None
    if memory is not None:
        parts.add(TurnTools(memory_tools(memory)))
    attachments = Attachments(features.transcription, features.documents)
    parts.add(attachments)
    subagents = _subagents(store, model, runner, channels, features.subagents)
    owners = _owners(cluster, store, runner, channels) if cluster is not None else None
    if owners is not None:
        parts.add(CutFirings(store))
        if scheduler is not None:
            scheduler.serve_cluster(owners)
    dispatcher = Dispatcher(
        store, runner, channels, access, max_message_chars=max_message_chars, owners=owners
    )
    dispatcher.screens.append(attachments.screen)
    commands = dispatcher.commands
    commands.add("agents", AgentsCommand(subagents, store))
    commands.add("tasks", TasksCommand(scheduler) if scheduler is not None else Answer(TASKS_OFF))
    commands.add("memory", MemoryCommand(memory) if memory is not None else Answer(MEMORY_OFF))
    plans = PlansCommand(store) if features.plan.enabled else Answer(PLANS_OFF)
    for name in ("plan", "plans"):
        commands.add(name, plans)
    for name in ("approve", "edit", "deny"):
        commands.add(name, AnswerCommand(approvals))
    commands.add("grants", GrantsCommand(store))
    return Assembly(runner, dispatcher, subagents, approvals, planning, scheduler, memory, owners)


def _owners(
    cluster: Coordinator, store: Store, runner: TurnRunner, channels: Mapping[str, Channel]
) -> Owners:
    """The conversations' owners of one of several workers (PostgreSQL's client loads only for
    a cluster)."""
    from core.cluster.owners import Owners

    return Owners(cluster, store, runner, dict(channels))


def _scheduler(
    store: Store, runner: TurnRunner, channels: Mapping[str, Channel], features: Features
) -> Scheduler | None:
    """The scheduler, its task tools given to every conversation's turns; None when off."""
    if not features.schedule.enabled:
        return None
    scheduler = Scheduler(
        store,
        runner,
        channels,
        features.schedule,
        zone=features.zone,
        clock=features.clock,
        timers=features.timers,
    )

    def agent_of(place: str, platform: str) -> str:
        return runner.conversations.agent_for(place, platform).name

    runner.parts.add(TurnTools(task_tools(scheduler, agent_of)))
    return scheduler


def _subagents(
    store: Store,
    model: ChatModel,
    runner: TurnRunner,
    channels: Mapping[str, Channel],
    settings: SubagentSettings,
) -> Subagents:
    """Sub-agents, a part of every turn (added last: their runs use the tools the other parts
    give an agent)."""
    subagents = Subagents(
        store,
        model,
        runner.settings,
        settings,
        runner.conversations.windows.of,
        runner.parts,
        channels,
    )
    runner.parts.add(subagents)
    return subagents


# -- from the config ------------------------------------------------------------------------


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
    )


def access_rules(config: Config) -> AccessRules:
    telegram, slack, discord, web = (
        config.channels.telegram,
        config.channels.slack,
        config.channels.discord,
        config.channels.web,
    )
    return AccessRules(
        {
            "terminal": Allowed(users=None),
            "web": Allowed(users=_people([*web.allowed_users, web.OPERATOR], web.anyone)),
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


def features(config: Config, mcp: McpServers | None = None) -> Features:
    """The features `config` turns on, with `mcp`, the MCP servers, started."""
    return Features(
        subagents=config.subagents,
        approvals=config.approvals,
        plan=config.workflows.plan,
        schedule=config.schedule,
        memory=config.memory,
        transcription=config.transcription,
        documents=config.documents,
        mcp=mcp,
        zone=config.assistant.timezone,
    )
