"""The `/plan` workflow through the whole turn path and the fake Ollama: draft, review, person,
steps, progress, stop, failure, schedule, restart.

Every request the fake answers comes in a fixed order (the drafter, the critic, each step, the
closing answer), so scripts are queued in that order. Ordering with the test is by handshakes:
the fake's pauses and the channel's changes; nothing sleeps.
"""

import asyncio
from datetime import UTC, datetime
from typing import Any

from core.agent.tools import ToolContext
from core.channel import Button, Outcome
from core.dispatch.recovery import Recovery, leftovers
from core.features.schedule.timing import ScheduleSettings, When
from core.store.tables import Plan
from core.turns.turn import Provenance, TurnRequest
from tests.core.agent.test_context import save_file
from tests.core.features.test_schedule import Clock
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import ErrorLine, HttpError, Pause, Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory
from workflows.plan.progress import progress_text
from workflows.plan.settings import PlanSettings
from workflows.plan.texts import CRITIC, RESULT_CRITIC

ANSWER_WITHOUT_ASKING = PlanSettings(critic_tools=[])
OTHER = "test:two"


def draft(*steps: str) -> ToolCall:
    return ToolCall(
        "submit_plan", {"steps": [{"what": what, "done_when": f"{what}: done"} for what in steps]}
    )


def verdict(approved: bool, reasons: str = "Sound.") -> ToolCall:
    return ToolCall("verdict", {"approved": approved, "reasons": reasons})


def planner(
    make_bot: BotFactory, settings: PlanSettings = ANSWER_WITHOUT_ASKING, **more: Any
) -> Bot:
    return make_bot(plan=settings, **more)


async def the_plan(bot: Bot, plan_id: int = 1) -> Plan:
    plan = await bot.store.plan(plan_id)
    assert plan is not None
    return plan


def progress(bot: Bot) -> str:
    """The progress message as it reads now (the first notice of a plan run)."""
    return bot.channel.notices_in(PLACE)[0]


def critic_requests(bot: Bot) -> list[dict[str, Any]]:
    return [r for r in bot.ollama.requests if r["messages"][0]["content"] == CRITIC]


async def test_a_plan_approved_the_first_time_is_carried_out_step_by_step(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot)
    bot.ollama.script(draft("Gather the numbers", "Write the summary"))
    bot.ollama.script(verdict(True, "Covers the task."))
    bot.ollama.script(Text("Numbers: 3 and 4."))
    bot.ollama.script(Text("Summary: 7 in all."))
    bot.ollama.script(Text("Done: the total is 7."))

    await bot.send("/plan sum up this week's numbers")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert reply.text == "Numbers: 3 and 4.\n\nSummary: 7 in all.\n\nDone: the total is 7."
    plan = await the_plan(bot)
    assert (plan.status, plan.rounds, plan.review) == ("done", 1, "Covers the task.")
    assert plan.task == "sum up this week's numbers"
    assert [(s["status"], s["result"]) for s in plan.steps] == [
        ("done", "Numbers: 3 and 4."),
        ("done", "Summary: 7 in all."),
    ]
    assert progress(bot) == progress_text(plan)
    assert progress(bot).splitlines() == [
        "Plan #1: sum up this week's numbers",
        "✓ 1. Gather the numbers",
        "✓ 2. Write the summary",
        "Done. Reviewer: Covers the task.",
    ]
    step_two = bot.ollama.requests[3]["messages"][-1]["content"]
    assert step_two.startswith("[Kaiwa /plan] Step 2 of 2: Write the summary")
    (turn,) = await bot.turns()
    assert (turn.status, turn.model_calls) == ("done", 5)


async def test_the_conversation_reads_the_same_after_a_plan(make_bot: BotFactory) -> None:
    """Kaiwa's instructions are stored with the turn, so the next request carries the plan's
    turn as its requests did (no two assistant messages run together)."""
    bot = planner(make_bot, PlanSettings(review=False))
    bot.ollama.script(draft("Say hi"))
    bot.ollama.script(Text("Hi."))
    bot.ollama.script(Text("Said hi."))
    bot.ollama.script(Text("Next answer."))

    await bot.send("/plan greet")
    await bot.channel.finished()
    await bot.send("and now?")
    await bot.channel.finished(2)

    roles = [m["role"] for m in bot.ollama.requests[-1]["messages"]]
    assert roles == [
        "system",
        "user",  # /plan greet
        "user",  # the drafting instruction
        "assistant",  # submit_plan
        "tool",
        "user",  # step 1
        "assistant",
        "user",  # the closing instruction
        "assistant",
        "user",  # and now?
    ]
    kaiwa = [row.text for row in await bot.history() if row.author == "kaiwa"]
    assert len(kaiwa) == 3 and all(text.startswith("[Kaiwa /plan]") for text in kaiwa)


