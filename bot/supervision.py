"""Channels run side by side, and one that fails does not take the others down.

Each channel's `run` is watched by a `Supervised`. When it raises, the channel is restarted
with backoff (1 s doubling to a minute), said in the log with the reason, while the others go on
answering: an event a library cannot parse, a dropped connection it did not survive, or a bug in
an adapter costs that channel a restart, not the bot. Two endings are not retried:
- the channel ends by itself (the terminal's end of input): the bot shuts down, exit status 0;
- the channel raises `ChannelError` (a platform refused its token or a permission): that needs
  a person, so the bot shuts down with the error and a non-zero exit status, for a service
  manager to see.
"""

import asyncio
import logging
from dataclasses import dataclass

from core.channel import Channel, Deliver
from core.errors import ChannelError

logger = logging.getLogger(__name__)

FIRST_PAUSE, MAX_PAUSE = 1.0, 60.0


@dataclass(frozen=True)
class Ended:
    """How a supervised channel ended: by itself (`error` None) or needing a person."""

    platform: str
    error: ChannelError | None = None


class Supervised:
    def __init__(
        self, channel: Channel, deliver: Deliver, *, first_pause: float = FIRST_PAUSE
    ) -> None:
        self.channel = channel
        self._deliver = deliver
        self._first_pause = first_pause
        self._stopping = asyncio.Event()

    async def run(self) -> Ended:
        pause = self._first_pause
        while True:
            try:
                await self.channel.run(self._deliver)
                return Ended(self.channel.platform)
            except ChannelError as exc:
                self.channel.problem = str(exc)
                return Ended(self.channel.platform, exc)
            except Exception as exc:
                if self._stopping.is_set():
                    return Ended(self.channel.platform)
                self.channel.connected.clear()
                # A channel that knows what went wrong said it (with the fix) in `problem`.
                self.channel.problem = self.channel.problem or str(exc) or type(exc).__name__
                logger.error(
                    "%s stopped (%s: %s); restarting it in %g s, the other channels go on",
                    self.channel.platform,
                    type(exc).__name__,
                    exc,
                    pause,
                    exc_info=logger.isEnabledFor(logging.DEBUG),
                )
            if await self._stopped_within(pause):
                return Ended(self.channel.platform)
            pause = min(pause * 2, MAX_PAUSE)

    async def stop(self) -> None:
        """Stop receiving, and do not restart."""
        self._stopping.set()
        await self.channel.stop_receiving()

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True
