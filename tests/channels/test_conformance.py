"""What every platform adapter must do, written once and run for each platform.

Each test drives the real adapter through the platform's fake (the web chat: its own HTTP API)
and the fake Ollama; see tests/channels/platforms.py and tests/channels/web_platform.py for how
each platform is set up and read.

A contract some platforms do not share is marked with the ones it runs on (`platforms`), and why
the others are left out. The web chat shares every contract but four kinds. Its platform is
this process's own board: nothing across a network rate limits it, refuses or loses a post,
answers one without its id or hangs up (`NETWORKED`); a page shows a reply being written by its
bubble, so no "typing…" request is ever in flight (`TYPING`); a web conversation is one
person's, so no one else can press or write in it (`SHARED_PLACES`: another person's request
there is answered as if the conversation did not exist, tests/channels/web/test_team.py); and a
page shows a reply's status line apart from its text (`STATUS_IN_TEXT`: it cannot spill into a
message of its own; the harness's `seen` reads it where it is).
"""

import asyncio
from itertools import pairwise

import pytest
from prometheus_client import REGISTRY

from channels.presses import STOP, payload
from channels.rendering import LOST_NOTICE
from core.agent.tools import ToolContext
from core.channel import Button, Delivery, Frame, Outcome, Reply
from core.features.approvals.questions import ApprovalSettings
from core.features.schedule.timing import ScheduleSettings, When
from tests.channels.platforms import (
    ANN,
    BOB,
    MALLORY,
    POOL_SIZE,
    WITH_HELPERS,
    Platform,
    RemotePlatform,
    research,
)
from tests.fakes.ollama import ChunkDelay, Done, Pause, Text, ToolCall
from workflows.plan.settings import PlanSettings

SENTENCE = "A paragraph of explanation that goes on for a while. "
STORM = 20
CHATS, ROUNDS = 10, 100  # a thousand replies, ten at a time

REMOTE = ("telegram", "slack", "discord")
NETWORKED = pytest.mark.platforms(
    *REMOTE,
    why="the web chat's platform is this process's own board: no rate limit, refusal, lost "
    "post, answer without an id or hang-up",
)
TYPING = pytest.mark.platforms(
    *REMOTE, why="the web chat sends no typing request: a page marks a reply by its bubble"
)
SHARED_PLACES = pytest.mark.platforms(
    *REMOTE, why="a web conversation is one person's: no one else presses or writes in it"
)
STATUS_IN_TEXT = pytest.mark.platforms(
    *REMOTE, why="the web chat shows a reply's status line apart from its text, never in it"
)


def code_block(lines: int) -> str:
    body = "\n".join(f"print({n})  # line {n} of the example" for n in range(lines))
    return f"```python\n{body}\n```"


async def test_each_chat_is_its_own_conversation(platform: Platform) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("Hello Ann."))
    ollama.script(Text("Hello Bob."))

    platform.say(ANN, "I am Ann")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Hello Ann."], "Ann's reply")
    platform.say(BOB, "Who am I?")
    await platform.wait_until(lambda: platform.shown(BOB) == ["Hello Bob."], "Bob's reply")

    assert await platform.bot.store.active_conversation(platform.place(ANN)) is not None
    bob_saw = [m["content"] for m in ollama.requests[1]["messages"]]
    assert "I am Ann" not in bob_saw


@pytest.mark.channel(paced=False)  # the interval alone; the platform's limits space edits more
async def test_a_streamed_reply_is_edited_no_faster_than_the_interval(platform: Platform) -> None:
    words = " ".join(["word"] * 40)
    platform.bot.ollama.script(ChunkDelay(0.01), Text(words, chunks=40))

    platform.say(ANN, "stream please")
    await platform.wait_until(lambda: platform.shown(ANN) == [words], "the whole reply")

    times = platform.edit_times(ANN)
    assert len(times) >= 3, "the reply grew by edits"
    interval = platform.bot.channel.traits.frame_interval
    streaming = times[:-1]  # the final text does not wait for the interval
    assert all(later - earlier >= interval * 0.99 for earlier, later in pairwise(streaming))


