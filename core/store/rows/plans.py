"""Plans: the state of a `/plan` workflow (its steps, its status), written whole as it goes.

A plan is written by its workflow while it runs; what a dead process left is closed by
`close_unfinished_plans`, which must stay true if its transaction is replayed after its COMMIT
answer was lost: the plans it closed are read back by what it wrote (`interrupted`, its `now`,
the place) rather than returned from the first pass, which a replay would find empty.
"""

from collections.abc import Awaitable
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, select

from core.store.base import StoreBase
from core.store.rows.turns import INSTRUCTION_AUTHOR
from core.store.tables import Message, Plan
from core.store.units import _finding, _inserting, _reading, _rows, _updater

_UNFINISHED_PLANS = ("drafting", "reviewing", "awaiting_person", "running")
_INTERRUPTED_STEPS = {"waiting": "not_run"}


class PlanStore(StoreBase):
    def add_plan(self, values: dict[str, Any]) -> Awaitable[Plan]:
        return self._call(_inserting(Plan, values), durable=True)

    def update_plan(self, plan_id: int, values: dict[str, Any]) -> Awaitable[None]:
        return self._call(_updater(Plan, plan_id, values), durable=True)

    def plan(self, plan_id: int) -> Awaitable[Plan | None]:
        return self._call(_finding(Plan, plan_id), autocommit=True)

    def plans(self, conversation_id: int, limit: int) -> Awaitable[list[Plan]]:
        """A conversation's latest plans, newest first."""
        reading = _reading(Plan, _plans_statement(), conversation_id=conversation_id, limit=limit)
        return self._call(reading, autocommit=True)

    def close_unfinished_plans(
        self, now: datetime, place: str | None = None
    ) -> Awaitable[list[Plan]]:
        """Plans a dead process left unfinished end `interrupted` (read at start-up; or, when a
        worker takes `place` over, only that place's), a running step `stopped` with what it had
        said as its result (stored with the plan's turn) and waiting ones `not_run`; the plans as
        they now are, so their progress messages can be edited to say so. They are read back by
        (`interrupted`, `now`, the place), so a transaction replayed after its COMMIT answer was
        lost returns them too, and no other place's."""
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
                said = _said_in_last_step(connection, plan.turn_id)
                steps = [_interrupted_step(step, said) for step in plan.steps or []]
                values = {"status": "interrupted", "steps": steps, "updated_at": now}
                _updater(Plan, plan.id, values)(connection)
            return _rows(connection, Plan, closed)

        return self._call(run, durable=True)


def _interrupted_step(step: dict[str, Any], said: str) -> dict[str, Any]:
    """A plan's step as a restart leaves it: a copy, so the step list is written whole; the
    running step keeps what it had said (`said`) as its result, as a stop keeps it."""
    status = step.get("status")
    if status == "running":
        return {**step, "status": "stopped", "result": step.get("result") or said}
    return {**step, "status": _INTERRUPTED_STEPS.get(status, status)}


def _said_in_last_step(connection: Connection, turn_id: int | None) -> str:
    """What the plan's turn said after Kaiwa's last instruction (the running step's), as the
    person saw it: its assistant texts, joined as the reply joins them."""
    if turn_id is None:
        return ""
    said: list[str] = []
    for role, text, author in connection.execute(_turn_messages_statement(), {"id": turn_id}):
        if author == INSTRUCTION_AUTHOR:
            said = []
        elif role == "assistant" and text:
            said.append(text)
    return "\n\n".join(said).strip()


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
def _turn_messages_statement() -> Executable:
    table = Message.__table__  # type: ignore[attr-defined]
    columns = (table.c.role, table.c.text, table.c.author)
    return select(*columns).where(table.c.turn_id == bindparam("id")).order_by(table.c.seq)
