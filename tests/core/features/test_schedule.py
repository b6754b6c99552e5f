"""Scheduled tasks through the whole turn path and the fake Ollama, on a clock the test moves.

No test waits for real time: the scheduler runs without timers and `fire_due()` fires what the
clock says is due (one test gives APScheduler a job due at once, to prove the wiring). Ordering
between a firing and a person's turn is by the fake's pauses.
"""

import asyncio
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.agent.tools import ToolContext
from core.channel import Delivery
from core.features.schedule.scheduler import RETRY_SECONDS, Scheduler
from core.features.schedule.timing import (
    ScheduleSettings,
    TaskError,
    When,
    aware,
    due,
    next_slot,
    trigger_of,
)
from core.store import Store
from core.store.tables import ScheduledTask
from tests.databases import IMPATIENT, QUICK, Outage, open_store
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import HttpError, Pause, Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory

ANN = ToolContext("test", PLACE, "ann", "person")
PARIS = "Europe/Paris"
BERLIN = "Europe/Berlin"


class Clock:
    """The scheduler's now, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


def scheduled(make_bot: BotFactory, clock: Clock, **settings: Any) -> tuple[Bot, Scheduler]:
    bot = make_bot(schedule=ScheduleSettings(**settings), clock=clock)
    assert bot.scheduler is not None
    return bot, bot.scheduler


async def fire(scheduler: Scheduler) -> None:
    await asyncio.gather(*scheduler.fire_due())


async def task_row(store: Store, task_id: int | None) -> ScheduledTask:
    assert task_id is not None
    row = await store.task(task_id)
    assert row is not None
    return row


@pytest.fixture
def tz_new_york() -> Iterator[None]:
    """The process runs under TZ=America/New_York for the test."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


async def test_a_cron_task_fires_at_its_local_time_on_both_sides_of_a_dst_change(
    make_bot: BotFactory, tz_new_york: None
) -> None:
    """09:00 Paris is 08:00 UTC before 29 March 2026 and 07:00 UTC after, whatever TZ Kaiwa
    runs under; each slot fires once, as a new reply in the task's place."""
    clock = Clock(utc(2026, 3, 27, 12))
    bot, scheduler = scheduled(make_bot, clock)
    bot.ollama.default = [Text("Good morning: no open incidents.")]
    task = await scheduler.create(
        ANN, "assistant", "summarize incidents", When("0 9 * * *", timezone=PARIS)
    )
    assert aware(task.next_run) == utc(2026, 3, 28, 8)  # type: ignore[arg-type]

    clock.now = utc(2026, 3, 28, 8)
    await fire(scheduler)
    moved = await task_row(bot.store, task.id)
    assert aware(moved.next_run) == utc(2026, 3, 29, 7), "CEST from 29 March"  # type: ignore[arg-type]
    clock.now = utc(2026, 3, 29, 7, 0, 30)
    await fire(scheduler)
    await fire(scheduler)  # nothing more is due

    assert [reply.text for reply in bot.channel.replies] == ["Good morning: no open incidents."] * 2
    assert all(reply.place == PLACE and reply.reply_to is None for reply in bot.channel.replies)
    runs = await bot.store.task_runs(task.id or 0, 10)
    assert [(aware(r.fire_time), r.outcome, r.late) for r in runs] == [
        (utc(2026, 3, 29, 7), "done", False),
        (utc(2026, 3, 28, 8), "done", False),
    ]
    asked = bot.ollama.requests[0]["messages"][-1]["content"]
    assert "Scheduled task #1 summarize-incidents" in asked and "summarize incidents" in asked


