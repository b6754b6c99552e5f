"""Conversation ownership: the per-conversation gate, across workers (ARCHITECTURE.md, "Several
workers").

A conversation's turns run on the one worker that holds its lease (`place:<place>`,
`core.cluster.leases`); in that worker the turn runner's gate orders them as in a single process. So
invariants 1 to 3 take this form: one owner per conversation at a time (the lease), turns in
arrival order (the inbox's ids), `/stop` run by the owner (forwarded to it).

- **Arrival.** Any worker records a message in the inbox (the dispatcher), then calls `arrived`.
  The owner picks it up. A conversation nobody owns is claimed by the worker a rendezvous hash
  of (worker, place) prefers among the live workers, so conversations spread over the workers
  whichever of them received the message (a platform's long poll runs on one). The others are
  told by notification (`work`); if the preferred one has died since the live workers were
  read, the receiver takes the place after `CLAIM_GRACE_SECONDS`.
- **Pickup.** The owner reads the place's queued messages, oldest first, takes each over
  (`Store.take_over`: one taker wins, even against a dying owner's last act) and submits it to
  its own runner. A message this worker received itself keeps what the inbox does not hold (its
  pictures).
- **Claim = recovery of that place.** Holding the lease proves no other worker runs a turn
  there, so whatever the place has left `running` (turns, a scheduled run, a plan, a question)
  belongs to a dead owner and is resolved before the first new turn: marked interrupted in the
  place, run again or the person told (`core.dispatch.recovery`). The place counts as owned only
  once that is done, and no pickup runs meanwhile, so a turn run again keeps its place in line.
- **Sweep.** Every third of `failover_seconds`, a worker looks for places with queued messages
  or running turns: it picks up its own (a missed notification), claims those it is preferred for,
  and those nobody claimed since the last sweep, up to `PLACES_AT_ONCE` side by side. A dead
  worker's conversations move this way within `failover_seconds`, with no message needed.
- **Release.** A conversation quiet for `idle_seconds` (no live turn, nothing queued) is let go,
  so leases do not pile up and ownership follows the live workers.
- **Commands and firings** for a conversation owned elsewhere are forwarded to the owner by
  notification (`command`, `firing`); the owner runs them as if received itself. A scheduled
  task made or changed on one worker is announced (`task`), so every worker's scheduler has it
  and a worker's death never leaves a task without one.
"""

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from core.channel import Channel, ChannelMessage
from core.cluster.leases import Coordinator
from core.dispatch.recovery import Recovery, leftovers, turn_of
from core.errors import StoreError
from core.store import Store
from core.turns.runner import TurnRunner
from core.turns.turn import TurnRequest

logger = logging.getLogger(__name__)

CLAIM_GRACE_SECONDS = 1.0
"""How long the preferred worker has to take a new conversation before the receiver does."""
PLACES_AT_ONCE = 16
"""Places one sweep takes over side by side: enough that a dead worker's conversations move
together, few enough that its recovery does not flood the store's threads or a platform."""
CommandRunner = Callable[[ChannelMessage], Awaitable[None]]
FiringRunner = Callable[[dict[str, Any]], Awaitable[None]]


