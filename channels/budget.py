"""A platform's rate limits as one budget a bot's replies share, spent in the order people read.

Every platform answers calls past its limits with a 429 and a wait. Waiting each refusal out,
reply by reply, works, but in a burst the waits end together and the calls come back as a storm,
and status lines and "typing…" compete with answers for the same allowance. So each channel keeps
its platform's limits (`Limit`: "at most N calls in any T seconds" per bot, per chat, per method)
in one `Budget`, and a reply asks its place's `Pace` before every call:
- **Answers wait their turn**, most urgent first (`Urgency`): final texts, then first words. A
  waiter is served as soon as every window it counts against has room; a later, more urgent one
  goes ahead of it.
- **The rest take only what is left** (`Pace.take`, never waiting): an edit of partial text
  leaves a third of each window free, a status line half, "typing…" two thirds (and each at
  least one call), so the answer that comes next finds room at once; nothing is taken while an
  answer waits. A frame not shown is not queued: the next one shows the newest state.
- **A live reply keeps room for its final text** (`Pace.reserve`) in the bot's shared windows:
  calls that do not wait leave that room too, so partial edits across the bot never spend the
  edits the replies still streaming need to end.
- **A 429 that comes anyway** (another process of the same bot, a limit nobody documented) holds
  the windows of that place until its wait is over; the reply waits it out as before.

A window counts calls in the last T seconds, the strictest shape a limit can have: calls that fit
it also fit a token bucket of N calls a T-second refill and a fixed window of N per T, whichever
the platform really runs. A call counts from the moment it is granted until its answer is back,
then from that moment (`Slot.landed`): the platform counted it somewhere between, and the calls
granted a window later cannot reach it inside that window, however slowly the first travelled.
Windows are also kept a little wider than the platform states (`MARGIN`). One
budget is one process: the workers of a cluster each keep their own (a 429 is still waited out).

Invariants, each with the bug it prevents and its test (tests/channels/test_budget.py):
- Nothing is taken while an answer waits on the same window, or status lines would keep a final
  text waiting (`test_nothing_is_taken_while_an_answer_waits`).
- A waiter that stands aside (cancelled, or its `unless` set) leaves the queue at once, or every
  call behind it would wait for nothing (`test_a_waiter_that_gives_up_lets_the_next_go`,
  `test_first_words_stand_aside_when_the_final_text_comes`).
- A full window holds only the calls that count against it: one busy chat never delays another
  (`test_one_full_place_does_not_hold_the_others`).
- A call counts from its answer once it has one, or calls granted together but slow to arrive
  land inside the next window, and Telegram answers 429
  (`test_a_call_counts_from_its_answer_once_it_lands`).
- What a live reply reserves is left by every call that does not wait, or partial edits spend a
  shared window's last calls and the final texts wait a minute on Slack
  (`test_a_live_replys_final_text_keeps_its_room_in_the_shared_window`); a place's own window
  is its reply's alone and ignores reservations
  (`test_a_reservation_leaves_a_places_own_window_alone`).
"""

import asyncio
import bisect
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

MARGIN = 1.05
"""How much wider than the platform's each window is kept."""
PRUNE_AT = 4096
"""Counted keys (chats, channels) kept before the idle ones are forgotten."""


class Urgency(IntEnum):
    """What a call shows, in the order people read it (lowest first)."""

    FINAL = 0
    """A reply's last text, a command's answer, a notice: waits for its turn."""
    FIRST = 1
    """A reply's first words: waits for its turn."""
    PARTIAL = 2
    """An edit of partial text: only if a third of each window is left."""
    STATUS = 3
    """A status line ("waiting for the model: 3 requests ahead"): only if half is left."""
    TYPING = 4
    """"typing…": only if two thirds are left."""


LEFT_FREE = {Urgency.PARTIAL: 1 / 3, Urgency.STATUS: 1 / 2, Urgency.TYPING: 2 / 3}
"""The share of each window a call that does not wait must leave free (at least one call)."""


class Action(Enum):
    """What a call does, for platforms whose limits differ by method (Slack's tiers)."""

    POST = "post"
    EDIT = "edit"
    DELETE = "delete"
    TYPING = "typing"


@dataclass(frozen=True)
class Limit:
    """At most `calls` calls in any `seconds` seconds, counted under `key` (every place whose
    calls share it: "bot", "chat 42", "T0123 chat.update"). A `shared` limit counts the whole
    bot's calls, so one place's 429 does not hold it."""

    key: str
    calls: int
    seconds: float
    shared: bool = False