def test_the_same_slots_under_any_tz() -> None:
    """The trigger is read in the task's zone: the process's TZ changes no instant."""
    task = ScheduledTask.model_construct(cron="30 2 * * *", timezone=PARIS, interval_seconds=None)
    after = utc(2026, 10, 24, 12)
    seen = []
    for zone in ("UTC", "Asia/Tokyo", "America/Los_Angeles"):
        os.environ["TZ"] = zone
        time.tzset()
        slot = next_slot(trigger_of(task), after)
        assert slot is not None
        seen.append([slot, next_slot(trigger_of(task), slot)])
    del os.environ["TZ"]
    time.tzset()
    assert seen[0] == seen[1] == seen[2]
    assert seen[0] == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)], "CEST, then CET"


def cron_task(cron: str, zone: str = BERLIN) -> ScheduledTask:
    """A task row as far as its slots go (built, not constructed: that sets up its mapping)."""
    return ScheduledTask(cron=cron, timezone=zone)


def slots_after(task: ScheduledTask, after: datetime, count: int) -> list[datetime]:
    """The task's next `count` slots after `after`, each found from the one before."""
    trigger, slots = trigger_of(task), []
    for _ in range(count):
        slot = next_slot(trigger, slots[-1] if slots else after)
        assert slot is not None
        slots.append(slot)
    return slots


def slot_told(prompt: str) -> str:
    """The slot's local time a firing's prompt gives the model ("02:30 CET")."""
    found = re.search(r", for \w+ \d+ \w+ \d+ (\d\d:\d\d \w+)", prompt)
    assert found is not None, prompt
    return found.group(1)


FALL_BACK = utc(2026, 10, 24, 22)
"""00:00 CEST on 25 October 2026; at 01:00 UTC (03:00 CEST) Berlin's clocks go back to 02:00 CET."""
SPRING_FORWARD = utc(2026, 3, 28, 23)
"""00:00 CET on 29 March 2026; at 01:00 UTC (02:00 CET) Berlin's clocks go forward to 03:00 CEST."""


@pytest.mark.parametrize(
    ("cron", "after", "slots"),
    [
        pytest.param(
            "30 * * * *",
            FALL_BACK,
            [
                utc(2026, 10, 24, 22, 30),
                utc(2026, 10, 24, 23, 30),
                utc(2026, 10, 25, 0, 30),
                utc(2026, 10, 25, 1, 30),
                utc(2026, 10, 25, 2, 30),
            ],
            id="hourly, clocks back: 02:30 CEST and 02:30 CET",
        ),
        pytest.param(
            "30 2 * * *",
            FALL_BACK,
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
            id="fixed 02:30, clocks back: the first 02:30 only",
        ),
        pytest.param(
            "30 */2 * * *",
            FALL_BACK,
            [
                utc(2026, 10, 24, 22, 30),
                utc(2026, 10, 25, 0, 30),
                utc(2026, 10, 25, 1, 30),
                utc(2026, 10, 25, 3, 30),
            ],
            id="every 2 hours, clocks back: both 02:30",
        ),
        pytest.param(
            "30 1-23/3 * * *",
            FALL_BACK,
            [utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 3, 30)],
            id="a step that skips 2 o'clock: 01:30 CEST, 04:30 CET",
        ),
        pytest.param(
            "30 2-23/3 * * *",
            FALL_BACK,
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 4, 30)],
            id="a step from 2 o'clock: both 02:30, then 05:30 CET",
        ),
        pytest.param(
            "30 2,3-23/5 * * *",
            FALL_BACK,
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 30)],
            id="2 o'clock listed, not a step's: once",
        ),
        pytest.param(
            "30 * * * *",
            utc(2026, 10, 25, 0, 45),
            [utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2, 30)],
            id="hourly, from inside the first 2 o'clock",
        ),
        pytest.param(
            "30 2 * * *",
            utc(2026, 10, 25, 0, 45),
            [utc(2026, 10, 26, 1, 30)],
            id="fixed 02:30, from after the first 02:30: tomorrow",
        ),
        pytest.param(
            "30 * * * *",
            SPRING_FORWARD,
            [
                utc(2026, 3, 28, 23, 30),
                utc(2026, 3, 29, 0, 30),
                utc(2026, 3, 29, 1, 30),
                utc(2026, 3, 29, 2, 30),
            ],
            id="hourly, clocks forward: 00:30, 01:30 CET, 03:30, 04:30 CEST",
        ),
        pytest.param(
            "30 2 * * *",
            SPRING_FORWARD,
            [utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)],
            id="fixed 02:30, clocks forward: 03:30 CEST, once",
        ),
        pytest.param(
            "30 */2 * * *",
            SPRING_FORWARD,
            [utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 2, 30)],
            id="every 2 hours, clocks forward: 02:30 comes at 03:30 CEST",
        ),
    ],
)
def test_next_slot_on_the_nights_the_clocks_change(
    cron: str, after: datetime, slots: list[datetime]
) -> None:
    """Regression (issue 26): an hourly task skipped the second 02:30 the night the clocks go
    back. A wildcard or step hour fires every elapsed hour that matches, a fixed hour once."""
    assert slots_after(cron_task(cron), after, len(slots)) == slots


