"""Sub-agents through the whole turn path and the fake Ollama: detached delegation, reports
delivered exactly once, `/agents`, stops, caps and restarts.

The fake answers each sub-agent by its task (`script_for`: a word of the task), and the parent
by its queue, so their interleaving never decides which script a request gets. Ordering is by
handshakes (the fake's pauses, a run's `finished` event); nothing here sleeps.
"""

from dataclasses import replace
from typing import Any

from core.agent.profile import AgentProfile
from core.channel import Button, Outcome
from core.dispatch.recovery import Recovery, leftovers
from core.features.subagents.runs import SubagentSettings, slug
from core.store import RunStart, Store, TurnStart, TurnState
from tests.fakes.ollama import Pause, Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory, echo

RESEARCHER = AgentProfile(
    name="researcher",
    model="test-model",
    system_prompt="You research one thing.",
    tools={"echo": echo},
    description="Looks one thing up.",
)


def task(instruction: str, **more: Any) -> dict[str, Any]:
    return {"profile": "researcher", "instruction": instruction, **more}


QUIET = SubagentSettings(status_message=False)
"""Without the status message, so each test counts only the replies it is about."""


def parent(make_bot: BotFactory, **settings: Any) -> Bot:
    settings.setdefault("subagents", QUIET)
    return make_bot(agents={"researcher": RESEARCHER}, delegates_to=("researcher",), **settings)


def reports(text: str) -> str:
    return ToolCall("report", {"summary": text})  # type: ignore[return-value]


async def finished(bot: Bot, key: str) -> None:
    run = bot.subagents.find(PLACE, key)
    assert run is not None
    await run.finished.wait()


def requests_with(bot: Bot, words: str) -> list[dict[str, Any]]:
    return [r for r in bot.ollama.requests if words in str(r["messages"])]


async def test_delegation_returns_at_once_and_the_reports_arrive_in_one_follow_up_turn(
    make_bot: BotFactory,
) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Text("I asked two helpers; I will tell you."))
    bot.ollama.script_for("apples", Pause("apples"), reports("Apples: 3 kinds."))
    bot.ollama.script_for("pears", Pause("pears"), reports("Pears: 2 kinds."))
    bot.ollama.script(Text("Both are back: 3 kinds of apples, 2 of pears."))

    await bot.send("what fruit is there?")
    (first,) = await bot.channel.finished()
    bot.ollama.release("apples")
    bot.ollama.release("pears")
    await finished(bot, "a1")
    await finished(bot, "a2")
    (_, follow_up) = await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    assert first.text == "I asked two helpers; I will tell you."
    assert follow_up.text == "Both are back: 3 kinds of apples, 2 of pears."
    assert len(bot.channel.replies) == 2, "one follow-up, not one per report"
    carried = requests_with(bot, "[Sub-agent report]")[0]["messages"][-1]["content"]
    assert "find-apples (a1, researcher) reported:\nApples: 3 kinds." in carried
    assert "find-pears (a2, researcher) reported:\nPears: 2 kinds." in carried
    conversation = await bot.store.active_conversation(PLACE)
    assert conversation is not None and conversation.id is not None
    rows = await bot.store.runs(conversation.id)
    assert [(r.key, r.status, r.delivery) for r in rows] == [
        ("a1", "done", "delivered"),
        ("a2", "done", "delivered"),
    ]


async def test_agent_wait_returns_what_is_ready_and_names_what_still_runs(
    make_bot: BotFactory,
) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Pause("collect"), ToolCall("agent_wait", {"timeout_s": 0}))
    bot.ollama.script(Text("One is back."))
    bot.ollama.script_for("apples", reports("Apples: 3 kinds."))
    bot.ollama.script_for("pears", Pause("pears"), reports("Pears: 2 kinds."))
    bot.ollama.script(Text("Pears too."))

    await bot.send("what fruit is there?")
    await bot.ollama.reached("collect")  # the sub-agents are launched by then
    await finished(bot, "a1")
    bot.ollama.release("collect")
    (first,) = await bot.channel.finished()
    bot.ollama.release("pears")
    await finished(bot, "a2")
    await bot.channel.finished(2)

    waited = [m for m in requests_with(bot, "Still running")[0]["messages"] if m["role"] == "tool"]
    assert "find-apples (a1, researcher) reported:\nApples: 3 kinds." in waited[-1]["content"]
    assert "Still running: find-pears (a2, researcher)" in waited[-1]["content"]
    assert first.text == "One is back."
    follow_up = requests_with(bot, "Pears: 2 kinds.")[-1]["messages"][-1]["content"]
    assert "Apples" not in follow_up, "a report is delivered once"


