"""The store on SQLite and, when KAIWA_TEST_POSTGRES_URL is set, on PostgreSQL: same code."""

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel

from core.agent.messages import (
    AssistantMessage,
    ToolCall,
    ToolResult,
    ToolStatus,
    Usage,
    UsageTotals,
)
from core.errors import StoreError
from core.features.schedule.timing import aware
from core.store import (
    CompactionRecord,
    Inbound,
    RunStart,
    Store,
    StoreSettings,
    TurnStart,
    TurnState,
)
from core.store.history import history_wire
from core.store.schema import MIGRATIONS, SCHEMA_HEAD
from core.store.tables import utc_now


@pytest.fixture
async def any_store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url)
    yield opened
    await opened.close()


def test_migrations_match_the_tables(any_store: Store, database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            differences = compare_metadata(
                MigrationContext.configure(connection), SQLModel.metadata
            )
    finally:
        engine.dispose()
    assert differences == []


def test_schema_head_is_the_newest_migration() -> None:
    scripts = ScriptDirectory.from_config(_alembic_config())
    assert scripts.get_current_head() == SCHEMA_HEAD


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


async def test_reopening_a_migrated_database_keeps_rows(database_url: str) -> None:
    first = await Store.open(database_url)
    conversation = await first.open_conversation("terminal:local", "assistant", "Be kind.")
    await first.close()

    second = await Store.open(database_url)
    try:
        again = await second.active_conversation("terminal:local")
        assert again is not None
        assert (again.id, again.system_prompt) == (conversation.id, "Be kind.")
    finally:
        await second.close()


async def test_inbound_events_are_unique_per_platform(any_store: Store) -> None:
    first = await any_store.claim_inbound(
        Inbound("telegram", "1", "telegram:5", "hi", "ann", "turn")
    )
    again = await any_store.claim_inbound(Inbound("telegram", "1", "telegram:5", "hi"))
    other = await any_store.claim_inbound(Inbound("slack", "1", "slack:x", "hi"))
    assert first.fresh and other.fresh and first.event_id != other.event_id
    assert (again.fresh, again.event_id) == (False, first.event_id)
    assert await any_store.inbound_status("telegram", "1") == "turn"


async def test_a_redelivery_of_a_message_no_turn_took_up_can_be_taken_over_once(
    any_store: Store,
) -> None:
    first = await any_store.claim_inbound(Inbound("t", "1", "t:5", "hi", "ann", "turn"))
    again = await any_store.claim_inbound(Inbound("t", "1", "t:5", "hi"))
    assert (again.fresh, again.answered) == (False, False)
    assert await any_store.unanswered_messages() != []

    assert await any_store.take_over(again.event_id, again.token)
    assert not await any_store.take_over(again.event_id, again.token), "one taker wins"
    start = TurnStart(
        "t:5", "assistant", "System.", "person", "hi", inbound_event_id=first.event_id
    )
    await any_store.start_turn(start)
    later = await any_store.claim_inbound(Inbound("t", "1", "t:5", "hi"))
    assert later.answered, "a turn took it up"
    assert await any_store.unanswered_messages() == []


async def test_a_conversation_round_trip(any_store: Store) -> None:
    started = await any_store.start_turn(
        TurnStart("test:place", "assistant", "System.", "person", "what time is it?", "ann")
    )
    conversation_id, turn_id = started.conversation_id, started.turn_id
    call = ToolCall("c1", "current_time", {"timezone": "UTC"})
    totals = UsageTotals()
    totals.add(Usage(prompt_tokens=10, output_tokens=4, seconds=0.5))
    checking = AssistantMessage("Checking.", "hm", (call,))
    await any_store.record_turn(
        conversation_id, turn_id, messages=[(1, checking)], state=TurnState(usage=totals)
    )
    result = ToolResult(call, "noon", ToolStatus.OK)
    partial = AssistantMessage("It is", partial=True)
    await any_store.record_turn(conversation_id, turn_id, messages=[(2, result), (3, partial)])
    stopped = AssistantMessage("It is noon", partial=True, stopped=True)
    ending = TurnState("stopped", totals, stop_reason="user", ended_at=utc_now())
    await any_store.record_turn(conversation_id, turn_id, messages=[(3, stopped)], state=ending)

    wire = history_wire(await any_store.history(conversation_id))
    assert wire == [
        {"role": "user", "content": "what time is it?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"function": {"name": "current_time", "arguments": {"timezone": "UTC"}}}
            ],
        },
        {"role": "tool", "content": "noon", "tool_name": "current_time"},
        {
            "role": "assistant",
            "content": "It is noon\n\n[This reply was cut off here: the person stopped it.]",
        },
    ]
    last = (await any_store.history(conversation_id))[-1]
    assert (last.partial, last.stopped, last.thinking) == (True, True, "")
    turn = await any_store.turn(turn_id)
    assert (turn.status, turn.stop_reason, turn.model_calls, turn.prompt_tokens) == (
        "stopped",
        "user",
        1,
        10,
    )
    assert turn.ended_at is not None


