"""When the database answers but refuses to write: one owner of whether it does now, since when,
and why.

A lost connection is an outage the database thread waits out (`core.store.dbthread`). A refusal
is different: the database answers at once, and no for as long as an operator has not acted (its
disk is full, its file or server is read-only, a quota is used up). Waiting a call out would only
hold each message for `write_retry_seconds` and then fail it anyway, so a refused call fails at
once with `WriteRefused`, and this owner keeps the state that everyone else reads: the
dispatcher tells each place once per outage (`Refusal.serial` tells one outage from the next),
readiness reports it, the metrics count it, and the log has one line when it starts and one when
it ends, however many messages were refused in between.

The causes are recognised from what the database or the operating system says (SQLite's
SQLITE_FULL and SQLITE_READONLY, PostgreSQL's SQLSTATE 53100 and 25006, errno ENOSPC, EROFS and
EDQUOT), since nothing else distinguishes them; anything else is a call's own failure.

The outage ends when a write is accepted again. Reads are accepted throughout, so while refusing,
a database thread confirms a group it ran with a write that changes nothing (`PROBE`) before it
calls the outage over.
"""

import errno
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from core.metrics import REFUSED_WRITES, REFUSING_WRITES

logger = logging.getLogger(__name__)

PROBE = "UPDATE alembic_version SET version_num = version_num"
"""A write that changes nothing: taken only where writes are."""


class Cause(StrEnum):
    DISK_FULL = "disk_full"
    READ_ONLY = "read_only"
    QUOTA = "quota"


PLAINLY = {
    Cause.DISK_FULL: "the server's disk is full",
    Cause.READ_ONLY: "the database is read-only",
    Cause.QUOTA: "the server's disk quota is used up",
}
"""Each cause as a person in a chat is told it."""

ERRNOS = {errno.ENOSPC: Cause.DISK_FULL, errno.EROFS: Cause.READ_ONLY, errno.EDQUOT: Cause.QUOTA}
SQLITE_CODES = {13: Cause.DISK_FULL, 8: Cause.READ_ONLY, 1544: Cause.READ_ONLY}
"""SQLITE_FULL, SQLITE_READONLY and SQLITE_READONLY_DIRECTORY, as extended codes. The other
SQLITE_READONLY_* (a file moved, a lock or a recovery) pass with a new connection: the database
thread waits those out as it does a lock."""
SQLSTATES = {"53100": Cause.DISK_FULL, "25006": Cause.READ_ONLY}
"""PostgreSQL's disk_full and read_only_sql_transaction."""


def refusal_cause(exc: BaseException) -> Cause | None:
    """Why the database refused a write, when `exc` (or what it wraps) is such a refusal."""
    seen: BaseException | None = exc
    while seen is not None:
        if (cause := _own_cause(seen)) is not None:
            return cause
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _own_cause(exc: BaseException) -> Cause | None:
    if isinstance(exc, OSError) and exc.errno in ERRNOS:
        return ERRNOS[exc.errno]
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", -1)
        return SQLITE_CODES.get(code)
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in SQLSTATES:
        quota = "quota" in str(exc).lower()  # the server's own ENOSPC and EDQUOT share 53100
        return Cause.QUOTA if quota else SQLSTATES[sqlstate]
    return None


@dataclass(frozen=True)
class Refusal:
    """An outage of writes: what refuses them, since when (UTC), and which outage it is."""

    cause: Cause
    since: datetime
    serial: int

    @property
    def plainly(self) -> str:
        return PLAINLY[self.cause]


class WriteOutage:
    """Whether the database refuses writes now; told by the database threads, read by anyone.
    Thread-safe: the threads report, the event loop reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Refusal | None = None
        self._began = 0.0
        self._serial = 0

    @property
    def current(self) -> Refusal | None:
        """The outage going on, or None while writes are taken."""
        return self._current

    def refused(self, cause: Cause) -> None:
        """A write was refused for `cause`: counted, and the start of an outage if none is on."""
        REFUSED_WRITES.labels(cause.value).inc()
        with self._lock:
            if self._current is not None:
                return
            self._serial += 1
            self._current = Refusal(cause, datetime.now(UTC), self._serial)
            self._began = time.monotonic()
        REFUSING_WRITES.labels(cause.value).set(1)
        logger.warning(
            "the database refuses writes (%s): messages are left for their platforms to deliver "
            "again and each place is told once",
            PLAINLY[cause],
        )

    def wrote(self) -> None:
        """A write was taken: the end of the outage, if one is on."""
        with self._lock:
            ended, self._current = self._current, None
        if ended is None:
            return
        REFUSING_WRITES.labels(ended.cause.value).set(0)
        logger.warning(
            "the database takes writes again after %.1f s (it was: %s)",
            time.monotonic() - self._began,
            PLAINLY[ended.cause],
        )