async def test_a_long_reply_is_split_without_breaking_code(platform: Platform) -> None:
    """About two and a half messages' worth, in proportion to the platform's limit."""
    sentences, lines = platform.limit // 100, platform.limit // 45
    prose = SENTENCE * sentences
    answer = f"{prose}\n\n{code_block(lines)}\n\n{prose}\n\n{prose}"
    platform.bot.ollama.script(Text(answer, chunks=20))

    platform.say(ANN, "explain with code")
    await platform.wait_until(
        lambda: "".join(platform.shown(ANN)).count(SENTENCE.strip()) == 3 * sentences,
        "every paragraph on the platform",
    )

    shown = platform.shown(ANN)
    assert len(shown) == 3
    assert all(len(text) <= platform.limit for text in shown)
    assert platform.fences_intact(ANN)
    assert sum(text.count("print(") for text in shown) == lines


@NETWORKED
async def test_a_rate_limit_delays_but_loses_nothing(platform: RemotePlatform) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("First part."), Pause("limited"), Text(" Second part, complete."))

    platform.say(ANN, "go")
    await platform.wait_until(lambda: platform.shown(ANN) == ["First part."], "the first part")
    platform.rate_limit_edits(retry_after=1)
    ollama.release("limited")

    await platform.wait_until(
        lambda: platform.shown(ANN) == ["First part. Second part, complete."], "the whole reply"
    )


def counted(name: str, platform: Platform) -> float:
    return REGISTRY.get_sample_value(name, {"platform": platform.name}) or 0.0


@NETWORKED
async def test_rate_limits_and_refusals_are_counted_for_the_operators(
    platform: RemotePlatform,
) -> None:
    """One 429 is one rate limit of this platform, whether Kaiwa or the library waited it out
    (discord.py waits most out itself); a refused post is an API error."""
    limits, errors = "kaiwa_platform_rate_limits_total", "kaiwa_platform_api_errors_total"
    limits_before, errors_before = counted(limits, platform), counted(errors, platform)
    await test_a_rate_limit_delays_but_loses_nothing(platform)
    assert counted(limits, platform) - limits_before == 1
    assert counted(errors, platform) == errors_before

    platform.refuse_posts(BOB)
    reply = platform.reply(BOB)
    await reply.update(Frame("Words nobody will see"))
    await reply.finish("Words nobody will see.", Outcome.DONE, None)
    assert counted(errors, platform) - errors_before >= 1
    assert counted(limits, platform) - limits_before == 1


async def test_stop_keeps_the_partial_text_on_the_platform_and_in_the_store(
    platform: Platform,
) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("The beginning of a long story"), Pause("story"), Text(" never told"))

    platform.say(ANN, "tell me a story")
    await platform.wait_until(
        lambda: platform.shown(ANN) == ["The beginning of a long story"], "the partial reply"
    )
    platform.say(ANN, "/stop")
    await platform.wait_until(lambda: "Stopped." in platform.shown(ANN), "the stop notice")

    reply = platform.shown(ANN)[0]
    assert reply == "The beginning of a long story (stopped)"
    assert await platform.bot.assistant_text(platform.place(ANN)) == reply.removesuffix(
        " (stopped)"
    )