async def test_a_conversation_reads_back_from_its_latest_compaction(any_store: Store) -> None:
    """Only what the model is sent is read (the messages from the first one kept on), while
    every message stays stored and the turns are counted in full."""
    place = "test:long"
    first = await any_store.start_turn(TurnStart(place, "a", "System.", "person", "one"))
    conversation_id = first.conversation_id
    await any_store.record_turn(
        conversation_id, first.turn_id, messages=[(1, AssistantMessage("Answer one."))]
    )
    second = await any_store.start_turn(
        TurnStart(place, "a", "System.", "person", "two", conversation_id=conversation_id)
    )
    kept_from_answer = CompactionRecord(None, 1, "They said one.", "summary", 900, 300)
    await any_store.record_turn(
        conversation_id,
        second.turn_id,
        messages=[(1, AssistantMessage("Answer two."))],
        compaction=kept_from_answer,
    )

    stored = await any_store.conversation_of(place)

    assert stored.compaction is not None and stored.compaction.summary == "They said one."
    assert [row.text for row in stored.messages] == ["Answer two."]
    assert (stored.turns, stored.compactions, set(stored.endings)) == (2, 1, {second.turn_id})
    assert len(await any_store.history(conversation_id)) == 4


async def test_closing_a_conversation_makes_room_for_a_new_one(any_store: Store) -> None:
    old = await any_store.open_conversation("test:place", "assistant", "Old.")
    assert old.id is not None
    await any_store.close_conversation(old.id)
    assert await any_store.active_conversation("test:place") is None
    new = await any_store.open_conversation("test:place", "assistant", "New.")
    assert await any_store.active_conversation("test:place") == new


async def test_sqlite_runs_in_wal_mode(store: Store, sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        engine.dispose()


async def test_turns_left_running_by_a_dead_process_are_marked_interrupted(
    any_store: Store,
) -> None:
    start = TurnStart("test:place", "assistant", "System.", "person", "hi")
    crashed = await any_store.start_turn(start)
    again = replace(start, conversation_id=crashed.conversation_id)
    finished = await any_store.start_turn(again)
    done = TurnState("done", ended_at=utc_now())
    await any_store.record_turn(finished.conversation_id, finished.turn_id, state=done)

    (unfinished,) = await any_store.unfinished_turns()
    assert unfinished.turn.id == crashed.turn_id
    assert [m.text for m in unfinished.messages] == ["hi"]
    await any_store.close_interrupted(unfinished, "the process ended")

    turn = await any_store.turn(crashed.turn_id)
    assert (turn.status, turn.error) == ("interrupted", "the process ended")
    assert (await any_store.turn(finished.turn_id)).status == "done"
    assert await any_store.unfinished_turns() == []


async def test_a_replys_posts_recorded_as_they_happen_make_an_unsure_delivery_known(
    any_store: Store,
) -> None:
    """A reply that may have posted (`unsure`) is `pending` once its posts' ids are stored, so
    a restart edits them instead of asking the person to send their message again."""
    started = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "hi"))
    ended = TurnState("done", ended_at=utc_now(), delivery="unsure")
    await any_store.record_turn(started.conversation_id, started.turn_id, state=ended)

    await any_store.record_posts(started.turn_id, ["m1", "m2"])
    turn = await any_store.turn(started.turn_id)
    assert (turn.delivery, turn.reply_ids) == ("pending", ["m1", "m2"])
    await any_store.mark_delivered(started.turn_id, "shown")
    await any_store.record_posts(started.turn_id, ["m1"])
    assert (await any_store.turn(started.turn_id)).delivery == "shown"


