"""Request slots: a bounded number at once, the rest in arrival order, each told its place."""

import asyncio

from core.agent.slots import RequestSlots


class Told:
    """The places a waiter was told, with a wait for the next one."""

    def __init__(self) -> None:
        self.places: list[int] = []
        self._changed = asyncio.Event()

    def __call__(self, ahead: int) -> None:
        self.places.append(ahead)
        self._changed.set()

    async def told(self, count: int) -> None:
        while len(self.places) < count:
            self._changed.clear()
            await self._changed.wait()


async def test_waiters_go_in_arrival_order_and_hear_their_place() -> None:
    slots = RequestSlots(1)
    b, c = Told(), Told()
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def request(name: str, told: Told | None = None) -> None:
        async with slots.held(told or (lambda ahead: None)):
            order.append(name)
            if name == "a":
                first_in.set()
                await release_first.wait()

    running = [asyncio.create_task(request("a"))]
    await first_in.wait()
    running += [asyncio.create_task(request("b", b)), asyncio.create_task(request("c", c))]
    await c.told(1)
    assert (b.places, c.places, slots.waiting) == ([1], [2], 2)
    release_first.set()
    await asyncio.gather(*running)

    assert order == ["a", "b", "c"]
    assert c.places == [2, 1], "c moved up when b got its slot"


async def test_a_cancelled_waiter_leaves_the_queue_and_the_others_move_up() -> None:
    slots = RequestSlots(1)
    held = asyncio.Event()
    release = asyncio.Event()
    leaver, stayer = Told(), Told()

    async def holder() -> None:
        async with slots.held(lambda ahead: None):
            held.set()
            await release.wait()

    async def waiter(told: Told) -> None:
        async with slots.held(told):
            pass

    holding = asyncio.create_task(holder())
    await held.wait()
    leaving = asyncio.create_task(waiter(leaver))
    await leaver.told(1)
    staying = asyncio.create_task(waiter(stayer))
    await stayer.told(1)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    assert stayer.places == [2, 1] and slots.waiting == 1
    release.set()
    await asyncio.gather(holding, staying)
    assert slots.waiting == 0


async def test_a_request_a_person_waits_for_goes_ahead_of_background_ones() -> None:
    """Five sub-agents queued must not hold up a person's message in another conversation."""
    slots = RequestSlots(1)
    order: list[str] = []
    first_in, release_first = asyncio.Event(), asyncio.Event()
    person, background = Told(), Told()

    async def request(name: str, told: Told, *, in_background: bool) -> None:
        async with slots.held(told, background=in_background):
            order.append(name)
            if name == "busy":
                first_in.set()
                await release_first.wait()

    running = [asyncio.create_task(request("busy", Told(), in_background=True))]
    await first_in.wait()
    running.append(asyncio.create_task(request("sub-agent", background, in_background=True)))
    await background.told(1)
    running.append(asyncio.create_task(request("person", person, in_background=False)))
    await person.told(1)
    release_first.set()
    await asyncio.gather(*running)

    assert order == ["busy", "person", "sub-agent"]
    assert person.places == [1] and background.places == [1, 2, 1]


async def test_a_waiter_hears_its_place_when_it_has_halved_not_at_every_step() -> None:
    """Regression: 300 replies waiting each heard every step of the queue, and each step was an
    edit on the platform: hundreds of edits a second starved the replies they waited for."""
    slots = RequestSlots(1)
    held, release = asyncio.Event(), asyncio.Event()
    last = Told()

    async def holder() -> None:
        async with slots.held(lambda ahead: None):
            held.set()
            await release.wait()

    async def waiter(told: Told | None = None) -> None:
        async with slots.held(told or (lambda ahead: None)):
            pass

    holding = asyncio.create_task(holder())
    await held.wait()
    seventh = Told()
    ahead = [asyncio.create_task(waiter()) for _ in range(6)]
    ahead.append(asyncio.create_task(waiter(seventh)))
    await seventh.told(1)  # tasks start in order: the six before it are queued too
    waiting = asyncio.create_task(waiter(last))
    await last.told(1)
    release.set()
    await asyncio.gather(holding, *ahead, waiting)

    assert last.places == [8, 4, 2, 1]
