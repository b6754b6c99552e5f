"""Request slots: at most `limit` model requests at once, the rest waiting in arrival order.

Ollama serves `OLLAMA_NUM_PARALLEL` requests at once and queues the rest where nobody can see
them, so the queue lives here instead (see `core.agent.model`). Unlike a semaphore, this one tells a
waiter where it stands: `held(on_wait)` calls `on_wait(ahead)` when the request has to wait, and
again once the count has halved since it was last told (or grown: a person's request went ahead
of it), so a person sees "waiting for the model: 40 requests ahead", then 20, 10, 5, 2, 1,
instead of a silent reply. Not every step: each one told is an edit of a message on a platform,
and with hundreds waiting, one edit per request served would flood the platform and starve the
very replies they wait for. A waiter that is cancelled leaves the queue and is never granted a
slot.

Background requests (sub-agents) queue behind every request a person waits for: a person's
message in one conversation never waits behind another's sub-agents, however many there are.
"""

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from core.metrics import MODEL_REQUESTS_IN_FLIGHT, MODEL_REQUESTS_WAITING


@dataclass(eq=False)
class _Waiter:
    granted: "asyncio.Future[None]"
    on_wait: Callable[[int], None]
    background: bool
    told: int = 0
    """The count of requests ahead it was last told (0: none yet)."""

    def tell(self, ahead: int) -> None:
        if not self.told or ahead > self.told or ahead <= self.told // 2:
            self.told = ahead
            self.on_wait(ahead)


class RequestSlots:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._busy = 0
        self._waiting: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> int:
        return self._busy

    @asynccontextmanager
    async def held(
        self, on_wait: Callable[[int], None], *, background: bool = False
    ) -> AsyncIterator[None]:
        """Hold a slot for the block; while waiting for one, `on_wait(requests ahead)`. A
        `background` request waits behind every other."""
        if self._busy < self._limit and not self._waiting:
            self._busy += 1
        else:
            MODEL_REQUESTS_WAITING.inc()
            try:
                await self._wait(on_wait, background)
            finally:
                MODEL_REQUESTS_WAITING.dec()
        MODEL_REQUESTS_IN_FLIGHT.inc()
        try:
            yield
        finally:
            MODEL_REQUESTS_IN_FLIGHT.dec()
            self._release()

    async def _wait(self, on_wait: Callable[[int], None], background: bool) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = _Waiter(granted, on_wait, background)
        behind = len(self._waiting)
        if not background:  # ahead of every background request
            behind = next((i for i, each in enumerate(self._waiting) if each.background), behind)
        self._waiting.insert(behind, entry)
        self._tell_positions(behind)  # it, and those it went ahead of, hear their place
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # granted as it was cancelled: pass the slot on
            elif entry in self._waiting:
                self._waiting.remove(entry)
                self._tell_positions()
            raise

    def _release(self) -> None:
        while self._waiting:
            granted = self._waiting.popleft().granted
            if not granted.done():
                granted.set_result(None)  # the slot passes straight to the next waiter
                self._tell_positions()
                return
        self._busy -= 1

    def _tell_positions(self, first: int = 0) -> None:
        """Tell each waiter from `first` on how many requests it waits behind (those queued
        before it, and the one it waits for), when that is news worth an edit (`_Waiter.tell`)."""
        for index in range(first, len(self._waiting)):
            self._waiting[index].tell(index + 1)