async def test_the_stop_button_stops_the_reply_keeps_its_text_and_goes_away(
    platform: Platform,
) -> None:
    """Pressing Stop is typing /stop: the reply keeps its partial text, on the platform and in
    the store; its button goes; "Stopped." is told to the presser alone. The button is there
    though the model stalls after its first words (on Telegram it comes by an edit after the
    post, one the reply makes itself when no frame comes)."""
    ollama = platform.bot.ollama
    ollama.script(Text("The beginning of a long story"), Pause("story"), Text(" never told"))

    platform.say(ANN, "tell me a story")
    await platform.wait_until(
        lambda: platform.shown(ANN) == ["The beginning of a long story"], "the partial reply"
    )
    await platform.wait_until(lambda: platform.has_stop_button(ANN), "a reply one can stop")
    platform.press_stop(ANN)
    await platform.wait_until(lambda: platform.told_privately(ANN) == ["Stopped."], "the answer")

    assert platform.shown(ANN) == ["The beginning of a long story (stopped)"]
    assert not platform.has_stop_button(ANN)
    place = platform.place(ANN)
    assert await platform.bot.assistant_text(place) == "The beginning of a long story"
    assert (await platform.bot.turns(place))[-1].status == Outcome.STOPPED.value


@SHARED_PLACES
async def test_a_strangers_press_stops_nothing(platform: Platform) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("An answer for Ann"), Pause("answer"), Text(", complete."))

    platform.say(ANN, "a question")
    await platform.wait_until(lambda: platform.shown(ANN) == ["An answer for Ann"], "streaming")
    await platform.wait_until(lambda: platform.has_stop_button(ANN), "the Stop button")
    platform.press_stop(ANN, user=MALLORY)
    await platform.wait_until(lambda: platform.told_privately(ANN), "the refusal")
    (refusal,) = platform.told_privately(ANN)
    assert "not allowed" in refusal and str(MALLORY) in refusal

    ollama.release("answer")
    await platform.wait_until(
        lambda: platform.shown(ANN) == ["An answer for Ann, complete."], "the whole reply"
    )
    assert not platform.has_stop_button(ANN), "a finished reply has no Stop button"
    assert (await platform.bot.turns(platform.place(ANN)))[-1].status == Outcome.DONE.value


async def test_a_reply_cut_at_the_length_limit_says_so(platform: Platform) -> None:
    platform.bot.ollama.script(Text("The first half of a long"), Done(reason="length"))

    platform.say(ANN, "tell me everything")

    await platform.wait_until(
        lambda: platform.shown(ANN) == ["The first half of a long (cut at the length limit)"],
        "the reply marked as cut",
    )
    assert (await platform.bot.turns(platform.place(ANN)))[-1].status == Outcome.CUT.value


@pytest.mark.model_slots(1)
async def test_a_reply_waiting_for_a_model_slot_says_how_many_are_ahead(
    platform: Platform,
) -> None:
    ollama = platform.bot.ollama
    ollama.script(Pause("ann"), Text("Ann's answer."))
    ollama.script(Text("Bob's answer."))

    platform.say(ANN, "first")
    await ollama.reached("ann")
    platform.say(BOB, "second")
    await platform.wait_until(
        lambda: any(
            "waiting for the model: 1 request ahead" in text for text in platform.seen(BOB)
        ),
        "Bob told what his reply waits for",
    )
    ollama.release("ann")

    await platform.wait_until(lambda: platform.shown(BOB) == ["Bob's answer."], "Bob's answer")
    assert platform.shown(ANN) == ["Ann's answer."]


@STATUS_IN_TEXT
async def test_a_status_line_that_spilled_over_is_gone_from_the_final_reply(
    platform: Platform,
) -> None:
    text = "x" * (platform.limit - 10)
    reply = platform.reply(ANN)

    await reply.update(Frame(text, activity="using current_time…"))
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the status on its own")
    await reply.finish(text, Outcome.DONE, None)

    assert platform.shown(ANN) == [text]
    assert not platform.has_stop_button(ANN)


async def test_a_duplicate_delivery_is_answered_once(platform: Platform) -> None:
    platform.bot.ollama.script(Text("Only once."))

    message_id = platform.say(ANN, "hello")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Only once."], "the reply")
    platform.say_again(ANN, message_id)
    platform.say(ANN, "/usage")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the /usage answer")

    assert len(platform.bot.ollama.requests) == 1
    assert platform.shown(ANN)[1].startswith("Usage of this conversation (1 turn)")


