"""Each conversation as the runner keeps it between turns: its gate and queue, and its history.

One `Conversation` per place lives in a pinned LRU (`core.turns.lru`): a conversation with a
live turn is pinned (invariant 2 in core/turns/runner.py), so eviction can never hand a later
message a fresh gate while a turn runs. Besides the gate, the queue and the running turn, it
keeps the model-facing history between turns, read from the store once per process
(`Store.conversation_of`, made well-formed by `core.store.history`), so a turn's start costs no
read of its conversation.

The history is keyed by where each message is stored (turn, seq): a compaction is stored with
the point where the kept messages begin, so the keys follow every change of the list (the
running turn's messages are keyed once its row is stored). Whenever the store and this copy may
disagree (a turn that could not be saved, a reply that did not end `done` and so carries a
cut-off mark in the store's history, a compaction that could not be stored), the copy is dropped
and the next turn reads the store again: the store is the truth, and the request for a turn is
the same whether or not Kaiwa restarted before it. So is a copy in which a tool's result or a
call's arguments were shortened to fit the window (the store keeps them whole).

A refusal of a message too large for the window names whose it is by the turn's provenance
(`AUTHORS`): the person's, a scheduled task's, or the sub-agents' reports a turn carries.
"""

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from core.agent.context import (
    Author,
    Calibration,
    Compaction,
    Compactor,
    ContextSettings,
    ContextWindows,
    SummaryModel,
    prompt_and_summary,
    system_message,
)
from core.agent.messages import Usage, UsageTotals
from core.agent.profile import AgentProfile
from core.channel import Outcome, platform_of
from core.errors import KaiwaError, StoreError
from core.store import CompactionRecord, StartedTurn, Store, TurnStart
from core.store.history import MessageKey, history_entries
from core.turns.body import TurnBody
from core.turns.lru import PinnedLRU
from core.turns.recording import TurnRecorder
from core.turns.turn import Provenance, TurnRequest, TurnResult, TurnSettings

logger = logging.getLogger(__name__)

AUTHORS = {
    Provenance.PERSON: Author("your message", "send something shorter"),
    Provenance.SCHEDULE: Author("this scheduled task's message", "shorten the task's text"),
    Provenance.SUBAGENT: Author("the sub-agents' reports", "ask for shorter reports"),
}
"""Whose message opens a turn, by the turn's provenance, as a refusal of it says."""


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


@dataclass
class Conversation:
    """Everything one conversation needs between turns."""

    place: str
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: "LiveTurn | None" = None
    waiting: list["LiveTurn"] = field(default_factory=list)
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
    shortened: bool = False
    """A tool result or call of `messages` was shortened to fit the window (the store keeps it
    whole): the copy is read again from the store after the turn."""


@dataclass(eq=False)
class LiveTurn:
    """A turn from `submit` until its task is done: queued, then running."""

    request: TurnRequest
    conversation: Conversation
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


