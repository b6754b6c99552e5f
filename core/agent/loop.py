"""The agent loop: model calls and tool runs until the model answers.

It imports nothing from the turn path, the store or any channel. It takes a chat model, the tools
an agent may use, the conversation so far (Ollama's wire shape, appended to in place) and a sink,
and returns the final answer or raises. Everything the outside world must know (text as it streams,
each finished message, each tool result, each call's usage) goes to the sink *synchronously*, as it
happens, so a stop between two events can never leave one of them unrecorded.

Contracts (ARCHITECTURE.md, "The agent loop's contracts"; each guarded in
tests/core/agent/test_loop.py):
- usage reaches the sink right after each model call returns, before any tool runs; a call cut
  short reports its usage as unknown (None), not as zero;
- every tool call gets exactly one result, sent to the model in the order the model asked, on
  every path; each result reaches the sink the moment its tool finishes (so it is stored in the
  order of completion, and a crash meanwhile cannot lose a finished result);
- read-only tools run concurrently with their read-only neighbours;
- no tool can hold the loop: a synchronous one runs in a thread; each runs under its timeout;
  on a stop or a timeout it gets `tool_grace` seconds to unwind, then it is abandoned (its
  result is "stopped" or "timed out", and whatever it does later changes nothing);
- at most `max_iterations` model calls; every empty reply gets a continuation nudge on the next
  call (counted); a cap reached with tool calls pending gets one more call without tools (not
  counted, and the result says it was wrapped up); a cap reached with only empty replies raises
  `DegenerateTurn`;
- a sink that raises is logged and ignored: observers never change the outcome;
- with a `Compactor`, every model call is a safe point: before it (every tool call has its
  result by then) the request is fitted to the window, and every request carries `num_ctx`. No
  call goes out larger than the window, the nudged one and the wrap-up call included: a tool's
  result or a call's arguments too large for it is shortened in the request, and a message
  that cannot fit is refused (`ContextOverflow` names whose it is, before any summary is made);
- an answer the model ended at its output limit (`done_reason` "length") is kept as partial and
  the result says it was cut;
- a `final` tool that succeeds ends the loop once every call of its batch has its result; its
  result is the answer (a sub-agent's `report`);
- notes from outside (`inbox`: a person telling a sub-agent something) join the history before a
  model call, never between a tool call and its result.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.context import Compactor
from core.agent.messages import AssistantMessage, ToolCall, ToolResult, ToolStatus, Usage
from core.agent.model import ChunkCallback, ModelReply, StatusCallback
from core.agent.tools import Tool, abandon, argument_problems
from core.errors import DegenerateTurn
from core.metrics import TOOL_CALLS

logger = logging.getLogger(__name__)

NUDGE = (
    "[Kaiwa] Your last reply was empty. Continue: answer the user, or call a tool if you need one."
)
WRAP_UP = (
    "[Kaiwa] You have used every model call this turn allows, so tools are no longer available. "
    "Answer the user now from what you already have, and say plainly what is left undone."
)


class ChatModel(Protocol):
    async def chat(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        reply: ModelReply,
        on_chunk: ChunkCallback,
        *,
        tools: Sequence[dict[str, Any]] = (),
        think: bool | None = None,
        on_status: StatusCallback = ...,
        options: dict[str, Any] | None = None,
        background: bool = False,
    ) -> ModelReply: ...


class LoopSink(Protocol):
    """Where the loop reports what happens. Synchronous on purpose (see the module docstring)."""

    def status(self, text: str) -> None:
        """What a model call waits for before its first piece (a slot, the model loading)."""
        ...

    def thinking(self, delta: str) -> None: ...
    def text(self, delta: str) -> None: ...
    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        """A model call returned or was cut short: what it cost, and what it said (None if it
        said nothing). Reported before any tool it asked for runs."""
        ...

    def tool_started(self, call: ToolCall) -> None: ...
    def tool_finished(self, result: ToolResult) -> None: ...


@dataclass(frozen=True)
class LoopSettings:
    agent: str
    model: str
    think: bool | None = None
    max_iterations: int = 10
    tool_timeout: float = 60.0
    tool_grace: float = 2.0
    """Seconds a stopped or timed-out tool gets to unwind before it is abandoned."""
    background: bool = False
    """Nobody waits on this loop's replies (a sub-agent): its model requests go after others."""


@dataclass(frozen=True)
class LoopResult:
    answer: AssistantMessage
    model_calls: int
    wrapped_up: bool
    cut: bool = False
    """The answer ended at the model's output limit."""


