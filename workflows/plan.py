"""`/plan <task>`: the agent drafts a plan, an independent critic reviews it, then the agent
carries it out step by step, the thread watching.

Why a workflow rather than a longer prompt: each phase is a separate, bounded use of the model
whose result is checked by code. The draft is structured data (`submit_plan`, a final tool whose
schema the arguments must meet), so the steps can be stored, shown and run one by one. The
critic runs aside (`BodyTurn.aside`): it reads the task and the plan and nothing else (no
conversation, no archive), with a few read-only tools and a fixed cap of `CRITIC_CALLS` model
calls, so it judges the plan rather than agreeing with the talk that led to it. A rejection goes
back to the drafter with the reasons, at most `review_rounds` times. `ask_person` then waits for
the asker's Approve / Edit / Reject (`core.features.approvals.questions`, so buttons, typed answers,
timeouts, `/stop` and restarts behave as a tool's approval does); an unattended run (a scheduled
`/plan`) skips it.

Each step is an instruction to the agent (stored with the turn, so the conversation reads the
same afterwards) and a run of the ordinary agent loop with the turn's tools; the agent may end a
step with `step_failed`, which stops the plan. A progress message (✓ done, ▶ running, · waiting)
is edited as the plan moves.

Records before notices, here too: every change of the plan is stored (awaited) before the
progress message shows it. A stop ends the running step with its partial text kept as its
result, marks the rest not run and stores that through the cancellation, then lets the stop go on
to the turn runner, which ends the turn as it ends any stopped turn.
"""

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.agent.tools import Tool, tool
from core.channel import Channel, platform_of
from core.errors import KaiwaError
from core.features.approvals.questions import Answer, Approvals
from core.store import Store
from core.store.tables import Plan, utc_now
from core.text import parse_command, plural
from core.turns.runner import BodyEnding, BodyTurn, Provenance, ending_of, through_cancellation

logger = logging.getLogger(__name__)

CRITIC_CALLS = 6
"""The critic's model calls per review, fixed: a review is a judgement, not a project."""
MAX_PERSON_EDITS = 5
PLANS_SHOWN = 10
CLIPPED = 300
NOTE_REASONS = 160
MARKS = {
    "done": "✓",
    "running": "▶",
    "waiting": "·",
    "failed": "✗",
    "stopped": "■",
    "not_run": "–",
}
JUDGED = ("reviewing", "awaiting_person", "rejected")
"""Plan states whose progress message shows each step in full."""
NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+(.+)$")

DRAFT = """[Kaiwa /plan] Before doing anything, write a plan for this task:
{task}

Call submit_plan once, with the steps in order (at most {max_steps}). Each step says what to do,
which tools or sub-agents it uses, and what counts as done. Make each step a piece of work you can
finish with the tools you have. Do not carry out any step yet."""
REVISE = """[Kaiwa /plan] {who} did not approve the plan:
{reasons}

Write a revised plan that answers this, and submit it with submit_plan."""
NO_PLAN = "[Kaiwa /plan] You did not call submit_plan. Call it now, with the steps."
STEP = """[Kaiwa /plan] Step {number} of {count}: {what}
Tools: {tools}
Done when: {done_when}

Carry out this step now, and only this step. End with a short summary of its result. If it
cannot be done, call step_failed with the reason."""
CLOSE = """[Kaiwa /plan] Every step is done. Answer the person now: what was done and what came of
it, briefly. Use no tools."""
CRITIC = """You review plans before anything is carried out. You see the task and the plan only.
Judge whether the steps, in this order, would accomplish the task: missing or needless steps,
wrong order, unclear or unverifiable "done when", steps no tool could do, risks. Use a tool only
to check a fact the judgement depends on. Then call verdict: approved true or false, and your
reasons (for a rejection, what must change). Approve a plan that is good enough; do not polish."""
RESULT_CRITIC = """You check finished work. You see the task, the plan and each step's result only.
Judge whether the task was accomplished. Then call verdict: approved true or false, and your
reasons (for a rejection, what is missing or wrong)."""


