"""One database connection on a thread of its own: where every store call actually runs.

Policy, and why:
- **The event loop never waits on the database.** A call is queued and returns a future at once;
  the thread runs it and resolves the future with `call_soon_threadsafe`. (SQLAlchemy's asyncio
  extension would also keep the loop free, but it costs greenlet switches on the loop for every
  statement, and aiosqlite adds a thread hop per statement anyway.)
- **Calls run in the order they were queued.** A caller may queue several writes without
  awaiting each and still have them land in that order; a stop that cancels the caller cannot
  tear a call already queued, which runs whole or fails whole.
- **Group commit.** Whatever is queued when the thread wakes runs in one transaction: one BEGIN
  and one COMMIT for many conversations' writes, so throughput grows with load instead of
  round trips piling up. A call that fails on its own (not the connection) is isolated by
  running the group's calls again one by one, so it fails alone. A call that needs no
  transaction (one statement) runs without BEGIN and COMMIT where that saves round trips
  (PostgreSQL's autocommit): one round trip instead of three. So do two such calls queued
  together (a turn's reply and its ending): two round trips instead of four.
- **Outages are waited out.** When the connection is lost (or SQLite is locked), the group is
  rolled back, the connection re-opened and the group run again, with backoff, until each
  call's deadline (`retry_seconds` after it was queued); a call past it fails with
  `StoreUnavailable`. A *durable* call (a turn's ending, which must not stay `running`) keeps
  trying until the thread closes. A connection found dead that re-opens at once (the server
  ended it) is one info line; an outage is a warning when it starts and one when it ends, with
  how long it lasted, however many threads saw it (`OutageLog`), never a traceback per call.
- **Refusals are not waited out.** A database that answers but refuses writes (a full disk, a
  read-only file or server) fails the call at once with `WriteRefused` and tells the store's
  `WriteOutage`; while it refuses, a group that ran without a refusal is confirmed with a write
  that changes nothing before the outage is called over. A connection refused as read-only is
  not kept, so the next call sees a database made writable again (PostgreSQL's
  `default_transaction_read_only` holds for a session).

A commit whose answer is lost with the connection is ambiguous; the group is then run again,
each call's unit as it was queued. Every write of the store stays true under such a replay: each
unit carries what it needs to recognise its own earlier run (see `core.store.units`).
"""

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from core.errors import StoreError, StoreUnavailable, WriteRefused
from core.metrics import STORE_OUTAGE_SECONDS, STORE_OUTAGES, STORE_RETRIES
from core.store.outage import PLAINLY, PROBE, Cause, WriteOutage, refusal_cause

logger = logging.getLogger(__name__)

T = TypeVar("T")
Unit = Callable[[Connection], T]
"""A call: statements run on the thread's connection, inside the group's transaction."""

MAX_GROUP = 256
AUTOCOMMIT_MOST = 2
"""The most calls that need no transaction run one by one rather than in one (`_each_alone`):
a turn's reply and its ending, queued together. Here a commit's flush costs about 0.2 ms, a
round trip to a database a network hop away 0.5 to 1 ms."""
SETTLE_SLICE = 32
FIRST_PAUSE, MAX_PAUSE = 0.05, 2.0
SQLITE_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o", "readonly")


@dataclass(eq=False)
class _Call:
    unit: Unit[Any]
    future: "asyncio.Future[Any]"
    queued_at: float
    deadline: float | None
    """Monotonic time after which a lost connection fails the call; None: durable."""
    autocommit: bool
    """The call needs no transaction around it (one statement, or reads that may see each
    other's moment), so alone it may run without BEGIN and COMMIT."""


_CLOSE = object()


class OutageLog:
    """The store's outages as the log tells them: one warning when the database stops answering,
    one when every thread that saw it has its answers again."""

    def __init__(self, retry_seconds: float) -> None:
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._began = 0.0
        self._cause = ""

    def failed(self, thread: str, cause: str) -> None:
        with self._lock:
            if not self._failing:
                self._began, self._cause = time.monotonic(), cause
                STORE_OUTAGES.inc()
                logger.warning(
                    "the database is unreachable (%s); holding writes and retrying for up to %g s",
                    cause,
                    self._retry_seconds,
                )
            self._failing.add(thread)

    def recovered(self, thread: str) -> None:
        with self._lock:
            if thread not in self._failing:
                return
            self._failing.discard(thread)
            if not self._failing:
                lasted = time.monotonic() - self._began
                STORE_OUTAGE_SECONDS.inc(lasted)
                logger.warning(
                    "the database is back after %.1f s (it was: %s)", lasted, self._cause
                )


