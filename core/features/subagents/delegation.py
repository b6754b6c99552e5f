"""Sub-agents: work the person-facing agent hands off, run detached, reported back exactly once.

Why it is shaped this way:
- `delegate` returns at once with ids and names: the person keeps talking while sub-agents
  work, and the parent's context never fills with their intermediate steps.
- A run is an agent loop of its own (its profile's tools, narrowed by the spawn, never widened;
  its own window and compaction; its own cap) ending when it calls `report`. A run that answers
  in plain text reports that text; one that is stopped reports what it had said so far.
- Exactly once: a finished report stays `pending` (stored) until a turn of its conversation that
  carried it has stored its records. A turn carries reports it collected with `agent_wait`, or
  those waiting when it starts (at the top of its message); when the conversation is idle, a
  finished run starts a turn of its own (provenance `subagent`) that finds its report then, and
  does nothing if another turn took it meanwhile. A turn that fails leaves its reports pending.
  Claims live in memory; the store keeps the state across restarts.
- Only the person-facing agent's `delegate` is detached. A sub-agent whose profile delegates
  (below the depth cap) gets a `delegate` that waits for the runs it launched and returns their
  reports to it alone; stopping it stops them too.
- Stops: `/agents stop` stops one (and its children); `/stop`, `/new` and shutdown stop all of a
  conversation's (or the process's) at once, sharing one grace window. `/new` discards
  undelivered reports.
- After a restart, runs a dead process left running are `lost` (their conversation is told
  once), and finished reports that never reached their conversation are delivered.

While a conversation's sub-agents run, one message there shows each (name, state, elapsed),
edited no faster than the channel allows, and becomes a one-line summary when the last ends.

Profiles: those in the delegator's `delegates_to`, and `general` (the delegator itself with a
generalist's prompt). Optional routing (`RoutingSettings`) picks a run's model by its task's kind.
A run's model requests are `background` (`core.agent.slots`): a person's go first.

Ids (`a1`, `a2`, ...) come from the store, never reused in a conversation; names are slugs of the
model's name for the task, or of the instruction. Model-facing text says `name (id, profile)`;
every command and tool accepts either.
"""

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.agent.context import Calibration, Compaction, Compactor, ContextSettings
from core.agent.loop import AgentLoop, ChatModel, LoopSettings
from core.agent.messages import AssistantMessage, ToolCall, ToolResult, Usage, UsageTotals
from core.agent.tools import Tool, ToolContext, called_from, tool
from core.channel import Channel, Frame, Outcome
from core.errors import KaiwaError, StoreError
from core.features.approvals.questions import Approvals
from core.features.mcp import McpServers
from core.store import RunStart, Store, not_awaited
from core.store.tables import utc_now
from core.text import plural
from core.turns.pump import FramePump

logger = logging.getLogger(__name__)

REPORT_RULE = (
    "\n\nYou are a sub-agent working on one task for another agent. When you are done, or cannot "
    "go further, call `report` once with a short summary of what you found; that ends your work."
)
GENERAL = "general"
GENERAL_PROMPT = (
    "You are a capable generalist. Do the task you are given thoroughly, with the tools you "
    "have, and be precise about what you found and what you could not find."
)
WORD = re.compile(r"[a-z0-9]+(?:[.:/-][a-z0-9]+)*")
NAME_WORDS = 4


class Profiles(Protocol):
    def named(self, name: str) -> Any: ...


@dataclass(frozen=True)
class RoutingSettings:
    """[subagents.routing]: a model per kind of task instead of each profile's own, decided by
    plain rules so the choice can be explained (off by default)."""

    enabled: bool = False
    small: str = ""
    """For `extract` and `format` tasks with only read-only tools and a short instruction."""
    medium: str = ""
    """For `analyze` tasks."""
    large: str = ""
    """For everything else."""
    short_instruction: int = 400
    """Characters an instruction may have and still count as short."""

    def route(self, kind: str, instruction: str, tools: Sequence[Tool]) -> tuple[str, str] | None:
        """The model for a task, and why; None when routing is off."""
        if not self.enabled:
            return None
        if kind in ("extract", "format"):
            if all(each.read_only for each in tools) and len(instruction) <= self.short_instruction:
                return self.small, f"small: a short {kind} task with read-only tools"
            return self.large, f"large: a {kind} task with tools that change things or a long brief"
        if kind == "analyze":
            return self.medium, "medium: an analyze task"
        return self.large, "large: " + (f"a {kind} task" if kind else "no kind given")


