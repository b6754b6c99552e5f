"""Sub-agent model routing: one pure test per eligibility rule, then the rules through the real
loop and the fake Ollama, whose requests show the model and the tools each run was given.

The fake answers each sub-agent by a word of its task (`script_for`), and 404s a model it does
not have, so each test appends its tiers' models to `bot.ollama.models`.
"""

from dataclasses import replace
from typing import Any

from core.agent.tools import tool
from core.features.subagents.routing import Route, RoutingSettings
from tests.core.features.test_subagents import QUIET, parent, reports, task
from tests.fakes.ollama import Text, ToolCall
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


def routed(make_bot: BotFactory, **settings: Any) -> Bot:
    bot = parent(make_bot, subagents=replace(QUIET, routing=ROUTING), **settings)
    bot.ollama.models += ["small-m", "medium-m", "large-m"]
    return bot


def run_request(bot: Bot, marker: str) -> dict[str, Any]:
    """The first request of the sub-agent whose task has `marker`."""
    return next(r for r in bot.ollama.requests if marker in str(r["messages"][1]["content"]))


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
