"""The shapes of work every kind of row's methods are built from: units and shared statements.

A store method builds a unit (`core.store.dbthread.Unit`: statements run on one connection) and
queues it through `_call` (`core.store.base`). Most units are one of a few shapes: insert a row
and read it back, find one by id, update one by id, read what a statement selects, a conditional
write that tells whether it won, a write that counts what it changed. Those shapes live here
once, keyed by model, so each kind's module (`inbox`, `turns`, `plans`, ...) holds only what is
its own. The names keep their leading underscore: they belong to the package, imported by its
modules and by nothing outside it.

Every unit may run twice: a transaction whose COMMIT answer is lost with the connection is run
again (`core.store.dbthread`), so each shape stays true under that replay. An update by id
writes values made before it was queued; an insert carries a token made then too (`_new_token`)
and finds its own row by it (`_inserting`); a count keeps the most any run counted (`_counting`).

No input can fail a record: every text written is cleaned first (`core.text.clean`: characters
that cannot be encoded become U+FFFD; NUL, which PostgreSQL refuses in text, is dropped) and cut
to its column's length (`_fit`).

Statements are SQLAlchemy Core built once (each `@cache`d per model and backend, here and in the
kinds' modules: SQLAlchemy then skips rebuilding them), and rows come back as SQLModel objects
built with `model_construct` (the rows come from our own schema; validating them again costs
37 µs a row).
"""

import uuid
from functools import cache
from typing import Any, TypeVar

from sqlalchemy import Connection, Executable, bindparam, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import SQLModel

from core.agent.messages import UsageTotals
from core.store.dbthread import Unit
from core.text import clean_all

Row = TypeVar("Row", bound=SQLModel)


def _rows(
    connection: Connection, model: type[Row], statement: Executable, **parameters: Any
) -> list[Row]:
    return [
        model.model_construct(**row._mapping) for row in connection.execute(statement, parameters)
    ]


def _reading(model: type[Row], statement: Executable, **parameters: Any) -> Unit[list[Row]]:
    """The rows of `model` that `statement` selects, in its order."""
    return lambda connection: _rows(connection, model, statement, **parameters)


def _of_conversation(model: type[Row], conversation_id: int) -> Unit[list[Row]]:
    """Every row of `model` that belongs to a conversation, oldest first."""
    statement = _of_conversation_statement(model)
    return _reading(model, statement, conversation_id=conversation_id)


def _inserting(model: type[Row], values: dict[str, Any]) -> Unit[Row]:
    """A new row of `model`, as stored (its id and defaults filled in), written once however
    often the unit runs: the row carries a token made now, before the unit is queued, and a run
    that finds it taken (a replay: the first run's COMMIT landed) reads that row back."""
    fitted = _with_token(model, values)

    def run(connection: Connection) -> Row:
        insert_once = _insert_once_statement(connection.dialect.name, model, whole=True)
        row = connection.execute(insert_once, fitted).first()
        if row is None:  # our own row, committed before its answer was lost
            mark = {"token": fitted["token"]}
            row = connection.execute(_by_token_statement(model), mark).one()
        return model.model_construct(**row._mapping)

    return run


def _with_token(model: type[SQLModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` fitted to `model`, with a new token (the write's own mark, `_new_token`)."""
    return _fit(model, values) | {"token": _new_token()}


def _new_token() -> str:
    """A mark for one write, made before its unit is queued, so every run of the unit carries
    the same one and a replay can tell its own rows from anyone else's."""
    return uuid.uuid4().hex


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


def _changes_one(statement: Executable) -> Unit[bool]:
    """True when `statement` (a conditional write) changed exactly one row: it won."""
    return lambda connection: connection.execute(statement).rowcount == 1


def _counting(statement: Executable) -> Unit[int]:
    """How many rows `statement` changed, for a write that stops matching the rows it changed
    (a delete; an update away from what it selects), so a replay of its unit (the first run's
    COMMIT landed, its answer was lost) finds nothing left to change: the unit answers the most
    any of its runs changed. Had the first run not committed after all, the replay changes them
    itself; either way they are changed."""
    most = 0

    def run(connection: Connection) -> int:
        nonlocal most
        most = max(most, connection.execute(statement).rowcount)
        return most

    return run


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
def _insert_once_statement(dialect: str, model: type[SQLModel], *, whole: bool) -> Executable:
    """Insert a row of `model` unless one with its token exists; the new row (`whole`) or its
    id, or nothing when the token was there (a replay of the write that put it there)."""
    table = model.__table__  # type: ignore[attr-defined]
    returned = table.c if whole else (table.c.id,)
    return (
        _dialect_insert(dialect)(table)
        .on_conflict_do_nothing(index_elements=["token"])
        .returning(*returned)
    )


@cache
def _by_token_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.token == bindparam("token"))


@cache
def _insert_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return insert(table).returning(table.c.id)


@cache
def _update_statement(model: type[SQLModel]) -> Executable:
    table = model.__table__  # type: ignore[attr-defined]
    return update(table).where(table.c.id == bindparam("row_id"))


@cache
def _insert_if_new_statement(
    dialect: str, model: type[SQLModel], unique: tuple[str, ...]
) -> Executable:
    """Insert a row of `model` unless one with the same `unique` columns exists; the new row's
    id, or nothing when it existed."""
    table = model.__table__  # type: ignore[attr-defined]
    return (
        _dialect_insert(dialect)(table)
        .on_conflict_do_nothing(index_elements=list(unique))
        .returning(table.c.id)
    )


def _dialect_insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert
