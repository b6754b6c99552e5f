"""What the model is told and what it gives back in a plan: the phases' prompts, their final
tools, and reading a plan or a verdict from plain text when a model answers without the tool.

The draft is structured data (`submit_plan`, a final tool whose schema the arguments must meet),
so the steps can be stored, shown and run one by one; the critic's judgement is `verdict`; a
step that cannot be done ends with `step_failed`. A model that writes a numbered list, or
starts its answer with "approved", is read as if it had called the tool.
"""

import re
from dataclasses import dataclass
from typing import Any

from core.agent.tools import Tool, tool
from core.text import plural
from workflows.plan.settings import PlanFailed

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


@dataclass
class Draft:
    """What `submit_plan` received, if the drafter called it."""

    steps: list[dict[str, Any]] | None = None


@dataclass
class Verdict:
    approved: bool | None = None
    reasons: str = ""


def submit_plan_tool(draft: Draft, max_steps: int) -> Tool:
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


def verdict_tool(holder: Verdict) -> Tool:
    @tool(final=True)
    def verdict(approved: bool, reasons: str) -> str:
        """Give your verdict: approved or not, and why (for a rejection, what must change).
        Ends the review."""
        holder.approved, holder.reasons = approved, reasons.strip()
        return "Verdict received."

    return verdict


def step_failed_tool(failure: list[str]) -> Tool:
    @tool(final=True)
    def step_failed(reason: str) -> str:
        """This step cannot be done: say why. Stops the plan."""
        failure.append(reason.strip() or "no reason given")
        return "The plan stops here."

    return step_failed


# -- reading the model's words --------------------------------------------------------------------


def numbered_steps(text: str) -> list[dict[str, Any]]:
    """A plan written as a numbered list instead of through submit_plan: one step per item."""
    steps = []
    for line in text.splitlines():
        match = NUMBERED.match(line)
        if match:
            what = match.group(2).strip()
            steps.append({"what": what, "tools": "", "done_when": "", "status": "waiting"})
    return [{**step, "result": ""} for step in steps]


def verdict_from_text(text: str) -> Verdict:
    """A critic that answered in words: approved only if it says so first."""
    words = text.strip().split(maxsplit=1)
    first = words[0].strip(".:,!*").lower() if words else ""
    reasons = words[1].strip() if len(words) > 1 else ""
    if first in ("approve", "approved", "yes"):
        return Verdict(True, reasons)
    return Verdict(False, text.strip() or "the reviewer gave no verdict")


# -- what people read -------------------------------------------------------------------------