async def test_the_critic_never_sees_the_conversation(make_bot: BotFactory) -> None:
    bot = planner(make_bot, PlanSettings())
    bot.ollama.script(Text("Noted: the door code is 4711."))
    bot.ollama.script(draft("Check the door"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Checked."))
    bot.ollama.script(Text("All checked."))

    await bot.send("remember the door code 4711")
    await bot.channel.finished()
    await bot.send("/plan check the door")
    await bot.channel.finished(2)

    (critic,) = critic_requests(bot)
    assert [m["role"] for m in critic["messages"]] == ["system", "user"]
    assert "4711" not in str(critic["messages"])
    assert critic["messages"][1]["content"] == (
        "Task:\ncheck the door\n\nPlan:\n1. Check the door (tools: unspecified; done when: "
        "Check the door: done)"
    )
    offered = {tool["function"]["name"] for tool in critic["tools"]}
    assert offered == {"current_time", "verdict"}, "critic_tools only: echo is the agent's"


async def test_a_rejected_plan_is_revised_and_then_carried_out(make_bot: BotFactory) -> None:
    bot = planner(make_bot)
    bot.ollama.script(draft("Do it all"))
    bot.ollama.script(verdict(False, "One step is too coarse; split it."))
    bot.ollama.script(draft("Do the first half", "Do the second half"))
    bot.ollama.script(verdict(True, "Better."))
    bot.ollama.script(Text("First half done."))
    bot.ollama.script(Text("Second half done."))
    bot.ollama.script(Text("All done."))

    await bot.send("/plan do the thing")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    revision = bot.ollama.requests[2]["messages"][-1]["content"]
    assert "The reviewer did not approve the plan" in revision
    assert "One step is too coarse; split it." in revision
    plan = await the_plan(bot)
    assert (plan.status, plan.rounds, len(plan.steps)) == ("done", 2, 2)
    assert len(critic_requests(bot)) == 2
    assert "Do it all" not in str(critic_requests(bot)[1]["messages"])


async def test_a_plan_rejected_past_the_round_limit_is_given_up_and_nothing_runs(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, PlanSettings(review_rounds=2, critic_tools=[]))
    bot.ollama.script(draft("Guess"))
    bot.ollama.script(verdict(False, "Guessing is not a plan."))
    bot.ollama.script(draft("Guess harder"))
    bot.ollama.script(verdict(False, "Still guessing."))

    await bot.send("/plan find the answer")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert reply.note == (
        "plan #1 not approved: the reviewer rejected it 2 times (last: Still guessing.); "
        "nothing was run"
    )
    assert len(bot.ollama.requests) == 4, "no step ran"
    plan = await the_plan(bot)
    assert (plan.status, plan.rounds, plan.review) == ("rejected", 2, "Still guessing.")
    assert progress(bot).endswith("Reviewer: Still guessing.")


async def test_a_plan_written_as_a_numbered_list_is_read_as_steps(make_bot: BotFactory) -> None:
    bot = planner(make_bot, PlanSettings(review=False))
    bot.ollama.script(Text("Here is my plan:\n1. Look\n2) Leap"))
    bot.ollama.script(Text("Looked."))
    bot.ollama.script(Text("Leapt."))
    bot.ollama.script(Text("Looked, then leapt."))

    await bot.send("/plan look before you leap")
    await bot.channel.finished()

    plan = await the_plan(bot)
    assert [step["what"] for step in plan.steps] == ["Look", "Leap"]
    assert plan.status == "done"


async def test_a_model_that_writes_no_plan_is_reminded_once_then_the_plan_fails(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, PlanSettings(review=False))
    bot.ollama.script(Text("I would rather just do it."))
    bot.ollama.script(Text("Really, no plan."))

    await bot.send("/plan something")
    (reply,) = await bot.channel.finished()

    assert bot.ollama.requests[1]["messages"][-1]["content"].startswith(
        "[Kaiwa /plan] You did not call submit_plan"
    )
    assert reply.outcome is Outcome.FAILED
    assert "wrote no plan" in (reply.note or "")
    assert (await the_plan(bot)).status == "failed"


async def test_the_critic_can_review_the_result_too_and_its_doubts_end_the_reply(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, PlanSettings(review_result=True, critic_tools=[]))
    bot.ollama.script(draft("Count the chairs"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("There are 12 chairs."))
    bot.ollama.script(verdict(False, "The tables were asked for too."))
    bot.ollama.script(Text("12 chairs."))

    await bot.send("/plan count the chairs and tables")
    (reply,) = await bot.channel.finished()

    assert reply.note == "the reviewer doubts the result: The tables were asked for too."
    (checked,) = [r for r in bot.ollama.requests if r["messages"][0]["content"] == RESULT_CRITIC]
    assert checked["messages"][1]["content"] == (
        "Task:\ncount the chairs and tables\n\nSteps and results:\n1. Count the chairs\n"
        "Result: There are 12 chairs."
    )
    assert (await the_plan(bot)).status == "done"


async def test_a_critic_that_cannot_be_reached_fails_the_plan_saying_so(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, PlanSettings(critic_model="missing-model", critic_tools=[]))
    bot.ollama.script(draft("Anything"))

    await bot.send("/plan anything")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert (reply.note or "").startswith("the review failed: model missing-model not found")
    assert (await the_plan(bot)).status == "failed"


# -- the person's review --------------------------------------------------------------------


ASK_ANN = PlanSettings(ask_person=True, critic_tools=[])
QUESTION = (
    "Plan #1 (1 step) is ready. Approve it? (/approve 1, /edit 1 followed by what to change, "
    "or /deny 1)"
)


async def asked(bot: Bot) -> None:
    await bot.channel.wait_until(lambda: QUESTION in bot.channel.notices_in(PLACE), "question")


async def test_the_person_approves_by_button_and_the_plan_runs(make_bot: BotFactory) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Tidy up"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Tidied."))
    bot.ollama.script(Text("All tidy."))

    await bot.send("/plan tidy up", author="ann")
    await asked(bot)
    await bot.channel.wait_until(
        lambda: bot.channel.replies[0].frames[-1].activity == "waiting for your answer to plan #1",
        "the reply saying it waits for Ann, not 'reviewing the plan'",
    )
    assert progress(bot).splitlines() == [
        "Plan #1: tidy up",
        "· 1. Tidy up",
        "   tools: any; done when: Tidy up: done",  # what Ann approves, in full
        "Waiting for the approval of the person who asked. Reviewer: Sound.",
    ]
    buttons = bot.channel.buttons[bot.channel.notices_in(PLACE).index(QUESTION)]
    assert buttons == (
        Button("Approve", "/approve 1"),
        Button("Edit", "/edit 1"),
        Button("Reject", "/deny 1"),
    )
    await bot.send("/approve 1", author="carol")  # an approver of tools: not of Ann's plan
    assert (await the_plan(bot)).status == "awaiting_person"
    await bot.send(buttons[0].command, author="ann")  # what a press delivers
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert (await the_plan(bot)).status == "done"
    notices = bot.channel.notices_in(PLACE)
    assert "plan #1: ann approved it." in notices
    assert "Only the person who asked (ann) can answer question 1." in notices


async def test_the_person_rejects_by_text_and_nothing_runs(make_bot: BotFactory) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Delete everything"))
    bot.ollama.script(verdict(True))

    await bot.send("/plan clean the disk", author="ann")
    await asked(bot)
    await bot.send("/deny 1", author="ann")
    (reply,) = await bot.channel.finished()

    assert reply.note == "plan #1 not approved: ann rejected it; nothing was run"
    assert len(bot.ollama.requests) == 2
    assert (await the_plan(bot)).status == "rejected"


async def test_the_person_rejects_by_button(make_bot: BotFactory) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Delete everything"))
    bot.ollama.script(verdict(True))

    await bot.send("/plan clean the disk", author="ann")
    await asked(bot)
    reject = bot.channel.buttons[bot.channel.notices_in(PLACE).index(QUESTION)][2]
    await bot.send(reject.command, author="ann")
    await bot.channel.finished()

    assert (await the_plan(bot)).status == "rejected"
    assert "plan #1: ann rejected it." in bot.channel.notices_in(PLACE)


async def test_the_person_approves_by_text(make_bot: BotFactory) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Water the plants"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Watered."))
    bot.ollama.script(Text("The plants are watered."))

    await bot.send("/plan water the plants", author="ann")
    await asked(bot)
    await bot.send("!approve 1", author="ann")
    await bot.channel.finished()

    assert (await the_plan(bot)).status == "done"