async def test_runs_past_a_conversations_total_are_not_stored(any_store: Store) -> None:
    """The count and the new rows are one decision, so two delegations at once cannot both
    take the last place."""
    started = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "hi"))
    conversation, turn = started.conversation_id, started.turn_id
    one = [RunStart("one", "helper", "m", "do one")]
    two = [RunStart("two", "helper", "m", "do two"), RunStart("three", "helper", "m", "do 3")]

    assert [key for _, key in await any_store.start_runs(conversation, turn, one)] == ["a1"]
    assert await any_store.start_runs(conversation, turn, two, max_total=2) == []
    assert await any_store.run_count(conversation) == 1
    assert [key for _, key in await any_store.start_runs(conversation, turn, two)] == ["a2", "a3"]


async def test_a_grant_belongs_to_the_conversation_active_in_its_place(any_store: Store) -> None:
    started = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "hi"))
    grant = {"tool": "fetch_url", "granted_by": "Ann", "created_at": utc_now()}

    await any_store.add_grant("t:p", grant)
    await any_store.add_grant("t:p", {**grant, "granted_by": "Bob"})  # granted already
    assert [(g.tool, g.granted_by) for g in await any_store.grants("t:p")] == [("fetch_url", "Ann")]
    assert await any_store.grants("t:other") == []
    await any_store.close_conversation(started.conversation_id)
    assert await any_store.grants("t:p") == [], "a new conversation starts without it"
    assert await any_store.revoke_grants("t:p") == 0


async def test_closing_an_interrupted_turn_answers_its_tool_calls(any_store: Store) -> None:
    started = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "search"))
    calls = (ToolCall("c1", "search", {"q": "x"}), ToolCall("c2", "fetch", {}))
    asked = AssistantMessage("Looking.", tool_calls=calls)
    done = ToolResult(calls[0], "found", ToolStatus.OK)
    conversation = started.conversation_id
    await any_store.record_turn(conversation, started.turn_id, messages=[(1, asked), (2, done)])
    (unfinished,) = await any_store.unfinished_turns()

    await any_store.close_interrupted(unfinished, "the process ended")

    rows = await any_store.history(conversation)
    assert [(r.role, r.tool_call_id, r.tool_status) for r in rows] == [
        ("user", None, None),
        ("assistant", None, None),
        ("tool", "c1", "ok"),
        ("tool", "c2", "interrupted"),
    ]
    assert "Kaiwa restarted while 'fetch' was running" in rows[-1].text


async def test_an_unreachable_database_is_one_clear_error_without_the_password() -> None:
    url = "postgresql+psycopg://kaiwa:hunter2@127.0.0.1:9/kaiwa"
    with pytest.raises(StoreError, match=r"cannot open the database .*kaiwa:\*\*\*@") as caught:
        await Store.open(url)
    assert "hunter2" not in str(caught.value)
    assert "[storage].database_url_env" in str(caught.value)


@pytest.mark.parametrize("level", ["NORMAL", "FULL"])
async def test_sqlite_durability_is_the_setting(sqlite_url: str, level: str) -> None:
    store = await Store.open(sqlite_url, StoreSettings(sqlite_synchronous=level))
    try:
        described = await store.describe()
    finally:
        await store.close()
    assert described.endswith(f"(wal, synchronous {level})")


