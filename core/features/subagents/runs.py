"""A sub-agent run as this process knows it, and the settings that bound runs.

Plain data shared by the package's modules: `Run` is what `/agents` shows and what a turn
carries once it ends; `Claims` are the reports one turn carries. Ids (`a1`, `a2`, ...) come
from the store, never reused in a conversation; names are slugs of the model's name for the
task, or of the instruction (`slug`). Model-facing text says `name (id, profile)`
(`Run.label`) and every command and tool accepts either (`Run.matches`).
"""

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.agent.messages import UsageTotals
from core.channel import platform_of
from core.features.subagents.routing import RoutingSettings
from core.store.tables import SubagentRun

WORD = re.compile(r"[a-z0-9]+(?:[.:/-][a-z0-9]+)*")
NAME_WORDS = 4


@dataclass(frozen=True)
class SubagentSettings:
    """[subagents] in config: the caps, and the grace a stopped run gets."""

    max_total: int = 20
    """Runs a conversation may ever have."""
    max_batch: int = 5
    """Runs one `delegate` call may launch."""
    max_concurrent: int = 5
    """Runs of one conversation at once."""
    max_running: int = 20
    """Runs of every conversation at once, in this process."""
    max_iterations: int = 30
    """Model calls one run may make."""
    max_depth: int = 2
    """Levels of sub-agents: at 2, a sub-agent may delegate, its sub-agents may not."""
    stop_grace: float = 2.0
    status_message: bool = True
    """Show the conversation's running sub-agents in one message, edited as they go."""
    routing: RoutingSettings = field(default_factory=RoutingSettings)


@dataclass(eq=False)
class Run:
    """A sub-agent run as this process knows it."""

    row_id: int
    key: str
    name: str
    profile: str
    model: str
    task: str
    place: str
    platform: str
    conversation_id: int = 0
    parent: "Run | None" = None
    """The run that launched this one, which alone receives its report."""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    status: str = "running"
    """running, done, stopped, failed, lost (a dead process's, read back after a restart)."""
    doing: str = "thinking"
    report: str = ""
    usage: UsageTotals = field(default_factory=UsageTotals)
    last_tool: str | None = None
    inbox: list[str] = field(default_factory=list)
    """What people told it with `/agents tell`, each naming who, not read yet."""
    claimed: bool = False
    delivery: str = "pending"
    worker: "asyncio.Task[None] | None" = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    on_change: Callable[[], None] = lambda: None
    """Told whenever what `/agents` would show of the run changes."""

    tier: str = ""
    """The tier routing chose ('' when it runs its profile's model)."""
    route: str = ""
    """Why routing chose that tier, without the tier ('' when it runs its profile's model)."""
    policy: RoutingSettings = field(default_factory=RoutingSettings)
    """The routing it was launched under, which routes the runs it launches in turn (as it was
    when it started, whatever the settings say later)."""
    granted: frozenset[str] = frozenset()
    """Tools needing approval that a person allowed for this run when it was delegated."""

    @classmethod
    def read_back(
        cls, place: str, row: SubagentRun, *, status: str | None = None, report: str | None = None
    ) -> "Run":
        """An ended run of a dead process, from its row (with `status` and `report` when they
        are being changed): its report waits for a turn to carry it."""
        assert row.id is not None
        platform = platform_of(place)
        run = cls(row.id, row.key, row.name, row.profile, row.model, row.task, place, platform)
        run.tier, run.route = row.tier or "", row.route or ""
        run.status = status or row.status
        run.report = report if report is not None else row.report or ""
        run.ended = time.monotonic()
        run.finished.set()
        return run

    def label(self) -> str:
        return f"{self.name} ({self.key}, {self.profile})"

    def matches(self, wanted: str) -> bool:
        return wanted in (self.key, self.name)

    def depth(self) -> int:
        """1 for a run the conversation's agent launched, 2 for one that run launched, ..."""
        depth, above = 1, self.parent
        while above is not None:
            depth, above = depth + 1, above.parent
        return depth

    def deliverable(self) -> bool:
        """A report the conversation still has to get (a nested run's goes to its parent)."""
        return (
            self.parent is None
            and self.status != "running"
            and self.delivery == "pending"
            and not self.claimed
        )


@dataclass
class Claims:
    """The reports one turn carries; they count as delivered once its records are stored."""

    runs: list[Run] = field(default_factory=list)

    def take(self, runs: Sequence[Run]) -> list[Run]:
        """Claim each deliverable run of `runs` for this turn; those claimed."""
        ready = [run for run in runs if run.deliverable()]
        for run in ready:
            run.claimed = True
        self.runs += ready
        return ready


def format_report(run: Run) -> str:
    """One shape for every delivery, so the model learns one."""
    how = {
        "done": "reported",
        "stopped": "was stopped; what it had",
        "failed": "failed",
        "lost": "was lost when Kaiwa restarted; what it had written",
    }.get(run.status, run.status)
    return f"[Sub-agent report] {run.label()} {how}:\n{run.report or '(nothing)'}"


def slug(text: str, taken: Sequence[str]) -> str:
    """A kebab-case name from `text` (at most four words; bare numbers dropped, `10.0.0.5` kept
    whole), made unique among `taken` (`port-scan-2`)."""
    words = [w for w in WORD.findall(text.lower()) if not w.isdigit()][:NAME_WORDS]
    base = "-".join(w.strip(".:/-") for w in words) or "task"
    name, number = base, 2
    while name in taken:
        name, number = f"{base}-{number}", number + 1
    return name
