"""The turn path: every message, scheduled firing and sub-agent report becomes a turn here.

A turn is a background task. `submit` returns at once so the channel keeps reading (which is what
makes `/stop` possible); per conversation, turns run one at a time in arrival order, and different
conversations run side by side.

What runs inside a turn is its body (ARCHITECTURE.md, "Turn bodies"): chat, or a workflow a
command starts (`/plan`). The runner holds the invariants around every body, so a body never
takes a gate, pins, or tells the channel how the turn ended. What a turn uses besides its agent's
own tools (sub-agents, approvals, MCP servers, notes, the task tools) is handed to the runner as
parts (`core.turns.parts`): the runner names none of them, and asks each at the same points.

Invariants (ARCHITECTURE.md); each names the bug it prevents and the test that guards it (in
tests/core/turns/test_runner.py unless named otherwise; tests/workflows/test_plan.py repeats 1-7
with the plan body):

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
   in tests/core/store/test_outages.py.
9. **A message gets one answer, never two and never none.** Its inbox record comes first; a
   redelivery is a duplicate unless no turn ever took the message up, and then one taker wins
   its claim (`core.dispatch.dispatcher`); a shutdown leaves queued messages recorded, and the next
   start answers them, runs once again a turn a crash cut before it showed anything, or tells the
   person (`core.dispatch.recovery`). Prevents a person answered twice after a redelivery, or
   waiting forever after a crash. `test_a_redelivery_that_comes_before_recovery_is_answered_once`
   and `test_messages_queued_at_shutdown_are_answered_at_the_next_start` in
   tests/core/dispatch/test_recovery.py.
"""

import asyncio
import logging
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.context import ContextSettings, ContextWindows, LengthModel
from core.agent.loop import ChatModel
from core.agent.tools import ToolContext, called_from
from core.channel import Channel, Outcome, Reply
from core.errors import KaiwaError
from core.metrics import QUEUED_MESSAGES
from core.store import StartedTurn, Store, not_awaited
from core.store.history import SHUTDOWN
from core.text import parse_command
from core.turns.body import CHAT, BodyTurn, TurnBody
from core.turns.conversations import Conversation, Conversations, LiveTurn
from core.turns.endings import (
    SilentUnlessSaid,
    close_reply,
    count_turn,
    log_turn,
    not_started,
    note_delivery,
    result_of,
    store_failure,
    through_cancellation,
    unsaved_note,
)
from core.turns.parts import Joined, OpenTurn, TurnParts
from core.turns.pump import FramePump
from core.turns.recording import TurnRecorder
from core.turns.turn import (
    LOGGED_TURN,
    Provenance,
    StopReport,
    TurnInLog,
    TurnRequest,
    TurnResult,
    TurnSettings,
)

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0
_RUNNERS: "weakref.WeakSet[TurnRunner]" = weakref.WeakSet()
"""Every runner of this process, for the queued-messages gauge, read only when scraped."""


def _queued() -> int:
    """Turns waiting behind their conversation's running one, in every runner."""
    live = (turn for runner in list(_RUNNERS) for turn in runner._live)
    return sum(turn in turn.conversation.waiting for turn in live)


QUEUED_MESSAGES.set_function(_queued)


class TurnModel(ChatModel, LengthModel, Protocol):
    """What a turn asks of the model client: chat, and a model's context length."""


@dataclass
class _Opened:
    """A turn as the runner opened it, until it ends."""

    recorder: TurnRecorder
    pump: FramePump
    reply: Reply
    joined: Joined
    began: float


