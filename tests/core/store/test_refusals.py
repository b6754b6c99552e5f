"""A database that answers but refuses writes, by cause: each refusal is real.

A full disk is a small tmpfs filled to its last byte (mounting needs root; without it the tests
skip). A read-only SQLite file is opened the way SQLite opens a file it may not write
(`mode=ro`): chmod alone cannot show it here, since root writes a file whatever its mode.
PostgreSQL refuses writes with `default_transaction_read_only` on a database of its own.
"""

import asyncio
import errno
import logging
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import psycopg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from bot.health import Readiness
from core.agent.model import ModelClient, ModelSettings
from core.channel import Button, ChannelMessage
from core.cluster.leases import conninfo
from core.errors import ChannelError, WriteRefused
from core.store import Inbound, Store
from core.store.dbthread import DatabaseThread
from core.store.outage import Cause, WriteOutage, refusal_cause
from tests.databases import QUICK, SmallDisk, open_store, postgres_database, postgres_url
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import FakeOllama, Text
from tests.harness import PLACE, BotFactory

OTHER_PLACE = "test:two"


def inbound(message_id: str) -> Inbound:
    return Inbound("test", message_id, PLACE, "x" * 8000, author="ann")


def refused(cause: Cause) -> float:
    sample = "kaiwa_store_refused_writes_total"
    return REGISTRY.get_sample_value(sample, {"cause": cause.value}) or 0.0


async def first_refused(store: Store) -> str:
    """Claim messages until the full disk refuses one; its id."""
    for number in range(200):
        try:
            await store.claim_inbound(inbound(f"m{number}"))
        except WriteRefused as exc:
            assert exc.cause == Cause.DISK_FULL
            return f"m{number}"
    raise AssertionError("no write was refused on a full disk")


async def test_a_full_disk_refuses_at_once_counts_and_ends_when_space_is_back(
    small_disk: SmallDisk, closing: list[Store], caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(f"sqlite:///{small_disk.root}/kaiwa.db", QUICK, closing)
    before = refused(Cause.DISK_FULL)
    caplog.set_level(logging.WARNING, logger="core.store.outage")
    small_disk.fill()

    left = await first_refused(store)
    assert store.writes.current is not None
    assert store.writes.current.cause is Cause.DISK_FULL
    with pytest.raises(WriteRefused, match="database or disk is full"):
        await store.claim_inbound(inbound(left))
    assert refused(Cause.DISK_FULL) - before >= 2
    assert store.writes.current is not None, "a refused write leaves the outage on"

    small_disk.empty()
    claim = await store.claim_inbound(inbound(left))
    await store.ping()  # after the claim's group, and its confirmation
    assert claim.fresh, "a refused message was never recorded"
    assert store.writes.current is None
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, "one line when it starts, one when it ends"
    assert lines[0].startswith("the database refuses writes (the server's disk is full)")
    assert lines[1].startswith("the database takes writes again after")


@pytest.fixture
def read_only_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "refusing.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE notes (body TEXT NOT NULL)")
        setup.execute("CREATE TABLE alembic_version (version_num TEXT NOT NULL)")
        setup.execute("INSERT INTO alembic_version VALUES ('head')")
    return path


async def test_a_read_only_sqlite_file_refuses_and_a_writable_one_is_seen_again(
    read_only_sqlite: Path,
) -> None:
    writable = asyncio.Event()

    def connect() -> sqlite3.Connection:
        mode = "rw" if writable.is_set() else "ro"
        return sqlite3.connect(f"file:{read_only_sqlite}?mode={mode}", uri=True)

    engine = create_engine("sqlite://", creator=connect)
    writes = WriteOutage()
    thread = DatabaseThread(engine, name="refusing", retry_seconds=30.0, writes=writes)
    note = "INSERT INTO notes VALUES ('kept')"
    try:
        with pytest.raises(WriteRefused, match="readonly database") as caught:
            await thread.submit(lambda connection: connection.exec_driver_sql(note).close())
        assert caught.value.cause == Cause.READ_ONLY
        assert caught.value.plainly == "the database is read-only"
        assert writes.current is not None and writes.current.cause is Cause.READ_ONLY

        writable.set()  # what a chmod u+w does for the next connection opened
        await thread.submit(lambda connection: connection.exec_driver_sql(note).close())
        await thread.submit(lambda connection: None)  # after the confirmation
        assert writes.current is None
    finally:
        await thread.close(grace=1.0)
        engine.dispose()
    with sqlite3.connect(read_only_sqlite) as check:
        assert check.execute("SELECT count(*) FROM notes").fetchone() == (1,)


@pytest.fixture
async def own_database() -> AsyncIterator[str]:
    async with postgres_database("kaiwa_refusing", "the PostgreSQL store tests") as url:
        yield url


async def read_only(url: str, on: bool) -> None:
    """Set the database's default, and end its sessions so that every new one has it."""
    name = make_url(url).database
    admin = conninfo(postgres_url() or "")
    setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as connection:
        await connection.execute(f'ALTER DATABASE "{name}" {setting}')
        ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
        await connection.execute(ended, (name,))


