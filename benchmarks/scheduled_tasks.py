"""Scheduled tasks: loading many at start-up, and many firing in the same second.

(1) Start-up load: `--tasks` tasks (default 10,000) are stored through `Scheduler.create`, ten
to a place, a third each cron (five expressions), interval (5 minutes to a day) and one-shot (a
local date-time up to a year ahead), spread over seven IANA zones. Then, on a freshly opened
store each time, `Scheduler.start()` is timed with real APScheduler timers (one job per task),
against the bare read of the same rows (`Store.tasks()`), alternating `--repeats` times. The
start-up scheduler's clock is pinned to the moment the tasks were made, so no slot is ever due
while it runs: a timer that wakes claims nothing and no turn runs into the figures. `start()`
also fires whatever came due while Kaiwa was down, and that check goes on after `start()`
returns, so "start + catch-up settled" (until `Scheduler.settled()`) is printed beside it, with
the event loop's longest stall meanwhile (`LoopLag`: how long a person's message arriving at
start-up would wait to be read). Target: every `start()` (p99) ≤ 2 s for 10,000 tasks; the ratio
to the bare read shows what building the jobs adds.

(2) Simultaneous firing: `--firings` daily cron tasks (default 100), each in a place of its own
so none queues behind another, have the same slot, 08:00 UTC on a December day, said in five
zones (08:00 UTC, 09:00 Paris, 03:00 New York, 17:00 Tokyo, 13:30 Kolkata). The scheduler runs
without timers on a clock moved by hand: each round moves it to the next day's slot and calls
`fire_due()`. A turn has started when the runner opens its reply on the channel
(`Channel.open_reply`): it holds its conversation's gate, has read its history, and its model
call begins. Each start is timed from the `fire_due()` call. The baseline is the same requests
(those the scheduler handed the runner in a first, unmeasured round), put to `TurnRunner.submit`
directly in places of their own with as many earlier turns, timed the same way; the two sides
alternate round by round. Target: p99 ≤ 1 s.

Exactly once: after the measured rounds, one more slot is fired by that scheduler and a second
`Scheduler` on the same store at the same time, then both call `fire_due()` again. Every task
must then have one `TaskRun` per slot, each `done`, and the channel one reply per run.

The fake Ollama streams 10 chunks 2 ms apart; the model client allows `--firings` requests at
once.

Run from the repository root:
    .venv/bin/python benchmarks/scheduled_tasks.py [--tasks 10000] [--repeats 5]
                                                   [--firings 100] [--rounds 5]
                                                   [--db sqlite|postgres]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS, DELAY_MS = 10, 2
LOAD_TARGET, FIRING_TARGET = 2.0, 1.0
BATCH = 500
"""Tasks created concurrently while the store is filled (not measured)."""
ZONES = (
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "Asia/Tokyo",
    "Australia/Sydney",
    "America/Sao_Paulo",
    "Asia/Kolkata",
)
CRONS = ("0 9 * * 1-5", "*/15 * * * *", "30 2 * * *", "0 18 * * 0", "5 * * * *")
SAME_SLOT = (
    ("UTC", "0 8 * * *"),
    ("Europe/Paris", "0 9 * * *"),
    ("America/New_York", "0 3 * * *"),
    ("Asia/Tokyo", "0 17 * * *"),
    ("Asia/Kolkata", "30 13 * * *"),
)
"""One instant, 08:00 UTC in December (no DST change), in five zones' words."""
CREATED = datetime(2026, 12, 1, 6, tzinfo=UTC)
FIRST_SLOT = datetime(2026, 12, 1, 8, tzinfo=UTC)


class Clock:
    """The firing scheduler's now, moved by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class TimedChannel(bench.BenchChannel):
    """The bench channel, noting when each reply is opened (a turn's start) and keeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: dict[str, float] = {}
        self.replies: list[bench.BenchReply] = []

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: Any = None,
    ) -> bench.BenchReply:
        self.opened[place] = time.perf_counter()
        reply = super().open_reply(place, reply_to, posted)
        self.replies.append(reply)
        return reply


