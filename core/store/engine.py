"""Opening the database: the engine for a URL, ready (its schema created or migrated) before any
database thread uses it.

This runs once, at start-up, and is the one place where opening's failures (a URL that cannot be
parsed, a backend Kaiwa does not store in, a database it cannot reach or migrate) become a
`StoreError` that names the fix, so it stands apart from the calls the store runs afterwards.
SQLite's connections get their pragmas here (WAL, `[storage].sqlite_synchronous`, a busy timeout,
foreign keys); PostgreSQL's pool holds one connection per database thread. The engine never logs
statement parameters, so a person's text cannot reach the log through an error.

The schema is created and upgraded by the Alembic migrations in `core/store/migrations`
(`core.store.schema`).
"""

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import configure_mappers

from core.errors import StoreError
from core.store.schema import ensure_schema

BACKENDS = ("sqlite", "postgresql")


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


async def open_engine(url: str, settings: StoreSettings) -> Engine:
    """The engine for the database at `url`, its schema created or migrated; a `StoreError`
    names the fix."""
    engine = _engine_for(url, settings)
    try:
        await asyncio.to_thread(ensure_schema, engine)
    except (SQLAlchemyError, OSError) as exc:
        engine.dispose()
        raise StoreError(
            f"cannot open the database {_shown(url)}: {_first_line(exc)}; check that it is "
            "reachable and that [storage].database_url_env names the right variable"
        ) from exc
    configure_mappers()  # `model_construct` skips the call that would otherwise do it
    return engine


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


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(unparseable URL)"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
