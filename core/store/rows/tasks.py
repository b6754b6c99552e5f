"""Scheduled tasks and their runs, together: a run is a task's fire slot, and claiming one writes
both rows in one transaction.

A slot runs at most once: `claim_slot` moves the task's `next_run` on only if it is still the one
expected, then inserts the run only if no run holds that (task, fire time) yet, so two schedulers
(or a restart) cannot both fire it; a claim replayed after its COMMIT answer was lost finds the
run it wrote by its token, so its run is not left `running` unowned. Every write here is
durable: a task or its run's ending must not be lost to an outage.
"""

from collections.abc import Awaitable
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, select, update

from core.store.base import StoreBase
from core.store.tables import ScheduledTask, TaskRun, utc_now
from core.store.units import (
    _counting,
    _finding,
    _insert_if_new_statement,
    _inserting,
    _reading,
    _updater,
    _with_token,
)


class TaskStore(StoreBase):
    def create_task(self, values: dict[str, Any]) -> Awaitable[ScheduledTask]:
        """Store a new task; the stored row (with its id)."""
        return self._call(_inserting(ScheduledTask, values), durable=True)

    def task(self, task_id: int) -> Awaitable[ScheduledTask | None]:
        return self._call(_finding(ScheduledTask, task_id), autocommit=True)

    def tasks(self, place: str | None = None) -> Awaitable[list[ScheduledTask]]:
        """Tasks not cancelled, oldest first: of one place, or all of them."""
        reading = _reading(ScheduledTask, _tasks_statement(place is None), place=place)
        return self._call(reading, autocommit=True)

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
        on, or the slot was claimed before a restart), and then nothing is written; but a replay
        of this claim (its COMMIT landed, the answer was lost) finds its own run by the token it
        carries, and answers its id."""
        values = _with_token(TaskRun, {"task_id": task_id, "fire_time": fire_time, **run})
        moved = _task_move_statement()
        statement = _insert_if_new_statement(self._dialect, TaskRun, ("task_id", "fire_time"))

        def claim(connection: Connection) -> int | None:
            if move is not None:
                step = {"row_id": task_id, "expected": move[0], "next_run": move[1]}
                if connection.execute(moved, step).rowcount != 1:
                    return _own_run(connection, values)
            inserted = connection.execute(statement, values).scalar()
            return _own_run(connection, values) if inserted is None else int(inserted)

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
        worker takes `place` over: then only the runs of tasks in that place); how many (a
        replay after a lost COMMIT answer counts those its first run closed)."""
        table = TaskRun.__table__  # type: ignore[attr-defined]
        statement = update(table).where(table.c.outcome == "running")
        if place is not None:
            tasks = ScheduledTask.__table__  # type: ignore[attr-defined]
            in_place = select(tasks.c.id).where(tasks.c.place == place)
            statement = statement.where(table.c.task_id.in_(in_place))
        statement = statement.values(
            outcome="interrupted", error="Kaiwa stopped during the run", finished_at=utc_now()
        )
        return self._call(_counting(statement), durable=True)

    def task_runs(self, task_id: int, limit: int = 5) -> Awaitable[list[TaskRun]]:
        """A task's latest runs, newest first."""
        reading = _reading(TaskRun, _task_runs_statement(), task_id=task_id, limit=limit)
        return self._call(reading, autocommit=True)


def _own_run(connection: Connection, values: dict[str, Any]) -> int | None:
    """The id of the slot's run if this claim (its token) wrote it, else None: it was taken."""
    mark = {name: values[name] for name in ("task_id", "fire_time", "token")}
    return connection.execute(_own_run_statement(), mark).scalar()


@cache
def _own_run_statement() -> Executable:
    table = TaskRun.__table__  # type: ignore[attr-defined]
    return select(table.c.id).where(
        table.c.task_id == bindparam("task_id"),
        table.c.fire_time == bindparam("fire_time"),
        table.c.token == bindparam("token"),
    )


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
