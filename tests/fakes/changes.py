"""What every fake server shares: a wake-up on each change it records.

Tests wait for a condition on what a fake has seen ("the bot has posted twice") instead of
sleeping; the fake calls `notify` whenever it records something, and `until` re-checks the
condition then, failing with a readable message when it never holds.
"""

import asyncio
import contextlib
import inspect
from collections.abc import Callable

from tests.fakes.patience import deadline


class Changes:
    def __init__(self) -> None:
        self._tick = asyncio.Event()

    def notify(self) -> None:
        """Something changed: wake everyone waiting."""
        self._tick.set()
        self._tick = asyncio.Event()

    async def next(self) -> None:
        """Wait for the next change."""
        await self._tick.wait()

    async def until(
        self,
        condition: Callable[[], object],
        timeout: float | None,  # noqa: ASYNC109  (the waiting is the point; a deadline is a value)
        what: str | None,
        context: Callable[[], str],
    ) -> None:
        """Return once `condition()` holds; after `timeout` seconds (None: `patience.deadline`)
        raise AssertionError naming `what` (else the condition's source) and the fake's
        `context()`."""
        timeout = deadline() if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    await self.next()
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or describe(condition)}; {context()}"
            ) from None


def describe(condition: Callable[[], object]) -> str:
    """A readable name for a condition: a lambda's source, else its qualified name."""
    name = getattr(condition, "__qualname__", repr(condition))
    if "<lambda>" in name:
        with contextlib.suppress(OSError, TypeError):
            source = inspect.getsource(condition).strip()
            return source[source.find("lambda") :]
    return name