class AgentLoop:
    def __init__(
        self,
        model: ChatModel,
        tools: Mapping[str, Tool],
        sink: LoopSink,
        settings: LoopSettings,
        context: Compactor | None = None,
        inbox: Callable[[], list[str]] | None = None,
    ) -> None:
        self._model = model
        self._tools = tools
        self._sink = sink
        self._settings = settings
        self._context = context
        self._inbox = inbox
        self._call_count = 0
        self._opening: dict[str, Any] | None = None
        """The message that opened the run: it and all after it are never summarized."""

    async def run(self, messages: list[dict[str, Any]]) -> LoopResult:
        """Run until the model answers; `messages` gains every message the turn produces."""
        extra: list[dict[str, Any]] = []
        tools_pending = False
        self._opening = messages[-1]
        for model_calls in range(1, self._settings.max_iterations + 1):
            message = await self._call_model(messages, extra, with_tools=True)
            extra = []
            tools_pending = bool(message.tool_calls)
            if tools_pending:
                results = await self._run_tools(message.tool_calls, messages)
                final = self._final_result(message.tool_calls, results)
                if final is not None:
                    return LoopResult(AssistantMessage(final), model_calls, wrapped_up=False)
                continue
            if message.text.strip():
                return LoopResult(message, model_calls, wrapped_up=False, cut=message.partial)
            extra = [{"role": "user", "content": NUDGE}]
        if not tools_pending:
            raise DegenerateTurn(
                f"{self._settings.model} ended its last allowed model call with an empty reply; "
                "try again or rephrase your message"
            )
        return await self._wrap_up(messages)

    async def _wrap_up(self, messages: list[dict[str, Any]]) -> LoopResult:
        wrap_up = [{"role": "user", "content": WRAP_UP}]
        message = await self._call_model(messages, wrap_up, with_tools=False)
        if not message.text.strip():
            raise DegenerateTurn(
                f"{self._settings.model} used all {self._settings.max_iterations} model calls of "
                "this turn and then gave no answer; ask for less at once, or raise "
                f"[agents.{self._settings.agent}].max_iterations"
            )
        return LoopResult(
            message, self._settings.max_iterations, wrapped_up=True, cut=message.partial
        )

    async def _call_model(
        self,
        messages: list[dict[str, Any]],
        extra: list[dict[str, Any]],
        *,
        with_tools: bool,
    ) -> AssistantMessage:
        streamed = ModelReply()
        schemas = [tool.schema() for tool in self._tools.values()] if with_tools else []
        if self._inbox is not None:
            messages.extend({"role": "user", "content": note} for note in self._inbox())
        if self._context is not None:
            await self._context.fit(messages, extra, schemas, self._status, opening=self._opening)
        started = time.monotonic()
        try:
            reply = await self._model.chat(
                self._settings.model,
                messages + extra if extra else messages,
                streamed,
                self._show,
                tools=schemas,
                think=self._settings.think,
                on_status=self._status,
                options=self._context.options if self._context is not None else None,
                background=self._settings.background,
            )
        except BaseException as exc:
            usage = Usage(None, None, seconds=time.monotonic() - started)
            self._keep_partial(streamed, usage, messages, isinstance(exc, asyncio.CancelledError))
            raise
        if self._context is not None:
            self._context.reported(reply.usage.prompt_tokens)
        cut = reply.done_reason == "length" and not reply.tool_calls
        message = self._message_from(reply, partial=cut)
        self._record(reply.usage, message if message.text or message.tool_calls else None, messages)
        return message

    def _status(self, text: str) -> None:
        self._emit(self._sink.status, text)

    def _show(self, text: str, thinking: str) -> None:
        if thinking:
            self._emit(self._sink.thinking, thinking)
        if text:
            self._emit(self._sink.text, text)

    def _message_from(
        self, reply: ModelReply, *, partial: bool = False, stopped: bool = False
    ) -> AssistantMessage:
        calls = []
        for name, arguments in reply.tool_calls:
            self._call_count += 1
            calls.append(ToolCall(f"c{self._call_count}", name, arguments))
        return AssistantMessage(reply.text, reply.thinking, tuple(calls), partial, stopped)

    def _keep_partial(
        self, streamed: ModelReply, usage: Usage, messages: list[dict[str, Any]], stopped: bool
    ) -> None:
        """A model call ended early: count it, keep what it said, close the calls it asked for."""
        if not (streamed.text or streamed.tool_calls):
            self._record(usage, None, messages)
            return
        message = self._message_from(streamed, partial=True, stopped=stopped)
        self._record(usage, message, messages)
        ending = "stopped" if stopped else "ended by an error"
        for call in message.tool_calls:
            result = _unfinished_result(call, started=False, ending=ending)
            messages.append(result.to_wire())
            self._emit(self._sink.tool_finished, result)

    def _final_result(
        self, calls: Sequence[ToolCall], results: dict[str, ToolResult]
    ) -> str | None:
        for call in calls:
            tool = self._tools.get(call.name)
            result = results[call.call_id]
            if tool is not None and tool.final and result.status is ToolStatus.OK:
                return result.content
        return None

    async def _run_tools(
        self, calls: Sequence[ToolCall], messages: list[dict[str, Any]]
    ) -> dict[str, ToolResult]:
        results: dict[str, ToolResult] = {}
        started: set[str] = set()
        try:
            for batch in self._batches(calls):
                async with asyncio.TaskGroup() as group:
                    for call in batch:
                        group.create_task(self._run_one(call, results, started))
        finally:
            for call in calls:
                if call.call_id not in results:
                    stopped = _unfinished_result(call, call.call_id in started, ending="stopped")
                    self._finished(stopped, results)
                messages.append(results[call.call_id].to_wire())
        return results

    def _batches(self, calls: Sequence[ToolCall]) -> list[list[ToolCall]]:
        """Consecutive read-only calls share a batch and overlap; any other call runs alone."""
        batches: list[list[ToolCall]] = []
        for call in calls:
            if batches and self._overlaps(call) and self._overlaps(batches[-1][-1]):
                batches[-1].append(call)
            else:
                batches.append([call])
        return batches

    def _overlaps(self, call: ToolCall) -> bool:
        tool = self._tools.get(call.name)
        return tool is not None and tool.read_only

    async def _run_one(
        self, call: ToolCall, results: dict[str, ToolResult], started: set[str]
    ) -> None:
        started.add(call.call_id)
        self._emit(self._sink.tool_started, call)
        self._finished(await self._result_of(call), results)

    def _finished(self, result: ToolResult, results: dict[str, ToolResult]) -> None:
        results[result.call.call_id] = result
        counted = result.call.name if result.call.name in self._tools else "unknown"
        TOOL_CALLS.labels(counted, result.status.value).inc()
        self._emit(self._sink.tool_finished, result)

    async def _result_of(self, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            valid = ", ".join(self._tools) or "none"
            return ToolResult(
                call,
                f"There is no tool named '{call.name}'. Available tools: {valid}.",
                ToolStatus.UNKNOWN_TOOL,
            )
        problems = argument_problems(tool, call.arguments)
        if problems:
            return ToolResult(
                call,
                f"Invalid arguments for '{call.name}': {'; '.join(problems)}. "
                "Call it again with corrected arguments.",
                ToolStatus.INVALID_ARGUMENTS,
            )
        limit = tool.timeout or self._settings.tool_timeout
        running = asyncio.ensure_future(tool.invoke(call.arguments))
        try:
            await asyncio.wait({running}, timeout=limit)
        except asyncio.CancelledError:  # a stop: the tool unwinds, or is left behind
            await self._unwind(running, call)
            raise
        if not running.done():
            await self._unwind(running, call)
            return ToolResult(
                call,
                f"'{call.name}' did not finish within {limit:g} s and was cancelled.",
                ToolStatus.TIMEOUT,
            )
        if not running.cancelled() and running.exception() is None:
            return ToolResult(call, running.result())
        problem = asyncio.CancelledError() if running.cancelled() else running.exception()
        logger.warning("tool %s failed: %s: %s", call.name, type(problem).__name__, problem)
        return ToolResult(
            call, f"'{call.name}' failed: {type(problem).__name__}: {problem}", ToolStatus.ERROR
        )

    async def _unwind(self, running: "asyncio.Future[str]", call: ToolCall) -> None:
        """Cancel a tool and give it `tool_grace` seconds to end; past that, abandon it."""
        running.cancel()
        await asyncio.wait({running}, timeout=self._settings.tool_grace)
        if not running.done():
            abandon(running, call.name, self._settings.tool_grace)
        elif not running.cancelled():
            running.exception()  # retrieved: it ended on its own terms, after the fact

    def _record(
        self, usage: Usage, message: AssistantMessage | None, messages: list[dict[str, Any]]
    ) -> None:
        if message is not None:
            messages.append(message.to_wire())
        self._emit(self._sink.model_call_finished, usage, message)

    def _emit(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("an observer of the agent loop failed; the turn goes on")


def _unfinished_result(call: ToolCall, started: bool, *, ending: str) -> ToolResult:
    """The result of a call the turn ended before it finished: tell the model exactly that."""
    if started:
        text = (
            f"The turn was {ending} while '{call.name}' was running; it was cancelled and its "
            "result is unknown. Do not assume it succeeded; run it again only if asked."
        )
    else:
        text = (
            f"The turn was {ending} before '{call.name}' ran; it did not run. Do not assume a "
            "result; run it only if asked again."
        )
    return ToolResult(call, text, ToolStatus.STOPPED)
