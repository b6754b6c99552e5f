"""What people read of a plan: its progress message (✓ done, ▶ running, · waiting), a line of
`/plans`, and the briefs the critic reads (the task and the plan, or the steps and their
results, and nothing else).
"""

from typing import Any

from core.features.approvals.questions import Answer
from core.store.tables import Plan
from core.text import plural

CLIPPED = 300
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


def progress_text(plan: Plan) -> str:
    """The progress message: the task, each step with its mark, and where the plan stands.
    While the plan is judged (before anything runs), each step also shows its tools and what
    counts as done: what the reviewer and the person approve."""
    lines = [f"Plan #{plan.id}: {clip(plan.task)}"]
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
    review = f" Reviewer: {clip(plan.review)}" if plan.review else ""
    status = plan.status
    if status == "drafting":
        return "Drafting…" + (f" (round {plan.rounds + 1})" if plan.rounds else "")
    if status == "reviewing":
        return f"The reviewer is reading it (round {plan.rounds})."
    if status == "awaiting_person":
        return "Waiting for the approval of the person who asked." + review
    if status == "running":
        done = sum(step.get("status") == "done" for step in plan.steps)
        return f"Running: {done} of {steps_count(plan)} done."
    if status == "done":
        return "Done." + review
    if status == "rejected":
        return f"Not approved: {plan.error}.{review}"
    if status == "stopped":
        return "Stopped; what was done is kept, the rest was not run."
    if status == "interrupted":
        return "Interrupted: Kaiwa restarted; the rest was not run. /plan again to go on."
    return f"Failed: {clip(plan.error or 'unknown error')}"


def describe_plan(plan: Plan) -> str:
    """One line of `/plans`: number, state, steps done, task, when."""
    done = sum(step.get("status") == "done" for step in plan.steps)
    steps = f"{done}/{len(plan.steps)} steps" if plan.steps else "no steps yet"
    when = f"{plan.created_at:%Y-%m-%d %H:%M}"
    return f"#{plan.id} · {plan.status} · {steps} · {when} · {clip(plan.task, 80)}"


def plan_brief(plan: Plan) -> str:
    steps = "\n".join(
        f"{number}. {step['what']} (tools: {step.get('tools') or 'unspecified'}; done when: "
        f"{step.get('done_when') or 'unspecified'})"
        for number, step in enumerate(plan.steps, 1)
    )
    return f"Task:\n{plan.task}\n\nPlan:\n{steps}"


def result_brief(plan: Plan) -> str:
    results = "\n".join(
        f"{number}. {step['what']}\nResult: {step.get('result') or '(none)'}"
        for number, step in enumerate(plan.steps, 1)
    )
    return f"Task:\n{plan.task}\n\nSteps and results:\n{results}"


def person_note(answer: Answer) -> str:
    if answer.decision == "denied":
        return f"{answer.by or 'the person'} rejected it"
    if answer.decision == "timed_out":
        return "nobody approved it in time"
    return "its approval was cancelled"


def done_before(plan: Plan) -> str:
    done = [str(n) for n, step in enumerate(plan.steps, 1) if step.get("status") == "done"]
    return f"; done before it: {plural(len(done), 'step')} {', '.join(done)}" if done else ""


def steps_count(plan: Plan) -> str:
    return f"{len(plan.steps)} {plural(len(plan.steps), 'step')}"


def with_step(steps: list[dict[str, Any]], index: int, **changes: Any) -> list[dict[str, Any]]:
    """`steps` with step `index` changed (a new list: the stored JSON is written whole)."""
    return [{**step, **changes} if number == index else step for number, step in enumerate(steps)]


def clip(text: str, limit: int = CLIPPED) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
