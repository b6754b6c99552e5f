"""Delegation as the model sees it: the `delegate` and `agent_wait` tools, whom it may choose, and
what it is told when a delegation cannot be launched.

`delegate` returns at once with ids and names: the person keeps talking while sub-agents work,
and the parent's context never fills with their intermediate steps. Only the conversation's
agent delegates that way; a sub-agent whose profile delegates (below `[subagents].max_depth`)
gets a `delegate` that waits for the runs it launched and returns their reports to it alone.

Profiles: those in the delegator's `delegates_to`, and `general` (the delegator itself with a
generalist's prompt, unless a profile of that name is configured). Each cap (batch, concurrent
here, running everywhere, total here) refuses with what to do instead, and a task may narrow its
profile's tools, never widen them.
"""

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from core.agent.profile import AgentProfile
from core.agent.tools import Tool, tool
from core.features.subagents.runs import Run, SubagentSettings
from core.text import plural
from core.turns.parts import ToolGuard

GENERAL = "general"
GENERAL_PROMPT = (
    "You are a capable generalist. Do the task you are given thoroughly, with the tools you "
    "have, and be precise about what you found and what you could not find."
)
Tasks = list[dict[str, Any]]
TASK_FIELDS = (
    "Give each task its kind and its criteria (what done looks like, which the sub-agent "
    "reads): with model routing on, they choose the model it runs on."
)
TASKS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "profile": {"type": "string"},
                    "instruction": {"type": "string"},
                    "name": {"type": "string"},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "kind": {"type": "string", "enum": ["extract", "format", "analyze", "other"]},
                    "criteria": {"type": "string"},
                },
                "required": ["profile", "instruction"],
            },
        }
    },
    "required": ["tasks"],
}


class Profiles(Protocol):
    def named(self, name: str) -> AgentProfile | None: ...


def profile_for(profiles: Profiles, delegator: AgentProfile, name: str) -> AgentProfile | None:
    """The profile `delegator` may hand a task to under `name`, or None. `general` (unless
    configured) is the delegator itself with a generalist's prompt: its tools and model."""
    if name == GENERAL and profiles.named(GENERAL) is None:
        return dataclasses.replace(
            delegator,
            name=GENERAL,
            system_prompt=GENERAL_PROMPT,
            description="a generalist with your own tools, for any self-contained task",
        )
    return profiles.named(name) if name in delegator.delegates_to else None


def choices(delegator: AgentProfile) -> list[str]:
    return [*delegator.delegates_to, *([GENERAL] if GENERAL not in delegator.delegates_to else [])]


def menu(profiles: Profiles, delegator: AgentProfile) -> str:
    """The profiles `delegator` may choose, each with what it is for."""
    return "; ".join(
        f"{name}: {_described(profile_for(profiles, delegator, name))}"
        for name in choices(delegator)
    )


def _described(profile: AgentProfile | None) -> str:
    return (profile.description if profile is not None else "") or "no description"


def delegate_tool(
    choosing: str, delegate: Callable[[Tasks], Awaitable[str]], *, waits: bool = False
) -> Tool:
    """`delegate` (`choosing`: the menu of profiles): the conversation's agent's returns at once
    with ids; a sub-agent's (`waits`) waits for the runs it launches and gets their reports."""
    what = (
        "Hand self-contained parts of your task to sub-agents and wait for their reports."
        if waits
        else "Hand self-contained tasks to sub-agents, which work on their own and report back "
        "later. Returns at once with their ids."
    )
    return Tool(
        name="delegate",
        description=f"{what} {TASK_FIELDS} Profiles: {choosing}.",
        function=delegate,
        parameters=TASKS_SCHEMA,
    )


def wait_tool(collect: Callable[[list[str] | None, float], Awaitable[str]]) -> Tool:
    @tool()
    async def agent_wait(ids: list[str] | None = None, timeout_s: float = 30.0) -> str:
        """Wait up to timeout_s seconds for sub-agents (ids or names; all of this
        conversation's if none) and return the reports that are ready."""
        return await collect(ids, timeout_s)

    return agent_wait


