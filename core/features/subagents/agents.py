"""Sub-agents as a part of every turn: runs launched, reported back exactly once, stopped.

Exactly once: a finished report stays `pending` (stored) until a turn of its conversation that
carried it has stored its records. A turn carries the reports it collected with `agent_wait`,
or those waiting when it opens (above its message, `Share.carried`); when the conversation is
idle, a finished run asks for a turn of its own (provenance `subagent`, `TurnParts.carry`) that
finds its report then, and does nothing if another turn took it meanwhile. A turn that fails
leaves its reports pending. Claims live in memory; the store keeps the state across restarts.

Stops: `/agents stop` stops one (and its children); `/stop`, `/new` and shutdown stop all of a
conversation's (or the process's) at once, sharing one grace window. `/new` discards
undelivered reports. After a restart, runs a dead process left running are `lost`: their
conversation is told once, and what each had written is its report, carried by the next turn
(as a stopped run's partial report is); finished reports that never reached their conversation
are delivered.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from core.agent.context import ContextSettings
from core.agent.loop import ChatModel
from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.channel import Channel
from core.features.subagents.board import Boards
from core.features.subagents.delegation import (
    Counts,
    Tasks,
    delegate_tool,
    granted,
    launched,
    menu,
    profile_for,
    refusal,
    total_refusal,
    wait_tool,
)
from core.features.subagents.routing import CHEAP_TIERS, RoutingSettings
from core.features.subagents.runs import Claims, Run, SubagentSettings, format_report, slug
from core.features.subagents.work import Workbench, work
from core.store import RunStart, Store, not_awaited
from core.store.tables import SubagentMessage, SubagentRun
from core.text import plural
from core.turns.parts import Leftover, OpenTurn, Part, Places, Share, TurnParts
from core.turns.turn import Provenance, TurnSettings

logger = logging.getLogger(__name__)


class Subagents(Part):
    def __init__(
        self,
        store: Store,
        model: ChatModel,
        turns: TurnSettings,
        settings: SubagentSettings,
        window: Callable[[AgentProfile], Awaitable[ContextSettings]],
        parts: TurnParts,
        channels: Mapping[str, Channel],
    ) -> None:
        self._store = store
        self._profiles = turns
        self.settings = settings
        self._parts = parts
        self._bench = Workbench(
            store,
            model,
            window,
            parts,
            turns.tool_timeout,
            turns.tool_grace,
            settings.max_iterations,
        )
        self._boards = Boards(channels, settings.status_message)
        self._runs: dict[str, list[Run]] = {}

    # -- a turn's share ------------------------------------------------------------------------

    def joined(self, turn: OpenTurn) -> Share:
        """Reports no turn has carried yet, above the turn's message; `delegate` and
        `agent_wait` for an agent that delegates."""
        place, agent = turn.request.place, turn.agent
        claims = Claims()
        carried = [format_report(run) for run in claims.take(self._runs.get(place, []))]
        tools: dict[str, Tool] = {}
        if agent.delegates_to:
            delegating = partial(self._delegate, turn, agent)
            tools["delegate"] = delegate_tool(menu(self._profiles, agent), delegating)
            tools["agent_wait"] = wait_tool(partial(self._collect, place, claims))
        return Share(tools, carried, partial(self._settle, claims))

    def _settle(self, claims: Claims, stored: bool) -> None:
        """The turn carrying `claims` has ended: its reports are delivered if its records are
        stored, else they wait for the next turn."""
        if not claims.runs:
            return
        for run in claims.runs:
            run.claimed = False
            if stored:
                run.delivery = "delivered"
        if stored:
            ids = [run.row_id for run in claims.runs]
            not_awaited(self._store.set_delivery(ids, "delivered"), "marking reports delivered")
        self._forget_delivered(claims.runs[0].place)

    # -- what commands see and do -----------------------------------------------------------------

    def live(self, place: str) -> list[Run]:
        return list(self._runs.get(place, []))

    def find(self, place: str, wanted: str) -> Run | None:
        return next((run for run in self._runs.get(place, []) if run.matches(wanted)), None)

    def tell(self, run: Run, text: str, who: str) -> bool:
        """A message from `who` (a person's name) for a running agent, read at its next step;
        False if it ended."""
        if run.status != "running":
            return False
        run.inbox.append(f"[From {who}, watching] {text}")
        return True

    async def stop_runs(self, runs: Sequence[Run]) -> None:
        """Stop `runs`, each reporting what it has, all within one grace window."""
        workers = [run.worker for run in runs if run.worker is not None and run.status == "running"]
        for worker in workers:
            worker.cancel()
        if workers:
            await asyncio.wait(workers, timeout=self.settings.stop_grace)

    # -- the part's life -----------------------------------------------------------------------

    async def stop(self, place: str) -> str:
        running = [run for run in self._runs.get(place, []) if run.status == "running"]
        await self.stop_runs(running)
        count = len(running)
        return (
            f"Stopped {count} {plural(count, 'sub-agent')}; their reports follow." if count else ""
        )

    async def forget(self, place: str) -> None:
        """The conversation's runs stop and their undelivered reports are dropped."""
        runs = self._runs.pop(place, [])
        for run in runs:
            run.delivery = "discarded"
        await self.stop_runs(runs)
        ids = [run.row_id for run in runs if run.status != "running"]
        if ids:
            not_awaited(self._store.set_delivery(ids, "discarded"), "discarding reports")

    async def shutdown(self) -> Mapping[int, str]:
        await self.stop_runs([run for runs in self._runs.values() for run in runs])
        return {}

    async def left_over(self, place: str | None) -> Leftover | None:
        lost = await self._store.live_runs(place)
        undelivered = await self._store.undelivered_reports(place)
        if not (lost or undelivered):
            return None
        return Leftover(partial(self._resume, lost, undelivered))

    async def _resume(
        self,
        lost: Sequence[tuple[str, SubagentRun]],
        undelivered: Sequence[tuple[str, SubagentRun]],
        places: Places,
    ) -> None:
        """Runs a dead process left running are lost: each conversation is told, and what a
        run had written becomes its report, carried by the conversation's next turn (the person
        decides whether to ask again; nothing starts by itself). Reports that finished without
        reaching their conversation are delivered, by a turn of their own."""
        for place, row in lost:
            assert row.id is not None
            report = _written(await self._store.transcript(row.id))
            top_level = row.parent_run_id is None
            await self._store.mark_run_lost(row.id, report, deliver=top_level)
            if top_level:
                self._held(Run.read_back(place, row, status="lost", report=report))
            await places.say(
                place,
                f"Sub-agent {row.name} ({row.key}) was lost when Kaiwa restarted; ask again if "
                "you still need its work.",
            )
        for place, row in undelivered:
            run = self._held(Run.read_back(place, row))
            if run.status != "lost":  # a lost one's report waits for the person's next turn
                self._carry(run)

    def _held(self, run: Run) -> Run:
        self._runs.setdefault(run.place, []).append(run)
        return run

    # -- delegating ----------------------------------------------------------------------------

    async def _delegate(self, turn: OpenTurn, parent: AgentProfile, tasks: Tasks) -> str:
        place = turn.request.place
        conversation_id, turn_id = await turn.ids()
        why_not = await self._refusal(place, conversation_id, parent, tasks)
        if why_not:
            return why_not
        grants = await granted(self._parts.guard, tasks, partial(self._tools_of, parent))
        where = (conversation_id, turn_id)
        runs = await self._launch(place, turn.request.platform, where, tasks, parent, grants)
        return launched(runs) if runs is not None else await self._full(conversation_id)

    async def _delegate_nested(self, run: Run, profile: AgentProfile, tasks: Tasks) -> str:
        """A sub-agent's `delegate`: it waits for the runs it launches and gets their reports
        itself; if it is stopped meanwhile, they are stopped too."""
        why_not = await self._refusal(run.place, run.conversation_id, profile, tasks, nested=True)
        if why_not:
            return why_not
        inherited = [run.granted] * len(tasks)  # a run never asks: its children share its grant
        where = (run.conversation_id, None)
        children = await self._launch(
            run.place, run.platform, where, tasks, profile, inherited, run
        )
        if children is None:
            return await self._full(run.conversation_id)
        try:
            await asyncio.gather(*(child.finished.wait() for child in children))
        except asyncio.CancelledError:
            await self.stop_runs(children)
            raise
        for child in children:
            child.delivery = "delivered"
        ids = [child.row_id for child in children]
        not_awaited(self._store.set_delivery(ids, "delivered"), "marking reports delivered")
        return "\n\n".join(format_report(child) for child in children)

    async def _collect(
        self, place: str, claims: Claims, ids: list[str] | None, timeout_s: float
    ) -> str:
        """`agent_wait`: the reports of the runs asked for, waiting up to `timeout_s`."""
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
        parts = [format_report(run) for run in claims.take(wanted)]
        running = [run.label() for run in wanted if run.status == "running"]
        if running:
            parts.append(f"Still running: {', '.join(running)}")
        return "\n\n".join(parts) or "No sub-agent reports are waiting."

    async def _refusal(
        self,
        place: str,
        conversation_id: int,
        delegator: AgentProfile,
        tasks: Tasks,
        *,
        nested: bool = False,
    ) -> str | None:
        counts = Counts(
            sum(run.status == "running" for run in self._runs.get(place, [])),
            await self._store.run_count(conversation_id),
            sum(run.status == "running" for each in self._runs.values() for run in each),
        )
        choosing = (self._profiles, delegator)
        return refusal(self.settings, counts, tasks, choosing, self._parts.tools_for, nested=nested)

    async def _full(self, conversation_id: int) -> str:
        """Another delegation took the conversation's last places while this one waited."""
        return total_refusal(self.settings, await self._store.run_count(conversation_id))

    async def _launch(
        self,
        place: str,
        platform: str,
        where: tuple[int, int | None],
        tasks: Tasks,
        delegator: AgentProfile,
        grants: Sequence[frozenset[str]],
        parent: Run | None = None,
    ) -> list[Run] | None:
        """Start a run per task, stored first under the conversation and turn (`where`);
        `grants`: the tools needing approval each may use. None, starting nothing, if the
        conversation has no room left for them (`max_total`, decided by the store)."""
        runs = self._runs.setdefault(place, [])
        names: list[str] = [run.name for run in runs]
        policy = parent.policy if parent is not None else self.settings.routing
        plans = []
        for task in tasks:
            names.append(slug(task.get("name") or task["instruction"], names))
            chosen = self._profile(delegator, task["profile"])
            offered = self._parts.tools_for(chosen)
            plans.append(planned(names[-1], task, chosen, offered, policy))
        conversation_id, turn_id = where
        parent_id = parent.row_id if parent is not None else None
        stored = await self._store.start_runs(
            conversation_id,
            turn_id,
            [plan.start for plan in plans],
            parent_id,
            max_total=self.settings.max_total,
        )
        if not stored:
            return None
        started = []
        for plan, grant, (row_id, key) in zip(plans, grants, stored, strict=True):
            run = plan.run(row_id, key, place, platform)
            run.conversation_id, run.parent, run.granted = conversation_id, parent, grant
            run.policy = policy
            tools, profile = dict(plan.tools), plan.profile
            if may_delegate(run, profile, self.settings.max_depth):
                nested = partial(self._delegate_nested, run, profile)
                tools["delegate"] = delegate_tool(menu(self._profiles, profile), nested, waits=True)
            self._boards.show(run)
            run.worker = asyncio.create_task(self._work(run, profile, tools), name=f"{key} {place}")
            runs.append(run)
            started.append(run)
        return started

    def _tools_of(self, delegator: AgentProfile, task: dict[str, Any]) -> Sequence[str]:
        """The tools a task's run would have."""
        profile = self._profile(delegator, task["profile"])
        return task.get("tools") or list(self._parts.tools_for(profile))

    def _profile(self, delegator: AgentProfile, name: str) -> AgentProfile:
        """A profile the refusal checks found: `delegator` may hand tasks to it."""
        profile = profile_for(self._profiles, delegator, name)
        assert profile is not None, "delegations are checked before they launch"
        return profile

    # -- a run's end ---------------------------------------------------------------------------

    async def _work(self, run: Run, profile: AgentProfile, tools: dict[str, Tool]) -> None:
        await work(run, profile, tools, self._bench)
        run.finished.set()
        await self._boards.ended(run)
        if run.parent is None and run.delivery == "pending" and not run.claimed:
            self._carry(run)

    def _carry(self, run: Run) -> None:
        """A turn of the run's conversation carries its report."""
        self._parts.carry(run.platform, run.place, Provenance.SUBAGENT, "sub-agents")

    def _forget_delivered(self, place: str) -> None:
        runs = self._runs.get(place, [])
        runs[:] = [run for run in runs if run.status == "running" or run.delivery == "pending"]


@dataclass(frozen=True)
class Planned:
    """A task's run as decided before it is stored: how it starts (its model, and the tier and
    reason when routing chose it), its profile on that model, and its tools (the task's
    narrowing of its profile's)."""

    start: RunStart
    profile: AgentProfile
    tools: Mapping[str, Tool]

    def run(self, row_id: int, key: str, place: str, platform: str) -> Run:
        start = self.start
        run = Run(row_id, key, start.name, start.profile, start.model, start.task, place, platform)
        run.tier, run.route = start.tier, start.route
        return run


def may_delegate(run: Run, profile: AgentProfile, max_depth: int) -> bool:
    """A run whose profile delegates gets `delegate` below the depth cap, unless routing put it
    on a cheap tier: a task routed there cannot reach broader tools or a larger model through a
    child."""
    cheap = run.tier in CHEAP_TIERS
    return bool(profile.delegates_to) and not cheap and run.depth() < max_depth


def planned(
    name: str,
    task: dict[str, Any],
    chosen: AgentProfile,
    offered: Mapping[str, Tool],
    routing: RoutingSettings,
) -> Planned:
    """The run of `task` (named `name`) on profile `chosen`, whose tools are `offered`. Its
    success criteria, when it has them, close its task, so the sub-agent reads them and its
    transcript keeps them."""
    allowed = task.get("tools") or list(offered)
    tools = {each: offered[each] for each in offered if each in allowed}
    criteria = (task.get("criteria") or "").strip()
    route = routing.route(task.get("kind") or "", task["instruction"], criteria, [*tools.values()])
    text = task["instruction"] + (f"\n\nDone when: {criteria}" if criteria else "")
    if route is None:
        start = RunStart(name, task["profile"], chosen.model, text)
    else:
        start = RunStart(name, task["profile"], route.model, text, route.tier, route.reason)
    return Planned(start, replace(chosen, model=start.model), tools)


def _written(transcript: Sequence[SubagentMessage]) -> str:
    """What a run had written to its last stored step (a reply being streamed when the process
    died was not stored)."""
    texts = [each.text for each in transcript if each.role == "assistant" and each.text]
    return "\n\n".join(texts) or "(nothing yet)"
