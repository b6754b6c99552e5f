"""`[workflows.plan]` in config, and the one error a plan ends with when it cannot go on."""

from dataclasses import dataclass, field

from core.errors import KaiwaError


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