@dataclass(frozen=True)
class SubagentSettings:
    """[subagents] in config: the caps, and the grace a stopped run gets."""

    max_total: int = 20
    """Runs a conversation may ever have."""
    max_batch: int = 5
    """Runs one `delegate` call may launch."""
    max_concurrent: int = 5
    """Runs of one conversation at once."""
    max_running: int = 20
    """Runs of every conversation at once, in this process."""
    max_iterations: int = 30
    """Model calls one run may make."""
    max_depth: int = 2
    """Levels of sub-agents: at 2, a sub-agent may delegate, its sub-agents may not."""
    stop_grace: float = 2.0
    status_message: bool = True
    """Show the conversation's running sub-agents in one message, edited as they go."""
    routing: RoutingSettings = field(default_factory=RoutingSettings)


@dataclass(eq=False)
class Run:
    """A sub-agent run as this process knows it."""

    row_id: int
    key: str
    name: str
    profile: str
    model: str
    task: str
    place: str
    platform: str
    conversation_id: int = 0
    parent: "Run | None" = None
    """The run that launched this one, which alone receives its report."""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    status: str = "running"
    """running, done, stopped, failed (lost: only in the store, after a restart)."""
    doing: str = "thinking"
    report: str = ""
    usage: UsageTotals = field(default_factory=UsageTotals)
    last_tool: str | None = None
    inbox: list[str] = field(default_factory=list)
    claimed: bool = False
    delivery: str = "pending"
    worker: "asyncio.Task[None] | None" = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    on_change: Callable[[], None] = lambda: None
    """Told whenever what `/agents` would show of the run changes."""

    route: str = ""
    """Why routing chose its model ('' when it runs its profile's)."""
    granted: frozenset[str] = frozenset()
    """Tools needing approval that a person allowed for this run when it was delegated."""

    def label(self) -> str:
        return f"{self.name} ({self.key}, {self.profile})"

    def matches(self, wanted: str) -> bool:
        return wanted in (self.key, self.name)


@dataclass
class Claims:
    """The reports one turn carries; they count as delivered once its records are stored."""

    runs: list[Run] = field(default_factory=list)


def format_report(run: Run) -> str:
    """One shape for every delivery, so the model learns one."""
    how = {
        "done": "reported",
        "stopped": "was stopped; what it had",
        "failed": "failed",
    }.get(run.status, run.status)
    return f"[Sub-agent report] {run.label()} {how}:\n{run.report or '(nothing)'}"


def slug(text: str, taken: Sequence[str]) -> str:
    """A kebab-case name from `text` (at most four words; bare numbers dropped, `10.0.0.5` kept
    whole), made unique among `taken` (`port-scan-2`)."""
    words = [w for w in WORD.findall(text.lower()) if not w.isdigit()][:NAME_WORDS]
    base = "-".join(w.strip(".:/-") for w in words) or "task"
    name, number = base, 2
    while name in taken:
        name, number = f"{base}-{number}", number + 1
    return name


