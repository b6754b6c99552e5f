"""Each task's timer: one APScheduler job per task, that only wakes the scheduler up.

The rows are the truth, and a job holds nothing of its own: `AsyncIOScheduler` keeps one job per
task for the life of the process, built from the rows at start-up (`track`), each a one-off at
the task's next slot that the scheduler arms again at every wake. A changed row re-arms its job,
a paused, cancelled or finished task loses it. Without timers (tests, which never wait for a
real clock) nothing wakes by itself: `due` says which tasks the test's clock has reached.
"""

import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from core.features.schedule.timing import aware
from core.store.tables import ScheduledTask


class Timers:
    def __init__(self, wake: Callable[[int], Awaitable[None]], *, enabled: bool) -> None:
        self._wake = wake
        self._jobs = AsyncIOScheduler(timezone=UTC) if enabled else None
        self._wanted: dict[int, datetime] = {}
        """Tasks whose slots fire (enabled, not cancelled), each with its next slot."""

    def __len__(self) -> int:
        return len(self._wanted)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._wanted

    def start(self) -> None:
        if self._jobs is not None:
            self._jobs.start()

    def stop(self) -> None:
        """No more wakes (running firings go on)."""
        if self._jobs is not None and self._jobs.running:
            self._jobs.shutdown(wait=False)

    def track(self, task: ScheduledTask) -> None:
        """Keep `task` runnable and its job in step with its row (`next_run` the row's or the
        one just claimed)."""
        assert task.id is not None
        if not task.enabled or task.cancelled_at is not None or task.next_run is None:
            self.untrack(task.id)
            return
        slot = aware(task.next_run)
        self._wanted[task.id] = slot
        self.arm(task.id, slot)

    def untrack(self, task_id: int) -> None:
        self._wanted.pop(task_id, None)
        if self._jobs is not None:
            with contextlib.suppress(Exception):  # no job: nothing to remove
                self._jobs.remove_job(str(task_id))

    def arm(self, task_id: int, at: datetime) -> None:
        """The task's job wakes at `at` (a one-off: each wake arms the next)."""
        if self._jobs is None:
            return
        self._jobs.add_job(
            self._wake,
            trigger=DateTrigger(run_date=at, timezone=UTC),
            args=[task_id],
            id=str(task_id),
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,
        )

    def due(self, now: datetime) -> list[int]:
        """The tasks whose slot has come at `now`, in id order."""
        return sorted(task_id for task_id, slot in self._wanted.items() if slot <= now)

    def jobs(self) -> dict[int, datetime | None]:
        """Each task's job and the next time it wakes (None without timers)."""
        if self._jobs is None:
            return dict.fromkeys(sorted(self._wanted))
        return {int(job.id): aware(job.next_run_time) for job in self._jobs.get_jobs()}
