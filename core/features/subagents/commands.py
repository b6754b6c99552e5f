"""`/agents`: the conversation's sub-agents, one in detail, stopping one, telling one something.

A list shows the runs the store has for the conversation, running ones first, with what this
process knows of those still live (what each does now, its usage so far), and a Stop button
for each running one shown (its command, `/agents stop <id>`, is the fallback where there are
no buttons). Every verb takes a run's name or its id.
"""

import time
from collections.abc import Sequence

from core.channel import Button, Channel, ChannelMessage
from core.features.subagents.agents import Subagents
from core.features.subagents.runs import Run
from core.store import Store
from core.store.tables import SubagentMessage, SubagentRun, utc_now
from core.text import Command

AGENTS_SHOWN = 12
AGENT_STEPS_SHOWN = 6


class AgentsCommand:
    """The `/agents` handler of a dispatcher (`core.dispatch.commands.Commands.add`)."""

    def __init__(self, subagents: Subagents, store: Store) -> None:
        self._subagents = subagents
        self._store = store

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, rest = command.argument.partition(" ")
        buttons: list[Button] = []
        who = message.author_name or message.author_id
        if verb == "stop":
            answer = await self._stop(message.place, rest.strip(), who)
        elif verb == "tell":
            target, _, text = rest.strip().partition(" ")
            answer = self._tell(message.place, target, text.strip(), who)
        elif verb:
            answer = await self._detail(message.place, command.argument.strip())
        else:
            answer, buttons = await self._listing(message.place)
        await channel.notify(message.place, answer, buttons)

    async def _listing(self, place: str) -> tuple[str, list[Button]]:
        rows = await self._runs_here(place)
        if not rows:
            return "No sub-agents in this conversation.", []
        live = {run.key: run for run in self._subagents.live(place)}
        cap = self._subagents.settings.max_iterations
        ordered = sorted(rows, key=lambda row: (row.status != "running", -(row.id or 0)))
        shown = ordered[:AGENTS_SHOWN]
        lines = [describe_run(row, live.get(row.key), cap) for row in shown]
        if len(ordered) > AGENTS_SHOWN:
            lines.append(f"+{len(ordered) - AGENTS_SHOWN} more")
        running = [row for row in shown if row.key in live]
        if running:
            lines.append("Stop one: /agents stop NAME")
        buttons = [Button(f"Stop {row.name}", f"/agents stop {row.key}") for row in running]
        return "Sub-agents here:\n" + "\n".join(lines), buttons

    async def _stop(self, place: str, target: str, who: str) -> str:
        if not target:
            return "Which one? /agents stop NAME, with a name or id from /agents (/stop stops all)."
        run = self._subagents.find(place, target)
        if run is None or run.status != "running":
            return f"No running sub-agent {target} here; /agents lists them."
        await self._subagents.stop_runs([run])
        return f"{who} stopped {run.name} ({run.key}); its report follows."

    def _tell(self, place: str, target: str, text: str, who: str) -> str:
        if not (target and text):
            return "Which one, and what? /agents tell NAME MESSAGE, with a name or id from /agents."
        run = self._subagents.find(place, target)
        if run is None or not self._subagents.tell(run, text, who):
            return f"No running sub-agent {target} here; /agents lists them."
        return f"{run.name} ({run.key}) reads it at its next step."

    async def _detail(self, place: str, target: str) -> str:
        row = next((r for r in await self._runs_here(place) if target in (r.key, r.name)), None)
        if row is None or row.id is None:
            return f"No sub-agent {target} here; /agents lists them."
        live = self._subagents.find(place, row.key)
        transcript = await self._store.transcript(row.id)
        lines = [
            describe_run(row, live, self._subagents.settings.max_iterations),
            f"Task: {row.task}",
            f"Model: {row.model}, " + ("tier " if row.tier else "") + row.why_model(),
        ]
        if live is not None and live.last_tool:
            lines.append(f"Last tool: {live.last_tool}")
        lines += ["Latest steps:", *(_step(each) for each in transcript[-AGENT_STEPS_SHOWN:])]
        if row.report:
            lines.append(f"Report: {_clipped(row.report, 1000)}")
        if row.unread:
            lines.append(f"It ended with {row.unread} of your messages unread.")
        return "\n".join(lines)

    async def _runs_here(self, place: str) -> Sequence[SubagentRun]:
        conversation = await self._store.active_conversation(place)
        if conversation is None or conversation.id is None:
            return []
        return await self._store.runs(conversation.id)


def describe_run(row: SubagentRun, live: Run | None, cap: int) -> str:
    """`name · profile · state · elapsed · calls of the cap · tokens · model (why)`."""
    state = live.doing if live is not None and live.status == "running" else row.status
    if live is not None:
        ended = live.ended if live.ended is not None else time.monotonic()
        seconds, calls = ended - live.started, live.usage.model_calls
        tokens = f"{live.usage.prompt_tokens + live.usage.output_tokens:,}"
    else:
        ended_at = row.ended_at or utc_now()
        seconds, calls = (ended_at - row.started_at).total_seconds(), row.model_calls
        known = row.prompt_tokens is not None and row.output_tokens is not None
        tokens = f"{(row.prompt_tokens or 0) + (row.output_tokens or 0):,}" if known else "?"
    return (
        f"{row.name} ({row.key}) · {row.profile} · {state} · {seconds:.0f} s · "
        f"{calls}/{cap} model calls · {tokens} tokens · {row.model} ({row.why_model()})"
    )


def _step(message: SubagentMessage) -> str:
    said = _clipped(_printable_line(message.text), 200)
    if message.role == "tool":
        return f"  tool {message.tool_name}: {said}"
    calls = ", ".join(call["name"] for call in message.tool_calls or ())
    return f"  {message.role}: {said}" + (f" [called {calls}]" if calls else "")


def _printable_line(text: str) -> str:
    """One line: newlines and control characters as spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
