"""The agent loop against the fake Ollama through the real client: its contracts, one by one."""

import asyncio
import contextlib
import threading
from typing import Annotated, Any

import pytest

from core.agent.context import Calibration, Compaction, Compactor, ContextSettings
from core.agent.loop import NUDGE, WRAP_UP, AgentLoop, LoopSettings
from core.agent.messages import AssistantMessage, ToolCall, ToolResult, ToolStatus, Usage
from core.agent.model import ModelClient
from core.agent.tools import Tool, abandoned_tools, builtin_tools, tool
from core.errors import DegenerateTurn
from tests.fakes.ollama import Done, FakeOllama, Pause, Text, Thinking
from tests.fakes.ollama import ToolCall as CallStep
from tests.fakes.patience import deadline

MODEL = "test-model"


class Events:
    """A sink that keeps every event, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.statuses: list[str] = []
        self.saw_text = asyncio.Event()

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def thinking(self, delta: str) -> None:
        self.log.append(("thinking", delta))

    def text(self, delta: str) -> None:
        self.log.append(("text", delta))
        self.saw_text.set()

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self.log.append(("usage", usage))
        if message is not None:
            self.log.append(("message", message))

    def tool_started(self, call: ToolCall) -> None:
        self.log.append(("started", call.name))

    def tool_finished(self, result: ToolResult) -> None:
        self.log.append(("result", result))

    def of(self, kind: str) -> list[Any]:
        return [value for event, value in self.log if event == kind]


def loop_for(
    model: ModelClient, tools: list[Tool], sink: Any = None, **settings: Any
) -> tuple[AgentLoop, Events]:
    events = sink or Events()
    loop = AgentLoop(
        model,
        {t.name: t for t in tools},
        events,
        LoopSettings(agent="assistant", model=MODEL, **settings),
    )
    return loop, events


def conversation(text: str = "hello") -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


@tool(read_only=True)
def echo(word: str) -> str:
    """Say a word back."""
    return f"echo {word}"


async def test_plain_reply_streams_text(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text("Hello there, friend.", chunks=4), Done(12, 4))
    loop, events = loop_for(model, [])
    messages = conversation()

    result = await loop.run(messages)

    assert result.answer.text == "Hello there, friend."
    assert "".join(events.of("text")) == "Hello there, friend."
    assert len(events.of("text")) == 4
    assert events.of("usage")[0].prompt_tokens == 12
    assert events.of("usage")[0].output_tokens == 4
    assert messages[-1] == {"role": "assistant", "content": "Hello there, friend."}


async def test_thinking_streams_separately(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Thinking("Let me think.", chunks=2), Text("Answer."))
    loop, events = loop_for(model, [], think=True)

    result = await loop.run(conversation())

    assert "".join(events.of("thinking")) == "Let me think."
    assert result.answer.thinking == "Let me think."
    assert result.answer.text == "Answer."
    assert ollama.requests[0]["think"] is True


async def test_tool_round_then_answer(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(CallStep("current_time", {"timezone": "UTC"}), Done(20, 3))
    ollama.script(Text("It is late."), Done(40, 4))
    loop, events = loop_for(model, builtin_tools(""))
    messages = conversation("what time is it?")

    result = await loop.run(messages)

    assert result.answer.text == "It is late."
    assert result.model_calls == 2
    (tool_result,) = events.of("result")
    assert tool_result.status is ToolStatus.OK
    assert "UTC" in tool_result.content
    second_request = ollama.requests[1]["messages"]
    assert second_request[-2]["tool_calls"][0]["function"]["name"] == "current_time"
    assert second_request[-1]["role"] == "tool"
    assert second_request[-1]["tool_name"] == "current_time"
    assert ollama.requests[0]["tools"][0]["function"]["name"] == "current_time"


async def test_usage_is_recorded_before_tools_run(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(CallStep("echo", {"word": "a"}), Done(7, 2))
    ollama.script(Text("done"))
    loop, events = loop_for(model, [echo])

    await loop.run(conversation())

    kinds = [kind for kind, _ in events.log]
    assert kinds.index("usage") < kinds.index("started")


async def test_read_only_tools_overlap_and_results_keep_order(
    ollama: FakeOllama, model: ModelClient
) -> None:
    both_running = asyncio.Event()
    running: list[str] = []

    async def wait_for_partner(name: str) -> str:
        running.append(name)
        if len(running) == 2:
            both_running.set()
        async with asyncio.timeout(deadline()):
            await both_running.wait()
        return name

    @tool(read_only=True)
    async def slow(label: str) -> str:
        """Return after the other call has started too."""
        return await wait_for_partner(f"slow {label}")

    ollama.script(CallStep("slow", {"label": "first"}), CallStep("slow", {"label": "second"}))
    ollama.script(Text("both done"))
    loop, events = loop_for(model, [slow])
    messages = conversation()

    await loop.run(messages)

    assert {r.content for r in events.of("result")} == {"slow first", "slow second"}
    tool_messages = [m["content"] for m in messages if m["role"] == "tool"]
    assert tool_messages == ["slow first", "slow second"], "sent in the order asked"


async def test_tools_that_may_not_overlap_run_one_at_a_time(
    ollama: FakeOllama, model: ModelClient
) -> None:
    active = 0
    most = 0

    @tool()
    async def write(value: int) -> str:
        """Pretend to write."""
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0)
        active -= 1
        return str(value)

    ollama.script(CallStep("write", {"value": 1}), CallStep("write", {"value": 2}))
    ollama.script(Text("written"))
    loop, events = loop_for(model, [write])

    await loop.run(conversation())

    assert most == 1
    assert [r.content for r in events.of("result")] == ["1", "2"]


async def test_unknown_tool_and_bad_arguments_become_results(
    ollama: FakeOllama, model: ModelClient
) -> None:
    ollama.script(CallStep("fly", {}), CallStep("echo", {"word": 3, "loud": True}))
    ollama.script(Text("sorry"))
    loop, events = loop_for(model, [echo])

    result = await loop.run(conversation())

    unknown, invalid = events.of("result")
    assert unknown.status is ToolStatus.UNKNOWN_TOOL
    assert "no tool named 'fly'" in unknown.content and "echo" in unknown.content
    assert invalid.status is ToolStatus.INVALID_ARGUMENTS
    assert "'word' must be a string" in invalid.content
    assert "unknown argument 'loud'" in invalid.content
    assert result.answer.text == "sorry"


async def test_tool_error_and_timeout_become_results(
    ollama: FakeOllama, model: ModelClient
) -> None:
    @tool()
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("boom")

    @tool(timeout=0.01)
    async def hang() -> str:
        """Never returns."""
        await asyncio.Event().wait()
        return "never"

    ollama.script(CallStep("explode", {}), CallStep("hang", {}))
    ollama.script(Text("both failed"))
    loop, events = loop_for(model, [explode, hang])

    await loop.run(conversation())

    failed, timed_out = events.of("result")
    assert failed.status is ToolStatus.ERROR
    assert "RuntimeError: boom" in failed.content
    assert timed_out.status is ToolStatus.TIMEOUT
    assert "did not finish" in timed_out.content


async def test_empty_reply_gets_one_nudge(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text(""))
    ollama.script(Text("Here you go."))
    loop, _ = loop_for(model, [])
    messages = conversation()

    result = await loop.run(messages)

    assert result.answer.text == "Here you go."
    assert result.model_calls == 2
    assert ollama.requests[1]["messages"][-1]["content"] == NUDGE
    assert all(m.get("content") != NUDGE for m in messages), "the nudge is not history"


async def test_every_empty_reply_is_nudged_within_the_cap(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """As the seed loop does: each empty reply gets a nudge, and each nudged call counts."""
    ollama.script(Text(""))
    ollama.script(Text(""))
    ollama.script(Text("Here it is."))
    loop, _ = loop_for(model, [], max_iterations=3)

    result = await loop.run(conversation())

    assert (result.answer.text, result.model_calls, result.wrapped_up) == ("Here it is.", 3, False)
    assert [r["messages"][-1]["content"] for r in ollama.requests[1:]] == [NUDGE, NUDGE]


async def test_only_empty_replies_until_the_cap_fail_loudly(
    ollama: FakeOllama, model: ModelClient
) -> None:
    for _ in range(3):
        ollama.script(Text(""))
    loop, _ = loop_for(model, [], max_iterations=3)

    with pytest.raises(DegenerateTurn, match="ended its last allowed model call with an empty"):
        await loop.run(conversation())
    assert len(ollama.requests) == 3


async def test_a_nudge_goes_with_the_next_call_only(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text(""))
    ollama.script(CallStep("echo", {"word": "x"}))
    ollama.script(Text("Done."))
    loop, _ = loop_for(model, [echo])

    await loop.run(conversation())

    assert ollama.requests[1]["messages"][-1]["content"] == NUDGE
    assert ollama.requests[2]["messages"][-1]["role"] == "tool", "no nudge after a tool call"


async def test_cap_reached_with_tool_pending_forces_a_wrap_up(
    ollama: FakeOllama, model: ModelClient
) -> None:
    for _ in range(3):
        ollama.script(CallStep("echo", {"word": "again"}))
    ollama.script(Text("Here is what I found."))
    loop, events = loop_for(model, [echo], max_iterations=3)

    result = await loop.run(conversation())

    assert result.wrapped_up
    assert result.answer.text == "Here is what I found."
    assert len(ollama.requests) == 4
    assert "tools" not in ollama.requests[3] or not ollama.requests[3]["tools"]
    assert ollama.requests[3]["messages"][-1]["content"] == WRAP_UP
    assert len(events.of("result")) == 3


async def test_cap_counts_the_nudge(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(CallStep("echo", {"word": "x"}))
    ollama.script(Text(""))
    ollama.script(Text("late answer"))
    loop, _ = loop_for(model, [echo], max_iterations=2)

    with pytest.raises(DegenerateTurn, match="last allowed model call"):
        await loop.run(conversation())
    assert len(ollama.requests) == 2


async def test_empty_wrap_up_is_a_degenerate_turn(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(CallStep("echo", {"word": "x"}))
    ollama.script(Text(""))
    loop, _ = loop_for(model, [echo], max_iterations=1)

    with pytest.raises(DegenerateTurn, match=r"raise \[agents.assistant\].max_iterations"):
        await loop.run(conversation())


async def test_stop_mid_stream_keeps_partial_text(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text("Partial answer"), Pause("mid"), Text(" never seen"))
    loop, events = loop_for(model, [])
    messages = conversation()

    running = asyncio.create_task(loop.run(messages))
    await ollama.reached("mid")
    await events.saw_text.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    (message,) = events.of("message")
    assert message.text == "Partial answer"
    assert message.stopped and message.partial
    assert len(events.of("usage")) == 1, "a stopped call still counts"
    assert messages[-1] == {"role": "assistant", "content": "Partial answer"}


async def test_stop_during_tools_closes_every_call(ollama: FakeOllama, model: ModelClient) -> None:
    started = asyncio.Event()

    @tool()
    async def block() -> str:
        """Wait forever."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    ollama.script(
        CallStep("echo", {"word": "done"}),
        CallStep("block", {}),
        CallStep("echo", {"word": "later"}),
    )
    loop, events = loop_for(model, [echo, block])
    messages = conversation()

    running = asyncio.create_task(loop.run(messages))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    finished, cancelled, never_ran = events.of("result")
    assert finished.status is ToolStatus.OK and finished.content == "echo done"
    assert (
        cancelled.status is ToolStatus.STOPPED and "while 'block' was running" in cancelled.content
    )
    assert never_ran.status is ToolStatus.STOPPED and "before 'echo' ran" in never_ran.content
    assert [m["role"] for m in messages[-4:]] == ["assistant", "tool", "tool", "tool"]