async def test_an_edit_goes_back_to_the_drafter_and_the_critic(make_bot: BotFactory) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Email everyone"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(draft("Email the team only"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Emailed the team."))
    bot.ollama.script(Text("The team knows."))

    await bot.send("/plan tell people", author="ann")
    await asked(bot)
    await bot.send("/edit 1", author="ann")  # the Edit button: it asks for the change
    assert "Say what to change: /edit 1 followed by the change." in bot.channel.notices_in(PLACE)
    await bot.send("/edit 1 only the team, not everyone", author="ann")
    await bot.channel.wait_until(lambda: len(bot.ollama.requests) == 4, "the second review")
    second = "Plan #1 (1 step) is ready. Approve it? (/approve 2, /edit 2 followed by what"
    await bot.channel.wait_until(
        lambda: any(n.startswith(second) for n in bot.channel.notices_in(PLACE)), "asked again"
    )
    await bot.send("/approve 2", author="ann")
    await bot.channel.finished()

    revision = bot.ollama.requests[2]["messages"][-1]["content"]
    assert "ann did not approve the plan" in revision
    assert "only the team, not everyone" in revision
    plan = await the_plan(bot)
    assert plan.status == "done" and plan.steps[0]["what"] == "Email the team only"
    assert "plan #1: ann asked for changes (only the team, not everyone)." in (
        bot.channel.notices_in(PLACE)
    )


