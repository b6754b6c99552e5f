"""Long conversations: every request inside the window, compaction at safe points, nothing lost.

Through the whole turn path and the real model client. The fake Ollama counts each request's
tokens its own way (three characters a token, where Kaiwa estimates four), so Kaiwa's estimate
has to learn from the counts the model reports; summary requests are the ones that offer no
tools, and the fake answers them apart (`without_tools`). After a compaction the system message
carries the summary after the system prompt. "Fits the window" is checked with the fake's own
count, which is stricter than Kaiwa's estimate: a chat request within `num_ctx`, a summary request
within it with the answer it asks for (`num_predict`).
"""

import logging
from typing import Any

import pytest

from core.agent.context import (
    SUMMARY_HEADER,
    Calibration,
    Compaction,
    Compactor,
    ContextSettings,
    raw_estimate,
    schema_share,
    system_message,
)
from core.agent.model import ModelClient
from core.agent.tools import tool
from core.channel import Outcome
from core.store.history import CUT_OFF
from tests.fakes.ollama import Done, FakeOllama, HttpError, Pause, Text, ToolCall
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


def summary_requests(ollama: FakeOllama) -> list[dict[str, Any]]:
    return [request for request in ollama.requests if not request.get("tools")]


def assert_every_request_fits(ollama: FakeOllama) -> None:
    """Each request within its window by the fake's count: a summary request with its answer."""
    for request, prompt in zip(ollama.requests, ollama.prompts, strict=True):
        answer = request["options"].get("num_predict", 0)
        assert prompt.num_ctx == WINDOW
        assert prompt.tokens + answer <= WINDOW, (prompt.tokens, answer)


@tool()
def save_file(path: str, content: str) -> str:
    """Save a text file."""
    return f"saved {len(content):,} characters to {path}"


@tool(read_only=True)
def read_log() -> str:
    """Read the web server's log."""
    return "\n".join(f"{n:05} GET /index.html 200 in {n % 97} ms" for n in range(1500))


FILE = "".join(f"line {n}: the notes of the trip, with its dates and names;\n" for n in range(100))
"""About 6,000 characters: some 2,000 tokens by the fake's count, the whole window."""


def many_tools(count: int) -> list[Any]:
    """`count` tools with schemas of some 100 tokens each."""

    def made(number: int) -> Any:
        def lookup(query: str, region: str = "", limit: int = 10) -> str:
            return query

        lookup.__name__ = f"lookup_{number}"
        lookup.__doc__ = "Look something up in one of the many catalogues. " * 3
        return tool(read_only=True)(lookup)

    return [made(number) for number in range(count)]


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


async def test_a_huge_tool_call_is_shortened_in_the_summary_request(make_bot: BotFactory) -> None:
    """Regression: the compaction's transcript kept a tool call's arguments whole, so one long
    call (a file written through a tool) put a line as large as the window into a summary
    request; and the request after the call overflowed, blamed on the person."""
    bot = long_bot(make_bot, tools=[save_file])
    await chat(bot, 2)
    bot.ollama.script(ToolCall("save_file", {"path": "notes.txt", "content": FILE}))
    bot.ollama.script(Text("Saved."))
    await bot.send("Save my notes to notes.txt, please.")
    await bot.channel.finished(3)
    await chat(bot, 2, first=3)

    assert {reply.outcome for reply in bot.channel.replies} == {Outcome.DONE}
    assert_every_request_fits(bot.ollama)
    after_the_call = chat_requests(bot)[3]["messages"]
    (call,) = after_the_call[-2]["tool_calls"]
    assert "the tool received them all" in call["function"]["arguments"]["content"]
    transcripts = [str(request["messages"]) for request in summary_requests(bot.ollama)]
    assert any("save_file(" in transcript for transcript in transcripts)
    assert not any(FILE[:3000] in transcript for transcript in transcripts)
    stored = next(row for row in await bot.history() if row.tool_calls)
    assert stored.tool_calls[0]["arguments"]["content"] == FILE, "the store keeps it whole"


