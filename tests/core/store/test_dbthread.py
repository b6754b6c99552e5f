"""The database thread: order, group commit, isolation, outages, close. Real SQLite, but for how
calls that need no transaction run on PostgreSQL (with KAIWA_TEST_POSTGRES_URL); an outage is
another connection holding SQLite's write lock, which is what a second process does. Handshakes
are threading events set from inside a call, or a log line the thread writes."""

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Connection, Engine, create_engine, event, text

from core.errors import StoreError, StoreUnavailable
from core.store.dbthread import AUTOCOMMIT_MOST, DatabaseThread
from tests.core.store.replays import commit_answer_lost
from tests.databases import postgres_url
from tests.fakes.patience import deadline

WAIT = deadline()


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "thread.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL UNIQUE)")
    return path


@pytest.fixture
def engine(database: Path) -> Iterator[Engine]:
    made = create_engine(
        f"sqlite:///{database}", connect_args={"timeout": 0.05, "check_same_thread": False}
    )
    yield made
    made.dispose()


@pytest.fixture
async def thread(engine: Engine) -> AsyncIterator[DatabaseThread]:
    started = DatabaseThread(engine, name="test-db", retry_seconds=WAIT)
    yield started
    await started.close(grace=0.1)


def note(body: str) -> Callable[[Connection], None]:
    def insert(connection: Connection) -> None:
        connection.execute(text("INSERT INTO notes (body) VALUES (:body)"), {"body": body})

    return insert


def notes(connection: Connection) -> list[str]:
    return list(connection.execute(text("SELECT body FROM notes ORDER BY id")).scalars())


class Gate:
    """A call that holds the thread until released: what is queued meanwhile forms one group."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, connection: Connection) -> None:
        self.entered.set()
        self.opened.wait(WAIT)

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT)


class Lock:
    """Another connection holding SQLite's write lock (as another process would)."""

    def __init__(self, database: Path) -> None:
        self._holder = sqlite3.connect(database, isolation_level=None)
        self._holder.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._holder.execute("ROLLBACK")
        self._holder.close()


