"""What a turn is, as everything that starts one or reads its end sees it.

A turn is asked for with a `TurnRequest` (by the dispatcher, recovery, a scheduled firing, a
cluster's owner, or a part that holds something for a conversation) and ends with a
`TurnResult`. These are plain values, kept apart from the runner so that whoever starts turns
can be read without the runner's code. `TurnSettings` is the configuration a turn reads once,
when it starts (invariant 1: a snapshot, never a lock).
"""

import asyncio
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum

from core.agent.context import ContextPolicy
from core.agent.profile import AgentProfile
from core.channel import Attachment, Delivery
from core.store import StartedTurn


class Provenance(StrEnum):
    PERSON = "person"
    SCHEDULE = "schedule"
    SUBAGENT = "subagent"


CUT_FIRING = (
    "A scheduled run here was cut short by a restart; its task runs again at its next time "
    "(/tasks lists it, /tasks run ID runs it now)."
)
"""What a place is told of a scheduled run a restart cut short: by recovery, for a turn of
provenance `schedule` that showed nothing; by the scheduler, for a run whose turn never began."""


@dataclass(frozen=True)
class TurnSettings:
    """Read once at the start of each turn. A conversation runs the agent stored with it; a new
    one gets its channel's agent (`channel_agents`, by platform), else `agent`."""

    agent: AgentProfile
    agents: Mapping[str, AgentProfile] = field(default_factory=dict)
    """Every agent by name (`agent` is among them, whether listed or not)."""
    channel_agents: Mapping[str, str] = field(default_factory=dict)
    tool_timeout: float = 60.0
    tool_grace: float = 2.0
    max_cached_conversations: int = 1000
    context: ContextPolicy = field(default_factory=ContextPolicy)

    def named(self, name: str) -> AgentProfile | None:
        return self.agent if name == self.agent.name else self.agents.get(name)

    def for_new_conversation(self, platform: str) -> AgentProfile:
        return self.named(self.channel_agents.get(platform, "")) or self.agent


@dataclass(frozen=True)
class TurnRequest:
    platform: str
    place: str
    text: str
    provenance: Provenance = Provenance.PERSON
    author: str | None = None
    """Who wrote the message, as the store keeps it (a name where the platform gives one)."""
    person: str | None = None
    """The platform's id of that person (what tools see as `ToolContext.person`)."""
    reply_to: str | None = None
    inbound_event_id: int | None = None
    images: tuple[bytes, ...] = ()
    attachments: tuple[Attachment, ...] = ()
    """The message's files besides pictures, read as the turn opens (`core.turns.parts.Reading`)."""
    attempt: int = 1
    """2 for a turn run again because a restart interrupted it before it showed anything."""
    proceed: Callable[[], bool] | None = None
    """Asked once the turn holds its conversation's gate: False skips it, unrecorded (a
    scheduled task cancelled while its firing waited behind another turn)."""
    silent_marker: str | None = None
    """An answer that is exactly this posts nothing (a scheduled run with nothing to say)."""


@dataclass(frozen=True)
class TurnResult:
    status: str
    text: str = ""
    error: str | None = None
    turn_id: int | None = None
    model_calls: int = 0
    wrapped_up: bool = False
    """The model ran out of calls with tools pending and answered in one more call without."""
    delivery: Delivery = Delivery.SHOWN
    """What the platform shows of the reply (`NOTHING`: not one message could be posted)."""
    silent: bool = False
    """The answer was the silent marker, so nothing was posted."""


@dataclass(frozen=True)
class StopReport:
    stopped_running: bool
    dropped: int
    running: int = 0
    """At shutdown: how many turns were running (each stopped)."""


@dataclass
class TurnInLog:
    """Which turn the code running now works for, as a log line can name it: the runner sets it
    (`LOGGED_TURN`) in a turn's task, and every task the turn starts inherits it. The turn's id
    is known once its row is stored (`started`)."""

    place: str
    started: "asyncio.Future[StartedTurn] | None" = None

    @property
    def turn_id(self) -> int | None:
        started = self.started
        if started is None or not started.done() or started.cancelled() or started.exception():
            return None
        return started.result().turn_id


LOGGED_TURN: ContextVar[TurnInLog | None] = ContextVar("kaiwa_logged_turn", default=None)
