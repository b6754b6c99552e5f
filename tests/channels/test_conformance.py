"""What every platform adapter must do, written once and run for each platform.

Each test drives the real adapter through the platform's fake and the fake Ollama; see
tests/channels/platforms.py for how each platform is set up and read.
"""

from itertools import pairwise

from core.channel import Outcome
from tests.channels.platforms import ANN, BOB, MALLORY, Platform
from tests.fakes.ollama import ChunkDelay, Pause, Text

SENTENCE = "A paragraph of explanation that goes on for a while. "


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


async def test_a_streamed_reply_is_edited_no_faster_than_the_interval(platform: Platform) -> None:
    words = " ".join(["word"] * 40)
    platform.bot.ollama.script(ChunkDelay(0.01), Text(words, chunks=40))

    platform.say(ANN, "stream please")
    await platform.wait_until(lambda: platform.shown(ANN) == [words], "the whole reply")

    times = platform.edit_times(ANN)
    assert len(times) >= 2, "the reply grew by edits"
    interval = platform.bot.channel.traits.frame_interval
    assert all(later - earlier >= interval * 0.99 for earlier, later in pairwise(times))


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


async def test_a_rate_limit_delays_but_loses_nothing(platform: Platform) -> None:
    ollama = platform.bot.ollama
    ollama.script(Text("First part."), Pause("limited"), Text(" Second part, complete."))

    platform.say(ANN, "go")
    await platform.wait_until(lambda: platform.shown(ANN) == ["First part."], "the first part")
    platform.rate_limit_next_edit(retry_after=1)
    ollama.release("limited")

    await platform.wait_until(
        lambda: platform.shown(ANN) == ["First part. Second part, complete."], "the whole reply"
    )


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


async def test_a_duplicate_delivery_is_answered_once(platform: Platform) -> None:
    platform.bot.ollama.script(Text("Only once."))

    message_id = platform.say(ANN, "hello")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Only once."], "the reply")
    platform.say_again(ANN, message_id)
    platform.say(ANN, "/usage")
    await platform.wait_until(lambda: len(platform.shown(ANN)) == 2, "the /usage answer")

    assert len(platform.bot.ollama.requests) == 1
    assert platform.shown(ANN)[1].startswith("Usage of this conversation (1 turns)")


async def test_a_stranger_is_refused_without_a_model_call(platform: Platform) -> None:
    platform.say(MALLORY, "let me in", user=MALLORY)
    await platform.wait_until(lambda: platform.shown(MALLORY), "the refusal")

    (refusal,) = platform.shown(MALLORY)
    assert "not allowed" in refusal and str(MALLORY) in refusal
    assert platform.bot.ollama.requests == []


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
