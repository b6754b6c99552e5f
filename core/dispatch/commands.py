"""Chat commands: matched by the dispatcher before anything queues, never sent to the model.

A command is a message whose first word is `/name` (or `!name`, which platforms that swallow
slash commands inside threads need). Each handler answers in the same place through the channel's
`notify`. Commands never wait behind a running turn, except `/stop` and `/new`, which wait only for
the turn they themselves ended, so their answer comes after the stopped reply's last edit.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from core.agent.context import Compaction
from core.channel import COMMANDS, Button, Channel, ChannelMessage
from core.errors import StoreError
from core.features.memory import Memory, describe_note
from core.features.schedule.scheduler import Scheduler, describe_task
from core.features.subagents.delegation import Run
from core.store import Store
from core.store.tables import SubagentMessage, SubagentRun, Turn, utc_now
from core.text import Command, plural
from core.turns.runner import ContextReport, ConversationBusy, StopReport, TurnRunner

STOP_WAIT_SECONDS = 10.0
USAGE_TURNS_SHOWN = 20
AGENTS_SHOWN = 12
AGENT_STEPS_SHOWN = 6
TASK_VERBS = ("pause", "resume", "cancel", "run")
PLANS_OFF = "The /plan workflow is off ([workflows.plan].enabled = false in config.toml)."
APPROVE_USAGE = {"approve": " [here]", "edit": " WHAT TO CHANGE"}
NO_TASKS = (
    'No scheduled tasks here. Ask for one in words ("every weekday at 9:00, summarize the '
    'open incidents here") and I will schedule it.'
)


Handler = Callable[[ChannelMessage, Channel, Command], Awaitable[None]]


class Commands:
    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        scheduler: Scheduler | None,
        memory: Memory | None,
    ) -> None:
        self._store = store
        self._runner = runner
        self._scheduler = scheduler
        self._memory = memory
        self._approvals = runner.approvals
        handlers: dict[str, Handler] = {
            "stop": self._stop,
            "new": self._new,
            "usage": self._usage,
            "compact": self._compact,
            "agents": self._agents,
            "tasks": self._tasks,
            "memory": self._notes,
            "plan": self._plan,
            "plans": self._plans,
            "approve": self._approve,
            "edit": self._approve,
            "deny": self._approve,
            "help": self._help,
        }
        self._handlers = {name: (handlers[name], summary) for name, summary in COMMANDS}

    async def run(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        handler = self._handlers.get(command.name, (self._unknown, ""))[0]
        await handler(message, channel, command)

    async def _stop(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        report = self._runner.stop(message.place)
        agents = await self._runner.stop_subagents(message.place)
        await self._wait_for_stop(message.place)
        answer = (
            describe_stop(report) if report.stopped_running or report.dropped or not agents else ""
        )
        if agents:
            answer += f" Stopped {agents} {plural(agents, 'sub-agent')}; their reports follow."
        await channel.notify(message.place, answer.strip())

    async def _agents(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, rest = command.argument.partition(" ")
        if verb == "stop":
            answer = await self._agents_stop(message.place, rest.strip())
        elif verb == "tell":
            target, _, text = rest.strip().partition(" ")
            answer = self._agents_tell(message.place, target, text.strip())
        elif verb:
            answer = await self._agent_detail(message.place, command.argument.strip())
        else:
            answer, buttons = await self._agents_list(message.place)
            await channel.notify(message.place, answer, buttons)
            return
        await channel.notify(message.place, answer)

    async def _agents_list(self, place: str) -> tuple[str, list[Button]]:
        """The conversation's sub-agents, running first, and a Stop button for each running one
        shown (its command, `/agents stop <id>`, is the fallback where there are no buttons)."""
        rows = await self._runs_here(place)
        if not rows:
            return "No sub-agents in this conversation.", []
        live = {run.key: run for run in self._runner.subagents.live(place)}
        cap = self._runner.subagents.settings.max_iterations
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

    async def _agents_stop(self, place: str, target: str) -> str:
        if not target:
            return "Which one? /agents stop NAME, with a name or id from /agents (/stop stops all)."
        run = self._runner.subagents.find(place, target)
        if run is None or run.status != "running":
            return f"No running sub-agent {target} here; /agents lists them."
        await self._runner.subagents.stop([run])
        return f"Stopped {run.name} ({run.key}); its report follows."

    def _agents_tell(self, place: str, target: str, text: str) -> str:
        if not (target and text):
            return "Which one, and what? /agents tell NAME MESSAGE, with a name or id from /agents."
        run = self._runner.subagents.find(place, target)
        if run is None or not self._runner.subagents.tell(run, text):
            return f"No running sub-agent {target} here; /agents lists them."
        return f"{run.name} ({run.key}) reads it at its next step."

    async def _agent_detail(self, place: str, target: str) -> str:
        row = next((r for r in await self._runs_here(place) if target in (r.key, r.name)), None)
        if row is None or row.id is None:
            return f"No sub-agent {target} here; /agents lists them."
        live = self._runner.subagents.find(place, row.key)
        transcript = await self._store.transcript(row.id)
        lines = [
            describe_run(row, live, self._runner.subagents.settings.max_iterations),
            f"Task: {row.task}",
            f"Model: {row.model}",
        ]
        if live is not None and live.last_tool:
            lines.append(f"Last tool: {live.last_tool}")
        lines += ["Latest steps:", *(_step(each) for each in transcript[-AGENT_STEPS_SHOWN:])]
        if row.report:
            lines.append(f"Report: {_clipped(row.report, 1000)}")
        if row.unread:
            lines.append(f"It ended with {row.unread} of your messages unread.")
        return "\n".join(lines)

    async def _runs_here(self, place: str) -> list[SubagentRun]:
        conversation = await self._store.active_conversation(place)
        if conversation is None or conversation.id is None:
            return []
        return await self._store.runs(conversation.id)

    async def _new(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        async with asyncio.timeout(STOP_WAIT_SECONDS):
            report = await self._runner.start_new_conversation(message.place)
        suffix = f" ({describe_stop(report)})" if report.stopped_running or report.dropped else ""
        await channel.notify(message.place, f"Started a new conversation.{suffix}")

    async def _usage(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        conversation = await self._store.active_conversation(message.place)
        turns = await self._store.turns(conversation.id) if conversation and conversation.id else []
        context = await self._runner.context_report(message.place) if turns else None
        runs = await self._store.runs(conversation.id) if conversation and conversation.id else []
        await channel.notify(message.place, describe_usage(turns, context, runs))

    async def _compact(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        try:
            compaction = await self._runner.compact(message.place)
        except ConversationBusy:
            answer = "A reply is being written here; send /compact once it is done (or /stop it)."
        except StoreError as exc:
            answer = f"I could not compact this conversation: {exc.plainly}. Try again in a minute."
        else:
            answer = describe_compaction(compaction)
        await channel.notify(message.place, answer)

    async def _tasks(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, target = command.argument.partition(" ")
        if self._scheduler is None:
            answer = "Scheduled tasks are off ([schedule].enabled = false in config.toml)."
        elif not verb:
            lines = await self._scheduler.listing(message.place)
            answer = "Tasks here:\n" + "\n".join(lines) if lines else NO_TASKS
        elif verb in TASK_VERBS and target.strip():
            answer = await self._task_verb(message.place, verb, target.strip())
        else:
            answer = "Usage: /tasks, or /tasks pause|resume|cancel|run ID (the ids /tasks shows)."
        await channel.notify(message.place, answer)

    async def _task_verb(self, place: str, verb: str, target: str) -> str:
        assert self._scheduler is not None
        task = await self._scheduler.find(place, target)
        if task is None:
            return f"No task {target} here; /tasks lists them."
        label = f"#{task.id} {task.name}"
        if verb == "pause":
            await self._scheduler.pause(task, "paused with /tasks")
            return f"Paused task {label}; /tasks resume {task.id} starts it again."
        if verb == "resume":
            resumed = await self._scheduler.resume(task)
            return f"Resumed: {describe_task(resumed, None)}"
        if verb == "cancel":
            await self._scheduler.cancel(task)
            return f"Cancelled task {label}; it will not fire again."
        self._scheduler.run_now(task)
        return f"Task {label} runs now; its answer follows here."

    async def _notes(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, target = command.argument.partition(" ")
        if self._memory is None:
            answer = "Notes are off ([memory].enabled = false in config.toml)."
        elif not verb:
            answer = await self._notes_list(message)
        elif verb == "forget" and target.strip().removeprefix("#").isdigit():
            owner = self._memory.owner(message.platform, message.place, message.author_id)
            note = int(target.strip().removeprefix("#"))
            forgotten = await self._memory.forget(owner, note)
            answer = f"Forgot note #{note}." if forgotten else f"No note #{note}; see /memory."
        else:
            answer = "Usage: /memory, or /memory forget ID (the numbers /memory shows)."
        await channel.notify(message.place, answer)

    async def _notes_list(self, message: ChannelMessage) -> str:
        assert self._memory is not None
        owner = self._memory.owner(message.platform, message.place, message.author_id)
        notes = await self._memory.recall(owner)
        whose = "for you" if self._memory.settings.scope == "person" else "in this conversation"
        if not notes:
            return f"No notes kept {whose}. Ask me to remember something."
        return f"Notes kept {whose}, newest first:\n" + "\n".join(map(describe_note, notes))

    async def _plan(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        """`/plan` without a task (with one, it is a turn: the dispatcher queues it)."""
        workflow = self._runner.workflows.get("plan")
        answer = workflow.usage if workflow else PLANS_OFF
        await channel.notify(message.place, answer)

    async def _plans(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        workflow = self._runner.workflows.get("plan")
        answer = await workflow.listing(message.place) if workflow else PLANS_OFF
        await channel.notify(message.place, answer)

    async def _approve(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        """`/approve ID [here]`, `/edit ID CHANGE` and `/deny ID`: an answer to a question."""
        key, _, rest = command.argument.strip().removeprefix("#").partition(" ")
        rest = rest.strip()
        if self._approvals is None:
            answer = "Nothing here asks for approval."
        elif not key.isdigit() or (command.name != "edit" and rest not in ("", "here")):
            answer = f"Usage: /{command.name} ID" + APPROVE_USAGE.get(command.name, "")
        else:
            decision = {"deny": "denied", "edit": "edited"}.get(command.name, "allowed")
            if decision == "allowed" and rest == "here":
                decision = "allowed_here"
            name = message.author_name or message.author_id
            change = rest if command.name == "edit" else ""
            answer = await self._approvals.answer(
                int(key), message.author_id, name, decision, change
            )
        await channel.notify(message.place, answer)

    async def _help(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        lines = [f"/{name}: {summary}" for name, (_, summary) in self._handlers.items()]
        await channel.notify(message.place, "Commands:\n" + "\n".join(lines))

    async def _unknown(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        names = ", ".join(f"/{name}" for name in self._handlers)
        await channel.notify(
            message.place, f"Unknown command /{command.name}. Commands: {names}. Try /help."
        )

    async def _wait_for_stop(self, place: str) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_SECONDS):
                await self._runner.wait_idle(place)


def describe_run(row: SubagentRun, live: Run | None, cap: int) -> str:
    """`name · profile · state · elapsed · calls of the cap · tokens`."""
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
        f"{calls}/{cap} model calls · {tokens} tokens"
        + (f" · {row.model}, routed {live.route}" if live is not None and live.route else "")
    )


def _step(message: SubagentMessage) -> str:
    said = _clipped(printable_line(message.text), 200)
    if message.role == "tool":
        return f"  tool {message.tool_name}: {said}"
    calls = ", ".join(call["name"] for call in message.tool_calls or ())
    return f"  {message.role}: {said}" + (f" [called {calls}]" if calls else "")


def printable_line(text: str) -> str:
    """One line: newlines and control characters as spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_stop(report: StopReport) -> str:
    if not report.stopped_running and not report.dropped:
        return "Nothing to stop."
    parts = ["Stopped." if report.stopped_running else "Nothing was running."]
    if report.dropped:
        plural = "s" if report.dropped != 1 else ""
        parts.append(f"Dropped {report.dropped} queued message{plural}.")
    return " ".join(parts)


