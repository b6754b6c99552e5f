"""The turn path: the seven invariants of core/turns/runner.py, each with the bug it once could be.

All ordering is by handshakes: the fake model pauses at named points (`reached`/`release`) and the
recording channel wakes waiters on every frame; nothing here sleeps.
"""

import asyncio
import contextlib

import pytest

from core.agent.messages import ToolStatus
from core.agent.profile import AgentProfile
from core.agent.tools import Tool, tool
from core.channel import Delivery, Outcome
from core.store import Store
from core.store.history import CUT_OFF
from core.turns.turn import Provenance, TurnRequest
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Done, ErrorLine, HttpError, Pause, Text, ToolCall
from tests.fakes.patience import deadline
from tests.harness import PLACE, SYSTEM_PROMPT, Bot, BotFactory, echo

OTHER = "test:two"


async def test_plain_reply_is_streamed_and_stored(bot: Bot) -> None:
    bot.ollama.script(Text("Hello,", chunks=2), Pause("mid"), Text(" Ann."), Done(30, 6))

    await bot.send("hi")
    await bot.channel.wait_until(
        lambda: bot.channel.replies and bot.channel.replies[0].shown == "Hello,"
    )
    bot.ollama.release("mid")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert reply.text == "Hello, Ann."
    roles = [(row.role, row.text) for row in await bot.history()]
    assert roles == [("user", "hi"), ("assistant", "Hello, Ann.")]
    (turn,) = await bot.turns()
    assert (turn.status, turn.model_calls, turn.prompt_tokens, turn.output_tokens) == (
        "done",
        1,
        30,
        6,
    )