async def test_a_stranger_is_refused_without_a_model_call(platform: Platform) -> None:
    platform.say(MALLORY, "let me in", user=MALLORY)
    await platform.wait_until(lambda: platform.shown(MALLORY), "the refusal")

    (refusal,) = platform.shown(MALLORY)
    assert "not allowed" in refusal and str(MALLORY) in refusal
    assert refusal.startswith(f"Sorry, {platform.name_of(MALLORY)}, ")
    assert platform.bot.ollama.requests == []


async def test_agents_answers_in_the_conversation(platform: Platform) -> None:
    platform.bot.ollama.script(Text("Hello."))
    platform.say(ANN, "hi")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Hello."], "the reply")

    platform.say(ANN, "/agents")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the /agents answer")
    platform.say(ANN, "/agents stop")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 3, "the usage line")

    assert platform.shown(ANN)[1:] == [
        "No sub-agents in this conversation.",
        "Which one? /agents stop NAME, with a name or id from /agents (/stop stops all).",
    ]


async def two_researchers_listed(platform: Platform) -> str:
    """Ann's question handed to two researchers (apples stalled after its first words, pears
    before any), then /agents, which lists both with a Stop button each, in the order listed;
    returns the payload of find-apples's Stop."""
    ollama = platform.bot.ollama
    ollama.script(research("find apples", "find pears"))
    ollama.script(Text("Two helpers are on it."))
    ollama.script_for("apples", Text("Apples so far: Gala"), Pause("apples"), Text(", Fuji"))
    ollama.script_for("pears", Pause("pears"), ToolCall("report", {"summary": "Pears: 2 kinds."}))
    ollama.default = [Text("Here is what came back.")]

    platform.say(ANN, "what fruit is there?")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Two helpers are on it."], "reply")
    await ollama.reached("apples")
    platform.say(ANN, "/agents")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the /agents answer")
    listing = platform.shown(ANN)[1]
    assert "find-apples (a1)" in listing and "find-pears (a2)" in listing
    stop_apples = payload(Button("Stop find-apples", "/agents stop a1"))
    stop_pears = payload(Button("Stop find-pears", "/agents stop a2"))
    assert platform.buttons(ANN) == [stop_pears, stop_apples], "in the order listed"
    return stop_apples


@pytest.mark.bot(**WITH_HELPERS)
async def test_agents_has_a_stop_button_per_running_agent(platform: Platform) -> None:
    """/agents lists the running sub-agents with a Stop button each; Ann's press stops that one
    agent, whose partial report is delivered, while its sibling runs on and reports normally."""
    ollama, place = platform.bot.ollama, platform.place(ANN)
    stop_apples = await two_researchers_listed(platform)
    apples = platform.bot.subagents.find(place, "a1")
    assert apples is not None

    platform.press(ANN, stop_apples)
    await apples.finished.wait()
    await platform.wait_until(lambda: platform.told_privately(ANN), "the answer")
    stopped = f"{platform.name_of(ANN)} stopped find-apples (a1); its report follows."
    assert platform.told_privately(ANN) == [stopped]
    assert apples.status == "stopped"
    pears = platform.bot.subagents.find(place, "a2")
    assert pears is not None and pears.status == "running", "its sibling runs on"

    ollama.release("pears")
    await pears.finished.wait()
    await platform.bot.runner.wait_idle(place)
    assert pears.status == "done"
    carried = [str(r["messages"]) for r in ollama.requests if "[Sub-agent report]" in str(r)]
    assert any("was stopped; what it had:\\nApples so far: Gala" in c for c in carried)
    assert any("Pears: 2 kinds." in c for c in carried)


@SHARED_PLACES
@pytest.mark.bot(**WITH_HELPERS)
async def test_a_strangers_press_of_an_agents_stop_stops_nothing(platform: Platform) -> None:
    stop_apples = await two_researchers_listed(platform)

    platform.press(ANN, stop_apples, user=MALLORY)
    await platform.wait_until(lambda: platform.told_privately(ANN), "the refusal")
    (refusal,) = platform.told_privately(ANN)
    assert "not allowed" in refusal and str(MALLORY) in refusal
    assert refusal.startswith(f"Sorry, {platform.name_of(MALLORY)}, "), "named, not by id alone"
    apples = platform.bot.subagents.find(platform.place(ANN), "a1")
    assert apples is not None and apples.status == "running", "a stranger stops nothing"


