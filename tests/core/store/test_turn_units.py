"""The turn path's units, each one statement on PostgreSQL (data-modifying CTEs) and a few in one
transaction on SQLite: what each writes, read back on both backends, and, on PostgreSQL, that each
is one statement (the round trips the turn pays for a database a network hop away).

Statements are counted with SQLAlchemy's own `before_cursor_execute` event, on every engine of
the process, the way `tests.core.store.replays` listens for commits.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event

from core.agent.messages import AssistantMessage, ToolCall, ToolResult, ToolStatus, UsageTotals
from core.store import CompactionRecord, Store, TurnStart, TurnState
from core.store.tables import utc_now
from tests.databases import QUICK, open_store


@pytest.fixture
async def store(database_url: str, closing: list[Store]) -> Store:
    return await open_store(database_url, QUICK, closing)


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """The statements any engine sends to its database within the block, in order."""
    sent: list[str] = []

    def count(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", count)


async def one_statement_on_postgresql(store: Store, sent: list[str]) -> None:
    """On PostgreSQL, the call just made sent one statement (run without a transaction, so
    with no BEGIN or COMMIT either: tests/core/store/test_dbthread.py)."""
    if (await store.describe()).startswith("PostgreSQL"):
        assert len(sent) == 1, sent


async def test_starting_a_turn_opens_its_conversation_and_stores_the_persons_message(
    store: Store,
) -> None:
    with statements_sent() as sent:
        started = await store.start_turn(
            TurnStart("t:p", "assistant", "S.", "person", "hi", author="Ann")
        )
    await one_statement_on_postgresql(store, sent)

    conversation = await store.active_conversation("t:p")
    assert conversation is not None and conversation.id == started.conversation_id
    assert (conversation.agent, conversation.system_prompt) == ("assistant", "S.")
    turn = await store.turn(started.turn_id)
    assert (turn.status, turn.attempt, turn.provenance) == ("running", 1, "person")
    assert (turn.wrapped_up, turn.model_calls, turn.prompt_tokens) == (False, 0, 0)
    (said,) = await store.history(started.conversation_id)
    assert (said.turn_id, said.seq, said.role, said.text, said.author) == (
        started.turn_id,
        0,
        "user",
        "hi",
        "Ann",
    )
    assert (said.partial, said.stopped, said.tool_calls) == (False, False, None)


async def test_starting_a_turn_in_an_open_conversation_opens_none(store: Store) -> None:
    first = await store.start_turn(TurnStart("t:p", "assistant", "S.", "person", "hi"))
    again = TurnStart(
        "t:p", "assistant", "S.", "person", "again", conversation_id=first.conversation_id
    )

    with statements_sent() as sent:
        second = await store.start_turn(again)
    await one_statement_on_postgresql(store, sent)

    assert second.conversation_id == first.conversation_id
    assert [turn.id for turn in await store.turns(first.conversation_id)] == [
        first.turn_id,
        second.turn_id,
    ]
    texts = [(row.turn_id, row.text) for row in await store.history(first.conversation_id)]
    assert texts == [(first.turn_id, "hi"), (second.turn_id, "again")]


async def test_a_turns_messages_compaction_and_state_are_written_together(store: Store) -> None:
    started = await store.start_turn(TurnStart("t:p", "assistant", "S.", "person", "look"))
    call = ToolCall("c1", "search", {"q": "tea"})
    messages = [
        (1, AssistantMessage("Looking.", tool_calls=(call,))),
        (2, ToolResult(call, "green", ToolStatus.OK)),
        (3, AssistantMessage("Green tea.")),
    ]
    compaction = CompactionRecord(None, 0, "They asked.", "summary", 100, 10)
    usage = UsageTotals(model_calls=2, prompt_tokens=30, output_tokens=7, seconds=0.5)
    ending = TurnState("done", usage, ended_at=utc_now(), delivery="pending")

    with statements_sent() as sent:
        await store.record_turn(
            started.conversation_id,
            started.turn_id,
            messages=messages,
            state=ending,
            compaction=compaction,
        )
    await one_statement_on_postgresql(store, sent)

    rows = await store.history(started.conversation_id)
    assert [(row.seq, row.role, row.text) for row in rows] == [
        (0, "user", "look"),
        (1, "assistant", "Looking."),
        (2, "tool", "green"),
        (3, "assistant", "Green tea."),
    ]
    assert rows[1].tool_calls == [{"id": "c1", "name": "search", "arguments": {"q": "tea"}}]
    (compacted,) = await store.compactions(started.conversation_id)
    assert (compacted.turn_id, compacted.first_kept_turn_id) == (started.turn_id,) * 2
    turn = await store.turn(started.turn_id)
    assert (turn.status, turn.model_calls, turn.prompt_tokens, turn.delivery) == (
        "done",
        2,
        30,
        "pending",
    )


async def test_a_message_saved_twice_in_one_write_keeps_the_last(store: Store) -> None:
    """Regression: PostgreSQL refuses an upsert that changes one row twice ("ON CONFLICT DO
    UPDATE command cannot affect row a second time"), so a write naming one `seq` twice failed
    there once the messages became one statement."""
    started = await store.start_turn(TurnStart("t:p", "assistant", "S.", "person", "hi"))
    draft, final = AssistantMessage("Hel", partial=True), AssistantMessage("Hello.")

    await store.record_turn(
        started.conversation_id, started.turn_id, messages=[(1, draft), (1, final)]
    )

    rows = await store.history(started.conversation_id)
    assert [(row.seq, row.text, row.partial) for row in rows] == [
        (0, "hi", False),
        (1, "Hello.", False),
    ]


async def test_a_message_saved_again_is_replaced_and_the_rest_kept(store: Store) -> None:
    started = await store.start_turn(TurnStart("t:p", "assistant", "S.", "person", "hi"))
    ids = started.conversation_id, started.turn_id
    await store.record_turn(*ids, messages=[(1, AssistantMessage("It", partial=True))])
    first = (await store.history(started.conversation_id))[-1]

    await store.record_turn(*ids, messages=[(1, AssistantMessage("It is noon."))])
    await store.record_turn(*ids, state=TurnState("done", ended_at=utc_now()))

    rows = await store.history(started.conversation_id)
    assert [(row.id, row.text, row.partial) for row in rows[1:]] == [
        (first.id, "It is noon.", False)
    ]
    assert rows[1].created_at == first.created_at, "kept from the first save"
    assert (await store.turn(started.turn_id)).status == "done"


async def test_what_the_platform_shows_is_one_statement(store: Store) -> None:
    started = await store.start_turn(TurnStart("t:p", "assistant", "S.", "person", "hi"))
    ending = TurnState("done", ended_at=utc_now(), delivery="pending")
    await store.record_turn(started.conversation_id, started.turn_id, state=ending)

    with statements_sent() as sent:
        await store.mark_delivered(started.turn_id, "shown", ["m1"])
    await one_statement_on_postgresql(store, sent)

    turn = await store.turn(started.turn_id)
    assert (turn.delivery, turn.reply_ids) == ("shown", ["m1"])
    assert await store.undelivered_turns() == []
