"""Turns and their messages: the rows the turn path writes while a turn runs, what recovery
reads back of the turns a dead process left, and `kaiwa status`'s figures.

Messages are here with the turns because every message is written as part of a turn (the
person's with `start_turn`, the rest with `record_turn`, repairs with `close_interrupted`) and is
keyed by it: its `seq` is its place in the turn.

A turn's common path is a handful of units: the message recorded (`claim_inbound`), the
conversation read (`conversation_of`), the turn started (`start_turn`: the conversation if it is
new, the turn and the person's message), the reply's records and the turn's ending
(`record_turn`), what the platform shows (`mark_delivered`). On PostgreSQL each write among them
is one statement (data-modifying CTEs: `core.store.units`) run without BEGIN and COMMIT, and so
is the read of a place with no conversation yet, so a database a network hop away costs the turn
a round trip per unit. Under load, calls of many conversations share one transaction instead
(group commit, in `core.store.dbthread`).

A unit whose COMMIT answer is lost with the connection is run again. Each write is written to
stay true under that replay: messages are upserted by (turn, seq); a turn's update writes its
whole mutable state; a claim recognises its own row by its claim token (`core.store.rows.inbox`);
`start_turn` finds its own turn (and the conversation it opened) by the token each carries, in
the insert itself (`ON CONFLICT DO NOTHING`; the person's message is written only with a new
turn), so the common path keeps its statements; a compaction is inserted once by its token too.
"""

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, case, func, select, update

from core.agent.messages import (
    AssistantMessage,
    Instruction,
    PersonMessage,
    ToolCall,
    ToolResult,
    ToolStatus,
    UsageTotals,
)
from core.channel import Attachment
from core.store.base import StoreBase
from core.store.dbthread import Unit
from core.store.history import INTERRUPTED_TOOL, unanswered_calls
from core.store.rows.compactions import CompactionRecord, _compaction_row, _compaction_write
from core.store.rows.conversations import (
    _conversation_row,
    _conversations_in,
    _place_statement,
)
from core.store.tables import (
    Conversation,
    InboundEvent,
    Message,
    Turn,
    attachments_of,
    utc_now,
)
from core.store.units import (
    _by_id_statement,
    _fit,
    _inserting,
    _of_conversation,
    _rows,
    _Under,
    _update_write,
    _updater,
    _upsert_write,
    _usage_values,
    _With,
    _writing,
)

PENDING_DELIVERY = "pending"
"""A turn's `delivery` between its stored ending and its last edit (`undelivered_turns`)."""
UNSURE_DELIVERY = "unsure"
"""The same, for a reply whose first post may be out with its id not yet known: a restart
cannot edit it, and must not post the answer a second time."""
INSTRUCTION_AUTHOR = "kaiwa"
"""The author of the instructions Kaiwa adds to a turn (a workflow's steps), as stored."""
CHANGING = ("text", "thinking", "tool_calls", "tool_status", "partial", "stopped", "updated_at")
"""What saving a message again changes (the rest stays as first written)."""


@dataclass(frozen=True)
class TurnStart:
    place: str
    agent: str
    system_prompt: str
    provenance: str
    text: str
    author: str | None = None
    inbound_event_id: int | None = None
    conversation_id: int | None = None
    """The place's conversation (`conversation_of`); None opens a new one, with `agent` and
    `system_prompt`."""
    attempt: int = 1
    model: str = ""
    """The agent's model, which the turn's usage is counted under."""


@dataclass(frozen=True)
class StartedTurn:
    conversation_id: int
    turn_id: int


@dataclass(frozen=True)
class TurnState:
    """Everything about a turn that changes after it starts, written whole every time."""

    status: str = "running"
    usage: UsageTotals = field(default_factory=UsageTotals)
    stop_reason: str | None = None
    error: str | None = None
    ended_at: datetime | None = None
    reply_ids: tuple[str, ...] = ()
    delivery: str | None = None
    wrapped_up: bool = False


TurnMessage = AssistantMessage | ToolResult | Instruction | PersonMessage


