"""Conversation ownership across workers: two workers in one test process, each with its own
store connections, turn runner, channel and cluster connections, on one PostgreSQL schema
(skipped without KAIWA_TEST_POSTGRES_URL). Worker `a` receives every message, as the holder of
a platform's long poll would; the conversation's owner answers.

Places are chosen by the rendezvous hash, so each test knows which worker prefers which place.
A worker's death is what PostgreSQL sees of it: its cluster connections close (its leases end)
and what it left `running` stays so.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest

from core.agent.tools import ToolContext
from core.channel import Outcome
from core.cluster.leases import ClusterSettings, Coordinator
from core.cluster.owners import preferred
from core.features.schedule.timing import ScheduleSettings, When
from core.store import Inbound, Store, TurnStart
from core.turns.turn import CUT_FIRING
from tests.databases import QUICK, postgres_schema, postgres_url
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Pause, Text
from tests.fakes.patience import deadline
from tests.harness import Bot, BotFactory

pytestmark = pytest.mark.postgres
WORKERS = ["a", "b"]


def place_of(worker: str, skip: int = 0) -> str:
    """A place the rendezvous hash gives `worker` (the `skip`-th such)."""
    found = [
        place for place in (f"test:{n}" for n in range(200)) if preferred(place, WORKERS) == worker
    ]
    return found[skip]


@dataclass
class Pair:
    a: Bot
    b: Bot
    coordinators: dict[str, Coordinator]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


CLOCK = Clock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))


@pytest.fixture
async def pair(make_bot: BotFactory) -> AsyncIterator[Pair]:
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the cluster tests")
    name = f"t{uuid.uuid4().hex[:8]}"
    with postgres_schema(base) as url:
        stores = [await Store.open(url, QUICK) for _ in WORKERS]
        coordinators = {
            worker: Coordinator(url, ClusterSettings(True, name=name, worker_id=worker))
            for worker in WORKERS
        }
        bots = []
        for worker, store in zip(WORKERS, stores, strict=True):
            bot = make_bot(
                bot_store=store,
                cluster=coordinators[worker],
                channel=RecordingChannel(),
                schedule=ScheduleSettings(),
                clock=CLOCK,
            )
            await coordinators[worker].start()
            bots.append(bot)
        for bot in bots:
            assert bot.owners is not None
            await bot.owners.start()
        yield Pair(bots[0], bots[1], coordinators)
        for bot in bots:
            assert bot.owners is not None
            await bot.owners.stop()
            await bot.runner.shutdown()
        for coordinator in coordinators.values():
            await coordinator.close()
        for store in stores:
            await store.close()


def texts(bot: Bot) -> list[str]:
    return [reply.text or "" for reply in bot.channel.replies if reply.outcome is not None]


async def test_a_message_is_answered_by_the_worker_its_conversation_goes_to(pair: Pair) -> None:
    mine, theirs = place_of("a"), place_of("b")
    pair.a.ollama.script_for("to a", Text("answered by a"))
    pair.a.ollama.script_for("to b", Text("answered by b"))

    await pair.a.send("to a", place=mine)
    await pair.a.send("to b", place=theirs)
    await pair.b.channel.finished()
    await pair.a.channel.finished()

    assert texts(pair.a) == ["answered by a"] and texts(pair.b) == ["answered by b"]
    assert pair.b.owners is not None and pair.b.owners.owned == {theirs}


async def test_a_conversations_messages_are_answered_in_order_by_its_owner(pair: Pair) -> None:
    place = place_of("b")
    pair.a.ollama.script(Pause("first"), Text("one"))
    pair.a.ollama.script(Text("two"))
    pair.a.ollama.script(Text("three"))

    await pair.a.send("first", place=place)
    await pair.a.ollama.reached("first")
    await pair.a.send("second", place=place)
    await pair.a.send("third", place=place)
    pair.a.ollama.release("first")
    await pair.b.channel.finished(3)

    assert texts(pair.b) == ["one", "two", "three"] and texts(pair.a) == []
    asked = [r["messages"][-1]["content"] for r in pair.a.ollama.requests]
    assert asked == ["first", "second", "third"]


async def test_stop_sent_through_a_worker_that_does_not_own_the_turn_stops_it(
    pair: Pair,
) -> None:
    place = place_of("b")
    pair.a.ollama.script(Text("Working"), Pause("long"), Text(" on and on"))

    await pair.a.send("long job", place=place)
    await pair.b.channel.wait_until(
        lambda: pair.b.channel.replies and pair.b.channel.replies[0].shown == "Working", "reply"
    )
    await pair.a.send("/stop", place=place)  # a receives it; b runs the turn
    (reply,) = await pair.b.channel.finished()

    assert (reply.outcome, reply.text) == (Outcome.STOPPED, "Working")
    await pair.b.channel.wait_until(lambda: pair.b.channel.notices_in(place), "the answer")
    assert pair.b.channel.notices_in(place) == ["Stopped."]
    assert pair.a.channel.notices_in(place) == []


async def test_a_dead_owners_running_turn_is_resolved_by_the_next_owner(pair: Pair) -> None:
    """What a worker killed mid-turn leaves: a turn `running`, no lease. The sweep of the live
    worker claims the place, with no new message needed, and recovers it as a restart would:
    the turn is marked interrupted and, since it showed nothing yet, its message runs again."""
    place = place_of("b")
    await pair.coordinators["b"].close()  # b is dead: its connections (and leases) are gone
    pair.a.ollama.script(Text("answered after all"))
    store = pair.a.store
    claim = await store.claim_inbound(
        Inbound("test", "m-dead", place, "what b was answering", "ann", status="turn")
    )
    await store.start_turn(
        TurnStart(
            place=place,
            agent="assistant",
            system_prompt="",
            provenance="person",
            text="what b was answering",
            author="ann",
            inbound_event_id=claim.event_id,
        )
    )
    assert pair.a.owners is not None

    await pair.a.owners.sweep()  # b is gone from the live workers: a is preferred now
    (reply,) = await pair.a.channel.finished()

    assert (reply.text, reply.reply_to) == ("answered after all", "m-dead")
    first, again = await pair.a.turns(place)
    assert (first.status, again.status, again.attempt) == ("interrupted", "done", 2)


async def test_a_message_nobody_picked_up_is_answered_by_the_sweep(pair: Pair) -> None:
    """A notification can be missed (a listening connection that dropped): the sweep finds the
    queued message and its preferred worker answers it."""
    place = place_of("b", skip=1)
    pair.a.ollama.script(Text("found by the sweep"))
    await pair.a.store.claim_inbound(
        Inbound("test", "m-missed", place, "anyone there?", "ann", status="turn")
    )
    assert pair.b.owners is not None

    await pair.b.owners.sweep()
    (reply,) = await pair.b.channel.finished()

    assert reply.text == "found by the sweep" and reply.reply_to == "m-missed"


async def test_a_quiet_conversation_is_let_go_and_claimed_again_on_its_next_message(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    place = place_of("b")
    pair.a.ollama.default = [Text("hello")]
    await pair.a.send("one", place=place)
    await pair.b.channel.finished()
    assert pair.b.owners is not None
    quick = replace(pair.coordinators["b"].settings, idle_seconds=0)
    monkeypatch.setattr(pair.coordinators["b"], "settings", quick)
    await pair.b.runner.wait_idle(place)
    async with asyncio.timeout(deadline()):  # until what the reply shows is stored, then quiet
        while place in await pair.b.store.places_waiting():  # noqa: ASYNC110  (the store's state)
            await asyncio.sleep(0.01)

    await pair.b.owners.sweep()
    assert pair.b.owners.owned == set()
    await pair.a.send("two", place=place)
    await pair.b.channel.finished(2)

    assert texts(pair.b) == ["hello", "hello"]


async def test_a_task_made_on_one_worker_fires_once_on_its_owner_after_its_maker_died(
    pair: Pair,
) -> None:
    """Every worker's scheduler follows a task made on any of them; a slot both try to fire is
    claimed once, and runs on the owner of the task's place."""
    place = place_of("b")
    assert pair.a.scheduler is not None and pair.b.scheduler is not None
    CLOCK.now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    ann = ToolContext("test", place, "ann", "person")
    task = await pair.a.scheduler.create(ann, "assistant", "say hello", When(every_minutes=60))
    pair.a.ollama.default = [Text("hello from the task")]
    CLOCK.now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)

    async def fired_by_both() -> bool:
        await asyncio.gather(*pair.a.scheduler.fire_due(), *pair.b.scheduler.fire_due())
        return bool(await pair.b.store.task_runs(task.id or 0, 5))

    async with asyncio.timeout(deadline()):  # b hears of the task by notification
        while not await fired_by_both():  # noqa: ASYNC110  (another worker's notice)
            await asyncio.sleep(0.01)
    await pair.a.runner.wait_idle(place)
    await pair.b.runner.wait_idle(place)
    replies = [r.text for bot in (pair.a, pair.b) for r in bot.channel.replies]
    assert replies == ["hello from the task"], "one run, on the worker that owns the place"
    assert len(await pair.b.store.task_runs(task.id or 0, 5)) == 1

    await pair.coordinators["a"].close()  # a dies; b alone fires the next slot
    pair.a.scheduler.stop()
    CLOCK.now = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    async with asyncio.timeout(deadline()):  # a's lease ends a moment after its connection
        while not await pair.b.owners.runs_here(place):  # type: ignore[union-attr]  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.gather(*pair.b.scheduler.fire_due())
    await pair.b.runner.wait_idle(place)
    assert [r.text for r in pair.b.channel.replies][-1] == "hello from the task"
    assert len(await pair.b.store.task_runs(task.id or 0, 5)) == 2


async def test_a_firing_its_dead_worker_claimed_but_never_started_is_said_in_its_place(
    pair: Pair,
) -> None:
    """A worker killed between claiming a slot and starting its turn left only a run
    `running`: the sweep finds the place, the run ends interrupted, and the place is told."""
    place = place_of("a")
    assert pair.a.scheduler is not None and pair.a.owners is not None
    CLOCK.now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    ann = ToolContext("test", place, "ann", "person")
    task = await pair.b.scheduler.create(  # type: ignore[union-attr]
        ann, "assistant", "say hello", When(every_minutes=60)
    )
    run = {"late": False, "missed_slots": 0, "outcome": "running", "started_at": CLOCK.now}
    assert await pair.a.store.claim_slot(task.id or 0, CLOCK.now, run) is not None

    await pair.a.owners.sweep()

    await pair.a.channel.wait_until(lambda: pair.a.channel.notices_in(place), "the notice")
    assert pair.a.channel.notices_in(place) == [CUT_FIRING]
    (ended,) = await pair.a.store.task_runs(task.id or 0, 5)
    assert ended.outcome == "interrupted"
