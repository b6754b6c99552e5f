"""Compactions: the summaries that stand for a conversation's older messages in what the model is
sent.

A compaction is made inside a turn (stored in that turn's own transaction, `record_turn`) or on
its own (`/compact`, `record_compaction`); both write the same row, so it is built and written
here once (`_compaction_row`, `_compaction_write`). The row is built before its unit is queued,
with a token, so a transaction replayed after its COMMIT answer was lost writes it once. Reading
a conversation (`conversation_of`) starts from the latest one (`_latest_compaction_statement`).
"""

from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy import Executable, bindparam, select

from core.agent.messages import UsageTotals
from core.store.base import StoreBase
from core.store.tables import Compaction, utc_now
from core.store.units import (
    _insert_once_write,
    _of_conversation,
    _usage_values,
    _with_token,
    _Write,
    _writing,
)


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


class CompactionStore(StoreBase):
    def record_compaction(
        self, conversation_id: int, compaction: CompactionRecord
    ) -> Awaitable[None]:
        """Store a compaction made outside any turn (`/compact`)."""
        row = _compaction_row(conversation_id, None, compaction)
        return self._call(_writing([_compaction_write(self._dialect, row)]), autocommit=True)

    def compactions(self, conversation_id: int) -> Awaitable[list[Compaction]]:
        return self._call(_of_conversation(Compaction, conversation_id), autocommit=True)


def _compaction_row(
    conversation_id: int, turn_id: int | None, compaction: CompactionRecord
) -> dict[str, Any]:
    first_kept_turn = compaction.first_kept_turn_id
    return _with_token(
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


def _compaction_write(dialect: str, row: dict[str, Any]) -> _Write:
    """Write `row` (`_compaction_row`) unless its token is stored already: a replay of the
    unit that wrote it."""
    return _insert_once_write(dialect, Compaction, row)


@cache
def _latest_compaction_statement() -> Executable:
    table = Compaction.__table__  # type: ignore[attr-defined]
    return (
        select(table)
        .where(table.c.conversation_id == bindparam("id"))
        .order_by(table.c.id.desc())
        .limit(1)
    )
