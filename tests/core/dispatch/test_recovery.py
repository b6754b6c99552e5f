"""Start-up recovery: what a dead process left is resolved in its place, once.

A crash is the state it leaves in the store: a turn still `running` (with what it said, the ids
of what its reply posted, the tools it asked for), or a message recorded that no turn took up.
Each test writes that state through the store, then "restarts": a new runner on the same store
reads the leftovers and recovers, as `kaiwa run` does (tests/bot/test_restart.py kills a real
process instead).
"""

from collections.abc import Sequence

from core.agent.messages import AssistantMessage, ToolCall
from core.channel import Outcome
from core.dispatch.recovery import Recovery, leftovers
from core.store import Inbound, Store, TurnStart, TurnState
from core.store.history import CUT_OFF
from core.turns.turn import CUT_FIRING
from tests.fakes.ollama import Pause, Text
from tests.harness import PLACE, SYSTEM_PROMPT, Bot, BotFactory


async def crashed(
    store: Store,
    text: str,
    message_id: str,
    *,
    said: str = "",
    posted: Sequence[str] = (),
    asked_for_a_tool: bool = False,
    attempt: int = 1,
    framed: bool = False,
) -> None:
    """What a process killed mid-turn leaves: the message, a turn `running` and its records."""
    claim = await store.claim_inbound(Inbound("test", message_id, PLACE, text, "ann", "turn"))
    start = TurnStart(
        PLACE, "assistant", SYSTEM_PROMPT, "person", text, "ann", claim.event_id, attempt=attempt
    )
    started = await store.start_turn(start)
    messages: list[tuple[int, AssistantMessage]] = []
    if asked_for_a_tool:
        calls = (ToolCall("c1", "echo", {"word": "x"}),)
        messages.append((1, AssistantMessage("Let me check.", tool_calls=calls)))
    if said:
        messages.append((len(messages) + 1, AssistantMessage(said, partial=True)))
    state = TurnState(reply_ids=tuple(posted), delivery="unsure" if framed else None)
    await store.record_turn(
        started.conversation_id, started.turn_id, messages=messages, state=state
    )


async def restart(make_bot: BotFactory, store: Store) -> Bot:
    """A new process on the same store: leftovers read first, then recovered."""
    bot = make_bot(bot_store=store)
    left = await leftovers(store, bot.runner.parts)
    await Recovery(store, bot.runner, {bot.channel.platform: bot.channel}).resolve(left)
    return bot