async def test_a_read_only_postgresql_refuses_and_its_end_is_seen(
    own_database: str, closing: list[Store]
) -> None:
    store = await open_store(own_database, QUICK, closing)
    await store.claim_inbound(inbound("before"))
    await read_only(own_database, True)

    with pytest.raises(WriteRefused, match="read-only transaction") as caught:
        await store.claim_inbound(inbound("during"))
    assert caught.value.cause == Cause.READ_ONLY
    assert store.writes.current is not None

    await read_only(own_database, False)
    claim = await store.claim_inbound(inbound("during"))
    await store.ping()
    assert claim.fresh
    assert store.writes.current is None


async def test_a_full_disk_is_told_once_per_place_and_every_message_answered_once_after(
    small_disk: SmallDisk, make_bot: BotFactory, closing: list[Store]
) -> None:
    """Issue 38: while the disk was full nobody in any chat heard anything; now each place is
    told once, never again at a redelivery, and every message is answered once after."""
    store = await open_store(f"sqlite:///{small_disk.root}/kaiwa.db", QUICK, closing)
    bot = make_bot(bot_store=store)
    small_disk.fill()
    await first_refused(store)
    messages = [
        ChannelMessage("test", PLACE, "a1", "ann", "first?", redeliverable=True),
        ChannelMessage("test", OTHER_PLACE, "b1", "bob", "other?", redeliverable=True),
        ChannelMessage("test", PLACE, "a2", "ann", "second?", redeliverable=True),
    ]
    for _ in range(3):  # the platform delivers each again, and again
        for message in messages:
            with pytest.raises(WriteRefused):
                await bot.dispatcher.handle(message)
    notice = (
        "I cannot save messages right now: the server's disk is full. Your message will be "
        "answered when that is fixed; nothing is lost."
    )
    assert bot.channel.notices_in(PLACE) == [notice]
    assert bot.channel.notices_in(OTHER_PLACE) == [notice]
    assert bot.ollama.requests == []

    small_disk.empty()
    bot.ollama.script(Text("One."))
    bot.ollama.script(Text("Two."))
    bot.ollama.script(Text("Three."))
    for message in messages + messages:  # redelivered twice more: answered once
        await bot.dispatcher.handle(message)
    replies = await bot.channel.finished(3)
    assert sorted(reply.text for reply in replies) == ["One.", "Three.", "Two."]
    assert len(bot.ollama.requests) == 3
    assert bot.channel.notices_in(PLACE) == [notice], "no second notice"


async def test_readyz_says_the_database_refuses_writes_and_why_until_it_takes_them(
    small_disk: SmallDisk, closing: list[Store]
) -> None:
    store = await open_store(f"sqlite:///{small_disk.root}/kaiwa.db", QUICK, closing)
    async with FakeOllama() as ollama:
        model = ModelClient(ModelSettings(url=ollama.url))
        readiness = Readiness(store, model, [])
        try:
            small_disk.fill()
            await first_refused(store)
            (problem,) = await readiness.problems()
            assert problem.startswith("the database refuses writes since ")
            assert problem.endswith(" UTC: the server's disk is full")

            small_disk.empty()
            assert await readiness.problems() == [], "its probe is a write: taken, it ends it"
        finally:
            await model.close()


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), Cause.DISK_FULL),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), Cause.QUOTA),
        (OSError(errno.EROFS, "Read-only file system"), Cause.READ_ONLY),
        (psycopg.errors.DiskFull("could not extend: No space left on device"), Cause.DISK_FULL),
        (psycopg.errors.DiskFull("could not extend: Disk quota exceeded"), Cause.QUOTA),
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT"), Cause.READ_ONLY),
        (psycopg.errors.UniqueViolation("duplicate key"), None),
        (OSError(errno.ECONNREFUSED, "Connection refused"), None),
    ],
)
def test_each_refusal_is_known_by_what_the_database_or_the_system_says(
    error: Exception, cause: Cause | None
) -> None:
    wrapped = RuntimeError("the driver's wrapper")
    wrapped.__cause__ = error
    assert refusal_cause(error) is cause
    assert refusal_cause(wrapped) is cause


class NoticeFailsOnce(RecordingChannel):
    """A channel whose platform refuses the first notice (down, or rate limited)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_notices = 0

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if not self.refused_notices:
            self.refused_notices += 1
            raise ChannelError("the platform refused the notice")
        return await super().notify(place, text, buttons)


async def test_a_notice_the_platform_refuses_leaves_the_message_its_own_and_is_told_later(
    small_disk: SmallDisk, make_bot: BotFactory, closing: list[Store]
) -> None:
    """A failed notice must not turn a message left for redelivery into one the channel lets go
    (an error other than `StoreError` is an unreadable update, confirmed and dropped)."""
    store = await open_store(f"sqlite:///{small_disk.root}/kaiwa.db", QUICK, closing)
    channel = NoticeFailsOnce()
    bot = make_bot(bot_store=store, channel=channel)
    small_disk.fill()
    await first_refused(store)
    message = ChannelMessage("test", PLACE, "a1", "ann", "first?", redeliverable=True)

    for _ in range(3):
        with pytest.raises(WriteRefused):
            await bot.dispatcher.handle(message)
    assert channel.refused_notices == 1
    assert len(channel.notices_in(PLACE)) == 1, "told at the next redelivery, and only then"