class Recording:
    """The runner as a scheduler sees it, keeping every request it is handed."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.requests: list[Any] = []

    async def run_unattended(self, request: Any) -> Any:
        self.requests.append(request)
        return await self.runner.run_unattended(request)


def context(place: str) -> Any:
    from core.agent.tools import ToolContext

    return ToolContext(bench.PLATFORM, place, "bench-user", "person")


# -- (1) start-up load ------------------------------------------------------------------------


def mixed_when(n: int, now: datetime) -> Any:
    """Task `n`'s schedule: cron, interval or one-shot in turn, in one of seven zones."""
    from core.features.schedule.timing import When

    zone = ZONES[n % len(ZONES)]
    if n % 3 == 0:
        return When(cron=CRONS[n % len(CRONS)], timezone=zone)
    if n % 3 == 1:
        return When(every_minutes=5 * (1 + n % 288), timezone=zone)
    local = (now + timedelta(days=1 + n % 365, minutes=n % 1440)).astimezone(ZoneInfo(zone))
    return When(at=local.strftime("%Y-%m-%d %H:%M"), timezone=zone)


async def populate(kaiwa: bench.Kaiwa, count: int) -> datetime:
    """`count` tasks stored as `Scheduler.create` stores them; returns when they were made."""
    from core.features.schedule.scheduler import Scheduler
    from core.features.schedule.timing import ScheduleSettings
    from core.store.tables import utc_now

    now = utc_now()
    maker = Scheduler(
        kaiwa.store, kaiwa.runner, {}, ScheduleSettings(), clock=lambda: now, timers=False
    )

    async def create(n: int) -> None:
        where = context(f"{bench.PLATFORM}:place-{n // 10}")
        await maker.create(where, "assistant", f"Report {n}.", mixed_when(n, now), name=f"t{n}")

    for first in range(0, count, BATCH):
        await asyncio.gather(*(create(n) for n in range(first, min(count, first + BATCH))))
    return now


async def timed_read(database_url: str) -> float:
    """Seconds `Store.tasks()` takes on a freshly opened store."""
    from core.store import Store, StoreSettings

    store = await Store.open(database_url, StoreSettings())
    try:
        begun = time.perf_counter()
        await store.tasks()
        return time.perf_counter() - begun
    finally:
        await store.close()


@dataclass
class Load:
    """Each start-up's seconds, per side."""

    read: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    settled: list[float] = field(default_factory=list)
    stall: list[float] = field(default_factory=list)
    """The event loop's longest lateness while it started and settled."""
    jobs: int = 0
    fill_seconds: float = 0.0


async def timed_start(load: Load, kaiwa: bench.Kaiwa, database_url: str, now: datetime) -> None:
    """On a freshly opened store: how long `start()` takes, how long until its catch-up firings
    have settled, the event loop's longest stall meanwhile, and the jobs it made."""
    from core.features.schedule.scheduler import Scheduler
    from core.features.schedule.timing import ScheduleSettings
    from core.store import Store, StoreSettings

    store = await Store.open(database_url, StoreSettings())
    channels = {bench.PLATFORM: kaiwa.channel}
    scheduler = Scheduler(store, kaiwa.runner, channels, ScheduleSettings(), clock=lambda: now)
    lag = bench.LoopLag().start()
    try:
        await asyncio.sleep(2 * lag.period)  # the monitor is ticking
        begun = time.perf_counter()
        await scheduler.start()
        load.start.append(time.perf_counter() - begun)
        await scheduler.settled()
        load.settled.append(time.perf_counter() - begun)
        load.jobs = len(scheduler.jobs())
    finally:
        await lag.stop()
        scheduler.stop()
        await scheduler.settled()
        await store.close()
    load.stall.append(max(lag.lateness(), default=0.0))


async def measure_load(
    url: str, database_url: str, data_dir: Path, tasks: int, repeats: int
) -> Load:
    load = Load()
    kaiwa = await bench.build_kaiwa(url, data_dir, 1, database_url=database_url)
    try:
        begun = time.perf_counter()
        now = await populate(kaiwa, tasks)
        load.fill_seconds = time.perf_counter() - begun
        for index in range(repeats):  # the sides alternate which goes first
            if index % 2:
                load.read.append(await timed_read(database_url))
            await timed_start(load, kaiwa, database_url, now)
            if not index % 2:
                load.read.append(await timed_read(database_url))
    finally:
        await kaiwa.close()
    return load


# -- (2) simultaneous firing ------------------------------------------------------------------


@dataclass
class Firing:
    scheduled: list[float] = field(default_factory=list)
    submitted: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    slots: int = 0


def delays(channel: TimedChannel, places: Sequence[str], begun: float) -> list[float]:
    """Each place's turn start after `begun` (inf for a place whose turn never started)."""
    return [channel.opened.get(place, math.inf) - begun for place in places]