@dataclass(frozen=True)
class Unfinished:
    """A turn a dead process left `running`, with what start-up recovery needs to resolve it."""

    turn: Turn
    place: str
    messages: list[Message]
    """The turn's own messages, in order (the person's first)."""
    reply_to: str | None
    """The platform id of the message it answers (None for a turn no person started)."""
    asked: str | None = None
    """That message's text, the person's own words (a turn's first stored message may also
    carry sub-agents' reports above them)."""
    person: str | None = None
    """The platform's id of the person who wrote it."""
    attachments: tuple[Attachment, ...] = ()
    """What it came with besides text, to be read again if the turn runs again."""


@dataclass(frozen=True)
class Summary:
    """What `kaiwa status` shows: the store's figures, without starting anything."""

    conversations: int
    turns: dict[str, int]
    """Turns since the `since` asked for, by outcome."""
    prompt_tokens: int
    output_tokens: int
    failures: list[Turn]
    """The latest failed turns, newest first."""
    places: dict[int, str]
    """The place of each conversation named in `failures`."""


class TurnStore(StoreBase):
    def start_turn(self, start: TurnStart) -> Awaitable[StartedTurn]:
        """Open a turn (and, if `start` names none, its conversation) and store the message
        that started it: one unit, one statement on PostgreSQL. The turn and the conversation
        carry tokens made here, so a replay of the unit (its COMMIT landed, the answer was lost)
        finds them and writes nothing."""
        now = utc_now()
        said = _message_defaults(now) | {
            "seq": 0,
            "role": "user",
            "text": start.text,
            "author": start.author,
        }
        message = _With(Message, said, (("conversation_id", "conversation_id"), ("turn_id", "id")))
        turn, under = _turn_row(start, now), None
        if start.conversation_id is None:
            opened = _conversation_row(start.place, start.agent, start.system_prompt)
            under = _Under(Conversation, opened, "conversation_id")
        else:
            turn["conversation_id"] = start.conversation_id
        inserting = _inserting(Turn, turn, under=under, together=[message])

        def run(connection: Connection) -> StartedTurn:
            stored = inserting(connection)
            assert stored.id is not None
            return StartedTurn(stored.conversation_id, stored.id)

        return self._call(run, autocommit=self._single_statements)

    def record_turn(
        self,
        conversation_id: int,
        turn_id: int,
        *,
        messages: Sequence[tuple[int, TurnMessage]] = (),
        state: TurnState | None = None,
        compaction: CompactionRecord | None = None,
        durable: bool = False,
    ) -> Awaitable[None]:
        """Save the turn's messages (each by its `seq` in the turn, so saving one again
        replaces it), a compaction made in it, and its state, in one transaction. `durable`:
        keep trying through an outage for as long as the store is open (a turn's ending must
        not stay `running`)."""
        now = utc_now()
        values = None if state is None else _state_values(state)
        compacted = (
            None if compaction is None else _compaction_row(conversation_id, turn_id, compaction)
        )
        writes = _turn_writes(
            self._dialect, conversation_id, turn_id, messages, now, values, compacted
        )
        return self._call(writes, key=turn_id, durable=durable, autocommit=self._single_statements)

    def turns(self, conversation_id: int) -> Awaitable[list[Turn]]:
        return self._call(_of_conversation(Turn, conversation_id), autocommit=True)

    def turn(self, turn_id: int) -> Awaitable[Turn]:
        def run(connection: Connection) -> Turn:
            (row,) = _rows(connection, Turn, _by_id_statement(Turn), row_id=turn_id)
            return row

        return self._call(run, autocommit=True)

    def summary(self, since: datetime, failures: int = 5) -> Awaitable[Summary]:
        """Conversations in all; turns, tokens since `since`; the latest `failures` failures."""
        turns = Turn.__table__  # type: ignore[attr-defined]
        conversations = Conversation.__table__  # type: ignore[attr-defined]
        recent = turns.c.started_at >= since
        by_outcome = select(turns.c.status, func.count()).where(recent).group_by(turns.c.status)
        tokens = select(
            func.coalesce(func.sum(turns.c.prompt_tokens), 0),
            func.coalesce(func.sum(turns.c.output_tokens), 0),
        ).where(recent)
        failed = (
            select(turns)
            .where(turns.c.status == "failed")
            .order_by(turns.c.id.desc())
            .limit(failures)
        )

        def run(connection: Connection) -> Summary:
            count = connection.execute(select(func.count()).select_from(conversations)).scalar()
            prompt, output = connection.execute(tokens).one()
            latest = _rows(connection, Turn, failed)
            ids = {turn.conversation_id for turn in latest}
            places = dict(
                connection.execute(
                    select(conversations.c.id, conversations.c.place).where(
                        conversations.c.id.in_(ids)
                    )
                ).all()
            )
            return Summary(
                conversations=int(count or 0),
                turns=dict(connection.execute(by_outcome).all()),
                prompt_tokens=int(prompt),
                output_tokens=int(output),
                failures=latest,
                places=places,
            )

        return self._call(run)

    def unfinished_turns(self, place: str | None = None) -> Awaitable[list[Unfinished]]:
        """Turns left `running` (by a process that died: the caller runs none of them), oldest
        first, with their messages and place: everywhere, or only `place`'s (a worker taking
        one place over)."""
        turns = Turn.__table__  # type: ignore[attr-defined]
        return self._turns_left(select(turns).where(turns.c.status == "running"), place)

    def undelivered_turns(self, place: str | None = None) -> Awaitable[list[Unfinished]]:
        """Turns that ended, were stored, and died before their last edit was made (`delivery`
        still `pending`): the person has not seen how they ended."""
        turns = Turn.__table__  # type: ignore[attr-defined]
        statement = select(turns).where(
            turns.c.status != "running",
            turns.c.delivery.in_((PENDING_DELIVERY, UNSURE_DELIVERY)),
        )
        return self._turns_left(statement, place)

    def _turns_left(self, statement: Any, place: str | None) -> Awaitable[list[Unfinished]]:
        turns = Turn.__table__  # type: ignore[attr-defined]
        if place is not None:
            statement = statement.where(turns.c.conversation_id.in_(_conversations_in(place)))

        def run(connection: Connection) -> list[Unfinished]:
            left = _rows(connection, Turn, statement)
            found = []
            for turn in sorted(left, key=lambda each: each.id or 0):
                turn_place = connection.execute(
                    _place_statement(), {"id": turn.conversation_id}
                ).scalar_one()
                messages = _rows(connection, Message, _of_turn_statement(), turn_id=turn.id)
                reply_to = asked = person = attached = None
                if turn.inbound_event_id is not None:
                    reply_to, asked, person, attached = connection.execute(
                        _inbound_statement(), {"id": turn.inbound_event_id}
                    ).one()
                found.append(
                    Unfinished(
                        turn,
                        turn_place,
                        messages,
                        reply_to,
                        asked,
                        person,
                        attachments_of(attached),
                    )
                )
            return found

        return self._call(run)

    def mark_delivered(
        self, turn_id: int, delivery: str, reply_ids: Sequence[str] | None = None
    ) -> Awaitable[None]:
        """What the platform shows of an ended turn's reply (and the messages it posted), once
        its last edit was made: the turn is no longer `undelivered`."""
        values: dict[str, Any] = {"delivery": delivery}
        if reply_ids is not None:
            values["reply_ids"] = list(reply_ids)
        updating = _updater(Turn, turn_id, values)
        return self._call(updating, key=turn_id, durable=True, autocommit=True)

    def record_posts(self, turn_id: int, reply_ids: Sequence[str]) -> Awaitable[None]:
        """The messages a turn's reply has posted so far, the moment the platform gives their
        ids: a restart can then edit them instead of wondering whether one is out. A reply whose
        delivery was `unsure` (it may have posted) becomes `pending` (its posts are known)."""
        turns = Turn.__table__  # type: ignore[attr-defined]
        statement = (
            update(turns)
            .where(turns.c.id == turn_id)
            .values(
                reply_ids=list(reply_ids),
                delivery=case(
                    (turns.c.delivery == UNSURE_DELIVERY, PENDING_DELIVERY),
                    else_=turns.c.delivery,
                ),
            )
        )
        return self._call(
            lambda connection: connection.execute(statement), key=turn_id, autocommit=True
        )

    def close_interrupted(self, unfinished: Unfinished, error: str) -> Awaitable[None]:
        """End a turn a dead process left running: `interrupted`, with `error`, and a result for
        each tool call it has none for, so the stored history is well-formed too."""
        turn = unfinished.turn
        assert turn.id is not None
        first = 1 + max((message.seq or 0 for message in unfinished.messages), default=0)
        now = utc_now()
        results = list(
            enumerate(map(_interrupted, unanswered_calls(unfinished.messages)), start=first)
        )
        values = {"status": "interrupted", "error": error, "ended_at": now}
        writes = _turn_writes(
            self._dialect, turn.conversation_id, turn.id, results, now, values, None
        )
        return self._call(writes, autocommit=self._single_statements)