@dataclass(frozen=True)
class PlanSettings:
    enabled: bool = True
    review: bool = True
    """A critic reviews each draft before anything runs."""
    review_rounds: int = 2
    """Drafts the critic may reject before the plan is given up."""
    ask_person: bool = False
    """After the critic, the person who asked approves, edits or rejects the plan."""
    person_wait_seconds: float = 1800.0
    review_result: bool = False
    """The critic also reads the finished work, and its verdict is said with the answer."""
    critic_model: str = ""
    """The critic's model; empty: the conversation's agent's model."""
    critic_tools: list[str] = field(default_factory=lambda: ["current_time", "fetch_url"])
    """Read-only tools the critic may use (those the agent has)."""
    max_steps: int = 12


class PlanFailed(KaiwaError):
    """The plan could not go on: no plan was written, a step failed, the review failed."""


@dataclass
class _Draft:
    """What `submit_plan` received, if the drafter called it."""

    steps: list[dict[str, Any]] | None = None


@dataclass
class _Verdict:
    approved: bool | None = None
    reasons: str = ""


class PlanWorkflow:
    """The `/plan` turn body; `/plans` lists its plans."""

    usage = (
        "Usage: /plan TASK. I write a plan for the task (numbered steps), "
        "a reviewer checks it, then I carry it out step by step here, showing progress. "
        "/stop stops it (what was done is kept); /plans lists the plans of this conversation."
    )

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
        run = _PlanRun(turn, plan, self._store, self._approvals, self.settings)
        return await run.run(stopped)

    async def listing(self, place: str) -> str:
        conversation = await self._store.active_conversation(place)
        plans = (
            await self._store.plans(conversation.id, PLANS_SHOWN)
            if conversation is not None and conversation.id is not None
            else []
        )
        if not plans:
            return "No plans in this conversation. /plan TASK makes one."
        return "Plans here, newest first:\n" + "\n".join(map(describe_plan, plans))

    async def show_interrupted(self, plans: list[Plan], channels: Mapping[str, Channel]) -> None:
        """Plans a dead process left unfinished (already marked `interrupted`): their progress
        messages are edited to say so."""
        for plan in plans:
            channel = channels.get(platform_of(plan.place))
            if channel is not None and plan.progress_message_id is not None:
                try:
                    await channel.edit_notice(
                        plan.place, plan.progress_message_id, progress_text(plan)
                    )
                except Exception as exc:
                    logger.warning("plan %s: its progress could not be edited: %s", plan.id, exc)


class _PlanRun:
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
                return await self._rejected(_person_note(answer))
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
            verdict = await self._critic(CRITIC, _plan_brief(self.plan), "reviewing the plan")
            await self._save(review=verdict.reasons)
            if verdict.approved:
                return None
            if round_number == rounds:
                break
            self._turn.instruct(REVISE.format(who="The reviewer", reasons=verdict.reasons))
        reasons = _clip(self.plan.review or "none given", NOTE_REASONS)
        return await self._rejected(
            f"the reviewer rejected it {rounds} {plural(rounds, 'time')} (last: {reasons})"
        )

    async def _draft(self) -> list[dict[str, Any]]:
        """The agent writes the plan (with the conversation, and the read-only tools it has);
        a text answer is read as a numbered list; one reminder if it gave neither."""
        draft = _Draft()
        tools = {
            **{name: each for name, each in self._turn.tools.items() if each.read_only},
            "submit_plan": _submit_plan(draft, self._settings.max_steps),
        }
        await self._save(status="drafting")
        for reminder in (False, True):
            if reminder:
                self._turn.instruct(NO_PLAN)
            result = await self._turn.loop(tools).run(self._turn.messages)
            steps = draft.steps or _numbered_steps(result.answer.text)
            if steps:
                return steps[: self._settings.max_steps]
        raise PlanFailed(f"{self._turn.agent.model} wrote no plan (it answered without steps)")

    async def _critic(self, instructions: str, brief: str, doing: str) -> _Verdict:
        """The critic's verdict on `brief`: it reads that alone."""
        verdict = _Verdict()
        allowed = set(self._settings.critic_tools)
        tools = {
            **{
                name: each
                for name, each in self._turn.tools.items()
                if each.read_only and name in allowed
            },
            "verdict": _verdict_tool(verdict),
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
            return _verdict_from_text(result.answer.text)
        return verdict

    def _asks_person(self) -> bool:
        return self._settings.ask_person and self._turn.request.provenance is Provenance.PERSON

    async def _person_review(self) -> Answer:
        await self._save(status="awaiting_person")
        plan = self.plan
        asking = f"Plan #{plan.id} ({_steps_count(plan)}) is ready. Approve it?"
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
            running = _with(self.plan.steps, index, status="running")
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
                RESULT_CRITIC, _result_brief(self.plan), "reviewing the result"
            )
            await self._save(review=verdict.reasons)
            if not verdict.approved:
                note = f"the reviewer doubts the result: {_clip(verdict.reasons)}"
        self._turn.instruct(CLOSE)
        result = await self._turn.loop({}, max_iterations=2).run(self._turn.messages)
        await self._save(status="done")
        ending = ending_of(result)
        return BodyEnding(ending.outcome, note or ending.note, ending.wrapped_up)

    async def _step(self, index: int) -> None:
        """Run step `index` with the turn's tools; its answer is its result. A failure (raised,
        or `step_failed`) fails the plan."""
        failure: list[str] = []
        tools = {**self._turn.tools, "step_failed": _step_failed(failure)}
        result = await self._turn.loop(tools).run(self._turn.messages)
        if failure:
            failed = _with(self.plan.steps, index, status="failed", result=failure[0])
            await self._save(steps=failed)
            raise PlanFailed(f"step {index + 1} failed: {failure[0]}{_done_before(self.plan)}")
        text = result.answer.text.strip() or self._said_in_step()
        done = _with(self.plan.steps, index, status="done", result=text)
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


