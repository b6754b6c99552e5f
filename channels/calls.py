"""What a call to a chat platform can come back with, and how a caller lives with it: one owner
for every adapter and for `channels.rendering` and `channels.notices`.

A transport maps its platform's errors to three kinds and nothing else: `RateLimited` (wait
this long, then try again), `PlatformError` (refused, unreachable, or answered in a way we cannot
use) and `LostMessage` (a post that may be out but cannot be named, so it is never sent again).
`counted_refusals` counts them for the operators where the mapping happens; `keep_trying` and
`paced` are how a final text gets through a platform's limits.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from channels.budget import Action, Pace, Urgency
from core.metrics import PLATFORM_API_ERRORS, PLATFORM_RATE_LIMITS

logger = logging.getLogger(__name__)


class RateLimited(Exception):
    """The platform asked us to wait `retry_after` seconds before the next call."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after:g} s")
        self.retry_after = retry_after


class PlatformError(Exception):
    """The platform refused a call, could not be reached, or answered in a way we cannot use;
    the message says which, in words for the log."""


FindLost = Callable[[], Awaitable[str | None]]
"""How a platform looks again for a lost post: its message's id, None if it did not land;
`LostMessage` while that still cannot be told."""


class LostMessage(PlatformError):
    """A post went through, or may have (its answer never came), but nothing says which message
    it made: it is never sent again. `find`, on a platform that lets a bot read its messages
    back (Slack), looks for it again later."""

    def __init__(self, why: str, find: FindLost | None = None) -> None:
        super().__init__(why)
        self.find = find


@contextlib.contextmanager
def counted_refusals(platform: str, *, rate_limits: bool = True) -> Iterator[None]:
    """Each refusal raised through the block counted for the operators (`core.metrics`): a rate
    limit (unless `rate_limits` is off: the library counts them where it meets them), or any
    other failed call of `platform`'s API. A transport's error mapping runs in it."""
    try:
        yield
    except RateLimited:
        if rate_limits:
            PLATFORM_RATE_LIMITS.labels(platform).inc()
        raise
    except PlatformError:
        PLATFORM_API_ERRORS.labels(platform).inc()
        raise


async def keep_trying(
    attempt: Callable[[], Awaitable[object]],
    seconds: float,
    *,
    first_wait: float = 0.0,
    done: Callable[[], bool] = lambda: False,
) -> None:
    """Call `attempt` until it is not rate limited (or `done()` says nothing is left to do),
    waiting before each try as long as the platform asked. Raises the last `RateLimited` once
    the next try would come later than `seconds` from now."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    wait = max(0.0, first_wait)
    while not done():
        if loop.time() + wait > deadline:
            raise RateLimited(wait)
        await asyncio.sleep(wait)
        try:
            await attempt()
            return
        except RateLimited as limited:
            logger.info("rate limited: trying again in %g s", limited.retry_after)
            wait = limited.retry_after


@contextlib.asynccontextmanager
async def paced(pace: Pace, action: Action) -> AsyncIterator[None]:
    """A call that shows a final text (a notice, a command's answer): it waits for room in the
    place's budget, and a 429 holds the place for as long as the platform asked."""
    slot = await pace.wait(action, Urgency.FINAL)
    try:
        yield
    except RateLimited as limited:
        pace.hold(action, limited.retry_after)
        raise
    finally:
        if slot is not None:
            slot.landed()