def question_buttons(platform: Platform, chat: int) -> list[str]:
    """The buttons of the questions in `chat`, without the Stop of the reply that asked.

    Regression (of this suite): it read every button in the chat, and under load the reply's
    status message, Stop button and all, was posted before the question instead of after, so
    the buttons read [Stop, Approve, ...]. Both are right: while a turn waits for a person it
    keeps its Stop (it ends the turn as /stop does), and when its status shows depends on the
    machine's speed."""
    return [button for button in platform.buttons(chat) if button != payload(STOP)]


def task_for(platform: Platform, chat: int) -> ToolContext:
    """A person's turn in `chat`, as a task tool sees where it was called from."""
    return ToolContext(platform.name, platform.place(chat), str(chat), "person")


@pytest.mark.bot(schedule=ScheduleSettings())
async def test_a_scheduled_task_posts_a_new_message_in_its_own_place(platform: Platform) -> None:
    scheduler, ollama = platform.bot.scheduler, platform.bot.ollama
    assert scheduler is not None
    ollama.script(Text("Hello Bob."))
    platform.say(BOB, "hi")
    await platform.wait_until(lambda: platform.shown(BOB) == ["Hello Bob."], "Bob's reply")
    ollama.default = [Text("Your daily digest: all quiet.")]
    task = await scheduler.create(
        task_for(platform, ANN), "assistant", "the daily digest", When(every_minutes=60)
    )
    await scheduler.run_now(task)
    await scheduler.settled()

    assert platform.shown(ANN) == ["Your daily digest: all quiet."]
    assert platform.shown(BOB) == ["Hello Bob."], "nothing in another place"
    (run,) = await platform.bot.store.task_runs(task.id or 0)
    assert run.outcome == "done"


@NETWORKED
@pytest.mark.bot(schedule=ScheduleSettings())
async def test_a_scheduled_task_whose_place_is_gone_is_paused(platform: RemotePlatform) -> None:
    scheduler = platform.bot.scheduler
    assert scheduler is not None
    platform.bot.ollama.default = [Text("Anyone there?")]
    task = await scheduler.create(
        task_for(platform, ANN), "assistant", "the daily digest", When(every_minutes=60)
    )
    platform.refuse_posts(ANN)
    await scheduler.run_now(task)
    await scheduler.settled()

    (run,) = await platform.bot.store.task_runs(task.id or 0)
    assert run.outcome == "undeliverable"
    stored = await platform.bot.store.task(task.id or 0)
    assert stored is not None and not stored.enabled
    assert "nothing could be posted in its place" in (stored.paused_reason or "")


async def echo_asked(platform: Platform) -> str:
    """Ann's message whose `echo` asks first, until its question shows with its buttons (the
    model then says "Done."); returns the payload of its Allow once."""
    ollama = platform.bot.ollama
    ollama.script(ToolCall("echo", {"word": "hello"}))
    ollama.script(Text("Done."))
    allow = payload(Button("Allow once", "/approve 1"))

    platform.say(ANN, "say hello")
    await platform.wait_until(lambda: allow in platform.buttons(ANN), "the question")
    assert question_buttons(platform, ANN) == [allow, "kaiwa:approve 1 here", "kaiwa:deny 1"]
    return allow


