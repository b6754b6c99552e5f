"""The turn path: every message, scheduled firing and sub-agent report becomes a turn here.

A turn is a background task. `submit` returns at once so the channel keeps reading (which is what
makes `/stop` possible); per conversation, turns run one at a time in arrival order, and different
conversations run side by side.

What runs inside a turn is its body (ARCHITECTURE.md, "Turn bodies"): chat, or a workflow a
command starts (`/plan`). The runner holds the invariants around every body, so a body never
takes a gate, pins, or tells the channel how the turn ended.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from core.agent.context import (
    Calibration,
    Compaction,
    Compactor,
    ContextPolicy,
    ContextSettings,
    prompt_and_summary,
    system_message,
)
from core.agent.loop import AgentLoop, ChatModel, LoopResult, LoopSettings
from core.agent.messages import Instruction, Usage, UsageTotals
from core.agent.tools import Tool, ToolContext, called_from
from core.channel import Channel, Delivery, Frame, Outcome, Reply
from core.errors import KaiwaError, ModelError, StoreError
from core.features.approvals.questions import Approvals
from core.features.mcp import McpServers
from core.features.subagents.delegation import Claims, Subagents, SubagentSettings, format_report
from core.store import CompactionRecord, StartedTurn, Store, TurnStart, not_awaited
from core.store.history import MessageKey, history_entries
from core.text import parse_command, plural
from core.turns.lru import PinnedLRU
from core.turns.pump import FramePump
from core.turns.recording import AsideSink, TurnRecorder

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
    context_window: int = 0
    """Tokens; 0 chooses one for the model (`ContextPolicy.window`)."""
    description: str = ""
    """What the agent is for, as an agent choosing whom to hand work to reads it."""
    delegates_to: tuple[str, ...] = ()
    """The agents this one may hand work to (`core.features.subagents.delegation`)."""
    run_iterations: int = 30
    """Most model calls in one of its runs as a sub-agent (`[subagents].max_iterations` caps it)."""
    mcp: tuple[str, ...] = ()
    """MCP servers (`files`) or their tools (`files.read_file`) it may use."""


@dataclass(frozen=True)
class TurnSettings:
    """Read once at the start of each turn (invariant 1: a snapshot, never a lock).

    A conversation runs the agent stored with it; a new one gets its channel's agent
    (`channel_agents`, by platform), else `agent`."""

    agent: AgentProfile
    agents: Mapping[str, AgentProfile] = field(default_factory=dict)
    """Every agent by name (`agent` is among them, whether listed or not)."""
    channel_agents: Mapping[str, str] = field(default_factory=dict)
    tool_timeout: float = 60.0
    tool_grace: float = 2.0
    max_cached_conversations: int = 1000
    context: ContextPolicy = field(default_factory=ContextPolicy)
    subagents: SubagentSettings = field(default_factory=SubagentSettings)

    def named(self, name: str) -> AgentProfile | None:
        return self.agent if name == self.agent.name else self.agents.get(name)

    def for_new_conversation(self, platform: str) -> AgentProfile:
        return self.named(self.channel_agents.get(platform, "")) or self.agent


class TurnModel(ChatModel, Protocol):
    async def context_length(self, model: str) -> int | None: ...


class ConversationBusy(KaiwaError):
    """A turn runs or waits in the conversation, so it cannot be compacted now."""


@dataclass(frozen=True)
class ContextReport:
    """What `/usage` says of a conversation's context."""

    tokens: int
    """About how many tokens the next request would carry (an estimate, corrected by what the
    model reported it read)."""
    window: int
    compactions: int


@dataclass(frozen=True)
class TurnRequest:
    platform: str
    place: str
    text: str
    provenance: Provenance = Provenance.PERSON
    author: str | None = None
    """Who wrote the message, as the store keeps it (a name where the platform gives one)."""
    person: str | None = None
    """The platform's id of that person (what tools see as `ToolContext.person`)."""
    reply_to: str | None = None
    inbound_event_id: int | None = None
    images: tuple[bytes, ...] = ()
    attempt: int = 1
    """2 for a turn run again because a restart interrupted it before it showed anything."""
    proceed: Callable[[], bool] | None = None
    """Asked once the turn holds its conversation's gate: False skips it, unrecorded (a
    scheduled task cancelled while its firing waited behind another turn)."""
    silent_marker: str | None = None
    """An answer that is exactly this posts nothing (a scheduled run with nothing to say)."""