def test_an_hourly_task_in_new_york_fires_in_both_passes_of_its_repeated_hour() -> None:
    """America/New_York repeats 01:00-02:00 on 1 November 2026 (EDT, then EST)."""
    hourly = cron_task("15 * * * *", "America/New_York")
    assert slots_after(hourly, utc(2026, 11, 1, 4), 4) == [
        utc(2026, 11, 1, 4, 15),
        utc(2026, 11, 1, 5, 15),
        utc(2026, 11, 1, 6, 15),
        utc(2026, 11, 1, 7, 15),
    ]


def test_an_interval_task_counts_elapsed_time_through_a_clock_change() -> None:
    """Every 60 minutes is every real hour, whatever the wall clocks do."""
    every_hour = ScheduledTask(interval_seconds=3600, created_at=FALL_BACK, timezone=BERLIN)
    slots = slots_after(every_hour, utc(2026, 10, 24, 23, 30), 4)
    assert slots == [FALL_BACK + timedelta(hours=hours) for hours in (2, 3, 4, 5)]


def test_slots_missed_across_the_repeated_hour_count_both_passes() -> None:
    """Down from before the first 02:30 to after 03:30 CET: three hourly slots were missed."""
    hourly = cron_task("30 * * * *")
    hourly.next_run = utc(2026, 10, 25, 0, 30)
    slots = due(hourly, utc(2026, 10, 25, 2, 45), 300)
    assert (slots.latest, slots.count, slots.late, slots.upcoming) == (
        utc(2026, 10, 25, 2, 30),
        3,
        True,
        utc(2026, 10, 25, 3, 30),
    )


