"""Sub-agent model routing: one pure test per eligibility rule, then the rules through the real
loop and the fake Ollama, whose requests show the model and the tools each run was given.

The fake answers each sub-agent by a word of its task (`script_for`), and 404s a model it does
not have, so each test appends its tiers' models to `bot.ollama.models`.
"""

from dataclasses import replace
from typing import Any

from core.agent.tools import tool
from core.dispatch.commands import describe_usage
from core.dispatch.recovery import Recovery, leftovers
from core.features.subagents.board import card_of
from core.features.subagents.routing import Route, RoutingSettings
from core.features.subagents.runs import SubagentSettings
from core.store import RunStart, Store, TurnStart, TurnState
from core.store.tables import SubagentRun, Turn, utc_now
from tests.core.features.test_subagents import (
    PLANNER,
    RESEARCHER,
    finished,
    reports,
    task,
)
from tests.fakes.ollama import Done, Pause, Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory, echo

ROUTING = RoutingSettings(enabled=True, small="small-m", medium="medium-m", large="large-m")
CRITERIA = "every date, as YYYY-MM-DD"
SMALL_REASON = (
    "an extract task with read-only tools, success criteria and an instruction of at most "
    "2,000 characters"
)
MEDIUM_REASON = (
    "an analyze task with read-only tools, success criteria and an instruction of at most "
    "4,000 characters"
)


@tool()
def shell(command: str) -> str:
    """Run a command (changes things)."""
    return command


def of_length(length: int) -> str:
    start = "extract the dates from the notes "
    return start + "x" * (length - len(start))


def test_an_extract_task_with_read_only_tools_and_criteria_is_small() -> None:
    at_the_limits = ROUTING.route("extract", of_length(2000), "y" * 1000, [echo])
    assert at_the_limits == Route("small", "small-m", SMALL_REASON)
    assert ROUTING.route("extract", "extract the dates", CRITERIA, []) == at_the_limits


def test_a_format_task_is_small() -> None:
    assert ROUTING.route("format", "format the list", "one line each", [echo]) == Route(
        "small", "small-m", SMALL_REASON.replace("an extract", "a format")
    )


def test_a_tool_that_changes_things_sends_it_large() -> None:
    assert ROUTING.route("extract", "extract the dates", CRITERIA, [echo, shell]) == Route(
        "large", "large-m", "an extract task with a tool that changes things (shell)"
    )


def test_an_extract_over_2000_characters_is_large_not_medium() -> None:
    why = "an extract task whose instruction is over 2,000 characters"
    assert ROUTING.route("extract", of_length(2001), CRITERIA, []) == Route("large", "large-m", why)
    assert ROUTING.route("extract", of_length(3000), CRITERIA, []) == Route("large", "large-m", why)


def test_an_extract_without_criteria_is_large() -> None:
    why = Route("large", "large-m", "an extract task without success criteria")
    assert ROUTING.route("extract", "extract the dates", "", [echo]) == why
    assert ROUTING.route("extract", "extract the dates", "  \n", [echo]) == why


def test_criteria_over_1000_characters_are_large() -> None:
    assert ROUTING.route("format", "format the list", "y" * 1001, []) == Route(
        "large", "large-m", "a format task with criteria over 1,000 characters"
    )


def test_an_analyze_task_is_medium() -> None:
    assert ROUTING.route("analyze", of_length(4000), "y" * 1000, [echo]) == Route(
        "medium", "medium-m", MEDIUM_REASON
    )


def test_an_analyze_over_4000_characters_is_large() -> None:
    assert ROUTING.route("analyze", of_length(4001), CRITERIA, [echo]) == Route(
        "large", "large-m", "an analyze task whose instruction is over 4,000 characters"
    )


def test_a_security_word_sends_any_kind_large() -> None:
    why = Route("large", "large-m", "'password' signals a security decision")
    assert ROUTING.route("extract", "list the Password rules", CRITERIA, []) == why
    assert ROUTING.route("format", "format the rules", "mention each password", []) == why