async def test_agents_lists_stops_one_and_tells_another(make_bot: BotFactory) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", Text("Apples so far: Gala"), Pause("apples"), Text(", Fuji"))
    bot.ollama.script_for("pears", Pause("pears"), ToolCall("echo", {"word": "pear"}))
    bot.ollama.script_for("pears", reports("Pears: 2 kinds, as told."))
    bot.ollama.default = [Text("Noted.")]

    await bot.send("what fruit is there?")
    await bot.channel.finished()
    await bot.ollama.reached("apples")
    await bot.send("/agents")
    await bot.send("/agents tell find-pears only count green ones")
    await bot.send("/agents stop find-apples")
    await finished(bot, "a1")
    bot.ollama.release("pears")
    await finished(bot, "a2")
    await bot.runner.wait_idle(PLACE)

    listing, told, stopped = bot.channel.notices_in(PLACE)[:3]
    assert listing.startswith("Sub-agents here:\n")
    assert "find-apples (a1) · researcher · " in listing and "0/30 model calls" in listing
    assert "find-pears (a2) · researcher · " in listing
    assert told == "find-pears (a2) reads it at its next step."
    assert stopped == "ann stopped find-apples (a1); its report follows."
    apples = bot.subagents.find(PLACE, "a1")
    assert apples is None or apples.status == "stopped"
    told_request = requests_with(bot, "[From ann, watching] only count green ones")
    assert told_request, "the message reached the agent at its next step"
    carried = [r["messages"][-1]["content"] for r in requests_with(bot, "[Sub-agent report]")]
    assert any(
        "find-apples (a1, researcher) was stopped; what it had:\nApples so far: Gala" in c
        for c in carried
    )


async def test_every_cap_refuses_with_what_to_do_instead(make_bot: BotFactory) -> None:
    bot = parent(make_bot, subagents=replace(QUIET, max_batch=2, max_total=3))
    too_many = {"tasks": [task("a"), task("b"), task("c")]}
    bot.ollama.script(ToolCall("delegate", too_many))
    bot.ollama.script(ToolCall("delegate", {"tasks": [{"profile": "poet", "instruction": "x"}]}))
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("x", tools=["current_time"])]}))
    bot.ollama.script(Text("I will do it myself."))

    await bot.send("do three things")
    await bot.channel.finished()

    results = [m["content"] for m in bot.ollama.requests[-1]["messages"] if m["role"] == "tool"]
    assert "At most 2 sub-agents per delegate call" in results[0]
    assert "agent_wait" in results[0]
    assert (
        "'poet' is not a profile you may delegate to; choose one of: researcher, general."
        in results[1]
    )
    assert "researcher may not use current_time; a task may only narrow" in results[2]
    assert bot.subagents.live(PLACE) == []


async def test_the_process_wide_cap_refuses_too(make_bot: BotFactory) -> None:
    bot = parent(make_bot, subagents=replace(QUIET, max_running=1))
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Text("I will do it myself."))

    await bot.send("two things")
    await bot.channel.finished()

    (refused,) = [m for m in bot.ollama.requests[-1]["messages"] if m["role"] == "tool"]
    assert "its limit being 1: do the work yourself, or delegate later." in refused["content"]


async def test_max_total_counts_every_run_a_conversation_ever_had_across_restarts(
    make_bot: BotFactory,
) -> None:
    """The bug: delivered runs were forgotten and the count began again with each process, so
    a conversation got a 21st sub-agent. The store's count decides."""
    settings = replace(QUIET, max_total=2)
    bot = parent(make_bot, subagents=settings)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", reports("Apples."))
    bot.ollama.script(Text("Apples are back."))
    await bot.send("what fruit is there?")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)
    assert bot.subagents.live(PLACE) == [], "delivered: this process has forgotten it"

    again = parent(make_bot, subagents=settings)  # a restart, on the same store
    again.ollama.script(ToolCall("delegate", {"tasks": [task("find pears"), task("find plums")]}))
    again.ollama.script(Text("I will do it myself."))
    await again.send("and pears and plums?")
    await again.channel.finished()

    *_, refused = [m for m in again.ollama.requests[-1]["messages"] if m["role"] == "tool"]
    assert refused["content"] == (
        "This conversation has had 1 of its 2 sub-agents (room for 1 more); do the rest of the "
        "work yourself."
    )


