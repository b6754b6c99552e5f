"""The `/plan` workflow as Kaiwa sees it: a turn body, a part whose plans outlive a process, and
the commands that speak of plans.

A message `/plan <task>` is a turn like any other (the runner picks this body from its text), so
the gate, the stop and the records are the runner's; `PlanWorkflow.run` opens the plan's row and
hands the work to a `PlanRun`. `/plan` alone says how to use it, `/plans` lists the
conversation's plans. Plans a dead process left unfinished are marked interrupted before any
plan of the new process exists (`left_over`), and their progress messages say so once their
channels are connected.
"""

import logging
from functools import partial

from core.channel import Channel, ChannelMessage
from core.features.approvals.questions import Approvals
from core.store import Store
from core.store.tables import Plan, utc_now
from core.text import Command, parse_command
from core.turns.body import BodyEnding, BodyTurn
from core.turns.endings import through_cancellation
from core.turns.parts import Leftover, Part, Places
from workflows.plan.progress import describe_plan, progress_text
from workflows.plan.run import PlanRun
from workflows.plan.settings import PlanSettings

logger = logging.getLogger(__name__)

PLANS_SHOWN = 10
USAGE = (
    "Usage: /plan TASK. I write a plan for the task (numbered steps), "
    "a reviewer checks it, then I carry it out step by step here, showing progress. "
    "/stop stops it (what was done is kept); /plans lists the plans of this conversation."
)
PLANS_OFF = "The /plan workflow is off ([workflows.plan].enabled = false in config.toml)."


class PlanWorkflow(Part):
    """The `/plan` turn body, and the part that resolves the plans a restart cut short."""

    def __init__(self, store: Store, approvals: Approvals, settings: PlanSettings) -> None:
        self._store = store
        self._approvals = approvals
        self.settings = settings

    async def run(self, turn: BodyTurn) -> BodyEnding:
        command = parse_command(turn.request.text)
        task = command.argument if command is not None else turn.request.text
        conversation_id, turn_id = await turn.ids()
        now = utc_now()
        opening = self._store.add_plan(
            {
                "conversation_id": conversation_id,
                "place": turn.request.place,
                "turn_id": turn_id,
                "task": task,
                "status": "drafting",
                "provenance": turn.request.provenance.value,
                "created_at": now,
                "updated_at": now,
            }
        )
        plan, stopped = await through_cancellation(opening)  # a plan stored is a plan ended
        return await PlanRun(turn, plan, self._store, self._approvals, self.settings).run(stopped)

    async def left_over(self, place: str | None) -> Leftover | None:
        """Plans a dead process left unfinished (in `place`, or everywhere): marked interrupted
        now, and their progress messages edited to say so once connected."""
        plans = await self._store.close_unfinished_plans(utc_now(), place)
        return Leftover(partial(self._show_interrupted, plans)) if plans else None

    async def _show_interrupted(self, plans: list[Plan], places: Places) -> None:
        for plan in plans:
            channel = await places.ready(plan.place)
            if channel is None or plan.progress_message_id is None:
                continue
            try:
                await channel.edit_notice(plan.place, plan.progress_message_id, progress_text(plan))
            except Exception as exc:
                logger.warning("plan %s: its progress could not be edited: %s", plan.id, exc)


class PlansCommand:
    """`/plan` alone (how to use it; with a task it is a turn) and `/plans` (the conversation's
    plans, newest first)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        answer = USAGE if command.name == "plan" else await self._listing(message.place)
        await channel.notify(message.place, answer)

    async def _listing(self, place: str) -> str:
        conversation = await self._store.active_conversation(place)
        plans = (
            await self._store.plans(conversation.id, PLANS_SHOWN)
            if conversation is not None and conversation.id is not None
            else []
        )
        if not plans:
            return "No plans in this conversation. /plan TASK makes one."
        return "Plans here, newest first:\n" + "\n".join(map(describe_plan, plans))