async def test_a_message_that_cannot_fit_is_refused_at_once_as_the_persons(
    make_bot: BotFactory,
) -> None:
    """Regression: a message too large for the window first had the whole conversation
    summarized (model calls spent for nothing), then was refused."""
    bot = long_bot(make_bot, max_message_chars=20_000)
    await chat(bot, 4)
    sent = len(bot.ollama.requests)

    await bot.send("Please read this. " + "word " * 2000)
    reply = (await bot.channel.finished(5))[-1]

    assert reply.outcome is Outcome.FAILED and reply.note is not None
    assert reply.note.startswith("your message is about 3,")
    assert "2,048-token context window" in reply.note and "send something shorter" in reply.note
    assert "[agents.assistant].context_window" in reply.note
    assert bot.ollama.requests[sent:] == [], "no summary was asked for"
    assert await compactions(bot) == []


async def test_a_tool_result_too_large_for_the_window_is_shortened_and_named(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a tool result larger than the window failed the turn, blamed on the person
    ("the latest message is about ... send something shorter")."""
    bot = long_bot(make_bot, tools=[read_log])
    bot.ollama.script(ToolCall("read_log", {}))
    bot.ollama.script(Text("The log shows 1,500 requests, all answered."))

    with caplog.at_level(logging.WARNING, logger="core.agent.context"):
        await bot.send("What does the log say?")
        (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.DONE
    assert_every_request_fits(bot.ollama)
    result = chat_requests(bot)[1]["messages"][-1]
    assert result["role"] == "tool" and result["content"].startswith("00000 GET")
    assert result["content"].endswith("01499 GET /index.html 200 in 44 ms")
    assert "[Kaiwa: read_log returned about " in result["content"]
    assert "ask for a smaller part" in result["content"]
    assert "the result of read_log is about" in caplog.text
    stored = next(row for row in await bot.history() if row.role == "tool")
    assert stored.text == read_log.function(), "the store keeps it whole"


async def test_the_turn_after_a_shortened_result_reads_it_from_the_store(
    make_bot: BotFactory,
) -> None:
    """The conversation's copy with the shortened result is dropped after the turn: the next
    one reads the store, as a restarted Kaiwa would, and summarizes the whole result."""
    bot = long_bot(make_bot, tools=[read_log])
    bot.ollama.script(ToolCall("read_log", {}))
    bot.ollama.script(Text("All answered."))
    await bot.send("What does the log say?")
    await bot.channel.finished()

    await bot.send("Thanks.")
    await bot.channel.finished(2)

    assert {reply.outcome for reply in bot.channel.replies} == {Outcome.DONE}
    assert_every_request_fits(bot.ollama)
    (summary,) = summary_requests(bot.ollama)
    assert "Tool read_log returned: 00000 GET" in summary["messages"][1]["content"]
    assert "[Kaiwa: read_log returned" not in str(chat_requests(bot)[-1]["messages"])


async def test_a_system_prompt_and_tools_that_leave_no_room_are_named(
    make_bot: BotFactory,
) -> None:
    """Not the person's fault: the refusal names the tools' schemas, the largest first."""
    bot = long_bot(make_bot, tools=[read_log, save_file, *many_tools(12)])

    await bot.send("Hello")
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED and reply.note is not None
    assert reply.note.startswith("the system prompt and the tools' schemas take about ")
    assert "the largest first: " in reply.note
    assert bot.ollama.requests == []


async def test_a_summary_request_that_cannot_fit_is_not_sent(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """Regression: with a summary so far too large for a summary request (the window lowered
    since it was written), summary requests went out larger than the window anyway."""
    ollama.count_prompts = True
    compactions: list[Compaction] = []
    compactor = Compactor(
        model, "test-model", ContextSettings(WINDOW), Calibration(), compactions.append
    )
    earlier = "Ann's trip: dates, names and numbers. " * 160  # some 2,000 tokens
    messages = [
        system_message("You are a test assistant.", earlier),
        {"role": "user", "content": FILLER},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And now?"},
    ]

    compaction = await compactor.compact(messages, keep_tokens=0)

    assert ollama.requests == []
    assert compaction is not None and compaction.method == "dropped"
    assert messages[0] == system_message("You are a test assistant.")


def test_the_share_of_the_window_the_tools_schemas_take() -> None:
    """What `kaiwa check` reports: at 2,048 tokens, fourteen tools take over a quarter, and the
    fewest to drop are the largest."""
    tools = [read_log, save_file, *many_tools(12)]

    share = schema_share(tools, 2048)

    assert share.tokens == raw_estimate([], [t.schema() for t in tools])
    sizes = dict(share.by_tool)
    assert sizes == {t.name: raw_estimate([], [t.schema()]) for t in tools}
    assert [size for _, size in share.by_tool] == sorted(sizes.values(), reverse=True)
    assert share.by_tool[-1][0] == "read_log"
    assert share.share == share.tokens / 2048 > 0.25
    dropped = share.to_drop()
    assert list(dropped) == [name for name, _ in share.by_tool[: len(dropped)]]
    left = share.tokens - sum(sizes[name] for name in dropped)
    assert left <= 2048 / 4 < left + sizes[dropped[-1]]
    assert schema_share(tools, 65536).to_drop() == ()


NOTES = "".join(f"note {n}: the hotel, the train and the museum tickets;\n" for n in range(24))
"""About 1,300 characters: some 450 tokens by the fake's count, a third of what the window
leaves beside the answer's reserve."""


async def test_a_compaction_inside_a_turn_never_summarizes_the_turns_own_question(
    make_bot: BotFactory,
) -> None:
    """Regression (issue 33): with a small window and a large tool call, the compaction before
    the model's next call kept only the call and its result and folded the person's message
    into the summary: the model was asked to go on from a request with no question in it."""
    bot = long_bot(make_bot, tools=[save_file])
    await chat(bot, 3)
    question = "Save my travel notes to notes.txt, then tell me what is still missing."
    bot.ollama.script(ToolCall("save_file", {"path": "notes.txt", "content": NOTES}))
    bot.ollama.script(Text("Saved; the museum tickets are still missing."))
    await bot.send(question)
    await bot.channel.finished(4)

    assert await compactions(bot), "the turn's second call needed a compaction"
    after_the_call = chat_requests(bot)[-1]["messages"]
    assert [m["role"] for m in after_the_call[-3:]] == ["user", "assistant", "tool"]
    assert after_the_call[-3]["content"] == question
    assert question not in after_the_call[0]["content"]
    assert_every_request_fits(bot.ollama)


async def test_a_turn_whose_own_messages_cannot_fit_even_shortened_ends_with_the_refusal(
    make_bot: BotFactory,
) -> None:
    """A turn's messages are never summarized: when even their shortened results no longer fit
    beside the answer's reserve, the turn ends with a refusal that says so, every request up to
    it fitting and carrying the question; what the tools returned stays stored whole."""
    bot = long_bot(make_bot, tools=[read_log], max_iterations=12)
    await chat(bot, 2)
    question = "Read the log again and again until you find the slow request."
    for _ in range(12):
        bot.ollama.script(ToolCall("read_log", {}))
    await bot.send(question)
    reply = (await bot.channel.finished(3))[-1]

    assert reply.outcome is Outcome.FAILED and reply.note is not None
    assert reply.note.startswith("your message and the ")
    assert "tool calls since, with their results, need about " in reply.note
    assert "ask for less at once, or raise [agents.assistant].context_window" in reply.note
    assert_every_request_fits(bot.ollama)
    turn_requests = [r for r in chat_requests(bot) if question in str(r["messages"][1:])]
    assert len(turn_requests) > 2
    for request in turn_requests:
        assert question not in request["messages"][0]["content"]
    stored = [row.text for row in await bot.history() if row.role == "tool"]
    assert stored and set(stored) == {read_log.function()}
