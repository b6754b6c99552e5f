"""Scheduled tasks: a prompt that fires on its own, in the place it was asked for, as a turn.

Tasks are rows (`ScheduledTask`), and the rows are the only truth: APScheduler's
`AsyncIOScheduler` holds one job per task for the life of the process, rebuilt from the rows at
start-up, and a job only wakes `Scheduler` up: what runs is decided from the row read then (a job
whose row is gone, paused or cancelled does nothing).

Time is the task's own. A trigger (cron in the task's IANA zone, an interval, or one date-time)
is an APScheduler trigger built from the row (`trigger_of`), so a task at 09:00 Europe/Paris
fires at 09:00 local on both sides of a DST change, whatever `TZ` the process has. `next_run`
on the row is the next slot, stored in UTC.

**A slot runs at most once.** Firing claims the slot in one transaction (`Store.claim_slot`): it
moves the row's `next_run` on only if it still holds the slot read (so of two schedulers reading
the same row, one moves it), and inserts the slot's `TaskRun` under a unique (task, fire time)
index (so a slot claimed before a restart is not claimed again).
`test_two_schedulers_on_one_store_run_a_slot_once`.

**Missed slots never storm.** A firing later than `misfire_grace_seconds` (Kaiwa was down, or
busy) looks at every slot it missed: `once` runs the latest one, marked late; `skip` records it
as `missed` and runs nothing. Either way one row stands for them all (`missed_slots`), and the
next slot is the first one after now. `test_missed_slots_run_once_late` and
`test_missed_slots_are_only_recorded_when_skipped`.

**A firing is a turn like any other** (`TurnRunner.run_unattended`, provenance `schedule`): it
waits for its conversation's gate, so a busy conversation delays it; `/stop` ends that run and
keeps the schedule; a task cancelled while its firing waits for the gate is not run
(`TurnRequest.proceed`). Its reply is a new message in the stored place; an answer that is
exactly the silent marker posts nothing. A run that posts nothing at all (the place is gone)
pauses its task with that reason; `max_failures` failures in a row pause it with the last error,
said in the place. Scheduled runs cannot create, change or delete tasks: the tools refuse
anything but a person's turn (`ToolContext.attended`).
"""

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from core.agent.tools import Tool, ToolContext, calling, tool
from core.channel import Channel, Delivery
from core.cluster.owners import Owners
from core.errors import KaiwaError, StoreError
from core.store import Store
from core.store.tables import ScheduledTask, TaskRun, utc_now
from core.text import plural
from core.turns.runner import Provenance, TurnRequest, TurnRunner

logger = logging.getLogger(__name__)

POLICIES = ("once", "skip")
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
SLOTS_COUNTED = 1_000
"""Missed slots counted at most, one by one (a minutely task down for a day stops here, after
about 20 ms; the count it records is then a lower bound)."""
RETRY_SECONDS = 30.0
"""When a firing could not claim its slot (the database away), its job wakes again this soon."""
START_BATCH = 200
"""Jobs built at start-up between two yields to the event loop (a message meanwhile waits for
one batch, not for every task)."""
WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]


class TaskError(KaiwaError):
    """A task that cannot be made or changed as asked, in words that say how to fix it."""


@dataclass(frozen=True)
class ScheduleSettings:
    enabled: bool = True
    misfire_grace_seconds: float = 300.0
    """A firing later than this after its slot is a missed one (its task's policy decides)."""
    silent_marker: str = "NO_REPLY"
    max_failures: int = 3
    """Failures in a row that pause a task."""
    min_interval_seconds: int = 60
    max_tasks_per_place: int = 50


# -- triggers --------------------------------------------------------------------------------------


def aware(moment: datetime) -> datetime:
    """`moment` in UTC (SQLite gives back naive datetimes of what was stored in UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def zone_named(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TaskError(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Paris, "
            "America/New_York or UTC"
        ) from exc


def machine_zone() -> str:
    from tzlocal import get_localzone_name  # APScheduler's own dependency

    return get_localzone_name() or "UTC"


def trigger_of(task: ScheduledTask) -> BaseTrigger:
    """The task's trigger, read in its own zone."""
    zone = zone_named(task.timezone)
    if task.cron:
        return cron_trigger(task.cron, zone)
    if task.interval_seconds:
        start = aware(task.created_at) + timedelta(seconds=task.interval_seconds)
        return IntervalTrigger(seconds=task.interval_seconds, start_date=start, timezone=zone)
    assert task.run_at is not None
    return DateTrigger(run_date=aware(task.run_at), timezone=zone)


