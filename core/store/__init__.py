"""Persistence for conversations, messages, turns, inbound events, sub-agent runs and tasks.

Every call is queued on a database thread (`core.store.dbthread`) the moment it is made and returns
an awaitable of its result. So the event loop never waits on a round trip, and calls made one after
another land in that order even when the caller awaits none of them until later. The turn path
relies on both: the agent loop's sink queues each record as it happens (no stop can lose it) and
awaits them before whatever must come after them (a frame shown, the closing notice).

A turn's common path is three transactions: the message recorded (`claim_inbound`), the turn
started (`start_turn`: the conversation, its history, the turn and the person's message), and the
reply with the turn's ending (`record_turn`). Under load, calls of many conversations share one
transaction (group commit, in `core.store.dbthread`).

No input can fail a record: every text written is cleaned first (`core.text.clean`: characters
that cannot be encoded become U+FFFD; NUL, which PostgreSQL refuses in text, is dropped) and cut
to its column's length. The engine never logs statement parameters, so a person's text cannot
reach the log through an error.

A transaction whose COMMIT answer is lost with the connection is run again. Each write is written
to stay true under that replay: messages are upserted by (turn, seq); a turn's update writes its
whole mutable state; a claim recognises its own row by its claim token. Only `start_turn` would
write a second turn; losing the connection in that instant is the one case left.

SQLite is the embedded default (WAL, `[storage].sqlite_synchronous`, a busy timeout) and gets one
thread, since SQLite has one writer at a time. PostgreSQL gets `[storage].connections` threads;
a turn's own writes all go to one of them (keyed by the turn), so they stay in order. Statements
are SQLAlchemy Core built once, and rows come back as SQLModel objects built with
`model_construct` (the rows come from our own schema; validating them again costs 37 µs a row).
The schema is created and upgraded by the Alembic migrations in `core/store/migrations`
(`core.store.schema`).
"""

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    union,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import configure_mappers
from sqlmodel import SQLModel

from core.agent.messages import (
    AssistantMessage,
    Instruction,
    ToolCall,
    ToolResult,
    ToolStatus,
    UsageTotals,
)
from core.errors import StoreError
from core.store.dbthread import DatabaseThread, OutageLog, Unit
from core.store.history import INTERRUPTED_TOOL, unanswered_calls
from core.store.schema import ensure_schema
from core.store.tables import (
    Approval,
    Compaction,
    Conversation,
    InboundEvent,
    Message,
    Note,
    Plan,
    ScheduledTask,
    SubagentMessage,
    SubagentRun,
    TaskRun,
    Turn,
    utc_now,
)
from core.text import clean_all

logger = logging.getLogger(__name__)

Row = TypeVar("Row", bound=SQLModel)
T = TypeVar("T")
BACKENDS = ("sqlite", "postgresql")
PENDING_DELIVERY = "pending"
"""A turn's `delivery` between its stored ending and its last edit (`undelivered_turns`)."""
UNSURE_DELIVERY = "unsure"
"""The same, for a reply whose first post may be out with its id not yet known: a restart
cannot edit it, and must not post the answer a second time."""
INSTRUCTION_AUTHOR = "kaiwa"
"""The author of the instructions Kaiwa adds to a turn (a workflow's steps), as stored."""


@dataclass(frozen=True)
class StoreSettings:
    sqlite_synchronous: str = "NORMAL"
    """NORMAL: a commit survives Kaiwa crashing; FULL: it also survives the machine losing power
    (an fsync per commit)."""
    write_retry_seconds: float = 30.0
    connections: int = 4
    """Database threads (and connections) for PostgreSQL; SQLite always has one."""
    close_grace_seconds: float = 10.0
    sqlite_busy_seconds: float = 5.0
    """How long SQLite waits for a lock another process holds before the write counts as
    failed (and is retried like any outage)."""


@dataclass(frozen=True)
class Inbound:
    """A platform message as the inbox records it, before anything acts on it."""

    platform: str
    platform_message_id: str
    place: str
    text: str
    author: str | None = None
    status: str = "received"
    author_id: str | None = None
    """The platform's id of the person (`author` is their name as shown)."""


@dataclass(frozen=True)
class Claim:
    """What `claim_inbound` found. A redelivery (`fresh` False) whose message no turn ever took
    up (`answered` False) may be taken over with `take_over(event_id, token)`."""

    event_id: int
    fresh: bool
    answered: bool = True
    token: str = ""
    """The claim the row carries (the one to take over)."""


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


@dataclass(frozen=True)
class RunStart:
    """A sub-agent run to store."""

    name: str
    profile: str
    model: str
    task: str


@dataclass(frozen=True)
class CompactionRecord:
    """A compaction to store; `first_kept_turn_id` None means the turn that records it."""

    first_kept_turn_id: int | None
    first_kept_seq: int
    summary: str
    method: str
    tokens_before: int
    tokens_after: int
    usage: UsageTotals = field(default_factory=UsageTotals)


@dataclass(frozen=True)
class Unfinished:
    """A turn a dead process left `running`, with what start-up recovery needs to resolve it."""

    turn: Turn
    place: str
    messages: list[Message]
    """The turn's own messages, in order (the person's first)."""
    reply_to: str | None
    """The platform id of the message it answers (None for a turn no person started)."""


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


TurnMessage = AssistantMessage | ToolResult | Instruction


