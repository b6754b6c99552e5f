"""The turn path: every message, scheduled firing and sub-agent report becomes a turn here.

A turn is a background task. `submit` returns at once so the channel keeps reading (which is what
makes `/stop` possible); per conversation, turns run one at a time in arrival order, and different
conversations run side by side.

Invariants (ARCHITECTURE.md); each names the bug it prevents and the test that guards it (in
tests/core/test_turns.py unless named otherwise):

1. **One gate hold per turn, taken once.** Nothing that holds a conversation's gate calls code
   that takes one; settings are a snapshot read when the turn starts. Prevents a turn deadlocking
   on its own conversation. `test_invariant_1_gate_taken_once_turns_serialize`.
2. **Pin for the whole turn.** A turn's conversation slot is pinned from `submit` until its task
   is done, so LRU eviction can never give a later message a fresh gate while this one runs.
   Prevents two turns of one conversation running at once.
   `test_invariant_2_pinned_slot_survives_eviction`.
3. **`/stop` has an explicit target**: the running turn of that conversation, and the turns queued
   behind it, which are dropped and counted. Prevents a stop that silently cancels a queued
   message while the running reply goes on.
   `test_invariant_3_stop_targets_running_and_drops_queued`.
4. **Stopping keeps what was said.** The partial text and every finished tool result are queued
   on the store before the stop is handled (a queued write runs whole, whatever is cancelled);
   a call without a result is closed as stopped. Prevents lost partial answers and malformed
   next requests. `test_invariant_4_stop_keeps_partial_text`.
5. **Record before you notify.** Each ending (done, stopped, failed) queues its records and waits
   until they are stored, through any cancellation, then tells the channel. Prevents a second
   cancellation during the notice losing the records.
   `test_invariant_5_records_survive_cancelled_notice`.
6. **An unattended turn never lets an exception escape** into its caller (the scheduler); it
   reports the failure in its conversation and the store. A stop ends a firing, nothing more.
   `test_invariant_6_unattended_failure_is_contained`.
7. **Shutdown waits for every live turn**, running or queued, cancels them and lets them store
   their partial state before the store closes. Prevents losing all but the newest turn per
   conversation at exit. `test_invariant_7_shutdown_waits_for_every_turn`.
8. **The store never leaves a person unanswered.** A turn that cannot be opened, or whose records
   cannot be written while the database is away longer than a write may wait, tells the person;
   its row is then marked failed by a durable write that lands once the database is back, so no
   turn stays `running` while the process lives. Prevents a message silently never answered, and
   a reply shown but not stored. `test_a_reply_that_cannot_be_saved_ends_failed_and_is_marked_
   once_the_database_is_back` and `test_a_message_that_cannot_be_recorded_asks_to_be_sent_again`
   in tests/core/test_outages.py.
9. **A message gets one answer, never two and never none.** Its inbox record comes first; a
   redelivery is a duplicate unless no turn ever took the message up, and then one taker wins
   its claim (`core.dispatcher`); a shutdown leaves queued messages recorded, and the next start
   answers them, runs once again a turn a crash cut before it showed anything, or tells the
   person (`core.recovery`). Prevents a person answered twice after a redelivery, or waiting
   forever after a crash. `test_a_redelivery_that_comes_before_recovery_is_answered_once` and
   `test_messages_queued_at_shutdown_are_answered_at_the_next_start` in
   tests/core/test_recovery.py.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from core.channel import Channel, Delivery, Outcome, Reply
from core.errors import KaiwaError, StoreError
from core.history import history_wire
from core.loop import AgentLoop, ChatModel, LoopSettings
from core.lru import PinnedLRU
from core.pump import FramePump
from core.recording import TurnRecorder
from core.store import StartedTurn, Store, TurnStart, not_awaited
from core.tools import Tool

logger = logging.getLogger(__name__)

T = TypeVar("T")
SHUTDOWN_GRACE_SECONDS = 10.0


class Provenance(StrEnum):
    PERSON = "person"
    SCHEDULE = "schedule"
    SUBAGENT = "subagent"


@dataclass(frozen=True)
class AgentProfile:
    """An agent as configured: who it is, which model it runs on, what it may use."""

    name: str
    model: str
    system_prompt: str
    tools: Mapping[str, Tool]
    think: bool | None = None
    max_iterations: int = 10
    images: bool = False
    """Whether the model reads images (a vision model)."""


@dataclass(frozen=True)
class TurnSettings:
    """Read once at the start of each turn (invariant 1: a snapshot, never a lock)."""

    agent: AgentProfile
    tool_timeout: float = 60.0
    max_cached_conversations: int = 1000


@dataclass(frozen=True)
class TurnRequest:
    platform: str
    place: str
    text: str
    provenance: Provenance = Provenance.PERSON
    author: str | None = None
    reply_to: str | None = None
    inbound_event_id: int | None = None
    images: tuple[bytes, ...] = ()
    attempt: int = 1
    """2 for a turn run again because a restart interrupted it before it showed anything."""


@dataclass(frozen=True)
class TurnResult:
    status: str
    text: str = ""
    error: str | None = None
    turn_id: int | None = None


@dataclass(frozen=True)
class StopReport:
    stopped_running: bool
    dropped: int
    running: int = 0
    """At shutdown: how many turns were running (each stopped)."""


@dataclass
class _Slot:
    """Everything one conversation needs between turns; lives in the pinned LRU."""

    place: str
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: "_Turn | None" = None
    waiting: list["_Turn"] = field(default_factory=list)
    conversation_id: int | None = None
    messages: list[dict[str, object]] | None = None
    """The model-facing history; None until read from the store (and after it may be stale)."""


@dataclass(eq=False)
class _Turn:
    request: TurnRequest
    slot: _Slot
    task: "asyncio.Task[TurnResult]" = field(init=False)
    stop_reason: str | None = None
    finishing: bool = False

    def stop(self, reason: str) -> bool:
        """Ask the turn to stop; False if it was already recorded and is sending its last edit."""
        if self.finishing:
            return False
        if self.stop_reason is None:
            self.stop_reason = reason
            self.task.cancel()
        return True


class TurnRunner:
    def __init__(
        self,
        store: Store,
        model: ChatModel,
        channels: Mapping[str, Channel],
        settings: TurnSettings,
    ) -> None:
        self._store = store
        self._model = model
        self._channels = channels
        self.settings = settings
        self._slots: PinnedLRU[str, _Slot] = PinnedLRU(settings.max_cached_conversations)
        self._live: set[_Turn] = set()
        self.closing = False

    # -- entry points --------------------------------------------------------------------------

    def submit(self, request: TurnRequest) -> "asyncio.Task[TurnResult]":
        """Queue a turn behind its conversation's running one and return at once."""
        if self.closing:
            raise RuntimeError("the turn runner is shutting down")
        slot = self._slots.get_or_create(request.place, lambda: _Slot(request.place))
        self._slots.pin(request.place)  # invariant 2: pinned before the gate, for the task's life
        turn = _Turn(request, slot)
        slot.waiting.append(turn)
        turn.task = asyncio.create_task(self._run(turn), name=f"turn {request.place}")
        turn.task.add_done_callback(lambda _: self._release(turn))
        self._live.add(turn)
        return turn.task

    async def run_unattended(self, request: TurnRequest) -> TurnResult:
        """Run a turn with no person waiting on it (a scheduled firing); never raises."""
        try:
            task = self.submit(request)
            await asyncio.wait({task})  # invariant 6: a stopped turn must not cancel our caller
            return _result_of(task)
        except Exception as exc:
            logger.exception("unattended turn in %s failed", request.place)
            return TurnResult("failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self, place: str, reason: str = "user") -> StopReport:
        """Stop the running turn in `place` and drop the turns queued behind it (invariant 3)."""
        slot = self._slots.get(place)
        if slot is None:
            return StopReport(stopped_running=False, dropped=0)
        dropped = self._drop_waiting(slot)
        stopped = slot.running is not None and slot.running.stop(reason)
        return StopReport(stopped_running=stopped, dropped=dropped)

    async def wait_idle(self, place: str) -> None:
        """Wait until no turn of `place` is alive."""
        tasks = [turn.task for turn in self._live if turn.request.place == place]
        if tasks:
            await asyncio.wait(tasks)

    async def start_new_conversation(self, place: str) -> StopReport:
        """`/new`: stop what runs, drop what waits, then close the conversation in `place`."""
        report = self.stop(place, reason="new conversation")
        slot = self._slots.get_or_create(place, lambda: _Slot(place))
        self._slots.pin(place)
        try:
            async with slot.gate:
                conversation_id = slot.conversation_id
                if conversation_id is None:
                    active = await self._store.active_conversation(place)
                    conversation_id = active.id if active else None
                if conversation_id is not None:
                    await self._store.close_conversation(conversation_id)
                slot.conversation_id, slot.messages = None, None
        finally:
            self._slots.unpin(place)
        return report

    def handles(self, inbound_event_id: int) -> bool:
        """Whether a live turn (queued or running) answers this recorded message."""
        return any(turn.request.inbound_event_id == inbound_event_id for turn in self._live)

    async def shutdown(self) -> StopReport:
        """Invariant 7: stop every live turn, queued or running, and wait for each to finish.
        Turns still queued never start; their messages stay recorded, unanswered, and the next
        start answers them (`core.recovery`). Returns how many were running and queued."""
        self.closing = True
        live = list(self._live)
        queued = 0
        for turn in live:
            if turn in turn.slot.waiting:
                queued += self._drop_waiting(turn.slot, reason="shutdown")
        running = sum(turn.stop("shutdown") for turn in live if turn.slot.running is turn)
        if live:
            tasks = [turn.task for turn in live]
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
            for task in stuck:  # a closing notice that hangs (a dead network) is cut short
                task.cancel()
            if stuck:
                await asyncio.wait(stuck)
        return StopReport(stopped_running=running > 0, dropped=queued, running=running)

    # -- the turn ------------------------------------------------------------------------------

    async def _run(self, turn: _Turn) -> TurnResult:
        slot = turn.slot
        async with slot.gate:  # invariant 1: the one gate hold of this turn
            slot.waiting.remove(turn)
            slot.running = turn
            try:
                return await self._execute(turn, self.settings)
            finally:
                slot.running = None

    async def _execute(self, turn: _Turn, settings: TurnSettings) -> TurnResult:
        request, agent, slot = turn.request, settings.agent, turn.slot
        channel = self._channels[request.platform]
        try:  # a read; a stop meanwhile still gets its turn recorded, as stopped
            messages, stopped_early = await _through_cancellation(self._history(slot, agent))
        except Exception as exc:
            return await self._not_started(channel, request, exc)
        # The turn's row is written while the model call begins; the recorder holds any write
        # (and the pump any frame) until it is stored.
        starting = asyncio.ensure_future(self._store.start_turn(self._turn_start(slot, request)))
        starting.add_done_callback(lambda stored: _remember_conversation(slot, stored))
        recorder = TurnRecorder(self._store, starting)
        said = {"role": "user", "content": request.text}
        messages.append({**said, "images": list(request.images)} if request.images else said)
        said_at = len(messages) - 1
        reply = channel.open_reply(request.place, request.reply_to)
        pump = FramePump(
            reply,
            recorder.frame,
            recorder.save_partial,
            channel.traits.frame_interval,
            name=f"frames {request.place}",
            shown=lambda: recorder.note_posted(reply.posted),
        )
        recorder.on_change = pump.poke
        loop = AgentLoop(
            self._model,
            agent.tools,
            recorder,
            LoopSettings(
                agent=agent.name,
                model=agent.model,
                think=agent.think,
                max_iterations=agent.max_iterations,
                tool_timeout=settings.tool_timeout,
            ),
        )
        began = time.monotonic()
        outcome, note = await self._run_loop(loop, messages, stopped_early, request)
        turn.finishing = True  # the outcome is decided: a stop from here on changes nothing
        pump.halt()  # no frame after the answer is complete; the last edit is the notice's
        messages[said_at] = said  # images go to the model with their own turn only
        # invariant 5: records first (awaited whole, whatever cancellation lands meanwhile) ...
        recorder.finish(outcome.value, turn.stop_reason, note)
        text = recorder.display_text()
        failure = await _store_failure(recorder)
        if failure is not None:
            outcome, note, text = Outcome.FAILED, _unsaved_note(failure), pump.shown_text
            recorder.mark_unsaved(note)  # invariant 8
            slot.messages = None  # the store is the truth: the next turn reads it again
            logger.warning("a turn in %s could not be saved: %s", request.place, failure)
        seconds = time.monotonic() - began
        self._log_turn(request, outcome, recorder, seconds, turn.stop_reason, note)
        # ... then the notice, which a second cancellation may cut short without losing anything.
        await self._notify(pump, reply, text, outcome, note, recorder.frame().tools)
        self._note_delivery(request, recorder, reply)
        return TurnResult(outcome.value, text, note, recorder.turn_id)

    def _note_delivery(self, request: TurnRequest, recorder: TurnRecorder, reply: Reply) -> None:
        """A reply the platform does not show in full is said in the log and the store."""
        if reply.delivery is Delivery.SHOWN:
            return
        shows = "nothing" if reply.delivery is Delivery.NOTHING else "an older text"
        logger.warning(
            "turn %s in %s: the platform shows %s of the reply; the store has it all",
            recorder.turn_id,
            request.place,
            shows,
        )
        recorder.delivered(reply.posted, reply.delivery.value)

    async def _run_loop(
        self,
        loop: AgentLoop,
        messages: list[dict[str, object]],
        stopped_early: bool,
        request: TurnRequest,
    ) -> tuple[Outcome, str | None]:
        if stopped_early:  # stopped while the turn was being opened
            return Outcome.STOPPED, None
        try:
            await loop.run(messages)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return Outcome.STOPPED, None
        except KaiwaError as exc:
            return Outcome.FAILED, str(exc)
        except Exception as exc:
            logger.exception("turn in %s failed unexpectedly", request.place)
            return Outcome.FAILED, f"internal error ({type(exc).__name__}); see the log"
        return Outcome.DONE, None

    async def _history(self, slot: _Slot, agent: AgentProfile) -> list[dict[str, object]]:
        """The conversation's model-facing history, kept in the slot between turns; read from
        the store the first time (a conversation that does not exist yet starts with the
        agent's system prompt, with which it will be opened)."""
        if slot.messages is None:
            stored = await self._store.conversation_of(slot.place)
            conversation = stored.conversation
            prompt = conversation.system_prompt if conversation else agent.system_prompt
            slot.conversation_id = conversation.id if conversation else None
            history = history_wire(stored.messages, stored.endings)
            slot.messages = [{"role": "system", "content": prompt}, *history]
        return slot.messages

    def _turn_start(self, slot: _Slot, request: TurnRequest) -> TurnStart:
        agent = self.settings.agent
        return TurnStart(
            place=request.place,
            agent=agent.name,
            system_prompt=str(slot.messages[0]["content"]) if slot.messages else "",
            provenance=request.provenance.value,
            text=request.text,
            author=request.author,
            inbound_event_id=request.inbound_event_id,
            conversation_id=slot.conversation_id,
            attempt=request.attempt,
        )

    async def _not_started(
        self, channel: Channel, request: TurnRequest, error: Exception
    ) -> TurnResult:
        """The conversation could not be read from the store: tell the person, never leave
        them waiting."""
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

    async def _notify(
        self,
        pump: FramePump,
        reply: Reply,
        text: str,
        outcome: Outcome,
        note: str | None,
        tools: tuple[str, ...],
    ) -> None:
        try:
            await pump.close()
            await reply.finish(text, outcome, note, tools=tools)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            logger.warning("the closing notice of a turn was cancelled; its records are stored")
        except Exception:
            logger.exception("the closing notice of a turn failed; its records are stored")

    def _log_turn(
        self,
        request: TurnRequest,
        outcome: Outcome,
        recorder: TurnRecorder,
        seconds: float,
        stop_reason: str | None,
        note: str | None,
    ) -> None:
        """One line per turn: where, which conversation, how it ended and why, what it cost."""
        usage = recorder.usage
        ending = f" stop_reason={stop_reason}" if outcome is Outcome.STOPPED else ""
        if outcome is Outcome.FAILED and note:
            ending = f" reason={' '.join(note.split())!r}"
        logger.info(
            "turn %s place=%s conversation=%s provenance=%s outcome=%s%s model_calls=%d "
            "tokens_in=%d tokens_out=%d seconds=%.2f",
            recorder.turn_id,
            request.place,
            recorder.conversation_id,
            request.provenance.value,
            outcome.value,
            ending,
            usage.model_calls,
            usage.prompt_tokens,
            usage.output_tokens,
            seconds,
        )

    # -- bookkeeping ---------------------------------------------------------------------------

    def _drop_waiting(self, slot: _Slot, reason: str = "dropped") -> int:
        """End the turns queued in `slot` before they start. A `/stop` marks their messages
        dropped; a shutdown leaves them recorded for the next start to answer."""
        dropped = list(slot.waiting)
        slot.waiting.clear()
        for turn in dropped:
            if reason == "dropped" and turn.request.inbound_event_id is not None:
                marking = self._store.mark_inbound(turn.request.inbound_event_id, "dropped")
                not_awaited(marking, "marking a dropped message")
            turn.stop(reason)
        return len(dropped)

    def _release(self, turn: _Turn) -> None:
        """Done-callback of every turn task: it runs even for a task cancelled before it started,
        which a `finally` inside the coroutine would not (invariant 2: the pin always ends)."""
        self._live.discard(turn)
        if turn in turn.slot.waiting:
            turn.slot.waiting.remove(turn)
        self._slots.unpin(turn.request.place)
        if not turn.task.cancelled() and turn.task.exception() is not None:
            logger.error(
                "turn task in %s crashed", turn.request.place, exc_info=turn.task.exception()
            )


async def _through_cancellation(awaitable: Awaitable[T]) -> tuple[T, bool]:
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


async def _store_failure(recorder: TurnRecorder) -> StoreError | None:
    """Wait until the turn's records are stored; the error if they could not be."""
    try:
        await _through_cancellation(recorder.flushed())
    except StoreError as exc:
        return exc
    return None


def _unsaved_note(error: StoreError) -> str:
    return (
        f"I could not save this reply: {error.plainly}, so it ends here and is marked failed. "
        "Please ask again in a minute."
    )


def _remember_conversation(slot: _Slot, stored: "asyncio.Future[StartedTurn]") -> None:
    """A turn's row is stored: the slot now knows its conversation (a new one, perhaps); if it
    could not be stored, the slot reads the store again next time."""
    if not stored.cancelled() and stored.exception() is None:
        slot.conversation_id = stored.result().conversation_id
    else:
        slot.messages = None


def _result_of(task: "asyncio.Task[TurnResult]") -> TurnResult:
    if task.cancelled():
        return TurnResult("dropped")
    error = task.exception()
    if error is not None:
        return TurnResult("failed", error=f"{type(error).__name__}: {error}")
    return task.result()