async def test_stop_while_the_person_decides_ends_the_question_and_the_plan(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, ASK_ANN)
    bot.ollama.script(draft("Wait"))
    bot.ollama.script(verdict(True))

    await bot.send("/plan wait for me", author="ann")
    await asked(bot)
    await bot.send("/stop", author="ann")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.STOPPED
    assert (await the_plan(bot)).status == "stopped"
    assert (await bot.store.approval(1)).status == "cancelled"  # type: ignore[union-attr]
    assert "plan #1: not run; the reply was stopped." in bot.channel.notices_in(PLACE)


async def test_a_plan_nobody_approves_in_time_is_not_run(make_bot: BotFactory) -> None:
    bot = planner(make_bot, PlanSettings(ask_person=True, person_wait_seconds=0.01))
    bot.ollama.script(draft("Wait"))
    bot.ollama.script(verdict(True))

    await bot.send("/plan wait for me", author="ann")
    (reply,) = await bot.channel.finished()

    assert reply.note == "plan #1 not approved: nobody approved it in time; nothing was run"
    assert (await the_plan(bot)).status == "rejected"
    assert len(bot.ollama.requests) == 2


# -- stop and failure -----------------------------------------------------------------------


async def test_stop_during_the_review_ends_the_plan_before_anything_runs(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot)
    bot.ollama.script(draft("One", "Two"))
    bot.ollama.script(Pause("reviewing"), verdict(True))

    await bot.send("/plan count")
    await bot.ollama.reached("reviewing")
    await bot.send("/stop")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.STOPPED
    plan = await the_plan(bot)
    assert plan.status == "stopped"
    assert [s["status"] for s in plan.steps] == ["not_run", "not_run"]
    assert len(bot.ollama.requests) == 2
    assert progress(bot).splitlines()[-1] == (
        "Stopped; what was done is kept, the rest was not run."
    )


