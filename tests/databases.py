"""Databases for tests: fresh ones on either backend, stores that give up quickly, and outages.

An outage is real. On SQLite, another connection holds the write lock (what a second process or
a backup does); on PostgreSQL, a TCP proxy between Kaiwa and the server drops every connection
and refuses new ones. `Outage.store_noticed` waits for the store's own "unreachable" log line,
and `store_recovered` for its "back" line, so tests order events by handshakes. A full disk is
real too: a tmpfs of 1 MiB filled to its last byte (`small_disk`; mounting needs root).
"""

import asyncio
import atexit
import errno
import functools
import logging
import os
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from core.cluster.leases import conninfo
from core.store import Store, StoreSettings
from core.store.schema import ensure_schema
from tests.fakes.patience import deadline
from tests.fakes.tcp_proxy import TcpProxy

WAIT = deadline()
QUICK = StoreSettings(write_retry_seconds=WAIT, sqlite_busy_seconds=0.05)
"""Waits out any outage a test makes; a lock held on SQLite shows at once."""
IMPATIENT = StoreSettings(write_retry_seconds=0.3, sqlite_busy_seconds=0.05)
"""Gives up quickly: for what happens after an outage outlasts the wait."""


POSTGRES_VARIABLE = "KAIWA_TEST_POSTGRES_URL"


def postgres_url() -> str | None:
    return os.environ.get(POSTGRES_VARIABLE)


def use_a_database_per_worker() -> None:
    """Under pytest-xdist, each worker's PostgreSQL tests use a database of their own on the
    test server (`test_gw0`, ... made when missing), so workers share no locks, notifications
    or connection limits: cluster tests take advisory locks and LISTEN database-wide."""
    worker, base = os.environ.get("PYTEST_XDIST_WORKER"), postgres_url()
    if not (worker and base):
        return
    url = make_url(base)
    name = f"{url.database}_{worker}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            known = "SELECT 1 FROM pg_database WHERE datname = :name"
            if connection.execute(text(known), {"name": name}).first() is None:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    os.environ[POSTGRES_VARIABLE] = url.set(database=name).render_as_string(hide_password=False)


@asynccontextmanager
async def postgres_database(prefix: str, why: str) -> AsyncIterator[str]:
    """A database of its own on the test server, dropped after (a schema is not enough where a
    setting or a lock holds database-wide: `default_transaction_read_only`, advisory locks);
    skipped, saying `why`, without a server."""
    base = postgres_url()
    if not base:
        pytest.skip(f"set {POSTGRES_VARIABLE} to run {why}")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = conninfo(base)
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as connection:
        await connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as connection:
            await connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextmanager
def postgres_schema(base: str) -> Iterator[str]:
    """A throwaway schema on the test server, so runs never see each other's rows. The URL also
    names the schema as its `application_name`, so a test can find (and terminate) exactly the
    connections of its own store."""
    schema = f"kaiwa_test_{uuid.uuid4().hex[:10]}"
    engine = create_engine(base)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options=-csearch_path%3D{schema}&application_name={schema}"
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def fresh_sqlite(path: Path) -> str:
    """The URL of a new, empty SQLite store at `path`: a copy of one migrated once per run.
    Running the migrations costs about 150 ms of CPU, a copy about one; with hundreds of
    tests opening a store, that was a fifth of the suite's time."""
    shutil.copyfile(_migrated_sqlite(), path)
    return f"sqlite:///{path}"


@functools.cache
def _migrated_sqlite() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="kaiwa-tests-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # gone with the run
    path = folder / "migrated.db"
    engine = create_engine(f"sqlite:///{path}")
    try:
        ensure_schema(engine)
    finally:
        engine.dispose()
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database on each backend: SQLite in a file, PostgreSQL in a schema of its own
    (skipped without KAIWA_TEST_POSTGRES_URL)."""
    if request.param == "sqlite":
        yield fresh_sqlite(tmp_path / "store.db")
        return
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the PostgreSQL store tests")
    with postgres_schema(base) as url:
        yield url


class LogWatch(logging.Handler):
    """The warnings of some loggers, with a wait for a line to appear (from any thread)."""

    def __init__(self, *names: str) -> None:
        super().__init__(logging.WARNING)
        self._names = names
        self._loop = asyncio.get_running_loop()
        self.lines: list[str] = []
        self._changed = asyncio.Event()

    def __enter__(self) -> "LogWatch":
        for name in self._names:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name in self._names:
            logging.getLogger(name).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self._loop.call_soon_threadsafe(self._changed.set)

    def count(self, phrase: str) -> int:
        return sum(phrase in line for line in self.lines)

    async def line_with(self, phrase: str, times: int = 1) -> None:
        async with asyncio.timeout(WAIT):
            while self.count(phrase) < times:
                self._changed.clear()
                await self._changed.wait()


@dataclass
class Outage:
    """The database going away and coming back, the same way for the test on either backend.
    `log` watches the store's and the dispatcher's warnings."""

    url: str
    begin: Callable[[], None]
    end: Callable[[], None]
    log: LogWatch

    async def store_noticed(self) -> None:
        """Wait until the store has tried the database and found it away."""
        await self.log.line_with("the database is unreachable")

    async def store_recovered(self) -> None:
        """Wait until the store found the database back (after every held write landed)."""
        await self.log.line_with("the database is back after")


@contextmanager
def sqlite_outage(path: Path, log: LogWatch) -> Iterator[Outage]:
    url = fresh_sqlite(path)
    holder = sqlite3.connect(path, isolation_level=None)

    def begin() -> None:
        holder.execute("BEGIN IMMEDIATE")

    def end() -> None:
        holder.execute("ROLLBACK")

    try:
        yield Outage(url, begin, end, log)
    finally:
        holder.close()


@contextmanager
def postgres_outage(base: str, log: LogWatch) -> Iterator[Outage]:
    with postgres_schema(base) as url:
        parsed = make_url(url)
        with TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432)) as proxy:
            through = parsed.set(host="127.0.0.1", port=proxy.port)
            yield Outage(
                through.render_as_string(hide_password=False), proxy.cut, proxy.restore, log
            )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def outage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Outage]:
    with LogWatch("core.store.dbthread", "core.dispatch.dispatcher") as log:
        if request.param == "sqlite":
            with sqlite_outage(tmp_path / "outage.db", log) as made:
                yield made
            return
        base = postgres_url()
        if not base:
            pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the PostgreSQL store tests")
        with postgres_outage(base, log) as made:
            yield made


@pytest.fixture
async def closing() -> AsyncIterator[list[Store]]:
    """Stores a test opened with `open_store`, closed when it ends."""
    stores: list[Store] = []
    yield stores
    for store in stores:
        await store.close()


async def open_store(url: str, settings: StoreSettings, stores: list[Store]) -> Store:
    store = await Store.open(url, settings)
    stores.append(store)
    return store


class SmallDisk:
    """A tmpfs of 1 MiB that can be filled to its last byte and emptied again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = root / "filler"

    def fill(self) -> None:
        with self._filler.open("ab", buffering=0) as filler:
            for _ in range(1024):  # 4 MiB at most: well past the disk's size
                try:
                    filler.write(b"\0" * 4096)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    return
        raise AssertionError("the small disk never filled")

    def empty(self) -> None:
        self._filler.unlink()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)
