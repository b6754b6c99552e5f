"""One plan inside one turn, from draft to its end: draft, review, the person's approval, the
steps.

Each phase is a separate, bounded use of the model whose result is checked by code. The critic
runs aside (`BodyTurn.aside`) with a fixed cap of `CRITIC_CALLS` model calls; a rejection goes
back to the drafter with the reasons, at most `review_rounds` times. Each step is an instruction
to the agent (stored with the turn) and a run of the ordinary agent loop with the turn's tools.

Records before notices, here too: every change of the plan is stored (awaited) before the
progress message shows it. A stop ends the running step with its partial text kept as its
result, marks the rest not run and stores that through the cancellation, then lets the stop go
on to the turn runner.
"""

import asyncio
import logging
from typing import Any

from core.errors import KaiwaError
from core.features.approvals.questions import Answer, Approvals
from core.store import Store
from core.store.tables import Plan, utc_now
from core.text import plural
from core.turns.body import BodyEnding, BodyTurn, ending_of
from core.turns.endings import through_cancellation
from core.turns.turn import Provenance
from workflows.plan.progress import (
    clip,
    done_before,
    person_note,
    plan_brief,
    progress_text,
    result_brief,
    steps_count,
    with_step,
)
from workflows.plan.settings import PlanFailed, PlanSettings
from workflows.plan.texts import (
    CLOSE,
    CRITIC,
    DRAFT,
    NO_PLAN,
    RESULT_CRITIC,
    REVISE,
    STEP,
    Draft,
    Verdict,
    numbered_steps,
    step_failed_tool,
    submit_plan_tool,
    verdict_from_text,
    verdict_tool,
)

logger = logging.getLogger(__name__)

CRITIC_CALLS = 6
"""The critic's model calls per review, fixed: a review is a judgement, not a project."""
MAX_PERSON_EDITS = 5
NOTE_REASONS = 160