def test_an_action_on_the_world_sends_any_kind_large() -> None:
    assert ROUTING.route("analyze", "then deploy it", CRITERIA, []) == Route(
        "large", "large-m", "'deploy' is an action on the world"
    )
    for word in ("sender", "deleted", "postgres"):
        routed = ROUTING.route("extract", f"extract the {word} names", CRITERIA, [])
        assert routed is not None and routed.tier == "small", word


def test_complex_work_sends_any_kind_large() -> None:
    assert ROUTING.route("format", "find the Root Cause", CRITERIA, []) == Route(
        "large", "large-m", "'root cause' signals complex work"
    )


def test_an_other_task_or_no_kind_is_large() -> None:
    assert ROUTING.route("other", "look around", CRITERIA, []) == Route(
        "large", "large-m", "a task of kind 'other'"
    )
    assert ROUTING.route("", "look around", CRITERIA, []) == Route(
        "large", "large-m", "no kind given"
    )


def test_routing_is_off_by_default() -> None:
    assert RoutingSettings().route("extract", "extract the dates", CRITERIA, []) is None


def routed(
    make_bot: BotFactory, delegates_to: str = "researcher", status_message: bool = False
) -> Bot:
    """A bot whose agent delegates to `delegates_to` (`planner` delegates to `researcher`),
    with routing on and the tiers' models on the fake."""
    agents = {"researcher": RESEARCHER, "planner": PLANNER}
    settings = SubagentSettings(status_message=status_message, routing=ROUTING)
    bot = make_bot(agents=agents, delegates_to=(delegates_to,), subagents=settings)
    bot.ollama.models += ["small-m", "medium-m", "large-m"]
    return bot


def planner_task(instruction: str, **more: Any) -> dict[str, Any]:
    return {"profile": "planner", "instruction": instruction, **more}


def run_request(bot: Bot, marker: str) -> dict[str, Any]:
    """The first request of the sub-agent whose task has `marker`."""
    return next(r for r in bot.ollama.requests if marker in str(r["messages"][1]["content"]))


def tool_names(request: dict[str, Any]) -> list[str]:
    return [each["function"]["name"] for each in request.get("tools") or ()]


async def test_three_tasks_run_on_their_tiers_models(make_bot: BotFactory) -> None:
    bot = routed(make_bot)
    tasks = [
        task("extract the dates", kind="extract", criteria=CRITERIA),
        task("analyze the trend", kind="analyze", criteria="up or down, and why"),
        task("extract the names", kind="extract"),
    ]
    bot.ollama.script(ToolCall("delegate", {"tasks": tasks}))
    bot.ollama.script(Text("On it."))
    for marker in ("dates", "trend", "names"):
        bot.ollama.script_for(marker, reports(f"{marker}: done."))
    bot.ollama.script(Text("All back."))

    await bot.send("what is in the notes?")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    models = [run_request(bot, marker)["model"] for marker in ("dates", "trend", "names")]
    assert models == ["small-m", "medium-m", "large-m"]
    assert run_request(bot, "dates")["messages"][1]["content"] == (
        f"extract the dates\n\nDone when: {CRITERIA}"
    ), "the sub-agent reads its criteria"
    launched = next(
        m["content"]
        for r in bot.ollama.requests
        for m in r["messages"]
        if m["role"] == "tool" and "Launched 3 sub-agents" in m["content"]
    )
    assert f"extract-the-dates (a1, researcher) on small-m (small: {SMALL_REASON}):" in launched
    assert f"analyze-the-trend (a2, researcher) on medium-m (medium: {MEDIUM_REASON}):" in launched
    assert (
        "extract-the-names (a3, researcher) on large-m "
        "(large: an extract task without success criteria):" in launched
    )


