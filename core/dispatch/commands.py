"""Chat commands: matched by the dispatcher before anything queues, never sent to the model.

A command is a message whose first word is `/name` (or `!name`, which platforms that swallow
slash commands inside threads need). Each handler answers in the same place through the channel's
`notify`. Commands never wait behind a running turn, except `/stop` and `/new`, which wait only for
the turn they themselves ended, so their answer comes after the stopped reply's last edit.

The commands people can type are one catalogue (`core.channel.COMMANDS`, which platforms show in
their menus too). The turn path's own are answered here (`/stop`, `/new`, `/usage`, `/compact`,
`/help`); a feature's are handed in where Kaiwa is wired (`Commands.add`: `/agents` by the
sub-agents, `/tasks` by the scheduler, ...), and one whose feature is off answers how to turn it
on (`Answer`).
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from core.agent.context import Compaction
from core.channel import COMMANDS, Channel, ChannelMessage
from core.errors import StoreError
from core.store import Store
from core.store.tables import SubagentRun, Turn
from core.text import Command, plural
from core.turns.conversations import ContextReport, ConversationBusy
from core.turns.runner import TurnRunner
from core.turns.turn import StopReport

STOP_WAIT_SECONDS = 10.0
USAGE_TURNS_SHOWN = 20
USAGE_RUNS_SHOWN = 12

Handler = Callable[[ChannelMessage, Channel, Command], Awaitable[None]]


class Answer:
    """A command that always answers the same (a feature that is off says how to turn it on)."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        await channel.notify(message.place, self.text)


class Commands:
    def __init__(self, store: Store, runner: TurnRunner) -> None:
        self._store = store
        self._runner = runner
        self._handlers: dict[str, Handler] = {
            "stop": self._stop,
            "new": self._new,
            "usage": self._usage,
            "compact": self._compact,
            "help": self._help,
        }
        self._summaries = dict(COMMANDS)

    def add(self, name: str, handler: Handler) -> None:
        """`handler` answers `/name`, a command of the catalogue."""
        if name not in self._summaries:
            raise ValueError(f"/{name} is not in core.channel.COMMANDS")
        self._handlers[name] = handler

    async def run(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        handler = self._handlers.get(command.name, self._unknown)
        await handler(message, channel, command)

    async def _stop(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        report = self._runner.stop(message.place)
        said = await self._runner.parts.stop(message.place)
        await self._wait_for_stop(message.place)
        stopped = report.stopped_running or report.dropped or not said
        answer = " ".join([describe_stop(report) if stopped else "", *said])
        await channel.notify(message.place, answer.strip())

    async def _new(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        async with asyncio.timeout(STOP_WAIT_SECONDS):
            report = await self._runner.start_new_conversation(message.place)
        suffix = f" ({describe_stop(report)})" if report.stopped_running or report.dropped else ""
        await channel.notify(message.place, f"Started a new conversation.{suffix}")

    async def _usage(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        conversation = await self._store.active_conversation(message.place)
        conversation_id = conversation.id if conversation else None
        turns = await self._store.turns(conversation_id) if conversation_id else []
        context = await self._runner.conversations.context_report(message.place) if turns else None
        runs = await self._store.runs(conversation_id) if conversation_id else []
        await channel.notify(message.place, describe_usage(turns, context, runs))

    async def _compact(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        try:
            compaction = await self._runner.conversations.compact(message.place)
        except ConversationBusy:
            answer = "A reply is being written here; send /compact once it is done (or /stop it)."
        except StoreError as exc:
            answer = f"I could not compact this conversation: {exc.plainly}. Try again in a minute."
        else:
            answer = describe_compaction(compaction)
        await channel.notify(message.place, answer)

    async def _help(self, message: ChannelMessage, channel: Channel, _: Command) -> None:
        lines = [f"/{name}: {summary}" for name, summary in COMMANDS]
        await channel.notify(message.place, "Commands:\n" + "\n".join(lines))

    async def _unknown(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        names = ", ".join(f"/{name}" for name, _ in COMMANDS)
        await channel.notify(
            message.place, f"Unknown command /{command.name}. Commands: {names}. Try /help."
        )

    async def _wait_for_stop(self, place: str) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_SECONDS):
                await self._runner.wait_idle(place)


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
    """The conversation's spend: each of its latest turns, their total, its sub-agents apart
    (each with its model and why), and everything by model."""
    if not turns:
        return "No turns in this conversation yet."
    lines = [f"Usage of this conversation ({len(turns)} {plural(len(turns), 'turn')}):"]
    first_shown = max(0, len(turns) - USAGE_TURNS_SHOWN)
    if first_shown:
        lines.append(f"(turns 1-{first_shown} are only in the total)")
    for number, turn in enumerate(turns[first_shown:], start=first_shown + 1):
        wrapped = ", answered at the limit of its model calls" if turn.wrapped_up else ""
        lines.append(f"#{number} {turn.status}{wrapped}: {_spent([turn])}")
    lines.append(f"Total: {_spent(turns)}")
    if any(t.prompt_tokens is None for t in turns):
        lines.append("(? : tokens not known for a model call cut short)")
    if runs:
        count = f"{len(runs)} {plural(len(runs), 'run')}"
        lines.append(f"Sub-agents ({count}, not in the total): {_spent(runs)}")
        lines += [
            f"  {run.key} {run.name}: {run.model} ({run.why_model()}), {_spent([run])}"
            for run in runs[:USAGE_RUNS_SHOWN]
        ]
        if len(runs) > USAGE_RUNS_SHOWN:
            lines.append(f"  +{len(runs) - USAGE_RUNS_SHOWN} more")
    lines += _by_model(turns, runs)
    if context is not None:
        lines.append(describe_context(context))
    return "\n".join(lines)


def _by_model(turns: Sequence[Turn], runs: Sequence[SubagentRun]) -> list[str]:
    """The spend of turns and runs by the model each ran on (turns stored before 0015 under
    "(not recorded)"); nothing when no sub-agent ran and the turns had one model."""
    models: dict[str, list[Turn | SubagentRun]] = {}
    for each in [*turns, *runs]:
        models.setdefault(each.model or "(not recorded)", []).append(each)
    if not runs and len(models) == 1:
        return []
    return ["By model:", *(f"  {model}: {_spent(rows)}" for model, rows in models.items())]


def _tokens(counts: Sequence[int | None]) -> str:
    """A sum of token counts; "?" for an unknown one ("120+?" when some are known)."""
    known = sum(count for count in counts if count is not None)
    if None not in counts:
        return f"{known}"
    return f"{known}+?" if known else "?"


def _spent(spenders: Sequence[Turn | SubagentRun]) -> str:
    """What turns or runs spent together."""
    calls = sum(each.model_calls for each in spenders)
    tokens_in = _tokens([each.prompt_tokens for each in spenders])
    tokens_out = _tokens([each.output_tokens for each in spenders])
    seconds = sum(each.model_seconds for each in spenders)
    return (
        f"{calls} model {plural(calls, 'call')}, {tokens_in} tokens in, {tokens_out} out, "
        f"{seconds:.1f} s"
    )