async def test_stop_stops_the_turn_and_every_sub_agent(make_bot: BotFactory) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Pause("parent"), Text("never"))
    bot.ollama.script_for("apples", Text("Gala"), Pause("apples"), Text(" and more"))
    bot.ollama.default = [Text("Stopped it is.")]

    await bot.send("what fruit is there?")
    await bot.ollama.reached("parent")
    await bot.ollama.reached("apples")
    run = bot.subagents.find(PLACE, "a1")
    await bot.send("/stop")
    assert run is not None
    await run.finished.wait()
    await bot.runner.wait_idle(PLACE)

    assert bot.channel.replies[0].outcome is Outcome.STOPPED
    assert bot.channel.notices_in(PLACE)[0] == (
        "Stopped. Stopped 1 sub-agent; their reports follow."
    )
    assert (run.status, run.report) == ("stopped", "Gala")


async def test_new_discards_undelivered_reports(make_bot: BotFactory) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", Pause("apples"), reports("Apples."))

    await bot.send("what fruit is there?")
    await bot.channel.finished()
    conversation = await bot.store.active_conversation(PLACE)
    await bot.send("/new")
    await bot.runner.wait_idle(PLACE)

    assert conversation is not None and conversation.id is not None
    (row,) = await bot.store.runs(conversation.id)
    assert (row.status, row.delivery) == ("stopped", "discarded")
    assert len(bot.channel.replies) == 1, "no follow-up carried a discarded report"


def test_names_are_slugs_made_unique() -> None:
    assert slug("Scan 10.0.0.5 for open ports, please", []) == "scan-10.0.0.5-for-open"
    assert slug("Port scan", ["port-scan"]) == "port-scan-2"
    assert slug("42 things", []) == "things"


async def crashed_with_runs(store: Store, *finished: str) -> int:
    """What a process killed mid-run leaves: run a1 still `running` (it had written one step),
    and a run finished with each report of `finished`, never delivered. The conversation's id."""
    started = await store.start_turn(TurnStart(PLACE, "assistant", "System.", "person", "go"))
    conversation_id = started.conversation_id
    tasks = ["find apples", *(f"find {report.split(':')[0].lower()}" for report in finished)]
    launched = await store.start_runs(
        conversation_id,
        started.turn_id,
        [RunStart(slug(each, []), "researcher", "test-model", each) for each in tasks],
    )
    (lost, _), *done = launched
    await store.record_run(lost, messages=[(1, "assistant", "Apples so far: Gala.", None, None)])
    for (row_id, _), report in zip(done, finished, strict=True):
        await store.record_run(row_id, values={"status": "done", "report": report})
    await store.record_turn(conversation_id, started.turn_id, state=TurnState("done"))
    return conversation_id


async def test_a_restart_marks_live_runs_lost_and_delivers_a_finished_report(
    make_bot: BotFactory, store: Store
) -> None:
    conversation_id = await crashed_with_runs(store, "Pears: 2 kinds.")

    bot = parent(make_bot)  # the new process
    bot.ollama.script(Text("The pears are back: 2 kinds."))
    left = await leftovers(store, bot.runner.parts)
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(left)
    (reply,) = await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)

    assert bot.channel.notices_in(PLACE) == [
        "Sub-agent find-apples (a1) was lost when Kaiwa restarted; ask again if you still need "
        "its work."
    ]
    assert reply.text == "The pears are back: 2 kinds."
    carried = bot.ollama.requests[-1]["messages"][-1]["content"]
    assert carried == (
        "[Sub-agent report] find-apples (a1, researcher) was lost when Kaiwa restarted; what it "
        "had written:\nApples so far: Gala.\n\n"
        "[Sub-agent report] find-pears (a2, researcher) reported:\nPears: 2 kinds."
    )
    rows = {row.key: row for row in await store.runs(conversation_id)}
    assert (rows["a1"].status, rows["a1"].delivery) == ("lost", "delivered")
    assert rows["a2"].delivery == "delivered"


async def test_a_lost_sub_agents_work_reaches_the_model_with_the_persons_next_message(
    make_bot: BotFactory, store: Store
) -> None:
    """The bug: a lost run was told to the person only; the model never learnt it was lost or
    what it had found, and its text was dropped. Nothing starts by itself: the person decides."""
    conversation_id = await crashed_with_runs(store)

    bot = parent(make_bot)
    left = await leftovers(store, bot.runner.parts)
    await Recovery(store, bot.runner, {"test": bot.channel}).resolve(left)
    assert len(bot.channel.notices_in(PLACE)) == 1 and bot.ollama.requests == []
    bot.ollama.script(Text("It had found Gala; shall I look further?"))
    await bot.send("what happened to the apples?")
    await bot.channel.finished()

    asked = bot.ollama.requests[-1]["messages"][-1]["content"]
    assert asked == (
        "[Sub-agent report] find-apples (a1, researcher) was lost when Kaiwa restarted; what it "
        "had written:\nApples so far: Gala.\n\nwhat happened to the apples?"
    )
    (row,) = await store.runs(conversation_id)
    assert (row.status, row.report, row.delivery) == ("lost", "Apples so far: Gala.", "delivered")


