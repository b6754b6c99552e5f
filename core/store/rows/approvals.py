"""Approvals: the questions a tool call waits on until a person answers `/approve` or `/deny`,
and the tools a person allowed for the rest of a conversation (grants).

An approval is settled only while it is `pending` (`decide_approval`), so the first answer wins,
also across processes, and a decision replayed after its COMMIT answer was lost knows its own
(by its token); the questions a dead process left are read back, everywhere or in one place, to
be closed. A grant belongs to the conversation active in its place, one row per tool (a second
"Allow here" changes nothing, and a replayed insert finds its row); a replayed revocation counts
what its first run ended. Writes are durable: a waiting call must learn its answer, and a
person's grant or revocation must hold after a restart.
"""

from collections.abc import Awaitable
from typing import Any

from sqlalchemy import Connection, delete, select, update

from core.store.base import StoreBase
from core.store.rows.conversations import _active_conversation
from core.store.tables import Approval, Conversation, ToolGrant
from core.store.units import (
    _changes_one,
    _counting,
    _finding,
    _fit,
    _inserting,
    _reading,
    _updater,
    _with_token,
)


class ApprovalStore(StoreBase):
    def add_approval(self, values: dict[str, Any]) -> Awaitable[Approval]:
        return self._call(_inserting(Approval, values), durable=True)

    def update_approval(self, approval_id: int, values: dict[str, Any]) -> Awaitable[None]:
        return self._call(_updater(Approval, approval_id, values), durable=True)

    def decide_approval(self, approval_id: int, values: dict[str, Any]) -> Awaitable[bool]:
        """Settle a pending approval; False when it was settled already (the first answer
        wins, also across processes). The decision writes a token of its own, so a replay of
        it (its COMMIT landed, the answer was lost) finds its own decision and still wins."""
        table = Approval.__table__  # type: ignore[attr-defined]
        decision = _with_token(Approval, values)
        statement = (
            update(table)
            .where(
                table.c.id == approval_id,
                (table.c.status == "pending") | (table.c.token == decision["token"]),
            )
            .values(**decision)
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

    def add_grant(self, place: str, values: dict[str, Any]) -> Awaitable[None]:
        """Let a tool run without asking in the conversation active in `place` (`tool`,
        `granted_by`, `approval_id`, `created_at`); a tool granted there already stays as it
        was, and without an active conversation nothing is granted."""
        grants = ToolGrant.__table__  # type: ignore[attr-defined]
        fitted = _fit(ToolGrant, values)

        def run(connection: Connection) -> None:
            conversation = _active_conversation(connection, place)
            if conversation is None:
                return
            there = select(grants.c.id).where(
                grants.c.conversation_id == conversation.id, grants.c.tool == fitted["tool"]
            )
            if connection.execute(there).first() is None:
                connection.execute(
                    grants.insert().values(conversation_id=conversation.id, **fitted)
                )

        return self._call(run, durable=True)

    def grants(self, place: str) -> Awaitable[list[ToolGrant]]:
        """The tools allowed without asking in the conversation active in `place`, oldest
        first."""
        grants = ToolGrant.__table__  # type: ignore[attr-defined]
        statement = (
            select(grants)
            .where(grants.c.conversation_id.in_(_active_conversation_ids(place)))
            .order_by(grants.c.id)
        )
        return self._call(_reading(ToolGrant, statement), autocommit=True)

    def revoke_grants(self, place: str, tool: str | None = None) -> Awaitable[int]:
        """End the grant of `tool` (every grant when None) in the conversation active in
        `place`; how many ended (a replay after a lost COMMIT answer counts those its first run
        ended)."""
        grants = ToolGrant.__table__  # type: ignore[attr-defined]
        statement = delete(grants).where(
            grants.c.conversation_id.in_(_active_conversation_ids(place))
        )
        if tool is not None:
            statement = statement.where(grants.c.tool == tool)
        return self._call(_counting(statement), durable=True)


def _active_conversation_ids(place: str) -> Any:
    conversations = Conversation.__table__  # type: ignore[attr-defined]
    return select(conversations.c.id).where(
        conversations.c.place == place, conversations.c.closed_at.is_(None)
    )
