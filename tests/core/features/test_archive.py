"""`search_conversations` and `read_conversation` through the turn path: earlier conversations of
the same space are found and read; another space's are not, whatever the model asks for."""

from channels.places import space_of
from core.features.archive import archive_tools
from core.store import Store
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Text, ToolCall
from tests.harness import Bot, BotFactory, echo

DECIDED = "slack:T1:C1:1.1"
ASKING = "slack:T1:C1:2.2"
ELSEWHERE = "slack:T1:C9:3.3"


def reading(make_bot: BotFactory, store: Store) -> Bot:
    tools = [echo, *archive_tools(lambda: store, space_of)]
    return make_bot(channel=RecordingChannel("slack"), tools=tools)


def results(bot: Bot, request: int) -> list[str]:
    messages = bot.ollama.requests[request]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def said(bot: Bot, place: str, text: str) -> None:
    bot.ollama.script(Text("Noted."))
    await bot.send(text, place=place)
    await bot.runner.wait_idle(place)


async def test_a_decision_is_found_and_read_in_its_space_only(
    make_bot: BotFactory, store: Store
) -> None:
    bot = reading(make_bot, store)
    await said(bot, DECIDED, "We decided to ship the release on Friday.")
    await said(bot, ELSEWHERE, "Secret: ship the release on Friday, say nothing.")
    decided = await store.active_conversation(DECIDED)
    elsewhere = await store.active_conversation(ELSEWHERE)
    assert decided is not None and elsewhere is not None
    bot.ollama.script(ToolCall("search_conversations", {"query": "ship friday"}))
    bot.ollama.script(ToolCall("read_conversation", {"conversation": decided.id}))
    bot.ollama.script(ToolCall("read_conversation", {"conversation": elsewhere.id}))
    bot.ollama.script(Text("You decided to ship on Friday."))

    await bot.send("what did we decide about the release?", place=ASKING)
    await bot.runner.wait_idle(ASKING)

    found, read, refused = results(bot, 5)
    assert found.startswith(f"conversation {decided.id} · ") and "ship the release" in found
    assert "Secret" not in found, "another channel's conversation is not searched"
    assert read.startswith(f"Conversation {decided.id} (2 messages):")
    assert read.endswith("assistant: Noted.")
    assert refused == (
        f"'read_conversation' failed: ArchiveError: there is no conversation {elsewhere.id} here"
    )


async def test_wildcards_in_a_search_are_taken_literally(
    make_bot: BotFactory, store: Store
) -> None:
    bot = reading(make_bot, store)
    await said(bot, DECIDED, "plain words only")
    bot.ollama.script(ToolCall("search_conversations", {"query": "%"}))
    bot.ollama.script(Text("Nothing."))
    await bot.send("search", place=ASKING)
    await bot.runner.wait_idle(ASKING)

    assert results(bot, 2) == ["No message here contains '%'."]
