"""The dispatcher's order of business: dedupe, access, commands, size, then a turn."""

import base64
import logging

import pytest

from core.agent.model import ModelClient
from core.agent.profile import AgentProfile
from core.channel import ChannelMessage, Outcome
from core.dispatch.dispatcher import AccessRules, Allowed, Dispatcher
from core.store import Store
from core.text import Command, parse_command
from core.turns.runner import TurnRunner
from core.turns.turn import TurnSettings
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import Done, FakeOllama, Pause, Text
from tests.harness import PLACE, SYSTEM_PROMPT, Bot, BotFactory

AGENT = AgentProfile(name="assistant", model="test-model", system_prompt="", tools={})


async def test_a_duplicate_message_id_is_answered_once(bot: Bot) -> None:
    bot.ollama.script(Text("once"))

    await bot.send("hello", message_id="same")
    await bot.channel.finished()
    await bot.send("hello", message_id="same")

    assert len(bot.channel.replies) == 1
    assert len(bot.ollama.requests) == 1


async def test_a_redelivery_after_a_restart_is_still_a_duplicate(
    make_bot: BotFactory, sqlite_url: str, store: Store
) -> None:
    first = make_bot()
    await first.send("hello", message_id="delivered-before")
    await first.channel.finished()
    await first.runner.shutdown()

    reopened = await Store.open(sqlite_url)
    try:
        second = make_bot(bot_store=reopened)
        await second.send("hello", message_id="delivered-before")
        await second.runner.shutdown()
    finally:
        await reopened.close()
    assert second.channel.replies == []
    assert len(first.ollama.requests) == 1


async def test_commands_never_reach_the_model(bot: Bot) -> None:
    await bot.send("/help")
    await bot.send("/frobnicate now")

    help_text, unknown = bot.channel.notices_in(PLACE)
    assert "/stop" in help_text and "/new" in help_text and "/usage" in help_text
    assert unknown.startswith("Unknown command /frobnicate.")
    assert "/help" in unknown
    assert bot.ollama.requests == []


async def test_commands_answer_while_a_reply_streams(bot: Bot) -> None:
    bot.ollama.script(Pause("busy"), Text("finally"))
    await bot.send("long one")
    await bot.ollama.reached("busy")

    await bot.send("/help")

    assert bot.channel.notices_in(PLACE)[0].startswith("Commands:")
    bot.ollama.release("busy")
    await bot.channel.finished()


async def test_bang_form_works_like_slash(bot: Bot) -> None:
    bot.ollama.script(Pause("busy"), Text("never"))
    await bot.send("go")
    await bot.ollama.reached("busy")

    await bot.send("!stop")

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.STOPPED


async def test_usage_matches_the_model_counts(bot: Bot) -> None:
    bot.ollama.script(Text("one"), Done(prompt_tokens=120, output_tokens=30))
    bot.ollama.script(Text("two"), Done(prompt_tokens=200, output_tokens=45))
    await bot.send("first")
    await bot.channel.finished()
    await bot.send("second")
    await bot.channel.finished(2)

    await bot.send("/usage")

    (usage,) = bot.channel.notices_in(PLACE)
    lines = usage.splitlines()
    assert lines[0] == "Usage of this conversation (2 turns):"
    assert lines[1].startswith("#1 done: 1 model call, 120 tokens in, 30 out")
    assert lines[2].startswith("#2 done: 1 model call, 200 tokens in, 45 out")
    assert lines[3].startswith("Total: 2 model calls, 320 tokens in, 75 out")


async def test_usage_with_no_turns(bot: Bot) -> None:
    await bot.send("/usage")
    assert bot.channel.notices_in(PLACE) == ["No turns in this conversation yet."]


async def test_an_oversized_message_is_refused_with_its_size(make_bot: BotFactory) -> None:
    bot = make_bot(max_message_chars=10)

    await bot.send("x" * 1234, message_id="big")

    assert bot.channel.notices_in(PLACE) == [
        "Your message is 1,234 characters; the limit is 10 ([limits].max_message_chars). "
        "Shorten or split it."
    ]
    assert bot.ollama.requests == []
    assert await bot.store.inbound_status("test", "big") == "refused"