class PlanRun:
    """One plan, from draft to its end, inside one turn."""

    def __init__(
        self,
        turn: BodyTurn,
        plan: Plan,
        store: Store,
        approvals: Approvals,
        settings: PlanSettings,
    ) -> None:
        self._turn = turn
        self.plan = plan
        self._store = store
        self._approvals = approvals
        self._settings = settings
        self._step_began: str | None = None
        """The reply's text when the running step began (a stop keeps what came after)."""
        self._shown = ""
        """The progress message as it was last shown."""

    async def run(self, stopped: bool) -> BodyEnding:
        """The plan from draft to its end; `stopped`: a stop came while it was being stored."""
        try:
            if stopped:
                raise asyncio.CancelledError
            approved = await self._settle_plan()
            if approved is not None:
                return approved
            return await self._carry_out()
        except asyncio.CancelledError:
            await self._end("stopped", None)
            raise
        except Exception as exc:
            await self._end("failed", str(exc) if isinstance(exc, KaiwaError) else repr(exc))
            raise

    # -- draft and review ------------------------------------------------------------------------

    async def _settle_plan(self) -> BodyEnding | None:
        """Draft, review and (if asked) have the person approve the plan: None once it may run,
        else how the turn ends (rejected)."""
        self._turn.instruct(DRAFT.format(task=self.plan.task, max_steps=self._settings.max_steps))
        for _ in range(MAX_PERSON_EDITS + 1):
            rejection = await self._reviewed_draft()
            if rejection is not None:
                return rejection
            if not self._asks_person():
                return None
            answer = await self._person_review()
            if answer.decision == "allowed":
                return None
            if answer.decision != "edited":
                return await self._rejected(person_note(answer))
            await self._save(review=f"{answer.by} asked for changes: {answer.text}")
            self._turn.instruct(REVISE.format(who=answer.by or "The person", reasons=answer.text))
        return await self._rejected(f"changed {MAX_PERSON_EDITS} times; start again with /plan")

    async def _reviewed_draft(self) -> BodyEnding | None:
        """Drafts until the critic approves one (or without a critic, the first); how the turn
        ends if none is approved within the rounds."""
        rounds = self._settings.review_rounds
        for round_number in range(1, rounds + 1):
            steps = await self._draft()
            if not self._settings.review:
                await self._save(steps=steps, show=False)  # shown with what comes next
                return None
            await self._save(steps=steps, status="reviewing", rounds=self.plan.rounds + 1)
            verdict = await self._critic(CRITIC, plan_brief(self.plan), "reviewing the plan")
            await self._save(review=verdict.reasons)
            if verdict.approved:
                return None
            if round_number == rounds:
                break
            self._turn.instruct(REVISE.format(who="The reviewer", reasons=verdict.reasons))
        reasons = clip(self.plan.review or "none given", NOTE_REASONS)
        return await self._rejected(
            f"the reviewer rejected it {rounds} {plural(rounds, 'time')} (last: {reasons})"
        )

    async def _draft(self) -> list[dict[str, Any]]:
        """The agent writes the plan (with the conversation, and the read-only tools it has);
        a text answer is read as a numbered list; one reminder if it gave neither."""
        draft = Draft()
        tools = {
            **{name: each for name, each in self._turn.tools.items() if each.read_only},
            "submit_plan": submit_plan_tool(draft, self._settings.max_steps),
        }
        await self._save(status="drafting")
        for reminder in (False, True):
            if reminder:
                self._turn.instruct(NO_PLAN)
            result = await self._turn.loop(tools).run(self._turn.messages)
            steps = draft.steps or numbered_steps(result.answer.text)
            if steps:
                return steps[: self._settings.max_steps]
        raise PlanFailed(f"{self._turn.agent.model} wrote no plan (it answered without steps)")

    async def _critic(self, instructions: str, brief: str, doing: str) -> Verdict:
        """The critic's verdict on `brief`: it reads that alone."""
        verdict = Verdict()
        allowed = set(self._settings.critic_tools)
        tools = {
            **{
                name: each
                for name, each in self._turn.tools.items()
                if each.read_only and name in allowed
            },
            "verdict": verdict_tool(verdict),
        }
        model = self._settings.critic_model or self._turn.agent.model
        loop = self._turn.aside(model, tools, max_iterations=CRITIC_CALLS, doing=doing)
        messages = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": brief},
        ]
        try:
            result = await loop.run(messages)
        except KaiwaError as exc:
            raise PlanFailed(f"the review failed: {exc}") from exc
        if verdict.approved is None:
            return verdict_from_text(result.answer.text)
        return verdict

    def _asks_person(self) -> bool:
        return self._settings.ask_person and self._turn.request.provenance is Provenance.PERSON

    async def _person_review(self) -> Answer:
        await self._save(status="awaiting_person")
        plan = self.plan
        self._turn.status(f"waiting for your answer to plan #{plan.id}")
        asking = f"Plan #{plan.id} ({steps_count(plan)}) is ready. Approve it?"
        return await self._approvals.review(
            f"plan #{plan.id}", asking, self._settings.person_wait_seconds
        )

    async def _rejected(self, why: str) -> BodyEnding:
        await self._save(status="rejected", error=why)
        return BodyEnding(note=f"plan #{self.plan.id} not approved: {why}; nothing was run")

    # -- carrying it out -------------------------------------------------------------------------

    async def _carry_out(self) -> BodyEnding:
        count = len(self.plan.steps)
        for index, step in enumerate(self.plan.steps):
            self._step_began = self._turn.shown()
            running = with_step(self.plan.steps, index, status="running")
            await self._save(status="running", steps=running)
            self._turn.instruct(
                STEP.format(
                    number=index + 1,
                    count=count,
                    what=step["what"],
                    tools=step.get("tools") or "any you need",
                    done_when=step.get("done_when") or "the step is complete",
                )
            )
            await self._step(index)
        note = None
        if self._settings.review_result:
            verdict = await self._critic(
                RESULT_CRITIC, result_brief(self.plan), "reviewing the result"
            )
            await self._save(review=verdict.reasons)
            if not verdict.approved:
                note = f"the reviewer doubts the result: {clip(verdict.reasons)}"
        self._turn.instruct(CLOSE)
        result = await self._turn.loop({}, max_iterations=2).run(self._turn.messages)
        await self._save(status="done")
        ending = ending_of(result)
        return BodyEnding(ending.outcome, note or ending.note, ending.wrapped_up)

    async def _step(self, index: int) -> None:
        """Run step `index` with the turn's tools; its answer is its result. A failure (the
        model's error, or `step_failed`) fails the plan, saying which step, why, and which steps
        were done before it."""
        failure: list[str] = []
        tools = {**self._turn.tools, "step_failed": step_failed_tool(failure)}
        try:
            result = await self._turn.loop(tools).run(self._turn.messages)
        except KaiwaError as exc:  # the model or a limit, not the step's own verdict
            raise PlanFailed(f"step {index + 1} failed: {exc}{done_before(self.plan)}") from exc
        if failure:
            failed = with_step(self.plan.steps, index, status="failed", result=failure[0])
            await self._save(steps=failed)
            raise PlanFailed(f"step {index + 1} failed: {failure[0]}{done_before(self.plan)}")
        text = result.answer.text.strip() or self._said_in_step()
        done = with_step(self.plan.steps, index, status="done", result=text)
        await self._save(steps=done, show=False)  # shown with the next step running

    def _said_in_step(self) -> str:
        """What the reply said since the running step began."""
        before, now = self._step_began or "", self._turn.shown()
        return now[len(before) :].strip() if now.startswith(before) else now.strip()

    # -- state -----------------------------------------------------------------------------------

    async def _end(self, status: str, error: str | None) -> None:
        """The plan ends early (`stopped`, `failed`): the running step keeps what it said as its
        result, the steps after it are not run; stored through a cancellation, then shown."""
        ending = "stopped" if status == "stopped" else "failed"
        partial = self._said_in_step() if self._step_began is not None else ""

        def ended(step: dict[str, Any]) -> dict[str, Any]:
            if step.get("status") == "running":
                return {**step, "status": ending, "result": partial or error or ""}
            if step.get("status") == "waiting":
                return {**step, "status": "not_run"}
            return step

        steps = [ended(step) for step in self.plan.steps]
        await through_cancellation(self._save(status=status, steps=steps, error=error))

    async def _save(self, *, show: bool = True, **values: Any) -> None:
        """Store the change, then show it (a progress message that cannot be edited is only
        logged: the plan goes on)."""
        values["updated_at"] = utc_now()
        assert self.plan.id is not None
        await self._store.update_plan(self.plan.id, values)
        self.plan = self.plan.model_copy(update=values)
        if show:
            await self._show()

    async def _show(self) -> None:
        """Post the progress message, or edit it if it reads differently now (a platform that
        cannot edit, the terminal, prints it again: only changes are worth it)."""
        text = progress_text(self.plan)
        if text == self._shown:
            return
        self._shown = text
        channel, place = self._turn.channel, self.plan.place
        try:
            if self.plan.progress_message_id is None:
                posted = await channel.notify(place, text)
                if posted:
                    assert self.plan.id is not None
                    self.plan = self.plan.model_copy(update={"progress_message_id": posted[-1]})
                    await self._store.update_plan(self.plan.id, {"progress_message_id": posted[-1]})
            else:
                await channel.edit_notice(place, self.plan.progress_message_id, text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("plan %s: its progress could not be shown: %s", self.plan.id, exc)


# -- the tools the phases get --------------------------------------------------------------------