async def test_tool_round_is_stored_in_order(bot: Bot) -> None:
    bot.ollama.script(Text("Let me check."), ToolCall("echo", {"word": "hi"}))
    bot.ollama.script(Text("It said hi."))

    await bot.send("use echo")
    (reply,) = await bot.channel.finished()

    assert reply.text == "Let me check.\n\nIt said hi."
    assert await bot.assistant_text() == reply.text
    rows = await bot.history()
    assert [row.role for row in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[1].tool_calls == [{"id": "c1", "name": "echo", "arguments": {"word": "hi"}}]
    assert (rows[2].text, rows[2].tool_status) == ("echo hi", "ok")


async def test_partial_text_is_stored_while_it_streams(bot: Bot) -> None:
    bot.ollama.script(Text("First half"), Pause("mid"), Text(", second half"))

    await bot.send("go")
    await bot.ollama.reached("mid")
    await bot.channel.wait_until(lambda: bot.channel.replies[0].shown == "First half")

    rows = await bot.history()
    assert (rows[-1].role, rows[-1].text, rows[-1].partial) == ("assistant", "First half", True)
    bot.ollama.release("mid")
    (reply,) = await bot.channel.finished()
    assert (await bot.history())[-1].text == reply.text == "First half, second half"
    assert not (await bot.history())[-1].partial


# -- invariant 1 -------------------------------------------------------------------------------


async def test_invariant_1_gate_taken_once_turns_serialize(bot: Bot) -> None:
    """Turns of one conversation run one at a time, in order; other conversations overlap.
    Bug prevented: a second message overtaking (or deadlocking on) the first."""
    bot.ollama.script(Pause("one-first"), Text("first answer"))
    bot.ollama.script(Pause("two"), Text("other conversation"))
    bot.ollama.script(Text("second answer"))

    await bot.send("first")
    await bot.ollama.reached("one-first")
    await bot.send("second")
    await bot.send("elsewhere", place=OTHER)
    await bot.ollama.reached("two")

    assert len(bot.ollama.requests) == 2, "the second message waits for the first turn"
    bot.ollama.release("one-first")
    await bot.channel.wait_until(lambda: len(bot.ollama.requests) == 3)
    assert bot.ollama.requests[2]["messages"][-1]["content"] == "second"
    assert bot.ollama.requests[2]["messages"][-2]["content"] == "first answer"
    bot.ollama.release("two")
    replies = await bot.channel.finished(3)
    assert sorted(r.text or "" for r in replies) == [
        "first answer",
        "other conversation",
        "second answer",
    ]


# -- invariant 2 -------------------------------------------------------------------------------


async def test_invariant_2_pinned_slot_survives_eviction(make_bot: BotFactory) -> None:
    """With room for one conversation, a second conversation must not evict the first while its
    turn runs. Bug prevented: a fresh gate for the next message, and two turns at once."""
    bot = make_bot(max_cached_conversations=1)
    bot.ollama.script(Pause("a1"), Text("a1 done"))
    bot.ollama.script(Text("b1 done"))
    bot.ollama.script(Text("a2 done"))

    await bot.send("a1")
    await bot.ollama.reached("a1")
    await bot.send("b1", place=OTHER)
    await bot.channel.finished(1)
    await bot.send("a2")

    assert [r["messages"][-1]["content"] for r in bot.ollama.requests] == ["a1", "b1"]
    bot.ollama.release("a1")
    await bot.channel.finished(3)
    assert bot.ollama.requests[2]["messages"][-1]["content"] == "a2"


async def test_evicted_conversation_reloads_from_the_store(make_bot: BotFactory) -> None:
    bot = make_bot(max_cached_conversations=1)
    bot.ollama.script(Text("one"))
    bot.ollama.script(Text("two"))
    bot.ollama.script(Text("three"))

    await bot.send("a1")
    await bot.channel.finished(1)
    await bot.send("b1", place=OTHER)
    await bot.channel.finished(2)
    await bot.send("a2")
    await bot.channel.finished(3)

    contents = [m["content"] for m in bot.ollama.requests[2]["messages"]]
    assert contents == [SYSTEM_PROMPT, "a1", "one", "a2"]


# -- invariant 3 -------------------------------------------------------------------------------


async def test_invariant_3_stop_targets_running_and_drops_queued(bot: Bot) -> None:
    """/stop stops the running turn and drops (and counts) the queued one.
    Bug prevented: a stop that cancels the queued message while the running reply goes on."""
    bot.ollama.script(Text("Working on it"), Pause("long"), Text(" and more"))

    await bot.send("long question", message_id="first")
    await bot.channel.wait_until(lambda: bot.channel.replies and bot.channel.replies[0].shown)
    await bot.send("follow-up", message_id="queued")
    await bot.send("/stop")

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.STOPPED
    assert bot.channel.notices_in(PLACE) == ["Stopped. Dropped 1 queued message."]
    assert len(bot.ollama.requests) == 1, "the dropped message never reached the model"
    assert await bot.store.inbound_status("test", "queued") == "dropped"
    assert all(row.text != "follow-up" for row in await bot.history())


async def test_stop_with_nothing_running(bot: Bot) -> None:
    await bot.send("/stop")
    assert bot.channel.notices_in(PLACE) == ["Nothing to stop."]
    assert bot.ollama.requests == []


async def test_stop_in_one_conversation_leaves_the_other_running(bot: Bot) -> None:
    bot.ollama.script(Pause("one"), Text("one"))
    bot.ollama.script(Pause("two"), Text("two"))
    await bot.send("first")
    await bot.send("second", place=OTHER)
    await bot.ollama.reached("one")
    await bot.ollama.reached("two")

    await bot.send("/stop")
    bot.ollama.release("two")

    replies = await bot.channel.finished(2)
    outcomes = {reply.place: reply.outcome for reply in replies}
    assert outcomes == {PLACE: Outcome.STOPPED, OTHER: Outcome.DONE}


# -- invariant 4 -------------------------------------------------------------------------------


async def test_invariant_4_stop_keeps_partial_text(bot: Bot) -> None:
    """The stored text equals the text the person saw, marked stopped.
    Bug prevented: a stop that throws away what was already said."""
    bot.ollama.script(Text("The first part", chunks=3), Pause("mid"), Text(" the rest"))

    await bot.send("tell me")
    await bot.ollama.reached("mid")
    await bot.channel.wait_until(lambda: bot.channel.replies[0].shown == "The first part")
    await bot.send("/stop")

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.STOPPED
    assert reply.text == "The first part"
    last = (await bot.history())[-1]
    assert (last.text, last.stopped, last.partial) == ("The first part", True, True)
    (turn,) = await bot.turns()
    assert (turn.status, turn.stop_reason) == ("stopped", "user")


async def test_the_notice_names_every_tool_even_one_no_frame_showed(make_bot: BotFactory) -> None:
    """Regression: a tool that ran between two frames was never shown (the terminal leaves a
    line for each tool)."""
    bot = make_bot(channel=RecordingChannel(hold_update=True), tools=[echo])
    bot.ollama.script(ToolCall("echo", {"word": "x"}), ToolCall("echo", {"word": "y"}))
    bot.ollama.script(Pause("answering"), Text("Echoed twice."))

    await bot.send("echo")
    await bot.channel.updating.wait()  # the pump is stuck on its first frame: no other is shown
    await bot.ollama.reached("answering")  # both tools have run meanwhile
    bot.channel.release_update()
    bot.ollama.release("answering")
    (reply,) = await bot.channel.finished()

    assert reply.tools == ("echo", "echo")


async def test_stop_during_a_tool_closes_the_call_and_next_request_is_well_formed(
    make_bot: BotFactory,
) -> None:
    started = asyncio.Event()

    @tool()
    async def slow_search(query: str) -> str:
        """Search slowly."""
        started.set()
        await asyncio.Event().wait()
        return query

    bot = make_bot(tools=[echo, slow_search])
    bot.ollama.script(ToolCall("echo", {"word": "x"}), ToolCall("slow_search", {"query": "q"}))
    bot.ollama.script(Text("Fine, new topic."))

    await bot.send("search")
    await started.wait()
    await bot.send("/stop")
    await bot.channel.finished()

    rows = await bot.history()
    assert [(r.role, r.tool_status) for r in rows[-3:]] == [
        ("assistant", None),
        ("tool", ToolStatus.OK.value),
        ("tool", ToolStatus.STOPPED.value),
    ]
    await bot.send("something else")
    await bot.channel.finished(2)
    sent = bot.ollama.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "user"]