def cron_trigger(expression: str, zone: ZoneInfo) -> CronTrigger:
    fields = expression.split()
    if len(fields) != 5:
        raise TaskError(
            f"cron {expression!r} needs five fields: minute hour day-of-month month day-of-week "
            '("0 9 * * 1-5" is 09:00 on weekdays)'
        )
    try:
        return CronTrigger.from_crontab(expression, timezone=zone)
    except ValueError as exc:
        raise TaskError(f"cron {expression!r} is not valid: {exc}") from exc


def next_slot(trigger: BaseTrigger, after: datetime) -> datetime | None:
    """The first slot strictly after `after` (UTC), or None when there is none (a date past).

    A cron time the clocks go through twice (02:30 on the night summer time ends) is one slot,
    the first; a time they skip (02:30 on the night it starts) comes an hour later, once."""
    following = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    while following is not None and isinstance(trigger, CronTrigger) and _second_pass(following):
        following = trigger.get_next_fire_time(None, aware(following) + timedelta(microseconds=1))
    if following is None or aware(following) <= after:  # a date trigger's date, already past
        return None
    return aware(following)


def _second_pass(moment: datetime) -> bool:
    """`moment` is the second time its zone's clocks show its wall time (the repeated hour)."""
    local = aware(moment).astimezone(moment.tzinfo)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def describe_schedule(task: ScheduledTask) -> str:
    """The schedule in words, with the cron itself where there is one."""
    if task.interval_seconds:
        return f"every {_duration(task.interval_seconds)}"
    if task.run_at is not None:
        return f"once, {_local(aware(task.run_at), task.timezone)}"
    assert task.cron is not None
    return f"{_cron_words(task.cron)} ({task.cron})"


def _cron_words(cron: str) -> str:
    minute, hour, day, month, weekday = cron.split()
    if not (minute.isdigit() and day == "*" and month == "*"):
        return "cron"
    if hour == "*" and weekday == "*":
        return f"every hour at :{int(minute):02d}"
    if not hour.isdigit():
        return "cron"
    at = f"{int(hour):02d}:{int(minute):02d}"
    days = {"*": "every day", "1-5": "every weekday", "0,6": "every weekend day"}
    if weekday in days:
        return f"{days[weekday]} at {at}"
    if weekday.isdigit() and int(weekday) <= 7:
        return f"every {WEEKDAYS[int(weekday) % 7]} at {at}"
    return "cron"