@pytest.mark.bot(approvals=ApprovalSettings(ask=["echo"]))
async def test_an_approval_is_asked_with_buttons_and_decided_once(platform: Platform) -> None:
    """Ann's Allow once runs the tool; the question then says who decided, its buttons gone; a
    late answer is told it is settled."""
    allow = await echo_asked(platform)

    platform.press(ANN, allow)
    await platform.wait_until(lambda: "Done." in platform.shown(ANN), "the reply")
    question = platform.shown(ANN)[0]
    assert question.startswith("echo(hello): ")
    assert question.endswith(f": {platform.name_of(ANN)} allowed it once."), "named, not by id"
    assert platform.buttons(ANN) == []
    assert platform.told_privately(ANN) == ["You allowed it once: echo(hello)."]
    platform.say(ANN, "/deny 1")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 3, "the late answer")
    assert platform.shown(ANN)[2] == "Question 1 is already settled (allowed)."
    tool = [m for m in platform.bot.ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool] == ["echo hello"]


@SHARED_PLACES
@pytest.mark.bot(approvals=ApprovalSettings(ask=["echo"]))
async def test_only_the_asker_or_an_approver_answers_an_approval(platform: Platform) -> None:
    """Bob's press on Ann's question changes nothing."""
    allow = await echo_asked(platform)

    platform.press(ANN, allow, user=BOB)
    await platform.wait_until(lambda: platform.told_privately(ANN), "Bob's answer")
    only = f"Only the person who asked ({platform.name_of(ANN)}) or an approver can answer"
    assert platform.told_privately(ANN)[0].startswith(only)
    assert (await platform.bot.store.approval(1)).status == "pending"  # type: ignore[union-attr]


@pytest.mark.bot(approvals=ApprovalSettings(ask=["echo"]))
async def test_an_approval_can_be_typed(platform: Platform) -> None:
    ollama = platform.bot.ollama
    ollama.script(ToolCall("echo", {"word": "typed"}))
    ollama.script(Text("Done."))

    platform.say(ANN, "say typed")
    await platform.wait_until(lambda: platform.buttons(ANN), "the question")
    platform.say(ANN, "/approve 1")
    await platform.wait_until(lambda: "Done." in platform.shown(ANN), "the reply")

    assert platform.shown(ANN)[0].endswith(" allowed it once.")
    tool = [m for m in ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool] == ["echo typed"]


async def test_commands_work_while_a_reply_streams(platform: Platform) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("Thinking out loud"), Pause("busy"), Text(", done."))

    platform.say(ANN, "long question")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Thinking out loud"], "streaming")
    platform.say(ANN, "/help")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the /help answer")
    assert platform.shown(ANN)[1].startswith("Commands:")

    ollama.release("busy")
    await platform.wait_until(
        lambda: platform.shown(ANN)[0] == "Thinking out loud, done.", "the finished reply"
    )
    assert (await platform.bot.turns(platform.place(ANN)))[-1].status == Outcome.DONE.value


@NETWORKED
async def test_a_storm_of_rate_limits_on_the_final_edit_ends_with_the_full_text(
    platform: RemotePlatform,
) -> None:
    """Regression: finishing gave up after ten rate limits, and the platform kept an older text
    (on Discord, with its Stop button)."""
    ollama = platform.bot.ollama
    ollama.script(Text("Storm"), Pause("storm"), Text(" over, every word kept."))

    platform.say(ANN, "go")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Storm"], "the first part")
    platform.rate_limit_edits(retry_after=0.01, times=STORM)
    ollama.release("storm")

    await platform.wait_until(
        lambda: platform.shown(ANN) == ["Storm over, every word kept."], "the whole reply"
    )
    assert platform.edits_tried(ANN) > STORM // 5, "the platform did refuse the edits"


