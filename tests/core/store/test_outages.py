"""The turn path when the database blinks: nothing said is lost, nobody is left without an answer.

Each outage is real. On SQLite, another connection holds the write lock (what a second process
or a backup does); on PostgreSQL, a TCP proxy between Kaiwa and the server drops every connection
and refuses new ones, and the server's own `pg_terminate_backend` kills Kaiwa's connections
mid-turn and mid-record. Handshakes: the fake model's pauses, the store's own "unreachable" log
line, and PostgreSQL's view of a backend waiting on a lock.
"""

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from core.agent.tools import tool
from core.channel import ChannelMessage, Outcome
from core.errors import StoreError
from core.store import Store
from tests.databases import (
    IMPATIENT,
    QUICK,
    WAIT,
    Outage,
    open_store,
    postgres_schema,
    postgres_url,
)
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Pause, Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory


async def running_turns(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT count(*) FROM turns WHERE status = 'running'")
            ).scalar_one()
    finally:
        engine.dispose()


async def first_frame(bot: Bot, shown: str) -> None:
    await bot.channel.wait_until(
        lambda: bot.channel.replies and bot.channel.replies[0].shown == shown, f"{shown!r} shown"
    )


# -- short outages: waited out -------------------------------------------------------------------


async def test_a_short_outage_during_a_reply_keeps_every_word(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(outage.url, QUICK, closing))
    bot.ollama.script(Text("Before the outage"), Pause("mid"), Text(", and after it."))

    await bot.send("tell me")
    await first_frame(bot, "Before the outage")
    outage.begin()
    bot.ollama.release("mid")
    await outage.store_noticed()
    assert bot.channel.replies[0].shown == "Before the outage", "nothing shown that is not saved"
    outage.end()

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "Before the outage, and after it.")
    assert await bot.assistant_text() == reply.text
    (turn,) = await bot.turns()
    assert turn.status == "done"
    assert await running_turns(outage.url) == 0
    counts = (outage.log.count("unreachable"), outage.log.count("is back after"))
    assert counts == (1, 1), "one line for the outage, one for its end"


async def test_a_message_sent_during_a_short_outage_is_recorded_and_answered(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(outage.url, QUICK, closing))
    bot.ollama.script(Text("Got it."))
    outage.begin()

    sending = asyncio.create_task(bot.send("are you there?"))
    await outage.store_noticed()
    assert not sending.done(), "the message is not taken until it is recorded"
    outage.end()
    await sending

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "Got it.")
    assert [row.text for row in await bot.history()] == ["are you there?", "Got it."]


# -- long outages: told, and marked once the database is back ------------------------------------


async def test_a_message_that_cannot_be_recorded_asks_to_be_sent_again(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(outage.url, IMPATIENT, closing))
    outage.begin()

    await bot.send("hello?")

    (notice,) = bot.channel.notices_in(PLACE)
    assert notice == (
        "I could not save your message: Kaiwa's database is not answering. "
        "Please send it again in a minute."
    )
    assert bot.ollama.requests == [], "nothing unrecorded reaches the model"
    outage.end()


async def test_a_redeliverable_message_that_cannot_be_recorded_is_left_unacknowledged(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(outage.url, IMPATIENT, closing))
    outage.begin()
    message = ChannelMessage("test", PLACE, "m-held", "ann", "hello?", redeliverable=True)

    with pytest.raises(StoreError, match="did not answer"):
        await bot.dispatcher.handle(message)
    assert bot.channel.notices_in(PLACE) == [], "the platform will deliver it again"
    outage.end()

    bot.ollama.script(Text("Now I am."))
    await bot.dispatcher.handle(message)
    (reply,) = await bot.channel.finished()
    assert reply.text == "Now I am."


async def test_a_reply_that_cannot_be_saved_ends_failed_and_is_marked_once_the_database_is_back(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(outage.url, IMPATIENT, closing))
    bot.ollama.script(Text("Said before"), Pause("mid"), Text(" and never saved."))

    await bot.send("tell me")
    await first_frame(bot, "Said before")
    outage.begin()
    bot.ollama.release("mid")

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.FAILED
    assert reply.text == "Said before", "only text that is stored is shown"
    assert (reply.note or "").startswith(
        "I could not save this reply: Kaiwa's database is not answering"
    )
    outage.end()
    await outage.store_recovered()
    (turn,) = await bot.turns()
    assert (turn.status, turn.error) == ("failed", reply.note)
    assert await running_turns(outage.url) == 0