class LogLines(logging.Handler):
    """Warnings of core.store.dbthread, with a thread-safe wait for the first ones."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self._seen = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._seen:
            self.lines.append(record.getMessage())
            self._seen.notify_all()

    async def wait_for(self, count: int) -> None:
        def wait() -> bool:
            with self._seen:
                return self._seen.wait_for(lambda: len(self.lines) >= count, WAIT)

        assert await asyncio.to_thread(wait), self.lines


@pytest.fixture
def warnings_logged() -> Iterator[LogLines]:
    handler = LogLines()
    logger = logging.getLogger("core.store.dbthread")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_calls_run_in_the_order_they_were_queued(thread: DatabaseThread) -> None:
    writes = [thread.submit(note(f"n{i}")) for i in range(30)]
    await asyncio.gather(*writes)
    assert await thread.submit(notes) == [f"n{i}" for i in range(30)]


async def test_calls_queued_while_the_thread_works_share_one_commit(
    thread: DatabaseThread, engine: Engine
) -> None:
    gate = Gate()
    first = thread.submit(gate)
    await gate.reached()
    commits: list[object] = []
    event.listen(engine, "commit", commits.append)
    writes = [thread.submit(note(f"n{i}")) for i in range(20)]
    gate.opened.set()
    await asyncio.gather(first, *writes)

    assert len(commits) == 2, "the held call's group, then one for all twenty writes"
    assert len(await thread.submit(notes)) == 20


async def test_a_call_that_fails_on_its_own_fails_alone(thread: DatabaseThread) -> None:
    gate = Gate()
    first = thread.submit(gate)
    await gate.reached()
    before = thread.submit(note("kept"))
    duplicate = thread.submit(note("kept"))
    after = thread.submit(note("also kept"))
    gate.opened.set()

    await asyncio.gather(first, before, after)
    with pytest.raises(StoreError, match="IntegrityError"):
        await duplicate
    assert await thread.submit(notes) == ["kept", "also kept"]


async def test_a_call_is_not_torn_by_its_callers_cancellation(thread: DatabaseThread) -> None:
    gate = Gate()
    held = thread.submit(gate)
    await gate.reached()
    waiter = asyncio.ensure_future(thread.submit(note("written anyway")))
    await asyncio.sleep(0)
    waiter.cancel()
    gate.opened.set()
    await held

    assert await thread.submit(notes) == ["written anyway"]


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_an_outage_is_waited_out_with_one_line_when_it_starts_and_one_when_it_ends(
    thread: DatabaseThread, database: Path, warnings_logged: LogLines
) -> None:
    outages, retries = counted("kaiwa_store_outages_total"), counted("kaiwa_store_retries_total")
    lock = Lock(database)
    writes = [thread.submit(note(f"n{i}")) for i in range(5)]
    await warnings_logged.wait_for(1)
    lock.release()
    await asyncio.gather(*writes)

    assert await thread.submit(notes) == [f"n{i}" for i in range(5)]
    assert counted("kaiwa_store_outages_total") - outages == 1, "one outage, however many tries"
    assert counted("kaiwa_store_retries_total") - retries >= 1
    began, ended = warnings_logged.lines
    assert began.startswith("the database is unreachable (OperationalError: database is locked)")
    assert ended.startswith("the database is back after ")


async def test_a_call_gives_up_after_its_retry_time_but_a_durable_one_does_not(
    engine: Engine, database: Path, warnings_logged: LogLines
) -> None:
    thread = DatabaseThread(engine, name="test-db", retry_seconds=0.2)
    lock = Lock(database)
    try:
        bounded = thread.submit(note("bounded"))
        durable = thread.submit(note("durable"), durable=True)
        with pytest.raises(StoreUnavailable, match=r"did not answer for \d+(\.\d)? s .*is locked"):
            await bounded
        assert not durable.done()
        lock.release()
        await durable
        assert await thread.submit(notes) == ["durable"]
    finally:
        await thread.close(grace=0.1)


async def test_close_runs_what_is_queued_then_refuses_more(thread: DatabaseThread) -> None:
    writes = [thread.submit(note(f"n{i}")) for i in range(10)]
    await thread.close(grace=1.0)
    assert all(write.done() and write.exception() is None for write in writes)
    with pytest.raises(StoreError, match="closed"):
        thread.submit(notes)


async def test_close_gives_a_durable_call_only_its_grace_in_an_outage(
    engine: Engine, database: Path
) -> None:
    thread = DatabaseThread(engine, name="test-db", retry_seconds=WAIT)
    lock = Lock(database)
    try:
        durable = thread.submit(note("never"), durable=True)
        await thread.close(grace=0.2)
        with pytest.raises(StoreUnavailable):
            await durable
    finally:
        lock.release()


# -- calls that need no transaction, on PostgreSQL ------------------------------------------------


@pytest.fixture
async def postgres_thread() -> AsyncIterator[DatabaseThread]:
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the PostgreSQL store tests")
    engine = create_engine(base)
    started = DatabaseThread(engine, name="test-pg", retry_seconds=WAIT)
    yield started
    await started.close(grace=0.1)
    engine.dispose()


def transaction_id(connection: Connection) -> str:
    """The id of the transaction the call runs in (each statement's own, without one)."""
    return str(connection.exec_driver_sql("SELECT pg_current_xact_id()").scalar())


async def queued_together(thread: DatabaseThread, *calls: Callable[[], object]) -> list[object]:
    """Queue `calls` (each submitting one) while the thread is held, so they form one group."""
    gate = Gate()
    held = thread.submit(gate)
    await gate.reached()
    futures = [call() for call in calls]
    gate.opened.set()
    await held
    return list(await asyncio.gather(*futures))  # type: ignore[call-overload]


@pytest.mark.postgres
async def test_a_few_calls_that_need_no_transaction_run_without_one_on_postgresql(
    postgres_thread: DatabaseThread,
) -> None:
    """A turn's reply and its ending, queued together, each one statement: without BEGIN and
    COMMIT, a round trip each; more than `AUTOCOMMIT_MOST` share one transaction (one commit)."""
    few = [lambda: postgres_thread.submit(transaction_id, autocommit=True)] * AUTOCOMMIT_MOST
    seen = await queued_together(postgres_thread, *few)
    assert len(set(seen)) == AUTOCOMMIT_MOST, "each in a transaction of its own"

    many = few + few[:1]
    assert len(set(await queued_together(postgres_thread, *many))) == 1, "one group commit"

    mixed = [few[0], lambda: postgres_thread.submit(transaction_id)]
    assert len(set(await queued_together(postgres_thread, *mixed))) == 1, "one needs it"


@pytest.mark.postgres
async def test_a_lost_commit_answer_runs_again_only_the_call_it_was_for(
    postgres_thread: DatabaseThread,
) -> None:
    runs = {"first": 0, "second": 0}
    first_ran = threading.Event()  # only the first call's commit is lost, not the gate's

    def counted_run(name: str) -> Callable[[Connection], str]:
        def run(connection: Connection) -> str:
            runs[name] += 1
            first_ran.set()
            return transaction_id(connection)

        return run

    with commit_answer_lost(when=first_ran.is_set) as lost:
        first, second = await queued_together(
            postgres_thread,
            lambda: postgres_thread.submit(counted_run("first"), autocommit=True),
            lambda: postgres_thread.submit(counted_run("second"), autocommit=True),
        )

    assert lost.happened
    assert runs == {"first": 2, "second": 1}, "the second had not run when the first was lost"
    assert first != second