class Conversations:
    def __init__(
        self, store: Store, model: SummaryModel, settings: TurnSettings, windows: ContextWindows
    ) -> None:
        self._store = store
        self._model = model
        self._settings = settings
        self.windows = windows
        self._cache: PinnedLRU[str, Conversation] = PinnedLRU(settings.max_cached_conversations)

    def get(self, place: str) -> Conversation | None:
        return self._cache.get(place)

    def pinned(self, place: str) -> Conversation:
        """The conversation in `place`, pinned until `unpin` (invariant 2)."""
        conversation = self._cache.get_or_create(place, lambda: Conversation(place))
        self._cache.pin(place)
        return conversation

    def unpin(self, place: str) -> None:
        self._cache.unpin(place)

    # -- history -------------------------------------------------------------------------------

    async def prepare(
        self, conversation: Conversation
    ) -> tuple[list[dict[str, Any]], ContextSettings]:
        """The conversation's model-facing history, and the window it must fit."""
        messages = await self.history(conversation)
        assert conversation.agent is not None
        return messages, await self.windows.of(conversation.agent)

    async def history(self, conversation: Conversation) -> list[dict[str, Any]]:
        """The model-facing history, read from the store the first time, with the agent the
        conversation runs (one that does not exist yet gets its channel's agent, and starts with
        that agent's system prompt, with which it will be opened): the system prompt, the latest
        compaction's summary, and the messages after it."""
        if conversation.messages is None:
            stored = await self._store.conversation_of(conversation.place)
            row = stored.conversation
            conversation.agent = self.agent_of(conversation.place, row.agent if row else None)
            prompt = row.system_prompt if row else conversation.agent.system_prompt
            conversation.conversation_id = row.id if row else None
            summary = stored.compaction.summary if stored.compaction else ""
            entries = history_entries(stored.messages, stored.endings)
            conversation.messages = [system_message(prompt, summary), *(w for w, _ in entries)]
            conversation.keys = [None, *(key for _, key in entries)]
            conversation.calibration = Calibration()
            conversation.compactions = stored.compactions
            conversation.shortened = False
        return conversation.messages

    def agent_of(self, place: str, stored: str | None) -> AgentProfile:
        """The agent stored with a conversation; a new one's (or one whose agent is no longer
        configured: said in the log) is its channel's."""
        platform = platform_of(place)
        if stored is None:
            return self._settings.for_new_conversation(platform)
        agent = self._settings.named(stored)
        if agent is None:
            agent = self._settings.for_new_conversation(platform)
            logger.warning(
                "the conversation in %s ran agent %s, which is no longer configured; %s answers",
                place,
                stored,
                agent.name,
            )
        return agent

    def agent_for(self, place: str, platform: str) -> AgentProfile:
        """The agent that answers in `place`: its conversation's, once known, else the one a
        new conversation there would get."""
        conversation = self._cache.get(place)
        known = conversation.agent if conversation is not None else None
        return known or self._settings.for_new_conversation(platform)

    def turn_start(self, conversation: Conversation, request: TurnRequest, text: str) -> TurnStart:
        agent = conversation.agent
        assert agent is not None
        messages = conversation.messages
        return TurnStart(
            place=request.place,
            agent=agent.name,
            system_prompt=prompt_and_summary(messages[0])[0] if messages else "",
            provenance=request.provenance.value,
            text=text,
            author=request.author,
            inbound_event_id=request.inbound_event_id,
            conversation_id=conversation.conversation_id,
            attempt=request.attempt,
            model=agent.model,
        )

    # -- a turn's keys and compactions ----------------------------------------------------------

    def compactor(
        self, conversation: Conversation, recorder: TurnRecorder, context: ContextSettings
    ) -> Compactor:
        """The compactor of a turn's loops (the conversation's running turn): a compaction is
        stored with the turn; a refusal names whose message it is."""

        def compacted(compaction: Compaction) -> None:
            _key_running_turn(conversation, recorder)
            recorder.compacted(self._record(conversation, compaction), compaction.calls)

        def shortened() -> None:
            conversation.shortened = True

        agent, running = conversation.agent, conversation.running
        assert agent is not None
        return Compactor(
            self._model,
            agent.model,
            context,
            conversation.calibration,
            compacted,
            author=AUTHORS[running.request.provenance] if running else Author(),
            on_shortened=shortened,
        )

    def settle(self, conversation: Conversation, recorder: TurnRecorder, outcome: Outcome) -> None:
        """The turn is stored: its messages are keyed by its row. A reply that did not end
        `done` (stopped, failed, cut) is read again next time from the store, with the mark its
        history gives it, so the next request is the one a restarted Kaiwa would send (and
        Ollama's prompt cache still fits it); so is one whose copy was shortened."""
        stored = recorder.turn_id is not None and conversation.messages is not None
        if outcome is not Outcome.DONE or not stored or conversation.shortened:
            conversation.messages = None
            return
        _key_running_turn(conversation, recorder)
        conversation.keys = [
            (recorder.turn_id, key[1]) if key is not None and key[0] is None else key
            for key in conversation.keys
        ]

    @staticmethod
    def remember(conversation: Conversation, row: "asyncio.Future[StartedTurn]") -> None:
        """A turn's row is stored: the conversation is known now (a new one, perhaps); if it
        could not be stored, the store is read again next time."""
        if not row.cancelled() and row.exception() is None:
            conversation.conversation_id = row.result().conversation_id
        else:
            conversation.messages = None

    def _record(self, conversation: Conversation, compaction: Compaction) -> CompactionRecord:
        first_kept = conversation.keys[compaction.first_kept]
        assert first_kept is not None, "a compaction keeps conversation messages, not a prompt"
        del conversation.keys[1 : compaction.first_kept]
        conversation.compactions += 1
        logger.info(
            "conversation %s in %s compacted (%s): about %d tokens, now %d",
            conversation.conversation_id,
            conversation.place,
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

    # -- commands: they never wait behind a turn ------------------------------------------------

    async def context_report(self, place: str) -> ContextReport | None:
        """`/usage`: how much of its window the conversation in `place` fills; None if it has
        no conversation. Reads, never waits for a running turn."""
        conversation = self._cache.get(place)
        if conversation is None or conversation.messages is None:
            conversation = Conversation(place)  # read aside: the cached one is its turns' to fill
            await self.history(conversation)
        if conversation.conversation_id is None:
            return None
        assert conversation.agent is not None and conversation.messages is not None
        context = await self.windows.of(conversation.agent)
        tools = [tool.schema() for tool in conversation.agent.tools.values()]
        size = conversation.calibration.size(conversation.messages, tools)
        return ContextReport(size, context.window, conversation.compactions)

    async def compact(self, place: str) -> Compaction | None:
        """`/compact`: summarize the conversation in `place` now, all but its latest message;
        None if there is nothing to compact. Raises `ConversationBusy` while a turn runs or
        waits there (it never waits behind one)."""
        conversation = self._cache.get(place)
        if conversation is not None and (conversation.running or conversation.waiting):
            raise ConversationBusy("a reply is being written here")
        conversation = self.pinned(place)
        try:
            async with conversation.gate:
                return await self._compact_now(conversation)
        finally:
            self.unpin(place)

    async def close(self, place: str) -> None:
        """`/new`, once the conversation's turns are stopped: its conversation is closed, and
        the next message opens a new one."""
        conversation = self.pinned(place)
        try:
            async with conversation.gate:
                conversation_id = conversation.conversation_id
                if conversation_id is None:
                    active = await self._store.active_conversation(place)
                    conversation_id = active.id if active else None
                if conversation_id is not None:
                    await self._store.close_conversation(conversation_id)
                conversation.conversation_id = None
                conversation.messages = conversation.agent = None
        finally:
            self.unpin(place)

    async def _compact_now(self, conversation: Conversation) -> Compaction | None:
        messages, context = await self.prepare(conversation)
        agent, conversation_id = conversation.agent, conversation.conversation_id
        assert agent is not None
        if conversation_id is None:
            return None
        records: list[CompactionRecord] = []
        compactor = Compactor(
            self._model,
            agent.model,
            context,
            conversation.calibration,
            lambda compaction: records.append(self._record(conversation, compaction)),
        )
        tools = [tool.schema() for tool in agent.tools.values()]
        compaction = await compactor.compact(messages, tools=tools, keep_tokens=0)
        for record in records:
            try:
                await self._store.record_compaction(conversation_id, record)
            except StoreError:
                conversation.messages = None  # the store is the truth: read it again next time
                raise
        return compaction


def _key_running_turn(conversation: Conversation, recorder: TurnRecorder) -> None:
    """Key the running turn's messages not keyed yet: the person's (0), then each the loop
    added, in the order the recorder placed them."""
    assert conversation.messages is not None
    missing = len(conversation.messages) - len(conversation.keys)
    if missing > 0:
        seqs = [0, *recorder.seqs]
        conversation.keys += [(None, seq) for seq in seqs[-missing:]]


def _totals(calls: tuple[Usage, ...]) -> UsageTotals:
    totals = UsageTotals()
    for usage in calls:
        totals.add(usage)
    return totals