class TurnRunner:
    def __init__(
        self,
        store: Store,
        model: TurnModel,
        channels: Mapping[str, Channel],
        settings: TurnSettings,
    ) -> None:
        self._store = store
        self._model = model
        self._channels = channels
        self.settings = settings
        self.conversations = Conversations(
            store, model, settings, ContextWindows(model, settings.context)
        )
        self.parts = TurnParts(carry=self._carry)
        """What turns use besides their agents' own tools (`core.turns.parts`)."""
        self.workflows: dict[str, TurnBody] = {}
        """Turn bodies by the command that starts them (`plan`: a message `/plan <task>`)."""
        self._live: set[LiveTurn] = set()
        _RUNNERS.add(self)
        self.closing = False
        self._why_stopped: dict[int, str] = {}
        """At shutdown: why a turn a part holds stops (stored as the turn's error)."""

    def workflow_of(self, text: str) -> str | None:
        """The workflow a message starts (`/plan <task>` → "plan"), or None for a chat turn."""
        command = parse_command(text)
        if command is None or not command.argument or command.name not in self.workflows:
            return None
        return command.name

    # -- entry points --------------------------------------------------------------------------

    def submit(self, request: TurnRequest) -> "asyncio.Task[TurnResult]":
        """Queue a turn behind its conversation's running one and return at once."""
        if self.closing:
            raise RuntimeError("the turn runner is shutting down")
        conversation = self.conversations.pinned(request.place)  # invariant 2: before the gate
        name = self.workflow_of(request.text)
        turn = LiveTurn(request, conversation, CHAT if name is None else self.workflows[name])
        conversation.waiting.append(turn)
        turn.task = asyncio.create_task(self._run(turn), name=f"turn {request.place}")
        turn.task.add_done_callback(lambda _: self._release(turn))
        self._live.add(turn)
        return turn.task

    async def run_unattended(self, request: TurnRequest) -> TurnResult:
        """Run a turn with no person waiting on it (a scheduled firing); never raises."""
        try:
            task = self.submit(request)
            await asyncio.wait({task})  # invariant 6: a stopped turn must not cancel our caller
            return result_of(task)
        except Exception as exc:
            logger.exception("unattended turn in %s failed", request.place)
            return TurnResult("failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self, place: str, reason: str = "user") -> StopReport:
        """Stop the running turn in `place` and drop the turns queued behind it (invariant 3)."""
        conversation = self.conversations.get(place)
        if conversation is None:
            return StopReport(stopped_running=False, dropped=0)
        dropped = self._drop_waiting(conversation)
        running = conversation.running
        stopped = running is not None and running.stop(reason)
        return StopReport(stopped_running=stopped, dropped=dropped)

    async def wait_idle(self, place: str) -> None:
        """Wait until no turn of `place` is alive."""
        tasks = [turn.task for turn in self._live if turn.request.place == place]
        if tasks:
            await asyncio.wait(tasks)

    async def start_new_conversation(self, place: str) -> StopReport:
        """`/new`: stop what runs, drop what waits and what parts hold for the conversation,
        then close the conversation in `place`."""
        report = self.stop(place, reason="new conversation")
        await self.parts.forget(place)
        await self.conversations.close(place)
        return report

    def has_live(self, place: str) -> bool:
        """Whether a turn of `place` runs or waits."""
        return any(turn.request.place == place for turn in self._live)

    def handles(self, inbound_event_id: int) -> bool:
        """Whether a live turn (queued or running) answers this recorded message."""
        return any(turn.request.inbound_event_id == inbound_event_id for turn in self._live)

    async def shutdown(self) -> StopReport:
        """Invariant 7: stop every live turn, queued or running, and wait for each to finish.
        Turns still queued never start; their messages stay recorded, unanswered, and the next
        start answers them (`core.dispatch.recovery`). Returns how many were running and
        queued."""
        self.closing = True
        self._why_stopped = await self.parts.shutdown()  # what they hold stays stored
        live = list(self._live)
        queued = 0
        for turn in live:
            if turn in turn.conversation.waiting:
                queued += self._drop_waiting(turn.conversation, reason=SHUTDOWN)
        running = sum(turn.stop(SHUTDOWN) for turn in live if turn.conversation.running is turn)
        if live:
            tasks = [turn.task for turn in live]
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
            for task in stuck:  # a closing notice that hangs (a dead network) is cut short
                task.cancel()
            if stuck:
                await asyncio.wait(stuck)
        return StopReport(stopped_running=running > 0, dropped=queued, running=running)

    # -- the turn ------------------------------------------------------------------------------

    async def _run(self, turn: LiveTurn) -> TurnResult:
        conversation = turn.conversation
        LOGGED_TURN.set(TurnInLog(turn.request.place))  # this task's context alone
        async with conversation.gate:  # invariant 1: the one gate hold of this turn
            conversation.waiting.remove(turn)
            if turn.request.proceed is not None and not turn.request.proceed():
                return TurnResult("skipped")
            conversation.running = turn
            try:
                return await self._execute(turn)
            finally:
                conversation.running = None

    async def _execute(self, turn: LiveTurn) -> TurnResult:
        request, conversation = turn.request, turn.conversation
        channel = self._channels[request.platform]
        try:  # reads; a stop meanwhile still gets its turn recorded, as stopped
            prepared, stopped_early = await through_cancellation(
                self.conversations.prepare(conversation)
            )
        except Exception as exc:
            return await not_started(channel, request, exc)
        messages, context = prepared
        agent = conversation.agent
        assert agent is not None
        opened = OpenTurn(request, agent)
        joined = self.parts.join(opened)
        if request.provenance is Provenance.SUBAGENT and not joined.carried:
            return TurnResult("skipped")  # started to carry what another turn carried meanwhile
        text = "\n\n".join([*joined.carried, *([request.text] if request.text else [])])
        # The turn's row is written while the model call begins; the recorder holds any write
        # (and the pump any frame) until it is stored.
        starting = opened.stored_by(
            self._store.start_turn(self.conversations.turn_start(conversation, request, text))
        )
        starting.add_done_callback(lambda row: Conversations.remember(conversation, row))
        LOGGED_TURN.set(TurnInLog(request.place, starting))
        pictures = {"images": list(request.images)} if request.images else {}
        sent: dict[str, Any] = {"role": "user", "content": text, **pictures}
        messages.append(sent)
        body, now = self._open(turn, opened, starting, joined, messages, context)
        outcome, note, wrapped_up = await self._run_body(turn.body, body, stopped_early)
        turn.finishing = True  # the outcome is decided: a stop from here on changes nothing
        now.pump.halt()  # no frame after the answer is complete; the last edit is the notice's
        sent.pop("images", None)  # images go to the model with their own turn only
        return await self._end(turn, now, outcome, note, wrapped_up)

    def _open(
        self,
        turn: LiveTurn,
        opened: OpenTurn,
        starting: "asyncio.Future[StartedTurn]",
        joined: Joined,
        messages: list[dict[str, Any]],
        context: ContextSettings,
    ) -> tuple[BodyTurn, _Opened]:
        """The turn's recorder, reply and pump, and the turn as its body sees it: the agent's
        tools with every part's, each through the guard."""
        request, conversation, agent = turn.request, turn.conversation, opened.agent
        channel = self._channels[request.platform]
        recorder = TurnRecorder(self._store, starting)
        reply = channel.open_reply(request.place, request.reply_to, on_post=recorder.note_posted)
        if request.silent_marker:
            reply = SilentUnlessSaid(reply, request.silent_marker)
        pump = FramePump(
            reply,
            recorder.frame,
            recorder.save_partial,
            channel.traits.frame_interval,
            name=f"frames {request.place}",
        )
        recorder.on_change = pump.poke
        settings = self.settings
        offered = self.parts.offered(agent, joined)
        body = BodyTurn(
            request,
            agent,
            messages,
            self.parts.guarded(offered, settings.tool_timeout),
            channel,
            opened,
            recorder,
            self._model,
            self.conversations.compactor(conversation, recorder, context),
            settings,
            messages[-1],
        )
        return body, _Opened(recorder, pump, reply, joined, time.monotonic())

    async def _run_body(
        self, body: TurnBody, turn: BodyTurn, stopped_early: bool
    ) -> tuple[Outcome, str | None, bool]:
        """How the body ended, the note to show with it, and whether it was wrapped up."""
        if stopped_early:  # stopped while the turn was being opened
            return Outcome.STOPPED, None, False
        request = turn.request
        author = request.author or request.person or ""
        context = ToolContext(
            request.platform, request.place, request.person, request.provenance.value, author,
            turn=turn.turn_id,
        )  # fmt: skip
        try:
            with called_from(context):
                await self.parts.read(turn)  # what the person's message came with
                ending = await body.run(turn)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return Outcome.STOPPED, None, False
        except KaiwaError as exc:
            return Outcome.FAILED, str(exc), False
        except Exception as exc:
            logger.exception("turn in %s failed unexpectedly", request.place)
            return Outcome.FAILED, f"internal error ({type(exc).__name__}); see the log", False
        return ending.outcome, ending.note, ending.wrapped_up

    async def _end(
        self,
        turn: LiveTurn,
        opened: _Opened,
        outcome: Outcome,
        note: str | None,
        wrapped_up: bool,
    ) -> TurnResult:
        """Invariant 5: the records first (awaited whole, whatever cancellation lands
        meanwhile), then the notice, which a second cancellation may cut short without losing
        anything."""
        request, conversation, recorder = turn.request, turn.conversation, opened.recorder
        error = note if outcome is Outcome.FAILED else self._why_stopped.get(recorder.turn_id or 0)
        recorder.finish(outcome.value, turn.stop_reason, error, wrapped_up=wrapped_up)
        text = recorder.display_text()
        failure = await store_failure(recorder)
        if failure is not None:
            outcome, note, text = Outcome.FAILED, unsaved_note(failure), opened.pump.shown_text
            recorder.mark_unsaved(note)  # invariant 8
            conversation.messages = None  # the store is the truth: the next turn reads it again
            logger.warning("a turn in %s could not be saved: %s", request.place, failure)
        else:
            self.conversations.settle(conversation, recorder, outcome)
        opened.joined.ended(failure is None and outcome is not Outcome.FAILED)
        log_turn(request, outcome, recorder, opened.began, turn.stop_reason, note)
        reply = opened.reply
        await close_reply(opened.pump, reply, text, outcome, note, recorder.frame().tools)
        note_delivery(request, recorder, reply)
        count_turn(request, outcome, recorder, opened.began)
        return TurnResult(
            outcome.value,
            text,
            error,
            recorder.turn_id,
            recorder.usage.model_calls,
            wrapped_up,
            reply.delivery,
            isinstance(reply, SilentUnlessSaid) and reply.silent,
        )

    # -- bookkeeping ---------------------------------------------------------------------------

    def _carry(self, request: TurnRequest) -> None:
        """A part holds something for a conversation: a turn there carries it."""
        if not self.closing and request.platform in self._channels:
            self.submit(request)

    def _drop_waiting(self, conversation: Conversation, reason: str = "dropped") -> int:
        """End the turns queued in `conversation` before they start. A `/stop` marks their
        messages dropped; a shutdown leaves them recorded for the next start to answer."""
        dropped = list(conversation.waiting)
        conversation.waiting.clear()
        for turn in dropped:
            if reason == "dropped" and turn.request.inbound_event_id is not None:
                marking = self._store.mark_inbound(turn.request.inbound_event_id, "dropped")
                not_awaited(marking, "marking a dropped message")
            turn.stop(reason)
        return len(dropped)

    def _release(self, turn: LiveTurn) -> None:
        """Done-callback of every turn task: it runs even for a task cancelled before it started,
        which a `finally` inside the coroutine would not (invariant 2: the pin always ends)."""
        self._live.discard(turn)
        if turn in turn.conversation.waiting:
            turn.conversation.waiting.remove(turn)
        self.conversations.unpin(turn.request.place)
        if not turn.task.cancelled() and turn.task.exception() is not None:
            logger.error(
                "turn task in %s crashed", turn.request.place, exc_info=turn.task.exception()
            )