async def test_invariant_4_stop_during_a_step_keeps_its_partial_and_marks_the_rest_not_run(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot)
    bot.ollama.script(draft("Read", "Write", "Send"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Read it all."))
    bot.ollama.script(Text("Writing the first para"), Pause("writing"), Text("graph."))

    await bot.send("/plan report")
    await bot.ollama.reached("writing")
    await bot.channel.wait_until(
        lambda: bot.channel.replies[0].shown.endswith("Writing the first para"), "the partial"
    )
    await bot.send("/stop")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.STOPPED
    assert reply.text == "Read it all.\n\nWriting the first para"
    plan = await the_plan(bot)
    assert plan.status == "stopped"
    assert [(s["status"], s["result"]) for s in plan.steps] == [
        ("done", "Read it all."),
        ("stopped", "Writing the first para"),
        ("not_run", ""),
    ]
    assert progress(bot).splitlines()[1:4] == ["✓ 1. Read", "■ 2. Write", "– 3. Send"]
    last = (await bot.history())[-1]
    assert (last.text, last.stopped) == ("Writing the first para", True)


async def test_a_step_that_fails_stops_the_plan_with_what_was_done(make_bot: BotFactory) -> None:
    bot = planner(make_bot)
    bot.ollama.script(draft("Open the file", "Parse it", "Report"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Opened."))
    bot.ollama.script(ToolCall("step_failed", {"reason": "the file is not CSV"}))

    await bot.send("/plan parse the file")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note == "step 2 failed: the file is not CSV; done before it: step 1"
    plan = await the_plan(bot)
    assert plan.status == "failed"
    assert [(s["status"], s["result"]) for s in plan.steps] == [
        ("done", "Opened."),
        ("failed", "the file is not CSV"),
        ("not_run", ""),
    ]
    assert progress(bot).splitlines()[1:4] == ["✓ 1. Open the file", "✗ 2. Parse it", "– 3. Report"]


async def test_a_model_error_in_a_step_says_which_step_failed_and_what_was_done(
    make_bot: BotFactory,
) -> None:
    """The bug: the reply said only "[failed] Ollama answered …", not which step failed nor
    which were done, as it does for a step the model itself declares failed."""
    bot = planner(make_bot)
    bot.ollama.script(draft("Think", "Answer"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Thought."))
    bot.ollama.script(Text("Half an answer"), ErrorLine("model runner crashed"))

    await bot.send("/plan deep question")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note == (
        "step 2 failed: Ollama reported an error mid-reply: model runner crashed; "
        "done before it: step 1"
    )
    plan = await the_plan(bot)
    assert plan.status == "failed" and plan.error == reply.note
    assert [(s["status"], s["result"]) for s in plan.steps] == [
        ("done", "Thought."),
        ("failed", "Half an answer"),
    ]


# -- commands ---------------------------------------------------------------------------------


async def test_plan_without_a_task_shows_the_usage_and_plans_lists_them(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, PlanSettings(review=False))
    bot.ollama.script(draft("Only step"))
    bot.ollama.script(Text("Did it."))
    bot.ollama.script(Text("Done."))

    await bot.send("/plans")
    await bot.send("/plan")
    await bot.send("/plan   ")
    await bot.send("/plan the task")
    await bot.channel.finished()
    await bot.send("/plans")

    empty, usage, again, *_, listing = bot.channel.notices_in(PLACE)
    assert empty == "No plans in this conversation. /plan TASK makes one."
    assert usage == again and usage.startswith("Usage: /plan TASK.")
    assert bot.ollama.requests[0]["messages"][1]["content"] == "/plan the task"
    head, line = listing.splitlines()
    assert head == "Plans here, newest first:"
    assert line.startswith("#1 · done · 1/1 steps · ") and line.endswith(" · the task")


async def test_plan_is_a_plain_command_when_the_workflow_is_off(make_bot: BotFactory) -> None:
    bot = make_bot()
    await bot.send("/plan the task")
    await bot.send("/plans")
    assert (
        bot.channel.notices_in(PLACE)
        == [
            "The /plan workflow is off ([workflows.plan].enabled = false in config.toml).",
        ]
        * 2
    )
    assert bot.ollama.requests == []


# -- unattended and restarts ---------------------------------------------------------------


async def test_a_scheduled_plan_runs_unattended_with_its_critic_and_no_person(
    make_bot: BotFactory,
) -> None:
    clock = Clock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    bot = planner(make_bot, ASK_ANN, schedule=ScheduleSettings(), clock=clock)
    assert bot.scheduler is not None
    ann = ToolContext("test", PLACE, "ann", "person")
    await bot.scheduler.create(ann, "assistant", "/plan the weekly report", When(every_minutes=60))
    bot.ollama.script(draft("Collect", "Write"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Collected."))
    bot.ollama.script(Text("Written."))
    bot.ollama.script(Text("The weekly report is ready."))

    clock.now = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    await asyncio.gather(*bot.scheduler.fire_due())

    (reply,) = bot.channel.replies
    assert (reply.outcome, reply.reply_to) == (Outcome.DONE, None)
    plan = await the_plan(bot)
    assert (plan.status, plan.provenance, plan.task) == ("done", "schedule", "the weekly report")
    assert len(critic_requests(bot)) == 1, "the critic still reviews an unattended plan"
    assert not any("Approve it?" in notice for notice in bot.channel.notices_in(PLACE))
    assert bot.ollama.requests[0]["messages"][-2]["content"] == "/plan the weekly report"


async def test_a_plan_a_restart_cut_short_is_marked_interrupted_and_shown_so(
    make_bot: BotFactory,
) -> None:
    """The running step keeps what it had said (the bug: its result was left empty, though the
    person saw its text and the turn had stored it)."""
    bot = planner(make_bot)
    bot.ollama.script(draft("Start", "Finish"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(Text("Started half"), Pause("working"), Text(" and done."))

    await bot.send("/plan a long job")
    await bot.ollama.reached("working")
    await bot.channel.wait_until(
        lambda: bot.channel.replies[0].shown.endswith("Started half"), "the step's text shown"
    )
    left = await leftovers(bot.store, bot.runner.parts)  # what the next process reads first
    places = Recovery(bot.store, bot.runner, {"test": bot.channel})
    for part in left.parts:  # the plan's part alone: this process's turn is still running
        await part.resume(places)

    plan = await the_plan(bot)
    assert plan.status == "interrupted"
    assert [(s["status"], s.get("result")) for s in plan.steps] == [
        ("stopped", "Started half"),
        ("not_run", ""),
    ]
    assert progress(bot).splitlines()[-1] == (
        "Interrupted: Kaiwa restarted; the rest was not run. /plan again to go on."
    )
    bot.ollama.release("working")


# -- the turn path's invariants (core/turns/runner.py), with the plan body
# ------------------------------


def one_step_plan(bot: Bot, step: list[Any], closing: str = "Closed.") -> None:
    bot.ollama.script(draft("The step"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(*step)
    bot.ollama.script(Text(closing))


async def test_invariant_1_a_plan_holds_its_conversations_gate_for_its_whole_run(
    make_bot: BotFactory,
) -> None:
    """A message after `/plan` waits until the plan's turn ends, however many model calls it
    makes; another conversation goes on meanwhile."""
    bot = planner(make_bot)
    one_step_plan(bot, [Pause("step"), Text("Stepped.")])

    await bot.send("/plan one thing")
    await bot.ollama.reached("step")
    await bot.send("after the plan")
    bot.ollama.script_for("elsewhere", Text("Other conversation."))
    await bot.send("elsewhere", place=OTHER)
    await bot.channel.wait_until(
        lambda: any(r.place == OTHER and r.outcome for r in bot.channel.replies)
    )
    assert not any("after the plan" in str(r["messages"]) for r in bot.ollama.requests)
    bot.ollama.script(Text("After."))
    bot.ollama.release("step")
    await bot.channel.finished(3)

    last = bot.ollama.requests[-1]["messages"]
    assert last[-1]["content"] == "after the plan" and last[-2]["content"] == "Closed."


async def test_invariant_2_a_plans_conversation_is_pinned_while_it_runs(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, max_cached_conversations=1)
    one_step_plan(bot, [Pause("step"), Text("Stepped.")])

    await bot.send("/plan one thing")
    await bot.ollama.reached("step")
    bot.ollama.script_for("elsewhere", Text("Other conversation."))
    await bot.send("elsewhere", place=OTHER)
    await bot.channel.wait_until(
        lambda: any(r.place == OTHER and r.outcome for r in bot.channel.replies)
    )
    await bot.send("after the plan")
    bot.ollama.script(Text("After."))
    bot.ollama.release("step")
    await bot.channel.finished(3)

    assert bot.ollama.requests[-1]["messages"][-1]["content"] == "after the plan"
    assert (await the_plan(bot)).status == "done"


async def test_invariant_3_stop_ends_the_plan_and_drops_what_waits_behind_it(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot)
    one_step_plan(bot, [Text("Going"), Pause("step"), Text(" on.")])

    await bot.send("/plan one thing")
    await bot.ollama.reached("step")
    await bot.send("queued behind", message_id="queued")
    await bot.send("/stop")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.STOPPED
    assert "Stopped. Dropped 1 queued message." in bot.channel.notices_in(PLACE)
    assert await bot.store.inbound_status("test", "queued") == "dropped"
    assert (await the_plan(bot)).status == "stopped"


async def test_invariant_5_a_plans_records_survive_a_cancelled_notice(
    make_bot: BotFactory,
) -> None:
    bot = planner(make_bot, channel=RecordingChannel(hold_finish=True))
    one_step_plan(bot, [Text("Stepped.")])

    task = bot.runner.submit(TurnRequest("test", PLACE, "/plan one thing"))
    await bot.channel.finishing.wait()
    task.cancel()
    result = await task

    assert result.status == "done"
    (turn,) = await bot.turns()
    assert turn.status == "done"
    assert (await the_plan(bot)).status == "done"


async def test_invariant_6_an_unattended_plan_that_fails_is_contained(make_bot: BotFactory) -> None:
    bot = planner(make_bot)
    bot.ollama.script(HttpError(500, "model runner crashed"))
    request = TurnRequest("test", PLACE, "/plan nightly", provenance=Provenance.SCHEDULE)

    result = await bot.runner.run_unattended(request)

    assert result.status == "failed" and "model runner crashed" in (result.error or "")
    plan = await the_plan(bot)
    assert plan.status == "failed" and "model runner crashed" in (plan.error or "")


async def test_invariant_7_shutdown_stores_a_running_plan_as_stopped(make_bot: BotFactory) -> None:
    bot = planner(make_bot)
    one_step_plan(bot, [Text("Half"), Pause("step"), Text(" done.")])

    await bot.send("/plan one thing")
    await bot.ollama.reached("step")
    await bot.channel.wait_until(lambda: bot.channel.replies[0].shown == "Half", "the partial")
    await bot.runner.shutdown()

    plan = await the_plan(bot)
    assert plan.status == "stopped"
    assert (plan.steps[0]["status"], plan.steps[0]["result"]) == ("stopped", "Half")
    assert (await bot.turns())[-1].stop_reason == "shutdown"


async def test_a_steps_compaction_never_summarizes_the_steps_own_instruction(
    make_bot: BotFactory,
) -> None:
    """Regression (issue 33): a step's large tool call in a small window had the compaction
    before the step's next call fold the step's instruction into the summary, so the model
    went on from a request that no longer said which step it was on."""
    notes = "".join(f"note {n}: the hotel, the train and the museum tickets;\n" for n in range(36))
    filler = "Here is some more about the trip, with its dates, names and numbers. " * 4
    bot = planner(make_bot, tools=[save_file], context_window=2048)
    bot.ollama.count_prompts = True
    for number in range(3):
        bot.ollama.script(Text(f"Noted, part {number}. " + filler))
        await bot.send(f"Part {number} of my notes. {filler}")
        await bot.channel.finished(number + 1)
    bot.ollama.script(draft("Save the notes to notes.txt"))
    bot.ollama.script(verdict(True))
    bot.ollama.script(ToolCall("save_file", {"path": "notes.txt", "content": notes}))
    bot.ollama.script(Text("Saved the notes."))
    bot.ollama.script(Text("Done: the notes are saved."))
    bot.ollama.without_tools = [Text("The person shared travel notes in three parts.")]

    await bot.send("/plan save my travel notes")
    reply = (await bot.channel.finished(4))[-1]

    assert reply.outcome is Outcome.DONE
    after_the_call = [
        request["messages"]
        for request in bot.ollama.requests
        if request.get("tools") and request["messages"][-1]["role"] == "tool"
    ]
    assert after_the_call, "the step's second call came"
    step = after_the_call[-1]
    assert step[-3]["role"] == "user" and "Step 1 of 1: Save the notes" in step[-3]["content"]
    assert "Step 1 of 1" not in step[0]["content"]
    assert all(not prompt.overflows for prompt in bot.ollama.prompts)