async def test_statement_logs_never_show_what_people_wrote(
    any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator who turns on SQLAlchemy's statement log sees statements, not parameters."""
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"):
        await any_store.claim_inbound(Inbound("test", "1", "test:place", "my secret plan"))
    assert any("parameters hidden" in record.getMessage() for record in caplog.records)
    assert not any("my secret plan" in record.getMessage() for record in caplog.records)


def upgrade_to(database_url: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql("PRAGMA foreign_keys = ON")  # as the store has it
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


async def test_a_database_with_rows_upgrades_to_the_newest_schema(database_url: str) -> None:
    """Migration 0005 changes columns of `turns`, which SQLite does by copying the table while
    messages point at it: with foreign keys enforced that failed on every database with rows."""
    upgrade_to(database_url, "0004")
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO conversations (id, place, agent, system_prompt, created_at) "
                    "VALUES (1, 'test:old', 'a', 'System.', CURRENT_TIMESTAMP)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO turns (id, conversation_id, provenance, attempt, status, "
                    "model_calls, prompt_tokens, output_tokens, model_seconds, started_at) "
                    "VALUES (1, 1, 'person', 1, 'done', 1, 10, 5, 0.1, CURRENT_TIMESTAMP)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO messages (conversation_id, turn_id, seq, role, text, thinking, "
                    "partial, stopped, created_at, updated_at) VALUES (1, 1, 0, 'user', 'hi', '', "
                    "false, false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        engine.dispose()

    store = await Store.open(database_url)
    try:
        stored = await store.conversation_of("test:old")
        (turn,) = await store.turns(1)
    finally:
        await store.close()

    assert [row.text for row in stored.messages] == ["hi"]
    assert (turn.prompt_tokens, turn.wrapped_up) == (10, False)


async def test_a_task_slot_is_claimed_once_however_many_claim_it(any_store: Store) -> None:
    """Schedulers that read the same row race for its slot: one moves `next_run` on and gets
    the run; the others, and a claim of the same slot after a restart, get None."""
    slot, following = datetime(2026, 12, 1, 8, tzinfo=UTC), datetime(2026, 12, 2, 8, tzinfo=UTC)
    task = await any_store.create_task(_task("t:p", slot))
    assert task.id is not None
    run = _running(slot)

    claims = await asyncio.gather(
        *(any_store.claim_slot(task.id, slot, run, (slot, following)) for _ in range(5))
    )
    again = await any_store.claim_slot(task.id, slot, run)

    assert sum(claim is not None for claim in claims) == 1 and again is None
    stored = await any_store.task(task.id)
    assert stored is not None and stored.next_run is not None
    assert aware(stored.next_run) == following
    (claimed,) = await any_store.task_runs(task.id)
    assert claimed.outcome == "running"
    await any_store.update_task(task.id, {"cancelled_at": slot})
    assert await any_store.tasks() == []


def _task(place: str, slot: datetime) -> dict[str, Any]:
    return {
        "platform": "t",
        "place": place,
        "agent": "assistant",
        "name": "digest",
        "prompt": "the digest",
        "cron": "0 8 * * *",
        "timezone": "UTC",
        "misfire": "once",
        "enabled": True,
        "consecutive_failures": 0,
        "created_by": "ann",
        "created_at": slot,
        "next_run": slot,
    }


def _running(slot: datetime) -> dict[str, Any]:
    return {"late": False, "missed_slots": 0, "outcome": "running", "started_at": slot}


async def test_messages_are_searched_within_a_space_with_wildcards_taken_literally(
    any_store: Store,
) -> None:
    for place, said in [
        ("slack:T1:C1:1.1", "ship 100% on Friday"),
        ("slack:T1:C10:2.2", "ship 100% on Friday too"),
        ("slack:T1:C1:3.3", "ship it on Monday"),
    ]:
        await any_store.start_turn(TurnStart(place, "assistant", "S.", "person", said))

    found = await any_store.search_messages("slack:T1:C1:", ["SHIP", "100%"], 10)
    assert [(m.text, place) for m, place in found] == [("ship 100% on Friday", "slack:T1:C1:1.1")]
    assert await any_store.search_messages("slack:T1:C1:", ["_"], 10) == []


def _step(what: str, status: str, result: str = "") -> dict[str, str]:
    return {
        "what": what,
        "tools": "search",
        "done_when": "found",
        "status": status,
        "result": result,
    }


def _plan(conversation_id: int, status: str, steps: list[dict[str, str]]) -> dict[str, Any]:
    now = utc_now()
    return {
        "conversation_id": conversation_id,
        "place": "t:p",
        "task": "compare three laptops",
        "status": status,
        "steps": steps,
        "created_at": now,
        "updated_at": now,
    }


async def test_a_plan_round_trip_keeps_its_steps(any_store: Store) -> None:
    started = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "/plan x"))
    added = await any_store.add_plan(
        {**_plan(started.conversation_id, "drafting", []), "turn_id": started.turn_id}
    )
    assert added.id is not None
    assert (added.steps, added.rounds, added.provenance, added.review) == ([], 0, "person", None)

    steps = [_step("find them", "done", "three found"), _step("compare — ✓", "waiting")]
    await any_store.update_plan(
        added.id,
        {
            "status": "running",
            "steps": steps,
            "rounds": 2,
            "review": "fine",
            "progress_message_id": "m1",
        },
    )

    stored = await any_store.plan(added.id)
    assert stored is not None
    assert (stored.status, stored.steps, stored.rounds, stored.review) == (
        "running",
        steps,
        2,
        "fine",
    )
    assert (stored.turn_id, stored.progress_message_id) == (started.turn_id, "m1")
    assert await any_store.plan(added.id + 1) is None


