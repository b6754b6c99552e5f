"""Notes through the whole turn path and the fake Ollama: what a person asks the bot to remember
in one conversation, it recalls in another and after a restart; `/memory` shows and forgets them;
nobody reaches another person's notes."""

from core.features.memory import MemorySettings
from core.store import Store
from tests.fakes.ollama import Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory

ELSEWHERE = "test:two"


def tool_results(bot: Bot, request: int) -> list[str]:
    messages = bot.ollama.requests[request]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_a_note_kept_in_one_conversation_is_recalled_in_another_and_after_a_restart(
    make_bot: BotFactory, store: Store
) -> None:
    bot = make_bot(memory=MemorySettings())
    bot.ollama.script(ToolCall("remember", {"text": "Ann prefers answers in French"}))
    bot.ollama.script(Text("Noted."))
    await bot.send("remember that I prefer French", author="ann")
    await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)

    restarted = make_bot(memory=MemorySettings(), bot_store=store)
    restarted.ollama.script(ToolCall("recall", {"query": "french language"}))
    restarted.ollama.script(Text("Bien sûr."))
    await restarted.send("what do you know of me?", place=ELSEWHERE, author="ann")
    await restarted.channel.finished()

    assert tool_results(bot, 1) == ["Remembered as note #1."]
    (recalled,) = tool_results(restarted, 3)  # one fake Ollama for both processes
    assert recalled.startswith("#1 (") and recalled.endswith(") Ann prefers answers in French")


async def test_memory_lists_and_forgets_and_another_person_sees_none_of_it(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(memory=MemorySettings())
    bot.ollama.script(ToolCall("remember", {"text": "the door code is 4711"}))
    bot.ollama.script(Text("Kept."))
    bot.ollama.script(ToolCall("forget", {"note": 1}))
    bot.ollama.script(Text("I cannot."))
    await bot.send("remember the door code 4711", author="ann")
    await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)

    await bot.send("forget note 1", place=ELSEWHERE, author="bob")
    await bot.channel.finished(2)
    await bot.runner.wait_idle(ELSEWHERE)
    await bot.send("/memory", place=ELSEWHERE, author="bob")
    await bot.send("/memory", author="ann")
    await bot.send("/memory forget 1", author="ann")
    await bot.send("/memory", author="ann")

    assert tool_results(bot, 3) == [
        "'forget' failed: NoteError: there is no note #1; recall lists them"
    ]
    bobs = bot.channel.notices_in(ELSEWHERE)
    assert bobs == ["No notes kept for you. Ask me to remember something."]
    listed, forgot, empty = bot.channel.notices_in(PLACE)
    assert listed.startswith("Notes kept for you, newest first:\n#1 (")
    assert listed.endswith("the door code is 4711")
    assert forgot == "Forgot note #1."
    assert empty == "No notes kept for you. Ask me to remember something."


async def test_notes_kept_per_conversation_stay_in_theirs(make_bot: BotFactory) -> None:
    bot = make_bot(memory=MemorySettings(scope="conversation"))
    bot.ollama.script(ToolCall("remember", {"text": "this thread is about the Q3 launch"}))
    bot.ollama.script(Text("Kept."))
    await bot.send("remember what this thread is about", author="ann")
    await bot.channel.finished()
    await bot.runner.wait_idle(PLACE)
    await bot.send("/memory", place=ELSEWHERE, author="ann")
    await bot.send("/memory", author="bob")

    assert bot.channel.notices_in(ELSEWHERE) == [
        "No notes kept in this conversation. Ask me to remember something."
    ]
    assert bot.channel.notices_in(PLACE)[0].endswith("this thread is about the Q3 launch")


async def test_a_note_too_long_or_one_too_many_is_refused_with_what_to_do(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(memory=MemorySettings(max_notes=1, max_chars=20))
    bot.ollama.script(ToolCall("remember", {"text": "a note far longer than twenty characters"}))
    bot.ollama.script(ToolCall("remember", {"text": "short one"}))
    bot.ollama.script(ToolCall("remember", {"text": "another"}))
    bot.ollama.script(Text("Done."))
    await bot.send("remember things", author="ann")
    await bot.channel.finished()

    assert tool_results(bot, 3) == [
        "'remember' failed: NoteError: a note holds at most 20 characters; shorten it",
        "Remembered as note #1.",
        "'remember' failed: NoteError: 1 notes are kept already; forget one first (recall lists "
        "them)",
    ]