async def test_usage_shows_the_sub_agents_spend_apart(make_bot: BotFactory) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", reports("Apples."))
    bot.ollama.script(Text("Apples are back."))

    await bot.send("what fruit is there?")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)
    await bot.send("/usage")

    usage = bot.channel.notices_in(PLACE)[-1]
    assert "Sub-agents (1 run, not in the total): 1 model call, " in usage


PLANNER = AgentProfile(
    name="planner",
    model="test-model",
    system_prompt="You plan.",
    tools={},
    delegates_to=("researcher",),
)


def with_planner(make_bot: BotFactory) -> Bot:
    agents = {"researcher": RESEARCHER, "planner": PLANNER}
    return make_bot(agents=agents, delegates_to=("planner",), subagents=QUIET)


async def test_a_nested_delegation_waits_for_its_own_children_and_gets_their_reports(
    make_bot: BotFactory,
) -> None:
    bot = with_planner(make_bot)
    bot.ollama.script(
        ToolCall("delegate", {"tasks": [{"profile": "planner", "instruction": "plan a trip"}]})
    )
    bot.ollama.script(Text("Planning."))
    bot.ollama.script_for("plan a trip", ToolCall("delegate", {"tasks": [task("find trains")]}))
    bot.ollama.script_for("plan a trip", reports("Take the 9:00 train."))
    bot.ollama.script_for("trains", reports("Trains at 9:00 and 11:00."))
    bot.ollama.script(Text("The plan: the 9:00 train."))

    await bot.send("plan my trip")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    planner_saw = requests_with(bot, "Trains at 9:00 and 11:00.")[0]["messages"]
    assert planner_saw[0]["content"].startswith("You plan."), (
        "the child's report went to its parent"
    )
    carried = requests_with(bot, "[Sub-agent report]")[-1]["messages"][-1]["content"]
    assert carried == (
        "[Sub-agent report] plan-a-trip (a1, planner) reported:\nTake the 9:00 train."
    )
    (researcher,) = [r for r in bot.ollama.requests if "You research" in str(r["messages"][0])]
    researcher_tools = [t["function"]["name"] for t in researcher["tools"]]
    assert "delegate" not in researcher_tools, "at the depth cap there is no delegate"


async def test_stopping_a_sub_agent_stops_the_ones_it_launched(make_bot: BotFactory) -> None:
    bot = with_planner(make_bot)
    bot.ollama.script(
        ToolCall("delegate", {"tasks": [{"profile": "planner", "instruction": "plan a trip"}]})
    )
    bot.ollama.script(Text("Planning."))
    bot.ollama.script_for("plan a trip", ToolCall("delegate", {"tasks": [task("find trains")]}))
    bot.ollama.script_for("trains", Text("Looking"), Pause("trains"), Text(" still"))
    bot.ollama.default = [Text("Stopped, then.")]

    await bot.send("plan my trip")
    await bot.ollama.reached("trains")
    planner, trains = bot.subagents.find(PLACE, "a1"), bot.subagents.find(PLACE, "a2")
    assert planner is not None and trains is not None
    await bot.send("/agents stop plan-a-trip")
    await trains.finished.wait()
    await bot.runner.wait_idle(PLACE)

    assert (planner.status, trains.status) == ("stopped", "stopped")


async def test_a_report_that_lands_mid_turn_is_delivered_once_after_that_turn(
    make_bot: BotFactory,
) -> None:
    bot = parent(make_bot)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Pause("parent"), Text("Still answering you."))
    bot.ollama.script_for("apples", reports("Apples: 3 kinds."))
    bot.ollama.script(Text("The apples are back: 3 kinds."))

    await bot.send("what fruit is there?")
    await bot.ollama.reached("parent")
    await finished(bot, "a1")  # the report lands while the turn still runs
    bot.ollama.release("parent")
    (first, follow_up) = await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    assert first.text == "Still answering you."
    assert follow_up.text == "The apples are back: 3 kinds."
    assert len(bot.channel.replies) == 2
    assert len(requests_with(bot, "[Sub-agent report]")) == 1