@pytest.mark.parametrize(
    ("cron", "evening", "fired"),
    [
        pytest.param(
            "30 * * * *",
            FALL_BACK,
            [
                (utc(2026, 10, 24, 22, 30), "00:30 CEST"),
                (utc(2026, 10, 24, 23, 30), "01:30 CEST"),
                (utc(2026, 10, 25, 0, 30), "02:30 CEST"),
                (utc(2026, 10, 25, 1, 30), "02:30 CET"),
                (utc(2026, 10, 25, 2, 30), "03:30 CET"),
                (utc(2026, 10, 25, 3, 30), "04:30 CET"),
            ],
            id="hourly, clocks back",
        ),
        pytest.param(
            "30 2 * * *",
            FALL_BACK,
            [(utc(2026, 10, 25, 0, 30), "02:30 CEST")],
            id="fixed 02:30, clocks back",
        ),
        pytest.param(
            "30 */2 * * *",
            FALL_BACK,
            [
                (utc(2026, 10, 24, 22, 30), "00:30 CEST"),
                (utc(2026, 10, 25, 0, 30), "02:30 CEST"),
                (utc(2026, 10, 25, 1, 30), "02:30 CET"),
                (utc(2026, 10, 25, 3, 30), "04:30 CET"),
            ],
            id="every 2 hours, clocks back",
        ),
        pytest.param(
            "30 * * * *",
            SPRING_FORWARD,
            [
                (utc(2026, 3, 28, 23, 30), "00:30 CET"),
                (utc(2026, 3, 29, 0, 30), "01:30 CET"),
                (utc(2026, 3, 29, 1, 30), "03:30 CEST"),
                (utc(2026, 3, 29, 2, 30), "04:30 CEST"),
                (utc(2026, 3, 29, 3, 30), "05:30 CEST"),
                (utc(2026, 3, 29, 4, 30), "06:30 CEST"),
            ],
            id="hourly, clocks forward",
        ),
        pytest.param(
            "30 2 * * *",
            SPRING_FORWARD,
            [(utc(2026, 3, 29, 1, 30), "03:30 CEST")],
            id="fixed 02:30, clocks forward",
        ),
    ],
)
async def test_a_night_the_clocks_change_fires_every_slot_it_means_once(
    make_bot: BotFactory, cron: str, evening: datetime, fired: list[tuple[datetime, str]]
) -> None:
    """Regression (issue 26): `30 * * * *` in Europe/Berlin fired at 02:30 CEST and next at
    03:30 CET, two real hours later, skipping 02:30 CET. The clock walks the night in quarter
    hours; each run is on time and the model is told the slot's local time."""
    clock = Clock(evening)
    bot, scheduler = scheduled(make_bot, clock)
    bot.ollama.default = [Text("Checked.")]
    task = await scheduler.create(ANN, "assistant", "check", When(cron, timezone=BERLIN))
    while clock.now < evening + timedelta(hours=6):
        clock.now += timedelta(minutes=15)
        await fire(scheduler)

    runs = await bot.store.task_runs(task.id or 0, 20)
    assert [(aware(run.fire_time), run.late) for run in reversed(runs)] == [
        (slot, False) for slot, _ in fired
    ]
    told = [slot_told(request["messages"][-1]["content"]) for request in bot.ollama.requests]
    assert told == [local for _, local in fired]


async def test_an_interval_task_and_a_one_shot_that_ends_itself(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 10))
    bot, scheduler = scheduled(make_bot, clock)
    bot.ollama.default = [Text("Done.")]
    every = await scheduler.create(ANN, "assistant", "check the queue", When(every_minutes=30))
    once = await scheduler.create(
        ANN, "assistant", "remind me of the party", When(at="2026-12-01 18:00", timezone=PARIS)
    )
    assert aware(every.next_run) == utc(2026, 12, 1, 10, 30)  # type: ignore[arg-type]
    assert aware(once.next_run) == utc(2026, 12, 1, 17)  # type: ignore[arg-type]

    clock.now = utc(2026, 12, 1, 10, 30)
    await fire(scheduler)
    clock.now = utc(2026, 12, 1, 17)
    await fire(scheduler)  # the interval's 17:00 slot is on time; earlier ones were missed
    clock.now = utc(2026, 12, 2, 17)
    await fire(scheduler)

    once_row = await task_row(bot.store, once.id)
    assert once_row.next_run is None and once_row.enabled, "done: it fired once"
    assert len(await bot.store.task_runs(once.id or 0, 10)) == 1
    every_row = await task_row(bot.store, every.id)
    assert aware(every_row.next_run) == utc(2026, 12, 2, 17, 30)  # type: ignore[arg-type]
    await bot.send("/tasks")
    listing = bot.channel.notices_in(PLACE)[-1]
    assert "every 30 minutes" in listing and "done (it ran once)" in listing


