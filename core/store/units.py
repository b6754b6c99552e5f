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

On PostgreSQL the shapes a turn's path is made of are one statement each, so their units need no
transaction, and the database thread runs them without BEGIN and COMMIT: one round trip each,
which is what a database a network hop away costs. A row inserted with the row it belongs to and
the rows written with it (`_inserting`: a turn, its new conversation, the person's message) is
one statement of data-modifying CTEs, and so are writes that need none of each other's results
(`_writing`: a turn's messages, a compaction, its state). SQLite has no data-modifying CTEs:
there the same shapes run statement by statement, in the unit's transaction.

No input can fail a record: every text written is cleaned first (`core.text.clean`: characters
that cannot be encoded become U+FFFD; NUL, which PostgreSQL refuses in text, is dropped) and cut
to its column's length (`_fit`).

Statements are SQLAlchemy Core built once (each `@cache`d per model and backend, here and in the
kinds' modules: SQLAlchemy then skips rebuilding them and caches their compiled form, which it
does for none of several VALUES rows, hence `_upsert_statement`'s SELECTs), and rows come back
as SQLModel objects built with `model_construct` (the rows come from our own schema; validating
them again costs 37 µs a row).
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Executable,
    Table,
    bindparam,
    cast,
    insert,
    literal,
    select,
    union_all,
    update,
)
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


@dataclass(frozen=True)
class _Under:
    """The row a new row belongs to, opened with it (`_inserting`): inserted once by a token of
    its own, its id filling the new row's `column`."""

    model: type[SQLModel]
    values: dict[str, Any]
    column: str


@dataclass(frozen=True)
class _With:
    """A row written with a new one (`_inserting`), and only with it, filling each of its
    columns `takes` names from the new row's: (its column, the new row's column)."""

    model: type[SQLModel]
    values: dict[str, Any]
    takes: tuple[tuple[str, str], ...]


def _inserting(
    model: type[Row],
    values: dict[str, Any],
    *,
    under: _Under | None = None,
    together: Sequence[_With] = (),
) -> Unit[Row]:
    """A new row of `model`, as stored (its id and defaults filled in), written once however
    often the unit runs: the row carries a token made now, before the unit is queued, and a run
    that finds it taken (a replay: the first run's COMMIT landed) reads that row back. `under`:
    the row it belongs to, opened first the same way; `together`: rows written with it, so a
    replay finds them written too. On PostgreSQL all of it is one statement
    (`_inserting_statement`): the unit needs no transaction there."""
    row = _with_token(model, values)
    parent = (
        None if under is None else replace(under, values=_with_token(under.model, under.values))
    )
    children = [replace(child, values=_fit(child.model, child.values)) for child in together]

    def run(connection: Connection) -> Row:
        if connection.dialect.name == "postgresql":
            return _inserted_at_once(connection, model, row, parent, children)
        return _inserted_one_by_one(connection, model, row, parent, children)

    return run


def _inserted_at_once(
    connection: Connection,
    model: type[Row],
    row: dict[str, Any],
    parent: _Under | None,
    children: Sequence[_With],
) -> Row:
    under = None if parent is None else (parent.model, tuple(parent.values), parent.column)
    shapes = tuple((child.model, tuple(child.values), child.takes) for child in children)
    statement = _inserting_statement(model, tuple(row), under, shapes)
    parameters = _named(_table(model).name, row)
    if parent is not None:
        parameters |= _named(_table(parent.model).name, parent.values)
    for index, child in enumerate(children):
        parameters |= _named(f"{_table(child.model).name}{index}", child.values)
    stored = connection.execute(statement, parameters).one()
    return model.model_construct(**stored._mapping)


def _inserted_one_by_one(
    connection: Connection,
    model: type[Row],
    row: dict[str, Any],
    parent: _Under | None,
    children: Sequence[_With],
) -> Row:
    if parent is not None:
        opened, _ = _inserted_once(connection, parent.model, parent.values)
        row = row | {parent.column: opened["id"]}
    stored, new = _inserted_once(connection, model, row)
    if new:  # else a replay found it, and the rows written with it
        for child in children:
            taken = {column: stored[source] for column, source in child.takes}
            connection.execute(insert(_table(child.model)), child.values | taken)
    return model.model_construct(**stored)


def _inserted_once(
    connection: Connection, model: type[SQLModel], row: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """`row` as stored, and whether this run wrote it (else a replay found it by its token)."""
    name = _table(model).name
    insert_once = _insert_once_statement(connection.dialect.name, model, tuple(row), "row")
    stored = connection.execute(insert_once, _named(name, row)).first()
    if stored is not None:
        return dict(stored._mapping), True
    mark = {f"{name}_token": row["token"]}
    return dict(connection.execute(_by_token_statement(model), mark).one()._mapping), False


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


@dataclass(frozen=True)
class _Write:
    """One write of a unit: a statement built once, its parameters named after the table it
    writes (`_named`), so that writes combined into one statement (`_writing`) never share a
    parameter's name; or a list of them, for a statement run once per row (not on PostgreSQL)."""

    statement: Executable
    parameters: dict[str, Any] | list[dict[str, Any]]


def _writing(writes: Sequence[_Write]) -> Unit[None]:
    """Writes that need none of each other's results, each to a table of its own, as one unit.
    On PostgreSQL that is one statement, every write but the last a data-modifying CTE of the
    last (`_combined_statement`; PostgreSQL runs each exactly once), so the unit needs no
    transaction there; elsewhere they run one after another in the unit's transaction."""
    statements = tuple(write.statement for write in writes)

    def run(connection: Connection) -> None:
        if connection.dialect.name == "postgresql" and writes:
            connection.execute(_combined_statement(statements), _merged(writes))
            return
        for write in writes:
            connection.execute(write.statement, write.parameters)

    return run


def _merged(writes: Sequence[_Write]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for write in writes:
        assert isinstance(write.parameters, dict), "PostgreSQL's writes name their parameters"
        if merged.keys() & write.parameters.keys():
            raise ValueError("writes combined into one statement must write tables of their own")
        merged |= write.parameters
    return merged


def _update_write(model: type[SQLModel], row_id: int, values: dict[str, Any]) -> _Write:
    """Set `values` (fitted here) on the row of `model` with `row_id`."""
    fitted = _fit(model, values)
    name = _table(model).name
    statement = _update_statement(model, tuple(fitted))
    return _Write(statement, _named(name, fitted) | {f"{name}_id": row_id})


def _insert_once_write(dialect: str, model: type[SQLModel], row: dict[str, Any]) -> _Write:
    """Insert `row` (fitted, with its token: `_with_token`) unless its token is stored already
    (a replay of the unit that wrote it)."""
    statement = _insert_once_statement(dialect, model, tuple(row), "nothing")
    return _Write(statement, _named(_table(model).name, row))


def _upsert_write(
    dialect: str,
    model: type[SQLModel],
    rows: Sequence[dict[str, Any]],
    unique: tuple[str, ...],
    changing: tuple[str, ...],
) -> _Write:
    """Insert `rows` (fitted, each with the same columns), or where a row with the same `unique`
    columns exists, set its `changing` columns to the new row's: one statement however many.
    On PostgreSQL the rows are a SELECT of parameters (`_upsert_statement`), so the write can
    join others in one statement; elsewhere the statement runs once per row (`executemany`)."""
    if dialect != "postgresql":
        return _Write(_upsert_each_statement(dialect, model, unique, changing), list(rows))
    name = _table(model).name
    statement = _upsert_statement(model, tuple(rows[0]), len(rows), unique, changing)
    parameters = {}
    for index, row in enumerate(rows):
        parameters |= _named(f"{name}{index}", row)
    return _Write(statement, parameters)


def _updater(model: type[SQLModel], row_id: int, values: dict[str, Any]) -> Unit[None]:
    return _writing([_update_write(model, row_id, values)])


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
# A statement that names its parameters names them after its table (`_named`): `turns_status`.


def _table(model: type[SQLModel]) -> Table:
    return model.__table__  # type: ignore[attr-defined,no-any-return]


def _named(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}_{name}": value for name, value in values.items()}


def _bound(table: Table, prefix: str, columns: Sequence[str]) -> dict[str, Any]:
    """A parameter for each of `columns`, named `prefix_column`, of its column's type."""
    return {name: bindparam(f"{prefix}_{name}", type_=table.c[name].type) for name in columns}


def _inserted(
    table: Table, prefix: str, columns: Sequence[str], taken: Sequence[str] = ()
) -> dict[str, Any]:
    """What a row inserted into `table` holds: the parameters of `columns` (`_bound`), and
    the default of every other column that has one, but those `taken` from another row. Written
    out, since SQLAlchemy fills in its defaults only for an INSERT on its own, not for one
    inside a CTE."""
    given = {*columns, *taken}
    defaults = {
        column.name: literal(column.default.arg, column.type)
        for column in table.columns
        if column.name not in given and column.default is not None and column.default.is_scalar
    }
    return _bound(table, prefix, columns) | defaults


def _selected(
    table: Table, prefix: str, columns: Sequence[str], taken: Sequence[str]
) -> dict[str, Any]:
    """`_inserted` as the values a SELECT gives an INSERT: cast to their columns' types,
    which PostgreSQL cannot infer there (in VALUES it takes them from the columns)."""
    return {
        name: cast(value, table.c[name].type)
        for name, value in _inserted(table, prefix, columns, taken).items()
    }


@cache
def _of_conversation_statement(model: type[SQLModel]) -> Executable:
    table = _table(model)
    return (
        select(table)
        .where(table.c.conversation_id == bindparam("conversation_id"))
        .order_by(table.c.id)
    )


@cache
def _by_id_statement(model: type[SQLModel]) -> Executable:
    table = _table(model)
    return select(table).where(table.c.id == bindparam("row_id"))


@cache
def _by_token_statement(model: type[SQLModel]) -> Executable:
    table = _table(model)
    return select(table).where(table.c.token == bindparam(f"{table.name}_token"))


@cache
def _insert_once_statement(
    dialect: str, model: type[SQLModel], columns: tuple[str, ...], returning: str
) -> Any:
    """Insert a row of `model` (`columns`) unless one with its token exists, `returning` the
    new row (`row`), its `id`, or `nothing`; nothing comes back when the token was there (a
    replay of the write that put it there)."""
    table = _table(model)
    statement = (
        _dialect_insert(dialect)(table)
        .values(_inserted(table, table.name, columns))
        .on_conflict_do_nothing(index_elements=["token"])
    )
    returned = {"row": tuple(table.c), "id": (table.c.id,), "nothing": ()}[returning]
    return statement.returning(*returned) if returned else statement


@lru_cache(maxsize=64)
def _inserting_statement(
    model: type[SQLModel],
    columns: tuple[str, ...],
    under: tuple[type[SQLModel], tuple[str, ...], str] | None,
    together: tuple[tuple[type[SQLModel], tuple[str, ...], tuple[tuple[str, str], ...]], ...],
) -> Executable:
    """`_inserting` on PostgreSQL, as one statement of data-modifying CTEs: the row it belongs
    to inserted once (`under`: its model, columns and the new row's column its id fills) or
    found by its token; the row inserted once; the rows written `together` with it inserted
    from what that insert returned, so nothing when it returned nothing. It answers the new row,
    or the one found by its token (a replay). Every CTE sees the database as it was when the
    statement began: a row found by its token is one an earlier run committed."""
    table = _table(model)
    if under is None:
        new = _insert_once_statement("postgresql", model, columns, "row")
    else:
        parent_model, parent_columns, column = under
        parent = _table(parent_model)
        opened = _insert_once_statement("postgresql", parent_model, parent_columns, "id")
        opened_cte = opened.cte(f"new_{parent.name}")
        found = select(parent.c.id).where(parent.c.token == bindparam(f"{parent.name}_token"))
        owner = select(opened_cte.c.id).union_all(found).cte(f"{parent.name}_row")
        values = _selected(table, table.name, columns, (column,))
        rows = select(owner.c.id, *values.values())
        new = (
            postgresql.insert(table)
            .from_select([column, *values], rows)
            .on_conflict_do_nothing(index_elements=["token"])
            .returning(*table.c)
        )
    inserted = new.cte(f"new_{table.name}")
    writes = []
    for index, (child_model, child_columns, takes) in enumerate(together):
        child = _table(child_model)
        taken = {column: inserted.c[source] for column, source in takes}
        values = taken | _selected(child, f"{child.name}{index}", child_columns, tuple(taken))
        rows = select(*values.values())
        insert_rows = postgresql.insert(child).from_select(list(values), rows)
        writes.append(insert_rows.cte(f"new_{child.name}{index}"))
    return select(inserted).union_all(_by_token_statement(model)).add_cte(*writes)


@lru_cache(maxsize=64)
def _combined_statement(statements: tuple[Any, ...]) -> Executable:
    """`statements` as one, on PostgreSQL: every one but the last a CTE of the last."""
    *before, last = statements
    if not before:
        return last
    return last.add_cte(*(each.cte(f"write_{index}") for index, each in enumerate(before)))


@cache
def _update_statement(model: type[SQLModel], columns: tuple[str, ...]) -> Executable:
    table = _table(model)
    return (
        update(table)
        .where(table.c.id == bindparam(f"{table.name}_id"))
        .values(_bound(table, table.name, columns))
    )


@lru_cache(maxsize=64)
def _upsert_statement(
    model: type[SQLModel],
    columns: tuple[str, ...],
    count: int,
    unique: tuple[str, ...],
    changing: tuple[str, ...],
) -> Executable:
    """`_upsert_write` on PostgreSQL: `count` rows, each a SELECT of parameters (SQLAlchemy
    caches no INSERT of several VALUES rows, and compiling one costs a millisecond)."""
    table = _table(model)
    rows = [_selected(table, f"{table.name}{index}", columns, ()) for index in range(count)]
    selects = [select(*row.values()) for row in rows]
    statement = postgresql.insert(table).from_select(
        list(rows[0]), selects[0] if count == 1 else union_all(*selects)
    )
    return _on_conflict_set(statement, unique, changing)


@cache
def _upsert_each_statement(
    dialect: str, model: type[SQLModel], unique: tuple[str, ...], changing: tuple[str, ...]
) -> Executable:
    """`_upsert_write` as one row's statement, run for each (`executemany`)."""
    return _on_conflict_set(_dialect_insert(dialect)(_table(model)), unique, changing)


def _on_conflict_set(statement: Any, unique: tuple[str, ...], changing: tuple[str, ...]) -> Any:
    return statement.on_conflict_do_update(
        index_elements=list(unique),
        set_={name: statement.excluded[name] for name in changing},
    )


@cache
def _insert_statement(model: type[SQLModel]) -> Executable:
    table = _table(model)
    return insert(table).returning(table.c.id)


@cache
def _insert_if_new_statement(
    dialect: str, model: type[SQLModel], unique: tuple[str, ...]
) -> Executable:
    """Insert a row of `model` unless one with the same `unique` columns exists; the new row's
    id, or nothing when it existed."""
    table = _table(model)
    return (
        _dialect_insert(dialect)(table)
        .on_conflict_do_nothing(index_elements=list(unique))
        .returning(table.c.id)
    )


def _dialect_insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert
