"""The turn's loop sink: queues a record of everything the moment it exists, and keeps the display.

The agent loop reports synchronously, and each report queues its write on the store at once
(`core.store` runs queued calls in order), so by the time a stop can land, whatever the loop
reported is already on its way to the database and nothing can take it back. Writes are awaited
only where something must come after them: `save_partial` before the frame pump shows a frame
(the text a person sees is never ahead of the store), and `flushed` before the closing notice
(invariant 5 in core/turns/runner.py).

The turn's own row is still being written when the model call begins (`starting`), so the first
model call does not wait for a database round trip; writes reported before that row exists are
held here and queued, in order, the moment it does. Awaiting any write awaits the row first.

Each message has its place in the turn (`seq`; the person's message is 0), and saving it again
replaces it, so the streaming text can be saved as often as frames are shown. A message without
tool calls is the turn's answer: it is held and written with the turn's ending, in the same
transaction, unless a frame shows it first.

The text a person sees and the stored text are built from the same strings: the answers of the
turn's assistant messages joined by blank lines (`display_text`), after the turn's preface when
it has one (what was heard of a voice note, `preface`), which the model never reads as its own.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from core.agent.loop import LoopSink
from core.agent.messages import (
    AssistantMessage,
    Instruction,
    PersonMessage,
    ToolCall,
    ToolResult,
    Usage,
    UsageTotals,
)
from core.channel import Frame
from core.errors import StoreError
from core.store import (
    PENDING_DELIVERY,
    UNSURE_DELIVERY,
    CompactionRecord,
    StartedTurn,
    Store,
    TurnMessage,
    TurnState,
    not_awaited,
)
from core.store.tables import utc_now

logger = logging.getLogger(__name__)

PARAGRAPH = "\n\n"


Write = tuple[list[tuple[int, TurnMessage]], TurnState | None, CompactionRecord | None]


class TurnRecorder(LoopSink):
    def __init__(self, store: Store, starting: "asyncio.Future[StartedTurn]") -> None:
        self._store = store
        self._starting = starting
        self._started: StartedTurn | None = None
        self._settled = False
        """`starting` is done and its outcome taken in (its callback ran, not only resolved)."""
        self._held: list[tuple[Write, asyncio.Future[None]]] = []
        starting.add_done_callback(self._turn_stored)
        self.usage = UsageTotals()
        self._seq = 1
        """The place in the turn of the assistant message being written."""
        self.seqs: list[int] = []
        """The place in the turn of each message the loop added to the history, in order."""
        self._said: list[str] = []
        self._preface = ""
        self._text = ""
        self._thinking = ""
        self._answer: AssistantMessage | None = None
        self._activity: str | None = None
        self._tools: list[str] = []
        self._saved = ("", "")
        self._reply_ids: tuple[str, ...] = ()
        self._ending: TurnState | None = None
        self._writes: list[asyncio.Future[None]] = []
        self._failure: BaseException | None = None
        self._unsaved = False
        self._framed = False
        self.first_posted_at: float | None = None
        """When the reply first showed on the platform (`time.monotonic`), for the metrics."""
        """A frame was saved to be shown: a post may be out whose id is not known yet."""
        self.on_change: Callable[[], None] = _nothing

    @property
    def turn_id(self) -> int | None:
        """The turn's row, once it is stored."""
        return self._started.turn_id if self._started else None

    @property
    def conversation_id(self) -> int | None:
        return self._started.conversation_id if self._started else None

    # -- LoopSink ------------------------------------------------------------------------------

    def status(self, text: str) -> None:
        self._activity = text
        self.on_change()

    def thinking(self, delta: str) -> None:
        self._thinking += delta
        self._activity = None
        self.on_change()

    def text(self, delta: str) -> None:
        self._text += delta
        self._activity = None
        self.on_change()

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self.usage.add(usage)
        held = self._take_answer()
        if message is None:
            self._write(held, state=self._state())
            return
        self.seqs.append(self._seq)
        if message.tool_calls:
            self._write([*held, (self._seq, message)], state=self._state())
        else:
            self._write(held)
            self._answer = message
        if message.text:
            self._said.append(message.text)
        self._seq += 1
        self._text, self._thinking = "", ""
        self._saved = ("", "")
        self.on_change()

    def tool_started(self, call: ToolCall) -> None:
        self._activity = f"using {call.name}…"
        self._tools.append(call.name)
        self.on_change()

    def tool_finished(self, result: ToolResult) -> None:
        self.seqs.append(self._seq)
        self._write([(self._seq, result)])
        self._seq += 1

    def instruct(self, instruction: Instruction) -> None:
        """Kaiwa told the model something in the middle of the turn (a workflow's next step):
        stored in its place in the turn, after the answer held so far."""
        self.seqs.append(self._seq)
        self._write([*self._take_answer(), (self._seq, instruction)])
        self._seq += 1

    def reword(self, text: str) -> None:
        """The person's message (the turn's first) reads `text` now: stored again in its place,
        in order with the turn's other writes."""
        self._write([(0, PersonMessage(text))])

    def preface(self, text: str) -> None:
        """Show `text` above the answer (what was heard of a voice note); it is not the
        model's, so no assistant message carries it."""
        self._preface = text
        self.on_change()

    def counted(self, usage: Usage) -> None:
        """A model call made for the turn outside its conversation (a workflow's reviewer):
        its cost is the turn's."""
        self.usage.add(usage)
        self.on_change()

    def compacted(self, compaction: CompactionRecord, calls: tuple[Usage, ...]) -> None:
        """The history was compacted in this turn: its summary calls count as the turn's model
        calls, and the compaction is stored with the turn's totals."""
        for usage in calls:
            self.usage.add(usage)
        self._write([], state=self._state(), compaction=compaction)

    # -- display, saving, ending ---------------------------------------------------------------

    def display_text(self) -> str:
        said = [*self._said, self._text] if self._text else self._said
        return PARAGRAPH.join([self._preface, *said] if self._preface else said)

    def frame(self) -> Frame:
        return Frame(self.display_text(), self._thinking, self._activity, tuple(self._tools))

    def save_partial(self) -> "asyncio.Future[None]":
        """Queue a save of what a frame would show now (the message being streamed, and an
        answer not yet written); resolves once it and every earlier write are stored. Before
        the first frame, the turn is marked as maybe shown (a status line is posted too), so a
        restart never runs again a turn whose first post may be out."""
        first = not self._framed
        self._framed = True
        messages = self._take_answer()
        if (self._text, self._thinking) != self._saved:
            partial = AssistantMessage(self._text, self._thinking, partial=True)
            messages.append((self._seq, partial))
            self._saved = (self._text, self._thinking)
        self._write(messages, state=self._state() if first else None)
        return asyncio.ensure_future(self.flushed())

    def note_posted(self, posted: tuple[str, ...]) -> None:
        """The reply has posted these messages: their ids are queued for the store at once (in
        order with the turn's other writes), so the window in which a restart cannot tell whether
        a post is out is the platform's round trip alone; a restart finds them and edits them."""
        if self.first_posted_at is None:
            self.first_posted_at = time.monotonic()
        if posted == self._reply_ids or self._unsaved:
            return
        self._reply_ids = posted
        if self._ending is not None:  # the final text's posts: the ending now knows them
            self._ending = replace(self._ending, reply_ids=posted, delivery=PENDING_DELIVERY)
        self._write([], state=self._ending or self._state())

    def finish(
        self, status: str, stop_reason: str | None, error: str | None, *, wrapped_up: bool = False
    ) -> None:
        """Queue the turn's ending, with its answer if it was held."""
        state = TurnState(
            status,
            self.usage,
            stop_reason,
            error,
            utc_now(),
            self._reply_ids,
            delivery=(  # until the last edit is made (`delivered`)
                UNSURE_DELIVERY if self._framed and not self._reply_ids else PENDING_DELIVERY
            ),
            wrapped_up=wrapped_up,
        )
        self._ending = state
        self._write(self._take_answer(), state=state)

    def delivered(self, posted: tuple[str, ...], delivery: str) -> None:
        """After the notice: what the platform shows of the reply. Until this is stored, a
        restart finds the turn undelivered and makes its last edit (`core.dispatch.recovery`). Not
        for a turn whose records could not be saved (`mark_unsaved` ends it; nothing to show)."""
        if self._ending is None or self._started is None or self._unsaved:
            return
        marking = self._store.mark_delivered(self._started.turn_id, delivery, posted)
        not_awaited(marking, "recording what the platform shows")

    def mark_unsaved(self, error: str) -> None:
        """The turn's records could not all be written: once the database is back, the turn
        ends `failed` (a durable write, queued after the ones that failed). A turn whose own row
        was never stored has nothing to mark."""
        self._unsaved = True
        if self._started is None:
            return
        state = TurnState("failed", self.usage, None, error, utc_now(), self._reply_ids)
        started = self._started
        with contextlib.suppress(StoreError):  # closed already: start-up marks it interrupted
            repair = self._store.record_turn(
                started.conversation_id, started.turn_id, state=state, durable=True
            )
            asyncio.ensure_future(repair).add_done_callback(_log_lost_repair)

    async def flushed(self) -> None:
        """Wait until the turn's row and every write queued so far are stored; raise the first
        that failed (a `StoreError`), again on every later call."""
        await asyncio.wait([self._starting])  # its callback has queued the held writes by now
        pending = list(self._writes)
        if pending:
            await asyncio.wait(pending)
            del self._writes[: len(pending)]
            for write in pending:
                if self._failure is None and write.exception() is not None:
                    self._failure = write.exception()
        if self._failure is not None:
            raise self._failure

    def _take_answer(self) -> list[tuple[int, TurnMessage]]:
        if self._answer is None:
            return []
        held, self._answer = self._answer, None
        return [(self._seq - 1, held)]

    def _state(self) -> TurnState:
        unsure = UNSURE_DELIVERY if self._framed and not self._reply_ids else None
        return TurnState("running", self.usage, reply_ids=self._reply_ids, delivery=unsure)

    def _write(
        self,
        messages: list[tuple[int, TurnMessage]],
        *,
        state: TurnState | None = None,
        compaction: CompactionRecord | None = None,
    ) -> None:
        if not messages and state is None:
            return
        if self._settled:
            self._writes.append(self._submit((messages, state, compaction)))
        else:  # queued the moment the turn's row is stored, in order
            placeholder = asyncio.get_running_loop().create_future()
            self._held.append(((messages, state, compaction), placeholder))
            self._writes.append(placeholder)

    def _turn_stored(self, starting: "asyncio.Future[StartedTurn]") -> None:
        if not starting.cancelled() and starting.exception() is None:
            self._started = starting.result()
        self._settled = True
        held, self._held = self._held, []
        for write, placeholder in held:
            _copy_outcome(self._submit(write), placeholder)

    def _submit(self, write: Write) -> "asyncio.Future[None]":
        """Queue `write` on the store; a future that fails with the reason it cannot be (the
        turn's row was not stored, or the store is closed)."""
        failed = asyncio.get_running_loop().create_future()
        if self._started is None:
            reason = self._starting.exception() if not self._starting.cancelled() else None
            failed.set_exception(reason or StoreError("the turn was not stored"))
            return failed
        messages, state, compaction = write
        try:
            call = self._store.record_turn(
                self._started.conversation_id,
                self._started.turn_id,
                messages=messages,
                state=state,
                compaction=compaction,
            )
        except StoreError as exc:
            failed.set_exception(exc)
            return failed
        return asyncio.ensure_future(call)


