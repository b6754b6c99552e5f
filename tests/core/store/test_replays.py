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

from core.agent.messages import AssistantMessage, ToolCall
from core.store import (
    CompactionRecord,
    Inbound,
    RunStart,
    StartedTurn,
    Store,
    TurnStart,
    TurnState,
)
from core.store.tables import utc_now
from tests.core.store.replays import commit_answer_lost
from tests.databases import QUICK, open_store

T = TypeVar("T")
SLOT = datetime(2026, 12, 1, 8, tzinfo=UTC)
FOLLOWING = datetime(2026, 12, 2, 8, tzinfo=UTC)


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


async def test_a_replayed_record_turn_writes_its_messages_compaction_and_state_once(
    store: Store,
) -> None:
    """The reply's records and the turn's ending, one statement on PostgreSQL, run twice."""
    started = await a_turn(store)
    said = [(1, AssistantMessage("Looking.")), (2, AssistantMessage("Found it."))]
    ending = TurnState("done", ended_at=utc_now(), delivery="pending")

    await replayed(
        lambda: store.record_turn(
            started.conversation_id,
            started.turn_id,
            messages=said,
            state=ending,
            compaction=_compaction(),
        )
    )

    rows = await store.history(started.conversation_id)
    assert [(row.seq, row.text) for row in rows] == [(0, "hi"), (1, "Looking."), (2, "Found it.")]
    assert len(await store.compactions(started.conversation_id)) == 1
    assert (await store.turn(started.turn_id)).status == "done"
    assert await store.unfinished_turns() == []


async def test_a_replayed_close_interrupted_answers_each_call_once(store: Store) -> None:
    started = await a_turn(store)
    asked = AssistantMessage("Looking.", tool_calls=(ToolCall("c1", "search", {}),))
    await store.record_turn(started.conversation_id, started.turn_id, messages=[(1, asked)])
    (unfinished,) = await store.unfinished_turns()

    await replayed(lambda: store.close_interrupted(unfinished, "the process ended"))

    rows = await store.history(started.conversation_id)
    assert [(row.role, row.tool_status) for row in rows] == [
        ("user", None),
        ("assistant", None),
        ("tool", "interrupted"),
    ]
    assert (await store.turn(started.turn_id)).status == "interrupted"


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


async def test_a_replayed_take_over_still_wins(store: Store) -> None:
    inbound = Inbound("t", "m1", "t:p", "hello", status="turn")
    await store.claim_inbound(inbound)
    redelivered = await store.claim_inbound(inbound)
    assert not redelivered.answered

    assert await replayed(lambda: store.take_over(redelivered.event_id, redelivered.token))
    assert not await store.take_over(redelivered.event_id, redelivered.token), "one taker"


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


async def test_a_replayed_forget_note_still_says_it_forgot(store: Store) -> None:
    note = await store.add_note(_note())

    assert await replayed(lambda: store.forget_note("t:person:1", note.id or 0))
    assert await store.notes("t:person:1") == []


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


async def test_a_replayed_decide_approval_still_wins(store: Store) -> None:
    approval = await store.add_approval(_approval())
    assert approval.id is not None
    decision = {"status": "allowed", "decided_by": "U1", "decided_at": utc_now()}

    assert await replayed(lambda: store.decide_approval(approval.id or 0, decision))
    stored = await store.approval(approval.id)
    assert stored is not None and (stored.status, stored.decided_by) == ("allowed", "U1")
    assert not await store.decide_approval(approval.id, {"status": "denied"}), "first wins"


async def test_a_replayed_revoke_grants_counts_what_it_revoked(store: Store) -> None:
    await a_turn(store)
    for tool in ("shell", "fetch_url"):
        await store.add_grant("t:p", {"tool": tool, "granted_by": "Ann", "created_at": utc_now()})

    assert await replayed(lambda: store.revoke_grants("t:p")) == 2
    assert await store.grants("t:p") == []


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


# -- sub-agent runs -------------------------------------------------------------------------------


async def test_a_replayed_start_runs_returns_its_runs_once(store: Store) -> None:
    started = await a_turn(store)
    runs = [RunStart("one", "helper", "m", "do one"), RunStart("two", "helper", "m", "do two")]

    stored = await replayed(
        lambda: store.start_runs(started.conversation_id, started.turn_id, runs, max_total=2)
    )

    assert [key for _, key in stored] == ["a1", "a2"]
    rows = await store.runs(started.conversation_id)
    assert [(row.id, row.key) for row in rows] == stored


async def test_a_replayed_record_run_keeps_one_transcript(store: Store) -> None:
    started = await a_turn(store)
    ((run_id, _),) = await store.start_runs(
        started.conversation_id, started.turn_id, [RunStart("one", "helper", "m", "do one")]
    )
    said = [(0, "user", "do one", None, None), (1, "assistant", "done", None, None)]

    await replayed(lambda: store.record_run(run_id, messages=said, values={"status": "done"}))

    assert [(row.seq, row.text) for row in await store.transcript(run_id)] == [
        (0, "do one"),
        (1, "done"),
    ]
    assert await store.live_runs() == []


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


def _running() -> dict[str, Any]:
    return {"late": False, "missed_slots": 0, "outcome": "running", "started_at": SLOT}


async def test_a_replayed_create_task_writes_one_task(store: Store) -> None:
    task = await replayed(lambda: store.create_task(_task()))

    assert [each.id for each in await store.tasks()] == [task.id]


@pytest.mark.parametrize("moving", [True, False], ids=["moving-next-run", "one-shot"])
async def test_a_replayed_claim_slot_finds_its_own_run(store: Store, moving: bool) -> None:
    task = await store.create_task(_task())
    assert task.id is not None
    move = (SLOT, FOLLOWING) if moving else None

    run_id = await replayed(lambda: store.claim_slot(task.id or 0, SLOT, _running(), move))

    (run,) = await store.task_runs(task.id)
    assert run_id is not None and run_id == run.id
    await store.finish_task_run(run_id, {"outcome": "done", "finished_at": SLOT}, task.id, {})
    assert [each.outcome for each in await store.task_runs(task.id)] == ["done"]
    assert await store.claim_slot(task.id, SLOT, _running()) is None, "the slot is taken"


async def test_a_replayed_close_unfinished_task_runs_counts_them(store: Store) -> None:
    task = await store.create_task(_task())
    assert task.id is not None
    await store.claim_slot(task.id, SLOT, _running())

    assert await replayed(lambda: store.close_unfinished_task_runs("t:p")) == 1
    assert [run.outcome for run in await store.task_runs(task.id)] == ["interrupted"]