# -- invariant 5 -------------------------------------------------------------------------------


async def test_invariant_5_records_survive_cancelled_notice(make_bot: BotFactory) -> None:
    """A cancellation that lands during the closing notice finds the records already stored.
    Bug prevented: notify-then-record, where a second /stop lost the turn's ending."""
    bot = make_bot(channel=RecordingChannel(hold_finish=True))
    bot.ollama.script(Text("All done."))

    task = bot.runner.submit(TurnRequest(platform="test", place=PLACE, text="hi"))
    await bot.channel.finishing.wait()
    task.cancel()
    result = await task

    assert result.status == "done"
    (turn,) = await bot.turns()
    assert turn.status == "done"
    assert (await bot.history())[-1].text == "All done."


async def test_a_stop_during_the_last_edit_lets_the_reply_finish(make_bot: BotFactory) -> None:
    bot = make_bot(channel=RecordingChannel(hold_finish=True))
    bot.ollama.script(Text("Complete answer."))

    await bot.send("hi")
    await bot.channel.finishing.wait()
    report = bot.runner.stop(PLACE)
    bot.channel.release_finish()

    (reply,) = await bot.channel.finished()
    assert not report.stopped_running
    assert (reply.outcome, reply.text) == (Outcome.DONE, "Complete answer.")


async def test_an_edit_in_flight_when_a_turn_ends_finishes_before_the_last_edit(
    make_bot: BotFactory,
) -> None:
    """Regression: ending a turn cancelled the frame pump mid-edit; on a platform where the edit
    had already landed, the reply's final text then went out as a second message."""
    bot = make_bot(channel=RecordingChannel(hold_update=True))
    bot.ollama.script(Text("Partial"), Pause("mid"), Text(" and the rest"))

    await bot.send("go")
    await bot.channel.updating.wait()
    assert bot.runner.stop(PLACE).stopped_running
    bot.channel.release_update()
    await bot.channel.finished()

    assert bot.channel.calls == ["update started", "update done", "finish"]
    assert bot.channel.replies[0].outcome is Outcome.STOPPED


# -- invariant 6 -------------------------------------------------------------------------------


async def test_invariant_6_unattended_failure_is_contained(bot: Bot) -> None:
    """A scheduled firing whose model fails reports it and returns; nothing escapes.
    Bug prevented: an exception killing the scheduler's job (and every later firing)."""
    bot.ollama.script(HttpError(500, "model runner crashed"))
    request = TurnRequest("test", PLACE, "daily summary", provenance=Provenance.SCHEDULE)

    result = await bot.runner.run_unattended(request)

    assert result.status == "failed"
    (reply,) = bot.channel.replies
    assert reply.outcome is Outcome.FAILED
    assert "HTTP 500: model runner crashed" in (reply.note or "")
    (turn,) = await bot.turns()
    assert (turn.status, turn.provenance) == ("failed", "schedule")
    assert "model runner crashed" in (turn.error or "")


