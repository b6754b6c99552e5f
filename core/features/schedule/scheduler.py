"""Scheduled tasks: a prompt that fires on its own, in the place it was asked for, as a turn.

Tasks are rows (`ScheduledTask`), and the rows are the only truth: a timer (`timers.Timers`)
only wakes the scheduler up, and what runs is decided from the row read then (a task whose row
is gone, paused or cancelled does nothing). The scheduler drives turns (it calls the runner,
like the dispatcher); its tools and `/tasks` are handed to the turns and the dispatcher where
Kaiwa is wired.

A slot is claimed once and run as a turn (`firing.SlotRuns`); whatever happens, the task's
timer is armed again before the run.

With several workers, every worker's scheduler follows every task (a change made on one is
announced to the others), a slot is still claimed once, and its turn runs on the worker that
owns the task's conversation (`Cluster`, which `core.cluster.owners` provides).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from core.agent.tools import ToolContext
from core.channel import Channel
from core.errors import StoreError
from core.features.schedule.firing import SlotRuns
from core.features.schedule.timers import Timers
from core.features.schedule.timing import (
    POLICIES,
    ScheduleSettings,
    TaskError,
    When,
    describe_schedule,
    describe_task,
    machine_zone,
    next_slot,
    slug,
    trigger_of,
)
from core.store import Store
from core.store.tables import ScheduledTask, utc_now
from core.text import plural
from core.turns.runner import TurnRunner

logger = logging.getLogger(__name__)

RETRY_SECONDS = 30.0
"""When a firing could not claim its slot (the database away), its timer wakes again this soon."""
START_BATCH = 200
"""Timers built at start-up between two yields to the event loop (a message meanwhile waits for
one batch, not for every task)."""
Firing = dict[str, Any]


class Cluster(Protocol):
    """The cluster's owners, as a scheduler on one of several workers uses them."""

    run_firing: Callable[[Firing], Awaitable[None]] | None
    task_changed: Callable[[int], Awaitable[None]] | None

    async def runs_here(self, place: str) -> bool: ...

    async def forward_firing(self, place: str, firing: Firing) -> None: ...

    async def announce_task(self, task_id: int) -> None: ...


