"""The shared budget: who waits, who goes first, what is left for the calls that do not wait.

Windows here are short (tenths of a second) so that a waiter is served soon; the assertions are
about order and counts, never about how long anything took."""

import asyncio

from channels.budget import Action, Budget, Limit, Urgency
from tests.fakes.patience import deadline

GUARD_SECONDS = deadline()
BOT = Limit("bot", 1, 0.2, shared=True)


def chat(name: str, calls: int = 3, seconds: float = 3600) -> Limit:
    return Limit(f"chat {name}", calls, seconds)


async def test_finals_go_before_first_words_that_asked_earlier() -> None:
    budget = Budget()
    place = budget.pace(lambda action: (BOT,))
    assert await place.wait(Action.POST, Urgency.FINAL)  # the window is full now
    served: list[str] = []

    async def ask(name: str, urgency: Urgency) -> None:
        await place.wait(Action.POST, urgency)
        served.append(name)

    first_words = asyncio.create_task(ask("first words", Urgency.FIRST))
    await asyncio.sleep(0)  # it is waiting
    final = asyncio.create_task(ask("final", Urgency.FINAL))
    await asyncio.wait_for(asyncio.gather(first_words, final), GUARD_SECONDS)
    assert served == ["final", "first words"]


async def test_calls_that_do_not_wait_leave_their_share_free() -> None:
    budget = Budget()
    place = budget.pace(lambda action: (chat("a", calls=6),))
    partial = [place.take(Action.EDIT, Urgency.PARTIAL) is not None for _ in range(6)]
    assert partial == [True] * 4 + [False] * 2, "a third of the window is left"
    assert not place.take(Action.TYPING, Urgency.TYPING)
    assert not place.take(Action.EDIT, Urgency.STATUS)
    assert await place.wait(Action.EDIT, Urgency.FINAL), "the final text finds the room left"
    assert await place.wait(Action.EDIT, Urgency.FINAL)


async def test_nothing_is_taken_while_an_answer_waits() -> None:
    budget = Budget()
    place = budget.pace(lambda action: (BOT,))
    assert await place.wait(Action.POST, Urgency.FINAL)
    waiting = asyncio.create_task(place.wait(Action.POST, Urgency.FINAL))
    await asyncio.sleep(0)
    assert not place.take(Action.EDIT, Urgency.PARTIAL)
    assert await asyncio.wait_for(waiting, GUARD_SECONDS)


async def test_one_full_place_does_not_hold_the_others() -> None:
    budget = Budget()
    a = budget.pace(lambda action: (chat("a", calls=1),))
    b = budget.pace(lambda action: (chat("b", calls=1),))
    assert await a.wait(Action.POST, Urgency.FINAL)
    stuck = asyncio.create_task(a.wait(Action.POST, Urgency.FINAL))  # an hour away
    await asyncio.sleep(0)
    assert await asyncio.wait_for(b.wait(Action.POST, Urgency.FIRST), GUARD_SECONDS)
    assert not stuck.done()
    stuck.cancel()


async def test_first_words_stand_aside_when_the_final_text_comes() -> None:
    """The first post waits for room unless the reply ends first: then nothing is spent, and
    the final text goes out as the one message."""
    budget = Budget()
    place = budget.pace(lambda action: (chat("a", calls=1),))
    assert await place.wait(Action.POST, Urgency.FINAL)
    finishing = asyncio.Event()
    first_words = asyncio.create_task(place.wait(Action.POST, Urgency.FIRST, unless=finishing))
    await asyncio.sleep(0)
    finishing.set()
    assert await asyncio.wait_for(first_words, GUARD_SECONDS) is None


async def test_a_429_holds_the_place_and_not_the_bot() -> None:
    budget = Budget()
    limits = (Limit("bot", 30, 1.0, shared=True), chat("a", calls=30))
    a = budget.pace(lambda action: limits)
    b = budget.pace(lambda action: (limits[0], chat("b", calls=30)))
    a.hold(Action.EDIT, 3600)
    assert not a.take(Action.EDIT, Urgency.PARTIAL)
    assert b.take(Action.EDIT, Urgency.PARTIAL)
    waiting = asyncio.create_task(a.wait(Action.EDIT, Urgency.FINAL))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()


async def test_a_waiter_that_gives_up_lets_the_next_go() -> None:
    """Regression guard: a cancelled waiter left on the list would block every call behind it."""
    budget = Budget()
    place = budget.pace(lambda action: (BOT,))
    assert await place.wait(Action.POST, Urgency.FINAL)
    gives_up = asyncio.create_task(place.wait(Action.POST, Urgency.FINAL))
    await asyncio.sleep(0)
    gives_up.cancel()
    await asyncio.gather(gives_up, return_exceptions=True)
    assert await asyncio.wait_for(place.wait(Action.POST, Urgency.FIRST), GUARD_SECONDS)


async def test_a_call_counts_from_its_answer_once_it_lands() -> None:
    """Regression (issue 36): calls granted together travel at different speeds; counted from
    their grant, the slow ones reached Telegram inside the next second's window, and a burst
    met 429s on the bot's 30 a second."""
    loop = asyncio.get_running_loop()
    place = Budget().pace(lambda action: (BOT,))
    slot = await place.wait(Action.POST, Urgency.FINAL)
    assert slot is not None
    await asyncio.sleep(BOT.seconds / 2)  # the call on its way
    landed_at = loop.time()
    slot.landed()
    assert await asyncio.wait_for(place.wait(Action.POST, Urgency.FINAL), GUARD_SECONDS)
    assert loop.time() - landed_at >= BOT.seconds, "the next call a whole window after it"


async def test_a_live_replys_final_text_keeps_its_room_in_the_shared_window() -> None:
    """Regression (issue 36): edits of partial text spent the workspace's minute of Slack
    chat.update, and the final texts of the replies still streaming waited for the next one."""
    workspace = Limit("workspace chat.update", 6, 3600, shared=True)
    budget = Budget()
    place = budget.pace(lambda action: (workspace,))
    live = [place.reserve(Action.EDIT) for _ in range(2)]  # two replies owe a final text
    partial = [place.take(Action.EDIT, Urgency.PARTIAL) is not None for _ in range(4)]
    assert partial == [True] * 2 + [False] * 2, "a third left, and the two finals"
    for reply in live:
        assert await place.wait(Action.EDIT, Urgency.FINAL), "each final finds its room"
        reply.release()
    assert not place.take(Action.EDIT, Urgency.PARTIAL), "the window's last two: a third of it"


async def test_a_reservation_leaves_a_places_own_window_alone() -> None:
    place = Budget().pace(lambda action: (chat("a", calls=3),))
    place.reserve(Action.EDIT)
    assert place.take(Action.EDIT, Urgency.PARTIAL), "a chat's window is the reply's own"