async def fire_round(scheduler: Any, channel: TimedChannel, places: Sequence[str]) -> list[float]:
    channel.opened.clear()
    begun = time.perf_counter()
    scheduler.fire_due()
    await scheduler.settled()
    return delays(channel, places, begun)


async def submit_round(kaiwa: bench.Kaiwa, requests: Sequence[Any]) -> list[float]:
    channel = kaiwa.channel
    channel.opened.clear()
    begun = time.perf_counter()
    turns = [kaiwa.runner.submit(request) for request in requests]
    await asyncio.gather(*turns)
    return delays(channel, [request.place for request in requests], begun)


async def exactly_once(kaiwa: bench.Kaiwa, tasks: Sequence[Any], slots: int) -> list[str]:
    """What breaks "one done run and one reply per task and slot", if anything."""
    problems = []
    for task in tasks:
        runs = await kaiwa.store.task_runs(task.id, slots + 5)
        if len(runs) != slots or any(run.outcome != "done" for run in runs):
            outcomes = ", ".join(run.outcome for run in runs)
            problems.append(f"task #{task.id}: {len(runs)} runs for {slots} slots ({outcomes})")
    places = {task.place for task in tasks}
    replies = [reply for reply in kaiwa.channel.replies if reply.place in places]
    done = sum(reply.outcome is bench.Outcome.DONE for reply in replies)
    if len(replies) != slots * len(tasks) or done != len(replies):
        problems.append(f"{len(replies)} replies ({done} done) for {slots * len(tasks)} runs")
    return problems


async def same_slot_tasks(scheduler: Any, count: int) -> list[Any]:
    """`count` daily tasks, each in a place of its own, all due at 08:00 UTC."""
    from core.features.schedule.timing import When

    tasks = []
    for n in range(count):
        zone, cron = SAME_SLOT[n % len(SAME_SLOT)]
        where = context(f"{bench.PLATFORM}:task-{n}")
        when = When(cron, timezone=zone)
        tasks.append(await scheduler.create(where, "assistant", f"Digest {n}.", when))
    return tasks


async def timed_rounds(
    firing: Firing,
    kaiwa: bench.Kaiwa,
    scheduler: Any,
    recording: Recording,
    clock: Clock,
    places: list[str],
    rounds: int,
) -> None:
    """The first slot fired unmeasured (a warm-up), the requests `recording` saw then kept as
    the baseline's; then `rounds` slots, each with a baseline round, alternating which goes
    first."""
    channel = kaiwa.channel
    clock.now = FIRST_SLOT
    await fire_round(scheduler, channel, places)
    baseline = [
        replace(request, place=f"{bench.PLATFORM}:bare-{n}")
        for n, request in enumerate(recording.requests)
    ]
    await submit_round(kaiwa, baseline)
    for index in range(1, rounds + 1):
        clock.now = FIRST_SLOT + timedelta(days=index)
        if index % 2:
            firing.submitted += await submit_round(kaiwa, baseline)
        firing.scheduled += await fire_round(scheduler, channel, places)
        if not index % 2:
            firing.submitted += await submit_round(kaiwa, baseline)


async def measure_firing(
    url: str, database_url: str, data_dir: Path, count: int, rounds: int
) -> Firing:
    from core.features.schedule.scheduler import Scheduler
    from core.features.schedule.timing import ScheduleSettings

    firing, clock, channel = Firing(), Clock(CREATED), TimedChannel()
    kaiwa = await bench.build_kaiwa(
        url, data_dir, count, database_url=database_url, channel=channel
    )
    channels = {bench.PLATFORM: channel}

    def scheduler(runner: Any) -> Scheduler:
        return Scheduler(
            kaiwa.store, runner, channels, ScheduleSettings(), clock=clock, timers=False
        )

    recording = Recording(kaiwa.runner)
    first, second = scheduler(recording), scheduler(kaiwa.runner)
    try:
        tasks = await same_slot_tasks(first, count)
        await second.start()  # nothing is due yet
        await second.settled()
        places = [task.place for task in tasks]
        await timed_rounds(firing, kaiwa, first, recording, clock, places, rounds)
        clock.now = FIRST_SLOT + timedelta(days=rounds + 1)
        await asyncio.gather(*first.fire_due(), *second.fire_due())  # the same slot, twice over
        await asyncio.gather(*first.fire_due(), *second.fire_due())  # and again: nothing is due
        await asyncio.gather(first.settled(), second.settled())
        firing.slots = rounds + 2
        firing.problems = await exactly_once(kaiwa, tasks, firing.slots)
    finally:
        await kaiwa.close()
    return firing


