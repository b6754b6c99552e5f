"""What the store is below its kinds of rows: its engine, its database threads, its dialect, and
`_call`, the one way any of its methods reaches the database.

Every call is queued on a database thread (`core.store.dbthread`) the moment it is made and returns
an awaitable of its result. So the event loop never waits on a round trip, and calls made one after
another land in that order even when the caller awaits none of them until later. The turn path
relies on both: the agent loop's sink queues each record as it happens (no stop can lose it) and
awaits them before whatever must come after them (a frame shown, the closing notice).

SQLite is the embedded default (WAL, `[storage].sqlite_synchronous`, a busy timeout) and gets one
thread, since SQLite has one writer at a time. PostgreSQL gets `[storage].connections` threads;
a turn's own writes all go to one of them (keyed by the turn), so they stay in order.

Each kind of row's methods are a class of their own deriving from `StoreBase` (a mixin of
`core.store.store.Store`): deriving, rather than assuming what the combined class will have,
lets each kind's module be read and type-checked alone. They share nothing but what is here,
the units of `core.store.units`, and the few helpers one kind lends another (a conversation's
place, a compaction's row, a turn's delivery states).
"""

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Self, TypeVar

from sqlalchemy import Connection, Engine

from core.store.dbthread import DatabaseThread, OutageLog, Unit
from core.store.engine import StoreSettings, open_engine
from core.store.outage import PROBE, WriteOutage

logger = logging.getLogger(__package__)  # the package's: its lines read `core.store: ...`

T = TypeVar("T")


class StoreBase:
    def __init__(
        self,
        engine: Engine,
        threads: list[DatabaseThread],
        settings: StoreSettings,
        writes: WriteOutage,
    ) -> None:
        self._engine = engine
        self._shown = engine.url.render_as_string(hide_password=True)
        self._threads = threads
        self._dialect = engine.dialect.name
        self._single_statements = self._dialect == "postgresql"
        """The units of `core.store.units` that are one statement on PostgreSQL are several
        elsewhere: pass this as `_call`'s `autocommit` for them."""
        self.settings = settings
        self.writes = writes
        """Whether the database refuses writes now, since when and why (`core.store.outage`)."""

    @classmethod
    async def open(cls, url: str, settings: StoreSettings | None = None) -> Self:
        """Open (and create or migrate) the database at `url`; a `StoreError` names the fix."""
        settings = settings or StoreSettings()
        engine = await open_engine(url, settings)
        count = 1 if engine.dialect.name == "sqlite" else settings.connections
        outages, writes = OutageLog(settings.write_retry_seconds), WriteOutage()
        threads = [
            DatabaseThread(
                engine,
                name=f"kaiwa-db-{index}",
                retry_seconds=settings.write_retry_seconds,
                outages=outages,
                writes=writes,
            )
            for index in range(count)
        ]
        return cls(engine, threads, settings, writes)

    async def close(self) -> None:
        """Let every queued call run (a lost connection is retried for a short grace), then
        close the connections."""
        grace = self.settings.close_grace_seconds
        await asyncio.gather(*(thread.close(grace) for thread in self._threads))
        self._engine.dispose()

    def describe(self) -> Awaitable[str]:
        """What the store is, for the log: the backend, where, and how it keeps commits."""
        if self._dialect != "sqlite":
            connections = len(self._threads)
            return self._call(lambda _: f"PostgreSQL {self._shown} ({connections} connections)")

        def run(connection: Connection) -> str:
            journal = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
            level = connection.exec_driver_sql("PRAGMA synchronous").scalar()
            synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
            return f"SQLite {self._engine.url.database} ({journal}, synchronous {synchronous})"

        return self._call(run)

    def ping(self) -> Awaitable[None]:
        """A write that changes nothing, for readiness: resolves once the database takes writes
        (during an outage, only once it is back). A read would pass while another process holds
        SQLite's write lock, when no message can be recorded."""
        return self._call(lambda connection: connection.exec_driver_sql(PROBE).close())

    def _call(
        self,
        unit: Unit[T],
        *,
        key: int | None = None,
        durable: bool = False,
        autocommit: bool = False,
    ) -> "asyncio.Future[T]":
        """Queue `unit` on a database thread: the one `key` maps to (so calls with one key keep
        their order), else the least busy. `autocommit`: `unit` needs no transaction around it
        on PostgreSQL (one statement there, or reads whose consistency the caller keeps), so
        it may run without BEGIN and COMMIT; SQLite runs every unit in one."""
        if key is not None:
            thread = self._threads[key % len(self._threads)]
        else:
            thread = min(self._threads, key=lambda each: each.backlog)
        return thread.submit(unit, durable=durable, autocommit=autocommit)


def not_awaited(call: Awaitable[Any], what: str) -> None:
    """For a store call nobody waits on: a failure becomes one log line, not a lost exception."""

    def log_failure(done: "asyncio.Future[Any]") -> None:
        if not done.cancelled() and done.exception() is not None:
            logger.warning("%s failed: %s", what, done.exception())

    asyncio.ensure_future(call).add_done_callback(log_failure)