Limits = Callable[[Action], Sequence[Limit]]
"""The limits one place's calls of each action count against."""


@dataclass(eq=False)
class _Count:
    """The calls one limit saw in its last window, and a 429's hold."""

    limit: Limit
    times: deque[float] = field(default_factory=deque)
    """When each call of the window counts from, oldest first."""
    held_until: float = 0.0
    reserved: int = 0
    """Final texts owed by live replies (`Pace.reserve`): what calls that do not wait leave."""

    def free(self, now: float) -> int:
        if now < self.held_until:
            return 0
        cutoff = now - self.limit.seconds * MARGIN
        while self.times and self.times[0] <= cutoff:
            self.times.popleft()
        return self.limit.calls - len(self.times)

    def room_at(self, now: float) -> float:
        """When one more call fits (now, if it does)."""
        if now < self.held_until:
            return self.held_until
        if self.free(now) > 0:
            return now
        return self.times[len(self.times) - self.limit.calls] + self.limit.seconds * MARGIN

    def idle(self, now: float) -> bool:
        return self.free(now) == self.limit.calls and not self.reserved

    def landed(self, granted_at: float, now: float) -> None:
        """A call granted at `granted_at` has its answer: it counts from now on."""
        with contextlib.suppress(ValueError):  # already out of the window
            self.times.remove(granted_at)
        bisect.insort(self.times, now)

    def kept_free(self, share: float) -> int:
        """What a call that does not wait must leave: its share, and the final texts owed."""
        return _left_free(share, self.limit) + self.reserved


@dataclass(eq=False)
class Slot:
    """Room one call was given. It counts from the moment it was granted until its answer is
    back (`landed`), then from then on: the platform counted it somewhere between, and a call
    that travelled slowly must not let the next window's calls land too close behind it."""

    _granted: tuple[tuple[_Count, float], ...]

    def landed(self) -> None:
        now = _now() if self._granted else 0.0
        for count, granted_at in self._granted:
            count.landed(granted_at, now)
        self._granted = ()


@dataclass(eq=False)
class Reservation:
    """A live reply's claim on room for its final text in the bot's shared windows, so edits
    of partial text elsewhere never spend it (`Pace.reserve`)."""

    _counts: tuple[_Count, ...]

    def release(self) -> None:
        for count in self._counts:
            count.reserved -= 1
        self._counts = ()


@dataclass(eq=False)
class _Waiter:
    urgency: Urgency
    order: int
    counts: tuple[_Count, ...]
    granted: asyncio.Future[Slot]