# -- PostgreSQL connections terminated mid-turn and mid-record --------------------------------


@pytest.fixture
async def postgres(closing: list[Store]) -> AsyncIterator[tuple[str, Engine]]:
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the PostgreSQL store tests")
    with postgres_schema(base) as url:
        admin_url = make_url(url).update_query_dict({"application_name": "kaiwa-test-admin"})
        admin = create_engine(admin_url)
        try:
            yield url, admin
        finally:
            admin.dispose()


def terminate_store_connections(url: str, admin: Engine) -> int:
    """What an administrator (or a failover) does: end the server processes of Kaiwa's store."""
    name = make_url(url).query["application_name"]
    with admin.connect() as connection:
        ended = connection.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        ).scalar_one()
        connection.commit()
    return int(ended)


async def store_waits_on_a_lock(url: str, admin: Engine) -> None:
    name = make_url(url).query["application_name"]

    def waiting() -> bool:
        with admin.connect() as connection:
            return bool(
                connection.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name "
                        "AND wait_event_type = 'Lock'"
                    ),
                    {"name": name},
                ).scalar_one()
            )

    async with asyncio.timeout(WAIT):
        while not await asyncio.to_thread(waiting):  # noqa: ASYNC110  (PostgreSQL has no event
            await asyncio.sleep(0.01)  # for a backend starting to wait on a lock)


@contextmanager
def table_locked(admin: Engine, table: str) -> Iterator[None]:
    """Hold `table` so Kaiwa's next write to it waits inside the database: mid-record."""
    with admin.connect() as connection, connection.begin():
        connection.execute(text(f"LOCK TABLE {table} IN EXCLUSIVE MODE"))
        yield


@pytest.mark.postgres
async def test_connections_terminated_mid_reply_lose_nothing(
    make_bot: BotFactory, postgres: tuple[str, Engine], closing: list[Store]
) -> None:
    url, admin = postgres
    bot = make_bot(bot_store=await open_store(url, QUICK, closing))
    bot.ollama.script(Text("First half"), Pause("mid"), Text(", second half."))

    await bot.send("go")
    await first_frame(bot, "First half")
    assert terminate_store_connections(url, admin) >= 1
    bot.ollama.release("mid")

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "First half, second half.")
    assert await bot.assistant_text() == reply.text
    assert await running_turns(url) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["inbound_events", "turns"])
async def test_a_connection_terminated_while_recording_the_message_still_answers_it_once(
    make_bot: BotFactory, postgres: tuple[str, Engine], closing: list[Store], table: str
) -> None:
    """inbound_events: the message's own record; turns: the turn being opened for it."""
    url, admin = postgres
    bot = make_bot(bot_store=await open_store(url, QUICK, closing))
    bot.ollama.script(Text("Answered once."))

    with table_locked(admin, table):
        sending = asyncio.create_task(bot.send("hello"))
        await store_waits_on_a_lock(url, admin)
        assert terminate_store_connections(url, admin) >= 1
    await sending

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "Answered once.")
    assert [(row.role, row.text) for row in await bot.history()] == [
        ("user", "hello"),
        ("assistant", "Answered once."),
    ]
    assert len(await bot.turns()) == 1
    assert len(bot.ollama.requests) == 1


@pytest.mark.postgres
async def test_a_connection_terminated_while_recording_the_reply_keeps_it_whole(
    make_bot: BotFactory, postgres: tuple[str, Engine], closing: list[Store]
) -> None:
    url, admin = postgres
    bot = make_bot(bot_store=await open_store(url, QUICK, closing))
    bot.ollama.script(Text("Half"), Pause("mid"), Text(" and whole."))

    await bot.send("go")
    await first_frame(bot, "Half")
    with table_locked(admin, "turns"):  # the reply's own record waits on it
        bot.ollama.release("mid")
        await store_waits_on_a_lock(url, admin)
        assert terminate_store_connections(url, admin) >= 1

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "Half and whole.")
    rows = await bot.history()
    assert [(row.role, row.text, row.partial) for row in rows] == [
        ("user", "go", False),
        ("assistant", "Half and whole.", False),
    ], "replayed, the reply is one message, not two"
    (turn,) = await bot.turns()
    assert turn.status == "done"