@dataclass(frozen=True)
class TurnResult:
    status: str
    text: str = ""
    error: str | None = None
    turn_id: int | None = None
    model_calls: int = 0
    wrapped_up: bool = False
    """The model ran out of calls with tools pending and answered in one more call without."""
    delivery: Delivery = Delivery.SHOWN
    """What the platform shows of the reply (`NOTHING`: not one message could be posted)."""
    silent: bool = False
    """The answer was the silent marker, so nothing was posted."""


@dataclass(frozen=True)
class BodyEnding:
    """How a body's work ended when it ended by itself (a stop or a failure is raised instead,
    and the runner ends the turn the same way for every body)."""

    outcome: Outcome = Outcome.DONE
    note: str | None = None
    """Said with the reply's ending ("answered at the limit of 10 model calls")."""
    wrapped_up: bool = False


def ending_of(result: LoopResult) -> BodyEnding:
    """The ending an agent loop's result gives its turn."""
    outcome = Outcome.CUT if result.cut else Outcome.DONE
    if result.wrapped_up:
        calls = result.model_calls
        note = f"answered at the limit of {calls} model {plural(calls, 'call')}"
        return BodyEnding(outcome, note, wrapped_up=True)
    return BodyEnding(outcome)


@dataclass
class BodyTurn:
    """A running turn as its body sees it: the conversation (the person's message last), the
    agent with the tools it may use this turn, and the means to run the agent loop on them,
    recorded as the turn. The runner has opened the turn and will end it; a body only works."""

    request: TurnRequest
    agent: AgentProfile
    messages: list[dict[str, Any]]
    tools: Mapping[str, Tool]
    """Everything the agent may use this turn (approval-guarded where `[approvals].ask` says)."""
    channel: Channel
    _ids: Callable[[], Awaitable[tuple[int, int]]]
    _loop: Callable[[Mapping[str, Tool], int | None], AgentLoop]
    _aside: Callable[[str, Mapping[str, Tool], int, str], AgentLoop]
    _recorder: TurnRecorder

    async def ids(self) -> tuple[int, int]:
        """The turn's conversation and row, once stored (a body's own records point at them)."""
        return await self._ids()

    async def turn_id(self) -> int:
        return (await self._ids())[1]

    def loop(
        self, tools: Mapping[str, Tool] | None = None, *, max_iterations: int | None = None
    ) -> AgentLoop:
        """The agent loop on the conversation, recorded as this turn and streamed into its
        reply: with the turn's tools unless given others, and the agent's cap unless given."""
        return self._loop(self.tools if tools is None else tools, max_iterations)

    def aside(
        self, model: str, tools: Mapping[str, Tool], *, max_iterations: int, doing: str
    ) -> AgentLoop:
        """A loop beside the conversation (it reads only the messages it is given): nothing it
        says is stored or shown, its calls count as the turn's, and the reply shows `doing`."""
        return self._aside(model, tools, max_iterations, doing)

    def instruct(self, text: str) -> None:
        """Tell the agent something before its next model call (a workflow's next step); it is
        stored with the turn, so the conversation reads the same afterwards."""
        self.messages.append(Instruction(text).to_wire())
        self._recorder.instruct(Instruction(text))

    def shown(self) -> str:
        """The reply's text so far."""
        return self._recorder.display_text()


class TurnBody(Protocol):
    """What runs inside a turn (ARCHITECTURE.md, "Turn bodies"). A stop arrives as a
    cancellation and a failure is raised; a body that keeps state of its own stores it (awaited,
    through the cancellation) before letting either go on."""

    async def run(self, turn: BodyTurn) -> BodyEnding: ...


class Workflow(TurnBody, Protocol):
    """A body a command starts (`/plan <task>`), named by that command."""

    usage: str
    """What its command alone (`/plan`) answers."""

    async def listing(self, place: str) -> str:
        """Its recent runs in `place`, for a person (`/plans`)."""
        ...


