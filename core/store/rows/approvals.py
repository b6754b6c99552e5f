"""Approvals: the questions a tool call waits on until a person answers `/approve` or `/deny`.

An approval is settled only while it is `pending` (`decide_approval`), so the first answer wins,
also across processes; the questions a dead process left are read back, everywhere or in one
place, to be closed. Writes are durable: a waiting call must learn its answer.
"""

from collections.abc import Awaitable
from typing import Any

from sqlalchemy import select, update

from core.store.base import StoreBase
from core.store.tables import Approval
from core.store.units import _changes_one, _finding, _fit, _inserting, _reading, _updater


class ApprovalStore(StoreBase):
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
        return self._call(_changes_one(statement), durable=True)

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
        return self._call(_reading(Approval, statement), autocommit=True)