# -- input no backend refuses -----------------------------------------------------------------


async def test_invalid_utf8_and_nul_are_stored_and_answered(
    make_bot: BotFactory, database_url: str, closing: list[Store]
) -> None:
    @tool()
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value\x00of {key}"

    bot = make_bot(bot_store=await open_store(database_url, QUICK, closing), tools=[lookup])
    bot.ollama.script(ToolCall("lookup", {"key": "k\x00\udcff"}))
    bot.ollama.script(Text("caf\x00é ok"))

    await bot.send("caf\udce9 \x00end")  # a terminal's undecodable byte, and a NUL

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text) == (Outcome.DONE, "café ok")
    rows = await bot.history()
    assert rows[0].text == "caf\ufffd end"
    assert rows[1].tool_calls == [{"id": "c1", "name": "lookup", "arguments": {"key": "k\ufffd"}}]
    assert rows[2].text == "valueof k\ufffd"
    assert rows[3].text == reply.text


async def test_names_longer_than_their_column_are_cut_not_refused(
    make_bot: BotFactory, database_url: str, closing: list[Store]
) -> None:
    bot = make_bot(bot_store=await open_store(database_url, QUICK, closing))
    bot.ollama.script(ToolCall("t" * 500, {}))
    bot.ollama.script(Text("No such tool, then."))

    await bot.send("go", author="a" * 1000)

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.DONE
    rows = await bot.history()
    assert rows[2].tool_name == "t" * 100


# -- how many transactions -----------------------------------------------------------------------


async def test_a_turn_takes_three_transactions_besides_the_saves_of_its_frames(
    make_bot: BotFactory, store: Store
) -> None:
    """Message recorded; turn started (with the person's message); reply stored with the turn's
    ending. Other writes only save what a frame shows (coalesced to the frame interval) and the
    ids of the messages the reply posted, and may share a transaction with the ending. After
    the last edit, one more: what the platform shows (so a crash before it is made good at the
    next start). (A conversation's first turn in a process also reads its history once.)"""
    bot = make_bot(channel=RecordingChannel(frame_interval=60))
    bot.ollama.script(Text("First."))
    bot.ollama.script(Text("Hello"), Pause("mid"), Text(" there."))
    await bot.send("to begin with")
    await bot.runner.wait_idle(PLACE)
    await bot.turns()  # queued after the first turn's last write, on SQLite's one thread
    transactions: list[list[str]] = []

    def began(connection: object) -> None:
        transactions.append([])

    def statement(connection: object, cursor: object, sql: str, *_: object) -> None:
        transactions[-1].append(" ".join(sql.split()[:3]))

    event.listen(Engine, "begin", began)
    event.listen(Engine, "before_cursor_execute", statement)
    try:
        await bot.send("hi")
        await bot.channel.wait_until(lambda: bot.channel.replies[-1].shown == "Hello")
        bot.ollama.release("mid")
        reply = (await bot.channel.finished(2))[-1]
        await bot.runner.wait_idle(PLACE)
        await bot.turns()
    finally:
        event.remove(Engine, "begin", began)
        event.remove(Engine, "before_cursor_execute", statement)

    assert reply.text == "Hello there."
    claim, start, *rest = transactions
    writes = [w for w in ([s for s in each if not s.startswith("SELECT")] for each in rest) if w]
    assert claim == ["INSERT INTO inbound_events"]
    assert start == ["INSERT INTO turns", "INSERT INTO messages"]
    frame_or_posted = {"INSERT INTO messages", "UPDATE turns SET"}
    assert all(set(each) <= frame_or_posted for each in writes)
    statements = [statement for each in writes for statement in each]
    assert "INSERT INTO messages" in statements, "the reply, with the ending"
    assert statements[-2:] == ["UPDATE turns SET"] * 2, "the ending, then what the platform shows"
    assert len(writes) <= 4, "at most: the frame's save, the message id, the ending, the showing"
