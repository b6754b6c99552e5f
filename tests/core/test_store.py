"""The store on SQLite and, when KAIWA_TEST_POSTGRES_URL is set, on PostgreSQL: same code."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel

from core.errors import StoreError
from core.messages import AssistantMessage, ToolCall, ToolResult, ToolStatus, Usage, UsageTotals
from core.schema import MIGRATIONS, SCHEMA_HEAD
from core.store import INTERRUPTED, Store, history_wire
from tests.conftest import postgres_url


def _postgres_schema_url(base: str) -> Iterator[str]:
    """A throwaway schema per test, so runs never see each other's rows."""
    schema = f"kaiwa_test_{uuid.uuid4().hex[:10]}"
    engine = create_engine(base)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the PostgreSQL store tests")
    yield from _postgres_schema_url(base)


@pytest.fixture
def any_store(database_url: str) -> Iterator[Store]:
    opened = Store(database_url)
    yield opened
    opened.close()


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


def test_reopening_a_migrated_database_keeps_rows(database_url: str) -> None:
    first = Store(database_url)
    conversation = first.open_conversation("terminal:local", "assistant", "Be kind.")
    first.close()

    second = Store(database_url)
    try:
        again = second.active_conversation("terminal:local")
        assert again is not None
        assert (again.id, again.system_prompt) == (conversation.id, "Be kind.")
    finally:
        second.close()


def test_inbound_events_are_unique_per_platform(any_store: Store) -> None:
    assert any_store.record_inbound("telegram", "1", "telegram:5") is not None
    assert any_store.record_inbound("telegram", "1", "telegram:5") is None
    assert any_store.record_inbound("slack", "1", "slack:x") is not None
    assert any_store.inbound_status("telegram", "1") == "received"


def test_a_conversation_round_trip(any_store: Store) -> None:
    conversation = any_store.open_conversation("test:place", "assistant", "System.")
    assert conversation.id is not None
    turn_id = any_store.start_turn(conversation.id, "person", "what time is it?", "ann")
    call = ToolCall("c1", "current_time", {"timezone": "UTC"})
    totals = UsageTotals()
    totals.add(Usage(prompt_tokens=10, output_tokens=4, seconds=0.5))
    checking = AssistantMessage("Checking.", "hm", (call,))
    any_store.save_assistant_message(conversation.id, turn_id, checking, None, usage=totals)
    any_store.add_tool_result(conversation.id, turn_id, ToolResult(call, "noon", ToolStatus.OK))
    partial = any_store.save_assistant_message(
        conversation.id, turn_id, AssistantMessage("It is", partial=True), None
    )
    stopped = AssistantMessage("It is noon", partial=True, stopped=True)
    assert any_store.save_assistant_message(conversation.id, turn_id, stopped, partial) == partial
    any_store.finish_turn(turn_id, "stopped", stop_reason="user")

    wire = history_wire(any_store.history(conversation.id))
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
        {"role": "assistant", "content": "It is noon"},
    ]
    last = any_store.history(conversation.id)[-1]
    assert (last.partial, last.stopped, last.thinking) == (True, True, "")
    turn = any_store.turn(turn_id)
    assert (turn.status, turn.stop_reason, turn.model_calls, turn.prompt_tokens) == (
        "stopped",
        "user",
        1,
        10,
    )
    assert turn.ended_at is not None


def test_closing_a_conversation_makes_room_for_a_new_one(any_store: Store) -> None:
    old = any_store.open_conversation("test:place", "assistant", "Old.")
    assert old.id is not None
    any_store.close_conversation(old.id)
    assert any_store.active_conversation("test:place") is None
    new = any_store.open_conversation("test:place", "assistant", "New.")
    assert any_store.active_conversation("test:place") == new


def test_sqlite_runs_in_wal_mode(store: Store, sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        engine.dispose()


def test_turns_left_running_by_a_dead_process_are_marked_interrupted(any_store: Store) -> None:
    conversation = any_store.open_conversation("test:place", "assistant", "System.")
    assert conversation.id is not None
    crashed = any_store.start_turn(conversation.id, "person", "hi", None)
    finished = any_store.start_turn(conversation.id, "person", "hi", None)
    any_store.finish_turn(finished, "done")

    assert any_store.close_interrupted_turns() == 1

    assert (any_store.turn(crashed).status, any_store.turn(crashed).error) == (
        "interrupted",
        INTERRUPTED,
    )
    assert any_store.turn(finished).status == "done"


def test_an_unreachable_database_is_one_clear_error_without_the_password() -> None:
    url = "postgresql+psycopg://kaiwa:hunter2@127.0.0.1:9/kaiwa"
    with pytest.raises(StoreError, match=r"cannot open the database .*kaiwa:\*\*\*@") as caught:
        Store(url)
    assert "hunter2" not in str(caught.value)
    assert "[storage].database_url_env" in str(caught.value)