def _duration(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {plural(count, unit)}" if count != 1 else unit
    return f"{seconds} s"


def _local(moment: datetime, zone: str) -> str:
    return moment.astimezone(zone_named(zone)).strftime("%a %d %b %Y %H:%M %Z")


def describe_tasks(tasks: list[ScheduledTask]) -> str:
    """How many tasks are scheduled, paused, and the next firing (`kaiwa check`)."""
    live = [task for task in tasks if task.enabled and task.next_run is not None]
    paused = sum(not task.enabled for task in tasks)
    if not live:
        return f"no scheduled task ({paused} paused)" if paused else "no scheduled task"
    first = min(live, key=lambda task: aware(task.next_run or utc_now()))
    assert first.next_run is not None
    return (
        f"{len(live)} scheduled {plural(len(live), 'task')} ({paused} paused); the next fires "
        f"{_local(aware(first.next_run), first.timezone)}: #{first.id} {first.name} in "
        f"{first.place}"
    )


# -- what a task is made of ------------------------------------------------------------------------


@dataclass(frozen=True)
class When:
    """A schedule as asked for: exactly one of `cron`, `every_minutes`, `at` (local time)."""

    cron: str = ""
    every_minutes: int = 0
    at: str = ""
    timezone: str = ""

    def columns(self, zone: str, now: datetime, settings: ScheduleSettings) -> dict[str, Any]:
        """The row's trigger columns; `TaskError` for a schedule that cannot be."""
        given = [bool(self.cron.strip()), self.every_minutes != 0, bool(self.at.strip())]
        if sum(given) != 1:
            raise TaskError(
                'give exactly one schedule: cron ("0 9 * * 1-5"), every_minutes (30), or at '
                '("2026-12-24 18:00", in the task\'s time zone)'
            )
        tz = zone_named(zone)
        if self.cron.strip():
            cron = " ".join(self.cron.split())
            cron_trigger(cron, tz)
            return {"cron": cron, "interval_seconds": None, "run_at": None}
        if self.every_minutes:
            seconds = self.every_minutes * 60
            if seconds < settings.min_interval_seconds:
                raise TaskError(
                    f"every_minutes must be at least {settings.min_interval_seconds // 60}"
                )
            return {"cron": None, "interval_seconds": seconds, "run_at": None}
        try:
            local = datetime.fromisoformat(self.at.strip())
        except ValueError as exc:
            raise TaskError(f"at {self.at!r} is not a date-time like 2026-12-24 18:00") from exc
        moment = aware(local.replace(tzinfo=tz) if local.tzinfo is None else local)
        if moment <= now:
            raise TaskError(f"at {self.at!r} ({_local(moment, zone)}) has already passed")
        return {"cron": None, "interval_seconds": None, "run_at": moment}


def describe_task(task: ScheduledTask, last: TaskRun | None) -> str:
    """One task as people and the model see it."""
    state = _state(task)
    next_run = f"next {_local(aware(task.next_run), task.timezone)}" if task.next_run else ""
    parts = [
        f"#{task.id} {task.name}",
        describe_schedule(task),
        task.timezone,
        next_run if task.enabled else "",
        f"last: {_last(last)}" if last else "never ran",
        state,
    ]
    return " · ".join(part for part in parts if part)


def _state(task: ScheduledTask) -> str:
    if task.cancelled_at is not None:
        return "cancelled"
    if not task.enabled:
        return f"paused: {task.paused_reason}" if task.paused_reason else "paused"
    return "done (it ran once)" if task.next_run is None else ""


def _last(run: TaskRun) -> str:
    late = " (late)" if run.late else ""
    return f"{run.outcome}{late} {aware(run.fire_time).strftime('%Y-%m-%d %H:%M UTC')}"


# -- the scheduler ---------------------------------------------------------------------------------


class Scheduler:
    """Every task's job, its firings, and the operations people and the model ask for.

    `clock` is what "now" is (tests move it by hand); `timers` false leaves APScheduler out, so
    only `fire_due` fires (tests, which never wait for a real clock)."""

    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        channels: dict[str, Channel],
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
        self._runner = runner
        self._channels = channels
        self.settings = settings
        self._clock = clock
        self._jobs = AsyncIOScheduler(timezone=UTC) if timers else None
        self._wanted: dict[int, datetime] = {}
        """Tasks whose slots fire (enabled, not cancelled), each with its next slot."""
        self._cancelled: set[int] = set()
        """Tasks cancelled by this process: a firing waiting for its gate asks."""
        self._firings: set[asyncio.Task[None]] = set()
        self.handed_over = asyncio.Event()
        """Set each time a firing has queued its turn (a handshake for tests)."""
        self._owners: Owners | None = None

    def serve_cluster(self, owners: Owners) -> None:
        """One of several workers: every worker's scheduler follows every task (a change made
        on one is announced to the others), a slot is still claimed once (the store's unique
        run), and its turn runs on the worker that owns the task's conversation."""
        self._owners = owners
        owners.run_firing = self._run_forwarded
        owners.task_changed = self._reload

    async def _announce(self, task: ScheduledTask) -> None:
        if self._owners is not None and task.id is not None:
            await self._owners.announce_task(task.id)

    async def _reload(self, task_id: int) -> None:
        """A task changed on another worker: follow its row."""
        task = await self._store.task(task_id)
        if task is None:
            self._untrack(task_id)
        else:
            self._track(task)

    @property
    def default_zone(self) -> str:
        return self._zone or machine_zone()

    def now(self) -> datetime:
        return self._clock()

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> int:
        """Build a job per task from the rows, then fire what came due while Kaiwa was down
        (runs a dead process left under way end `interrupted`; their turns are recovery's).
        Returns how many tasks are scheduled. In a cluster, the runs a dead worker left are its
        conversations' new owners' to close (`core.cluster.owners`): another worker's are live."""
        interrupted = 0 if self._owners else await self._store.close_unfinished_task_runs()
        if interrupted:
            logger.warning(
                "%d scheduled %s cut short by the last stop marked interrupted",
                interrupted,
                plural(interrupted, "run was", "runs were"),
            )
        if self._jobs is not None:
            self._jobs.start()
        for index, task in enumerate(await self._store.tasks(), start=1):
            self._track(task)
            if index % START_BATCH == 0:
                await asyncio.sleep(0)
        self.fire_due()
        return len(self._wanted)

    def stop(self) -> None:
        """No more firings (before the turn runner shuts down); running ones go on."""
        if self._jobs is not None and self._jobs.running:
            self._jobs.shutdown(wait=False)

    async def settled(self) -> None:
        """Until every firing under way has stored how it ended."""
        while self._firings:
            await asyncio.gather(*list(self._firings), return_exceptions=True)

    def jobs(self) -> dict[int, datetime | None]:
        """Each task's job and the next time it wakes (None without timers)."""
        if self._jobs is None:
            return dict.fromkeys(sorted(self._wanted))
        return {int(job.id): aware(job.next_run_time) for job in self._jobs.get_jobs()}

    # -- firing ----------------------------------------------------------------------------------

    def fire_due(self) -> list[asyncio.Task[None]]:
        """Fire every task whose slot has come (at start-up; tests call it after moving the
        clock). Returns the firings started."""
        now = self._clock()
        due = sorted(task_id for task_id, slot in self._wanted.items() if slot <= now)
        return [self._fire_task(task_id) for task_id in due]

    def _fire_task(self, task_id: int, *, now: bool = False) -> "asyncio.Task[None]":
        firing = asyncio.create_task(self._fire(task_id, now=now), name=f"task {task_id}")
        self._firings.add(firing)
        firing.add_done_callback(self._firings.discard)
        return firing

    async def _woken(self, task_id: int) -> None:
        """APScheduler's job: fire, without waiting for the run (so the job ends at once)."""
        self._fire_task(task_id)

    async def _fire(self, task_id: int, *, now: bool = False) -> None:
        """Claim the task's due slot, if it has one, and run it. Never raises (invariant 6).
        Whatever happens, the task's job is armed again before the run: at its next slot, or,
        when the slot could not be claimed, `RETRY_SECONDS` from now."""
        try:
            task = await self._store.task(task_id)
            if task is None or task.cancelled_at is not None or task_id in self._cancelled:
                return
            if not now and not (task.enabled and task_id in self._wanted):
                return
            claimed = await (self._claim_now(task) if now else self._claim_due(task))
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
            if self._owners is not None and not await self._owners.runs_here(task.place):
                firing = {"task": task.id, "run": run_id, "slot": slot.isoformat(), "late": late}
                await self._owners.forward_firing(task.place, firing)
                return
            await self._run(task, run_id, slot, late)
        except StoreError as exc:
            logger.error("task %d: how its run ended could not be stored: %s", task.id, exc)
        except Exception:
            logger.exception("task %d: its run failed unexpectedly", task.id)

    async def _run_forwarded(self, firing: dict[str, Any]) -> None:
        """A slot another worker claimed, for a conversation this one owns."""
        task = await self._store.task(int(firing["task"]))
        if task is not None:
            slot = datetime.fromisoformat(str(firing["slot"]))
            run = self._run_safely(task, int(firing["run"]), slot, bool(firing["late"]))
            running = asyncio.ensure_future(run)
            self._firings.add(running)
            running.add_done_callback(self._firings.discard)
            await running

    def _retry(self, task_id: int, error: Exception) -> None:
        if isinstance(error, StoreError):
            logger.error("task %d: its slot could not be claimed: %s", task_id, error)
        else:
            logger.error("task %d: firing failed unexpectedly", task_id, exc_info=error)
        if task_id in self._wanted:
            self._arm(task_id, self._clock() + timedelta(seconds=RETRY_SECONDS))

    async def _claim_due(self, task: ScheduledTask) -> tuple[int, datetime, bool] | None:
        """The due slot claimed (run id, slot, late), or None: not due, claimed before, or
        missed and skipped (recorded so)."""
        assert task.id is not None
        if task.next_run is None:
            self._untrack(task.id)
            return None
        now, first = self._clock(), aware(task.next_run)
        if first > now:  # woken before its slot (the row changed meanwhile)
            self._track(task)
            return None
        trigger = trigger_of(task)
        latest, count = first, 1
        while count < SLOTS_COUNTED:
            following = next_slot(trigger, latest)
            if following is None or following > now:
                break
            latest, count = following, count + 1
        late = (now - latest).total_seconds() > self.settings.misfire_grace_seconds
        skipped = late and task.misfire == "skip"
        upcoming = next_slot(trigger, now)
        run = {
            "late": late,
            "missed_slots": count - 1 if not skipped else count,
            "outcome": "missed" if skipped else "running",
            "started_at": now,
            "finished_at": now if skipped else None,
        }
        run_id = await self._store.claim_slot(task.id, latest, run, (first, upcoming))
        if run_id is None:  # another scheduler moved it on: follow the row
            moved = await self._store.task(task.id)
            if moved is None:
                self._untrack(task.id)
            else:
                self._track(moved)
            return None
        self._track(task.model_copy(update={"next_run": upcoming}))
        if skipped:
            logger.info(
                "task %d: %d %s missed while Kaiwa was down; skipped (its policy)",
                task.id,
                count,
                plural(count, "slot"),
            )
            return None
        return run_id, latest, late

    async def _claim_now(self, task: ScheduledTask) -> tuple[int, datetime, bool] | None:
        now = self._clock().replace(microsecond=0)
        assert task.id is not None
        run = {"late": False, "missed_slots": 0, "outcome": "running", "started_at": now}
        run_id = await self._store.claim_slot(task.id, now, run)
        return None if run_id is None else (run_id, now, False)

    async def _run(self, task: ScheduledTask, run_id: int, slot: datetime, late: bool) -> None:
        assert task.id is not None
        task_id = task.id
        workflow = self._runner.workflow_of(task.prompt) is not None
        request = TurnRequest(  # a workflow's command (`/plan …`) is run as it is, never silent
            platform=task.platform,
            place=task.place,
            text=task.prompt if workflow else self._prompt(task, slot, late),
            provenance=Provenance.SCHEDULE,
            author=f"task #{task_id}",
            proceed=lambda: task_id not in self._cancelled,
            silent_marker=None if workflow else self.settings.silent_marker,
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
            self._untrack(task_id)
        finished = {
            "outcome": outcome,
            "error": error,
            "turn_id": result.turn_id,
            "finished_at": self._clock(),
        }
        await self._store.finish_task_run(run_id, finished, task_id, changes)
        logger.info("task %d (%s) ran: %s", task_id, task.place, outcome)
        if pause is not None:
            logger.warning("task %d in %s paused: %s", task_id, task.place, pause)
            if outcome == "failed":
                await self._tell(task, f"⚠️ Task #{task_id} {task.name} is paused: {pause}")

    def _pause_reason(
        self, task_id: int, outcome: str, error: str | None, failures: int
    ) -> str | None:
        if outcome == "undeliverable":
            return f"{error}; /tasks resume {task_id} once the bot can post there again"
        if outcome == "failed" and failures >= self.settings.max_failures:
            return f"{failures} failures in a row, the last: {error}"
        return None

    def _prompt(self, task: ScheduledTask, slot: datetime, late: bool) -> str:
        when = _local(slot, task.timezone)
        lateness = f"; late: Kaiwa was down at {when}, and this runs now" if late else ""
        return (
            f"[Scheduled task #{task.id} {task.name}, for {when}{lateness}. Nobody asked just "
            f"now; if there is nothing worth posting, answer exactly "
            f"{self.settings.silent_marker}.]\n{task.prompt}"
        )

    async def _tell(self, task: ScheduledTask, text: str) -> None:
        channel = self._channels.get(task.platform)
        if channel is None:
            return
        try:
            await channel.notify(task.place, text)
        except Exception as exc:
            logger.warning("task %s: could not tell %s: %s", task.id, task.place, exc)

    # -- jobs ------------------------------------------------------------------------------------

    def _track(self, task: ScheduledTask) -> None:
        """Keep `task` runnable and its job in step with its row (`next_run` the row's or the
        one just claimed)."""
        assert task.id is not None
        if not task.enabled or task.cancelled_at is not None or task.next_run is None:
            self._untrack(task.id)
            return
        slot = aware(task.next_run)
        self._wanted[task.id] = slot
        self._arm(task.id, slot)

    def _untrack(self, task_id: int) -> None:
        self._wanted.pop(task_id, None)
        if self._jobs is not None:
            with contextlib.suppress(Exception):  # no job: nothing to remove
                self._jobs.remove_job(str(task_id))

    def _arm(self, task_id: int, at: datetime) -> None:
        """The task's job wakes at `at` (a one-off: each wake arms the next)."""
        if self._jobs is None:
            return
        self._jobs.add_job(
            self._woken,
            trigger=DateTrigger(run_date=at, timezone=UTC),
            args=[task_id],
            id=str(task_id),
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,
        )

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
        columns = when.columns(zone, now, self.settings)
        values = {
            "platform": context.platform,
            "place": context.place,
            "agent": agent,
            "name": _slug(name or prompt),
            "prompt": prompt.strip(),
            "timezone": zone,
            "misfire": misfire,
            "enabled": True,
            "consecutive_failures": 0,
            "created_by": context.person or "",
            "created_at": now,
            **columns,
        }
        probe = ScheduledTask.model_construct(**values)
        values["next_run"] = next_slot(trigger_of(probe), now)
        task = await self._store.create_task(values)
        self._track(task)
        await self._announce(task)
        logger.info("task %d created in %s: %s", task.id, task.place, describe_schedule(task))
        return task

    async def listing(self, place: str) -> list[str]:
        lines = []
        for task in await self._store.tasks(place):
            assert task.id is not None
            runs = await self._store.task_runs(task.id, 1)
            lines.append(describe_task(task, runs[0] if runs else None))
        return lines

    async def find(self, place: str, wanted: str) -> ScheduledTask | None:
        """The task of `place` with id (`3`, `#3`) or name `wanted`."""
        key = wanted.strip().removeprefix("#")
        for task in await self._store.tasks(place):
            if str(task.id) == key or task.name == key:
                return task
        return None

    async def pause(self, task: ScheduledTask, reason: str = "") -> None:
        assert task.id is not None
        await self._store.update_task(task.id, {"enabled": False, "paused_reason": reason or None})
        self._untrack(task.id)
        await self._announce(task)

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
        self._track(resumed)
        await self._announce(task)
        return resumed

    async def cancel(self, task: ScheduledTask) -> None:
        """Never fires again, not even a firing already waiting for its conversation."""
        assert task.id is not None
        self._cancelled.add(task.id)
        self._untrack(task.id)
        await self._store.update_task(task.id, {"enabled": False, "cancelled_at": self._clock()})
        await self._announce(task)

    async def update(self, task: ScheduledTask, changes: dict[str, Any]) -> ScheduledTask:
        assert task.id is not None
        changed = task.model_copy(update=changes)
        if {"cron", "interval_seconds", "run_at", "timezone"} & changes.keys():
            changes["next_run"] = next_slot(trigger_of(changed), self._clock())
            changed = task.model_copy(update=changes)
        await self._store.update_task(task.id, changes)
        self._track(changed)
        await self._announce(task)
        return changed

    def run_now(self, task: ScheduledTask) -> None:
        """An extra run at once, its slot now; the schedule goes on as it was."""
        assert task.id is not None
        self._fire_task(task.id, now=True)


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words[:5])[:60] or "task"


# -- the model's tools -----------------------------------------------------------------------------


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
            changes["name"] = _slug(name)
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
        scheduler.run_now(stored)
        return f"Task #{stored.id} {stored.name} runs now; its answer follows in this conversation."

    return [
        schedule_task,
        list_tasks,
        update_task,
        pause_task,
        resume_task,
        cancel_task,
        run_task_now,
    ]