@NETWORKED
async def test_a_post_answered_without_its_id_ends_the_replys_calls(
    platform: RemotePlatform,
) -> None:
    """Regression: Slack's answer without `ts` became the message id "None", and the reply went
    on editing message "None". Then the regression: Slack's first frame stayed in the thread for
    ever, Stop button and all. Slack lets a bot read back its own messages, so there the post
    is found and the reply goes on with it; elsewhere it is not sent again, and the person is
    told part of the reply may be missing. And the bug of issue 33: on Telegram the first frame
    kept its Stop button for ever, since nothing could take away what was posted with it
    (on Discord, whose API always answers with the id, it still does)."""
    platform.answer_posts_without_ids()
    reply = platform.reply(ANN)
    await reply.update(Frame("First words"))
    await reply.update(Frame("First words and more"))
    await reply.finish("First words and more, all of them.", Outcome.DONE, None)

    if platform.name == "slack":
        assert platform.shown(ANN) == ["First words and more, all of them."]
        assert platform.buttons(ANN) == [], "the Stop button went with the final edit"
        assert reply.delivery is Delivery.SHOWN
        return
    assert platform.shown(ANN) == ["First words", LOST_NOTICE], "posted once, then told"
    if platform.name == "telegram":
        assert not platform.has_stop_button(ANN), "the lost post went out without one"
    assert platform.edits_tried(ANN) == 0
    assert reply.posted == () and reply.delivery is Delivery.NOTHING


@NETWORKED
async def test_a_post_whose_answer_never_came_is_never_sent_twice(platform: RemotePlatform) -> None:
    """The bug: slack_sdk's connection-error retry sent chat.postMessage again when the
    connection dropped unanswered, and the reply's next frame posted once more, though the
    first had landed. A post without an answer may be out: on Discord it is sent again with the
    same nonce (which Discord answers with the first message); on Slack the bot reads back its
    newest messages and finds it; on Telegram it is not sent again, and the person is told part
    of the reply may be missing."""
    platform.hang_up_on_the_next_post(ANN)
    reply = platform.reply(ANN)
    await reply.update(Frame("First words"))
    await reply.update(Frame("First words and more"))
    await reply.finish("First words and more, all of them.", Outcome.DONE, None)

    if platform.name in ("discord", "slack"):
        assert platform.shown(ANN) == ["First words and more, all of them."]
        assert reply.delivery is Delivery.SHOWN
    else:
        assert platform.shown(ANN) == ["First words", LOST_NOTICE], "posted once, then told"
        assert reply.posted == () and reply.delivery is Delivery.NOTHING
    assert not platform.has_stop_button(ANN)


@NETWORKED
async def test_a_lost_post_found_later_ends_with_the_final_text_and_no_stop_button(
    platform: RemotePlatform,
) -> None:
    """The bug of issue 33: a post whose answer never came, on a platform that could not be
    asked about it then (Slack refused the read-back), stayed with its first frame and its Stop
    button for ever, under a notice that part of the reply may be missing. Slack is asked
    again when the reply finishes: the post is found, never posted again, and shows the final
    text without the button. Telegram lets a bot learn nothing of it, so there the post went
    out without the button, and the person is told; Discord's nonce finds the post at once."""
    platform.hang_up_on_the_next_post(ANN)
    platform.fail_the_next_read_back(ANN)
    reply = platform.reply(ANN)
    await reply.update(Frame("First words"))
    await reply.update(Frame("First words and more"))
    await reply.finish("First words and more, all of them.", Outcome.DONE, None)

    assert not platform.has_stop_button(ANN)
    if platform.name == "telegram":
        assert platform.shown(ANN) == ["First words", LOST_NOTICE], "posted once, then told"
        assert reply.posted == () and reply.delivery is Delivery.NOTHING
        return
    assert platform.shown(ANN) == ["First words and more, all of them."], "posted once"
    assert len(reply.posted) == 1 and reply.delivery is Delivery.SHOWN


@NETWORKED
async def test_a_reply_the_platform_refuses_ends_with_nothing_delivered(
    platform: RemotePlatform,
) -> None:
    platform.refuse_posts(ANN)
    reply = platform.reply(ANN)
    await reply.update(Frame("Words nobody will see"))
    await reply.finish("Words nobody will see.", Outcome.DONE, None)

    assert platform.shown(ANN) == []
    assert reply.posted == () and reply.delivery is Delivery.NOTHING