class Store:
    def __init__(
        self, engine: Engine, threads: list[DatabaseThread], settings: StoreSettings
    ) -> None:
        self._engine = engine
        self._shown = engine.url.render_as_string(hide_password=True)
        self._threads = threads
        self._dialect = engine.dialect.name
        self.settings = settings

    @classmethod
    async def open(cls, url: str, settings: StoreSettings | None = None) -> "Store":
        """Open (and create or migrate) the database at `url`; a `StoreError` names the fix."""
        settings = settings or StoreSettings()
        shown = _shown(url)
        engine = _engine_for(url, settings)
        try:
            await asyncio.to_thread(ensure_schema, engine)
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            raise StoreError(
                f"cannot open the database {shown}: {_first_line(exc)}; check that it is "
                "reachable and that [storage].database_url_env names the right variable"
            ) from exc
        configure_mappers()  # `model_construct` skips the call that would otherwise do it
        count = 1 if engine.dialect.name == "sqlite" else settings.connections
        outages = OutageLog(settings.write_retry_seconds)
        threads = [
            DatabaseThread(
                engine,
                name=f"kaiwa-db-{index}",
                retry_seconds=settings.write_retry_seconds,
                outages=outages,
            )
            for index in range(count)
        ]
        return cls(engine, threads, settings)

    async def close(self) -> None:
        """Let every queued call run (a lost connection is retried for a short grace), then
        close the connections."""
        grace = self.settings.close_grace_seconds
        await asyncio.gather(*(thread.close(grace) for thread in self._threads))
        self._engine.dispose()

    def describe(self) -> Awaitable[str]:
        """What the store is, for the log: the backend, where, and how it keeps commits."""
        if self._dialect != "sqlite":
            connections = len(self._threads)
            return self._call(lambda _: f"PostgreSQL {self._shown} ({connections} connections)")

        def run(connection: Connection) -> str:
            journal = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
            level = connection.exec_driver_sql("PRAGMA synchronous").scalar()
            synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
            return f"SQLite {self._engine.url.database} ({journal}, synchronous {synchronous})"

        return self._call(run)

    # -- inbound events ------------------------------------------------------------------------

    def claim_inbound(self, inbound: Inbound) -> Awaitable[Claim]:
        """Record a platform message in the inbox. A message recorded before (a redelivery) is
        not recorded again: the claim says whether anything took it up. The platform may be
        told the message arrived once this resolves."""
        token = uuid.uuid4().hex
        values = _fit(
            InboundEvent,
            {
                "platform": inbound.platform,
                "platform_message_id": inbound.platform_message_id,
                "place": inbound.place,
                "text": inbound.text,
                "author": inbound.author,
                "author_id": inbound.author_id,
                "status": inbound.status,
                "claim": token,
                "received_at": utc_now(),
            },
        )
        claim_statement = _claim_statement(self._dialect)

        def claim(connection: Connection) -> Claim:
            inserted = connection.execute(claim_statement, values).scalar()
            if inserted is not None:
                return Claim(int(inserted), fresh=True, token=token)
            found = connection.execute(_earlier_claim_statement(), values).one()
            if found.claim == token:  # our own commit, replayed after its answer was lost
                return Claim(found.id, fresh=True, token=token)
            taken_up = found.status != "turn" or found.turns > 0
            return Claim(found.id, fresh=False, answered=taken_up, token=found.claim or "")

        return self._call(claim, autocommit=True)  # its SELECT only runs after a collision

    def take_over(self, event_id: int, token: str) -> Awaitable[bool]:
        """Take a recorded message no turn took up, if nobody took it over since `token` was
        read (its claim changes, so a second taker finds it gone)."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = (
            update(table)
            .where(table.c.id == event_id, table.c.claim == token)
            .values(claim=uuid.uuid4().hex)
        )
        return self._call(
            lambda connection: connection.execute(statement).rowcount == 1, autocommit=True
        )

    def unanswered_messages(self) -> Awaitable[list[InboundEvent]]:
        """Messages recorded for a turn that never started (a crash or a shutdown came first),
        oldest first."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = select(table).where(_untaken(table)).order_by(table.c.id)
        return self._call(
            lambda connection: _rows(connection, InboundEvent, statement), autocommit=True
        )

    def queued_messages(self, place: str) -> Awaitable[list[InboundEvent]]:
        """The messages of one place recorded for a turn that no turn has taken up yet (the
        `unanswered_messages` rule), oldest first: what its owner answers when it takes the
        place over, whichever worker recorded them."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = (
            select(table).where(table.c.place == place, _untaken(table)).order_by(table.c.id)
        )
        return self._call(
            lambda connection: _rows(connection, InboundEvent, statement), autocommit=True
        )

    def places_waiting(self) -> Awaitable[list[str]]:
        """The places with work left in the store, sorted: a message no turn has taken up, a
        turn still `running` or not yet shown to have ended, or a scheduled run under way (its
        worker may have died). These are the places to recover, one at a time, by whoever owns
        each."""
        inbox = InboundEvent.__table__  # type: ignore[attr-defined]
        turns = Turn.__table__  # type: ignore[attr-defined]
        conversations = Conversation.__table__  # type: ignore[attr-defined]
        queued = select(inbox.c.place).where(_untaken(inbox))
        running = (
            select(conversations.c.place)
            .join(turns, turns.c.conversation_id == conversations.c.id)
            .where(
                or_(
                    turns.c.status == "running",
                    turns.c.delivery.in_((PENDING_DELIVERY, UNSURE_DELIVERY)),
                )
            )
        )
        task_runs = TaskRun.__table__  # type: ignore[attr-defined]
        tasks = ScheduledTask.__table__  # type: ignore[attr-defined]
        firing = (
            select(tasks.c.place)
            .join(task_runs, task_runs.c.task_id == tasks.c.id)
            .where(task_runs.c.outcome == "running")
        )
        statement = union(queued, running, firing)  # UNION drops duplicates

        def run(connection: Connection) -> list[str]:
            return sorted(connection.execute(statement).scalars())

        return self._call(run, autocommit=True)

    def mark_inbound(self, event_id: int, status: str) -> Awaitable[None]:
        return self._call(_updater(InboundEvent, event_id, {"status": status}), autocommit=True)

    def inbound_status(self, platform: str, platform_message_id: str) -> Awaitable[str | None]:
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = select(table.c.status).where(
            table.c.platform == platform, table.c.platform_message_id == platform_message_id
        )
        return self._call(
            lambda connection: connection.execute(statement).scalar(), autocommit=True
        )

    # -- conversations -------------------------------------------------------------------------

    def active_conversation(self, place: str) -> Awaitable[Conversation | None]:
        return self._call(
            lambda connection: _active_conversation(connection, place), autocommit=True
        )

    def open_conversation(
        self, place: str, agent: str, system_prompt: str
    ) -> Awaitable[Conversation]:
        return self._call(
            lambda connection: _open_conversation(connection, place, agent, system_prompt)
        )

    def close_conversation(self, conversation_id: int) -> Awaitable[None]:
        closing = _updater(Conversation, conversation_id, {"closed_at": utc_now()})
        return self._call(closing, autocommit=True)

    def history(self, conversation_id: int) -> Awaitable[list[Message]]:
        return self._call(
            lambda connection: _of_conversation(connection, Message, conversation_id),
            autocommit=True,
        )

    # -- turns ---------------------------------------------------------------------------------

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
            endings = dict(connection.execute(_endings_statement(), key | since).all())
            turns, compactions = connection.execute(_counts_statement(), key).one()
            return StoredConversation(
                conversation, messages, endings, compaction, turns, compactions
            )

        # Reads that need no transaction: the caller holds the conversation's gate.
        return self._call(run, autocommit=True)

    def start_turn(self, start: TurnStart) -> Awaitable[StartedTurn]:
        """Open a turn (and, if `start` names none, its conversation) and store the message
        that started it: one transaction."""

        def run(connection: Connection) -> StartedTurn:
            conversation_id = start.conversation_id
            if conversation_id is None:
                opened = _open_conversation(
                    connection, start.place, start.agent, start.system_prompt
                )
                assert opened.id is not None
                conversation_id = opened.id
            now = utc_now()
            turn = {
                "conversation_id": conversation_id,
                "inbound_event_id": start.inbound_event_id,
                "provenance": start.provenance,
                "attempt": start.attempt,
                "status": "running",
                "started_at": now,
                **_usage_values(UsageTotals()),
            }
            turn_id = int(
                connection.execute(_insert_statement(Turn), _fit(Turn, turn)).scalar_one()
            )
            said = _message_defaults(now) | {
                "conversation_id": conversation_id,
                "turn_id": turn_id,
                "seq": 0,
                "role": "user",
                "text": start.text,
                "author": start.author,
            }
            said = _fit(Message, said)
            connection.execute(insert(Message.__table__), said)  # type: ignore[attr-defined]
            return StartedTurn(conversation_id, turn_id)

        return self._call(run)

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
        rows = [
            _fit(Message, _message_row(conversation_id, turn_id, seq, message, now))
            for seq, message in messages
        ]
        values = None if state is None else _state_values(state)
        upsert = _upsert_message_statement(self._dialect)
        compacted = (
            None if compaction is None else _compaction_row(conversation_id, turn_id, compaction)
        )

        def run(connection: Connection) -> None:
            if rows:
                connection.execute(upsert, rows)  # one statement, however many rows
            if compacted is not None:
                connection.execute(insert(Compaction.__table__), compacted)  # type: ignore[attr-defined]
            if values is not None:
                _updater(Turn, turn_id, values)(connection)

        return self._call(run, key=turn_id, durable=durable)

    def record_compaction(
        self, conversation_id: int, compaction: CompactionRecord
    ) -> Awaitable[None]:
        """Store a compaction made outside any turn (`/compact`)."""
        row = _compaction_row(conversation_id, None, compaction)
        return self._call(
            lambda connection: connection.execute(insert(Compaction.__table__), row)  # type: ignore[attr-defined]
        )

    def compactions(self, conversation_id: int) -> Awaitable[list[Compaction]]:
        return self._call(
            lambda connection: _of_conversation(connection, Compaction, conversation_id),
            autocommit=True,
        )

    def turns(self, conversation_id: int) -> Awaitable[list[Turn]]:
        return self._call(
            lambda connection: _of_conversation(connection, Turn, conversation_id), autocommit=True
        )

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
                reply_to = None
                if turn.inbound_event_id is not None:
                    reply_to = connection.execute(
                        _platform_id_statement(), {"id": turn.inbound_event_id}
                    ).scalar()
                found.append(Unfinished(turn, turn_place, messages, reply_to))
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
        return self._call(_updater(Turn, turn_id, values), durable=True)

    def close_interrupted(self, unfinished: Unfinished, error: str) -> Awaitable[None]:
        """End a turn a dead process left running: `interrupted`, with `error`, and a result for
        each tool call it has none for, so the stored history is well-formed too."""
        turn = unfinished.turn
        assert turn.id is not None
        first = 1 + max((message.seq or 0 for message in unfinished.messages), default=0)
        now = utc_now()
        rows = [
            _fit(Message, _message_row(turn.conversation_id, turn.id, seq, result, now))
            for seq, result in enumerate(
                map(_interrupted, unanswered_calls(unfinished.messages)), start=first
            )
        ]
        values = {"status": "interrupted", "error": error, "ended_at": now}
        upsert = _upsert_message_statement(self._dialect)

        def run(connection: Connection) -> None:
            if rows:
                connection.execute(upsert, rows)
            _updater(Turn, turn.id, values)(connection)  # type: ignore[arg-type]

        return self._call(run)

    # -- sub-agent runs ------------------------------------------------------------------------

    def start_runs(
        self,
        conversation_id: int,
        parent_turn_id: int | None,
        runs: Sequence[RunStart],
        parent_run_id: int | None = None,
    ) -> Awaitable[list[tuple[int, str]]]:
        """Store new runs of a conversation, keyed `a<n>` after every run it ever had (keys are
        never reused); their row ids and keys, in order. One transaction."""
        now = utc_now()

        def run(connection: Connection) -> list[tuple[int, str]]:
            count = connection.execute(_run_count_statement(), {"id": conversation_id}).scalar()
            started = []
            for number, spec in enumerate(runs, start=int(count or 0) + 1):
                key = f"a{number}"
                values = _fit(
                    SubagentRun,
                    {
                        "conversation_id": conversation_id,
                        "parent_turn_id": parent_turn_id,
                        "parent_run_id": parent_run_id,
                        "key": key,
                        "name": spec.name,
                        "profile": spec.profile,
                        "model": spec.model,
                        "task": spec.task,
                        "status": "running",
                        "delivery": "pending",
                        "unread": 0,
                        "started_at": now,
                        **_usage_values(UsageTotals()),
                    },
                )
                row_id = connection.execute(_insert_statement(SubagentRun), values).scalar_one()
                started.append((int(row_id), key))
            return started

        return self._call(run)

    def record_run(
        self,
        run_id: int,
        *,
        messages: Sequence[tuple[int, str, str, str | None, list[dict[str, Any]] | None]] = (),
        values: dict[str, Any] | None = None,
        durable: bool = False,
    ) -> Awaitable[None]:
        """Append to a run's transcript (seq, role, text, tool name, tool calls) and change its
        row, in one transaction."""
        now = utc_now()
        rows = [
            _fit(
                SubagentMessage,
                {
                    "run_id": run_id,
                    "seq": seq,
                    "role": role,
                    "text": text,
                    "tool_name": tool_name,
                    "tool_calls": tool_calls,
                    "created_at": now,
                },
            )
            for seq, role, text, tool_name, tool_calls in messages
        ]
        changes = _fit(SubagentRun, values or {})

        def run(connection: Connection) -> None:
            if rows:
                connection.execute(insert(SubagentMessage.__table__), rows)  # type: ignore[attr-defined]
            if changes:
                _updater(SubagentRun, run_id, changes)(connection)

        return self._call(run, key=-run_id, durable=durable)

    def runs(self, conversation_id: int) -> Awaitable[list[SubagentRun]]:
        return self._call(
            lambda connection: _of_conversation(connection, SubagentRun, conversation_id),
            autocommit=True,
        )

    def transcript(self, run_id: int) -> Awaitable[list[SubagentMessage]]:
        def run(connection: Connection) -> list[SubagentMessage]:
            return _rows(connection, SubagentMessage, _transcript_statement(), run_id=run_id)

        return self._call(run, autocommit=True)

    def set_delivery(self, run_ids: Sequence[int], delivery: str) -> Awaitable[None]:
        def run(connection: Connection) -> None:
            for run_id in run_ids:
                _updater(SubagentRun, run_id, {"delivery": delivery})(connection)

        return self._call(run, durable=True)

    def live_runs(self, place: str | None = None) -> Awaitable[list[tuple[str, SubagentRun]]]:
        """Runs still `running` (read at start-up, or when a worker takes `place` over: a dead
        process's), each with its place."""
        return self._runs_with_places(_live_runs_statement(), place)

    def undelivered_reports(
        self, place: str | None = None
    ) -> Awaitable[list[tuple[str, SubagentRun]]]:
        """Finished runs whose reports never reached their conversation, with its place."""
        return self._runs_with_places(_undelivered_statement(), place)

    def mark_runs_lost(self, run_ids: Sequence[int]) -> Awaitable[None]:
        values = {"status": "lost", "delivery": "discarded", "ended_at": utc_now()}

        def run(connection: Connection) -> None:
            for run_id in run_ids:
                _updater(SubagentRun, run_id, values)(connection)

        return self._call(run)

    def _runs_with_places(
        self, statement: Any, place: str | None
    ) -> Awaitable[list[tuple[str, SubagentRun]]]:
        if place is not None:
            runs = SubagentRun.__table__  # type: ignore[attr-defined]
            statement = statement.where(runs.c.conversation_id.in_(_conversations_in(place)))

        def run(connection: Connection) -> list[tuple[str, SubagentRun]]:
            found = []
            for row in _rows(connection, SubagentRun, statement):
                place = connection.execute(_place_statement(), {"id": row.conversation_id})
                found.append((str(place.scalar_one()), row))
            return found

        return self._call(run, autocommit=True)

    # -- scheduled tasks -----------------------------------------------------------------------

    def create_task(self, values: dict[str, Any]) -> Awaitable[ScheduledTask]:
        """Store a new task; the stored row (with its id)."""
        return self._call(_inserting(ScheduledTask, values), durable=True)

    def task(self, task_id: int) -> Awaitable[ScheduledTask | None]:
        return self._call(_finding(ScheduledTask, task_id), autocommit=True)

    def tasks(self, place: str | None = None) -> Awaitable[list[ScheduledTask]]:
        """Tasks not cancelled, oldest first: of one place, or all of them."""

        def run(connection: Connection) -> list[ScheduledTask]:
            return _rows(connection, ScheduledTask, _tasks_statement(place is None), place=place)

        return self._call(run, autocommit=True)

    def update_task(self, task_id: int, values: dict[str, Any]) -> Awaitable[None]:
        return self._call(_updater(ScheduledTask, task_id, values), durable=True)

    def claim_slot(
        self,
        task_id: int,
        fire_time: datetime,
        run: dict[str, Any],
        move: tuple[datetime, datetime | None] | None = None,
    ) -> Awaitable[int | None]:
        """Claim a task's fire slot in one transaction: `move` (expected, next) moves the task's
        `next_run` on to next, only if it is still expected; then the slot's run row (`run`'s
        values) is inserted. None when either was taken first (another scheduler moved the task
        on, or the slot was claimed before a restart), and then nothing is written."""
        values = _fit(TaskRun, {"task_id": task_id, "fire_time": fire_time, **run})
        moved = _task_move_statement()
        statement = _slot_claim_statement(self._dialect)

        def claim(connection: Connection) -> int | None:
            if move is not None:
                step = {"row_id": task_id, "expected": move[0], "next_run": move[1]}
                if connection.execute(moved, step).rowcount != 1:
                    return None
            inserted = connection.execute(statement, values).scalar()
            return None if inserted is None else int(inserted)

        return self._call(claim, durable=True)

    def finish_task_run(
        self, run_id: int, run: dict[str, Any], task_id: int, task: dict[str, Any]
    ) -> Awaitable[None]:
        """A run's ending and what it changes on its task, in one transaction."""

        def finish(connection: Connection) -> None:
            _updater(TaskRun, run_id, run)(connection)
            if task:
                _updater(ScheduledTask, task_id, task)(connection)

        return self._call(finish, durable=True)

    def close_unfinished_task_runs(self, place: str | None = None) -> Awaitable[int]:
        """Runs a dead process left `running` end `interrupted` (read at start-up, or when a
        worker takes `place` over: then only the runs of tasks in that place); how many."""
        table = TaskRun.__table__  # type: ignore[attr-defined]
        statement = update(table).where(table.c.outcome == "running")
        if place is not None:
            tasks = ScheduledTask.__table__  # type: ignore[attr-defined]
            in_place = select(tasks.c.id).where(tasks.c.place == place)
            statement = statement.where(table.c.task_id.in_(in_place))
        statement = statement.values(
            outcome="interrupted", error="Kaiwa stopped during the run", finished_at=utc_now()
        )
        return self._call(lambda connection: connection.execute(statement).rowcount, durable=True)

    def task_runs(self, task_id: int, limit: int = 5) -> Awaitable[list[TaskRun]]:
        """A task's latest runs, newest first."""

        def run(connection: Connection) -> list[TaskRun]:
            return _rows(connection, TaskRun, _task_runs_statement(), task_id=task_id, limit=limit)

        return self._call(run, autocommit=True)

    # -- reading conversations -----------------------------------------------------------------

    def search_messages(
        self, space: str, words: Sequence[str], limit: int
    ) -> Awaitable[list[tuple[Message, str]]]:
        """The newest messages (a person's or an answer, not Kaiwa's instructions) of
        conversations in `space` holding every one of `words`, case-insensitively, each with its
        conversation's place. `space` is a place, or a prefix of places ending in ':'."""
        messages = Message.__table__  # type: ignore[attr-defined]
        conversations = Conversation.__table__  # type: ignore[attr-defined]
        statement = (
            select(messages, conversations.c.place.label("conversation_place"))
            .join(conversations, conversations.c.id == messages.c.conversation_id)
            .where(_in_space(conversations.c.place, space))
            .where(messages.c.role.in_(("user", "assistant")))
            .where(messages.c.author.is_distinct_from(INSTRUCTION_AUTHOR))
            .where(*(messages.c.text.ilike(f"%{_escaped(word)}%", escape="\\") for word in words))
            .order_by(messages.c.id.desc())
            .limit(limit)
        )

        def run(connection: Connection) -> list[tuple[Message, str]]:
            found = []
            for row in connection.execute(statement):
                values = dict(row._mapping)
                place = values.pop("conversation_place")
                found.append((Message.model_construct(**values), place))
            return found

        return self._call(run, autocommit=True)

    def conversation(self, conversation_id: int) -> Awaitable[Conversation | None]:
        return self._call(_finding(Conversation, conversation_id), autocommit=True)

    def add_note(self, values: dict[str, Any]) -> Awaitable[Note]:
        return self._call(_inserting(Note, values), durable=True)

    def notes(self, owner: str) -> Awaitable[list[Note]]:
        """An owner's notes, oldest first."""

        def run(connection: Connection) -> list[Note]:
            return _rows(connection, Note, _notes_statement(), owner=owner)

        return self._call(run, autocommit=True)

    def forget_note(self, owner: str, note_id: int) -> Awaitable[bool]:
        """Delete one of `owner`'s notes; False when it has none with that id."""
        table = Note.__table__  # type: ignore[attr-defined]
        statement = delete(table).where(table.c.id == note_id, table.c.owner == owner)
        return self._call(
            lambda connection: connection.execute(statement).rowcount == 1, durable=True
        )

    # -- approvals -----------------------------------------------------------------------------

    def add_approval(self, values: dict[str, Any]) -> Awaitable[Approval]:
        return self._call(_inserting(Approval, values), durable=True)

    def update_approval(self, approval_id: int, values: dict[str, Any]) -> Awaitable[None]:
        return self._call(_updater(Approval, approval_id, values), durable=True)

    def decide_approval(self, approval_id: int, values: dict[str, Any]) -> Awaitable[bool]:
        """Settle a pending approval; False when it was settled already (the first answer
        wins, also across processes)."""
        table = Approval.__table__  # type: ignore[attr-defined]
        statement = (
            update(table)
            .where(table.c.id == approval_id, table.c.status == "pending")
            .values(**_fit(Approval, values))
        )
        return self._call(
            lambda connection: connection.execute(statement).rowcount == 1, durable=True
        )

    def approval(self, approval_id: int) -> Awaitable[Approval | None]:
        return self._call(_finding(Approval, approval_id), autocommit=True)

    def pending_approvals(self, place: str | None = None) -> Awaitable[list[Approval]]:
        """Approvals still `pending` (read at start-up, a dead process's questions; or when a
        worker takes `place` over, only those asked there)."""
        table = Approval.__table__  # type: ignore[attr-defined]
        statement = select(table).where(table.c.status == "pending")
        if place is not None:
            statement = statement.where(table.c.place == place)
        statement = statement.order_by(table.c.id)
        return self._call(lambda c: _rows(c, Approval, statement), autocommit=True)

    # -- plans ---------------------------------------------------------------------------------

    def add_plan(self, values: dict[str, Any]) -> Awaitable[Plan]:
        return self._call(_inserting(Plan, values), durable=True)

    def update_plan(self, plan_id: int, values: dict[str, Any]) -> Awaitable[None]:
        return self._call(_updater(Plan, plan_id, values), durable=True)

    def plan(self, plan_id: int) -> Awaitable[Plan | None]:
        return self._call(_finding(Plan, plan_id), autocommit=True)

    def plans(self, conversation_id: int, limit: int) -> Awaitable[list[Plan]]:
        """A conversation's latest plans, newest first."""

        def run(connection: Connection) -> list[Plan]:
            return _rows(
                connection, Plan, _plans_statement(), conversation_id=conversation_id, limit=limit
            )

        return self._call(run, autocommit=True)

    def close_unfinished_plans(
        self, now: datetime, place: str | None = None
    ) -> Awaitable[list[Plan]]:
        """Plans a dead process left unfinished end `interrupted` (read at start-up; or, when a
        worker takes `place` over, only that place's), a running step `stopped` and waiting
        ones `not_run`; the plans as they now are, so their progress messages can be edited to
        say so. They are read back by (`interrupted`, `now`, the place), so a transaction
        replayed after its COMMIT answer was lost returns them too, and no other place's."""
        table = Plan.__table__  # type: ignore[attr-defined]
        unfinished = select(table).where(table.c.status.in_(_UNFINISHED_PLANS))
        closed = select(table).where(table.c.status == "interrupted", table.c.updated_at == now)
        if place is not None:
            unfinished = unfinished.where(table.c.place == place)
            closed = closed.where(table.c.place == place)
        closed = closed.order_by(table.c.id)

        def run(connection: Connection) -> list[Plan]:
            for plan in _rows(connection, Plan, unfinished):
                assert plan.id is not None
                steps = [_interrupted_step(step) for step in plan.steps or []]
                values = {"status": "interrupted", "steps": steps, "updated_at": now}
                _updater(Plan, plan.id, values)(connection)
            return _rows(connection, Plan, closed)

        return self._call(run, durable=True)

    # -- plumbing ------------------------------------------------------------------------------

    def _call(
        self,
        unit: Unit[T],
        *,
        key: int | None = None,
        durable: bool = False,
        autocommit: bool = False,
    ) -> "asyncio.Future[T]":
        """Queue `unit` on a database thread: the one `key` maps to (so calls with one key keep
        their order), else the least busy. `autocommit`: `unit` needs no transaction around it
        (one statement, or reads whose consistency the caller keeps)."""
        if key is not None:
            thread = self._threads[key % len(self._threads)]
        else:
            thread = min(self._threads, key=lambda each: each.backlog)
        return thread.submit(unit, durable=durable, autocommit=autocommit)


# -- units ----------------------------------------------------------------------------------------


_UNFINISHED_PLANS = ("drafting", "reviewing", "awaiting_person", "running")
_INTERRUPTED_STEPS = {"running": "stopped", "waiting": "not_run"}


def _interrupted_step(step: dict[str, Any]) -> dict[str, Any]:
    """A plan's step as a restart leaves it: a copy, so the step list is written whole."""
    status = step.get("status")
    return {**step, "status": _INTERRUPTED_STEPS.get(status, status)}


def _interrupted(call: dict[str, Any]) -> ToolResult:
    made = ToolCall(call["id"], call["name"], call["arguments"])
    text = INTERRUPTED_TOOL.format(name=call["name"])
    return ToolResult(made, text, ToolStatus.INTERRUPTED)


def _untaken(inbox: Any) -> Any:
    """An inbox row recorded for a turn that no turn has taken up (none points at it)."""
    turns = Turn.__table__  # type: ignore[attr-defined]
    taken = select(turns.c.id).where(turns.c.inbound_event_id == inbox.c.id).exists()
    return (inbox.c.status == "turn") & ~taken


def _conversations_in(place: str) -> Any:
    """The ids of every conversation `place` has had (a closed one's turns are still its)."""
    conversations = Conversation.__table__  # type: ignore[attr-defined]
    return select(conversations.c.id).where(conversations.c.place == place)


def _active_conversation(connection: Connection, place: str) -> Conversation | None:
    found = _rows(connection, Conversation, _active_conversation_statement(), place=place)
    return found[0] if found else None


def _open_conversation(
    connection: Connection, place: str, agent: str, system_prompt: str
) -> Conversation:
    values = _fit(
        Conversation,
        {"place": place, "agent": agent, "system_prompt": system_prompt, "created_at": utc_now()},
    )
    row = connection.execute(_insert_returning_row(Conversation), values).one()
    return Conversation.model_construct(**row._mapping)


def _of_conversation(connection: Connection, model: type[Row], conversation_id: int) -> list[Row]:
    statement = _of_conversation_statement(model)
    return _rows(connection, model, statement, conversation_id=conversation_id)


def _rows(
    connection: Connection, model: type[Row], statement: Executable, **parameters: Any
) -> list[Row]:
    return [
        model.model_construct(**row._mapping) for row in connection.execute(statement, parameters)
    ]


def _inserting(model: type[Row], values: dict[str, Any]) -> Unit[Row]:
    """A new row of `model`, as stored (its id and defaults filled in)."""
    fitted = _fit(model, values)

    def run(connection: Connection) -> Row:
        row = connection.execute(_insert_returning_row(model), fitted).one()
        return model.model_construct(**row._mapping)

    return run


def _finding(model: type[Row], row_id: int) -> Unit[Row | None]:
    """The row of `model` with `row_id`, or None."""

    def run(connection: Connection) -> Row | None:
        found = _rows(connection, model, _by_id_statement(model), row_id=row_id)
        return found[0] if found else None

    return run


def _updater(model: type[SQLModel], row_id: int, values: dict[str, Any]) -> Unit[None]:
    statement = _update_statement(model)
    parameters = {"row_id": row_id, **_fit(model, values)}

    def run(connection: Connection) -> None:
        connection.execute(statement, parameters)

    return run


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


def _compaction_row(
    conversation_id: int, turn_id: int | None, compaction: CompactionRecord
) -> dict[str, Any]:
    first_kept_turn = compaction.first_kept_turn_id
    return _fit(
        Compaction,
        {
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "first_kept_turn_id": turn_id if first_kept_turn is None else first_kept_turn,
            "first_kept_seq": compaction.first_kept_seq,
            "summary": compaction.summary,
            "method": compaction.method,
            "tokens_before": compaction.tokens_before,
            "tokens_after": compaction.tokens_after,
            **_usage_values(compaction.usage),
            "created_at": utc_now(),
        },
    )


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


def _usage_values(usage: UsageTotals) -> dict[str, Any]:
    """Token totals are NULL when a call's counts are unknown (it was cut short): a sum of the
    known ones would claim to be the whole."""
    known = not usage.unknown_calls
    return {
        "model_calls": usage.model_calls,
        "prompt_tokens": usage.prompt_tokens if known else None,
        "output_tokens": usage.output_tokens if known else None,
        "model_seconds": usage.seconds,
    }


def _calls_json(message: AssistantMessage) -> list[dict[str, Any]]:
    return [
        {"id": call.call_id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    ]


# -- fitting values to their columns --------------------------------------------------------------


def _fit(model: type[SQLModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` as `model`'s table takes them: every string cleaned (`clean`, also inside JSON)
    and cut to its column's length (a model may name a tool 500 characters long; PostgreSQL
    would refuse the row)."""
    limits = _column_lengths(model)
    fitted = {}
    for name, value in values.items():
        value = clean_all(value)
        limit = limits.get(name)
        fitted[name] = value[:limit] if limit and isinstance(value, str) else value
    return fitted


@cache
def _column_lengths(model: type[SQLModel]) -> dict[str, int]:
    table = model.__table__  # type: ignore[attr-defined]
    return {
        column.name: column.type.length
        for column in table.columns
        if getattr(column.type, "length", None)
    }


# -- statements, built once per model and backend: SQLAlchemy then skips rebuilding them ----------


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
def _of_conversation_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.conversation_id == bindparam("conversation_id"))
        .order_by(table.c.id)
    )


@cache
def _by_id_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.id == bindparam("row_id"))


@cache
def _insert_returning_row(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return insert(table).returning(*table.c)


@cache
def _insert_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return insert(table).returning(table.c.id)


@cache
def _update_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return update(table).where(table.c.id == bindparam("row_id"))


@cache
def _claim_statement(dialect: str) -> Executable:
    table = InboundEvent.__table__  # type: ignore[attr-defined]
    return (
        _dialect_insert(dialect)(table)
        .on_conflict_do_nothing(index_elements=["platform", "platform_message_id"])
        .returning(table.c.id)
    )


@cache
def _slot_claim_statement(dialect: str) -> Executable:
    table = TaskRun.__table__  # type: ignore[attr-defined]
    return (
        _dialect_insert(dialect)(table)
        .on_conflict_do_nothing(index_elements=["task_id", "fire_time"])
        .returning(table.c.id)
    )


def _in_space(place: Any, space: str) -> Any:
    """`place` is `space` (a place), or begins with it (a prefix ending in ':')."""
    if space.endswith(":"):
        return place.startswith(space, autoescape=True)
    return place == space


def _escaped(word: str) -> str:
    """`word` for a LIKE pattern, its wildcards taken literally."""
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@cache
def _notes_statement() -> Executable:
    table = Note.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.owner == bindparam("owner")).order_by(table.c.id)


@cache
def _task_move_statement() -> Executable:
    table = ScheduledTask.__table__  # type: ignore[attr-defined]
    return (
        update(table)
        .where(table.c.id == bindparam("row_id"), table.c.next_run == bindparam("expected"))
        .values(next_run=bindparam("next_run"))
    )


@cache
def _tasks_statement(everywhere: bool) -> Executable:
    table = ScheduledTask.__table__  # type: ignore[attr-defined]
    chosen = select(table).where(table.c.cancelled_at.is_(None))
    if not everywhere:
        chosen = chosen.where(table.c.place == bindparam("place"))
    return chosen.order_by(table.c.id)


@cache
def _task_runs_statement() -> Executable:
    table = TaskRun.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.task_id == bindparam("task_id"))
        .order_by(table.c.fire_time.desc(), table.c.id.desc())
        .limit(bindparam("limit"))
    )


@cache
def _plans_statement() -> Executable:
    table = Plan.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.conversation_id == bindparam("conversation_id"))
        .order_by(table.c.id.desc())
        .limit(bindparam("limit"))
    )


@cache
def _earlier_claim_statement() -> Executable:
    """The row a redelivery collided with: its id, status, claim and how many turns took it."""
    table = InboundEvent.__table__  # type: ignore[attr-defined]
    turns = Turn.__table__  # type: ignore[attr-defined]
    taken = (
        select(func.count(turns.c.id))
        .where(turns.c.inbound_event_id == table.c.id)
        .scalar_subquery()
        .label("turns")
    )
    return select(table.c.id, table.c.status, table.c.claim, taken).where(
        table.c.platform == bindparam("platform"),
        table.c.platform_message_id == bindparam("platform_message_id"),
    )


@cache
def _endings_statement() -> Executable:
    turns = Turn.__table__  # type: ignore[attr-defined]
    return select(turns.c.id, turns.c.status).where(
        turns.c.conversation_id == bindparam("id"), turns.c.id >= bindparam("turn")
    )


@cache
def _run_count_statement() -> Executable:
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    return select(func.count()).where(table.c.conversation_id == bindparam("id"))


@cache
def _transcript_statement() -> Executable:
    table = SubagentMessage.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.run_id == bindparam("run_id")).order_by(table.c.seq)


@cache
def _live_runs_statement() -> Executable:
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.status == "running").order_by(table.c.id)


@cache
def _undelivered_statement() -> Executable:
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.status != "running", table.c.delivery == "pending")
        .order_by(table.c.id)
    )


@cache
def _latest_compaction_statement() -> Executable:
    table = Compaction.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.conversation_id == bindparam("id"))
        .order_by(table.c.id.desc())
        .limit(1)
    )


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
def _counts_statement() -> Executable:
    turns = Turn.__table__  # type: ignore[attr-defined]
    compactions = Compaction.__table__  # type: ignore[attr-defined]
    return select(
        select(func.count()).where(turns.c.conversation_id == bindparam("id")).scalar_subquery(),
        select(func.count())
        .where(compactions.c.conversation_id == bindparam("id"))
        .scalar_subquery(),
    )


@cache
def _place_statement() -> Executable:
    table = Conversation.__table__  # type: ignore[attr-defined]
    return select(table.c.place).where(table.c.id == bindparam("id"))


@cache
def _platform_id_statement() -> Executable:
    table = InboundEvent.__table__  # type: ignore[attr-defined]
    return select(table.c.platform_message_id).where(table.c.id == bindparam("id"))


@cache
def _of_turn_statement() -> Executable:
    table = Message.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.turn_id == bindparam("turn_id")).order_by(table.c.id)


@cache
def _upsert_message_statement(dialect: str) -> Executable:
    table = Message.__table__  # type: ignore[attr-defined]
    statement = _dialect_insert(dialect)(table)
    changing = ("text", "thinking", "tool_calls", "tool_status", "partial", "stopped", "updated_at")
    return statement.on_conflict_do_update(
        index_elements=["turn_id", "seq"],
        set_={name: statement.excluded[name] for name in changing},
    )


def _dialect_insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


# -- engines --------------------------------------------------------------------------------------


def _engine_for(url: str, settings: StoreSettings) -> Engine:
    shown = _shown(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise StoreError(  # not shown: a URL that cannot be parsed cannot have its password hidden
            f"the database URL is not valid ({_first_line(exc)}); fix it in the variable "
            "[storage].database_url_env names"
        ) from exc
    if parsed.get_backend_name() not in BACKENDS:
        raise StoreError(
            f"the database URL {shown} is for {parsed.get_backend_name()}; Kaiwa stores in "
            "SQLite or PostgreSQL (postgresql+psycopg://...)"
        )
    try:
        if parsed.get_backend_name() == "postgresql":
            return create_engine(
                url,
                hide_parameters=True,
                pool_pre_ping=True,
                pool_size=settings.connections,
                max_overflow=1,
            )
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            hide_parameters=True,
            connect_args={"timeout": settings.sqlite_busy_seconds, "check_same_thread": False},
        )
    except (SQLAlchemyError, ImportError, OSError, ValueError) as exc:
        raise StoreError(f"cannot open the database {shown}: {_first_line(exc)}") from exc

    def pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(settings.sqlite_busy_seconds * 1000)}")
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    event.listen(engine, "connect", pragmas)
    return engine


def not_awaited(call: Awaitable[Any], what: str) -> None:
    """For a store call nobody waits on: a failure becomes one log line, not a lost exception."""

    def log_failure(done: "asyncio.Future[Any]") -> None:
        if not done.cancelled() and done.exception() is not None:
            logger.warning("%s failed: %s", what, done.exception())

    asyncio.ensure_future(call).add_done_callback(log_failure)


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(unparseable URL)"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