def _log_failure(task: "asyncio.Future[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("ownership: taking a place over failed: %s", task.exception())


def preferred(place: str, workers: list[str]) -> str | None:
    """The worker a conversation goes to (rendezvous hashing: adding or losing a worker moves
    only the conversations that were or become its own)."""
    if not workers:
        return None
    return max(workers, key=lambda worker: hashlib.sha256(f"{worker}|{place}".encode()).digest())


class Owners:
    def __init__(
        self,
        coordinator: Coordinator,
        store: Store,
        runner: TurnRunner,
        channels: dict[str, Channel],
    ) -> None:
        self._coordinator = coordinator
        self._store = store
        self._runner = runner
        self._channels = channels
        self.worker = coordinator.worker
        self._owned: dict[str, float] = {}
        """Places this worker owns, with when each was last active (monotonic)."""
        self._received: dict[int, TurnRequest] = {}
        """Turns of messages this worker received for places it owns, by inbox id, until taken."""
        self._picking: dict[str, asyncio.Lock] = {}
        self._workers: list[str] = [self.worker]
        self._unclaimed: set[str] = set()
        """Places the last sweep found waiting with no owner."""
        self._sweeping: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        self.run_command: CommandRunner | None = None
        """Runs a command as the dispatcher would (set by the dispatcher)."""
        self.run_firing: FiringRunner | None = None
        """Runs a scheduled firing claimed elsewhere (set by the scheduler)."""
        self.task_changed: Callable[[int], Awaitable[None]] | None = None
        """Told of a scheduled task changed on another worker (set by the scheduler)."""
        coordinator.on("work", self._on_work)
        coordinator.on("task", self._on_task)
        coordinator.on("joined", self._on_joined)
        coordinator.on("command", self._on_command)
        coordinator.on("firing", self._on_firing)

    @property
    def owned(self) -> set[str]:
        return set(self._owned)

    async def start(self) -> None:
        """Read the live workers, and tell them this one joined (so new conversations come to
        it from now on, not only after their next sweep)."""
        self._workers = await self._coordinator.workers()
        self._sweeping = asyncio.create_task(self._sweep_forever(), name="ownership sweep")
        await self._coordinator.notify("joined")

    async def stop(self) -> None:
        tasks = [*self._background, *([self._sweeping] if self._sweeping else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- arrivals ----------------------------------------------------------------------------------

    async def arrived(self, request: TurnRequest) -> None:
        """A message recorded in the inbox (`request.inbound_event_id`) waits for a turn."""
        place = request.place
        if await self._claimed(place, preferred_only=True):
            assert request.inbound_event_id is not None
            self._received[request.inbound_event_id] = request
            await self.pickup(place)
        else:
            await self._coordinator.notify("work", place=place)
            self._later(self._unless_taken(place))

    async def _unless_taken(self, place: str) -> None:
        """The preferred worker had a moment to take `place`; if nobody did (it died since the
        live workers were last read), this worker does, and reads them again."""
        await asyncio.sleep(CLAIM_GRACE_SECONDS)
        if place not in self._owned and await self._claimed(place, preferred_only=False):
            self._workers = await self._coordinator.workers()
            await self.pickup(place)

    def _later(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    async def pickup(self, place: str) -> None:
        """Submit the place's queued messages, oldest first, each taken over once."""
        async with self._picking.setdefault(place, asyncio.Lock()):
            self._owned[place] = time.monotonic()
            for row in await self._store.queued_messages(place):
                assert row.id is not None
                if self._runner.handles(row.id):
                    continue
                kept = self._received.pop(row.id, None)
                if not await self._store.take_over(row.id, row.claim or ""):
                    continue
                self._runner.submit(kept or turn_of(row))

    # -- commands and firings --------------------------------------------------------------------

    async def runs_here(self, place: str) -> bool:
        """Whether what acts on `place` runs on this worker: it owns the place, or has just
        claimed it."""
        return await self._claimed(place, preferred_only=False)

    async def forward_command(self, message: ChannelMessage) -> None:
        """Hand a command for a conversation owned elsewhere to its owner."""
        shown = {k: v for k, v in asdict(message).items() if k not in ("images", "author_roles")}
        await self._coordinator.notify("command", message=shown)

    async def forward_firing(self, place: str, firing: dict[str, Any]) -> None:
        await self._coordinator.notify("firing", place=place, firing=firing)

    async def announce_task(self, task_id: int) -> None:
        """A scheduled task was made or changed here: every worker's scheduler follows it."""
        await self._coordinator.notify("task", id=task_id)

    async def _on_joined(self, note: dict[str, Any]) -> None:
        if note.get("from") != self.worker:
            self._workers = await self._coordinator.workers()

    async def _on_task(self, note: dict[str, Any]) -> None:
        if self.task_changed is not None and note.get("from") != self.worker:
            await self.task_changed(int(note["id"]))

    # -- notifications ---------------------------------------------------------------------------

    async def _on_work(self, note: dict[str, Any]) -> None:
        place = str(note["place"])
        mine = place in self._owned or preferred(place, self._workers) == self.worker
        if mine and await self._claimed(place, preferred_only=False):
            await self.pickup(place)

    async def _on_command(self, note: dict[str, Any]) -> None:
        message = ChannelMessage(**note["message"])
        if note.get("from") == self.worker and message.place not in self._owned:
            return  # the sender forwarded it because another worker owns the place
        if self.run_command is not None and await self._claimed(message.place, False):
            self._owned[message.place] = time.monotonic()
            await self.run_command(message)

    async def _on_firing(self, note: dict[str, Any]) -> None:
        place = str(note["place"])
        if note.get("from") == self.worker and place not in self._owned:
            return
        if self.run_firing is not None and await self._claimed(place, False):
            await self.run_firing(note["firing"])

    # -- claiming, sweeping, releasing ---------------------------------------------------------

    async def _claimed(self, place: str, preferred_only: bool) -> bool:
        """Whether this worker owns `place`, taking its lease if nobody holds it (only if it is
        the preferred worker, with `preferred_only`). A place claimed is recovered first."""
        if place in self._owned:
            return True
        if preferred_only and preferred(place, self._workers) not in (self.worker, None):
            return False
        async with self._picking.setdefault(place, asyncio.Lock()):  # no pickup meanwhile
            if place in self._owned:
                return True
            if not await self._coordinator.try_lease(f"place:{place}"):
                return False
            logger.info("worker %s owns %s now", self.worker, place)
            await self._recover(place)  # first: a turn run again goes before new messages
            self._owned[place] = time.monotonic()
        return True

    async def _recover(self, place: str) -> None:
        """What a dead owner left in `place`, resolved before this worker's first turn there:
        its turns, and what each turn part left (`core.dispatch.recovery`)."""
        try:
            left = await leftovers(self._store, self._runner.parts, place)
            if left:
                await Recovery(self._store, self._runner, self._channels).resolve(left)
                logger.info("%s: what a dead worker left there is resolved", place)
        except StoreError as exc:
            logger.warning("%s: what a dead worker left could not be resolved yet: %s", place, exc)

    async def _sweep_forever(self) -> None:
        interval = self._coordinator.settings.failover_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except StoreError as exc:
                logger.warning("ownership sweep: %s", exc)
            except Exception:
                logger.exception("ownership sweep failed")

    async def sweep(self) -> None:
        """One round: refresh the live workers, pick up or claim what waits, let idle places go.
        Places are visited side by side (at most `PLACES_AT_ONCE`): taking over a dead worker's
        place waits on the store and the platform, and its fifty places must not wait in line
        for one another. A place that fails is logged; the others go on."""
        self._workers = await self._coordinator.workers()
        waiting = await self._store.places_waiting()
        unclaimed: set[str] = set()
        room = asyncio.Semaphore(PLACES_AT_ONCE)

        async def visit(place: str) -> None:
            async with room:
                mine = preferred(place, self._workers) == self.worker or place in self._unclaimed
                if place in self._owned or (mine and await self._claimed(place, False)):
                    await self.pickup(place)
                elif place not in self._owned:
                    unclaimed.add(place)

        visits = await asyncio.gather(*(visit(p) for p in waiting), return_exceptions=True)
        for place, outcome in zip(waiting, visits, strict=True):
            if isinstance(outcome, StoreError):
                logger.warning("ownership sweep: %s: %s", place, outcome)
            elif isinstance(outcome, BaseException):
                logger.error("ownership sweep: %s failed", place, exc_info=outcome)
        self._unclaimed = unclaimed
        await self._release_idle(set(waiting))

    async def _release_idle(self, waiting: set[str]) -> None:
        idle_for = self._coordinator.settings.idle_seconds
        now = time.monotonic()
        for place, active in list(self._owned.items()):
            busy = self._runner.has_live(place) or place in waiting
            if busy:
                self._owned[place] = now
            elif now - active >= idle_for:
                del self._owned[place]
                self._picking.pop(place, None)
                await self._coordinator.release(f"place:{place}")
                logger.info(
                    "worker %s let go of %s (quiet for %.0f s)", self.worker, place, now - active
                )
