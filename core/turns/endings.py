"""How a turn ends: its records first, then what the person and the log are told.

Every ending (done, stopped, failed, cut) goes the same way, for every body (invariant 5 in
core/turns/runner.py): the records are queued and awaited to their end, through any cancellation
that lands meanwhile (`through_cancellation`), and only then does the closing notice go out, as
the reply's last edit. A notice that fails or is cancelled is logged and loses nothing, since the
records are stored. A turn that could not even open tells the person so (`not_started`), and one
whose records could not be written says it was not saved (`unsaved_note`, invariant 8).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from core.channel import Card, Channel, Delivery, Frame, Outcome, Reply
from core.errors import StoreError
from core.metrics import FIRST_POST_SECONDS, TURN_SECONDS, TURNS
from core.turns.pump import FramePump
from core.turns.recording import TurnRecorder
from core.turns.turn import TurnRequest, TurnResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def through_cancellation(awaitable: Awaitable[T]) -> tuple[T, bool]:
    """Await `awaitable` to its end even if this task is cancelled meanwhile, and say whether it
    was. A queued store call runs whole either way; this keeps the turn's bookkeeping in step."""
    future = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(future), cancelled
        except asyncio.CancelledError:
            if future.cancelled():
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            cancelled = True


async def store_failure(recorder: TurnRecorder) -> StoreError | None:
    """Wait until the turn's records are stored; the error if they could not be."""
    try:
        await through_cancellation(recorder.flushed())
    except StoreError as exc:
        return exc
    return None


def unsaved_note(error: StoreError) -> str:
    return (
        f"I could not save this reply: {error.plainly}, so it ends here and is marked failed. "
        "Please ask again in a minute."
    )


async def not_started(channel: Channel, request: TurnRequest, error: Exception) -> TurnResult:
    """The conversation could not be read from the store: tell the person, never leave them
    waiting."""
    if isinstance(error, StoreError):
        logger.warning("a turn in %s could not start: %s", request.place, error)
    else:
        logger.error("a turn in %s could not start", request.place, exc_info=error)
    note = (
        f"I could not start on your message: {error.plainly}. Please send it again in a minute."
        if isinstance(error, StoreError)
        else "I could not start on your message (an internal error; see the log). "
        "Please send it again."
    )
    try:
        await channel.notify(request.place, note)
    except Exception:
        logger.exception("telling %s that its turn could not start failed", request.place)
    return TurnResult("failed", error=note)


async def close_reply(
    pump: FramePump,
    reply: Reply,
    text: str,
    outcome: Outcome,
    note: str | None,
    tools: tuple[str, ...],
) -> None:
    """The closing notice: the reply's last edit, after the pump's last frame. A second
    cancellation or a failing platform cuts it short; the records are stored already."""
    try:
        await pump.close()
        await reply.finish(text, outcome, note, tools=tools)
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        logger.warning("the closing notice of a turn was cancelled; its records are stored")
    except Exception:
        logger.exception("the closing notice of a turn failed; its records are stored")


def note_delivery(request: TurnRequest, recorder: TurnRecorder, reply: Reply) -> None:
    """What the platform shows of the reply goes to the store (a turn stored but never shown is
    made visible after a crash); one it does not show in full, to the log too."""
    recorder.delivered(reply.posted, reply.delivery.value)
    if reply.delivery is Delivery.SHOWN:
        return
    shows = "nothing" if reply.delivery is Delivery.NOTHING else "an older text"
    logger.warning(
        "turn %s in %s: the platform shows %s of the reply; the store has it all",
        recorder.turn_id,
        request.place,
        shows,
    )


def log_turn(
    request: TurnRequest,
    outcome: Outcome,
    recorder: TurnRecorder,
    began: float,
    stop_reason: str | None,
    note: str | None,
) -> None:
    """One line per turn: where, which conversation, how it ended and why, what it cost.
    `began` is the turn's start (`time.monotonic`)."""
    seconds = time.monotonic() - began
    usage = recorder.usage
    unknown = "+?" if usage.unknown_calls else ""
    ending = f" stop_reason={stop_reason}" if outcome is Outcome.STOPPED else ""
    if outcome is Outcome.FAILED and note:
        ending = f" reason={' '.join(note.split())!r}"
    logger.info(
        "turn %s place=%s conversation=%s provenance=%s outcome=%s%s model_calls=%d "
        "tokens_in=%d%s tokens_out=%d%s seconds=%.2f",
        recorder.turn_id,
        request.place,
        recorder.conversation_id,
        request.provenance.value,
        outcome.value,
        ending,
        usage.model_calls,
        usage.prompt_tokens,
        unknown,
        usage.output_tokens,
        unknown,
        seconds,
    )


def count_turn(
    request: TurnRequest, outcome: Outcome, recorder: TurnRecorder, began: float
) -> None:
    """The turn in the metrics (`core.metrics`), once its reply has ended on the platform."""
    TURNS.labels(request.platform, outcome.value).inc()
    TURN_SECONDS.labels(request.platform).observe(time.monotonic() - began)
    if recorder.first_posted_at is not None:
        FIRST_POST_SECONDS.labels(request.platform).observe(recorder.first_posted_at - began)


def result_of(task: "asyncio.Task[TurnResult]") -> TurnResult:
    """A finished turn task's result, whatever ended it."""
    if task.cancelled():
        return TurnResult("dropped")
    error = task.exception()
    if error is not None:
        return TurnResult("failed", error=f"{type(error).__name__}: {error}")
    return task.result()


class SilentUnlessSaid:
    """A reply that shows nothing while its text could still be exactly `marker`, and nothing
    at all if it is: a scheduled run with nothing to say posts no message. Once the text is
    anything else, every frame so far goes through as usual."""

    def __init__(self, reply: Reply, marker: str) -> None:
        self._reply = reply
        self._marker = marker.strip()
        self.silent = False

    @property
    def posted(self) -> tuple[str, ...]:
        return self._reply.posted

    @property
    def delivery(self) -> Delivery:
        return Delivery.SHOWN if self.silent else self._reply.delivery

    def _could_be_marker(self, text: str) -> bool:
        return self._marker.startswith(text.strip())

    async def update(self, frame: Frame) -> None:
        if not self._could_be_marker(frame.text):
            await self._reply.update(frame)

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: Sequence[str] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        if outcome is Outcome.DONE and text.strip() == self._marker:
            self.silent = True
            await self._reply.finish("", Outcome.DONE, None, tools=())
            return
        await self._reply.finish(text, outcome, note, tools=tuple(tools), cards=cards)