# -- the report -------------------------------------------------------------------------------


def row(name: str, seconds: Sequence[float]) -> tuple[str, int, str, str]:
    return (
        name,
        len(seconds),
        bench.ms(bench.median(seconds)),
        bench.ms(bench.percentile(seconds, 99)),
    )


def report_load(load: Load, tasks: int, label: str, peak: float) -> None:
    bench.print_table(
        f"Start-up with {tasks:,} stored tasks ({load.jobs:,} jobs), {label}",
        ("what", "n", "median", "p99"),
        [
            row("Scheduler.start(), real timers", load.start),
            row("  start + catch-up firings settled", load.settled),
            row("Store.tasks() alone (baseline)", load.read),
            row("longest event-loop stall in start-up", load.stall),
        ],
    )
    start, read = bench.median(load.start), bench.median(load.read)
    print(f"\nfilling the store (not measured): {load.fill_seconds:.1f} s")
    print(f"peak memory: {peak:.0f} MiB")
    print(f"start() / bare read: {start / read:.1f}x (info)")
    slowest = bench.percentile(load.start, 99)
    settled = bench.percentile(load.settled, 99)
    print(
        f"start() p99 {slowest:.3f} s (target ≤ {LOAD_TARGET:g} s): "
        f"{bench.verdict(slowest, LOAD_TARGET)}; with the catch-up settled {settled:.3f} s: "
        f"{bench.verdict(settled, LOAD_TARGET)}"
    )


def report_firing(firing: Firing, count: int, peak: float) -> None:
    bench.print_table(
        f"{count} tasks due in the same second: fire_due() to each turn's start",
        ("what", "n", "median", "p99"),
        [
            row("Scheduler.fire_due()", firing.scheduled),
            row("TurnRunner.submit, same requests (baseline)", firing.submitted),
        ],
    )
    p99 = bench.percentile(firing.scheduled, 99)
    ratio = bench.median(firing.scheduled) / bench.median(firing.submitted)
    print(f"\npeak memory: {peak:.0f} MiB")
    print(f"scheduler / submit, median: {ratio:.2f}x (info)")
    target = f"target ≤ {FIRING_TARGET:g} s"
    print(f"start delay p99 {p99:.3f} s ({target}): {bench.verdict(p99, FIRING_TARGET)}")
    slots = f"{count} tasks x {firing.slots} slots (the last fired by two schedulers, then again)"
    if firing.problems:
        print(f"exactly once: MISS, {slots}:")
        for problem in firing.problems[:10]:
            print(f"  {problem}")
    else:
        print(f"exactly once: PASS, {slots}: one done run and one reply each")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks stored for start-up")
    parser.add_argument("--repeats", type=int, default=5, help="start-ups measured per side")
    parser.add_argument("--firings", type=int, default=100, help="tasks due in the same second")
    parser.add_argument("--rounds", type=int, default=5, help="measured slots per side")
    bench.add_database_arguments(parser)
    args = parser.parse_args()
    bench.check_database_arguments(parser, args)
    if min(args.tasks, args.repeats, args.firings, args.rounds) < 1:
        parser.error("every count must be at least 1")
    label = bench.database_label(args.db, args.db_rtt_ms)
    print(
        f"scheduled tasks: start-up with {args.tasks:,} tasks x {args.repeats}; "
        f"{args.firings} firings x {args.rounds} rounds after a warm-up; store: {label}"
    )
    with (
        bench.database_server(args.db, args.db_rtt_ms) as server,
        bench.fake_ollama(CHUNKS, DELAY_MS) as url,
    ):
        with (
            tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp,
            bench.fresh_database(server, Path(tmp)) as db,
        ):
            load = asyncio.run(measure_load(url, db, Path(tmp), args.tasks, args.repeats))
        load_peak = bench.peak_rss_mib()
        with (
            tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp,
            bench.fresh_database(server, Path(tmp)) as db,
        ):
            firing = asyncio.run(measure_firing(url, db, Path(tmp), args.firings, args.rounds))
    report_load(load, args.tasks, label, load_peak)
    report_firing(firing, args.firings, bench.peak_rss_mib())


if __name__ == "__main__":
    main()
