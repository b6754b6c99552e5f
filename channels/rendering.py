"""How a reply appears on a chat platform, shared by every adapter that edits messages in place.

An adapter supplies a `Transport` (send a message, edit one, show "typing", each in the
platform's own markup and with its own error mapping); `StreamingReply` does the rest, the same
way everywhere:
- The reply is one message that grows: the first frame with something to show sends it, later
  frames edit it. The turn's frame pump paces frames (the channel's `frame_interval`, about one
  a second for Telegram), and the reply itself keeps `min_interval` between two changes, the
  final one included: a stream that ends just after an edit waits out the interval first.
- Past the platform's length limit the text continues in follow-up messages (`split_message`:
  paragraph or line boundaries, code fences closed and reopened). Pieces are recomputed from the
  whole text each time; a piece only changes while it is the last one, so earlier messages are
  not edited again.
- A rate limit (`RateLimited`) delays the next call by what the platform asked. Frames that
  arrive meanwhile are skipped, not queued: the first call after the wait shows the newest state,
  so edits coalesce and the final text is never lost. `finish` waits out the limit and keeps
  trying until the final text is shown.
- Thinking and tool activity appear as one status line under the text while the reply streams,
  and never in the final text. A stopped reply ends with "(stopped)"; a failed one with its reason.
- "Typing…" shows from the moment the reply opens until the first text is visible.
- A platform whose messages can carry a Stop control (`Transport.controls`) gets every message
  sent `live` while the reply streams; `finish` shows each one's final form without it, editing
  a message whose text is already final just to take the control away.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from channels.formatting import split_message
from core.channel import Delivery, Frame, Outcome

logger = logging.getLogger(__name__)

STOPPED_MARK = "(stopped)"
INTERRUPTED_MARK = "(interrupted by a restart)"
TYPING_REFRESH_SECONDS = 4.0
TYPING_GIVE_UP_SECONDS = 300.0
FINISH_ATTEMPTS = 10


class RateLimited(Exception):
    """The platform asked us to wait `retry_after` seconds before the next call."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after:g} s")
        self.retry_after = retry_after


class Transport(Protocol):
    """One place on one platform (a chat, a thread), in the platform's own terms.

    `live` is true while the reply is still being written: a transport with `controls` shows a
    Stop control on such a message; others ignore it.
    """

    limit: int
    measure: Callable[[str], int]
    controls: bool

    async def send(self, text: str, *, live: bool) -> str:
        """Post a new message with `text` (Markdown); return its id. May raise RateLimited."""
        ...

    async def edit(self, message_id: str, text: str, *, live: bool) -> None:
        """Replace a message's text (Markdown). May raise RateLimited."""
        ...

    async def typing(self) -> None:
        """Show that the bot is working (a platform may let this lapse after a few seconds)."""
        ...


@dataclass(frozen=True)
class RenderSettings:
    show_thinking: bool = True
    show_tools: bool = True
    min_interval: float = 0.0
    """Shortest time between two calls that change the reply (the platform's edit rate)."""


@dataclass
class _Shown:
    message_id: str
    text: str
    live: bool
    """Shown with a Stop control, which the final form must take away."""