class Subagents:
    def __init__(
        self,
        store: Store,
        model: ChatModel,
        profiles: Profiles,
        settings: SubagentSettings,
        window: Callable[[Any], Awaitable[ContextSettings]],
        *,
        tool_timeout: float = 60.0,
        tool_grace: float = 2.0,
        channels: Mapping[str, Channel] | None = None,
    ) -> None:
        self._store = store
        self._channels = channels or {}
        self._boards: dict[str, _Board] = {}
        self._model = model
        self._profiles = profiles
        self.settings = settings
        self._window = window
        self._tool_timeout = tool_timeout
        self._tool_grace = tool_grace
        self.mcp: McpServers | None = None
        """The runner's MCP servers (`TurnRunner.serve_mcp`): a profile's `mcp` names tools
        among theirs."""
        self.approvals: Approvals | None = None
        """Set with the runner's (`TurnRunner.require_approvals`): a run's calls that need a
        person's yes are refused, since a run never asks."""
        self._runs: dict[str, list[Run]] = {}
        self.wake: Callable[[str, str], None] = lambda platform, place: None
        """Start a turn in (platform, place) to carry a finished report; set by the runner."""

    # -- what a turn uses --------------------------------------------------------------------

    def tools_for(
        self,
        place: str,
        platform: str,
        parent: Any,
        started: Callable[[], Awaitable[tuple[int, int]]],
        claims: Claims,
    ) -> dict[str, Tool]:
        """`delegate` and `agent_wait` for one turn of the agent `parent` in `place`;
        `started()` gives the turn's (conversation id, turn id) once stored."""
        if not parent.delegates_to:
            return {}
        return {
            "delegate": self._delegate_tool(place, platform, parent, started),
            "agent_wait": self._wait_tool(place, claims),
        }

    def claim_ready(self, place: str, claims: Claims) -> list[Run]:
        """Finished reports nobody carries yet, now carried by the turn holding `claims`."""
        ready = [r for r in self._runs.get(place, []) if _deliverable(r)]
        for run in ready:
            run.claimed = True
        claims.runs += ready
        return ready

    def settle(self, claims: Claims, *, delivered: bool) -> None:
        """The turn carrying `claims` has ended: its reports are delivered if its records are
        stored, else they wait for the next turn."""
        if not claims.runs:
            return
        for run in claims.runs:
            run.claimed = False
            if delivered:
                run.delivery = "delivered"
        if delivered:
            ids = [run.row_id for run in claims.runs]
            not_awaited(self._store.set_delivery(ids, "delivered"), "marking reports delivered")
        self._forget_delivered(claims.runs[0].place)

    # -- commands ------------------------------------------------------------------------------

    def live(self, place: str) -> list[Run]:
        return list(self._runs.get(place, []))

    def find(self, place: str, wanted: str) -> Run | None:
        return next((run for run in self._runs.get(place, []) if run.matches(wanted)), None)

    async def stop(self, runs: Sequence[Run]) -> None:
        """Stop `runs`, each reporting what it has, all within one grace window."""
        workers = [run.worker for run in runs if run.worker is not None and run.status == "running"]
        for worker in workers:
            worker.cancel()
        if workers:
            await asyncio.wait(workers, timeout=self.settings.stop_grace)

    async def stop_all(self, place: str) -> int:
        running = [run for run in self._runs.get(place, []) if run.status == "running"]
        await self.stop(running)
        return len(running)

    async def discard(self, place: str) -> None:
        """`/new`: the conversation's runs stop and their undelivered reports are dropped."""
        runs = self._runs.pop(place, [])
        for run in runs:
            run.delivery = "discarded"
        await self.stop(runs)
        ids = [run.row_id for run in runs if run.status != "running"]
        if ids:
            not_awaited(self._store.set_delivery(ids, "discarded"), "discarding reports")

    def tell(self, run: Run, text: str) -> bool:
        """A person's message for a running agent, read at its next step; False if it ended."""
        if run.status != "running":
            return False
        run.inbox.append(text)
        return True

    async def shutdown(self) -> None:
        await self.stop([run for runs in self._runs.values() for run in runs])

    async def resume(
        self,
        lost: Sequence[tuple[str, Any]],
        undelivered: Sequence[tuple[str, Any]],
        notify: Callable[[str, str], Awaitable[None]],
    ) -> None:
        """After a restart: runs a dead process left running are lost (each conversation is told
        once), and reports that finished without reaching their conversation are delivered."""
        await self._store.mark_runs_lost([row.id for _, row in lost])
        for place, row in lost:
            await notify(
                place,
                f"Sub-agent {row.name} ({row.key}) was lost when Kaiwa restarted; ask again if "
                "you still need its work.",
            )
        for place, row in undelivered:
            assert row.id is not None
            platform = place.partition(":")[0]  # every place is `<platform>:...`
            run = Run(row.id, row.key, row.name, row.profile, row.model, row.task, place, platform)
            run.status, run.report, run.ended = row.status, row.report or "", time.monotonic()
            run.finished.set()
            self._runs.setdefault(place, []).append(run)
            self.wake(run.platform, place)

    # -- the tools -----------------------------------------------------------------------------

    def _delegate_tool(
        self,
        place: str,
        platform: str,
        parent: Any,
        started: Callable[[], Awaitable[tuple[int, int]]],
    ) -> Tool:
        menu = "; ".join(
            f"{name}: {self._profile(parent, name).description or 'no description'}"
            for name in _choices(parent)
        )

        async def delegate(tasks: list[dict[str, Any]]) -> str:
            refusal = self._refusal(place, parent, tasks)
            if refusal:
                return refusal
            grants = await self._granted(parent, tasks)
            conversation_id, turn_id = await started()
            launched = await self._launch(
                place, platform, conversation_id, turn_id, tasks, parent, grants
            )
            lines = [f"- {run.label()} on {run.model}{_why(run)}: {run.task}" for run in launched]
            return (
                f"Launched {len(launched)} {plural(len(launched), 'sub-agent')}:\n"
                + "\n".join(lines)
                + "\nThey work on their own. Answer the person now; collect the reports with "
                "agent_wait when you need them (each also reaches this conversation by itself "
                "when it is done)."
            )

        return Tool(
            name="delegate",
            description=(
                "Hand self-contained tasks to sub-agents, which work on their own and report "
                f"back later. Returns at once with their ids. Profiles: {menu}."
            ),
            function=delegate,
            parameters={
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
                                "kind": {
                                    "type": "string",
                                    "enum": ["extract", "format", "analyze", "other"],
                                },
                            },
                            "required": ["profile", "instruction"],
                        },
                    }
                },
                "required": ["tasks"],
            },
        )

    async def _granted(self, delegator: Any, tasks: list[dict[str, Any]]) -> list[frozenset[str]]:
        """Ask once, before any starts, for the tools needing approval that these tasks would
        have; each task's grant. `ApprovalDenied` when the person says no, and nothing is
        launched."""
        approvals = self.approvals
        if approvals is None:
            return [frozenset()] * len(tasks)
        grants, needs = [], []
        for task in tasks:
            profile = self._profile(delegator, task["profile"])
            tools = task.get("tools") or self._tools_of(profile)
            grant = frozenset(name for name in tools if approvals.asks(name))
            grants.append(grant)
            if grant:
                who = f"{task.get('name') or _excerpt(task['instruction'])} ({task['profile']})"
                needs.append(f"{who} use {', '.join(sorted(grant))}")
        if needs:
            await approvals.grant("; ".join(needs))
        return grants

    def _wait_tool(self, place: str, claims: Claims) -> Tool:
        @tool()
        async def agent_wait(ids: list[str] | None = None, timeout_s: float = 30.0) -> str:
            """Wait up to timeout_s seconds for sub-agents (ids or names; all of this
            conversation's if none) and return the reports that are ready."""
            wanted = [
                run
                for run in self._runs.get(place, [])
                if not ids or any(run.matches(each) for each in ids)
            ]
            waiting = [run.finished.wait() for run in wanted if run.status == "running"]
            if waiting:
                futures = [asyncio.ensure_future(each) for each in waiting]
                await asyncio.wait(futures, timeout=max(0.0, timeout_s))
                for future in futures:
                    future.cancel()
            ready = [run for run in wanted if _deliverable(run)]
            for run in ready:
                run.claimed = True
            claims.runs += ready
            parts = [format_report(run) for run in ready]
            running = [run.label() for run in wanted if run.status == "running"]
            if running:
                parts.append(f"Still running: {', '.join(running)}")
            return "\n\n".join(parts) or "No sub-agent reports are waiting."

        return agent_wait

    def _refusal(
        self, place: str, parent: Any, tasks: list[dict[str, Any]], *, nested: bool = False
    ) -> str | None:
        """Why these tasks cannot be launched, with what to do instead; None if they can."""
        caps = self.settings
        runs = self._runs.get(place, [])
        running = sum(run.status == "running" for run in runs)
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
        everywhere = sum(run.status == "running" for each in self._runs.values() for run in each)
        if everywhere + len(tasks) > caps.max_running:
            return (
                f"Kaiwa is running {everywhere} sub-agents across its conversations, its limit "
                f"being {caps.max_running}: do the work yourself, or delegate later."
            )
        if len(runs) + len(tasks) > caps.max_total:
            return (
                f"This conversation has had {len(runs)} of its {caps.max_total} sub-agents; do "
                "the rest of the work yourself."
            )
        for task in tasks:
            profile = self._profile(parent, task["profile"])
            if profile is None:
                return (
                    f"'{task['profile']}' is not a profile you may delegate to; choose one of: "
                    f"{', '.join(_choices(parent))}."
                )
            offered = self._tools_of(profile)
            outside = sorted(set(task.get("tools") or ()) - set(offered))
            if outside:
                return (
                    f"{task['profile']} may not use {', '.join(outside)}; a task may only narrow "
                    f"its profile's tools ({', '.join(offered) or 'none'})."
                )
        return None

    async def _launch(
        self,
        place: str,
        platform: str,
        conversation_id: int,
        turn_id: int | None,
        tasks: list[dict[str, Any]],
        delegator: Any,
        grants: Sequence[frozenset[str]],
        parent: Run | None = None,
    ) -> list[Run]:
        """Start a run per task; `grants`: the tools needing approval each may use."""
        runs = self._runs.setdefault(place, [])
        names: list[str] = [run.name for run in runs]
        specs, routes = [], []
        for task in tasks:
            names.append(slug(task.get("name") or task["instruction"], names))
            profile = self._profile(delegator, task["profile"])
            offered = self._tools_of(profile)
            tools = [offered[name] for name in task.get("tools") or offered]
            routed = self.settings.routing.route(task.get("kind", ""), task["instruction"], tools)
            model, why = routed or (profile.model, "")
            routes.append(why)
            specs.append(RunStart(names[-1], task["profile"], model, task["instruction"]))
        parent_id = parent.row_id if parent is not None else None
        stored = await self._store.start_runs(conversation_id, turn_id, specs, parent_id)
        launched = []
        started = zip(specs, tasks, routes, grants, stored, strict=True)
        for spec, task, why, grant, (row_id, key) in started:
            run = Run(row_id, key, spec.name, spec.profile, spec.model, spec.task, place, platform)
            run.conversation_id, run.parent, run.route = conversation_id, parent, why
            run.granted = grant
            chosen = self._profile(delegator, spec.profile)
            profile = dataclasses.replace(chosen, model=spec.model)
            offered = self._tools_of(profile)
            allowed = set(task.get("tools") or offered)
            tools = {name: each for name, each in offered.items() if name in allowed}
            if profile.delegates_to and self._depth(run) < self.settings.max_depth:
                tools["delegate"] = self._nested_delegate_tool(run, profile)
            self._show(run)
            run.worker = asyncio.create_task(self._work(run, profile, tools), name=f"{key} {place}")
            runs.append(run)
            launched.append(run)
        return launched

    def _nested_delegate_tool(self, run: Run, profile: Any) -> Tool:
        """A sub-agent's `delegate`: it waits for the runs it launches and gets their reports
        itself; if it is stopped meanwhile, they are stopped too."""

        async def delegate(tasks: list[dict[str, Any]]) -> str:
            refusal = self._refusal(run.place, profile, tasks, nested=True)
            if refusal:
                return refusal
            inherited = [run.granted] * len(tasks)  # a run never asks: its children share its grant
            children = await self._launch(
                run.place, run.platform, run.conversation_id, None, tasks, profile, inherited, run
            )
            try:
                await asyncio.gather(*(child.finished.wait() for child in children))
            except asyncio.CancelledError:
                await self.stop(children)
                raise
            for child in children:
                child.delivery = "delivered"
            ids = [child.row_id for child in children]
            not_awaited(self._store.set_delivery(ids, "delivered"), "marking reports delivered")
            return "\n\n".join(format_report(child) for child in children)

        detached = self._delegate_tool(run.place, run.platform, profile, _never)
        return Tool(
            name="delegate",
            description=(
                "Hand self-contained parts of your task to sub-agents and wait for their "
                "reports. Profiles: " + detached.description.split("Profiles: ", 1)[-1]
            ),
            function=delegate,
            parameters=detached.parameters,
        )

    def _profile(self, delegator: Any, name: str) -> Any:
        """The profile `delegator` may hand a task to under `name`, or None. `general` (unless
        configured) is the delegator itself with a generalist's prompt: its tools and model."""
        if name == GENERAL and self._profiles.named(GENERAL) is None:
            return dataclasses.replace(
                delegator,
                name=GENERAL,
                system_prompt=GENERAL_PROMPT,
                description="a generalist with your own tools, for any self-contained task",
            )
        return self._profiles.named(name) if name in delegator.delegates_to else None

    def _tools_of(self, profile: Any) -> dict[str, Tool]:
        """A profile's tools: its own, and those of the MCP servers it names."""
        served = self.mcp.tools_for(profile.mcp) if self.mcp is not None else {}
        return {**profile.tools, **served}

    @staticmethod
    def _depth(run: Run) -> int:
        depth, above = 1, run.parent
        while above is not None:
            depth, above = depth + 1, above.parent
        return depth

    # -- a run ---------------------------------------------------------------------------------

    async def _work(self, run: Run, profile: Any, tools: dict[str, Tool]) -> None:
        sink = _RunSink(self._store, run)
        messages = [
            {"role": "system", "content": profile.system_prompt + REPORT_RULE},
            {"role": "user", "content": run.task},
        ]
        sink.add("user", run.task)
        try:
            context = await self._window(profile)
            offered = {**tools, "report": _report_tool()}
            if self.approvals is not None:  # never asked mid-run: refused, unattended
                offered = self.approvals.guard(offered, self._tool_timeout)
            loop = AgentLoop(
                self._model,
                offered,
                sink,
                LoopSettings(
                    agent=profile.name,
                    model=profile.model,
                    think=profile.think,
                    max_iterations=min(profile.run_iterations, self.settings.max_iterations),
                    tool_timeout=self._tool_timeout,
                    tool_grace=self._tool_grace,
                    background=True,
                ),
                Compactor(self._model, profile.model, context, Calibration(), _no_record),
                inbox=lambda: sink.noted(_read(run)),
            )
            unattended = ToolContext(run.platform, run.place, None, "subagent", granted=run.granted)
            with called_from(unattended):
                result = await loop.run(messages)
            run.status, run.report = "done", result.answer.text
        except asyncio.CancelledError:
            run.status, run.report = "stopped", sink.said() or "(nothing yet)"
        except KaiwaError as exc:
            run.status, run.report = "failed", str(exc)
        except Exception as exc:
            logger.exception("sub-agent %s in %s failed unexpectedly", run.key, run.place)
            run.status, run.report = "failed", f"internal error ({type(exc).__name__})"
        await self._ended(run, sink)

    async def _ended(self, run: Run, sink: "_RunSink") -> None:
        run.ended, run.doing = time.monotonic(), run.status
        values = {
            "status": run.status,
            "report": run.report,
            "ended_at": utc_now(),
            "unread": len(run.inbox),
            "model_calls": run.usage.model_calls,
            "prompt_tokens": None if run.usage.unknown_calls else run.usage.prompt_tokens,
            "output_tokens": None if run.usage.unknown_calls else run.usage.output_tokens,
            "model_seconds": run.usage.seconds,
        }
        try:
            await self._store.record_run(run.row_id, values=values, durable=True)
        except StoreError as exc:
            logger.error(
                "sub-agent %s in %s: its ending could not be stored: %s", run.key, run.place, exc
            )
        logger.info(
            "sub-agent %s (%s) in %s ended %s after %d model %s",
            run.key,
            run.name,
            run.place,
            run.status,
            run.usage.model_calls,
            plural(run.usage.model_calls, "call"),
        )
        run.finished.set()
        await self._board_after(run)
        if run.parent is None and run.delivery == "pending" and not run.claimed:
            self.wake(run.platform, run.place)

    def _show(self, run: Run) -> None:
        """Put `run` on its conversation's status message (opened with the first)."""
        channel = self._channels.get(run.platform)
        if not self.settings.status_message or channel is None:
            return
        board = self._boards.get(run.place)
        if board is None:
            board = self._boards[run.place] = _Board(channel, run.place)
        board.add(run)

    async def _board_after(self, run: Run) -> None:
        board = self._boards.get(run.place)
        if board is None:
            return
        if board.running():
            board.poke()
            return
        del self._boards[run.place]
        await board.close()

    def _forget_delivered(self, place: str) -> None:
        runs = self._runs.get(place, [])
        runs[:] = [run for run in runs if run.status == "running" or run.delivery == "pending"]