async def test_the_general_profile_is_the_delegator_with_a_generalists_prompt(
    make_bot: BotFactory,
) -> None:
    bot = parent(make_bot)
    general = {"profile": "general", "instruction": "summarize the notes"}
    bot.ollama.script(ToolCall("delegate", {"tasks": [general]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("summarize", reports("Short summary."))
    bot.ollama.script(Text("Here is the summary."))

    await bot.send("summarize")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    (ran,) = [r for r in bot.ollama.requests if "capable generalist" in str(r["messages"][0])]
    names = {t["function"]["name"] for t in ran["tools"]}
    assert {"echo", "current_time", "report"} <= names, "the delegator's own tools"
    assert "delegate" in names, "below the depth cap it may delegate in turn"


async def test_a_status_message_shows_the_running_sub_agents_then_sums_them_up(
    make_bot: BotFactory,
) -> None:
    bot = parent(make_bot, subagents=SubagentSettings())
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", Pause("apples"), reports("Apples."))
    bot.ollama.script_for("pears", reports("Pears."))
    bot.ollama.script(Text("Both back."))

    await bot.send("fruit?")
    await bot.ollama.reached("apples")
    board = next(r for r in bot.channel.replies if r.reply_to is None)
    await bot.channel.wait_until(
        lambda: "find-apples (a1)" in board.shown and "find-pears (a2)" in board.shown,
        "both on the status message",
    )
    bot.ollama.release("apples")
    await bot.channel.wait_until(lambda: board.text is not None, "the summary")
    await bot.runner.wait_idle(PLACE)

    assert board.frames[-1].text.startswith("Sub-agents:\n· find-apples (a1) · ")
    assert board.text == "Sub-agents: find-apples done, find-pears done."
    live = next(frame.cards for frame in board.frames if frame.cards[0].status == "running")
    assert live[0].buttons[0] == Button("Stop find-apples", "/agents stop a1"), "a card's Stop"
    assert [(c.key, c.status, c.model, c.model_calls) for c in board.cards] == [
        ("a1", "done", "test-model", 1),
        ("a2", "done", "test-model", 1),
    ], "the summary carries the cards' final states"
    assert board.cards[0].buttons == (Button("Transcript of find-apples", "/agents a1"),)


async def test_a_run_has_at_most_its_profiles_model_calls_under_the_global_cap(
    make_bot: BotFactory,
) -> None:
    brief = replace(RESEARCHER, run_iterations=1)
    bot = make_bot(agents={"researcher": brief}, delegates_to=("researcher",), subagents=QUIET)
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("On it."))
    bot.ollama.script_for("apples", ToolCall("echo", {"word": "apple"}))
    bot.ollama.script_for("apples", Text("Apples, from what I had."))
    bot.ollama.script(Text("Back."))

    await bot.send("fruit?")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(PLACE)

    ran = [r for r in bot.ollama.requests if "You research" in str(r["messages"][0])]
    assert len(ran) == 2, "one call, then the wrap-up without tools"
    assert "tools" not in ran[-1] or not ran[-1]["tools"]


async def test_a_runs_compaction_never_summarizes_its_task_message(make_bot: BotFactory) -> None:
    """Regression (issue 33): in a small window, a sub-agent's large tool call and its result
    had the compaction before its next call fold the task message into the summary, so the run
    went on from a request with no task in it. The task and what follows it are kept (tool
    results shortened instead)."""
    notes = "".join(f"note {n}: the hotel, the train and the museum tickets;\n" for n in range(48))
    small = replace(RESEARCHER, context_window=2048)
    bot = make_bot(agents={"researcher": small}, delegates_to=("researcher",), subagents=QUIET)
    bot.ollama.count_prompts = True
    instruction = "collect the travel notes and say what is missing. " + "Check each booking. " * 45
    bot.ollama.script(ToolCall("delegate", {"tasks": [task(instruction)]}))
    bot.ollama.script(Text("A helper is on it."))
    bot.ollama.script_for("travel", ToolCall("echo", {"word": notes}))
    bot.ollama.script_for("travel", reports("Tickets missing."))
    bot.ollama.script(Text("The museum tickets are missing."))

    await bot.send("what is missing from my notes?")
    await bot.channel.finished()
    await finished(bot, "a1")
    await bot.channel.finished(2)

    runs = [r for r in bot.ollama.requests if small.system_prompt in r["messages"][0]["content"]]
    after_the_call = [r for r in runs if r["messages"][-1]["role"] == "tool"]
    assert after_the_call, "the run's second call came"
    for request in after_the_call:
        users = [m["content"] for m in request["messages"] if m["role"] == "user"]
        assert any(instruction in text for text in users), request["messages"]
        assert instruction not in request["messages"][0]["content"]
        assert request["options"]["num_ctx"] == 2048
    assert all(not prompt.overflows for prompt in bot.ollama.prompts)
