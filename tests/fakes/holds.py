"""Answers a fake keeps waiting, and requests whose client gave up on them.

Some client behaviours only show while a request is still in flight at the right moment: a
reply that cancels its "typing…" request when its text appears leaves that request abandoned
(and, with httpx, possibly its pooled connection taken for good). A fake answers each request
inside `Holds.answering`: while a hold set with `hold(name, until)` does not allow it yet, the
answer waits, a handshake on what the fake has seen, never a sleep; `in_flight(name)` counts the
requests not answered yet (`most_in_flight(name)`: the most there ever were at once), and
`abandoned` names every request whose client went away before its answer was ready, which a
client that never cancels a request in flight does not do. `hang_up` ends a request that took
effect without an answer.
"""

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web

from tests.fakes.changes import Changes
from tests.fakes.patience import deadline

HOLD_SECONDS = deadline()  # past this a held answer goes out anyway, so a failing test ends

Until = Callable[[Mapping[str, Any]], Callable[[], object]]
"""Called with a request's parameters as it arrives; returns the condition its answer awaits."""


class Holds:
    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self._rules: dict[str, Until] = {}
        self._in_flight: Counter[str] = Counter()
        self._most: Counter[str] = Counter()
        self.abandoned: list[str] = []

    def hold(self, name: str, until: Until) -> None:
        """From now on, answer each `name` request only once `until(params)()` holds."""
        self._rules[name] = until

    def release(self, name: str) -> None:
        """Answer later `name` requests at once (those already held keep their condition)."""
        self._rules.pop(name, None)

    def in_flight(self, name: str) -> int:
        return self._in_flight[name]

    def most_in_flight(self, name: str) -> int:
        return self._most[name]

    @contextlib.asynccontextmanager
    async def answering(
        self, request: web.Request, name: str, params: Mapping[str, Any]
    ) -> AsyncIterator[None]:
        """Around the making of one answer: waits for its hold, counts it in flight, and notes
        it as abandoned when its client is gone by the time the answer is ready."""
        self._in_flight[name] += 1
        self._most[name] = max(self._most[name], self._in_flight[name])
        self._changes.notify()
        try:
            rule = self._rules.get(name)
            if rule is not None:
                await self._wait(rule(params))
            yield
        except asyncio.CancelledError:  # the server cancels a handler whose client went away
            self.abandoned.append(name)
            raise
        else:
            if request.transport is None or request.transport.is_closing():
                self.abandoned.append(name)
        finally:
            self._in_flight[name] -= 1
            self._changes.notify()

    async def _wait(self, condition: Callable[[], object]) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HOLD_SECONDS):
                while not condition():
                    await self._changes.next()


def hang_up(request: web.Request) -> web.Response:
    """End a request whose call took effect without answering it: the connection is cut, as a
    network failure after the request arrived does (the client cannot tell whether it worked)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=204)  # never sent: the connection is gone