class _Board:
    """The status message of one conversation's sub-agents while they run."""

    def __init__(self, channel: Channel, place: str) -> None:
        self._runs: list[Run] = []
        self._reply = channel.open_reply(place, None)
        self._pump = FramePump(
            self._reply,
            self._frame,
            _nothing_to_save,
            channel.traits.frame_interval,
            name=f"sub-agents in {place}",
        )

    def add(self, run: Run) -> None:
        self._runs.append(run)
        run.on_change = self._pump.poke
        self._pump.poke()

    def poke(self) -> None:
        self._pump.poke()

    def running(self) -> bool:
        return any(run.status == "running" for run in self._runs)

    async def close(self) -> None:
        """The last one ended: the message becomes a one-line summary."""
        await self._pump.close()
        ended = ", ".join(f"{run.name} {run.status}" for run in self._runs)
        try:
            await self._reply.finish(f"Sub-agents: {ended}.", Outcome.DONE, None)
        except Exception:
            logger.exception("the sub-agents' status message could not be finished")

    def _frame(self) -> Frame:
        now = time.monotonic()
        lines = [
            f"· {run.name} ({run.key}) · {run.doing} · {(run.ended or now) - run.started:.0f} s"
            for run in self._runs
        ]
        return Frame("Sub-agents:\n" + "\n".join(lines))