async def test_a_failing_observer_changes_nothing(ollama: FakeOllama, model: ModelClient) -> None:
    class Broken(Events):
        def text(self, delta: str) -> None:
            raise RuntimeError("observer bug")

        def tool_finished(self, result: ToolResult) -> None:
            raise RuntimeError("observer bug")

    ollama.script(CallStep("echo", {"word": "x"}))
    ollama.script(Text("still fine"))
    loop, events = loop_for(model, [echo], sink=Broken())

    result = await loop.run(conversation())

    assert result.answer.text == "still fine"
    assert len(events.of("message")) == 2


def test_schema_comes_from_type_hints() -> None:
    @tool()
    def sample(
        city: Annotated[str, "a city"], days: int = 1, units: list[str] | None = None
    ) -> str:
        """Forecast for a city.

        More detail that the model does not need.
        """
        return city

    schema = sample.schema()["function"]
    assert schema["description"] == "Forecast for a city."
    assert schema["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "a city"},
            "days": {"type": "integer"},
            "units": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["city"],
    }


async def test_a_synchronous_tool_runs_off_the_loop_and_under_its_timeout(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """It blocks its thread until released; the loop times it out and goes on meanwhile (on
    the event loop it would have blocked the timeout itself)."""
    release = threading.Event()

    @tool(timeout=0.1)
    def blocking() -> str:
        """Block until released."""
        release.wait(deadline())
        return "too late"

    ollama.script(CallStep("blocking", {}))
    ollama.script(Text("It took too long."))
    loop, events = loop_for(model, [blocking], tool_grace=0.05)
    try:
        result = await loop.run(conversation())
    finally:
        release.set()

    (timed_out,) = events.of("result")
    assert timed_out.status is ToolStatus.TIMEOUT
    assert "did not finish within 0.1 s" in timed_out.content
    assert result.answer.text == "It took too long."


async def test_a_tool_that_swallows_cancellation_is_abandoned_after_its_grace(
    ollama: FakeOllama, model: ModelClient
) -> None:
    started, release, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool(timeout=0.1)
    async def stubborn() -> str:
        """Ignore every cancellation until released."""
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        ended.set()
        return "finally"

    ollama.script(CallStep("stubborn", {}))
    ollama.script(Text("Gave up on it."))
    loop, events = loop_for(model, [stubborn], tool_grace=0.05)
    abandoned = abandoned_tools()

    result = await loop.run(conversation())

    assert result.answer.text == "Gave up on it."
    assert [r.status for r in events.of("result")] == [ToolStatus.TIMEOUT]
    assert abandoned_tools() == abandoned + 1
    release.set()
    await ended.wait()
    assert [r.status for r in events.of("result")] == [ToolStatus.TIMEOUT], "it changed nothing"


async def test_each_result_reaches_the_sink_as_its_tool_finishes(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """Stored in the order of completion; sent to the model in the order asked."""
    second_done = asyncio.Event()

    @tool(read_only=True)
    async def waits(label: str) -> str:
        """Finish once the other has."""
        await second_done.wait()
        return label

    @tool(read_only=True)
    async def quick(label: str) -> str:
        """Finish at once."""
        second_done.set()
        return label

    ollama.script(CallStep("waits", {"label": "first"}), CallStep("quick", {"label": "second"}))
    ollama.script(Text("done"))
    loop, events = loop_for(model, [waits, quick])
    messages = conversation()

    await loop.run(messages)

    assert [r.content for r in events.of("result")] == ["second", "first"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["first", "second"]


async def test_a_call_cut_short_has_unknown_usage(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text("Half"), Pause("cut"), Text(" and the rest"))
    loop, events = loop_for(model, [])
    running = asyncio.create_task(loop.run(conversation()))
    await ollama.reached("cut")

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    (usage,) = events.of("usage")
    assert (usage.prompt_tokens, usage.output_tokens) == (None, None)


async def test_a_final_tool_ends_the_loop_with_its_result(
    ollama: FakeOllama, model: ModelClient
) -> None:
    @tool(final=True)
    def report(summary: str) -> str:
        """Hand back the result."""
        return summary

    ollama.script(CallStep("echo", {"word": "x"}), CallStep("report", {"summary": "All done."}))
    loop, _ = loop_for(model, [echo, report])
    messages = conversation()

    result = await loop.run(messages)

    assert (result.answer.text, result.model_calls) == ("All done.", 1)
    assert [m["role"] for m in messages[-2:]] == ["tool", "tool"], "every call has its result"
    assert len(ollama.requests) == 1


async def test_notes_from_outside_join_before_the_next_model_call(
    ollama: FakeOllama, model: ModelClient
) -> None:
    notes = ["only green ones"]
    ollama.script(CallStep("echo", {"word": "x"}))
    ollama.script(Text("Green only."))
    loop = AgentLoop(
        model,
        {"echo": echo},
        Events(),
        LoopSettings(agent="assistant", model=MODEL),
        inbox=lambda: [notes.pop()] if notes else [],
    )

    await loop.run(conversation())

    first, second = ollama.requests
    assert first["messages"][-1] == {"role": "user", "content": "only green ones"}
    assert second["messages"][-1]["role"] == "tool", "never between a call and its result"


# -- every request inside the window ----------------------------------------------------------

WINDOW = 2048


def fitted_loop(
    model: ModelClient, ollama: FakeOllama, tools: list[Tool], **settings: Any
) -> tuple[AgentLoop, list[Compaction]]:
    """A loop with a 2,048-token window, against a fake that reports what it counts."""
    ollama.count_prompts = True
    compactions: list[Compaction] = []
    loop = AgentLoop(
        model,
        {t.name: t for t in tools},
        Events(),
        LoopSettings(agent="assistant", model=MODEL, **settings),
        Compactor(model, MODEL, ContextSettings(WINDOW), Calibration(), compactions.append),
    )
    return loop, compactions


def assert_every_request_fits(ollama: FakeOllama) -> None:
    """By the fake's own count: a request, and the answer it asks for, within `num_ctx`."""
    for request, prompt in zip(ollama.requests, ollama.prompts, strict=True):
        assert prompt.num_ctx == WINDOW
        assert prompt.tokens + request["options"].get("num_predict", 0) <= WINDOW


def long_conversation(turns: int) -> list[dict[str, Any]]:
    said = "We talked about the trip, its dates, its names and its numbers, at length. " * 3
    messages = [{"role": "system", "content": "be brief"}]
    for number in range(turns):
        messages.append({"role": "user", "content": f"{number}. {said}"})
        messages.append({"role": "assistant", "content": f"Noted {number}. {said}"})
    return [*messages, {"role": "user", "content": "So, where do we go first?"}]


@tool(read_only=True)
def read_log() -> str:
    """Read the web server's log."""
    return "\n".join(f"{n:05} GET /index.html 200" for n in range(1500))


async def test_a_nudged_call_is_fitted_to_the_window(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """The continuation nudge joins the request before it is fitted: once the model's count is
    learnt, the nudged call needs a compaction first, and gets it."""
    ollama.without_tools = [Text("Ann asked about her trip; the plan was discussed at length.")]
    ollama.script(Text(""))
    ollama.script(Text("Lisbon first."))
    loop, compactions = fitted_loop(model, ollama, [echo])
    messages = long_conversation(7)

    result = await loop.run(messages)

    assert result.answer.text == "Lisbon first."
    nudged = [request for request in ollama.requests if request.get("tools")][-1]
    assert nudged["messages"][-1] == {"role": "user", "content": NUDGE}
    assert [compaction.method for compaction in compactions] == ["summary"]
    assert_every_request_fits(ollama)


async def test_the_wrap_up_call_shortens_a_tool_result_too_large_for_the_window(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """Regression: a tool result larger than the window made the wrap-up call (no tools) raise
    `ContextOverflow` instead of answering from what the tool found."""
    ollama.script(CallStep("read_log", {}))
    ollama.script(Text("The log has 1,500 requests."))
    loop, _ = fitted_loop(model, ollama, [read_log], max_iterations=1)

    result = await loop.run(conversation("what does the log say?"))

    assert result.wrapped_up and result.answer.text == "The log has 1,500 requests."
    wrap_up = ollama.requests[-1]
    assert not wrap_up.get("tools") and wrap_up["messages"][-1]["content"] == WRAP_UP
    told = wrap_up["messages"][-2]["content"]
    assert told.startswith("00000 GET") and told.endswith("01499 GET /index.html 200")
    assert "[Kaiwa: read_log returned about " in told
    assert_every_request_fits(ollama)


async def test_a_call_too_large_for_the_window_is_shortened_in_the_next_request(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """The model's own call (a long text for a tool) is shortened in the request after it; the
    tool had it whole."""
    word = "lisbon-porto-faro " * 400
    ollama.script(CallStep("echo", {"word": "short"}), CallStep("save", {"text": word}))
    ollama.script(Text("Saved."))
    saved: list[str] = []

    @tool()
    def save(text: str) -> str:
        """Save a text."""
        saved.append(text)
        return "saved"

    loop, _ = fitted_loop(model, ollama, [echo, save])
    result = await loop.run(conversation("save the route"))

    assert result.answer.text == "Saved." and saved == [word]
    calls = ollama.requests[1]["messages"][-3]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"word": "short"}
    text = calls[1]["function"]["arguments"]["text"]
    assert text.startswith("lisbon-porto-faro") and "the tool received them all" in text
    assert_every_request_fits(ollama)