def _submit_plan(draft: _Draft, max_steps: int) -> Tool:
    async def submit_plan(steps: list[dict[str, Any]]) -> str:
        if not steps:
            raise PlanFailed("a plan needs at least one step")
        if len(steps) > max_steps:
            raise PlanFailed(f"at most {max_steps} steps; merge some")
        draft.steps = [
            {
                "what": str(step["what"]).strip(),
                "tools": str(step.get("tools", "")).strip(),
                "done_when": str(step.get("done_when", "")).strip(),
                "status": "waiting",
                "result": "",
            }
            for step in steps
        ]
        return f"Plan received: {len(steps)} {plural(len(steps), 'step')}."

    step_schema = {
        "type": "object",
        "properties": {
            "what": {"type": "string", "description": "what to do"},
            "tools": {"type": "string", "description": "the tools or sub-agents it uses"},
            "done_when": {"type": "string", "description": "what counts as done"},
        },
        "required": ["what", "done_when"],
    }
    return Tool(
        name="submit_plan",
        description="Submit the plan: its steps in order. Ends the drafting.",
        function=submit_plan,
        parameters={
            "type": "object",
            "properties": {"steps": {"type": "array", "items": step_schema}},
            "required": ["steps"],
        },
        final=True,
    )


def _verdict_tool(holder: _Verdict) -> Tool:
    @tool(final=True)
    def verdict(approved: bool, reasons: str) -> str:
        """Give your verdict: approved or not, and why (for a rejection, what must change).
        Ends the review."""
        holder.approved, holder.reasons = approved, reasons.strip()
        return "Verdict received."

    return verdict


def _step_failed(failure: list[str]) -> Tool:
    @tool(final=True)
    def step_failed(reason: str) -> str:
        """This step cannot be done: say why. Stops the plan."""
        failure.append(reason.strip() or "no reason given")
        return "The plan stops here."

    return step_failed


# -- reading the model's words --------------------------------------------------------------------


def _numbered_steps(text: str) -> list[dict[str, Any]]:
    """A plan written as a numbered list instead of through submit_plan: one step per item."""
    steps = []
    for line in text.splitlines():
        match = NUMBERED.match(line)
        if match:
            what = match.group(2).strip()
            steps.append({"what": what, "tools": "", "done_when": "", "status": "waiting"})
    return [{**step, "result": ""} for step in steps]


