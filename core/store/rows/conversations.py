"""Conversations: a place's thread of turns, and how the turn path reads one whole.

A place has at most one active conversation (the newest not closed); a closed one keeps its
turns, which is why the place of a turn or a run is read through its conversation
(`_conversations_in`, `_place_statement`, used by the turns and the sub-agent runs too).
`conversation_of` is here rather than with the turns because it reads the conversation as a
whole, once per process: its latest compaction, the messages after it, how each of their turns
ended, and how many turns and compactions it has had.
"""

from collections.abc import Awaitable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, func, select

from core.store.base import StoreBase
from core.store.dbthread import Unit
from core.store.history import ending_of
from core.store.rows.compactions import _latest_compaction_statement
from core.store.tables import Compaction, Conversation, Message, Turn, utc_now
from core.store.units import _finding, _inserting, _of_conversation, _rows, _updater


@dataclass(frozen=True)
class StoredConversation:
    """A place's active conversation as the turn path reads it: the messages the model is sent
    (those after its latest compaction, whose summary comes first), and how each of their turns
    ended."""

    conversation: Conversation | None
    messages: list[Message]
    endings: dict[int, str]
    """How each of its turns ended (its status), for `core.store.history`."""
    compaction: Compaction | None = None
    """The latest compaction (its summary stands for every message before `messages`)."""
    turns: int = 0
    """How many turns the conversation has had in all."""
    compactions: int = 0


class ConversationStore(StoreBase):
    def active_conversation(self, place: str) -> Awaitable[Conversation | None]:
        return self._call(
            lambda connection: _active_conversation(connection, place), autocommit=True
        )

    def open_conversation(
        self, place: str, agent: str, system_prompt: str
    ) -> Awaitable[Conversation]:
        return self._call(_opening_conversation(place, agent, system_prompt))

    def close_conversation(self, conversation_id: int) -> Awaitable[None]:
        closing = _updater(Conversation, conversation_id, {"closed_at": utc_now()})
        return self._call(closing, autocommit=True)

    def conversation(self, conversation_id: int) -> Awaitable[Conversation | None]:
        return self._call(_finding(Conversation, conversation_id), autocommit=True)

    def history(self, conversation_id: int) -> Awaitable[list[Message]]:
        return self._call(_of_conversation(Message, conversation_id), autocommit=True)

    def conversation_of(self, place: str) -> Awaitable[StoredConversation]:
        """The place's active conversation (None if it has none), its messages so far and how
        each of its turns ended."""

        def run(connection: Connection) -> StoredConversation:
            conversation = _active_conversation(connection, place)
            if conversation is None or conversation.id is None:
                return StoredConversation(None, [], {})
            key = {"id": conversation.id}
            latest = _rows(connection, Compaction, _latest_compaction_statement(), **key)
            compaction = latest[0] if latest else None
            since = (
                {"turn": compaction.first_kept_turn_id, "seq": compaction.first_kept_seq}
                if compaction
                else {"turn": 0, "seq": 0}
            )
            messages = _rows(connection, Message, _messages_since_statement(), **key, **since)
            endings = {
                turn: ending_of(status, reason)
                for turn, status, reason in connection.execute(_endings_statement(), key | since)
            }
            turns, compactions = connection.execute(_counts_statement(), key).one()
            return StoredConversation(
                conversation, messages, endings, compaction, turns, compactions
            )

        # Reads that need no transaction: the caller holds the conversation's gate.
        return self._call(run, autocommit=True)


def _active_conversation(connection: Connection, place: str) -> Conversation | None:
    found = _rows(connection, Conversation, _active_conversation_statement(), place=place)
    return found[0] if found else None


def _opening_conversation(place: str, agent: str, system_prompt: str) -> Unit[Conversation]:
    """A new conversation of `place`, opened once however often the unit runs (`_inserting`)."""
    return _inserting(Conversation, _conversation_row(place, agent, system_prompt))


def _conversation_row(place: str, agent: str, system_prompt: str) -> dict[str, Any]:
    """A new conversation's row (`start_turn` opens one under its turn): build it before the
    unit is queued."""
    return {
        "place": place,
        "agent": agent,
        "system_prompt": system_prompt,
        "created_at": utc_now(),
    }


def _conversations_in(place: str) -> Any:
    """The ids of every conversation `place` has had (a closed one's turns are still its)."""
    conversations = Conversation.__table__  # type: ignore[attr-defined]
    return select(conversations.c.id).where(conversations.c.place == place)


@cache
def _active_conversation_statement() -> Executable:
    table = Conversation.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.place == bindparam("place"), table.c.closed_at.is_(None))
        .order_by(table.c.id.desc())
        .limit(1)
    )


@cache
def _place_statement() -> Executable:
    table = Conversation.__table__  # type: ignore[attr-defined]
    return select(table.c.place).where(table.c.id == bindparam("id"))


@cache
def _messages_since_statement() -> Executable:
    """A conversation's messages from (turn, seq) on, in order."""
    table = Message.__table__  # type: ignore[attr-defined]
    turn, seq = bindparam("turn"), bindparam("seq")
    return (
        select(table)
        .where(
            table.c.conversation_id == bindparam("id"),
            (table.c.turn_id > turn) | ((table.c.turn_id == turn) & (table.c.seq >= seq)),
        )
        .order_by(table.c.id)
    )


@cache
def _endings_statement() -> Executable:
    turns = Turn.__table__  # type: ignore[attr-defined]
    return select(turns.c.id, turns.c.status, turns.c.stop_reason).where(
        turns.c.conversation_id == bindparam("id"), turns.c.id >= bindparam("turn")
    )


@cache
def _counts_statement() -> Executable:
    turns = Turn.__table__  # type: ignore[attr-defined]
    compactions = Compaction.__table__  # type: ignore[attr-defined]
    return select(
        select(func.count()).where(turns.c.conversation_id == bindparam("id")).scalar_subquery(),
        select(func.count())
        .where(compactions.c.conversation_id == bindparam("id"))
        .scalar_subquery(),
    )