def _turn_writes(
    dialect: str,
    conversation_id: int,
    turn_id: int,
    messages: Sequence[tuple[int, TurnMessage]],
    now: datetime,
    values: dict[str, Any] | None,
    compacted: dict[str, Any] | None,
) -> Unit[None]:
    """A turn's messages upserted by `seq` (one statement, however many; the last one given
    for a `seq` wins), a compaction row made in it, and `values` written to its row: one unit
    (`_writing`), one statement on PostgreSQL."""
    by_seq = {seq: message for seq, message in messages}
    rows = [
        _fit(Message, _message_row(conversation_id, turn_id, seq, message, now))
        for seq, message in by_seq.items()
    ]
    writes = []
    if rows:
        writes.append(_upsert_write(dialect, Message, rows, ("turn_id", "seq"), CHANGING))
    if compacted is not None:
        writes.append(_compaction_write(dialect, compacted))
    if values is not None:
        writes.append(_update_write(Turn, turn_id, values))
    return _writing(writes)


def _turn_row(start: TurnStart, now: datetime) -> dict[str, Any]:
    """A new turn's row, but for its conversation (which `start_turn` may open first)."""
    return {
        "inbound_event_id": start.inbound_event_id,
        "provenance": start.provenance,
        "attempt": start.attempt,
        "model": start.model or None,
        "status": "running",
        "started_at": now,
        **_usage_values(UsageTotals()),
    }


