"""Approvals through the whole turn path and the fake Ollama: a tool marked to ask runs only on
a yes from the person who asked (or an approver), once, whoever clicks twice; a timeout or `/stop`
ends the wait; a restart expires the question; unattended runs are refused at once.

`echo` is the tool that asks. Ordering is by handshakes: the question's notice appearing, the
fake's pauses.
"""

from core.agent.profile import AgentProfile
from core.agent.tools import ToolContext
from core.channel import Button
from core.dispatch.recovery import Leftovers, Recovery, leftovers
from core.features.approvals.questions import Approvals, ApprovalSettings
from core.features.schedule.timing import ScheduleSettings, When
from core.features.subagents.runs import SubagentSettings
from core.store import Store
from tests.fakes.ollama import Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory, echo

ASK_ECHO = ApprovalSettings(ask=["echo"], approvers=["carol"])
QUESTION = "May I run echo(hello)? (/approve 1, /approve 1 here for this conversation, or /deny 1)"


def asks(make_bot: BotFactory, **settings: object) -> Bot:
    bot = make_bot(approvals=ASK_ECHO, **settings)
    bot.ollama.script(ToolCall("echo", {"word": "hello"}))
    bot.ollama.script(Text("Done."))
    return bot


async def asked(bot: Bot) -> None:
    await bot.channel.wait_until(lambda: QUESTION in bot.channel.notices_in(PLACE), "question")


def results(bot: Bot, request: int = 1) -> list[str]:
    messages = bot.ollama.requests[request]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_allowed_once_by_the_person_who_asked_the_tool_runs(make_bot: BotFactory) -> None:
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)
    assert bot.channel.buttons[0] == (
        Button("Allow once", "/approve 1"),
        Button("Allow here", "/approve 1 here"),
        Button("Deny", "/deny 1"),
    )
    await bot.send("/approve 1", author="ann")
    (reply,) = await bot.channel.finished()

    assert reply.text == "Done." and results(bot) == ["echo hello"]
    question, told = bot.channel.notices_in(PLACE)
    assert question == "echo(hello): ann allowed it once." and bot.channel.buttons[0] == ()
    assert told == "You allowed it once: echo(hello)."
    stored = await bot.store.approval(1)
    assert stored is not None and (stored.status, stored.decided_by) == ("allowed", "ann")


async def test_denied_the_model_is_told_and_goes_on(make_bot: BotFactory) -> None:
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/deny 1", author="ann")
    await bot.channel.finished()

    assert results(bot) == [
        "'echo' failed: ApprovalDenied: echo(hello) was not allowed: the person denied it"
    ]
    assert bot.channel.notices_in(PLACE)[0] == "echo(hello): ann denied it."


async def test_a_strangers_answer_changes_nothing_and_a_second_answer_is_told_it_is_settled(
    make_bot: BotFactory,
) -> None:
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/approve 1", author="bob")
    assert (await bot.store.approval(1)).status == "pending"  # type: ignore[union-attr]
    await bot.send("/approve 1", author="carol")  # an approver
    await bot.channel.finished()
    await bot.send("/deny 1", author="ann")

    _, stranger, approver, late = bot.channel.notices_in(PLACE)
    assert stranger == "Only the person who asked (ann) or an approver can answer question 1."
    assert approver == "You allowed it once: echo(hello)."
    assert late == "Question 1 is already settled (allowed)."
    assert results(bot) == ["echo hello"]


async def test_allowed_here_asks_no_more_in_this_conversation(make_bot: BotFactory) -> None:
    bot = asks(make_bot)
    bot.ollama.script(ToolCall("echo", {"word": "again"}))
    bot.ollama.script(Text("Again."))
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/approve 1 here", author="ann")
    await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)
    await bot.send("say it again", author="ann")
    await bot.channel.finished(2)

    assert results(bot, 3)[-1] == "echo again"
    assert len([n for n in bot.channel.notices_in(PLACE) if n.startswith("May I")]) == 0
    assert bot.channel.notices_in(PLACE)[0] == "echo(hello): ann allowed it for this conversation."