async def test_a_small_or_medium_run_is_not_offered_delegate(make_bot: BotFactory) -> None:
    """Regression (issue 37): runs routed to small and medium were offered `delegate`, so a
    task routed to a cheap tier could reach broader tools or a larger model through a child."""
    bot = routed(make_bot, "planner")
    tasks = [
        planner_task("analyze the timetable", kind="analyze", criteria="the fastest train"),
        planner_task("extract the stations", kind="extract", criteria="one per line"),
    ]
    bot.ollama.script(ToolCall("delegate", {"tasks": tasks}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("timetable", reports("The 9:00."))
    bot.ollama.script_for("stations", reports("Bern, Thun."))
    bot.ollama.script(Text("Both back."))

    await bot.send("plan my trip")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    medium, small = run_request(bot, "timetable"), run_request(bot, "stations")
    assert (medium["model"], small["model"]) == ("medium-m", "small-m")
    assert "delegate" not in tool_names(medium), "a medium run cannot widen itself by a child"
    assert "delegate" not in tool_names(small), "nor a small one"


def trip_planner(bot: Bot, *before: Any) -> None:
    """The agent hands the planner an `other` task; the planner (after `before`) hands a
    researcher a small-eligible extract, then reports."""
    child = task("extract the trains", kind="extract", criteria="each departure time")
    bot.ollama.script(ToolCall("delegate", {"tasks": [planner_task("look into the trip")]}))
    bot.ollama.script(Text("Planning."))
    bot.ollama.script_for("look into", *before, ToolCall("delegate", {"tasks": [child]}))
    bot.ollama.script_for("look into", reports("Take the 9:00."))
    bot.ollama.script_for("trains", reports("9:00 and 11:00."))
    bot.ollama.script(Text("The 9:00 it is."))


async def test_a_large_run_delegates_and_its_child_is_routed(make_bot: BotFactory) -> None:
    bot = routed(make_bot, "planner")
    trip_planner(bot)

    await bot.send("plan my trip")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    planner = run_request(bot, "look into the trip")
    assert planner["model"] == "large-m"
    assert "delegate" in tool_names(planner), "a large run keeps nested delegation"
    assert run_request(bot, "extract the trains")["model"] == "small-m"


async def test_a_nested_delegation_is_routed_by_the_policy_its_parent_started_under(
    make_bot: BotFactory,
) -> None:
    """Issue 37: a child is routed by the policy as it was when its parent started (read from
    the settings of the moment before; they never change while Kaiwa runs, so the snapshot
    makes the rule explicit rather than fixing a seen failure)."""
    bot = routed(make_bot, "planner")
    trip_planner(bot, Pause("plan"))

    await bot.send("plan my trip")
    await bot.ollama.reached("plan")
    bot.subagents.settings = replace(bot.subagents.settings, routing=RoutingSettings())
    bot.ollama.release("plan")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    assert run_request(bot, "extract the trains")["model"] == "small-m"


async def test_agents_status_message_store_and_usage_say_each_runs_model_tier_and_why(
    make_bot: BotFactory,
) -> None:
    """Regression (issue 37): only the delegate result said which model a run had and why;
    /agents did only while it ran, the status message and /usage never, and nothing stored it."""
    bot = routed(make_bot, status_message=True)
    tasks = [
        task("extract the dates", kind="extract", criteria=CRITERIA),
        task("look around", kind="other"),
    ]
    bot.ollama.script(ToolCall("delegate", {"tasks": tasks}), Done(100, 10))
    bot.ollama.script(Text("On it."), Done(110, 5))
    bot.ollama.script(Pause("told a2"), Text("Nothing around."), Done(120, 6))
    bot.ollama.script(Pause("told a1"), Text("May 1."), Done(130, 7))
    bot.ollama.script_for("dates", Pause("dates"), reports("May 1."), Done(40, 8))
    bot.ollama.script_for("around", reports("Nothing."), Done(60, 12))

    await bot.send("when?")
    await bot.ollama.reached("dates")
    await bot.ollama.reached("told a2")  # a2 has ended; a1 is held
    await bot.send("/agents")
    board = next(r for r in bot.channel.replies if r.reply_to is None)
    await bot.channel.wait_until(lambda: "small-m (small)" in board.shown, "a1's model and tier")
    live = next(card for frame in board.frames for card in frame.cards if card.key == "a1")
    bot.ollama.release("told a2")
    bot.ollama.release("dates")
    bot.ollama.release("told a1")
    await finished(bot, "a1")
    await bot.ollama.reached("told a1")
    await bot.runner.wait_idle(PLACE)
    await bot.send("/agents a1")
    await bot.send("/usage")

    listing, detail, usage = bot.channel.notices_in(PLACE)
    a1_line = next(line for line in listing.splitlines() if line.startswith("extract-the-dates"))
    assert a1_line.endswith(f" · small-m (small: {SMALL_REASON})")
    assert live.route == f"small: {SMALL_REASON}"
    assert f"Model: small-m, tier small: {SMALL_REASON}" in detail.splitlines()
    conversation = await bot.store.active_conversation(PLACE)
    assert conversation is not None and conversation.id is not None
    rows = await bot.store.runs(conversation.id)
    assert [(r.key, r.model, r.tier, r.route) for r in rows] == [
        ("a1", "small-m", "small", SMALL_REASON),
        ("a2", "large-m", "large", "a task of kind 'other'"),
    ]
    lines = usage.splitlines()
    expected = [
        f"  a1 extract-the-dates: small-m (small: {SMALL_REASON}), 1 model call, 40 tokens in, 8 ",
        "  a2 look-around: large-m (large: a task of kind 'other'), 1 model call, 60 tokens in, ",
        "By model:",
        "  test-model: 4 model calls, 460 tokens in, 28 out, ",
        "  small-m: 1 model call, 40 tokens in, 8 out, ",
        "  large-m: 1 model call, 60 tokens in, 12 out, ",
    ]
    start = lines.index(next(line for line in lines if line.startswith("Sub-agents (2 runs")))
    shown = lines[start + 1 : start + 1 + len(expected)]
    assert [line[: len(want)] for line, want in zip(shown, expected, strict=True)] == expected


async def test_a_run_read_back_after_a_restart_keeps_its_tier_and_reason(
    make_bot: BotFactory, store: Store
) -> None:
    """Regression (issue 37): a run's tier and reason lived only in memory, so after a restart
    /agents no longer said why the run had its model."""
    started = await store.start_turn(TurnStart(PLACE, "assistant", "System.", "person", "go"))
    dates = RunStart("extract-the-dates", "researcher", "small-m", "extract", "small", SMALL_REASON)
    await store.start_runs(started.conversation_id, started.turn_id, [dates])
    await store.record_turn(started.conversation_id, started.turn_id, state=TurnState("done"))

    bot = routed(make_bot)  # the new process
    left = await leftovers(store, bot.runner.parts)
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(left)
    await bot.send("/agents a1")

    run = bot.subagents.find(PLACE, "a1")
    assert run is not None and (run.status, run.tier, run.route) == ("lost", "small", SMALL_REASON)
    assert card_of(run).route == f"small: {SMALL_REASON}"
    detail = bot.channel.notices_in(PLACE)[-1]
    assert f"Model: small-m, tier small: {SMALL_REASON}" in detail.splitlines()


def test_usage_puts_turns_stored_before_their_model_was_under_not_recorded() -> None:
    """Turns stored before migration 0015 have no model: their spend is not given to one."""
    now = utc_now()
    spent = {"model_calls": 1, "prompt_tokens": 10, "output_tokens": 2, "model_seconds": 0.5}
    turn = {"conversation_id": 1, "provenance": "person", "status": "done", "started_at": now}
    old, new = Turn(**turn, **spent), Turn(**turn, **spent, model="test-model")
    run = SubagentRun(
        conversation_id=1,
        key="a1",
        name="find-apples",
        profile="researcher",
        model="test-model",
        task="find apples",
        status="done",
        started_at=now,
        **spent,
    )

    usage = describe_usage([old, new], runs=[run]).splitlines()

    assert usage[usage.index("By model:") + 1 :] == [
        "  (not recorded): 1 model call, 10 tokens in, 2 out, 0.5 s",
        "  test-model: 2 model calls, 20 tokens in, 4 out, 1.0 s",
    ]
    ran = "  a1 find-apples: test-model (its profile's), 1 model call, 10 tokens in, 2 out, 0.5 s"
    assert ran in usage