async def test_plans_are_read_newest_first_within_one_conversation(any_store: Store) -> None:
    first = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "hi"))
    other = await any_store.start_turn(TurnStart("t:q", "a", "S.", "person", "hi"))
    ids = [
        (await any_store.add_plan(_plan(first.conversation_id, "done", []))).id for _ in range(3)
    ]
    await any_store.add_plan(_plan(other.conversation_id, "done", []))

    assert [plan.id for plan in await any_store.plans(first.conversation_id, 2)] == ids[:0:-1]
    assert len(await any_store.plans(other.conversation_id, 10)) == 1


async def test_unfinished_plans_are_interrupted_with_their_steps_ended(any_store: Store) -> None:
    conversation = await any_store.start_turn(TurnStart("t:p", "a", "S.", "person", "hi"))
    running = [_step("one", "done", "ok"), _step("two", "running"), _step("three", "waiting")]
    unfinished = {
        status: await any_store.add_plan(_plan(conversation.conversation_id, status, steps))
        for status, steps in [
            ("drafting", []),
            ("reviewing", []),
            ("awaiting_person", [_step("one", "waiting")]),
            ("running", running),
        ]
    }
    ended = {
        status: await any_store.add_plan(_plan(conversation.conversation_id, status, steps))
        for status, steps in [
            ("done", [_step("one", "done")]),
            ("failed", [_step("one", "failed")]),
        ]
    }
    now = utc_now() + timedelta(seconds=1)

    closed = await any_store.close_unfinished_plans(now)

    assert [plan.id for plan in closed] == [plan.id for plan in unfinished.values()]
    assert {plan.status for plan in closed} == {"interrupted"}
    assert [step["status"] for step in closed[-1].steps] == ["done", "stopped", "not_run"]
    assert [step["status"] for step in closed[2].steps] == ["not_run"]
    assert closed[-1].steps[0]["result"] == "ok"
    for plan in ended.values():
        assert plan.id is not None
        assert await any_store.plan(plan.id) == plan, "an ended plan is left as it was"
    again = await any_store.plan(closed[-1].id or 0)
    assert again is not None and (again.status, again.steps) == ("interrupted", closed[-1].steps)
    assert again.updated_at is not None and aware(again.updated_at) == now
    assert await any_store.close_unfinished_plans(utc_now()) == []


# -- one place at a time: what a worker taking a place over reads and closes ---------------------


async def test_the_inbox_keeps_the_authors_platform_id(any_store: Store) -> None:
    await any_store.claim_inbound(
        Inbound("t", "1", "t:p", "hi", "Ann", "turn", author_id="U42" + "9" * 300)
    )
    await any_store.claim_inbound(Inbound("t", "2", "t:p", "hi again", "Ann", "turn"))

    first, second = await any_store.queued_messages("t:p")

    assert (first.author, first.author_id) == ("Ann", "U42" + "9" * 197), "cut to its column"
    assert (second.author, second.author_id) == ("Ann", None)


async def _message(store: Store, number: int, place: str, status: str = "turn") -> int:
    claim = await store.claim_inbound(Inbound("t", str(number), place, f"m{number}", None, status))
    return claim.event_id


async def test_queued_messages_are_a_places_untaken_ones_oldest_first(any_store: Store) -> None:
    first = await _message(any_store, 1, "t:a")
    taken = await _message(any_store, 2, "t:a")
    await any_store.start_turn(TurnStart("t:a", "a", "S.", "person", "m2", inbound_event_id=taken))
    await _message(any_store, 3, "t:a", "command")
    await _message(any_store, 4, "t:a", "dropped")
    elsewhere = await _message(any_store, 5, "t:b")
    last = await _message(any_store, 6, "t:a")

    assert [event.id for event in await any_store.queued_messages("t:a")] == [first, last]
    assert [event.text for event in await any_store.queued_messages("t:a")] == ["m1", "m6"]
    assert [event.id for event in await any_store.queued_messages("t:b")] == [elsewhere]
    assert await any_store.queued_messages("t:nothing") == []