class Budget:
    """One bot's limits on one platform, shared by every place it writes to; with `paced` off
    (`[channels.<platform>].paced`), every call goes at once."""

    def __init__(self, *, paced: bool = True) -> None:
        self._paced = paced
        self._counts: dict[str, _Count] = {}
        self._prune_at = PRUNE_AT
        self._waiting: list[_Waiter] = []
        """Sorted by urgency, then arrival."""
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def pace(self, limits: Limits) -> "Pace":
        return Pace(self if self._paced else None, limits)

    def has_room(self, limits: Sequence[Limit], urgency: Urgency) -> bool:
        """Whether a call that does not wait would find room now (nothing is taken)."""
        counts = self._counts_of(limits)
        if any(count in waiter.counts for waiter in self._waiting for count in counts):
            return False  # an answer is waiting for this room
        now = _now()
        share = LEFT_FREE[urgency]
        return all(count.free(now) - 1 >= count.kept_free(share) for count in counts)

    def take(self, limits: Sequence[Limit], urgency: Urgency) -> Slot | None:
        if self.has_room(limits, urgency):
            return _spend(self._counts_of(limits), _now())
        return None

    def reserve(self, limits: Sequence[Limit]) -> Reservation:
        counts = tuple(count for count in self._counts_of(limits) if count.limit.shared)
        for count in counts:
            count.reserved += 1
        return Reservation(counts)

    def ask(self, limits: Sequence[Limit], urgency: Urgency) -> asyncio.Future[Slot]:
        """A future resolved when the call may go (at once, if it may now); cancel it to stand
        aside."""
        granted = asyncio.get_running_loop().create_future()
        waiter = _Waiter(urgency, next(self._order), self._counts_of(limits), granted)
        bisect.insort(self._waiting, waiter, key=lambda w: (w.urgency, w.order))
        granted.add_done_callback(lambda _: self._withdraw(waiter))
        self._serve()
        return granted

    def hold(self, limits: Sequence[Limit], seconds: float) -> None:
        """The platform asked this place to wait `seconds`: its own windows (not the bot's
        shared ones) give no room until then."""
        until = _now() + seconds
        for count in self._counts_of([limit for limit in limits if not limit.shared]):
            count.held_until = max(count.held_until, until)
        self._serve()

    def _withdraw(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            self._serve()  # those behind it may go now

    def _serve(self) -> None:
        """Every waiter with room goes, most urgent first; then a wake-up when the next one
        can."""
        now = _now()
        full: set[int] = set()
        """Counts a more urgent waiter found full: nobody behind it takes them."""
        for waiter in list(self._waiting):
            if waiter.granted.done():
                continue
            if any(id(count) in full for count in waiter.counts):
                continue
            if all(count.free(now) > 0 for count in waiter.counts):
                waiter.granted.set_result(_spend(waiter.counts, now))  # its callback unlists it
            else:
                full.update(id(count) for count in waiter.counts if count.free(now) <= 0)
        self._wake_when_room(now)

    def _wake_when_room(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = [waiter for waiter in self._waiting if not waiter.granted.done()]
        if waiting:
            room = min(max(c.room_at(now) for c in waiter.counts) for waiter in waiting)
            self._timer = asyncio.get_running_loop().call_later(max(0.0, room - now), self._serve)

    def _counts_of(self, limits: Sequence[Limit]) -> tuple[_Count, ...]:
        if len(self._counts) >= self._prune_at:
            self._forget_idle()
        return tuple(self._counts.setdefault(limit.key, _Count(limit)) for limit in limits)

    def _forget_idle(self) -> None:
        now = _now()
        waited_on = {id(count) for waiter in self._waiting for count in waiter.counts}
        self._counts = {
            key: count
            for key, count in self._counts.items()
            if not count.idle(now) or id(count) in waited_on
        }
        self._prune_at = max(PRUNE_AT, 2 * len(self._counts))


class Pace:
    """One place's share of its platform's budget: what its calls ask before they go."""

    def __init__(self, budget: Budget | None, limits: Limits) -> None:
        self._budget = budget
        self._limits = limits

    def take(self, action: Action, urgency: Urgency) -> Slot | None:
        """Room for a call that does not wait (`Urgency.PARTIAL` and below), taken if left."""
        return FREE if self._budget is None else self._budget.take(self._limits(action), urgency)

    def has_room(self, action: Action, urgency: Urgency) -> bool:
        """Whether `take` would find room now; nothing is taken."""
        return self._budget is None or self._budget.has_room(self._limits(action), urgency)

    def reserve(self, action: Action) -> Reservation:
        """Room kept in the bot's shared windows for a live reply's final text, until
        released: calls that do not wait leave it to that text."""
        if self._budget is None:
            return NOTHING_RESERVED
        return self._budget.reserve(self._limits(action))

    async def wait(
        self, action: Action, urgency: Urgency, *, unless: asyncio.Event | None = None
    ) -> Slot | None:
        """Wait for room for a call; None, with nothing spent, if `unless` is set first."""
        if self._budget is None:
            return FREE
        granted = self._budget.ask(self._limits(action), urgency)
        if granted.done():
            return granted.result()
        if unless is None:
            return await granted
        ending = asyncio.ensure_future(unless.wait())
        try:
            await asyncio.wait((granted, ending), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not granted.done():
                granted.cancel()
        return None if granted.cancelled() else granted.result()

    def hold(self, action: Action, seconds: float) -> None:
        """A 429 asked this place to wait `seconds`."""
        if self._budget is not None:
            self._budget.hold(self._limits(action), seconds)


FREE = Slot(())
"""The room of a call no limit counts (an unpaced bot's)."""
NOTHING_RESERVED = Reservation(())
UNLIMITED = Pace(None, lambda action: ())
"""A place with no limits to keep (the web chat, a test's board)."""


def _left_free(share: float, limit: Limit) -> int:
    return max(1, int(share * limit.calls))


def _spend(counts: Sequence[_Count], now: float) -> Slot:
    for count in counts:
        count.times.append(now)
    return Slot(tuple((count, now) for count in counts))


def _now() -> float:
    return asyncio.get_running_loop().time()