def _message_row(
    conversation_id: int, turn_id: int, seq: int, message: TurnMessage, now: datetime
) -> dict[str, Any]:
    row = {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "seq": seq,
        **_message_defaults(now),
    }
    if isinstance(message, Instruction):
        return row | {"role": "user", "text": message.text, "author": INSTRUCTION_AUTHOR}
    if isinstance(message, PersonMessage):  # its author stays the one the turn began with
        return row | {"role": "user", "text": message.text}
    if isinstance(message, ToolResult):
        return row | {
            "role": "tool",
            "text": message.content,
            "tool_name": message.call.name,
            "tool_call_id": message.call.call_id,
            "tool_status": message.status.value,
        }
    return row | {
        "role": "assistant",
        "text": message.text,
        "thinking": message.thinking,
        "tool_calls": _calls_json(message) or None,
        "partial": message.partial,
        "stopped": message.stopped,
    }


def _message_defaults(now: datetime) -> dict[str, Any]:
    return {
        "text": "",
        "thinking": "",
        "tool_calls": None,
        "tool_name": None,
        "tool_call_id": None,
        "tool_status": None,
        "author": None,
        "partial": False,
        "stopped": False,
        "created_at": now,
        "updated_at": now,
    }


def _state_values(state: TurnState) -> dict[str, Any]:
    return {
        "status": state.status,
        "stop_reason": state.stop_reason,
        "error": state.error,
        "ended_at": state.ended_at,
        "reply_ids": list(state.reply_ids) or None,
        "delivery": state.delivery,
        "wrapped_up": state.wrapped_up,
        **_usage_values(state.usage),
    }


def _calls_json(message: AssistantMessage) -> list[dict[str, Any]]:
    return [
        {"id": call.call_id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    ]


def _interrupted(call: dict[str, Any]) -> ToolResult:
    made = ToolCall(call["id"], call["name"], call["arguments"])
    text = INTERRUPTED_TOOL.format(name=call["name"])
    return ToolResult(made, text, ToolStatus.INTERRUPTED)


@cache
def _of_turn_statement() -> Executable:
    table = Message.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.turn_id == bindparam("turn_id")).order_by(table.c.id)


@cache
def _inbound_statement() -> Executable:
    """The platform's id, the text, the author and the attachments of the inbox message a turn
    answers."""
    table = InboundEvent.__table__  # type: ignore[attr-defined]
    columns = (table.c.platform_message_id, table.c.text, table.c.author_id, table.c.attachments)
    return select(*columns).where(table.c.id == bindparam("id"))