async def test_missed_slots_run_once_late(make_bot: BotFactory) -> None:
    """Three days down: one catch-up run, marked late, standing for the three slots."""
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    bot.ollama.default = [Text("Catching up.")]
    task = await scheduler.create(ANN, "assistant", "daily digest", When("0 8 * * *"))
    clock.now = utc(2026, 12, 4, 12)
    await fire(scheduler)

    (run,) = await bot.store.task_runs(task.id or 0, 10)
    assert (aware(run.fire_time), run.late, run.missed_slots, run.outcome) == (
        utc(2026, 12, 4, 8),
        True,
        3,
        "done",
    )
    assert len(bot.ollama.requests) == 1, "one run, never a storm"
    assert "late" in bot.ollama.requests[0]["messages"][-1]["content"]
    assert aware((await task_row(bot.store, task.id)).next_run) == utc(2026, 12, 5, 8)  # type: ignore[arg-type]


async def test_missed_slots_are_only_recorded_when_skipped(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(
        ANN, "assistant", "daily digest", When("0 8 * * *"), misfire="skip"
    )
    clock.now = utc(2026, 12, 4, 12)
    await fire(scheduler)

    (run,) = await bot.store.task_runs(task.id or 0, 10)
    assert (run.outcome, run.missed_slots) == ("missed", 4)
    assert bot.ollama.requests == [] and bot.channel.replies == []


async def test_a_restart_rebuilds_a_job_per_task_and_closes_runs_left_under_way(
    make_bot: BotFactory,
) -> None:
    clock = Clock(datetime.now(UTC))
    bot, scheduler = scheduled(make_bot, clock)
    daily = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    paused = await scheduler.create(ANN, "assistant", "other", When(every_minutes=60))
    await scheduler.pause(paused)

    under_way = {"late": False, "missed_slots": 0, "outcome": "running", "started_at": clock.now}
    await bot.store.claim_slot(daily.id or 0, clock.now, under_way)  # then the process died

    restarted = Scheduler(bot.store, bot.runner, {"test": bot.channel}, ScheduleSettings())
    assert await restarted.start() == 1
    try:
        jobs = restarted.jobs()
    finally:
        restarted.stop()
    assert list(jobs) == [daily.id] and jobs[daily.id or 0] == aware(daily.next_run)  # type: ignore[arg-type]
    (cut,) = await bot.store.task_runs(daily.id or 0)
    assert (cut.outcome, cut.error) == ("interrupted", "Kaiwa stopped during the run")


async def test_apscheduler_wakes_a_task_when_its_slot_comes(make_bot: BotFactory) -> None:
    """The real timer: a job due now fires through APScheduler into a turn."""
    bot = make_bot()
    bot.ollama.default = [Text("Reminder: stretch.")]
    scheduler = Scheduler(bot.store, bot.runner, {"test": bot.channel}, ScheduleSettings())
    soon = datetime.now(UTC) + timedelta(milliseconds=50)
    await bot.store.create_task(
        {
            "platform": "test",
            "place": PLACE,
            "agent": "assistant",
            "name": "stretch",
            "prompt": "remind me to stretch",
            "run_at": soon,
            "timezone": "UTC",
            "misfire": "once",
            "enabled": True,
            "consecutive_failures": 0,
            "created_by": "ann",
            "created_at": datetime.now(UTC),
            "next_run": soon,
        }
    )
    await scheduler.start()
    try:
        (reply,) = await bot.channel.finished()
    finally:
        scheduler.stop()
        await scheduler.settled()
    assert reply.text == "Reminder: stretch."


async def test_two_schedulers_on_one_store_run_a_slot_once(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, first = scheduled(make_bot, clock)
    bot.ollama.default = [Text("Once.")]
    second = Scheduler(
        bot.store, bot.runner, {"test": bot.channel}, ScheduleSettings(), clock=clock, timers=False
    )
    await first.create(ANN, "assistant", "digest", When("0 8 * * *"))
    await second.start()
    await second.settled()  # its start-up firing: nothing was due yet
    clock.now = utc(2026, 12, 1, 8)
    await asyncio.gather(*first.fire_due(), *second.fire_due(), *first.fire_due())

    assert len(bot.channel.replies) == 1 and len(bot.ollama.requests) == 1


async def test_a_firing_waits_for_a_busy_conversation(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    bot.ollama.script(Text("A long answer"), Pause("person"), Text(", done."))
    bot.ollama.script(Text("The digest."))

    await bot.send("tell me something long")
    await bot.ollama.reached("person")
    clock.now = utc(2026, 12, 1, 8)
    firing = scheduler.fire_due()
    await scheduler.handed_over.wait()
    assert len(bot.ollama.requests) == 1, "the firing waits behind the person's turn"
    bot.ollama.release("person")
    await asyncio.gather(*firing)

    assert [reply.text for reply in bot.channel.replies] == ["A long answer, done.", "The digest."]


async def test_stop_during_a_firing_ends_that_run_and_keeps_the_schedule(
    make_bot: BotFactory,
) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    bot.ollama.script(Text("The digest so far"), Pause("digest"), Text(" and more"))
    clock.now = utc(2026, 12, 1, 8)
    firing = scheduler.fire_due()
    await bot.ollama.reached("digest")
    await bot.send("/stop")
    await asyncio.gather(*firing)

    (run,) = await bot.store.task_runs(task.id or 0)
    assert run.outcome == "stopped"
    row = await task_row(bot.store, task.id)
    assert row.enabled and aware(row.next_run) == utc(2026, 12, 2, 8)  # type: ignore[arg-type]
    assert bot.channel.replies[0].text == "The digest so far"


async def test_a_cancel_stops_a_firing_that_waits_for_the_gate(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    bot.ollama.script(Text("Busy"), Pause("person"), Text("."))
    await bot.send("hello")
    await bot.ollama.reached("person")
    clock.now = utc(2026, 12, 1, 8)
    firing = scheduler.fire_due()
    await scheduler.handed_over.wait()
    await bot.send(f"/tasks cancel {task.id}")
    bot.ollama.release("person")
    await asyncio.gather(*firing)

    (run,) = await bot.store.task_runs(task.id or 0)
    assert run.outcome == "cancelled"
    assert len(bot.ollama.requests) == 1 and len(bot.channel.replies) == 1
    assert (await task_row(bot.store, task.id)).cancelled_at is not None
    assert await bot.store.tasks(PLACE) == []


async def test_an_answer_that_is_the_silent_marker_posts_nothing(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(ANN, "assistant", "anything new?", When("0 8 * * *"))
    bot.ollama.script(Text("NO_REPLY"))
    clock.now = utc(2026, 12, 1, 8)
    await fire(scheduler)

    (reply,) = bot.channel.replies
    assert reply.frames == [] and reply.text == "", "nothing was shown"
    (run,) = await bot.store.task_runs(task.id or 0)
    assert run.outcome == "silent"


async def test_three_failures_in_a_row_pause_the_task_and_say_so(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    for day in (1, 2, 3):
        bot.ollama.script(HttpError(404, "model 'test-model' not found"))
        clock.now = utc(2026, 12, day, 8)
        await fire(scheduler)
    clock.now = utc(2026, 12, 4, 8)
    await fire(scheduler)

    row = await task_row(bot.store, task.id)
    assert not row.enabled and row.consecutive_failures == 3
    assert row.paused_reason and row.paused_reason.startswith("3 failures in a row, the last:")
    assert len(await bot.store.task_runs(task.id or 0, 10)) == 3, "paused: no fourth run"
    (notice,) = [n for n in bot.channel.notices_in(PLACE) if "paused" in n]
    assert notice.startswith(f"⚠️ Task #{task.id} digest is paused: 3 failures in a row")


async def test_a_place_that_is_gone_pauses_the_task(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot = make_bot(
        schedule=ScheduleSettings(), clock=clock, channel=RecordingChannel(shows=Delivery.NOTHING)
    )
    assert bot.scheduler is not None
    bot.ollama.default = [Text("Hello?")]
    task = await bot.scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    clock.now = utc(2026, 12, 1, 8)
    await fire(bot.scheduler)

    (run,) = await bot.store.task_runs(task.id or 0)
    assert run.outcome == "undeliverable"
    row = await task_row(bot.store, task.id)
    assert not row.enabled and "nothing could be posted" in (row.paused_reason or "")
    await bot.send("/tasks")
    assert "paused: nothing could be posted" in bot.channel.notices_in(PLACE)[-1]


async def test_the_models_tools_and_tasks_agree(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, _ = scheduled(make_bot, clock)
    weekday = {"prompt": "summarize the open incidents", "cron": "0 9 * * 1-5", "timezone": PARIS}
    bot.ollama.script(ToolCall("schedule_task", {**weekday, "name": "incidents"}))
    bot.ollama.script(Text("Scheduled."))
    bot.ollama.script(ToolCall("list_tasks", {}))
    bot.ollama.script(Text("Here they are."))

    await bot.send("every weekday at 9:00 summarize the open incidents here")
    await bot.send("which tasks are there?")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)
    await bot.send("/tasks")

    stored = [m["content"] for m in bot.ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert stored[0].startswith("Scheduled: #1 incidents · every weekday at 09:00 (0 9 * * 1-5)")
    assert "next Tue 01 Dec 2026 09:00 CET" in stored[0]
    listed = [m["content"] for m in bot.ollama.requests[3]["messages"] if m["role"] == "tool"][-1]
    assert bot.channel.notices_in(PLACE)[-1] == "Tasks here:\n" + listed


async def test_a_scheduled_run_cannot_create_tasks(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    bot.ollama.script(ToolCall("schedule_task", {"prompt": "more", "every_minutes": 60}))
    bot.ollama.script(Text("I may not."))
    clock.now = utc(2026, 12, 1, 8)
    await fire(scheduler)

    result = [m["content"] for m in bot.ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert "a scheduled run (or a sub-agent) cannot create, change or delete tasks" in result[0]
    assert len(await bot.store.tasks(PLACE)) == 1


@pytest.mark.parametrize(
    ("when", "says"),
    [
        (When("0 9 * * *", timezone="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (When("61 * * * *"), "cron '61 * * * *' is not valid"),
        (When("0 9 * *"), "needs five fields"),
        (When(), "give exactly one schedule"),
        (When("0 9 * * *", every_minutes=5), "give exactly one schedule"),
        (When(every_minutes=0, at="yesterday"), "is not a date-time"),
        (When(at="2020-01-01 09:00"), "has already passed"),
        (When(every_minutes=1), "every_minutes must be at least"),
    ],
)
def test_a_bad_schedule_is_refused_clearly(when: When, says: str) -> None:
    with pytest.raises(TaskError) as refused:
        when.columns(
            when.timezone or "UTC", utc(2026, 12, 1), ScheduleSettings(min_interval_seconds=120)
        )
    assert says in str(refused.value)


async def test_the_tool_refuses_a_bad_zone_in_words_the_model_can_act_on(
    make_bot: BotFactory,
) -> None:
    bot, _ = scheduled(make_bot, Clock(utc(2026, 12, 1)))
    bot.ollama.script(
        ToolCall("schedule_task", {"prompt": "x", "cron": "0 9 * * *", "timezone": "Paris"})
    )
    bot.ollama.script(Text("That zone is unknown."))
    await bot.send("every day at 9 in Paris")
    await bot.channel.finished()

    result = [m["content"] for m in bot.ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert "unknown time zone 'Paris': use an IANA name such as Europe/Paris" in result[0]
    assert await bot.store.tasks(PLACE) == []


async def test_a_firing_during_a_database_blink_waits_and_runs_once(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    """The claim is a durable write: it waits for the database, and the slot runs when it is
    back, once."""
    clock = Clock(utc(2030, 1, 1, 6))
    bot = make_bot(
        bot_store=await open_store(outage.url, QUICK, closing),
        schedule=ScheduleSettings(),
        clock=clock,
    )
    assert bot.scheduler is not None
    bot.ollama.default = [Text("The digest.")]
    task = await bot.scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    outage.begin()
    clock.now = utc(2030, 1, 1, 8)
    firing = bot.scheduler.fire_due()
    await outage.store_noticed()
    outage.end()
    await asyncio.gather(*firing, *bot.scheduler.fire_due())

    (run,) = await bot.store.task_runs(task.id or 0)
    assert (aware(run.fire_time), run.outcome) == (utc(2030, 1, 1, 8), "done")
    assert [reply.text for reply in bot.channel.replies] == ["The digest."]


async def test_a_slot_the_database_kept_from_being_claimed_is_tried_again(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    """Regression: a wake that could not read its task left it with no timer for the rest of
    the process. Now its job wakes again `RETRY_SECONDS` later, and the slot runs."""
    if outage.url.startswith("sqlite"):
        pytest.skip("on SQLite a held write lock keeps no reader out")
    clock = Clock(utc(2030, 1, 1, 6))
    bot = make_bot(bot_store=await open_store(outage.url, IMPATIENT, closing))
    bot.ollama.default = [Text("The digest.")]
    scheduler = Scheduler(
        bot.store, bot.runner, {"test": bot.channel}, ScheduleSettings(), clock=clock
    )
    await scheduler.start()
    try:
        task = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
        outage.begin()
        clock.now = utc(2030, 1, 1, 8)
        await asyncio.gather(*scheduler.fire_due())
        retry_at = clock.now + timedelta(seconds=RETRY_SECONDS)
        assert scheduler.jobs() == {task.id: retry_at}
        outage.end()
        clock.now = retry_at
        await asyncio.gather(*scheduler.fire_due())
    finally:
        scheduler.stop()
    (run,) = await bot.store.task_runs(task.id or 0)
    assert (aware(run.fire_time), run.outcome, run.late) == (utc(2030, 1, 1, 8), "done", False)


async def test_a_second_tasks_run_in_the_same_second_says_it_is_already_running(
    make_bot: BotFactory,
) -> None:
    """The bug: the second `/tasks run` claimed the same slot (one per second), answered "runs
    now", and ran nothing. It says the first is running; a later one runs again."""
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    task = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    bot.ollama.script(Pause("digest"), Text("The digest."))
    bot.ollama.script(Text("The digest again."))

    await bot.send(f"/tasks run {task.id}")
    await bot.send(f"/tasks run {task.id}")
    bot.ollama.release("digest")
    await scheduler.settled()
    clock.now += timedelta(seconds=1)
    await bot.send(f"/tasks run {task.id}")
    await scheduler.settled()

    assert bot.channel.notices_in(PLACE) == [
        f"Task #{task.id} digest runs now; its answer follows here.",
        f"Task #{task.id} digest is already running (started this second); its answer follows.",
        f"Task #{task.id} digest runs now; its answer follows here.",
    ]
    assert [reply.text for reply in bot.channel.replies] == ["The digest.", "The digest again."]
    assert len(await bot.store.task_runs(task.id or 0)) == 2


async def test_the_listing_carries_each_tasks_next_steps_as_buttons(make_bot: BotFactory) -> None:
    clock = Clock(utc(2026, 12, 1, 6))
    bot, scheduler = scheduled(make_bot, clock)
    digest = await scheduler.create(ANN, "assistant", "digest", When("0 8 * * *"))
    await bot.send("/tasks")
    assert [(b.label, b.command) for b in bot.channel.buttons[-1]] == [
        (f"Pause #{digest.id} digest", f"/tasks pause {digest.id}"),
        (f"Run #{digest.id} digest now", f"/tasks run {digest.id}"),
    ]

    await bot.send(bot.channel.buttons[-1][0].command)  # the Pause button, as pressed
    assert not (await task_row(bot.store, digest.id)).enabled
    await bot.send("/tasks")
    assert bot.channel.buttons[-1][0].command == f"/tasks resume {digest.id}"