async def test_places_waiting_are_those_with_untaken_messages_or_running_turns(
    any_store: Store,
) -> None:
    await _message(any_store, 1, "t:queued")
    await any_store.start_turn(TurnStart("t:running", "a", "S.", "person", "hi"))
    await _message(any_store, 2, "t:both")
    await _message(any_store, 3, "t:both")
    await any_store.start_turn(TurnStart("t:both", "a", "S.", "person", "hi"))
    answered = await _message(any_store, 4, "t:answered")
    done = await any_store.start_turn(
        TurnStart("t:answered", "a", "S.", "person", "m4", inbound_event_id=answered)
    )
    ended = TurnState("done", ended_at=utc_now())
    await any_store.record_turn(done.conversation_id, done.turn_id, state=ended)
    await _message(any_store, 5, "t:command", "command")

    assert await any_store.places_waiting() == ["t:both", "t:queued", "t:running"]


async def test_unfinished_turns_of_one_place_leave_other_places_alone(any_store: Store) -> None:
    mine = await any_store.start_turn(TurnStart("t:a", "a", "S.", "person", "mine"))
    assert mine.conversation_id is not None
    await any_store.close_conversation(mine.conversation_id)  # still the place's turn
    later = await any_store.start_turn(TurnStart("t:a", "a", "S.", "person", "later"))
    other = await any_store.start_turn(TurnStart("t:b", "a", "S.", "person", "other"))

    found = await any_store.unfinished_turns("t:a")

    assert [(u.turn.id, u.place) for u in found] == [(mine.turn_id, "t:a"), (later.turn_id, "t:a")]
    assert [u.turn.id for u in await any_store.unfinished_turns("t:b")] == [other.turn_id]
    assert len(await any_store.unfinished_turns()) == 3


async def test_closing_one_places_task_runs_leaves_other_places_alone(any_store: Store) -> None:
    slot = datetime(2026, 12, 1, 8, tzinfo=UTC)
    runs = {}
    for place in ("t:a", "t:b"):
        task = await any_store.create_task(_task(place, slot))
        assert task.id is not None
        await any_store.claim_slot(task.id, slot, _running(slot))
        runs[place] = task.id

    assert await any_store.close_unfinished_task_runs("t:a") == 1

    (closed,) = await any_store.task_runs(runs["t:a"])
    (left,) = await any_store.task_runs(runs["t:b"])
    assert (closed.outcome, left.outcome) == ("interrupted", "running")
    assert await any_store.close_unfinished_task_runs("t:a") == 0
    assert await any_store.close_unfinished_task_runs() == 1


async def test_closing_one_places_plans_leaves_and_reads_back_no_other_place(
    any_store: Store,
) -> None:
    """Both are closed at the same `now`: the read-back of one place's must not return the
    other's, already closed ones."""
    plans = {}
    for place in ("t:a", "t:b"):
        started = await any_store.start_turn(TurnStart(place, "a", "S.", "person", "hi"))
        plan = {**_plan(started.conversation_id, "running", [_step("one", "running")])}
        plans[place] = await any_store.add_plan(plan | {"place": place})
    now = utc_now() + timedelta(seconds=1)

    (closed,) = await any_store.close_unfinished_plans(now, "t:b")
    assert closed.id == plans["t:b"].id
    left = await any_store.plan(plans["t:a"].id or 0)
    assert left is not None and left.status == "running"

    (closed,) = await any_store.close_unfinished_plans(now, "t:a")
    assert (closed.id, closed.status) == (plans["t:a"].id, "interrupted")
    assert len(await any_store.close_unfinished_plans(now)) == 2, "both, read back everywhere"


async def test_pending_approvals_of_one_place_leave_other_places_alone(any_store: Store) -> None:
    added = {}
    for place in ("t:a", "t:b", "t:a"):
        approval = await any_store.add_approval(
            {
                "turn_id": None,
                "place": place,
                "tool": "shell",
                "call": "shell(ls)",
                "asked_of": "U1",
                "asked_of_name": "Ann",
                "status": "pending",
                "created_at": utc_now(),
            }
        )
        added.setdefault(place, []).append(approval.id)

    assert [a.id for a in await any_store.pending_approvals("t:a")] == added["t:a"]
    assert [a.id for a in await any_store.pending_approvals("t:b")] == added["t:b"]
    assert len(await any_store.pending_approvals()) == 3
