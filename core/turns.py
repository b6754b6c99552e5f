"""The turn path: every message, scheduled firing and sub-agent report becomes a turn here.

A turn is a background task. `submit` returns at once so the channel keeps reading (which is what
makes `/stop` possible); per conversation, turns run one at a time in arrival order, and different
conversations run side by side.

Invariants (DESIGN.md); each names the bug it prevents and the test in tests/core/test_turns.py
that guards it:

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
4. **Stopping keeps what was said.** The partial text and every finished tool result are stored
   before the stop is handled; a call without a result is closed as stopped. Prevents lost
   partial answers and malformed next requests. `test_invariant_4_stop_keeps_partial_text`.
5. **Record before you notify.** Each ending (done, stopped, failed) writes the store first, then
   tells the channel. Prevents a second cancellation during the notice losing the records.
   `test_invariant_5_records_survive_cancelled_notice`.
6. **An unattended turn never lets an exception escape** into its caller (the scheduler); it
   reports the failure in its conversation and the store. A stop ends a firing, nothing more.
   `test_invariant_6_unattended_failure_is_contained`.
7. **Shutdown waits for every live turn**, running or queued, cancels them and lets them store
   their partial state before the store closes. Prevents losing all but the newest turn per
   conversation at exit. `test_invariant_7_shutdown_waits_for_every_turn`.
"""

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from core.channel import Channel, Outcome, Reply
from core.errors import KaiwaError
from core.loop import AgentLoop, ChatModel, LoopSettings
from core.lru import PinnedLRU
from core.pump import FramePump
from core.recording import TurnRecorder
from core.store import Store, history_wire
from core.tables import Conversation
from core.tools import Tool

logger = logging.getLogger(__name__)

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


@dataclass
class _Slot:
    """Everything one conversation needs between turns; lives in the pinned LRU."""

    place: str
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: "_Turn | None" = None
    waiting: list["_Turn"] = field(default_factory=list)
    conversation: Conversation | None = None
    messages: list[dict[str, object]] | None = None


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
                conversation = slot.conversation or self._store.active_conversation(place)
                if conversation is not None and conversation.id is not None:
                    self._store.close_conversation(conversation.id)
                slot.conversation, slot.messages = None, None
        finally:
            self._slots.unpin(place)
        return report

    async def shutdown(self) -> None:
        """Invariant 7: stop every live turn, queued or running, and wait for each to finish."""
        self.closing = True
        live = list(self._live)
        for turn in live:
            if turn in turn.slot.waiting:
                self._drop_waiting(turn.slot)
            turn.stop("shutdown")
        if not live:
            return
        tasks = [turn.task for turn in live]
        _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
        for task in stuck:  # a closing notice that hangs (a dead network) is cut short
            task.cancel()
        if stuck:
            await asyncio.wait(stuck)

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
        request, agent = turn.request, settings.agent
        conversation, messages = self._conversation(turn.slot, agent)
        assert conversation.id is not None
        turn_id = self._store.start_turn(
            conversation.id, request.provenance.value, request.text, request.author
        )
        said = {"role": "user", "content": request.text}
        messages.append({**said, "images": list(request.images)} if request.images else said)
        said_at = len(messages) - 1
        channel = self._channels[request.platform]
        reply = channel.open_reply(request.place, request.reply_to)
        recorder = TurnRecorder(self._store, conversation.id, turn_id)
        pump = FramePump(
            reply,
            recorder.frame,
            recorder.save_partial,
            channel.traits.frame_interval,
            name=f"frames {request.place}",
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
        started = time.monotonic()
        try:
            await loop.run(messages)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            outcome, note = Outcome.STOPPED, None
        except KaiwaError as exc:
            outcome, note = Outcome.FAILED, str(exc)
        except Exception as exc:
            logger.exception("turn in %s failed unexpectedly", request.place)
            outcome, note = Outcome.FAILED, f"internal error ({type(exc).__name__}); see the log"
        else:
            outcome, note = Outcome.DONE, None
        messages[said_at] = said  # images go to the model with their own turn only
        # invariant 5: records first (synchronous, so no cancellation can tear them) ...
        self._store.finish_turn(turn_id, outcome.value, stop_reason=turn.stop_reason, error=note)
        self._log_turn(request, outcome, recorder, time.monotonic() - started)
        turn.finishing = True
        # ... then the notice, which a second cancellation may cut short without losing anything.
        text = recorder.display_text()
        await self._notify(pump, reply, text, outcome, note)
        return TurnResult(outcome.value, text, note, turn_id)

    def _conversation(
        self, slot: _Slot, agent: AgentProfile
    ) -> tuple[Conversation, list[dict[str, object]]]:
        """The conversation in this place and its model-facing history, cached in the slot."""
        if slot.conversation is None or slot.messages is None:
            conversation = self._store.active_conversation(slot.place)
            if conversation is None:
                conversation = self._store.open_conversation(
                    slot.place, agent.name, agent.system_prompt
                )
                history = []
            else:
                assert conversation.id is not None
                history = history_wire(self._store.history(conversation.id))
            slot.conversation = conversation
            slot.messages = [{"role": "system", "content": conversation.system_prompt}, *history]
        return slot.conversation, slot.messages

    async def _notify(
        self, pump: FramePump, reply: Reply, text: str, outcome: Outcome, note: str | None
    ) -> None:
        try:
            await pump.close()
            await reply.finish(text, outcome, note)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            logger.warning("the closing notice of a turn was cancelled; its records are stored")
        except Exception:
            logger.exception("the closing notice of a turn failed; its records are stored")

    def _log_turn(
        self, request: TurnRequest, outcome: Outcome, recorder: TurnRecorder, seconds: float
    ) -> None:
        usage = recorder.usage
        logger.info(
            "turn %s conversation=%s provenance=%s outcome=%s model_calls=%d tokens_in=%d "
            "tokens_out=%d seconds=%.2f",
            recorder.turn_id,
            request.place,
            request.provenance.value,
            outcome.value,
            usage.model_calls,
            usage.prompt_tokens,
            usage.output_tokens,
            seconds,
        )

    # -- bookkeeping ---------------------------------------------------------------------------

    def _drop_waiting(self, slot: _Slot) -> int:
        dropped = list(slot.waiting)
        slot.waiting.clear()
        for turn in dropped:
            if turn.request.inbound_event_id is not None:
                self._store.mark_inbound(turn.request.inbound_event_id, "dropped")
            turn.stop("dropped")
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


def _result_of(task: "asyncio.Task[TurnResult]") -> TurnResult:
    if task.cancelled():
        return TurnResult("dropped")
    error = task.exception()
    if error is not None:
        return TurnResult("failed", error=f"{type(error).__name__}: {error}")
    return task.result()
