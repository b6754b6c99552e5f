"""A task's slot claimed, run as a turn in its task's place, and how it ended stored on its run.

**A slot runs at most once.** Firing claims the slot in one transaction (`Store.claim_slot`): it
moves the row's `next_run` on only if it still holds the slot read (so of two schedulers reading
the same row, one moves it), and inserts the slot's `TaskRun` under a unique (task, fire time)
index (so a slot claimed before a restart is not claimed again).
`test_two_schedulers_on_one_store_run_a_slot_once`. Whatever happens, the task's timer is armed
again before the run.

**A firing is a turn like any other** (`TurnRunner.run_unattended`, provenance `schedule`): it
waits for its conversation's gate, so a busy conversation delays it; `/stop` ends that run and
keeps the schedule; a task cancelled while its firing waits for the gate is not run
(`TurnRequest.proceed`). Its reply is a new message in the stored place; an answer that is
exactly the silent marker posts nothing. A workflow's command (`/plan …`) is run as it is, never
silent. A run that posts nothing at all (the place is gone) pauses its task with that reason;
`max_failures` failures in a row pause it with the last error, said in the place.
"""

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from core.channel import Channel, Delivery
from core.features.schedule.timers import Timers
from core.features.schedule.timing import ScheduleSettings, aware, due, local_time
from core.metrics import SCHEDULED_FIRINGS
from core.store import Store
from core.store.tables import ScheduledTask
from core.text import plural
from core.turns.parts import Leftover, Part, Places
from core.turns.runner import TurnRunner
from core.turns.turn import CUT_FIRING, Provenance, TurnRequest

logger = logging.getLogger(__name__)


