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

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.channel import Channel, Deliver
from core.errors import ChannelError

if TYPE_CHECKING:
    from core.cluster.leases import Coordinator

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
        return await _set_within(self._stopping, seconds)


class Leased:
    """A channel whose platform connection must be single (Telegram's long poll, a Discord
    gateway, Slack's Socket Mode), in a cluster: it receives only while this worker holds the
    lease `channel:<platform>`, and posts either way. Every worker tries for the lease a few
    times per `failover_seconds`; PostgreSQL ends the holder's lease when it dies, so the next
    try of another worker takes the connection over. Slack's HTTP Events need no lease: every
    worker serves them, and the inbox deduplicates."""

    def __init__(self, supervised: Supervised, coordinator: Coordinator) -> None:
        self.channel = supervised.channel
        self._supervised = supervised
        self._coordinator = coordinator
        self._stopping = asyncio.Event()

    async def run(self) -> Ended:
        platform = self.channel.platform
        try:
            await self.channel.open_for_sending()
        except ChannelError as exc:
            return Ended(platform, exc)
        except Exception as exc:  # posting fails later and says why; receiving may still come
            logger.warning("%s: cannot post yet (%s)", platform, exc)
        lease = f"channel:{platform}"
        interval = self._coordinator.settings.failover_seconds / 3
        while not await self._coordinator.try_lease(lease):
            if await _set_within(self._stopping, interval):
                return Ended(platform)
        logger.info("worker %s holds the %s connection", self._coordinator.worker, platform)
        return await self._supervised.run()

    async def stop(self) -> None:
        self._stopping.set()
        await self._supervised.stop()


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True
