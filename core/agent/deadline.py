"""A deadline that slides with activity: one timer per stream, not one per chunk.

A model stream must fail when its first chunk is late (`first` seconds) or when it goes silent
between chunks (`idle` seconds). `asyncio.timeout(...).reschedule()` on every chunk would do it,
but each call allocates a timer handle and reorders the loop's timer heap, and a reply is
thousands of chunks. Here a chunk only stores a timestamp (`touch`); the single timer, when it
fires, either re-arms itself for the time that is left or cancels the task, which `__exit__` turns
into `TimeoutError`, exactly as `asyncio.timeout` does (a cancellation from anyone else passes
through untouched).
"""

import asyncio
from types import TracebackType


class SlidingDeadline:
    def __init__(self, first: float, idle: float) -> None:
        self._first = first
        self._idle = idle
        self._last: float | None = None
        self.expired = False

    @property
    def waiting_for_first(self) -> bool:
        return self._last is None

    def touch(self) -> None:
        """Something arrived: the silence allowance starts again from now."""
        first = self._last is None
        self._last = self._loop.time()
        if first:  # the timer still waits for the (longer) first-chunk limit: bring it forward
            self._timer.cancel()
            self._timer = self._loop.call_at(self._last + self._idle, self._check)

    def __enter__(self) -> "SlidingDeadline":
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("SlidingDeadline must be used inside a task")
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._timer = self._loop.call_at(self._started + self._first, self._check)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        if self.expired and exc_type is asyncio.CancelledError and self._task.uncancel() == 0:
            raise TimeoutError from exc

    def _check(self) -> None:
        limit = self._started + self._first if self._last is None else self._last + self._idle
        if self._loop.time() >= limit:
            self.expired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(limit, self._check)