class ChatBody:
    """The agent loop on the conversation: what an ordinary message runs."""

    async def run(self, turn: BodyTurn) -> BodyEnding:
        return ending_of(await turn.loop().run(turn.messages))


CHAT = ChatBody()


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
    messages: list[dict[str, Any]] | None = None
    """The model-facing history; None until read from the store (and after it may be stale)."""
    keys: list[MessageKey | None] = field(default_factory=list)
    """Where each message of `messages` is stored (None for the system prompt and a summary;
    a turn of None for the running turn's). The running turn's are added when needed."""
    calibration: Calibration = field(default_factory=Calibration)
    compactions: int = 0
    agent: AgentProfile | None = None
    """The agent the conversation runs, known once its history is read."""


@dataclass(eq=False)
class _Turn:
    request: TurnRequest
    slot: _Slot
    body: TurnBody
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
        model: TurnModel,
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
        self.subagents = Subagents(
            store,
            model,
            settings,
            settings.subagents,
            self._context,
            tool_timeout=settings.tool_timeout,
            tool_grace=settings.tool_grace,
            channels=channels,
        )
        self.subagents.wake = self._wake
        self.shared_tools: dict[str, Tool] = {}
        """Tools every conversation's agent has besides its own (the scheduled-task tools)."""
        self.approvals: Approvals | None = None
        """Asks before the tools that need a person's yes (`require_approvals`)."""
        self.mcp: McpServers | None = None
        """The MCP servers whose tools an agent's `mcp` names (`serve_mcp`)."""
        self.workflows: dict[str, Workflow] = {}
        """Turn bodies by the command that starts them (`plan`: a message `/plan <task>`)."""

    def serve_mcp(self, servers: McpServers) -> None:
        """Agents' and sub-agents' profiles may name tools of these servers."""
        self.mcp = self.subagents.mcp = servers

    def require_approvals(self, approvals: Approvals) -> None:
        """Tools in `[approvals].ask` run in a person's turn only once they say yes, and never
        in a sub-agent's run."""
        self.approvals = self.subagents.approvals = approvals

    def workflow_of(self, text: str) -> str | None:
        """The workflow a message starts (`/plan <task>` → "plan"), or None for a chat turn."""
        command = parse_command(text)
        if command is None or not command.argument or command.name not in self.workflows:
            return None
        return command.name

    def _body_for(self, text: str) -> TurnBody:
        name = self.workflow_of(text)
        return CHAT if name is None else self.workflows[name]

    # -- entry points --------------------------------------------------------------------------

    def submit(self, request: TurnRequest) -> "asyncio.Task[TurnResult]":
        """Queue a turn behind its conversation's running one and return at once."""
        if self.closing:
            raise RuntimeError("the turn runner is shutting down")
        slot = self._slots.get_or_create(request.place, lambda: _Slot(request.place))
        self._slots.pin(request.place)  # invariant 2: pinned before the gate, for the task's life
        turn = _Turn(request, slot, self._body_for(request.text))
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

    async def stop_subagents(self, place: str) -> int:
        """`/stop`'s second half: every sub-agent of `place` stops, reporting what it has."""
        return await self.subagents.stop_all(place)

    async def start_new_conversation(self, place: str) -> StopReport:
        """`/new`: stop what runs, drop what waits and the sub-agents' undelivered reports, then
        close the conversation in `place`."""
        report = self.stop(place, reason="new conversation")
        await self.subagents.discard(place)
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
                slot.conversation_id, slot.messages, slot.agent = None, None, None
        finally:
            self._slots.unpin(place)
        return report

    async def context_report(self, place: str) -> ContextReport | None:
        """`/usage`: how much of its window the conversation in `place` fills; None if it has
        no conversation. Reads, never waits for a running turn."""
        slot = self._slots.get(place)
        if slot is None or slot.messages is None or slot.conversation_id is None:
            slot = _Slot(place)  # read aside: the conversation's own slot is its turns' to fill
            await self._history(slot)
            if slot.conversation_id is None:
                return None
        assert slot.agent is not None and slot.messages is not None
        context = await self._context(slot.agent)
        tools = [tool.schema() for tool in slot.agent.tools.values()]
        size = slot.calibration.size(slot.messages, tools)
        return ContextReport(size, context.window, slot.compactions)

    def agent_for(self, place: str, platform: str) -> AgentProfile:
        """The agent that answers in `place`: its conversation's, once known, else the one a
        new conversation there would get."""
        slot = self._slots.get(place)
        known = slot.agent if slot is not None else None
        return known or self.settings.for_new_conversation(platform)

    async def compact(self, place: str) -> Compaction | None:
        """`/compact`: summarize the conversation in `place` now, all but its latest message;
        None if there is nothing to compact. Raises `ConversationBusy` while a turn runs or
        waits there (it never waits behind one)."""
        slot = self._slots.get_or_create(place, lambda: _Slot(place))
        if slot.running is not None or slot.waiting:
            raise ConversationBusy("a reply is being written here")
        self._slots.pin(place)
        try:
            async with slot.gate:
                return await self._compact_now(slot)
        finally:
            self._slots.unpin(place)

    async def _compact_now(self, slot: _Slot) -> Compaction | None:
        messages, context = await self._prepare(slot)
        agent, conversation_id = slot.agent, slot.conversation_id
        assert agent is not None
        if conversation_id is None:
            return None
        records: list[CompactionRecord] = []
        compactor = Compactor(
            self._model,
            agent.model,
            context,
            slot.calibration,
            lambda compaction: records.append(self._note_compaction(slot, compaction)),
        )
        tools = [tool.schema() for tool in agent.tools.values()]
        compaction = await compactor.compact(messages, tools=tools, keep_tokens=0)
        for record in records:
            try:
                await self._store.record_compaction(conversation_id, record)
            except StoreError:
                slot.messages = None  # the store is the truth: read it again next time
                raise
        return compaction

    def has_live(self, place: str) -> bool:
        """Whether a turn of `place` runs or waits."""
        return any(turn.request.place == place for turn in self._live)

    def handles(self, inbound_event_id: int) -> bool:
        """Whether a live turn (queued or running) answers this recorded message."""
        return any(turn.request.inbound_event_id == inbound_event_id for turn in self._live)

    async def shutdown(self) -> StopReport:
        """Invariant 7: stop every live turn, queued or running, and wait for each to finish.
        Turns still queued never start; their messages stay recorded, unanswered, and the next
        start answers them (`core.dispatch.recovery`). Returns how many were running and queued."""
        self.closing = True
        await self.subagents.shutdown()  # their reports stay pending, for the next start
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
            if turn.request.proceed is not None and not turn.request.proceed():
                return TurnResult("skipped")
            slot.running = turn
            try:
                return await self._execute(turn, self.settings)
            finally:
                slot.running = None

    async def _execute(self, turn: _Turn, settings: TurnSettings) -> TurnResult:
        request, slot = turn.request, turn.slot
        channel = self._channels[request.platform]
        try:  # reads; a stop meanwhile still gets its turn recorded, as stopped
            (messages, context), stopped_early = await through_cancellation(self._prepare(slot))
        except Exception as exc:
            return await self._not_started(channel, request, exc)
        agent = slot.agent
        assert agent is not None
        claims = Claims()
        text = self._with_reports(request, claims)
        if text is None:  # started for reports another turn has carried meanwhile
            return TurnResult("skipped")
        # The turn's row is written while the model call begins; the recorder holds any write
        # (and the pump any frame) until it is stored.
        starting = asyncio.ensure_future(
            self._store.start_turn(self._turn_start(slot, request, text))
        )
        starting.add_done_callback(lambda stored: _remember_conversation(slot, stored))
        recorder = TurnRecorder(self._store, starting)
        said = {"role": "user", "content": text}
        sent = {**said, "images": list(request.images)} if request.images else said
        messages.append(sent)
        reply = channel.open_reply(request.place, request.reply_to)
        if request.silent_marker:
            reply = SilentUnlessSaid(reply, request.silent_marker)
        pump = FramePump(
            reply,
            recorder.frame,
            recorder.save_partial,
            channel.traits.frame_interval,
            name=f"frames {request.place}",
            shown=lambda: recorder.note_posted(reply.posted),
        )
        recorder.on_change = pump.poke
        tools = self.subagents.tools_for(
            request.place, request.platform, agent, lambda: _ids(starting), claims
        )
        served = self.mcp.tools_for(agent.mcp) if self.mcp is not None else {}
        offered = {**agent.tools, **self.shared_tools, **served, **tools}
        if self.approvals is not None:
            offered = self.approvals.guard(offered, settings.tool_timeout)
        began = time.monotonic()
        scope = self._scope(turn, messages, offered, recorder, starting, context, settings)
        outcome, note, wrapped_up = await self._run_body(turn.body, scope, stopped_early)
        turn.finishing = True  # the outcome is decided: a stop from here on changes nothing
        pump.halt()  # no frame after the answer is complete; the last edit is the notice's
        _replace(messages, sent, said)  # images go to the model with their own turn only
        # invariant 5: records first (awaited whole, whatever cancellation lands meanwhile) ...
        error = note if outcome is Outcome.FAILED else None
        recorder.finish(outcome.value, turn.stop_reason, error, wrapped_up=wrapped_up)
        text = recorder.display_text()
        failure = await _store_failure(recorder)
        if failure is not None:
            outcome, note, text = Outcome.FAILED, _unsaved_note(failure), pump.shown_text
            recorder.mark_unsaved(note)  # invariant 8
            slot.messages = None  # the store is the truth: the next turn reads it again
            logger.warning("a turn in %s could not be saved: %s", request.place, failure)
        else:
            self._settle_keys(slot, recorder, outcome)
        self.subagents.settle(claims, delivered=failure is None and outcome is not Outcome.FAILED)
        seconds = time.monotonic() - began
        self._log_turn(request, outcome, recorder, seconds, turn.stop_reason, note)
        # ... then the notice, which a second cancellation may cut short without losing anything.
        await self._notify(pump, reply, text, outcome, note, recorder.frame().tools)
        self._note_delivery(request, recorder, reply)
        calls = recorder.usage.model_calls
        silent = isinstance(reply, SilentUnlessSaid) and reply.silent
        return TurnResult(
            outcome.value,
            text,
            error,
            recorder.turn_id,
            calls,
            wrapped_up,
            reply.delivery,
            silent,
        )

    def _note_delivery(self, request: TurnRequest, recorder: TurnRecorder, reply: Reply) -> None:
        """What the platform shows of the reply goes to the store (a turn stored but never
        shown is made visible after a crash); one it does not show in full, to the log too."""
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

    def _scope(
        self,
        turn: _Turn,
        messages: list[dict[str, Any]],
        tools: Mapping[str, Tool],
        recorder: TurnRecorder,
        starting: "asyncio.Future[StartedTurn]",
        context: ContextSettings,
        settings: TurnSettings,
    ) -> BodyTurn:
        """The turn as its body sees it: loops on the conversation share one compactor and the
        turn's recorder; loops aside share only the recorder's totals."""
        request, slot = turn.request, turn.slot
        agent = slot.agent
        assert agent is not None
        compactor = Compactor(
            self._model,
            agent.model,
            context,
            slot.calibration,
            lambda compaction: self._compacted(slot, recorder, compaction),
        )

        def conversation_loop(tools: Mapping[str, Tool], iterations: int | None) -> AgentLoop:
            return AgentLoop(
                self._model,
                tools,
                recorder,
                LoopSettings(
                    agent=agent.name,
                    model=agent.model,
                    think=agent.think,
                    max_iterations=iterations or agent.max_iterations,
                    tool_timeout=settings.tool_timeout,
                    tool_grace=settings.tool_grace,
                ),
                compactor,
            )

        def aside(model: str, tools: Mapping[str, Tool], iterations: int, doing: str) -> AgentLoop:
            return AgentLoop(
                self._model,
                tools,
                AsideSink(recorder, doing),
                LoopSettings(
                    agent=agent.name,
                    model=model,
                    max_iterations=iterations,
                    tool_timeout=settings.tool_timeout,
                    tool_grace=settings.tool_grace,
                ),
            )

        channel = self._channels[request.platform]
        return BodyTurn(
            request,
            agent,
            messages,
            tools,
            channel,
            lambda: _ids(starting),
            conversation_loop,
            aside,
            recorder,
        )

    async def _run_body(
        self, body: TurnBody, scope: BodyTurn, stopped_early: bool
    ) -> tuple[Outcome, str | None, bool]:
        """How the body ended, the note to show with it, and whether it was wrapped up."""
        if stopped_early:  # stopped while the turn was being opened
            return Outcome.STOPPED, None, False
        request = scope.request
        context = ToolContext(
            request.platform,
            request.place,
            request.person,
            request.provenance.value,
            request.author or request.person or "",
            turn=scope.turn_id,
        )
        try:
            with called_from(context):
                ending = await body.run(scope)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return Outcome.STOPPED, None, False
        except KaiwaError as exc:
            return Outcome.FAILED, str(exc), False
        except Exception as exc:
            logger.exception("turn in %s failed unexpectedly", request.place)
            return Outcome.FAILED, f"internal error ({type(exc).__name__}); see the log", False
        return ending.outcome, ending.note, ending.wrapped_up

    async def _prepare(self, slot: _Slot) -> tuple[list[dict[str, Any]], ContextSettings]:
        """The conversation's model-facing history, and the window it must fit."""
        messages = await self._history(slot)
        assert slot.agent is not None
        return messages, await self._context(slot.agent)

    async def _history(self, slot: _Slot) -> list[dict[str, Any]]:
        """The conversation's model-facing history, kept in the slot between turns; read from
        the store the first time, with the agent it runs (a conversation that does not exist
        yet gets its channel's agent, and starts with that agent's system prompt, with which it
        will be opened): the system prompt, the latest compaction's summary, and the messages
        after it."""
        if slot.messages is None:
            stored = await self._store.conversation_of(slot.place)
            conversation = stored.conversation
            slot.agent = self._agent_of(slot.place, conversation.agent if conversation else None)
            prompt = conversation.system_prompt if conversation else slot.agent.system_prompt
            slot.conversation_id = conversation.id if conversation else None
            summary = stored.compaction.summary if stored.compaction else ""
            entries = history_entries(stored.messages, stored.endings)
            slot.messages = [system_message(prompt, summary), *(wire for wire, _ in entries)]
            slot.keys = [None, *(key for _, key in entries)]
            slot.calibration, slot.compactions = Calibration(), stored.compactions
        return slot.messages

    def _agent_of(self, place: str, stored: str | None) -> AgentProfile:
        """The agent stored with a conversation; a new one's (or one whose agent is no longer
        configured: said in the log) is its channel's."""
        platform = place.partition(":")[0]  # every place is `<platform>:...`
        if stored is None:
            return self.settings.for_new_conversation(platform)
        agent = self.settings.named(stored)
        if agent is None:
            agent = self.settings.for_new_conversation(platform)
            logger.warning(
                "the conversation in %s ran agent %s, which is no longer configured; %s answers",
                place,
                stored,
                agent.name,
            )
        return agent

    async def _context(self, agent: AgentProfile) -> ContextSettings:
        """The agent's window: its own setting, or chosen for its model (asked of Ollama once;
        while Ollama cannot say, `max_window`)."""
        policy = self.settings.context
        setting = f"[agents.{agent.name}].context_window"
        if agent.context_window:
            return policy.settings(agent.context_window, setting)
        try:  # asked of Ollama once: the model client keeps the answer
            length = await self._model.context_length(agent.model)
        except ModelError as exc:
            logger.warning(
                "the context length of %s is unknown (%s); planning for %d tokens",
                agent.model,
                exc,
                policy.max_window,
            )
            length = None
        return policy.settings(policy.window(0, length), setting)

    def _compacted(self, slot: _Slot, recorder: TurnRecorder, compaction: Compaction) -> None:
        """The loop compacted the history in a turn: the slot's keys follow, and the compaction
        is stored with the turn."""
        _key_running_turn(slot, recorder)
        record = self._note_compaction(slot, compaction)
        recorder.compacted(record, compaction.calls)

    def _note_compaction(self, slot: _Slot, compaction: Compaction) -> CompactionRecord:
        first_kept = slot.keys[compaction.first_kept]
        assert first_kept is not None, "a compaction keeps conversation messages, not a prompt"
        del slot.keys[1 : compaction.first_kept]
        slot.compactions += 1
        logger.info(
            "conversation %s in %s compacted (%s): about %d tokens, now %d",
            slot.conversation_id,
            slot.place,
            compaction.method,
            compaction.tokens_before,
            compaction.tokens_after,
        )
        return CompactionRecord(
            first_kept[0],
            first_kept[1],
            compaction.summary,
            compaction.method,
            compaction.tokens_before,
            compaction.tokens_after,
            _totals(compaction.calls),
        )

    def _settle_keys(self, slot: _Slot, recorder: TurnRecorder, outcome: Outcome) -> None:
        """The turn is stored: its messages are keyed by its row. A reply cut at the length
        limit is read again next time, with the mark the store's history gives it."""
        if outcome is Outcome.CUT or recorder.turn_id is None or slot.messages is None:
            slot.messages = None
            return
        _key_running_turn(slot, recorder)
        slot.keys = [
            (recorder.turn_id, key[1]) if key is not None and key[0] is None else key
            for key in slot.keys
        ]

    def _with_reports(self, request: TurnRequest, claims: Claims) -> str | None:
        """The turn's message, with the sub-agents' reports no turn has carried on top; None for
        a turn started for reports when there are none left."""
        carried = self.subagents.claim_ready(request.place, claims)
        if request.provenance is Provenance.SUBAGENT and not carried:
            return None
        return "\n\n".join(
            [*map(format_report, carried), *([request.text] if request.text else [])]
        )

    def _wake(self, platform: str, place: str) -> None:
        """A sub-agent's report is waiting: a turn in its conversation carries it (after the
        turn that runs there now, if any)."""
        if self.closing or platform not in self._channels:
            return
        self.submit(
            TurnRequest(platform, place, "", provenance=Provenance.SUBAGENT, author="sub-agents")
        )

    def _turn_start(self, slot: _Slot, request: TurnRequest, text: str) -> TurnStart:
        agent = slot.agent
        assert agent is not None
        return TurnStart(
            place=request.place,
            agent=agent.name,
            system_prompt=prompt_and_summary(slot.messages[0])[0] if slot.messages else "",
            provenance=request.provenance.value,
            text=text,
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
        self, text: str, outcome: Outcome, note: str | None, *, tools: Sequence[str] = ()
    ) -> None:
        if outcome is Outcome.DONE and text.strip() == self._marker:
            self.silent = True
            await self._reply.finish("", Outcome.DONE, None, tools=())
            return
        await self._reply.finish(text, outcome, note, tools=tuple(tools))


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