class DatabaseThread:
    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        retry_seconds: float,
        outages: OutageLog | None = None,
        writes: WriteOutage | None = None,
    ) -> None:
        self._engine = engine
        self._autocommit = engine.dialect.name == "postgresql"
        self._name = name
        self._retry_seconds = retry_seconds
        self._outages = outages or OutageLog(retry_seconds)
        self._writes = writes or WriteOutage()
        self._refused = False
        """A call of the group running now was refused (`WriteRefused`)."""
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Call | object] = queue.SimpleQueue()
        self._connection: Connection | None = None
        self._closing_at: float | None = None
        self._wake = threading.Event()
        self._stopped = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def submit(
        self, unit: Unit[T], *, durable: bool = False, autocommit: bool = False
    ) -> "asyncio.Future[T]":
        """Queue `unit`; the future resolves with its result once its group has committed.
        `autocommit`: `unit` needs no transaction around it."""
        if self._closing_at is not None:
            raise StoreError("the store is closed")
        now = time.monotonic()
        future: asyncio.Future[T] = self._loop.create_future()
        deadline = None if durable else now + self._retry_seconds
        self._queue.put(_Call(unit, future, now, deadline, autocommit))
        return future

    async def close(self, grace: float) -> None:
        """Run what is queued (a lost connection is retried for at most `grace` seconds more),
        then close the connection and end the thread."""
        if self._closing_at is None:
            self._closing_at = time.monotonic() + grace
            self._queue.put(_CLOSE)
            self._wake.set()
        await asyncio.shield(self._stopped)

    # -- on the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (group := self._next_group()) is not None:
                self._run_group(group)
        finally:
            self._disconnect(invalidate=False)
            self._loop.call_soon_threadsafe(_settle, self._stopped, None, None)

    def _next_group(self) -> list[_Call] | None:
        first = self._queue.get()
        if first is _CLOSE:
            return None
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _CLOSE:
                self._queue.put(_CLOSE)  # seen again once this group is done
                break
            group.append(item)
        return group  # type: ignore[return-value]

    def _run_group(self, group: list[_Call]) -> None:
        pending, pause, self._refused = group, FIRST_PAUSE, False
        while pending:
            try:
                pending = self._commit(pending)
            except _ConnectionLost as lost:
                if lost.stale:
                    logger.info("a database connection was lost (%s); reconnecting", lost.cause)
                    pending = lost.remaining
                    STORE_RETRIES.inc()
                    continue
                self._outages.failed(self._name, lost.cause)
                pending = self._expire(lost.remaining, lost.cause)
                if pending:
                    self._wake.wait(pause)
                    pause = min(pause * 2, MAX_PAUSE)
                    STORE_RETRIES.inc()
            else:
                self._outages.recovered(self._name)
                if self._writes.current is not None and not self._refused:
                    self._confirm_writes()

    def _confirm_writes(self) -> None:
        """While writes are refused: whether one is taken now, which ends the outage."""
        try:
            connection = self._connect()
            with connection.begin():
                connection.exec_driver_sql(PROBE).close()
        except Exception as exc:
            if refusal_cause(exc) is Cause.READ_ONLY or self._lost(exc):
                self._disconnect(invalidate=True)
            return
        self._writes.wrote()

    def _commit(self, calls: list[_Call]) -> list[_Call]:
        """Run `calls` in one transaction and resolve them; on a call's own failure, run them
        again one by one. A few calls that each need no transaction run one by one without one
        (`_each_alone`). Raises `_ConnectionLost` with the calls not yet resolved."""
        if self._each_alone(calls):
            for index, call in enumerate(calls):
                self._commit_alone(call, calls[index:], autocommit=True)
            return []
        reused = self._connection is not None
        try:
            connection = self._connect()
            with connection.begin():
                results = [call.unit(connection) for call in calls]
        except Exception as exc:
            if self._lost(exc):
                raise self._connection_lost(exc, calls, reused) from exc
            if len(calls) == 1:
                self._resolve([(calls[0], None, self._failure(exc))])
                return []
            for index, call in enumerate(calls):
                self._commit_alone(call, calls[index:])
            return []
        self._resolve([(call, result, None) for call, result in zip(calls, results, strict=True)])
        return []

    def _each_alone(self, calls: list[_Call]) -> bool:
        """Whether `calls` run one by one without BEGIN and COMMIT (PostgreSQL's autocommit):
        when each needs no transaction and there are at most `AUTOCOMMIT_MOST`, which costs
        a round trip each instead of two more for BEGIN and COMMIT. A larger group shares one
        transaction, so one commit (one flush of the server's log) instead of one per call."""
        return (
            self._autocommit
            and len(calls) <= AUTOCOMMIT_MOST
            and all(call.autocommit for call in calls)
        )

    def _commit_alone(
        self, call: _Call, remaining: list[_Call], *, autocommit: bool = False
    ) -> None:
        reused = self._connection is not None
        try:
            connection = self._connect()
            if autocommit:
                result = self._autocommitted(connection, call)
            else:
                with connection.begin():
                    result = call.unit(connection)
        except Exception as exc:
            if self._lost(exc):
                raise self._connection_lost(exc, remaining, reused) from exc
            self._resolve([(call, None, self._failure(exc))])
            return
        self._resolve([(call, result, None)])

    def _connection_lost(
        self, exc: Exception, remaining: list[_Call], reused: bool
    ) -> "_ConnectionLost":
        stale = reused and isinstance(exc, DBAPIError) and exc.connection_invalidated
        self._disconnect(invalidate=True)
        return _ConnectionLost(remaining, _describe(exc), stale=stale)

    def _autocommitted(self, connection: Connection, call: _Call) -> Any:
        default = connection.default_isolation_level
        connection.execution_options(isolation_level="AUTOCOMMIT")
        try:
            result = call.unit(connection)
            connection.commit()  # ends SQLAlchemy's own bookkeeping; nothing goes to the server
        finally:
            with contextlib.suppress(Exception):  # a dead connection is replaced anyway
                connection.rollback()
                connection.execution_options(isolation_level=default)
        return result

    def _connect(self) -> Connection:
        if self._connection is None:
            self._connection = self._engine.connect()
        return self._connection

    def _disconnect(self, *, invalidate: bool) -> None:
        if self._connection is None:
            return
        with contextlib.suppress(Exception):
            if invalidate:
                self._connection.invalidate()
            self._connection.close()
        self._connection = None

    def _failure(self, exc: Exception) -> Exception:
        """A call's own failure, as Kaiwa's error; a refusal is told to the `WriteOutage`."""
        cause = refusal_cause(exc)
        if cause is None:
            return _mapped(exc)
        self._refused = True
        self._writes.refused(cause)
        if cause is Cause.READ_ONLY:
            self._disconnect(invalidate=True)
        error = WriteRefused(
            f"the database refused a write: {_describe(exc)}", cause=cause, plainly=PLAINLY[cause]
        )
        error.__cause__ = exc
        return error

    def _lost(self, exc: Exception) -> bool:
        """Whether `exc` is the database being away (retry) rather than the call being wrong.
        A refusal is neither: it fails the call at once (`_failure`)."""
        if refusal_cause(exc) is not None:
            return False
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return True
        if isinstance(exc, OperationalError) and isinstance(exc.orig, sqlite3.OperationalError):
            return any(word in str(exc.orig).lower() for word in SQLITE_TRANSIENT)
        return isinstance(exc, OperationalError | InterfaceError | OSError)

    def _expire(self, calls: list[_Call], cause: str) -> list[_Call]:
        """Fail the calls whose time is up; return the others."""
        now = time.monotonic()
        expired, kept = [], []
        for call in calls:
            deadline = call.deadline
            if self._closing_at is not None:
                deadline = self._closing_at if deadline is None else min(deadline, self._closing_at)
            (expired if deadline is not None and now >= deadline else kept).append(call)
        if expired:
            waited = now - min(call.queued_at for call in expired)
            seconds = f"{waited:.1f}" if waited < 10 else f"{waited:.0f}"  # never "0 s"
            error = StoreUnavailable(
                f"the database did not answer for {seconds} s ({cause}); check that it is "
                "running and reachable"
            )
            self._resolve([(call, None, error) for call in expired])
        return kept

    def _resolve(self, outcomes: list[tuple[_Call, Any, BaseException | None]]) -> None:
        self._loop.call_soon_threadsafe(self._settle_from, outcomes, 0)

    def _settle_from(
        self, outcomes: list[tuple[_Call, Any, BaseException | None]], first: int
    ) -> None:
        """On the loop: resolve a slice of a group's calls, and the next slice only after the
        callers these wake have run, so a thousand waiters wake a few dozen at a time and the
        loop's timers get their turn in between."""
        for call, result, error in outcomes[first : first + SETTLE_SLICE]:
            _settle(call.future, result, error)
        if first + SETTLE_SLICE < len(outcomes):
            self._loop.call_soon(self._settle_from, outcomes, first + SETTLE_SLICE)


class _ConnectionLost(Exception):
    def __init__(self, remaining: list[_Call], cause: str, *, stale: bool = False) -> None:
        super().__init__(cause)
        self.remaining = remaining
        self.cause = cause
        self.stale = stale
        """A connection that had worked was found dead: try a new one before calling it an
        outage."""


def _settle(future: "asyncio.Future[Any]", result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _mapped(exc: Exception) -> Exception:
    """A call's own failure, as Kaiwa's error (the engine hides parameters, so no user text)."""
    if isinstance(exc, DBAPIError):
        error = StoreError(f"the database refused a write: {_describe(exc)}")
        error.__cause__ = exc
        return error
    return exc


def _describe(exc: BaseException) -> str:
    original = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = str(original).strip()
    return f"{type(original).__name__}: {text.splitlines()[0]}" if text else type(original).__name__
