"""The model's task tools: `schedule_task` and the rest, on the conversation they are called from.

Each acts on its own conversation's tasks, read from the turn's `ToolContext` (never from the
model's arguments), and only a person's turn may create, change or delete a task: a scheduled
run or a sub-agent is refused (`ToolContext.attended`). They are given to every conversation's
turns (`core.turns.parts.TurnTools`), not to sub-agents' runs.
"""

from collections.abc import Callable
from typing import Annotated, Any

from core.agent.tools import Tool, ToolContext, calling, tool
from core.features.schedule.scheduler import Scheduler
from core.features.schedule.timing import POLICIES, TaskError, When, describe_task, slug, zone_named
from core.store.tables import ScheduledTask

TASK_TOOLS = (
    "schedule_task",
    "list_tasks",
    "update_task",
    "pause_task",
    "resume_task",
    "cancel_task",
    "run_task_now",
)
"""The names of `task_tools`, known before a store exists (to check config against)."""


def task_tools(scheduler: Scheduler, agent_of: Callable[[str, str], str]) -> list[Tool]:
    """`schedule_task` and the rest, acting on the conversation they are called from.
    `agent_of(place, platform)` names the agent a task of that place runs."""

    def here() -> ToolContext:
        context = calling()
        if context is None:
            raise TaskError("tasks can only be managed from a conversation")
        return context

    def changing() -> ToolContext:
        context = here()
        if not context.attended:
            raise TaskError(
                "a scheduled run (or a sub-agent) cannot create, change or delete tasks; "
                "a person can, in the conversation"
            )
        return context

    async def found(wanted: str) -> ScheduledTask:
        task = await scheduler.find(here().place, wanted)
        if task is None:
            raise TaskError(f"no task {wanted!r} in this conversation; list_tasks shows them")
        return task

    @tool()
    async def schedule_task(
        prompt: Annotated[
            str,
            "what to do each time it fires, as you would ask yourself; '/plan TASK' plans the "
            "task, has the plan reviewed and carries it out",
        ],
        cron: Annotated[str, "five-field cron in the task's zone, e.g. '0 9 * * 1-5'"] = "",
        every_minutes: Annotated[int, "or: run every N minutes"] = 0,
        at: Annotated[str, "or: run once at this local date-time, '2026-12-24 18:00'"] = "",
        timezone: Annotated[str, "IANA zone, e.g. Europe/Paris; default: Kaiwa's"] = "",
        name: Annotated[str, "a short name for the task"] = "",
        if_missed: Annotated[str, "after downtime: 'once' (one late run) or 'skip'"] = "once",
    ) -> str:
        """Schedule a task that runs on its own in this conversation and posts its answer here.
        Give exactly one of cron, every_minutes or at. Returns the stored task with its next
        run, or an error; only a stored task is scheduled."""
        context = changing()
        when = When(cron, every_minutes, at, timezone)
        agent = agent_of(context.place, context.platform)
        task = await scheduler.create(context, agent, prompt, when, name=name, misfire=if_missed)
        return f"Scheduled: {describe_task(task, None)}"

    @tool(read_only=True)
    async def list_tasks() -> str:
        """List this conversation's scheduled tasks: schedule, zone, next run, last outcome."""
        lines = await scheduler.listing(here().place)
        return "\n".join(lines) if lines else "No scheduled tasks in this conversation."

    @tool()
    async def update_task(
        task: Annotated[str, "the task's id or name"],
        prompt: str = "",
        cron: str = "",
        every_minutes: int = 0,
        at: str = "",
        timezone: str = "",
        name: str = "",
        if_missed: str = "",
    ) -> str:
        """Change a task of this conversation: only what is given changes (a new schedule
        replaces the old one)."""
        changing()
        stored = await found(task)
        changes: dict[str, Any] = {}
        if prompt.strip():
            changes["prompt"] = prompt.strip()
        if name.strip():
            changes["name"] = slug(name)
        if if_missed:
            if if_missed not in POLICIES:
                raise TaskError("if_missed must be 'once' or 'skip'")
            changes["misfire"] = if_missed
        zone = timezone.strip() or stored.timezone
        if cron or every_minutes or at:
            when = When(cron, every_minutes, at, zone)
            changes.update(when.columns(zone, scheduler.now(), scheduler.settings))
        if timezone.strip():
            zone_named(zone)
            changes["timezone"] = zone
        if not changes:
            raise TaskError("nothing to change: give a prompt, a schedule, a zone or a name")
        updated = await scheduler.update(stored, changes)
        return f"Updated: {describe_task(updated, None)}"

    @tool()
    async def pause_task(task: Annotated[str, "the task's id or name"]) -> str:
        """Pause a task of this conversation until it is resumed."""
        changing()
        stored = await found(task)
        await scheduler.pause(stored, "paused on request")
        return f"Paused task #{stored.id} {stored.name}."

    @tool()
    async def resume_task(task: Annotated[str, "the task's id or name"]) -> str:
        """Resume a paused task of this conversation (runs missed while paused are skipped)."""
        changing()
        resumed = await scheduler.resume(await found(task))
        return f"Resumed: {describe_task(resumed, None)}"

    @tool()
    async def cancel_task(task: Annotated[str, "the task's id or name"]) -> str:
        """Cancel a task of this conversation for good."""
        changing()
        stored = await found(task)
        await scheduler.cancel(stored)
        return f"Cancelled task #{stored.id} {stored.name}; it will not fire again."

    @tool()
    async def run_task_now(task: Annotated[str, "the task's id or name"]) -> str:
        """Run a task of this conversation once now, besides its schedule."""
        changing()
        stored = await found(task)
        label = f"#{stored.id} {stored.name}"
        if not await scheduler.run_now(stored):
            return f"Task {label} is already running (started this second); do not run it again."
        return f"Task {label} runs now; its answer follows in this conversation."

    return [
        schedule_task,
        list_tasks,
        update_task,
        pause_task,
        resume_task,
        cancel_task,
        run_task_now,
    ]
