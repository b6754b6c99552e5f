"""One sub-agent run: an agent loop of its own, from its task to its report.

A run has its profile's tools (narrowed by the delegation, never widened), each through the
turn parts' guard, so a call that needs a person's yes is refused rather than asked (nobody is
there to answer; `ToolContext.granted` holds what the delegation was allowed). It has its own
window and compaction (its compactions change only its own context: the transcript keeps every
message) and its own cap, and ends when it calls `report`. One that answers in plain text
reports that text; one that is stopped reports what it had said so far. A run's model requests
are `background` (`core.agent.slots`): a person's go first.

The transcript goes to the store as it happens (`RunSink`), and the run's ending is stored
durably before anyone hears of it.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.agent.context import Author, Calibration, Compaction, Compactor, ContextSettings
from core.agent.loop import AgentLoop, ChatModel, LoopSettings
from core.agent.messages import AssistantMessage, ToolCall, ToolResult, Usage
from core.agent.profile import AgentProfile
from core.agent.tools import Tool, ToolContext, called_from, tool
from core.errors import KaiwaError, StoreError
from core.features.subagents.runs import Run
from core.metrics import SUBAGENT_RUNS, SUBAGENTS_RUNNING
from core.store import Store, not_awaited
from core.store.tables import utc_now
from core.text import plural
from core.turns.parts import TurnParts

logger = logging.getLogger(__name__)

REPORT_RULE = (
    "\n\nYou are a sub-agent working on one task for another agent. When you are done, or cannot "
    "go further, call `report` once with a short summary of what you found; that ends your work."
)
TASK_AUTHOR = Author("this sub-agent's task", "hand it a smaller task")
"""Whose message opens a run's requests, as a refusal of it says."""


@dataclass(frozen=True)
class Workbench:
    """What every run works with."""

    store: Store
    model: ChatModel
    window: Callable[[AgentProfile], Awaitable[ContextSettings]]
    parts: TurnParts
    tool_timeout: float
    tool_grace: float
    max_iterations: int
    """`[subagents].max_iterations`: no run makes more model calls, whatever its profile says."""


async def work(run: Run, profile: AgentProfile, tools: dict[str, Tool], bench: Workbench) -> None:
    """Run `run` to its end: its status and report set, and stored."""
    sink = RunSink(bench.store, run)
    messages = [
        {"role": "system", "content": profile.system_prompt + REPORT_RULE},
        {"role": "user", "content": run.task},
    ]
    sink.add("user", run.task)
    SUBAGENTS_RUNNING.inc()
    try:
        context = await bench.window(profile)
        offered = bench.parts.guarded({**tools, "report": _report_tool()}, bench.tool_timeout)
        loop = AgentLoop(
            bench.model,
            offered,
            sink,
            LoopSettings(
                agent=profile.name,
                model=profile.model,
                think=profile.think,
                max_iterations=min(profile.run_iterations, bench.max_iterations),
                tool_timeout=bench.tool_timeout,
                tool_grace=bench.tool_grace,
                background=True,
            ),
            Compactor(
                bench.model, profile.model, context, Calibration(), _no_record, author=TASK_AUTHOR
            ),
            inbox=lambda: sink.noted(_read(run)),
        )
        unattended = ToolContext(run.platform, run.place, None, "subagent", granted=run.granted)
        with called_from(unattended):
            result = await loop.run(messages)
        run.status, run.report = "done", result.answer.text
    except asyncio.CancelledError:
        run.status, run.report = "stopped", sink.said() or "(nothing yet)"
    except KaiwaError as exc:
        run.status, run.report = "failed", str(exc)
    except Exception as exc:
        logger.exception("sub-agent %s in %s failed unexpectedly", run.key, run.place)
        run.status, run.report = "failed", f"internal error ({type(exc).__name__})"
    finally:
        SUBAGENTS_RUNNING.dec()
    SUBAGENT_RUNS.labels(run.status).inc()
    await _store_ending(run, bench.store)


async def _store_ending(run: Run, store: Store) -> None:
    run.ended, run.doing = time.monotonic(), run.status
    values = {
        "status": run.status,
        "report": run.report,
        "ended_at": utc_now(),
        "unread": len(run.inbox),
        "model_calls": run.usage.model_calls,
        "prompt_tokens": None if run.usage.unknown_calls else run.usage.prompt_tokens,
        "output_tokens": None if run.usage.unknown_calls else run.usage.output_tokens,
        "model_seconds": run.usage.seconds,
    }
    try:
        await store.record_run(run.row_id, values=values, durable=True)
    except StoreError as exc:
        logger.error(
            "sub-agent %s in %s: its ending could not be stored: %s", run.key, run.place, exc
        )
    logger.info(
        "sub-agent %s (%s) in %s ended %s after %d model %s",
        run.key,
        run.name,
        run.place,
        run.status,
        run.usage.model_calls,
        plural(run.usage.model_calls, "call"),
    )


class RunSink:
    """A run's loop sink: the transcript goes to the store as it happens; `/agents` reads the
    run's state from here."""

    def __init__(self, store: Store, run: Run) -> None:
        self._store = store
        self._run = run
        self._seq = 0
        self._text = ""
        self._said: list[str] = []

    def add(self, role: str, text: str, tool_name: str | None = None, calls: Any = None) -> None:
        self._seq += 1
        row = (self._seq, role, text, tool_name, calls)
        not_awaited(self._store.record_run(self._run.row_id, messages=[row]), "a sub-agent's step")

    def noted(self, notes: list[str]) -> list[str]:
        for note in notes:
            self.add("user", note)
        return notes

    def said(self) -> str:
        return "\n\n".join([*self._said, self._text] if self._text else self._said)

    def status(self, text: str) -> None:
        self._doing("waiting")

    def thinking(self, delta: str) -> None:
        self._doing("thinking")

    def text(self, delta: str) -> None:
        self._text += delta
        self._doing("writing")

    def _doing(self, doing: str) -> None:
        if self._run.doing != doing:
            self._run.doing = doing
            self._run.on_change()

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self._run.usage.add(usage)
        self._text = ""
        if message is None:
            return
        if message.text:
            self._said.append(message.text)
        calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls] or None
        self.add("assistant", message.text, calls=calls)

    def tool_started(self, call: ToolCall) -> None:
        self._run.last_tool = call.name
        self._doing(f"using {call.name}")

    def tool_finished(self, result: ToolResult) -> None:
        self._doing("thinking")
        self.add("tool", result.content, tool_name=result.call.name)


def _report_tool() -> Tool:
    @tool(final=True)
    def report(summary: str, findings: str = "") -> str:
        """Hand back your result: a short summary, and findings in detail if there are any.
        Ends your work."""
        return f"{summary}\n\n{findings}".strip()

    return report


def _read(run: Run) -> list[str]:
    notes, run.inbox = run.inbox, []
    return notes


def _no_record(compaction: Compaction) -> None:
    """A run's compactions change only its own context; its transcript keeps every message."""
