"""Several workers, one bot: PostgreSQL is the coordination engine (ARCHITECTURE.md, "Several
workers"). No broker, no consensus of our own: leases are advisory locks, wake-ups are
LISTEN/NOTIFY, and what must happen once is a unique row or a conditional update in the store.

Why session advisory locks held on a connection of their own: such a lock lives exactly as long
as the connection that took it, and PostgreSQL ends the connection of a process that died (its
socket closes with it), so a lease needs no heartbeat, no expiry to tune and no clock. A worker
killed with SIGKILL has lost every lease by the time another worker next tries for it. The other
side of that coin: if the lease connection itself drops, this worker has lost every lease too,
and says so (`lost`), since another may already hold them.

Names are hashed to the 64-bit keys PostgreSQL locks on; every name and the notification channel
carry the cluster's `name`, so two Kaiwa bots sharing a server never see each other's leases.
Notifications are small JSON objects with a `kind`, delivered to the handlers registered for it;
a handler that raises is logged and the others go on.
"""

import asyncio
import hashlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from core.cluster.settings import ClusterSettings, worker_name
from core.errors import ConfigError, StoreError
from core.metrics import CLUSTER_LEASES, CLUSTER_WORKERS

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[None]]
RECONNECT_SECONDS = 1.0


def lock_key(name: str) -> int:
    """The advisory-lock key of a lease name: 64 bits of its SHA-256, signed as PostgreSQL's
    bigint."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def conninfo(url: str) -> str:
    """A psycopg connection string from the store's SQLAlchemy URL; a SQLite URL cannot be
    shared by workers (`ConfigError`)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            "[cluster].enabled needs PostgreSQL: workers share one database, and SQLite is a "
            "file of one machine; set the database URL (storage.database_url_env) to a "
            "postgresql:// URL, or [cluster].enabled = false"
        )
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


async def cluster_view(
    url: str, settings: ClusterSettings, leases: list[str]
) -> tuple[list[str], dict[str, str]]:
    """For `kaiwa status`: the live workers, and which worker holds each of `leases`."""
    prefix = f"kaiwa:{settings.name}:"
    async with await psycopg.AsyncConnection.connect(
        conninfo(url), autocommit=True, application_name="kaiwa-status"
    ) as connection:
        cursor = await connection.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            (prefix.replace("_", r"\_") + "%",),
        )
        workers = sorted(str(row[0]).removeprefix(prefix) for row in await cursor.fetchall())
        holders = {}
        for lease in leases:
            key = lock_key(f"{settings.name}:{lease}")
            cursor = await connection.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = %s AND l.objid = %s AND l.objsubid = 1",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            )
            row = await cursor.fetchone()
            if row:
                holders[lease] = str(row[0]).removeprefix(prefix)
    return workers, holders


_COORDINATORS: "weakref.WeakSet[Coordinator]" = weakref.WeakSet()
"""Every coordinator of this process (one, but for tests), for the leases gauge."""


def _leases_held() -> int:
    return sum(len(coordinator.held) for coordinator in list(_COORDINATORS))


CLUSTER_LEASES.set_function(_leases_held)