@TYPING
@pytest.mark.channel(paced=False)  # every reply's "typing…" at once: more than the limits allow
async def test_a_thousand_replies_cut_no_request_off_and_leave_the_pool_free(
    platform: RemotePlatform,
) -> None:
    """Regression: each reply cancelled its "typing…" request when its text appeared; landing
    while the request was in flight, that cut it off, and httpx kept its pooled connection
    marked busy for good, until every Telegram call failed with "Pool timeout". Here each
    "typing…" request is still in flight when its reply's text goes out (the platform answers it
    only after), and no request may be cut off. Then as many "typing…" requests as Telegram's
    pool has connections must all be in flight at once: a connection still taken would leave
    one waiting for a slot (and failing after a second), so the count would never be reached.
    (Telegram's pool is small here, so a thousand replies would soon exhaust it if each leaked.)"""
    platform.typing_waits_for_text()
    for _ in range(ROUNDS):
        await _replies(platform, [platform.reply(chat) for chat in range(1, CHATS + 1)])
    assert sum(len(platform.shown(chat)) for chat in range(1, CHATS + 1)) == CHATS * ROUNDS
    assert platform.abandoned() == []

    platform.typing_waits_for_company(POOL_SIZE)
    replies = [platform.reply(chat) for chat in range(1, POOL_SIZE + 1)]
    await platform.wait_until(
        lambda: platform.most_typing_in_flight() == POOL_SIZE,
        "a whole pool's worth of requests in flight at once",
    )
    await asyncio.gather(*(_reply(reply, n) for n, reply in enumerate(replies)))
    assert platform.abandoned() == []


async def _replies(platform: RemotePlatform, replies: list[Reply]) -> None:
    """Each reply's "typing…" in flight, then each shows its text as it finishes."""
    await platform.wait_until(
        lambda: platform.typing_in_flight() == len(replies), "every reply typing"
    )
    await asyncio.gather(*(_reply(reply, n) for n, reply in enumerate(replies)))


async def _reply(reply: Reply, n: int) -> None:
    await reply.finish(f"Answer {n}.", Outcome.DONE, None)
    assert reply.delivery is Delivery.SHOWN


@pytest.mark.bot(plan=PlanSettings(ask_person=True, critic_tools=[]))
async def test_a_plan_asks_with_buttons_and_edits_one_progress_message(platform: Platform) -> None:
    """The plan's question has Approve / Edit / Reject; once approved, one progress message is
    edited in place as the steps move (▶ running, ✓ done), never posted again."""
    ollama = platform.bot.ollama
    ollama.script(ToolCall("submit_plan", {"steps": [{"what": "Look", "done_when": "seen"}]}))
    ollama.script(ToolCall("verdict", {"approved": True, "reasons": "Fine."}))
    ollama.script(Pause("looking"), Text("Looked."))
    ollama.script(Text("I looked."))
    approve = payload(Button("Approve", "/approve 1"))

    platform.say(ANN, "/plan look around")
    await platform.wait_until(lambda: approve in platform.buttons(ANN), "the question")
    assert question_buttons(platform, ANN) == [approve, "kaiwa:edit 1", "kaiwa:deny 1"]
    platform.press(ANN, approve)
    await ollama.reached("looking")

    def progress() -> list[str]:
        return [text for text in platform.shown(ANN) if text.startswith("Plan #1: look around")]

    running = "Plan #1: look around\n▶ 1. Look\nRunning: 0 of 1 step done."
    await platform.wait_until(lambda: progress() == [running], "the step running")
    ollama.release("looking")
    done = "Plan #1: look around\n✓ 1. Look\nDone. Reviewer: Fine."
    await platform.wait_until(lambda: progress() == [done], "the plan done, in the same message")
    await platform.wait_until(lambda: "Looked.\n\nI looked." in platform.shown(ANN), "the reply")
    (question,) = [text for text in platform.shown(ANN) if "approved it" in text]
    assert question.endswith(f"{platform.name_of(ANN)} approved it."), "named, not by id"
