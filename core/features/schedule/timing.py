"""A task's time and words: triggers, slots, zones, and how a task is described.

Time is the task's own. A trigger (cron in the task's IANA zone, an interval, or one date-time)
is an APScheduler trigger built from the row (`trigger_of`), so a task at 09:00 Europe/Paris
fires at 09:00 local on both sides of a DST change, whatever `TZ` the process has. `next_run`
on the row is the next slot, stored in UTC.

**A clock change keeps what the schedule means** (`next_slot`). The hour the clocks show twice
fires twice for a task that runs by the hour (a wildcard or step in its hour field), once for
a task at a named hour; a wall time they skip comes as late as they jump, once.
`test_a_night_the_clocks_change_fires_every_slot_it_means_once`.

**Missed slots never storm.** A firing later than `misfire_grace_seconds` (Kaiwa was down, or
busy) looks at every slot it missed (`due`): `once` runs the latest one, marked late; `skip`
records it as `missed` and runs nothing. Either way one row stands for them all
(`missed_slots`), and the next slot is the first one after now.
`test_missed_slots_run_once_late` and `test_missed_slots_are_only_recorded_when_skipped`.
"""

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.cron.expressions import AllExpression
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from core.errors import KaiwaError
from core.store.tables import ScheduledTask, TaskRun, utc_now
from core.text import plural

POLICIES = ("once", "skip")
SLOTS_COUNTED = 1_000
"""Missed slots counted at most, one by one (a minutely task down for a day stops here, after
about 20 ms; the count it records is then a lower bound)."""
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

    The night the clocks go back they show an hour twice (02:00-03:00 in Europe/Berlin, CEST
    then CET). A cron task whose hour field matches that hour by a wildcard or a step (`*`,
    `*/2`, `2-23/3`) fires in both passes: every elapsed hour that matches, as cron runs `*`. One
    that names the hour (`30 2 * * *`, `1,2`, `2-4`) fires in the first pass only, once that
    night. The night they go forward, a wall time they skip (02:30) comes as late as they jump
    (03:30 CEST), once, whatever the hour field. Intervals count elapsed time: no clock change
    moves them."""
    following = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    while isinstance(trigger, CronTrigger) and following is not None:
        local = aware(following).astimezone(trigger.timezone)
        if not _second_pass(local) or _hour_by_cadence(trigger, local):
            break
        following = trigger.get_next_fire_time(None, aware(following) + timedelta(microseconds=1))
    if following is None or aware(following) <= after:  # a date trigger's date, already past
        return None
    return aware(following)


def _second_pass(local: datetime) -> bool:
    """`local` is the second time its zone's clocks show its wall time (the repeated hour)."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _hour_by_cadence(trigger: CronTrigger, local: datetime) -> bool:
    """A wildcard or a step of the trigger's hour field matches `local`'s hour (a part that
    names hours, `2` or `2-4`, does not count)."""
    hours = trigger.fields[CronTrigger.FIELD_NAMES.index("hour")]
    return any(
        (type(part) is AllExpression or part.step)
        and part.get_next_value(local, hours) == local.hour
        for part in hours.expressions
    )


def describe_schedule(task: ScheduledTask) -> str:
    """The schedule in words, with the cron itself where there is one."""
    if task.interval_seconds:
        return f"every {_duration(task.interval_seconds)}"
    if task.run_at is not None:
        return f"once, {local_time(aware(task.run_at), task.timezone)}"
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


def local_time(moment: datetime, zone: str) -> str:
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
        f"{local_time(aware(first.next_run), first.timezone)}: #{first.id} {first.name} in "
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
            raise TaskError(f"at {self.at!r} ({local_time(moment, zone)}) has already passed")
        return {"cron": None, "interval_seconds": None, "run_at": moment}


def describe_task(task: ScheduledTask, last: TaskRun | None) -> str:
    """One task as people and the model see it."""
    state = _state(task)
    next_run = f"next {local_time(aware(task.next_run), task.timezone)}" if task.next_run else ""
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


# -- firing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Due:
    """What firing a task now claims: its latest slot passed, how many slots it stands for,
    whether it is late (and, by its policy, skipped), and the slot after now."""

    latest: datetime
    count: int
    late: bool
    skipped: bool
    upcoming: datetime | None


def due(task: ScheduledTask, now: datetime, grace_seconds: float) -> Due:
    """The task's due slots at `now`, from its `next_run` (which has passed)."""
    assert task.next_run is not None
    trigger = trigger_of(task)
    latest, count = aware(task.next_run), 1
    while count < SLOTS_COUNTED:
        following = next_slot(trigger, latest)
        if following is None or following > now:
            break
        latest, count = following, count + 1
    late = (now - latest).total_seconds() > grace_seconds
    return Due(latest, count, late, late and task.misfire == "skip", next_slot(trigger, now))


def slug(text: str) -> str:
    """A task's name from what it was called (or its prompt)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words[:5])[:60] or "task"
