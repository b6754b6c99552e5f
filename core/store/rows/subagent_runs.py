"""Sub-agent runs and their transcripts: one row per run, its messages appended as it goes.

A run belongs to a conversation (its key `a<n>` counts that conversation's runs), and its writes
are queued under a key of their own (`-run_id`, never a turn's id), so its steps land in the
order they were taken. Replayed after a lost COMMIT answer, `start_runs` finds the runs it
stored by their token (rather than counting them as earlier ones and storing more), and a
transcript's rows are appended once each, by (run, seq). Recovery reads the runs a dead process
left, and the reports never delivered, each with its conversation's place
(`_runs_with_places`), everywhere or in one place.
"""

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, case, func, select

from core.agent.messages import UsageTotals
from core.store.base import StoreBase
from core.store.dbthread import Unit
from core.store.rows.conversations import _conversations_in, _place_statement
from core.store.tables import SubagentMessage, SubagentRun, utc_now
from core.store.units import (
    _dialect_insert,
    _fit,
    _insert_statement,
    _new_token,
    _of_conversation,
    _reading,
    _rows,
    _updater,
    _usage_values,
)


@dataclass(frozen=True)
class RunStart:
    """A sub-agent run to store."""

    name: str
    profile: str
    model: str
    task: str
    tier: str = ""
    """The tier routing chose, and why (`route`); '' when it runs its profile's model."""
    route: str = ""


class SubagentRunStore(StoreBase):
    def start_runs(
        self,
        conversation_id: int,
        parent_turn_id: int | None,
        runs: Sequence[RunStart],
        parent_run_id: int | None = None,
        *,
        max_total: int | None = None,
    ) -> Awaitable[list[tuple[int, str]]]:
        """Store new runs of a conversation, keyed `a<n>` after every run it ever had (keys are
        never reused); their row ids and keys, in order. One transaction, which stores none
        (and returns []) if the conversation would have more than `max_total` runs: the count
        and the new rows are one decision. The runs carry a token made here, so a replay of
        the transaction (its COMMIT landed, the answer was lost) answers the runs it stored
        instead of storing more."""
        now = utc_now()
        token = _new_token()
        mine = {"id": conversation_id, "token": token}

        def run(connection: Connection) -> list[tuple[int, str]]:
            count, ours = connection.execute(_runs_so_far_statement(), mine).one()
            if ours:  # stored by this call, committed before its answer was lost
                return [(int(row_id), name) for row_id, name in connection.execute(_ours(), mine)]
            if max_total is not None and count + len(runs) > max_total:
                return []
            started = []
            for number, spec in enumerate(runs, start=count + 1):
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
                        "tier": spec.tier or None,
                        "route": spec.route or None,
                        "task": spec.task,
                        "status": "running",
                        "delivery": "pending",
                        "unread": 0,
                        "started_at": now,
                        "token": token,
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
        row, in one transaction. A message whose (run, seq) is stored already is kept as it is:
        a replay of this call (its COMMIT landed, the answer was lost) appends nothing twice."""
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

        append = _append_statement(self._dialect)

        def run(connection: Connection) -> None:
            if rows:
                connection.execute(append, rows)
            if changes:
                _updater(SubagentRun, run_id, changes)(connection)

        return self._call(run, key=-run_id, durable=durable)

    def run_count(self, conversation_id: int) -> Awaitable[int]:
        """How many runs the conversation ever had, in any state and in any process."""

        def run(connection: Connection) -> int:
            count = connection.execute(_run_count_statement(), {"id": conversation_id}).scalar()
            return int(count or 0)

        return self._call(run, autocommit=True)

    def runs(self, conversation_id: int) -> Awaitable[list[SubagentRun]]:
        return self._call(_of_conversation(SubagentRun, conversation_id), autocommit=True)

    def transcript(self, run_id: int) -> Awaitable[list[SubagentMessage]]:
        reading = _reading(SubagentMessage, _transcript_statement(), run_id=run_id)
        return self._call(reading, autocommit=True)

    def set_delivery(self, run_ids: Sequence[int], delivery: str) -> Awaitable[None]:
        return self._call(_runs_updater(run_ids, {"delivery": delivery}), durable=True)

    def live_runs(self, place: str | None = None) -> Awaitable[list[tuple[str, SubagentRun]]]:
        """Runs still `running` (read at start-up, or when a worker takes `place` over: a dead
        process's), each with its place."""
        return self._runs_with_places(_live_runs_statement(), place)

    def undelivered_reports(
        self, place: str | None = None
    ) -> Awaitable[list[tuple[str, SubagentRun]]]:
        """Finished runs whose reports never reached their conversation, with its place."""
        return self._runs_with_places(_undelivered_statement(), place)

    def mark_run_lost(self, run_id: int, report: str, *, deliver: bool) -> Awaitable[None]:
        """A run a dead process left running: `lost`, with what it had written as its report,
        to be carried to its conversation (`deliver`) or not (a nested run's parent is lost
        with it)."""
        values = {
            "status": "lost",
            "report": report,
            "delivery": "pending" if deliver else "discarded",
            "ended_at": utc_now(),
        }
        return self._call(_updater(SubagentRun, run_id, values), key=-run_id, durable=True)

    def _runs_with_places(
        self, statement: Any, place: str | None
    ) -> Awaitable[list[tuple[str, SubagentRun]]]:
        if place is not None:
            runs = SubagentRun.__table__  # type: ignore[attr-defined]
            statement = statement.where(runs.c.conversation_id.in_(_conversations_in(place)))

        def run(connection: Connection) -> list[tuple[str, SubagentRun]]:
            found = []
            for row in _rows(connection, SubagentRun, statement):
                where = connection.execute(_place_statement(), {"id": row.conversation_id})
                found.append((str(where.scalar_one()), row))
            return found

        return self._call(run, autocommit=True)


def _runs_updater(run_ids: Sequence[int], values: dict[str, Any]) -> Unit[None]:
    """The same `values` written to each of the runs `run_ids`."""

    def run(connection: Connection) -> None:
        for run_id in run_ids:
            _updater(SubagentRun, run_id, values)(connection)

    return run


@cache
def _run_count_statement() -> Executable:
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    return select(func.count()).where(table.c.conversation_id == bindparam("id"))


@cache
def _runs_so_far_statement() -> Executable:
    """How many runs a conversation has had, and how many of them carry `token`."""
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    ours = func.count(case((table.c.token == bindparam("token"), 1)))
    return select(func.count(), ours).where(table.c.conversation_id == bindparam("id"))


@cache
def _ours() -> Executable:
    """The ids and keys of a conversation's runs that carry `token`, in order."""
    table = SubagentRun.__table__  # type: ignore[attr-defined]
    return (
        select(table.c.id, table.c.key)
        .where(table.c.conversation_id == bindparam("id"), table.c.token == bindparam("token"))
        .order_by(table.c.id)
    )


@cache
def _append_statement(dialect: str) -> Executable:
    """Transcript rows, each unless its (run, seq) is stored already."""
    table = SubagentMessage.__table__  # type: ignore[attr-defined]
    return _dialect_insert(dialect)(table).on_conflict_do_nothing(index_elements=["run_id", "seq"])


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