async def test_a_scheduled_message_too_large_for_the_window_is_named_as_the_tasks(
    make_bot: BotFactory,
) -> None:
    """A refusal names whose message it is by the turn's provenance: nobody is told to "send
    something shorter" for a scheduled task's text."""
    bot = make_bot(context_window=2048)
    request = TurnRequest("test", PLACE, "Summarize: " + "news " * 2000, Provenance.SCHEDULE)

    result = await bot.runner.run_unattended(request)

    assert result.status == "failed" and result.error is not None
    assert result.error.startswith("this scheduled task's message is about ")
    assert "shorten the task's text, or raise [agents.assistant].context_window" in result.error
    assert bot.ollama.requests == []


async def test_unattended_turn_stopped_returns_instead_of_raising(bot: Bot) -> None:
    bot.ollama.script(Pause("firing"), Text("never"))
    request = TurnRequest("test", PLACE, "daily", provenance=Provenance.SCHEDULE)

    firing = asyncio.create_task(bot.runner.run_unattended(request))
    await bot.ollama.reached("firing")
    await bot.send("/stop")

    result = await firing
    assert result.status == "stopped"


# -- invariant 7 -------------------------------------------------------------------------------


async def test_invariant_7_shutdown_waits_for_every_turn(bot: Bot) -> None:
    """Shutdown stops every live turn, not only the newest per conversation, and each stores
    its partial text; a message still queued stays recorded for the next start to answer.
    Bug prevented: turns left running after the store closed."""
    bot.ollama.script(Text("Partial one"), Pause("one"), Text(" rest"))
    bot.ollama.script(Text("Partial two"), Pause("two"), Text(" rest"))
    await bot.send("first", message_id="a")
    await bot.send("second", place=OTHER, message_id="b")
    await bot.send("queued", message_id="c")
    await bot.ollama.reached("one")
    await bot.ollama.reached("two")
    await bot.channel.wait_until(
        lambda: sorted(r.shown for r in bot.channel.replies) == ["Partial one", "Partial two"]
    )

    await bot.runner.shutdown()

    assert all(r.outcome is Outcome.STOPPED for r in bot.channel.replies)
    for place, text in ((PLACE, "Partial one"), (OTHER, "Partial two")):
        assert (await bot.history(place))[-1].text == text
        assert (await bot.turns(place))[-1].stop_reason == "shutdown"
    (queued,) = await bot.store.unanswered_messages()
    assert (queued.platform_message_id, queued.text) == ("c", "queued")


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([HttpError(500, "internal error")], "Ollama answered HTTP 500: internal error"),
        ([Text("half"), ErrorLine("runner died")], "error mid-reply: runner died"),
        ([Text("")], None),
    ],
    ids=["http-error", "error-line", "degenerate"],
)
async def test_failures_end_the_turn_with_a_reason(
    bot: Bot, steps: list[object], message: str | None
) -> None:
    bot.ollama.script(*steps)  # type: ignore[arg-type]
    bot.ollama.default = [Text("")]  # every nudged call empty too

    await bot.send("hi")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note
    if message:
        assert message in reply.note
    (turn,) = await bot.turns()
    assert (turn.status, turn.error) == ("failed", reply.note)
    assert reply.text == await bot.assistant_text() if reply.text else True


async def test_missing_model_tells_what_to_pull(bot: Bot) -> None:
    bot.ollama.models.clear()

    await bot.send("hi")
    (reply,) = await bot.channel.finished()

    assert reply.note == "model test-model not found: run `ollama pull test-model`"
    assert [row.role for row in await bot.history()] == ["user"], "the message is kept"


async def test_error_text_never_enters_the_model_context(bot: Bot) -> None:
    bot.ollama.script(HttpError(500, "secret internals"))
    bot.ollama.script(Text("ok now"))

    await bot.send("first")
    await bot.channel.finished()
    await bot.send("second")
    await bot.channel.finished(2)

    sent = bot.ollama.requests[1]["messages"]
    assert all("secret internals" not in str(m) for m in sent)


# -- restart -----------------------------------------------------------------------------------


async def test_history_and_system_prompt_survive_a_restart(
    make_bot: BotFactory, sqlite_url: str, store: Store
) -> None:
    first = make_bot()
    first.ollama.script(Text("Nice to meet you, Ann."))
    await first.send("I am Ann")
    await first.channel.finished()
    await first.runner.shutdown()
    await store.close()

    reopened = await Store.open(sqlite_url)
    try:
        second = make_bot(bot_store=reopened)
        second.ollama.script(Text("You are Ann."))
        await second.send("who am I?")
        await second.channel.finished()
    finally:
        await second.runner.shutdown()
        await reopened.close()

    sent = second.ollama.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", SYSTEM_PROMPT),
        ("user", "I am Ann"),
        ("assistant", "Nice to meet you, Ann."),
        ("user", "who am I?"),
    ]