async def _nothing_to_save() -> None:
    """The status message is not a record: nothing to store before showing it."""


class _RunSink:
    """A run's loop sink: the transcript goes to the store as it happens; `/agents` reads the
    run's state from here."""

    def __init__(self, store: Store, run: Run) -> None:
        self._store = store
        self._run = run
        self._seq = 0
        self._text = ""
        self._said: list[str] = []

    def add(self, role: str, text: str, tool_name: str | None = None, calls: Any = None) -> None:
        self._seq += 1
        row = (self._seq, role, text, tool_name, calls)
        not_awaited(self._store.record_run(self._run.row_id, messages=[row]), "a sub-agent's step")

    def noted(self, notes: list[str]) -> list[str]:
        for note in notes:
            self.add("user", note)
        return notes

    def said(self) -> str:
        return "\n\n".join([*self._said, self._text] if self._text else self._said)

    def status(self, text: str) -> None:
        self._doing("waiting")

    def thinking(self, delta: str) -> None:
        self._doing("thinking")

    def text(self, delta: str) -> None:
        self._text += delta
        self._doing("writing")

    def _doing(self, doing: str) -> None:
        if self._run.doing != doing:
            self._run.doing = doing
            self._run.on_change()

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self._run.usage.add(usage)
        self._text = ""
        if message is None:
            return
        if message.text:
            self._said.append(message.text)
        calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls] or None
        self.add("assistant", message.text, calls=calls)

    def tool_started(self, call: ToolCall) -> None:
        self._run.last_tool = call.name
        self._doing(f"using {call.name}")

    def tool_finished(self, result: ToolResult) -> None:
        self._doing("thinking")
        self.add("tool", result.content, tool_name=result.call.name)


def _report_tool() -> Tool:
    @tool(final=True)
    def report(summary: str, findings: str = "") -> str:
        """Hand back your result: a short summary, and findings in detail if there are any.
        Ends your work."""
        return f"{summary}\n\n{findings}".strip()

    return report


def _read(run: Run) -> list[str]:
    notes, run.inbox = run.inbox, []
    return [f"[From the person watching] {note}" for note in notes]


def _deliverable(run: Run) -> bool:
    """A report the conversation still has to get (a nested run's goes to its parent)."""
    return (
        run.parent is None
        and run.status != "running"
        and run.delivery == "pending"
        and not run.claimed
    )


def _choices(delegator: Any) -> list[str]:
    return [*delegator.delegates_to, *([GENERAL] if GENERAL not in delegator.delegates_to else [])]


def _why(run: Run) -> str:
    return f" (routed {run.route})" if run.route else ""


async def _never() -> tuple[int, int]:
    raise AssertionError("a nested delegation knows its conversation")


def _no_record(compaction: Compaction) -> None:
    """A run's compactions change only its own context; its transcript keeps every message."""


def _excerpt(instruction: str) -> str:
    """The start of a task, as a question names it."""
    return instruction if len(instruction) <= 40 else instruction[:39] + "…"