class SlotRuns:
    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        channels: Mapping[str, Channel],
        settings: ScheduleSettings,
        clock: Callable[[], datetime],
        timers: Timers,
        cancelled: set[int],
    ) -> None:
        """`cancelled`: the tasks cancelled by this process (a firing waiting for its gate
        asks)."""
        self._store = store
        self._runner = runner
        self._channels = channels
        self._settings = settings
        self._clock = clock
        self._timers = timers
        self._cancelled = cancelled
        self.handed_over = asyncio.Event()
        """Set each time a firing has queued its turn (a handshake for tests)."""

    async def claim_due(self, task: ScheduledTask) -> tuple[int, datetime, bool] | None:
        """The due slot claimed (run id, slot, late), or None: not due, claimed before, or
        missed and skipped (recorded so)."""
        assert task.id is not None
        if task.next_run is None:
            self._timers.untrack(task.id)
            return None
        now = self._clock()
        if aware(task.next_run) > now:  # woken before its slot (the row changed meanwhile)
            self._timers.track(task)
            return None
        slots = due(task, now, self._settings.misfire_grace_seconds)
        run = {
            "late": slots.late,
            "missed_slots": slots.count if slots.skipped else slots.count - 1,
            "outcome": "missed" if slots.skipped else "running",
            "started_at": now,
            "finished_at": now if slots.skipped else None,
        }
        moving = (aware(task.next_run), slots.upcoming)
        run_id = await self._store.claim_slot(task.id, slots.latest, run, moving)
        if run_id is None:  # another scheduler moved it on: follow the row
            moved = await self._store.task(task.id)
            if moved is None:
                self._timers.untrack(task.id)
            else:
                self._timers.track(moved)
            return None
        self._timers.track(task.model_copy(update={"next_run": slots.upcoming}))
        if slots.skipped:
            logger.info(
                "task %d: %d %s missed while Kaiwa was down; skipped (its policy)",
                task.id,
                slots.count,
                plural(slots.count, "slot"),
            )
            return None
        return run_id, slots.latest, slots.late

    async def claim_now(self, task: ScheduledTask) -> tuple[int, datetime, bool] | None:
        now = self._clock().replace(microsecond=0)
        assert task.id is not None
        run = {"late": False, "missed_slots": 0, "outcome": "running", "started_at": now}
        run_id = await self._store.claim_slot(task.id, now, run)
        return None if run_id is None else (run_id, now, False)

    async def run(self, task: ScheduledTask, run_id: int, slot: datetime, late: bool) -> bool:
        """Run the claimed slot and store how it ended; whether the task is paused now."""
        assert task.id is not None
        task_id = task.id
        workflow = self._runner.workflow_of(task.prompt) is not None
        request = TurnRequest(
            platform=task.platform,
            place=task.place,
            text=task.prompt if workflow else self._prompt(task, slot, late),
            provenance=Provenance.SCHEDULE,
            author=f"task #{task_id}",
            proceed=lambda: task_id not in self._cancelled,
            silent_marker=None if workflow else self._settings.silent_marker,
        )
        self.handed_over.set()  # run_unattended queues the turn before it first waits
        result = await self._runner.run_unattended(request)
        outcome, error = result.status, result.error
        if result.status == "skipped":
            outcome, error = "cancelled", "cancelled while it waited for its conversation"
        elif result.silent:
            outcome = "silent"
        elif result.delivery is Delivery.NOTHING:
            outcome = "undeliverable"
            error = "nothing could be posted in its place (removed from it, or it is gone?)"
        failures = task.consecutive_failures + 1 if outcome in ("failed", "undeliverable") else 0
        changes: dict[str, Any] = {"consecutive_failures": failures}
        pause = self._pause_reason(task_id, outcome, error, failures)
        if pause is not None:
            changes.update(enabled=False, paused_reason=pause)
        finished = {
            "outcome": outcome,
            "error": error,
            "turn_id": result.turn_id,
            "finished_at": self._clock(),
        }
        await self._store.finish_task_run(run_id, finished, task_id, changes)
        logger.info("task %d (%s) ran: %s", task_id, task.place, outcome)
        SCHEDULED_FIRINGS.labels(outcome).inc()
        if pause is not None:
            logger.warning("task %d in %s paused: %s", task_id, task.place, pause)
            if outcome == "failed":
                await self._tell(task, f"⚠️ Task #{task_id} {task.name} is paused: {pause}")
        return pause is not None

    def _pause_reason(
        self, task_id: int, outcome: str, error: str | None, failures: int
    ) -> str | None:
        if outcome == "undeliverable":
            return f"{error}; /tasks resume {task_id} once the bot can post there again"
        if outcome == "failed" and failures >= self._settings.max_failures:
            return f"{failures} failures in a row, the last: {error}"
        return None

    def _prompt(self, task: ScheduledTask, slot: datetime, late: bool) -> str:
        when = local_time(slot, task.timezone)
        lateness = f"; late: Kaiwa was down at {when}, and this runs now" if late else ""
        return (
            f"[Scheduled task #{task.id} {task.name}, for {when}{lateness}. Nobody asked just "
            f"now; if there is nothing worth posting, answer exactly "
            f"{self._settings.silent_marker}.]\n{task.prompt}"
        )

    async def _tell(self, task: ScheduledTask, text: str) -> None:
        channel = self._channels.get(task.platform)
        if channel is None:
            return
        try:
            await channel.notify(task.place, text)
        except Exception as exc:
            logger.warning("task %s: could not tell %s: %s", task.id, task.place, exc)


class CutFirings(Part):
    """The scheduled runs a dead worker left under way in a place another worker now owns: a
    turn part that closes them when the place is taken over, and says so there when no turn of
    theirs is left for recovery to tell of (a run claimed whose turn never began). A single
    process closes them all as its scheduler starts (`Scheduler.start`)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def left_over(self, place: str | None) -> Leftover | None:
        if place is None or not await self._store.close_unfinished_task_runs(place):
            return None
        turns = await self._store.unfinished_turns(place)
        if any(each.turn.provenance == Provenance.SCHEDULE for each in turns):
            return None
        return Leftover(partial(_say_cut, place))


async def _say_cut(place: str, places: Places) -> None:
    await places.say(place, CUT_FIRING)