async def test_a_reply_cut_by_a_crash_is_marked_interrupted_where_it_stands(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression: after kill -9 a half reply stayed on the platform with no mark, forever."""
    await crashed(store, "tell me a story", "m-story", said="Once upon a", posted=["reply-1"])

    bot = await restart(make_bot, store)

    (reply,) = await bot.channel.finished()
    assert reply.taken_up == ("reply-1",), "the same message is edited, not a new one posted"
    assert (reply.outcome, reply.text) == (Outcome.INTERRUPTED, "Once upon a")
    (turn,) = await bot.turns()
    assert turn.status == "interrupted"
    bot.ollama.script(Text("Shall I go on?"))
    await bot.send("and then?")
    await bot.channel.finished(2)
    sent = [m["content"] for m in bot.ollama.requests[0]["messages"]]
    assert sent == [
        SYSTEM_PROMPT,
        "tell me a story",
        f"Once upon a\n\n{CUT_OFF['interrupted']}",
        "and then?",
    ]


async def test_a_turn_that_showed_nothing_and_ran_no_tool_is_run_again_once(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression: the message was recorded, its redelivery ignored as a duplicate, and the
    person, who saw "typing…", never got an answer."""
    await crashed(store, "what is 2 + 2?", "m-sum")

    bot = make_bot(bot_store=store)
    bot.ollama.script(Text("4."))
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(
        await leftovers(store, bot.runner.parts)
    )

    (reply,) = await bot.channel.finished()
    assert (reply.outcome, reply.text, reply.reply_to) == (Outcome.DONE, "4.", "m-sum")
    assert [(t.status, t.attempt) for t in await bot.turns()] == [("interrupted", 1), ("done", 2)]
    assert [m["content"] for m in bot.ollama.requests[0]["messages"]][-1] == "what is 2 + 2?"
    await bot.send("what is 2 + 2?", message_id="m-sum")  # the platform delivers it again
    assert len(bot.channel.replies) == 1, "answered once"


async def test_a_turn_that_saved_text_but_no_reply_id_is_not_run_again(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression (found killing cluster workers): a frame is saved, then posted, then its id is
    written; a kill between the post and the id left a message the restart could not see, and
    running the turn again answered the person twice. Now the person is asked instead."""
    await crashed(store, "what is 2 + 2?", "m-sum", said="It is", framed=True)

    bot = await restart(make_bot, store)

    await bot.channel.wait_until(lambda: bot.channel.notices_in(PLACE), "the notice")
    assert bot.channel.notices_in(PLACE) == [
        "I was restarted before I could finish answering “what is 2 + 2?”. Please send it again."
    ]
    assert bot.channel.replies == [] and bot.ollama.requests == []


async def test_a_turn_that_posted_only_a_status_line_is_not_run_again(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression (found killing cluster workers): "waiting for the model" was posted, the
    kill came before its id was written, nothing else was stored, and the turn ran again: two
    replies. The first frame marks the turn `unsure` before it is shown."""
    await crashed(store, "what is 2 + 2?", "m-sum", framed=True)

    bot = await restart(make_bot, store)

    await bot.channel.wait_until(lambda: bot.channel.notices_in(PLACE), "the notice")
    assert bot.channel.replies == [] and bot.ollama.requests == []


async def test_a_turn_stored_as_ended_but_never_shown_is_shown_at_the_next_start(
    make_bot: BotFactory, store: Store
) -> None:
    """Records come before the last edit (invariant 5): a kill between the two left a reply
    the store had as done and the person never saw end. The next start makes that edit."""
    claim = await store.claim_inbound(Inbound("test", "m-done", PLACE, "hello", "ann", "turn"))
    start = TurnStart(PLACE, "assistant", SYSTEM_PROMPT, "person", "hello", "ann", claim.event_id)
    started = await store.start_turn(start)
    ended = TurnState("done", reply_ids=("reply-1",), delivery="pending")
    await store.record_turn(
        started.conversation_id,
        started.turn_id,
        messages=[(1, AssistantMessage("Hello, Ann."))],
        state=ended,
    )

    bot = await restart(make_bot, store)

    (reply,) = await bot.channel.finished()
    assert (reply.taken_up, reply.outcome, reply.text) == (
        ("reply-1",),
        Outcome.DONE,
        "Hello, Ann.",
    )
    await bot.runner.wait_idle(PLACE)
    (turn,) = await bot.turns()
    assert (turn.status, turn.delivery) == ("done", "shown")
    assert bot.ollama.requests == []


async def test_a_message_that_crashed_kaiwa_twice_is_not_run_a_third_time(
    make_bot: BotFactory, store: Store
) -> None:
    await crashed(store, "the poison message", "m-poison", attempt=2)

    bot = await restart(make_bot, store)

    (notice,) = bot.channel.notices_in(PLACE)
    assert notice == (
        "I was restarted before I could finish answering “the poison message”. "
        "Please send it again."
    )
    assert bot.ollama.requests == []


async def test_a_scheduled_run_cut_by_a_crash_is_said_as_such_not_as_a_message_to_resend(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression: the place was asked to "send again" the task's own prompt, which nobody
    sent."""
    start = TurnStart(PLACE, "assistant", SYSTEM_PROMPT, "schedule", "[Scheduled task #1] digest")
    await store.start_turn(start)

    bot = await restart(make_bot, store)

    assert bot.channel.notices_in(PLACE) == [CUT_FIRING]
    assert bot.ollama.requests == [] and [t.status for t in await bot.turns()] == ["interrupted"]


async def test_a_turn_that_asked_for_a_tool_is_not_run_again_but_the_person_is_told(
    make_bot: BotFactory, store: Store
) -> None:
    """A tool may have done its side effect before the crash: running the turn again could do
    it twice."""
    await crashed(store, "book the room", "m-book", asked_for_a_tool=True)

    bot = await restart(make_bot, store)

    (notice,) = bot.channel.notices_in(PLACE)
    assert notice.startswith("I was restarted before I could finish answering “book the room”")
    rows = await bot.history()
    assert [(r.role, r.tool_status) for r in rows] == [
        ("user", None),
        ("assistant", None),
        ("tool", "interrupted"),
    ]


async def test_a_message_recorded_but_never_started_is_answered_after_the_restart_once(
    make_bot: BotFactory, store: Store
) -> None:
    await store.claim_inbound(Inbound("test", "m-late", PLACE, "still there?", "ann", "turn"))

    bot = make_bot(bot_store=store)
    bot.ollama.script(Text("Yes."))
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(
        await leftovers(store, bot.runner.parts)
    )

    (reply,) = await bot.channel.finished()
    assert (reply.text, reply.reply_to) == ("Yes.", "m-late")
    await bot.send("still there?", message_id="m-late")
    assert len(bot.channel.replies) == 1
    assert len(bot.ollama.requests) == 1


async def test_a_redelivery_that_comes_before_recovery_is_answered_once(
    make_bot: BotFactory, store: Store
) -> None:
    await store.claim_inbound(Inbound("test", "m-again", PLACE, "hello?", "ann", "turn"))
    bot = make_bot(bot_store=store)
    left = await leftovers(store, bot.runner.parts)

    bot.ollama.script(Text("Hello."))
    await bot.send("hello?", message_id="m-again")  # Telegram redelivers before recovery runs
    await bot.channel.finished()
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(left)

    assert len(bot.channel.replies) == 1
    assert len(bot.ollama.requests) == 1


async def test_messages_queued_at_shutdown_are_answered_at_the_next_start(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression: messages queued behind a running reply were dropped silently at shutdown."""
    first = make_bot()
    first.ollama.script(Text("Partial"), Pause("busy"), Text(" never"))
    await first.send("first", message_id="q-1")
    await first.ollama.reached("busy")
    await first.send("second", message_id="q-2")  # queued behind the first
    await first.runner.shutdown()

    second = make_bot(bot_store=store)
    second.ollama.script(Text("About the second."))
    await Recovery(store, second.runner, {"test": second.channel}).resolve(
        await leftovers(store, second.runner.parts)
    )

    (reply,) = await second.channel.finished()
    assert (reply.text, reply.reply_to) == ("About the second.", "q-2")
