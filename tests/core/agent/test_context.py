"""Long conversations: every request inside the window, compaction at safe points, nothing lost.

Through the whole turn path and the real model client. The fake Ollama counts each request's
tokens its own way (three characters a token, where Kaiwa estimates four), so Kaiwa's estimate
has to learn from the counts the model reports; summary requests are the ones that offer no
tools, and the fake answers them apart (`without_tools`). After a compaction the system message
carries the summary after the system prompt.
"""

import logging
from typing import Any

import pytest

from core.agent.context import SUMMARY_HEADER, Calibration, raw_estimate, system_message
from core.channel import Outcome
from core.store.history import CUT_OFF
from tests.fakes.ollama import Done, HttpError, Pause, Text, ToolCall
from tests.harness import Bot, BotFactory

WINDOW = 2048
FILLER = "Here is some more about the plan, with its dates, names and numbers. " * 3
ANSWER = "Noted; that fits with what you said before, and I will keep it in mind. " * 3
SUMMARY = "Ann is planning a trip; every message so far was about its dates, names and numbers."


def long_bot(make_bot: BotFactory, **settings: Any) -> Bot:
    bot = make_bot(context_window=WINDOW, **settings)
    bot.ollama.count_prompts = True
    bot.ollama.default = [Text(ANSWER)]
    bot.ollama.without_tools = [Text(SUMMARY)]
    return bot


async def chat(bot: Bot, turns: int, first: int = 0) -> None:
    for number in range(first, first + turns):
        await bot.send(f"Message {number}. {FILLER}")
        await bot.channel.finished(number + 1)


def chat_requests(bot: Bot) -> list[dict[str, Any]]:
    return [request for request in bot.ollama.requests if request.get("tools")]


async def compactions(bot: Bot) -> list[Any]:
    conversation = await bot.store.active_conversation("test:one")
    assert conversation is not None and conversation.id is not None
    return await bot.store.compactions(conversation.id)


async def test_two_hundred_turns_never_send_a_request_over_the_window(
    make_bot: BotFactory,
) -> None:
    bot = long_bot(make_bot)

    await chat(bot, 200)

    assert {reply.outcome for reply in bot.channel.replies} == {Outcome.DONE}
    prompts = bot.ollama.prompts
    assert {prompt.num_ctx for prompt in prompts} == {WINDOW}, "num_ctx on every request"
    assert [prompt for prompt in prompts if prompt.overflows] == []
    assert all(request["messages"][0]["role"] == "system" for request in bot.ollama.requests)
    latest = chat_requests(bot)[-1]["messages"]
    assert latest[0] == system_message("You are a test assistant.", SUMMARY)
    assert latest[1]["role"] != "system"
    assert "Message 0." not in str(latest)
    stored = await compactions(bot)
    assert len(stored) >= 10 and {row.method for row in stored} == {"summary"}
    assert stored[-1].summary == SUMMARY
    assert len(await bot.history()) == 400, "every message stays stored"


async def test_a_restart_resumes_from_the_latest_summary(make_bot: BotFactory) -> None:
    before = long_bot(make_bot)
    await chat(before, 12)
    (*_, latest) = await compactions(before)
    requests = len(before.ollama.requests)

    after = long_bot(make_bot)  # a new process: same store, nothing in memory
    await after.send("And what was my first message about?")
    await after.channel.finished()

    assert len(after.ollama.requests) == requests + 1, "no new summary was needed"
    sent = chat_requests(after)[-1]["messages"]
    assert sent[0] == system_message("You are a test assistant.", latest.summary)
    kept = [m["content"] for m in sent[1:] if m["role"] == "user"]
    assert kept[-1] == "And what was my first message about?"
    assert "Message 0." not in str(sent)
    assert len(kept) < 12


async def test_compaction_never_separates_a_tool_call_from_its_result(
    make_bot: BotFactory,
) -> None:
    bot = long_bot(make_bot)
    for number in range(30):
        bot.ollama.script(ToolCall("echo", {"word": f"w{number}" * 30}))
        bot.ollama.script(Text(ANSWER))
        await bot.send(f"Message {number}. {FILLER}")
        await bot.channel.finished(number + 1)

    assert await compactions(bot)
    for request in chat_requests(bot):
        messages = request["messages"]
        assert messages[1]["role"] != "tool", "a result without its call"
        for index, message in enumerate(messages):
            calls = message.get("tool_calls") or []
            results = messages[index + 1 : index + 1 + len(calls)]
            assert [m["role"] for m in results] == ["tool"] * len(calls)
    assert [prompt for prompt in bot.ollama.prompts if prompt.overflows] == []


