"""The frame pump: shows a turn's progress at most once per interval, saving before it shows.

Streaming chunks arrive far faster than any platform accepts edits, so the turn does not push each
one. The pump wakes when something changed, takes the frame to show, saves what that frame shows
and waits until it is stored (so the store is never behind the screen), pushes the frame, then
rests for the channel's frame interval; whatever changes in the meantime is coalesced into the
next frame. A save that fails (the database is away for longer than a write may wait) means the
frame is not shown; a failing edit is logged. Neither is raised: the turn's outcome does not
depend on its display. Closing lets an edit in flight finish (see `close`).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.channel import Frame, Reply
from core.errors import StoreError

logger = logging.getLogger(__name__)


class FramePump:
    def __init__(
        self,
        reply: Reply,
        frame: Callable[[], Frame],
        save: Callable[[], Awaitable[None]],
        interval: float,
        *,
        name: str,
    ) -> None:
        self._reply = reply
        self._frame = frame
        self._save = save
        self._interval = interval
        self._wake = asyncio.Event()
        self._showing: asyncio.Future[None] | None = None
        self.shown_text = ""
        """The text of the last frame shown: always text that is stored."""
        self._unsaved = False
        self._task = asyncio.create_task(self._run(), name=name)

    def poke(self) -> None:
        """Something changed: show it at the next opportunity."""
        self._wake.set()

    def halt(self) -> None:
        """Start no more frames (an edit already on its way goes on); see `close`."""
        self._task.cancel()

    async def close(self) -> None:
        """Stop pumping. An edit already on its way is let through first: cut short, it could
        reach the platform while the reply believes it did not, and the reply's last word would
        then go out as a second message. Safe to call twice."""
        self.halt()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._showing is not None:
            await asyncio.gather(self._showing, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            frame = self._frame()
            try:
                await self._save()  # queued before the next chunk can change what `frame` shows
            except StoreError as exc:
                if not self._unsaved:
                    logger.warning("showing no more of a reply that could not be saved: %s", exc)
                self._unsaved = True
                continue
            self._showing = asyncio.ensure_future(self._reply.update(frame))
            try:
                await asyncio.shield(self._showing)
                self.shown_text = frame.text
            except Exception:
                logger.exception("showing the partial reply failed; the reply goes on")
            self._showing = None
            if self._interval > 0:
                await asyncio.sleep(self._interval)