@pytest.mark.parametrize("ending", ["stopped", "failed"])
async def test_the_model_reads_a_cut_reply_the_same_before_and_after_a_restart(
    make_bot: BotFactory, ending: str
) -> None:
    """The bug: a stopped or failed reply went back to the model as its bare text for the rest
    of the process's life, and with its "[This reply was cut off here: …]" mark once read from
    the store; a restart changed the request (and Ollama's prompt cache missed). Now a request
    after a restart extends the one before it."""
    bot = make_bot()
    if ending == "stopped":
        bot.ollama.script(Text("The first part"), Pause("mid"), Text(" the rest"))
    else:
        bot.ollama.script(Text("The first part"), ErrorLine("runner died"))
    await bot.send("tell me")
    if ending == "stopped":
        await bot.ollama.reached("mid")
        await bot.channel.wait_until(lambda: bot.channel.replies[0].shown == "The first part")
        await bot.send("/stop")
    await bot.channel.finished()
    bot.ollama.script(Text("Going on."))
    await bot.send("go on")
    await bot.channel.finished(2)
    before = bot.ollama.requests[-1]["messages"]

    restarted = make_bot()  # a new process, on the same store
    restarted.ollama.script(Text("And on."))
    await restarted.send("and then?")
    await restarted.channel.finished()
    after = restarted.ollama.requests[-1]["messages"]

    assert after[: len(before)] == before
    assert f"The first part\n\n{CUT_OFF[ending]}" in [m["content"] for m in before]


@pytest.mark.parametrize("shows", [Delivery.STALE, Delivery.NOTHING])
async def test_a_reply_the_platform_does_not_show_in_full_is_recorded_so(
    make_bot: BotFactory, shows: Delivery
) -> None:
    bot = make_bot(channel=RecordingChannel(shows=shows))
    bot.ollama.script(Text("All of it."))

    await bot.send("hi")
    await bot.channel.finished()  # the turn queues what the platform shows as it finishes

    (turn,) = await bot.turns()  # a read queued after it, on SQLite's one database thread
    assert (turn.status, turn.delivery) == ("done", shows.value)
    assert await bot.assistant_text() == "All of it.", "the store has it all"


async def test_a_message_with_nothing_to_read_gets_a_hint_not_a_turn(bot: Bot) -> None:
    """Regression: a bare mention sent an empty message to the model."""
    await bot.send("   ")

    assert bot.channel.notices_in(PLACE) == [
        "Ask me something: I read text, so write your question as a message."
    ]
    assert bot.ollama.requests == []


# -- tools that misbehave, results as they finish, wrap-ups, tries again, unknown usage ------------


def stubborn_tool(started: asyncio.Event, release: asyncio.Event) -> Tool:
    @tool()
    async def stubborn() -> str:
        """Ignore every cancellation until released."""
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return "finally"

    return stubborn


async def test_stop_ends_a_turn_whose_tool_ignores_cancellation(make_bot: BotFactory) -> None:
    """It used to answer "Stopped." while the turn ran on, with the conversation locked."""
    started, release = asyncio.Event(), asyncio.Event()
    bot = make_bot(tools=[stubborn_tool(started, release)], tool_grace=0.05)
    bot.ollama.script(ToolCall("stubborn", {}))
    await bot.send("go")
    await started.wait()

    await bot.send("/stop")
    (stopped,) = await bot.channel.finished()
    bot.ollama.script(Text("Still here."))
    await bot.send("are you there?")
    (_, answered) = await bot.channel.finished(2)
    release.set()

    assert stopped.outcome is Outcome.STOPPED
    assert bot.channel.notices_in(PLACE) == ["Stopped."]
    assert answered.text == "Still here."
    (result,) = [row for row in await bot.history() if row.role == "tool"]
    assert result.tool_status == ToolStatus.STOPPED.value