class StreamingReply:
    def __init__(
        self, transport: Transport, settings: RenderSettings, posted: Sequence[str] = ()
    ) -> None:
        """`posted`: messages an earlier process posted for this reply (taken up again, their
        text unknown, so the final text replaces them)."""
        self._transport = transport
        self._settings = settings
        self._shown: list[_Shown] = [_Shown(message_id, "", True) for message_id in posted]
        self._quiet_until = 0.0
        self.delivery = Delivery.NOTHING
        self._typing = asyncio.create_task(self._keep_typing(), name="typing indicator")

    @property
    def posted(self) -> tuple[str, ...]:
        return tuple(shown.message_id for shown in self._shown)

    async def update(self, frame: Frame) -> None:
        body = _with_status(frame.text, self._status(frame))
        if not body:
            return
        self._stop_typing()
        if asyncio.get_running_loop().time() < self._quiet_until:
            return  # too soon (an interval or a rate limit): a later frame or `finish` shows it
        try:
            await self._show(self._pieces(body), live=True)
        except RateLimited as limited:
            self._keep_quiet(limited.retry_after)

    async def finish(self, text: str, outcome: Outcome, note: str | None) -> None:
        self._stop_typing()
        pieces = self._pieces(final_text(text, outcome, note))
        for _ in range(FINISH_ATTEMPTS):
            if self._shows_finally(pieces):
                self.delivery = Delivery.SHOWN
                return
            await asyncio.sleep(max(0.0, self._quiet_until - asyncio.get_running_loop().time()))
            try:
                await self._show(pieces, live=False)
                self.delivery = Delivery.SHOWN
                return
            except RateLimited as limited:
                logger.info("rate limited: trying again in %g s", limited.retry_after)
                self._keep_quiet(limited.retry_after)
        self.delivery = Delivery.STALE if self._shown else Delivery.NOTHING
        logger.error("gave up showing a reply's final text after %d rate limits", FINISH_ATTEMPTS)

    def _shows_finally(self, pieces: list[str]) -> bool:
        shown = self._shown
        return pieces == [s.text for s in shown] and not any(s.live for s in shown)

    def _keep_quiet(self, seconds: float) -> None:
        until = asyncio.get_running_loop().time() + seconds
        self._quiet_until = max(self._quiet_until, until)

    def _pieces(self, text: str) -> list[str]:
        return split_message(text, self._transport.limit, self._transport.measure)

    async def _show(self, pieces: list[str], *, live: bool) -> None:
        """Make the platform show `pieces`: edit what changed, send what is new."""
        called = False
        live = live and self._transport.controls
        for index, piece in enumerate(pieces):
            if index < len(self._shown):
                shown = self._shown[index]
                if shown.text != piece or shown.live != live:
                    await self._transport.edit(shown.message_id, piece, live=live)
                    shown.text, shown.live, called = piece, live, True
            else:
                message_id = await self._transport.send(piece, live=live)
                self._shown.append(_Shown(message_id, piece, live))
                called = True
        if called:
            self._keep_quiet(self._settings.min_interval)

    def _status(self, frame: Frame) -> str:
        if frame.activity and self._settings.show_tools:
            return frame.activity
        if frame.thinking and self._settings.show_thinking and not frame.text:
            return "thinking…"
        return ""

    async def _keep_typing(self) -> None:
        """Until the first text shows: the platform's indicator, refreshed before it lapses."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TYPING_GIVE_UP_SECONDS):
                while True:
                    try:
                        await self._transport.typing()
                    except Exception as exc:  # a missing indicator is not worth a failed reply
                        logger.debug("typing indicator failed: %s", exc)
                    await asyncio.sleep(TYPING_REFRESH_SECONDS)

    def _stop_typing(self) -> None:
        self._typing.cancel()


async def send_notice(transport: Transport, text: str) -> None:
    """A standalone message (a command's answer, a refusal), split at the limit, sent in full
    even through rate limits."""
    for piece in split_message(text, transport.limit, transport.measure):
        for _ in range(FINISH_ATTEMPTS):
            try:
                await transport.send(piece, live=False)
                break
            except RateLimited as limited:
                await asyncio.sleep(limited.retry_after)


def final_text(text: str, outcome: Outcome, note: str | None) -> str:
    """The reply's last form: the answer, then the stop mark or the failure reason."""
    if outcome is Outcome.STOPPED:
        return _marked(text, STOPPED_MARK)
    if outcome is Outcome.INTERRUPTED:
        return _marked(text, INTERRUPTED_MARK)
    if outcome is Outcome.FAILED:
        reason = f"⚠️ {note}" if note else "⚠️ the reply failed"
        return f"{text}\n\n{reason}" if text else reason
    return text


def _marked(text: str, mark: str) -> str:
    """The text, then one space and the mark (however the text ended)."""
    text = text.rstrip()
    return f"{text} {mark}" if text else mark


def _with_status(text: str, status: str) -> str:
    if not status:
        return text
    line = f"_{status}_"
    return f"{text}\n\n{line}" if text else line