async def test_allowed_here_survives_a_restart_until_it_is_revoked(
    make_bot: BotFactory, store: Store
) -> None:
    """The bug: "Allow here" lasted only until a restart. It is stored with the conversation;
    `/grants` lists it and `/grants revoke` makes the tool ask again."""
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/approve 1 here", author="ann")
    await bot.channel.finished()
    await bot.runner.shutdown()

    restarted = make_bot(bot_store=store, approvals=ASK_ECHO)
    restarted.ollama.script(ToolCall("echo", {"word": "again"}))
    restarted.ollama.script(Text("Again."))
    await restarted.send("say it again", author="ann")
    await restarted.channel.finished()
    await restarted.runner.wait_idle(PLACE)
    await restarted.send("/grants", author="bob")
    await restarted.send("/grants revoke echo", author="bob")
    restarted.ollama.script(ToolCall("echo", {"word": "once more"}))
    await restarted.send("and once more", author="ann")
    await restarted.channel.wait_until(
        lambda: any(
            n.startswith("May I run echo(once more)?") for n in restarted.channel.notices_in(PLACE)
        ),
        "asked again",
    )

    ran = [results(restarted, index) for index in range(len(restarted.ollama.requests))]
    assert ["echo hello", "echo again"] in ran, "ran without asking after the restart"
    assert not any("echo(again)" in notice for notice in restarted.channel.notices_in(PLACE))
    listed, revoked = restarted.channel.notices_in(PLACE)[:2]
    assert listed.startswith("These tools run here without asking:\n- echo: allowed by ann, ")
    assert revoked == "echo asks again here before it runs."
    await restarted.send("/stop", author="ann")


async def test_a_new_conversation_starts_without_the_old_ones_grants(
    make_bot: BotFactory,
) -> None:
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/approve 1 here", author="ann")
    await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)

    await bot.send("/new", author="ann")
    await bot.send("/grants", author="ann")

    assert bot.channel.notices_in(PLACE)[-1] == (
        "No tool runs here without asking (a question's Allow here adds one)."
    )


async def test_a_question_nobody_answers_is_a_denial(make_bot: BotFactory) -> None:
    bot = make_bot(approvals=ApprovalSettings(ask=["echo"], timeout_seconds=0.05))
    bot.ollama.script(ToolCall("echo", {"word": "hello"}))
    bot.ollama.script(Text("Nobody answered."))
    await bot.send("say hello", author="ann")
    await bot.channel.finished()

    assert results(bot) == [
        "'echo' failed: ApprovalDenied: echo(hello) was not allowed: nobody answered in time"
    ]
    assert bot.channel.notices_in(PLACE) == ["echo(hello): not run; nobody answered in time."]
    assert (await bot.store.approval(1)).status == "timed_out"  # type: ignore[union-attr]


async def test_stop_during_a_pending_question_ends_the_turn_and_the_next_message_is_answered(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(approvals=ASK_ECHO)
    bot.ollama.script(ToolCall("echo", {"word": "hello"}))
    bot.ollama.script(Text("Hi again."))
    await bot.send("say hello", author="ann")
    await asked(bot)
    await bot.send("/stop", author="ann")
    await bot.send("hi", author="ann")
    await bot.channel.finished(2)

    assert [t.status for t in await bot.turns()] == ["stopped", "done"]
    assert (await bot.store.approval(1)).status == "cancelled"  # type: ignore[union-attr]
    assert bot.channel.notices_in(PLACE)[0] == "echo(hello): not run; the reply was stopped."
    assert bot.channel.replies[-1].text == "Hi again."


async def test_a_restart_expires_the_question_left_pending(
    make_bot: BotFactory, store: Store
) -> None:
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)  # and then the process died
    restarted = make_bot(bot_store=store, channel=bot.channel, approvals=ASK_ECHO)
    left = await leftovers(store, restarted.runner.parts)
    await Recovery(store, restarted.runner, {"test": bot.channel}).resolve(left)

    (turn,) = await bot.turns()
    assert (turn.status, turn.error) == (
        "interrupted",
        "Kaiwa stopped while this turn waited for a person to approve echo(hello)",
    )
    assert [a.status for a in await store.pending_approvals()] == []
    assert (await store.approval(1)).status == "expired"  # type: ignore[union-attr]
    assert bot.channel.notices_in(PLACE)[0] == (
        "echo(hello): not run; Kaiwa stopped before anyone answered."
    )


async def test_a_shutdown_expires_a_waiting_question_and_the_turn_names_it(
    make_bot: BotFactory, store: Store
) -> None:
    """The bug: SIGTERM said "not run; the reply was stopped" and the turn's record did not name
    the question, where a kill expires it and names it. A stop and a kill now read the same."""
    bot = asks(make_bot)
    await bot.send("say hello", author="ann")
    await asked(bot)

    await bot.runner.shutdown()

    (turn,) = await bot.turns()
    assert (turn.status, turn.stop_reason, turn.error) == (
        "stopped",
        "shutdown",
        "Kaiwa stopped while this turn waited for a person to approve echo(hello)",
    )
    assert (await store.approval(1)).status == "expired"  # type: ignore[union-attr]
    assert bot.channel.notices_in(PLACE)[0] == (
        "echo(hello): not run; Kaiwa stopped before anyone answered."
    )
    restarted = make_bot(bot_store=store, channel=bot.channel, approvals=ASK_ECHO)
    assert await leftovers(store, restarted.runner.parts) == Leftovers(), "nothing left over"