class AsideSink(LoopSink):
    """The sink of a loop a turn runs beside its conversation (a workflow's reviewer): nothing it
    says joins the conversation or the reply; its cost counts as the turn's, and while it works
    the reply shows what it does (`doing`, then the tool it uses)."""

    def __init__(self, recorder: TurnRecorder, doing: str) -> None:
        self._recorder = recorder
        self._doing = doing

    def status(self, text: str) -> None:
        self._recorder.status(f"{self._doing} ({text})")

    def thinking(self, delta: str) -> None:
        self._recorder.status(self._doing)

    def text(self, delta: str) -> None:
        self._recorder.status(self._doing)

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self._recorder.counted(usage)

    def tool_started(self, call: ToolCall) -> None:
        self._recorder.status(f"{self._doing}: using {call.name}…")

    def tool_finished(self, result: ToolResult) -> None:
        self._recorder.status(self._doing)


def _copy_outcome(source: "asyncio.Future[None]", target: "asyncio.Future[None]") -> None:
    def copy(done: "asyncio.Future[None]") -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            target.set_result(None)

    source.add_done_callback(copy)


def _log_lost_repair(repair: "asyncio.Future[None]") -> None:
    if not repair.cancelled() and repair.exception() is not None:
        logger.error(
            "a turn that could not be saved is still marked running (%s); the next start marks "
            "it interrupted",
            repair.exception(),
        )


def _nothing() -> None:
    pass