async def _store_failure(recorder: TurnRecorder) -> StoreError | None:
    """Wait until the turn's records are stored; the error if they could not be."""
    try:
        await through_cancellation(recorder.flushed())
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


async def _ids(starting: "asyncio.Future[StartedTurn]") -> tuple[int, int]:
    """The turn's conversation and turn ids, once its row is stored."""
    stored = await asyncio.shield(starting)
    return stored.conversation_id, stored.turn_id


def _key_running_turn(slot: _Slot, recorder: TurnRecorder) -> None:
    """Key the running turn's messages not keyed yet: the person's (0), then each the loop
    added, in the order the recorder placed them."""
    assert slot.messages is not None
    missing = len(slot.messages) - len(slot.keys)
    if missing > 0:
        seqs = [0, *recorder.seqs]
        slot.keys += [(None, seq) for seq in seqs[-missing:]]


def _replace(messages: list[dict[str, Any]], old: dict[str, Any], new: dict[str, Any]) -> None:
    """`old` (that very message, if it is still there) becomes `new`."""
    for index, message in enumerate(messages):
        if message is old:
            messages[index] = new
            return


def _totals(calls: tuple[Usage, ...]) -> UsageTotals:
    totals = UsageTotals()
    for usage in calls:
        totals.add(usage)
    return totals


def _result_of(task: "asyncio.Task[TurnResult]") -> TurnResult:
    if task.cancelled():
        return TurnResult("dropped")
    error = task.exception()
    if error is not None:
        return TurnResult("failed", error=f"{type(error).__name__}: {error}")
    return task.result()