async def test_a_failed_summary_drops_the_oldest_messages_instead(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = long_bot(make_bot)
    bot.ollama.without_tools = [HttpError(500, "out of memory")]

    with caplog.at_level(logging.WARNING, logger="core.agent.context"):
        await chat(bot, 20)

    assert {reply.outcome for reply in bot.channel.replies} == {Outcome.DONE}
    assert {row.method for row in await compactions(bot)} == {"dropped"}
    assert [prompt for prompt in bot.ollama.prompts if prompt.overflows] == []
    assert "could not be written" in caplog.text and "dropped instead" in caplog.text
    assert not any(SUMMARY_HEADER in m["content"] for m in chat_requests(bot)[-1]["messages"])


async def test_a_message_too_big_for_the_window_is_refused_with_its_size(
    make_bot: BotFactory,
) -> None:
    bot = long_bot(make_bot, max_message_chars=20_000)

    await bot.send("Please read this. " + "word " * 2000)
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note is not None
    assert "tokens" in reply.note and "[agents.assistant].context_window" in reply.note
    assert bot.ollama.requests == [], "nothing was sent to be cut"


async def test_usage_shows_the_context_and_compact_compacts_now(make_bot: BotFactory) -> None:
    bot = long_bot(make_bot)
    await chat(bot, 3)

    await bot.send("/usage")
    await bot.send("/compact")
    await bot.send("/usage")

    usage, compacted, usage_after = bot.channel.notices_in("test:one")
    assert f"of {WINDOW:,} tokens" in usage and "0 compactions so far" in usage
    assert compacted.startswith("Compacted: the older messages are now a summary (about ")
    assert "1 compaction so far" in usage_after
    (row,) = await compactions(bot)
    assert row.turn_id is None and row.model_calls == 1, "its cost is recorded with it"


async def test_compact_while_a_reply_is_written_says_to_wait(make_bot: BotFactory) -> None:
    bot = long_bot(make_bot)
    bot.ollama.script(Pause("mid"), Text(ANSWER))
    await bot.send("Hello")
    await bot.ollama.reached("mid")

    await bot.send("/compact")
    bot.ollama.release("mid")
    await bot.channel.finished()

    assert bot.channel.notices_in("test:one")[0].startswith("A reply is being written here")
    assert await compactions(bot) == []


async def test_a_reply_cut_at_the_length_limit_is_marked_on_the_platform_and_stored(
    make_bot: BotFactory,
) -> None:
    bot = long_bot(make_bot)
    bot.ollama.script(Text("The first half of a long"), Done(reason="length"))

    await bot.send("Tell me everything.")
    (reply,) = await bot.channel.finished()
    await bot.send("Go on.")
    await bot.channel.finished(2)

    assert reply.outcome is Outcome.CUT
    first, _ = await bot.turns()
    assert first.status == "cut"
    answer = next(row for row in await bot.history() if row.role == "assistant")
    assert answer.partial and not answer.stopped
    told = chat_requests(bot)[-1]["messages"]
    assert told[2]["content"] == f"The first half of a long\n\n{CUT_OFF['cut']}"


async def test_the_window_is_chosen_for_the_model_once(make_bot: BotFactory) -> None:
    bot = make_bot()
    bot.ollama.context_lengths["test-model"] = 8192

    await bot.send("one")
    await bot.channel.finished()
    await bot.send("two")
    await bot.channel.finished(2)

    assert bot.ollama.show_requests == ["test-model"]
    assert [prompt.num_ctx for prompt in bot.ollama.prompts] == [8192, 8192]


def test_the_estimate_learns_from_what_the_model_reports() -> None:
    messages = [{"role": "user", "content": "x" * 400}]
    calibration = Calibration()
    calibration.sent(raw_estimate(messages))
    assert calibration.size(messages) == 104

    calibration.reported(208)  # the model's tokenizer counts twice as many
    assert calibration.size(messages) == 208

    calibration.sent(raw_estimate(messages))
    calibration.reported(20)  # a count cut short by Ollama's prompt cache: not learnt from
    assert calibration.size(messages) == 208