class Coordinator:
    """This worker's two connections to PostgreSQL: one holds its leases (and sends its
    notifications), one listens."""

    def __init__(self, url: str, settings: ClusterSettings) -> None:
        self._conninfo = conninfo(url)
        self.settings = settings
        self.worker = worker_name(settings)
        self._channel = f"kaiwa_{lock_key(settings.name) & 0xFFFFFFFF:08x}"
        self._leases: psycopg.AsyncConnection[Any] | None = None
        self._listening: asyncio.Task[None] | None = None
        self._handlers: dict[str, list[Handler]] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self.held: set[str] = set()
        """The leases this worker holds."""
        self.lost = asyncio.Event()
        """Set when the lease connection ended: every lease is gone (others may hold them)."""
        _COORDINATORS.add(self)

    @property
    def application_name(self) -> str:
        """How this worker's connections show in `pg_stat_activity` (`kaiwa status` reads it)."""
        return f"kaiwa:{self.settings.name}:{self.worker}"[:63]

    async def start(self) -> None:
        """Connect, and start listening. `StoreError` if PostgreSQL cannot be reached."""
        self._leases = await self._connect()
        listener = await self._connect()
        await listener.execute(f"LISTEN {self._channel}")
        self._listening = asyncio.create_task(self._listen(listener), name="cluster listening")
        logger.info("cluster %s: worker %s joined", self.settings.name, self.worker)

    async def close(self) -> None:
        pending = [self._listening, *self._handling] if self._listening else [*self._handling]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._leases is not None:
            await self._leases.close()
        self.held.clear()

    def on(self, kind: str, handler: Handler) -> None:
        self._handlers.setdefault(kind, []).append(handler)

    async def try_lease(self, name: str) -> bool:
        """Take the lease `name` if nobody holds it; True if this worker holds it now."""
        if name in self.held:
            return True
        row = await self._query("SELECT pg_try_advisory_lock(%s)", self._key(name))
        if row:
            self.held.add(name)
        return bool(row)

    async def release(self, name: str) -> None:
        if name in self.held:
            self.held.discard(name)
            await self._query("SELECT pg_advisory_unlock(%s)", self._key(name))

    async def notify(self, kind: str, **payload: Any) -> None:
        """Tell every worker (this one too) `kind` with `payload`."""
        message = json.dumps({"kind": kind, "from": self.worker, **payload})
        await self._query("SELECT pg_notify(%s, %s) IS NULL", self._channel, message)

    async def workers(self) -> list[str]:
        """The workers connected now, this one included, sorted."""
        prefix = f"kaiwa:{self.settings.name}:"
        assert self._leases is not None
        try:
            cursor = await self._leases.execute(
                "SELECT DISTINCT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE %s",
                (prefix.replace("_", r"\_") + "%",),
            )
            rows = await cursor.fetchall()
        except psycopg.Error as exc:
            self._connection_lost(exc)
            raise StoreError(f"the cluster's database connection failed: {exc}") from exc
        workers = sorted(str(row[0]).removeprefix(prefix) for row in rows)
        CLUSTER_WORKERS.set(len(workers))
        return workers

    def _key(self, name: str) -> int:
        return lock_key(f"{self.settings.name}:{name}")

    async def _query(self, sql: str, *parameters: Any) -> Any:
        if self._leases is None or self._leases.closed:
            raise StoreError("the cluster's database connection is closed")
        try:
            cursor = await self._leases.execute(sql, parameters)  # type: ignore[arg-type]
            row = await cursor.fetchone()
        except psycopg.Error as exc:
            self._connection_lost(exc)
            raise StoreError(f"the cluster's database connection failed: {exc}") from exc
        return row[0] if row else None

    def _connection_lost(self, error: Exception) -> None:
        if self._leases is not None and self._leases.closed and not self.lost.is_set():
            logger.error(
                "cluster %s: worker %s lost its lease connection (%s); every lease is gone",
                self.settings.name,
                self.worker,
                error,
            )
            self.held.clear()
            self.lost.set()

    async def _connect(self) -> "psycopg.AsyncConnection[Any]":
        try:
            return await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, application_name=self.application_name
            )
        except psycopg.Error as exc:
            raise StoreError(f"the cluster cannot reach PostgreSQL: {exc}") from exc

    async def _listen(self, connection: "psycopg.AsyncConnection[Any]") -> None:
        """Hand each notification to its handlers; reconnect after a drop (what was sent
        meanwhile is missed: the ownership's periodic sweep makes up for it)."""
        try:
            while True:
                try:
                    async for notice in connection.notifies():
                        self._deliver(notice.payload)
                except psycopg.Error as exc:
                    logger.warning("cluster: listening failed (%s); listening again", exc)
                await connection.close()
                connection = await self._listener()
        finally:
            await connection.close()

    async def _listener(self) -> "psycopg.AsyncConnection[Any]":
        while True:
            await asyncio.sleep(RECONNECT_SECONDS)
            try:
                connection = await self._connect()
                await connection.execute(f"LISTEN {self._channel}")
                return connection
            except (StoreError, psycopg.Error) as exc:
                logger.warning("cluster: cannot listen yet (%s)", exc)

    def _deliver(self, payload: str) -> None:
        """Each handler runs as a task of its own: a slow one (a `/stop` waiting for its turn to
        end) holds up no other notification."""
        try:
            message = json.loads(payload)
        except ValueError:
            logger.warning("cluster: an unreadable notification was ignored: %.200s", payload)
            return
        for handler in self._handlers.get(str(message.get("kind")), []):
            task = asyncio.create_task(_handled(handler, message), name="cluster notification")
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)


async def _handled(handler: Handler, message: dict[str, Any]) -> None:
    try:
        await handler(message)
    except Exception:
        logger.exception("cluster: handling a %s notification failed", message.get("kind"))