async def test_shutdown_does_not_wait_for_a_tool_that_ignores_cancellation(
    make_bot: BotFactory,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    bot = make_bot(tools=[stubborn_tool(started, release)], tool_grace=0.05)
    bot.ollama.script(ToolCall("stubborn", {}))
    await bot.send("go")
    await started.wait()

    try:
        async with asyncio.timeout(deadline()):  # a guard: the grace is 0.05 s
            report = await bot.runner.shutdown()
    finally:
        release.set()

    assert report.running == 1
    assert (await bot.turns())[-1].status == "stopped"


async def test_a_finished_tool_result_is_stored_while_the_next_tool_runs(
    make_bot: BotFactory,
) -> None:
    """A crash while the second runs must not lose the first, whose side effect happened."""
    second_started, release = asyncio.Event(), asyncio.Event()

    @tool()
    def first() -> str:
        """Done at once."""
        return "first done"

    @tool()
    async def second() -> str:
        """Wait to be released."""
        second_started.set()
        await release.wait()
        return "second done"

    bot = make_bot(tools=[first, second])
    bot.ollama.script(ToolCall("first", {}), ToolCall("second", {}))
    bot.ollama.script(Text("Both done."))
    await bot.send("go")
    await second_started.wait()

    stored = [row.text for row in await bot.history() if row.role == "tool"]
    release.set()
    await bot.channel.finished()

    assert stored == ["first done"]


async def test_a_wrapped_up_turn_says_so_on_the_platform_in_the_store_and_in_usage(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(max_iterations=2)
    bot.ollama.script(ToolCall("echo", {"word": "a"}))
    bot.ollama.script(ToolCall("echo", {"word": "b"}))
    bot.ollama.script(Text("Here is what I have."))

    result = await bot.runner.run_unattended(TurnRequest("test", PLACE, "dig deep"))
    await bot.send("/usage")

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.note) == (Outcome.DONE, "answered at the limit of 2 model calls")
    assert (result.status, result.model_calls, result.wrapped_up) == ("done", 3, True)
    (turn,) = await bot.turns()
    assert turn.wrapped_up and turn.model_calls == 3
    (usage,) = bot.channel.notices_in(PLACE)
    assert "#1 done, answered at the limit of its model calls: 3 model calls" in usage


async def test_a_503_before_any_text_is_tried_again_and_shown_once(bot: Bot) -> None:
    bot.ollama.script(HttpError(503, "busy"))
    bot.ollama.script(Text("Fine, thanks.", chunks=3))

    await bot.send("how are you?")
    (reply,) = await bot.channel.finished()

    assert (reply.outcome, reply.text) == (Outcome.DONE, "Fine, thanks.")
    shown = [frame.text for frame in reply.frames]
    assert all("Fine, thanks.".startswith(text) for text in shown), "never shown twice"
    assert len(bot.ollama.requests) == 2


async def test_the_tokens_of_a_call_cut_short_are_unknown_not_zero(bot: Bot) -> None:
    bot.ollama.script(Text("Hello"), Pause("mid"), Text(" there."))
    await bot.send("hi")
    await bot.ollama.reached("mid")

    await bot.send("/stop")
    await bot.channel.finished()
    await bot.send("/usage")

    (turn,) = await bot.turns()
    assert (turn.model_calls, turn.prompt_tokens, turn.output_tokens) == (1, None, None)
    usage = bot.channel.notices_in(PLACE)[-1]
    assert "#1 stopped: 1 model call, ? tokens in, ? out" in usage


# -- which agent answers ---------------------------------------------------------------------

CODER = AgentProfile(name="coder", model="coder-model", system_prompt="You write code.", tools={})


async def test_a_new_conversation_gets_its_channels_agent_and_keeps_it(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(agents={"coder": CODER}, channel_agents={"test": "coder"})
    bot.ollama.models.append("coder-model")
    await bot.send("write me a loop")
    await bot.channel.finished()

    later = make_bot(agents={"coder": CODER})  # restarted; the channel's agent is now the default
    await later.send("and now in Rust")
    await later.channel.finished()

    first, again = bot.ollama.requests
    assert (first["model"], first["messages"][0]["content"]) == ("coder-model", "You write code.")
    assert again["model"] == "coder-model", "the conversation keeps the agent it started with"
    conversation = await bot.store.active_conversation(PLACE)
    assert conversation is not None and conversation.agent == "coder"


async def test_a_conversation_whose_agent_is_gone_gets_the_channels_agent(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = make_bot(agents={"coder": CODER}, channel_agents={"test": "coder"})
    bot.ollama.models.append("coder-model")
    await bot.send("write me a loop")
    await bot.channel.finished()

    later = make_bot()  # the coder agent was removed from the config
    await later.send("still there?")
    (reply,) = await later.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert bot.ollama.requests[-1]["model"] == "test-model"
    assert "ran agent coder, which is no longer configured; assistant answers" in caplog.text