async def test_a_stranger_is_refused_without_a_model_call(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = make_bot(allowed=frozenset({"ann"}))

    with caplog.at_level(logging.WARNING):
        await bot.send("let me in", author="mallory")

    (notice,) = bot.channel.notices_in(PLACE)
    assert "not allowed" in notice and "mallory" in notice
    assert bot.ollama.requests == []
    assert "refused a message from test user mallory" in caplog.text


async def test_a_stranger_is_told_at_most_once_an_hour(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a refused stranger's every mention got its own refusal (on Discord, its own
    public thread): a lever to make the bot spam a channel."""
    bot = make_bot(allowed=frozenset({"ann"}))

    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await bot.send("let me in", author="mallory")
        await bot.send("me too", author="trudy")

    notices = bot.channel.notices_in(PLACE)
    assert [("mallory" in n, "trudy" in n) for n in notices] == [(True, False), (False, True)]
    assert caplog.text.count("refused a message from test user mallory") == 3
    assert caplog.text.count("told within the hour, not again") == 2


async def test_a_room_not_on_the_list_is_refused(
    store: Store, model: ModelClient, ollama: FakeOllama
) -> None:
    channel = RecordingChannel()
    runner = TurnRunner(store, model, {"test": channel}, TurnSettings(agent=AGENT))
    rules = AccessRules({"test": Allowed(users=None, rooms=frozenset({"C-ok"}))})
    dispatcher = Dispatcher(store, runner, {"test": channel}, rules, max_message_chars=100)

    await dispatcher.handle(ChannelMessage("test", PLACE, "m1", "ann", "hi", room="C-other"))
    await runner.shutdown()

    (notice,) = channel.notices_in(PLACE)
    assert "does not answer here" in notice and "allowed_channels" in notice
    assert ollama.requests == []


def test_a_role_on_the_list_lets_a_person_in() -> None:
    rules = AccessRules({"test": Allowed(users=frozenset({"ann"}), roles=frozenset({"r-team"}))})

    def message(author: str, roles: tuple[str, ...]) -> ChannelMessage:
        return ChannelMessage("test", PLACE, "m1", author, "hi", author_roles=roles)

    assert rules.refusal(message("ann", ())) is None
    assert rules.refusal(message("bob", ("r-other", "r-team"))) is None
    refusal = rules.refusal(message("eve", ("r-other",)))
    assert refusal is not None and "eve" in refusal and "allowed_roles" in refusal


def test_a_server_not_on_the_list_is_refused_but_a_direct_message_is_not() -> None:
    rules = AccessRules({"test": Allowed(users=None, spaces=frozenset({"g-ok"}))})

    elsewhere = ChannelMessage("test", PLACE, "m1", "ann", "hi", room="c1", space="g-other")
    refusal = rules.refusal(elsewhere)
    assert refusal is not None and "g-other" in refusal and "allowed_guilds" in refusal
    assert rules.refusal(ChannelMessage("test", PLACE, "m2", "ann", "hi")) is None


def test_a_platform_without_rules_is_closed() -> None:
    refusal = AccessRules().refusal(ChannelMessage("other", PLACE, "m1", "ann", "hi"))
    assert refusal is not None and "[channels.other].allowed_users" in refusal


async def test_new_starts_a_fresh_conversation(bot: Bot) -> None:
    bot.ollama.script(Text("noted"))
    bot.ollama.script(Text("fresh"))
    await bot.send("remember 42")
    await bot.channel.finished()

    await bot.send("/new")
    await bot.send("what did I say?")
    await bot.channel.finished(2)

    assert bot.channel.notices_in(PLACE) == ["Started a new conversation."]
    sent = bot.ollama.requests[1]["messages"]
    assert [m["content"] for m in sent] == [SYSTEM_PROMPT, "what did I say?"]
    assert [row.text for row in await bot.history()] == ["what did I say?", "fresh"]


async def test_new_while_a_reply_streams_stops_it_first(bot: Bot) -> None:
    bot.ollama.script(Text("half"), Pause("busy"), Text(" more"))
    await bot.send("go")
    await bot.ollama.reached("busy")

    await bot.send("/new")

    (reply,) = await bot.channel.finished()
    assert reply.outcome is Outcome.STOPPED
    assert bot.channel.notices_in(PLACE) == ["Started a new conversation. (Stopped.)"]
    assert await bot.store.active_conversation(PLACE) is None


def test_parse_command() -> None:
    assert parse_command("/stop") is not None
    assert parse_command("  !usage  ") is not None
    assert parse_command("/new@kaiwa_bot").name == "new"  # type: ignore[union-attr]
    assert parse_command("/tasks list all").argument == "list all"  # type: ignore[union-attr]
    assert parse_command("hello /stop") is None
    assert parse_command("/") is None
    assert parse_command("/ 42") is None
    multiline = parse_command("/plan\nfirst this,\n then that")
    assert multiline == Command("plan", "first this,\n then that"), "a task may start a line down"


async def test_a_message_during_shutdown_is_kept_for_the_next_start(bot: Bot) -> None:
    """Regression: it was dropped unrecorded, and a platform that does not redeliver (Discord,
    the terminal) lost it; now the next start answers it (`core.dispatch.recovery`)."""
    await bot.runner.shutdown()

    await bot.send("too late", message_id="late")

    assert bot.channel.replies == []
    (kept,) = await bot.store.unanswered_messages()
    assert (kept.platform_message_id, kept.text) == ("late", "too late")


async def test_an_image_for_a_model_that_cannot_see_is_explained(bot: Bot) -> None:
    await bot.send("what is this?", images=(b"\x89PNG",))

    (notice,) = bot.channel.notices_in(PLACE)
    assert "test-model does not read them" in notice
    assert "[agents.assistant].images = true" in notice
    assert bot.ollama.requests == []


async def test_images_reach_a_vision_model_with_their_turn_only(make_bot: BotFactory) -> None:
    bot = make_bot(images=True)
    bot.ollama.script(Text("A cat."))
    bot.ollama.script(Text("Still a cat."))

    await bot.send("what is this?", images=(b"cat-bytes",))
    await bot.channel.finished()
    await bot.send("and now?")
    await bot.channel.finished(2)

    first, second = (request["messages"] for request in bot.ollama.requests)
    assert first[-1]["images"] == [base64.b64encode(b"cat-bytes").decode()]
    assert all("images" not in message for message in second)