def _verdict_from_text(text: str) -> _Verdict:
    """A critic that answered in words: approved only if it says so first."""
    words = text.strip().split(maxsplit=1)
    first = words[0].strip(".:,!*").lower() if words else ""
    reasons = words[1].strip() if len(words) > 1 else ""
    if first in ("approve", "approved", "yes"):
        return _Verdict(True, reasons)
    return _Verdict(False, text.strip() or "the reviewer gave no verdict")


# -- what people read -------------------------------------------------------------------------


def progress_text(plan: Plan) -> str:
    """The progress message: the task, each step with its mark, and where the plan stands.
    While the plan is judged (before anything runs), each step also shows its tools and what
    counts as done: what the reviewer and the person approve."""
    lines = [f"Plan #{plan.id}: {_clip(plan.task)}"]
    detailed = plan.status in JUDGED
    for number, step in enumerate(plan.steps, 1):
        mark = MARKS.get(step.get("status", "waiting"), "·")
        lines.append(f"{mark} {number}. {step['what']}")
        if detailed:
            tools, done_when = step.get("tools") or "any", step.get("done_when") or "?"
            lines.append(f"   tools: {tools}; done when: {done_when}")
    lines.append(_standing(plan))
    return "\n".join(lines)


def _standing(plan: Plan) -> str:
    review = f" Reviewer: {_clip(plan.review)}" if plan.review else ""
    status = plan.status
    if status == "drafting":
        return "Drafting…" + (f" (round {plan.rounds + 1})" if plan.rounds else "")
    if status == "reviewing":
        return f"The reviewer is reading it (round {plan.rounds})."
    if status == "awaiting_person":
        return "Waiting for the approval of the person who asked." + review
    if status == "running":
        done = sum(step.get("status") == "done" for step in plan.steps)
        return f"Running: {done} of {_steps_count(plan)} done."
    if status == "done":
        return "Done." + review
    if status == "rejected":
        return f"Not approved: {plan.error}.{review}"
    if status == "stopped":
        return "Stopped; what was done is kept, the rest was not run."
    if status == "interrupted":
        return "Interrupted: Kaiwa restarted; the rest was not run. /plan again to go on."
    return f"Failed: {_clip(plan.error or 'unknown error')}"


def describe_plan(plan: Plan) -> str:
    """One line of `/plans`: number, state, steps done, task, when."""
    done = sum(step.get("status") == "done" for step in plan.steps)
    steps = f"{done}/{len(plan.steps)} steps" if plan.steps else "no steps yet"
    when = f"{plan.created_at:%Y-%m-%d %H:%M}"
    return f"#{plan.id} · {plan.status} · {steps} · {when} · {_clip(plan.task, 80)}"


def _plan_brief(plan: Plan) -> str:
    steps = "\n".join(
        f"{number}. {step['what']} (tools: {step.get('tools') or 'unspecified'}; done when: "
        f"{step.get('done_when') or 'unspecified'})"
        for number, step in enumerate(plan.steps, 1)
    )
    return f"Task:\n{plan.task}\n\nPlan:\n{steps}"


def _result_brief(plan: Plan) -> str:
    results = "\n".join(
        f"{number}. {step['what']}\nResult: {step.get('result') or '(none)'}"
        for number, step in enumerate(plan.steps, 1)
    )
    return f"Task:\n{plan.task}\n\nSteps and results:\n{results}"


def _person_note(answer: Answer) -> str:
    if answer.decision == "denied":
        return f"{answer.by or 'the person'} rejected it"
    if answer.decision == "timed_out":
        return "nobody approved it in time"
    return "its approval was cancelled"


def _done_before(plan: Plan) -> str:
    done = [str(n) for n, step in enumerate(plan.steps, 1) if step.get("status") == "done"]
    return f"; done before it: {plural(len(done), 'step')} {', '.join(done)}" if done else ""


def _steps_count(plan: Plan) -> str:
    return f"{len(plan.steps)} {plural(len(plan.steps), 'step')}"


def _with(steps: list[dict[str, Any]], index: int, **changes: Any) -> list[dict[str, Any]]:
    """`steps` with step `index` changed (a new list: the stored JSON is written whole)."""
    return [{**step, **changes} if number == index else step for number, step in enumerate(steps)]


def _clip(text: str, limit: int = CLIPPED) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
