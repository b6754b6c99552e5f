"""Every write stays true when its transaction is run again after its COMMIT answer was lost.

Each test makes one public store call whose COMMIT lands and is then reported lost
(`tests.core.store.replays`), so the database thread runs it a second time, and checks that the
rows and the answer are what one clean call leaves: one row, the same id, nothing left running,
no error. On SQLite and, with KAIWA_TEST_POSTGRES_URL, on PostgreSQL.
"""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from core.store import CompactionRecord, StartedTurn, Store, TurnStart
from core.store.tables import utc_now
from tests.core.store.replays import commit_answer_lost
from tests.databases import QUICK, open_store

T = TypeVar("T")
SLOT = datetime(2026, 12, 1, 8, tzinfo=UTC)


@pytest.fixture
async def store(database_url: str, closing: list[Store]) -> Store:
    return await open_store(database_url, QUICK, closing)


async def replayed(call: Callable[[], Awaitable[T]]) -> T:
    """`call`'s answer when its COMMIT lands, its answer is lost, and it is run again."""
    with commit_answer_lost() as lost:
        answer = await call()
    assert lost.happened, "the call committed, and was run again"
    return answer


async def a_turn(store: Store, place: str = "t:p") -> StartedTurn:
    return await store.start_turn(TurnStart(place, "assistant", "S.", "person", "hi"))


# -- the turn path --------------------------------------------------------------------------------


async def test_a_replayed_start_turn_writes_one_turn_and_one_conversation(store: Store) -> None:
    started = await replayed(lambda: a_turn(store))

    conversation = await store.active_conversation("t:p")
    assert conversation is not None and conversation.id == started.conversation_id
    (turn,) = await store.turns(started.conversation_id)
    assert (turn.id, turn.status) == (started.turn_id, "running")
    assert [(row.turn_id, row.text) for row in await store.history(conversation.id)] == [
        (started.turn_id, "hi")
    ]
    assert len(await store.unfinished_turns()) == 1


async def test_a_replayed_start_turn_in_an_open_conversation_writes_one_turn(
    store: Store,
) -> None:
    first = await a_turn(store)
    start = TurnStart(
        "t:p", "assistant", "S.", "person", "again", conversation_id=first.conversation_id
    )

    started = await replayed(lambda: store.start_turn(start))

    turns = await store.turns(first.conversation_id)
    assert [turn.id for turn in turns] == [first.turn_id, started.turn_id]
    texts = [row.text for row in await store.history(first.conversation_id)]
    assert texts == ["hi", "again"]


def _compaction(first_kept_turn_id: int | None = None) -> CompactionRecord:
    """A compaction keeping the messages from a turn on (None: the turn that records it)."""
    return CompactionRecord(first_kept_turn_id, 0, "They said hi.", "summary", 100, 10)


async def test_a_replayed_compaction_in_a_turn_writes_one_compaction(store: Store) -> None:
    started = await a_turn(store)

    await replayed(
        lambda: store.record_turn(
            started.conversation_id, started.turn_id, compaction=_compaction()
        )
    )

    assert [row.summary for row in await store.compactions(started.conversation_id)] == [
        "They said hi."
    ]


async def test_a_replayed_record_compaction_writes_one_compaction(store: Store) -> None:
    started = await a_turn(store)

    compaction = _compaction(started.turn_id)

    await replayed(lambda: store.record_compaction(started.conversation_id, compaction))

    assert len(await store.compactions(started.conversation_id)) == 1


async def test_a_replayed_open_conversation_opens_one(store: Store) -> None:
    opened = await replayed(lambda: store.open_conversation("t:p", "assistant", "S."))

    active = await store.active_conversation("t:p")
    assert active is not None and active.id == opened.id
    await store.close_conversation(active.id or 0)
    assert await store.active_conversation("t:p") is None, "no second one left open"


# -- notes, approvals, plans ----------------------------------------------------------------------


def _note() -> dict[str, Any]:
    return {
        "owner": "t:person:1",
        "text": "likes tea",
        "place": "t:p",
        "created_by": "Ann",
        "created_at": utc_now(),
    }


async def test_a_replayed_add_note_writes_one_note(store: Store) -> None:
    note = await replayed(lambda: store.add_note(_note()))

    assert [each.id for each in await store.notes("t:person:1")] == [note.id]


def _approval() -> dict[str, Any]:
    return {
        "turn_id": None,
        "place": "t:p",
        "tool": "shell",
        "call": "shell(ls)",
        "asked_of": "U1",
        "asked_of_name": "Ann",
        "status": "pending",
        "created_at": utc_now(),
    }


async def test_a_replayed_add_approval_writes_one_approval(store: Store) -> None:
    approval = await replayed(lambda: store.add_approval(_approval()))

    assert [each.id for each in await store.pending_approvals()] == [approval.id]


async def test_a_replayed_add_plan_writes_one_plan(store: Store) -> None:
    started = await a_turn(store)
    now = utc_now()
    plan = {
        "conversation_id": started.conversation_id,
        "place": "t:p",
        "task": "compare three laptops",
        "status": "drafting",
        "steps": [],
        "created_at": now,
        "updated_at": now,
    }

    added = await replayed(lambda: store.add_plan(plan))

    assert [each.id for each in await store.plans(started.conversation_id, 10)] == [added.id]


# -- scheduled tasks ------------------------------------------------------------------------------


def _task() -> dict[str, Any]:
    return {
        "platform": "t",
        "place": "t:p",
        "agent": "assistant",
        "name": "digest",
        "prompt": "the digest",
        "cron": "0 8 * * *",
        "timezone": "UTC",
        "misfire": "once",
        "enabled": True,
        "consecutive_failures": 0,
        "created_by": "ann",
        "created_at": SLOT,
        "next_run": SLOT,
    }


async def test_a_replayed_create_task_writes_one_task(store: Store) -> None:
    task = await replayed(lambda: store.create_task(_task()))

    assert [each.id for each in await store.tasks()] == [task.id]