def launched(runs: Sequence[Run]) -> str:
    """What the conversation's agent is told of a delegation it launched."""
    lines = [f"- {run.label()} on {run.model}{_routed(run)}: {run.task}" for run in runs]
    return (
        f"Launched {len(runs)} {plural(len(runs), 'sub-agent')}:\n"
        + "\n".join(lines)
        + "\nThey work on their own. Answer the person now; collect the reports with agent_wait "
        "when you need them (each also reaches this conversation by itself when it is done)."
    )


def _routed(run: Run) -> str:
    return f" ({run.tier}: {run.route})" if run.tier else ""


@dataclasses.dataclass(frozen=True)
class Counts:
    """What the caps are checked against."""

    running_here: int
    """The conversation's runs running now."""
    had: int
    """The runs the conversation ever had (the store's count, across restarts)."""
    running_everywhere: int
    """This process's runs running now, in every conversation."""


def refusal(
    caps: SubagentSettings,
    counts: Counts,
    tasks: Tasks,
    choosing: tuple[Profiles, AgentProfile],
    tools_of: Callable[[AgentProfile], Mapping[str, Tool]],
    *,
    nested: bool = False,
) -> str | None:
    """Why `tasks` cannot be launched, with what to do instead; None if they can. `choosing`:
    the profiles and the delegator."""
    running, had, running_everywhere = counts.running_here, counts.had, counts.running_everywhere
    if not tasks:
        return "Give at least one task: [{profile, instruction}]."
    if len(tasks) > caps.max_batch:
        later = "in a second call" if nested else "once you have their reports (agent_wait)"
        return (
            f"At most {caps.max_batch} sub-agents per delegate call; launch {caps.max_batch} "
            f"now and the rest {later}."
        )
    if running + len(tasks) > caps.max_concurrent:
        instead = (
            "do this part of the work yourself"
            if nested
            else "collect their reports with agent_wait first, or do the work yourself"
        )
        return (
            f"{running} sub-agents are running here and at most {caps.max_concurrent} may run "
            f"at once: {instead}."
        )
    if running_everywhere + len(tasks) > caps.max_running:
        return (
            f"Kaiwa is running {running_everywhere} sub-agents across its conversations, its "
            f"limit being {caps.max_running}: do the work yourself, or delegate later."
        )
    if had + len(tasks) > caps.max_total:
        return total_refusal(caps, had)
    return _profile_refusal(tasks, choosing, tools_of)


def total_refusal(caps: SubagentSettings, had: int) -> str:
    left = max(0, caps.max_total - had)
    room = f"room for {left} more" if left else "no room for more"
    return (
        f"This conversation has had {had} of its {caps.max_total} sub-agents ({room}); do the "
        "rest of the work yourself."
    )


def _profile_refusal(
    tasks: Tasks,
    choosing: tuple[Profiles, AgentProfile],
    tools_of: Callable[[AgentProfile], Mapping[str, Tool]],
) -> str | None:
    profiles, delegator = choosing
    for task in tasks:
        profile = profile_for(profiles, delegator, task["profile"])
        if profile is None:
            return (
                f"'{task['profile']}' is not a profile you may delegate to; choose one of: "
                f"{', '.join(choices(delegator))}."
            )
        offered = tools_of(profile)
        outside = sorted(set(task.get("tools") or ()) - set(offered))
        if outside:
            return (
                f"{task['profile']} may not use {', '.join(outside)}; a task may only narrow "
                f"its profile's tools ({', '.join(offered) or 'none'})."
            )
    return None


async def granted(
    guard: ToolGuard | None, tasks: Tasks, tools_of: Callable[[dict[str, Any]], Sequence[str]]
) -> list[frozenset[str]]:
    """Ask once, before any starts, for the tools needing approval that these tasks' runs would
    have (`tools_of` a task); each task's grant. The guard raises when the person says no, and
    nothing is launched."""
    if guard is None:
        return [frozenset()] * len(tasks)
    grants, needs = [], []
    for task in tasks:
        grant = frozenset(name for name in tools_of(task) if guard.asks(name))
        grants.append(grant)
        if grant:
            who = f"{task.get('name') or _excerpt(task['instruction'])} ({task['profile']})"
            needs.append(f"{who} use {', '.join(sorted(grant))}")
    if needs:
        await guard.grant("; ".join(needs))
    return grants


def _excerpt(instruction: str) -> str:
    """The start of a task, as a question names it."""
    return instruction if len(instruction) <= 40 else instruction[:39] + "…"