def describe_compaction(compaction: Compaction | None) -> str:
    if compaction is None:
        return "Nothing to compact: this conversation is still short."
    sizes = f"about {compaction.tokens_before:,} → {compaction.tokens_after:,} tokens"
    if compaction.method == "dropped":
        return (
            "The summary could not be written (the log says why), so the older messages were "
            f"left out of the model's context instead; they stay stored ({sizes})."
        )
    return f"Compacted: the older messages are now a summary ({sizes})."


def describe_context(context: ContextReport) -> str:
    share = round(100 * context.tokens / context.window)
    compactions = f"{context.compactions} {plural(context.compactions, 'compaction')} so far"
    return (
        f"Context: about {context.tokens:,} of {context.window:,} tokens ({share} %); "
        f"{compactions}."
    )


def describe_usage(
    turns: Sequence[Turn],
    context: ContextReport | None = None,
    runs: Sequence[SubagentRun] = (),
) -> str:
    if not turns:
        return "No turns in this conversation yet."
    lines = [f"Usage of this conversation ({len(turns)} {plural(len(turns), 'turn')}):"]
    first_shown = max(0, len(turns) - USAGE_TURNS_SHOWN)
    if first_shown:
        lines.append(f"(turns 1-{first_shown} are only in the total)")
    for number, turn in enumerate(turns[first_shown:], start=first_shown + 1):
        spent = _spent(
            turn.model_calls,
            _tokens([turn.prompt_tokens]),
            _tokens([turn.output_tokens]),
            turn.model_seconds,
        )
        wrapped = ", answered at the limit of its model calls" if turn.wrapped_up else ""
        lines.append(f"#{number} {turn.status}{wrapped}: {spent}")
    lines.append(
        "Total: "
        + _spent(
            sum(t.model_calls for t in turns),
            _tokens([t.prompt_tokens for t in turns]),
            _tokens([t.output_tokens for t in turns]),
            sum(t.model_seconds for t in turns),
        )
    )
    if any(t.prompt_tokens is None for t in turns):
        lines.append("(? : tokens not known for a model call cut short)")
    if runs:
        lines.append(
            f"Sub-agents ({len(runs)} {plural(len(runs), 'run')}, not in the total): "
            + _spent(
                sum(r.model_calls for r in runs),
                _tokens([r.prompt_tokens for r in runs]),
                _tokens([r.output_tokens for r in runs]),
                sum(r.model_seconds for r in runs),
            )
        )
    if context is not None:
        lines.append(describe_context(context))
    return "\n".join(lines)


def _tokens(counts: Sequence[int | None]) -> str:
    """A sum of token counts; "?" for an unknown one ("120+?" when some are known)."""
    known = sum(count for count in counts if count is not None)
    if None not in counts:
        return f"{known}"
    return f"{known}+?" if known else "?"


def _spent(calls: int, tokens_in: str, tokens_out: str, seconds: float) -> str:
    return (
        f"{calls} model {plural(calls, 'call')}, {tokens_in} tokens in, {tokens_out} out, "
        f"{seconds:.1f} s"
    )