class Scheduler:
    """Every task's timer, its firings, and the operations people and the model ask for.

    `clock` is what "now" is (tests move it by hand); `timers` false leaves APScheduler out, so
    only `fire_due` fires (tests, which never wait for a real clock)."""

    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        channels: Mapping[str, Channel],
        settings: ScheduleSettings,
        *,
        zone: str = "",
        clock: Callable[[], datetime] = utc_now,
        timers: bool = True,
    ) -> None:
        """`zone`: the time zone of a task that names none (`[assistant].timezone`; empty: the
        machine's)."""
        self._store = store
        self._zone = zone
        self.settings = settings
        self._clock = clock
        self._timers = Timers(self._woken, enabled=timers)
        self._cancelled: set[int] = set()
        """Tasks cancelled by this process: a firing waiting for its gate asks."""
        self._slots = SlotRuns(
            store, runner, channels, settings, clock, self._timers, self._cancelled
        )
        self.handed_over = self._slots.handed_over
        self._firings: set[asyncio.Task[None]] = set()
        self._cluster: Cluster | None = None

    def serve_cluster(self, cluster: Cluster) -> None:
        """One of several workers: follow tasks changed on the others, and run a slot on the
        worker that owns its conversation."""
        self._cluster = cluster
        cluster.run_firing = self._run_forwarded
        cluster.task_changed = self._reload

    @property
    def default_zone(self) -> str:
        return self._zone or machine_zone()

    def now(self) -> datetime:
        return self._clock()

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> int:
        """Build a timer per task from the rows, then fire what came due while Kaiwa was down
        (runs a dead process left under way end `interrupted`; their turns are recovery's).
        Returns how many tasks are scheduled. In a cluster, the runs a dead worker left are its
        conversations' new owners' to close (`firing.CutFirings`): another worker's are live."""
        interrupted = 0 if self._cluster else await self._store.close_unfinished_task_runs()
        if interrupted:
            logger.warning(
                "%d scheduled %s cut short by the last stop marked interrupted",
                interrupted,
                plural(interrupted, "run was", "runs were"),
            )
        self._timers.start()
        for index, task in enumerate(await self._store.tasks(), start=1):
            self._timers.track(task)
            if index % START_BATCH == 0:
                await asyncio.sleep(0)
        self.fire_due()
        return len(self._timers)

    def stop(self) -> None:
        """No more firings (before the turn runner shuts down); running ones go on."""
        self._timers.stop()

    async def settled(self) -> None:
        """Until every firing under way has stored how it ended."""
        while self._firings:
            await asyncio.gather(*list(self._firings), return_exceptions=True)

    def jobs(self) -> dict[int, datetime | None]:
        """Each task's timer and the next time it wakes (None without timers)."""
        return self._timers.jobs()

    # -- firing ----------------------------------------------------------------------------------

    def fire_due(self) -> list["asyncio.Task[None]"]:
        """Fire every task whose slot has come (at start-up; tests call it after moving the
        clock). Returns the firings started."""
        return [self._fire_task(task_id) for task_id in self._timers.due(self._clock())]

    async def run_now(self, task: ScheduledTask) -> bool:
        """An extra run at once, its slot this second (the schedule goes on as it was), once its
        slot is claimed; False if a run already took that slot (a second `/tasks run` within
        the same second: the first is the one running). Raises `StoreError` if the slot cannot
        be claimed."""
        claimed = await self._slots.claim_now(task)
        if claimed is None:
            return False
        self._keep(self._run_safely(task, *claimed), name=f"task {task.id}")
        return True

    def _fire_task(self, task_id: int) -> "asyncio.Task[None]":
        return self._keep(self._fire(task_id), name=f"task {task_id}")

    def _keep(self, firing: Coroutine[Any, Any, None], *, name: str) -> "asyncio.Task[None]":
        """A firing under way, kept until it ends (`settled` waits for it)."""
        task = asyncio.create_task(firing, name=name)
        self._firings.add(task)
        task.add_done_callback(self._firings.discard)
        return task

    async def _woken(self, task_id: int) -> None:
        """A timer's job: fire, without waiting for the run (so the job ends at once)."""
        self._fire_task(task_id)

    async def _fire(self, task_id: int) -> None:
        """Claim the task's due slot, if it has one, and run it. Never raises (invariant 6).
        Whatever happens, the task's timer is armed again before the run: at its next slot, or,
        when the slot could not be claimed, `RETRY_SECONDS` from now."""
        try:
            task = await self._store.task(task_id)
            if task is None or task.cancelled_at is not None or task_id in self._cancelled:
                return
            if not (task.enabled and task_id in self._timers):
                return
            claimed = await self._slots.claim_due(task)
        except Exception as exc:
            self._retry(task_id, exc)
            return
        if claimed is None:
            return
        await self._run_safely(task, *claimed)

    async def _run_safely(
        self, task: ScheduledTask, run_id: int, slot: datetime, late: bool
    ) -> None:
        """Run a claimed slot here, or on the worker owning its conversation."""
        assert task.id is not None
        try:
            if self._cluster is not None and not await self._cluster.runs_here(task.place):
                firing = {"task": task.id, "run": run_id, "slot": slot.isoformat(), "late": late}
                await self._cluster.forward_firing(task.place, firing)
                return
            if await self._slots.run(task, run_id, slot, late):
                self._timers.untrack(task.id)  # paused
        except StoreError as exc:
            logger.error("task %d: how its run ended could not be stored: %s", task.id, exc)
        except Exception:
            logger.exception("task %d: its run failed unexpectedly", task.id)

    async def _run_forwarded(self, firing: Firing) -> None:
        """A slot another worker claimed, for a conversation this one owns."""
        task = await self._store.task(int(firing["task"]))
        if task is not None:
            slot = datetime.fromisoformat(str(firing["slot"]))
            run = self._run_safely(task, int(firing["run"]), slot, bool(firing["late"]))
            await self._keep(run, name=f"task {task.id}")

    def _retry(self, task_id: int, error: Exception) -> None:
        if isinstance(error, StoreError):
            logger.error("task %d: its slot could not be claimed: %s", task_id, error)
        else:
            logger.error("task %d: firing failed unexpectedly", task_id, exc_info=error)
        if task_id in self._timers:
            self._timers.arm(task_id, self._clock() + timedelta(seconds=RETRY_SECONDS))

    # -- what people and the model ask for -------------------------------------------------------

    async def create(
        self,
        context: ToolContext,
        agent: str,
        prompt: str,
        when: When,
        *,
        name: str = "",
        misfire: str = "once",
    ) -> ScheduledTask:
        """A new task in the place of `context`; `TaskError` when it cannot be."""
        if not prompt.strip():
            raise TaskError("the task needs a prompt: what to do each time it fires")
        if misfire not in POLICIES:
            raise TaskError("if_missed must be 'once' (one late run) or 'skip'")
        if len(await self._store.tasks(context.place)) >= self.settings.max_tasks_per_place:
            raise TaskError(
                f"this conversation has {self.settings.max_tasks_per_place} tasks already; "
                "cancel one first"
            )
        zone = when.timezone.strip() or self.default_zone
        now = self._clock()
        values = {
            "platform": context.platform,
            "place": context.place,
            "agent": agent,
            "name": slug(name or prompt),
            "prompt": prompt.strip(),
            "timezone": zone,
            "misfire": misfire,
            "enabled": True,
            "consecutive_failures": 0,
            "created_by": context.person or "",
            "created_at": now,
            **when.columns(zone, now, self.settings),
        }
        probe = ScheduledTask.model_construct(**values)
        values["next_run"] = next_slot(trigger_of(probe), now)
        task = await self._store.create_task(values)
        await self._changed(task)
        logger.info("task %d created in %s: %s", task.id, task.place, describe_schedule(task))
        return task

    async def listing(self, place: str) -> list[str]:
        return [line for _, line in await self.described(place)]

    async def described(self, place: str) -> list[tuple[ScheduledTask, str]]:
        """Each task of `place`, with the line that describes it (its last run included)."""
        described = []
        for task in await self._store.tasks(place):
            assert task.id is not None
            runs = await self._store.task_runs(task.id, 1)
            described.append((task, describe_task(task, runs[0] if runs else None)))
        return described

    async def find(self, place: str, wanted: str) -> ScheduledTask | None:
        """The task of `place` with id (`3`, `#3`) or name `wanted`."""
        key = wanted.strip().removeprefix("#")
        for task in await self._store.tasks(place):
            if str(task.id) == key or task.name == key:
                return task
        return None

    async def pause(self, task: ScheduledTask, reason: str = "") -> None:
        assert task.id is not None
        changes = {"enabled": False, "paused_reason": reason or None}
        await self._store.update_task(task.id, changes)
        await self._changed(task.model_copy(update=changes))

    async def resume(self, task: ScheduledTask) -> ScheduledTask:
        """Enabled again from now on: slots passed while paused are not caught up."""
        assert task.id is not None
        upcoming = next_slot(trigger_of(task), self._clock())
        changes = {
            "enabled": True,
            "paused_reason": None,
            "consecutive_failures": 0,
            "next_run": upcoming,
        }
        await self._store.update_task(task.id, changes)
        resumed = task.model_copy(update=changes)
        await self._changed(resumed)
        return resumed

    async def cancel(self, task: ScheduledTask) -> None:
        """Never fires again, not even a firing already waiting for its conversation."""
        assert task.id is not None
        self._cancelled.add(task.id)
        self._timers.untrack(task.id)
        changes = {"enabled": False, "cancelled_at": self._clock()}
        await self._store.update_task(task.id, changes)
        await self._changed(task.model_copy(update=changes))

    async def update(self, task: ScheduledTask, changes: dict[str, Any]) -> ScheduledTask:
        assert task.id is not None
        changed = task.model_copy(update=changes)
        if {"cron", "interval_seconds", "run_at", "timezone"} & changes.keys():
            changes["next_run"] = next_slot(trigger_of(changed), self._clock())
            changed = task.model_copy(update=changes)
        await self._store.update_task(task.id, changes)
        await self._changed(changed)
        return changed

    async def _changed(self, task: ScheduledTask) -> None:
        """A task was made or changed here: its timer follows, and so do the other workers'."""
        assert task.id is not None
        self._timers.track(task)
        if self._cluster is not None:
            await self._cluster.announce_task(task.id)

    async def _reload(self, task_id: int) -> None:
        """A task changed elsewhere (another worker, another scheduler): follow its row."""
        task = await self._store.task(task_id)
        if task is None:
            self._timers.untrack(task_id)
        else:
            self._timers.track(task)
