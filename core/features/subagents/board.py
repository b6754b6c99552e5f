"""The status message of a conversation's running sub-agents.

While a conversation's sub-agents run, one message there shows each (name, state, elapsed,
model and the tier routing chose), edited no faster than the channel allows (a `FramePump`, as
a reply is), and becomes a one-line summary when the last one ends. Each frame also carries
every run as a `Card` (its step, its model, why it runs on it, and model calls, a Stop button
while it runs, and its transcript, `/agents <id>`), for a channel that shows live cards (the
web chat); the summary carries their final states. A
channel that cannot edit in place (`ChannelTraits.edits_in_place`: a pipe) gets only that
summary, as a notice: each edit would print below the last, in the middle of the
conversation's replies. It is not a record: nothing is stored before
it is shown, and a failing edit is logged, never raised into a run.
"""

import logging
import time
from collections.abc import Mapping

from core.channel import Button, Card, Channel, Frame, Outcome
from core.features.subagents.runs import Run
from core.turns.pump import FramePump

logger = logging.getLogger(__name__)


class Boards:
    """One status message per conversation with running sub-agents (`[subagents].
    status_message`)."""

    def __init__(self, channels: Mapping[str, Channel], enabled: bool) -> None:
        self._channels = channels
        self._enabled = enabled
        self._boards: dict[str, _Board] = {}

    def show(self, run: Run) -> None:
        """Put `run` on its conversation's message (opened with the first)."""
        channel = self._channels.get(run.platform)
        if not self._enabled or channel is None:
            return
        board = self._boards.get(run.place)
        if board is None:
            board = self._boards[run.place] = _Board(channel, run.place)
        board.add(run)

    async def ended(self, run: Run) -> None:
        """`run` ended: its line says so; the last one to end closes the message."""
        board = self._boards.get(run.place)
        if board is None:
            return
        if board.running():
            board.poke()
            return
        del self._boards[run.place]
        await board.close()


class _Board:
    def __init__(self, channel: Channel, place: str) -> None:
        self._runs: list[Run] = []
        self._channel, self._place = channel, place
        self._reply = channel.open_reply(place, None) if channel.traits.edits_in_place else None
        self._pump = None
        if self._reply is not None:
            self._pump = FramePump(
                self._reply,
                self._frame,
                _nothing_to_save,
                channel.traits.frame_interval,
                name=f"sub-agents in {place}",
            )

    def add(self, run: Run) -> None:
        self._runs.append(run)
        run.on_change = self.poke
        self.poke()

    def poke(self) -> None:
        if self._pump is not None:
            self._pump.poke()

    def running(self) -> bool:
        return any(run.status == "running" for run in self._runs)

    async def close(self) -> None:
        """The last one ended: the message becomes a one-line summary (is said, where it could
        not be edited)."""
        ended = ", ".join(f"{run.name} {run.status}" for run in self._runs)
        summary = f"Sub-agents: {ended}."
        try:
            if self._pump is None or self._reply is None:
                await self._channel.notify(self._place, summary)
                return
            await self._pump.close()
            await self._reply.finish(summary, Outcome.DONE, None, cards=self._cards())
        except Exception:
            logger.exception("the sub-agents' status message could not be finished")

    def _frame(self) -> Frame:
        now = time.monotonic()
        lines = [
            f"· {run.name} ({run.key}) · {run.doing} · {(run.ended or now) - run.started:.0f} s · "
            f"{run.model}" + (f" ({run.tier})" if run.tier else "")
            for run in self._runs
        ]
        return Frame("Sub-agents:\n" + "\n".join(lines), cards=self._cards())

    def _cards(self) -> tuple[Card, ...]:
        return tuple(card_of(run) for run in self._runs)


def card_of(run: Run) -> Card:
    """`run` as a live card: what it does now, and what a person may do with it."""
    running = run.status == "running"
    buttons = (Button(f"Stop {run.name}", f"/agents stop {run.key}"),) if running else ()
    buttons += (Button(f"Transcript of {run.name}", f"/agents {run.key}"),)
    return Card(
        key=run.key,
        name=run.name,
        status=run.status,
        doing=run.doing if running else run.status,
        seconds=(run.ended or time.monotonic()) - run.started,
        model=run.model,
        model_calls=run.usage.model_calls,
        buttons=buttons,
        route=f"{run.tier}: {run.route}" if run.tier else "",
    )


async def _nothing_to_save() -> None:
    """The status message is not a record: nothing to store before showing it."""
