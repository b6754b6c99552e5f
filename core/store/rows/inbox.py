"""The inbox: every platform message as recorded before anything acts on it, and the queue of
those no turn has taken up yet.

A message is recorded before its platform is told it arrived, so a redelivery finds its row: the
claim says whether anything took it up, and a row recorded for a turn that no turn points at
(`_untaken`) is still owed an answer. A claim recognises its own row by its claim token, so a
claim replayed after its COMMIT answer was lost is not mistaken for a redelivery; taking a row
over changes the token, so a second taker finds it gone (and a replayed take-over its own).
`places_waiting` is here because the inbox is the queue recovery starts from: it names every
place with work left (a queued message, a turn not yet shown to have ended, a scheduled run
under way).
"""

import uuid
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, func, or_, select, union, update

from core.channel import Attachment
from core.store.base import StoreBase
from core.store.rows.turns import PENDING_DELIVERY, UNSURE_DELIVERY
from core.store.tables import (
    Conversation,
    InboundEvent,
    ScheduledTask,
    TaskRun,
    Turn,
    utc_now,
)
from core.store.units import _changes_one, _fit, _insert_if_new_statement, _reading, _updater


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
    attachments: tuple[Attachment, ...] = ()


@dataclass(frozen=True)
class Claim:
    """What `claim_inbound` found. A redelivery (`fresh` False) whose message no turn ever took
    up (`answered` False) may be taken over with `take_over(event_id, token)`."""

    event_id: int
    fresh: bool
    answered: bool = True
    token: str = ""
    """The claim the row carries (the one to take over)."""


class InboxStore(StoreBase):
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
                "attachments": [asdict(each) for each in inbound.attachments] or None,
                "claim": token,
                "received_at": utc_now(),
            },
        )
        claim_statement = _insert_if_new_statement(
            self._dialect, InboundEvent, ("platform", "platform_message_id")
        )

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
        read (its claim changes, so a second taker finds it gone, and a replay of this call
        finds the claim it wrote)."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        ours = uuid.uuid4().hex  # made before queueing: a replay finds the row carrying it
        statement = (
            update(table)
            .where(table.c.id == event_id, table.c.claim.in_((token, ours)))
            .values(claim=ours)
        )
        return self._call(_changes_one(statement), autocommit=True)

    def unanswered_messages(self) -> Awaitable[list[InboundEvent]]:
        """Messages recorded for a turn that never started (a crash or a shutdown came first),
        oldest first."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = select(table).where(_untaken(table)).order_by(table.c.id)
        return self._call(_reading(InboundEvent, statement), autocommit=True)

    def queued_messages(self, place: str) -> Awaitable[list[InboundEvent]]:
        """The messages of one place recorded for a turn that no turn has taken up yet (the
        `unanswered_messages` rule), oldest first: what its owner answers when it takes the
        place over, whichever worker recorded them."""
        table = InboundEvent.__table__  # type: ignore[attr-defined]
        statement = (
            select(table).where(table.c.place == place, _untaken(table)).order_by(table.c.id)
        )
        return self._call(_reading(InboundEvent, statement), autocommit=True)

    def places_waiting(self) -> Awaitable[list[str]]:
        """The places with work left in the store, sorted: a message no turn has taken up, a
        turn still `running` or not yet shown to have ended, or a scheduled run under way (its
        worker may have died). These are the places to recover, each by whoever owns it."""
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


def _untaken(inbox: Any) -> Any:
    """An inbox row recorded for a turn that no turn has taken up (none points at it)."""
    turns = Turn.__table__  # type: ignore[attr-defined]
    taken = select(turns.c.id).where(turns.c.inbound_event_id == inbox.c.id).exists()
    return (inbox.c.status == "turn") & ~taken


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