async def test_an_unattended_run_is_refused_at_once(make_bot: BotFactory) -> None:
    bot = make_bot(approvals=ASK_ECHO, schedule=ScheduleSettings())
    assert bot.scheduler is not None
    bot.ollama.script(ToolCall("echo", {"word": "hello"}))
    bot.ollama.script(Text("I could not."))
    context = ToolContext("test", PLACE, "ann", "person")
    task = await bot.scheduler.create(context, "assistant", "say hello", When(every_minutes=60))
    await bot.scheduler.run_now(task)
    await bot.scheduler.settled()

    (refused,) = results(bot)
    assert "echo(hello) needs a person's approval, and nobody is here to give it" in refused
    assert bot.channel.notices_in(PLACE) == [], "nobody was asked"


RESEARCHER = AgentProfile(
    name="researcher",
    model="test-model",
    system_prompt="You research one thing.",
    tools={"echo": echo},
    description="Looks one thing up.",
)


def delegating(make_bot: BotFactory) -> Bot:
    bot = make_bot(
        approvals=ASK_ECHO,
        agents={"researcher": RESEARCHER},
        delegates_to=("researcher",),
        subagents=SubagentSettings(status_message=False),
    )
    task = {"profile": "researcher", "instruction": "find apples", "name": "apples"}
    bot.ollama.script(ToolCall("delegate", {"tasks": [task]}))
    bot.ollama.script(Text("A helper is on it."))
    return bot


async def test_a_delegation_is_approved_once_before_the_sub_agent_starts(
    make_bot: BotFactory,
) -> None:
    """The sub-agent then uses the tool without asking anyone mid-run."""
    bot = delegating(make_bot)
    bot.ollama.script_for("apples", ToolCall("echo", {"word": "gala"}))
    bot.ollama.script_for("apples", ToolCall("report", {"summary": "Gala."}))
    bot.ollama.default = [Text("Apples: Gala.")]
    await bot.send("what fruit is there?", author="ann")
    await bot.channel.wait_until(
        lambda: any(
            n.startswith("May I let apples (researcher) use echo?")
            for n in bot.channel.notices_in(PLACE)
        ),
        "the question",
    )
    await bot.send("/approve 1", author="ann")
    await bot.channel.finished()
    run = bot.subagents.find(PLACE, "a1")
    assert run is not None
    await run.finished.wait()

    assert run.status == "done" and run.report == "Gala."
    asked = [n for n in bot.channel.notices_in(PLACE) if "May I" in n]
    assert asked == [], "one question, for the delegation, then edited"
    transcript = await bot.store.transcript(run.row_id)
    assert next(m.text for m in transcript if m.role == "tool") == "echo gala"


async def test_a_denied_delegation_launches_nothing(make_bot: BotFactory) -> None:
    bot = delegating(make_bot)
    await bot.send("find apples", author="ann")
    await bot.channel.wait_until(lambda: bot.channel.notices_in(PLACE), "the question")
    await bot.send("/deny 1", author="ann")
    await bot.channel.finished()

    (refused,) = results(bot)
    assert refused == (
        "'delegate' failed: ApprovalDenied: apples (researcher) use echo was not allowed: the "
        "person denied it"
    )
    assert bot.subagents.live(PLACE) == []


def test_a_whole_mcp_server_can_be_asked_about(store: Store) -> None:
    approvals = Approvals(store, {}, ApprovalSettings(ask=["files", "fetch_url"]))
    assert approvals.asks("files.write_file") and approvals.asks("fetch_url")
    assert not approvals.asks("filesystem.read") and not approvals.asks("echo")


async def test_a_call_with_braces_in_its_arguments_is_asked_about(make_bot: BotFactory) -> None:
    """Regression: the question's number was filled in with str.format over the whole text, so
    an argument holding braces ("{x}") broke the question and the tool call with it."""
    bot = make_bot(approvals=ASK_ECHO)
    bot.ollama.script(ToolCall("echo", {"word": "{x}"}))
    bot.ollama.script(Text("Done."))
    await bot.send("say {x}", author="ann")
    question = (
        "May I run echo({x})? (/approve 1, /approve 1 here for this conversation, or /deny 1)"
    )
    await bot.channel.wait_until(lambda: question in bot.channel.notices_in(PLACE), "question")
    await bot.send("/approve 1", author="ann")
    await bot.channel.finished()
    assert results(bot) == ["echo {x}"]
