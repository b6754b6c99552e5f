"""The web chat's live parts, as a person sees them in chromium: what a reply is doing beside
its words, the model's thinking folded away, sub-agents as live cards, and a reply that goes on
being written in a conversation the person has left.

Helpers and conventions are test_page.py's: `web` before `page`, `expect` waits, the fake
model's pauses say when a reply is half written.
"""

import re

import pytest
from playwright.async_api import Page, expect

from channels.web.channel import WebChannel
from core.agent.tools import ToolContext
from core.features.schedule.timing import ScheduleSettings, When
from core.features.subagents.runs import SubagentSettings
from tests.channels.web.test_page import (
    answer,
    bubbles,
    new_conversation,
    say,
    signed_in,
    streaming,
)
from tests.core.features.test_subagents import RESEARCHER, reports, task
from tests.fakes.ollama import Pause, Text, Thinking, ToolCall
from tests.harness import Bot


def doing(page: Page) -> object:
    return page.get_by_role("status", name="What Kaiwa is doing")


async def test_the_thinking_is_folded_away_and_the_status_is_apart_from_the_words(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(
        Thinking("The person wants a greeting."), Pause("thought"), Text("Hello!"), Pause("said")
    )
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "greet me")

    await expect(doing(page)).to_have_text("Kaiwa: thinking…")
    folded = page.locator("#thinking")
    await expect(folded).to_be_visible()
    await expect(folded).not_to_have_attribute("open", re.compile(".*"))
    await expect(folded.locator(".text")).to_be_hidden()
    await page.get_by_text("Thinking", exact=True).click()
    await expect(folded.locator(".text")).to_have_text("The person wants a greeting.")
    await expect(bubbles(page, "kaiwa")).to_have_count(0)
    item = page.get_by_role("link", name=re.compile("greet me"))
    await expect(item.get_by_role("img", name="writing")).to_be_visible()

    bot.ollama.release("thought")
    reply = await streaming(page, "Hello!")  # the words alone, no status line in them
    await expect(doing(page)).to_have_text("")  # the words say it now
    bot.ollama.release("said")
    await expect(reply).to_have_attribute("aria-busy", "false")
    await expect(doing(page)).to_have_text("")
    await expect(folded).to_be_hidden()
    await expect(item.get_by_role("img", name="writing")).to_be_hidden()
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    await expect(reply.locator(".body")).to_have_text("Hello!")


async def test_a_reply_goes_on_in_a_conversation_left_and_is_whole_on_return(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("The first half"), Pause("half"), Text(" and the second."))
    bot.ollama.script(Text("Hello there."))
    await signed_in(page, channel)
    first = await new_conversation(page)
    await say(page, "a long answer, please")
    await streaming(page, "The first half")

    await new_conversation(page)
    await say(page, "meanwhile, hi")
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text("Hello there.")
    left = page.get_by_role("link", name=re.compile("a long answer"))
    await expect(left.get_by_role("img", name="writing")).to_be_visible()
    bot.ollama.release("half")
    await bot.runner.wait_idle(f"web:operator:{first}")
    await expect(left.get_by_role("img", name="writing")).to_be_hidden()

    await left.click()
    await expect(page).to_have_url(re.compile(f"#{first}$"))
    whole = bubbles(page, "kaiwa").locator(".body")
    await expect(whole).to_have_text(["The first half and the second."])
    await expect(bubbles(page)).to_have_count(2)


@pytest.mark.bot(
    agents={"researcher": RESEARCHER}, delegates_to=("researcher",), subagents=SubagentSettings()
)
async def test_a_sub_agent_is_a_live_card_told_something_and_stopped_from_it(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("A helper is on it."))
    bot.ollama.script_for("apples", Pause("apples"), ToolCall("echo", {"word": "apple"}))
    bot.ollama.script_for("apples", Pause("forever"), reports("never"))
    bot.ollama.script(Text("The helper was stopped."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "what fruit is there?")
    await bot.ollama.reached("apples")

    card = page.get_by_role("region", name="Sub-agent find-apples")
    await expect(card).to_contain_text("find-apples (a1)")
    await expect(card).to_contain_text("test-model")
    await expect(card.get_by_role("button", name="Transcript of find-apples")).to_be_visible()
    await card.get_by_role("textbox", name="Tell find-apples").fill("only green ones")
    await card.get_by_role("button", name="Tell").click()
    await expect(answer(page)).to_contain_text("find-apples (a1) reads it at its next step.")
    await expect(card.get_by_role("textbox", name="Tell find-apples")).to_have_value("")
    bot.ollama.release("apples")
    await bot.ollama.reached("forever")
    told = [r for r in bot.ollama.requests if "find apples" in str(r["messages"][:2])][-1]
    assert "only green ones" in str(told["messages"]), "the run read what it was told"
    await expect(card).to_contain_text("1 model call")  # the second is under way

    await card.get_by_role("button", name="Stop find-apples").click()
    await expect(answer(page)).to_contain_text("stopped find-apples")
    await expect(card).to_contain_text("stopped")
    await expect(card.get_by_role("button", name="Stop find-apples")).to_have_count(0)
    await expect(card.get_by_role("textbox", name="Tell find-apples")).to_be_hidden()
    await expect(bubbles(page, "kaiwa").last.locator(".body")).to_have_text(
        "The helper was stopped."
    )
    await bot.runner.wait_idle(f"web:operator:{conversation}")

    await card.get_by_role("button", name="Transcript of find-apples").click()
    await expect(answer(page)).to_contain_text("Task: find apples")


@pytest.mark.bot(schedule=ScheduleSettings())
async def test_the_tasks_panel_pauses_and_runs_a_task_now(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Today's digest: nothing new."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    place = f"web:operator:{conversation}"
    assert bot.scheduler is not None
    here = ToolContext("web", place, "operator", "person")
    digest = await bot.scheduler.create(here, "assistant", "digest", When("0 8 * * *"))

    await page.get_by_role("button", name="Tasks").click()
    panel = answer(page)
    await expect(panel).to_contain_text(f"#{digest.id} digest")
    await panel.get_by_role("button", name=f"Pause #{digest.id} digest").click()
    await expect(panel).to_contain_text(f"Paused task #{digest.id} digest")
    await page.get_by_role("button", name="Tasks").click()
    await panel.get_by_role("button", name=f"Run #{digest.id} digest now").click()
    await expect(panel).to_contain_text("runs now; its answer follows here")
    reply = bubbles(page, "kaiwa").locator(".body")
    await expect(reply).to_have_text("Today's digest: nothing new.")
    await page.get_by_role("button", name="Tasks").click()
    await expect(panel.get_by_role("button", name=f"Resume #{digest.id} digest")).to_be_visible()
