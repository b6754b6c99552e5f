"""Discord beyond the shared conformance suite: threads, the three ways to stop, long replies,
gateway drops and replays, start-up problems, access rules, through the real discord.py against
the fake Discord and the fake Ollama."""

import asyncio
import base64
import functools
import gc
import socket
from typing import Any

import pytest

from channels.calls import PlatformError
from channels.discord.channel import DiscordChannel
from channels.presses import STOP, payload
from channels.settings import DiscordSettings
from core.agent.tools import ToolContext
from core.channel import COMMANDS, Button, ChannelMessage, Frame
from core.dispatch.dispatcher import Allowed
from core.errors import ChannelError
from core.features.schedule.timing import ScheduleSettings, When
from tests.channels.platforms import (
    WITH_HELPERS,
    DiscordPlatform,
    discord_buttons,
    discord_platform,
    has_stop_button,
    research,
    running,
)
from tests.fakes.discord import BOT_TOKEN, CHANNEL_ID, GUILD_ID, USER_ID, FakeDiscord
from tests.fakes.ollama import Pause, Text
from tests.fakes.patience import deadline
from tests.harness import BotFactory

STRANGER = 6666


def place(thread: int) -> str:
    return f"discord:{GUILD_ID}:{thread}"


def said(fake: FakeDiscord, channel: int) -> list[str]:
    """What everyone sees from the bot in a channel or thread (not private answers)."""
    return [sent.content for sent in fake.messages(channel) if not sent.ephemeral]


def private(fake: FakeDiscord, channel: int) -> list[str]:
    return [sent.content for sent in fake.messages(channel) if sent.ephemeral]


def open_thread(discord: DiscordPlatform, text: str, **options: Any) -> int:
    """A person mentions the bot in #general; the thread the bot opens takes the message's id."""
    options.setdefault("mentions_bot", True)
    return int(discord.fake.user_message(CHANNEL_ID, text, **options)["id"])


async def test_a_mention_opens_a_thread_and_the_reply_streams_there(
    make_bot: BotFactory,
) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Pause("first"), Text("Hello"), Pause("mid"), Text(", Ann."))
        thread = open_thread(discord, "what is a thread?\nTell me more.")
        await fake.wait_until(
            lambda: fake.calls_to("POST", f"/channels/{thread}/typing"), what="typing…"
        )
        discord.bot.ollama.release("first")
        await fake.wait_until(lambda: said(fake, thread) == ["Hello"], what="the first part")
        assert has_stop_button(fake.messages(thread)[0]), "a live reply can be stopped"
        discord.bot.ollama.release("mid")
        await fake.wait_until(
            lambda: fake.messages(thread)[0].components == [], what="the finished reply"
        )

    assert fake.threads[thread]["name"] == "what is a thread?"
    assert said(fake, CHANNEL_ID) == [], "nothing at the channel's top level"
    (reply,) = fake.messages(thread)
    assert reply.content == "Hello, Ann."
    history = [m.text for m in await discord.bot.history(place(thread))]
    assert history == ["what is a thread?\nTell me more.", "Hello, Ann."]
    typing = fake.calls_to("POST", f"/channels/{thread}/typing")
    first_post = fake.calls_to("POST", f"/channels/{thread}/messages")[0]
    assert typing and typing[0].at <= first_post.at, "typing shows before the first text"


async def test_a_follow_up_in_the_thread_needs_no_mention(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Noted: 42."))
        ollama.script(Text("You said 42."))
        thread = open_thread(discord, "remember 42")
        await fake.wait_until(lambda: said(fake, thread) == ["Noted: 42."], what="the first")
        fake.user_message(thread, "what did I say?")
        await fake.wait_until(lambda: len(said(fake, thread)) == 2, what="the second reply")
    sent = [m["content"] for m in ollama.requests[1]["messages"]]
    assert sent[-3:] == ["remember 42", "Noted: 42.", "what did I say?"]


async def test_a_mention_of_the_bots_role_counts_as_a_mention(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("You called?"))
        thread = open_thread(
            discord, "picked the role by mistake", mentions_bot=False, mentions_bot_role=True
        )
        await fake.wait_until(lambda: said(fake, thread) == ["You called?"], what="the reply")
    assert fake.threads[thread]["name"] == "picked the role by mistake"


async def test_without_the_right_to_open_threads_the_bot_says_so_in_the_channel(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Nowhere to be shown."))
        fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages/", status=403)
        opened = open_thread(discord, "hello?")
        await fake.wait_until(lambda: said(fake, CHANNEL_ID), what="the explanation")
    (explanation,) = fake.all_messages()
    assert explanation.reference == opened, "a reply to the person's message"
    assert "Create Public Threads" in explanation.content
    assert fake.threads == {}
    assert "cannot open a thread in #general" in caplog.text


async def test_messages_in_the_channel_without_a_mention_are_not_for_the_bot(
    make_bot: BotFactory,
) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Only this."))
        fake.user_message(CHANNEL_ID, "people talking among themselves")
        thread = open_thread(discord, "now you")
        await fake.wait_until(lambda: said(fake, thread) == ["Only this."], what="the reply")
    assert len(discord.bot.ollama.requests) == 1
    assert len(fake.threads) == 1


@pytest.mark.parametrize("way", ["typed", "mention", "slash command", "button"])
async def test_each_way_of_stopping_keeps_the_partial_text(make_bot: BotFactory, way: str) -> None:
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Half a story"), Pause("story"), Text(" never told"))
        thread = open_thread(discord, "tell me a story")
        await fake.wait_until(lambda: said(fake, thread) == ["Half a story"], what="streaming")
        if way == "typed":
            fake.user_message(thread, "/stop")
        elif way == "mention":
            fake.user_message(thread, "stop", mentions_bot=True)
        elif way == "slash command":
            fake.slash_command("stop", channel_id=thread)
        else:
            fake.button_click(fake.messages(thread)[0].id, payload(STOP))
        answered = said if way in ("typed", "mention") else private
        await fake.wait_until(lambda: "Stopped." in answered(fake, thread), what="the answer")

    reply = fake.messages(thread)[0]
    assert reply.content == "Half a story (stopped)"
    assert reply.components == [], "no Stop button on a finished reply"
    assert await discord.bot.assistant_text(place(thread)) == "Half a story"
    assert (await discord.bot.turns(place(thread)))[-1].status == "stopped"


async def test_shutting_down_mid_reply_leaves_it_stopped_on_discord(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Working on it"), Pause("busy"), Text(" and done"))
        thread = open_thread(discord, "take your time")
        await fake.wait_until(lambda: said(fake, thread) == ["Working on it"], what="streaming")
    (reply,) = fake.messages(thread)
    assert reply.content == "Working on it (stopped)"
    assert reply.components == []
    assert await discord.bot.assistant_text(place(thread)) == "Working on it"


async def test_a_command_at_shutdown_still_gets_its_answer(make_bot: BotFactory) -> None:
    """Regression: closing the channel closed discord.py's HTTP session under a Stop button's
    answer still on its way (here held back by a rate limit), and the answer was lost."""
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Half"), Pause("story"), Text(" never told"))
        thread = open_thread(discord, "go")
        await fake.wait_until(lambda: said(fake, thread) == ["Half"], what="streaming")
        fake.fail_next("POST", "/webhooks/", status=429, retry_after=0.3)
        fake.button_click(fake.messages(thread)[0].id, payload(STOP))
        await fake.wait_until(lambda: fake.calls_to("POST", "/webhooks/"), what="the answer")
    assert private(fake, thread) == ["Stopped."]


async def test_a_rate_limit_too_long_to_wait_in_line_skips_frames_instead(
    make_bot: BotFactory,
) -> None:
    """discord.py waits out a 429 itself, inside the call; past 30 s it raises instead, and the
    reply skips frames until the limit is over rather than holding the stream up."""
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages", status=429, retry_after=60)
        reply = discord.bot.channel.open_reply(f"discord:{GUILD_ID}:{CHANNEL_ID}", None)
        async with asyncio.timeout(deadline()):
            await reply.update(Frame("first words"))
            await reply.update(Frame("first words and more"))
    (refused,) = fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages")
    assert refused.status == 429
    assert said(fake, CHANNEL_ID) == []


async def test_a_long_reply_with_code_arrives_as_three_messages_with_intact_fences(
    make_bot: BotFactory,
) -> None:
    prose = "These sentences explain what the code below is for and why. " * 20
    code = "\n".join(f"total += values[{n}]  # add the value number {n}" for n in range(56))
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}"
    assert len(answer) > 5000
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text(answer, chunks=25))
        thread = open_thread(discord, "show me the code")
        await fake.wait_until(
            lambda: (
                "".join(said(fake, thread)).count("total +=") == 56
                and all(not sent.components for sent in fake.messages(thread))
            ),
            what="the whole reply",
        )
    shown = said(fake, thread)
    assert len(shown) == 3
    assert all(len(text) <= 2000 for text in shown)
    assert all(text.count("```") % 2 == 0 for text in shown)
    assert shown[1].startswith("```python\n"), "the code block reopens with its language"


@pytest.mark.parametrize("how", ["dropped", "reconnect", "invalid session"])
async def test_a_gateway_interruption_mid_reply_loses_nothing_and_repeats_nothing(
    make_bot: BotFactory, how: str
) -> None:
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Before the drop"), Pause("drop"), Text(", and after."))
        ollama.script(Text("Still here."))
        thread = open_thread(discord, "keep going")
        await fake.wait_until(lambda: said(fake, thread) == ["Before the drop"], what="streaming")
        if how == "dropped":
            await fake.drop_gateway()
        elif how == "reconnect":
            await fake.reconnect()
        else:
            await fake.invalid_session(resumable=True)
        fake.user_message(thread, "are you there?")  # sent while the gateway is down
        ollama.release("drop")
        await fake.wait_until(
            lambda: said(fake, thread) == ["Before the drop, and after.", "Still here."],
            what="both replies",
        )
    assert fake.resumes == 1 and fake.identifies == 1, "the session was resumed"
    assert len(ollama.requests) == 2


async def test_a_replayed_mention_is_answered_once_in_one_thread(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Only once."))
        opened = fake.user_message(CHANNEL_ID, "hello", mentions_bot=True)
        thread = int(opened["id"])
        await fake.wait_until(lambda: said(fake, thread) == ["Only once."], what="the reply")
        fake.replay_message(opened)
        fake.user_message(thread, "/usage")
        await fake.wait_until(lambda: len(said(fake, thread)) == 2, what="the /usage answer")
    assert len(discord.bot.ollama.requests) == 1
    assert said(fake, thread)[1].startswith("Usage of this conversation (1 turn)")
    assert len(fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages/{thread}/threads")) == 1


async def test_a_direct_message_is_a_conversation_and_new_starts_afresh(
    make_bot: BotFactory,
) -> None:
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Noted."))
        ollama.script(Text("Fresh start."))
        fake.dm(USER_ID, "remember 42")
        dm = fake.dm_channel(USER_ID)
        assert dm is not None
        await fake.wait_until(lambda: said(fake, dm) == ["Noted."], what="the reply")
        fake.dm(USER_ID, "/new")
        fake.dm(USER_ID, "what did I say?")
        await fake.wait_until(lambda: len(said(fake, dm)) == 3, what="the second reply")
    assert said(fake, dm)[1] == "Started a new conversation."
    sent = [m["content"] for m in ollama.requests[1]["messages"]]
    assert "remember 42" not in sent


async def test_slash_commands_are_registered_and_answer_privately(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        names = [command["name"] for command in fake.commands]
        assert names == [name for name, _ in COMMANDS]
        assert names[:6] == ["stop", "new", "usage", "compact", "agents", "tasks"]
        discord.bot.ollama.script(Text("Hi."))
        thread = open_thread(discord, "hi")
        await fake.wait_until(lambda: said(fake, thread) == ["Hi."], what="the reply")
        fake.slash_command("help", channel_id=thread)
        fake.slash_command("usage", channel_id=CHANNEL_ID)
        await fake.wait_until(lambda: any(private(fake, thread)), what="the /help answer")
        await fake.wait_until(lambda: any(private(fake, CHANNEL_ID)), what="the channel's answer")
    assert private(fake, thread)[0].startswith("Commands:")
    (outside,) = private(fake, CHANNEL_ID)
    assert "mention me in a channel" in outside
    assert said(fake, thread) == ["Hi."], "nothing public besides the reply"


async def test_the_agents_slash_command_takes_what_follows_it(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        (agents,) = [c for c in fake.commands if c["name"] == "agents"]
        discord.bot.ollama.script(Text("Hi."))
        thread = open_thread(discord, "hi")
        await fake.wait_until(lambda: said(fake, thread) == ["Hi."], what="the reply")
        fake.slash_command("agents", {"what": "stop ghost"}, channel_id=thread)
        await fake.wait_until(lambda: any(private(fake, thread)), what="the answer")

    assert [(o["name"], o.get("required", False)) for o in agents["options"]] == [("what", False)]
    assert private(fake, thread) == ["No running sub-agent ghost here; /agents lists them."]


async def test_agents_by_slash_command_shows_its_stop_buttons_to_the_asker_alone(
    make_bot: BotFactory,
) -> None:
    """The private answer to /agents carries each running agent's Stop button, and a click on
    it stops that agent, answered privately too."""
    async with discord_platform(functools.partial(make_bot, **WITH_HELPERS)) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(research("find apples"))
        ollama.script(Text("A helper is on it."))
        ollama.script_for("apples", Pause("apples"), Text("Gala"))
        ollama.default = [Text("Noted.")]
        thread = open_thread(discord, "what fruit is there?")
        await fake.wait_until(lambda: said(fake, thread) == ["A helper is on it."], what="reply")
        await ollama.reached("apples")
        fake.slash_command("agents", channel_id=thread)
        await fake.wait_until(lambda: any(private(fake, thread)), what="the /agents answer")
        (listing,) = [sent for sent in fake.messages(thread) if sent.ephemeral]
        stop = payload(Button("Stop find-apples", "/agents stop a1"))
        assert discord_buttons(listing) == [stop]

        fake.button_click(listing.id, stop)
        await fake.wait_until(lambda: len(private(fake, thread)) == 2, what="the stop's answer")
        apples = discord.bot.subagents.find(place(thread), "a1")
        assert apples is not None
        await apples.finished.wait()
    assert private(fake, thread)[1] == "User30 stopped find-apples (a1); its report follows."
    assert apples.status == "stopped"


async def test_a_private_answer_and_a_public_one_in_one_thread_do_not_swap(
    make_bot: BotFactory,
) -> None:
    """A slash command's answer goes to its interaction only while its own command runs: a
    typed command handled meanwhile in the same thread still answers in the thread."""
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Hi."))
        thread = open_thread(discord, "hi")
        await fake.wait_until(lambda: said(fake, thread) == ["Hi."], what="the reply")
        fake.slash_command("help", channel_id=thread)
        fake.user_message(thread, "/usage")
        await fake.wait_until(
            lambda: private(fake, thread) and len(said(fake, thread)) == 2, what="both answers"
        )
    assert private(fake, thread)[0].startswith("Commands:")
    assert said(fake, thread)[1].startswith("Usage of this conversation")


async def test_other_bots_are_ignored(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("For the person."))
        thread = open_thread(discord, "hi")
        await fake.wait_until(lambda: said(fake, thread) == ["For the person."], what="reply")
        fake.user_message(thread, "beep boop", author_id=4242, bot=True)
        fake.user_message(thread, "/usage")
        await fake.wait_until(lambda: len(said(fake, thread)) == 2, what="the /usage answer")
    assert len(discord.bot.ollama.requests) == 1


async def test_the_bot_never_pings_anyone(make_bot: BotFactory) -> None:
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Hey @everyone, look."))
        thread = open_thread(discord, "shout")
        await fake.wait_until(lambda: said(fake, thread), what="the reply")
    (post,) = fake.calls_to("POST", f"/channels/{thread}/messages")
    assert post.body["allowed_mentions"]["parse"] == []


async def test_a_thread_someone_else_opened_is_followed_once_the_bot_is_mentioned(
    make_bot: BotFactory,
) -> None:
    async with FakeDiscord() as fake:
        thread = fake.user_thread(CHANNEL_ID, "our own chat")
        async with discord_platform(make_bot, fake=fake) as discord:
            ollama = discord.bot.ollama
            ollama.script(Text("Joined."))
            fake.user_message(thread, "the bot should not answer this")
            fake.user_message(thread, "what do you think?", mentions_bot=True)
            await fake.wait_until(lambda: said(fake, thread) == ["Joined."], what="the reply")
        assert [m.text for m in await discord.bot.history(place(thread))] == [
            "what do you think?",
            "Joined.",
        ]
        assert len(fake.calls_to("PUT", f"/channels/{thread}/thread-members/@me")) == 1

        async with discord_platform(make_bot, fake=fake) as restarted:
            restarted.bot.ollama.script(Text("Still following."))
            fake.user_message(thread, "and after a restart?")
            await fake.wait_until(lambda: len(said(fake, thread)) == 2, what="the reply")
        assert said(fake, thread)[1] == "Still following."


async def test_an_archived_thread_continues_its_conversation(make_bot: BotFactory) -> None:
    """Also when a message arrives before its thread is back in discord.py's cache; the thread
    still counts as its parent channel for allowed_channels."""
    only_general = Allowed(users=None, rooms=frozenset({str(CHANNEL_ID)}))
    async with discord_platform(make_bot, access=only_general) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Noted: 42."))
        ollama.script(Text("You said 42."))
        ollama.script(Text("Still 42."))
        thread = open_thread(discord, "remember 42")
        await fake.wait_until(lambda: said(fake, thread) == ["Noted: 42."], what="the reply")
        fake.archive_thread(thread)
        asked = fake.user_message(thread, "what did I say?")  # reopens it, as Discord does
        await fake.wait_until(lambda: len(said(fake, thread)) == 2, what="the second reply")
        fake.archive_thread(thread)
        unseen = {**asked, "id": "1100000000000099999", "content": "and now?"}
        fake.dispatch("MESSAGE_CREATE", unseen)  # no THREAD_UPDATE first: not in the cache
        await fake.wait_until(lambda: len(said(fake, thread)) == 3, what="the third reply")
    sent = [m["content"] for m in ollama.requests[2]["messages"]]
    assert sent[1:] == ["remember 42", "Noted: 42.", "what did I say?", "You said 42.", "and now?"]
    assert fake.calls_to("GET", f"/channels/{thread}"), "the uncached thread was looked up"


async def test_a_scheduled_task_posts_in_its_thread_archived_since(make_bot: BotFactory) -> None:
    """The thread was archived after the task was made: posting reopens it, as Discord does
    for a member's message, and the reply lands there."""
    scheduling = functools.partial(make_bot, schedule=ScheduleSettings())
    async with discord_platform(scheduling) as discord:
        fake, scheduler = discord.fake, discord.bot.scheduler
        assert scheduler is not None
        discord.bot.ollama.script(Text("Noted."))
        thread = open_thread(discord, "post the digest here every morning")
        await fake.wait_until(lambda: said(fake, thread) == ["Noted."], what="the reply")
        asked = ToolContext("discord", place(thread), str(USER_ID), "person")
        task = await scheduler.create(asked, "assistant", "the digest", When(every_minutes=60))
        fake.archive_thread(thread)
        discord.bot.ollama.default = [Text("This morning's digest.")]
        await scheduler.run_now(task)
        await scheduler.settled()
    assert said(fake, thread) == ["Noted.", "This morning's digest."]
    (run,) = await discord.bot.store.task_runs(task.id or 0)
    assert run.outcome == "done"


async def test_a_role_on_the_list_lets_its_holders_in(make_bot: BotFactory) -> None:
    async with FakeDiscord() as fake:
        team = fake.add_role("team")
        by_role = Allowed(users=frozenset(), roles=frozenset({str(team)}))
        async with discord_platform(make_bot, fake=fake, access=by_role) as discord:
            discord.bot.ollama.script(Text("Welcome, teammate."))
            member = open_thread(discord, "hi", roles=[team])
            open_thread(discord, "hi too", author_id=STRANGER)
            await fake.wait_until(lambda: said(fake, member), what="the member's reply")
            await fake.wait_until(lambda: said(fake, CHANNEL_ID), what="the refusal")
    assert said(fake, member) == ["Welcome, teammate."]
    (refusal,) = said(fake, CHANNEL_ID)
    assert "allowed_roles" in refusal
    assert list(fake.threads) == [member], "no thread for the outsider"
    assert len(discord.bot.ollama.requests) == 1


async def test_a_picture_reaches_a_model_that_can_see(make_bot: BotFactory) -> None:
    picture = b"\x89PNG\r\n\x1a\n a tiny picture"
    async with discord_platform(make_bot, vision=True) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("A tiny picture."))
        fake.dm(USER_ID, "what is this?", attachments=[("p.png", "image/png", picture)])
        dm = fake.dm_channel(USER_ID)
        assert dm is not None
        await fake.wait_until(lambda: said(fake, dm), what="the reply")
    (request,) = discord.bot.ollama.requests
    assert request["messages"][-1]["images"] == [base64.b64encode(picture).decode()]


async def test_a_stranger_is_refused_in_the_channel_once_an_hour_and_gets_no_thread(
    make_bot: BotFactory,
) -> None:
    """Regression: every mention by a stranger opened a public thread for its refusal, so
    anyone could make the bot fill a channel with threads."""
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        first = open_thread(discord, "let me in", author_id=STRANGER)
        await fake.wait_until(lambda: said(fake, CHANNEL_ID), what="the refusal")
        open_thread(discord, "let me in, please", author_id=STRANGER)
        fake.user_message(CHANNEL_ID, "/usage", mentions_bot=True)  # someone allowed, after
        await fake.wait_until(lambda: len(said(fake, CHANNEL_ID)) == 2, what="the other answer")
    refusal, usage = fake.messages(CHANNEL_ID)
    assert "not allowed" in refusal.content and str(STRANGER) in refusal.content
    assert refusal.reference == first, "a reply to the stranger's first mention"
    assert usage.content == "No turns in this conversation yet.", "a command needs no thread"
    assert fake.threads == {} and not fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages/")
    assert discord.bot.ollama.requests == []


@pytest.mark.parametrize(
    ("access", "named"),
    [
        (Allowed(users=None, spaces=frozenset({"1"})), f"({GUILD_ID}) to [channels.discord]"
         ".allowed_guilds"),
        (Allowed(users=None, rooms=frozenset({"1"})), f"({CHANNEL_ID}) to [channels.discord]"
         ".allowed_channels"),
    ],
    ids=["server", "channel"],
)  # fmt: skip
async def test_a_server_or_channel_not_on_the_lists_is_refused(
    make_bot: BotFactory, access: Allowed, named: str
) -> None:
    async with discord_platform(make_bot, access=access) as discord:
        fake = discord.fake
        open_thread(discord, "hello")
        await fake.wait_until(lambda: said(fake, CHANNEL_ID), what="the refusal")
    (refusal,) = said(fake, CHANNEL_ID)
    assert named in refusal
    assert fake.threads == {} and discord.bot.ollama.requests == []


async def test_a_missing_message_content_intent_is_reported_at_start_up() -> None:
    async with FakeDiscord() as fake:
        fake.message_content_intent_enabled = False
        channel = DiscordChannel(settings(fake), BOT_TOKEN, guild_ready_timeout=0.01)
        problems = await channel.problems()
        with pytest.raises(ChannelError, match="Message Content Intent"):
            await channel.run(nowhere)
        await channel.close()
    (problem,) = problems
    assert problem.startswith("Discord would send every message without its text")
    assert "Privileged Gateway Intents → Message Content Intent" in problem


async def test_a_token_discord_rejects_is_named_without_the_token() -> None:
    async with FakeDiscord() as fake:
        channel = DiscordChannel(settings(fake), "not-the-token")
        problems = await channel.problems()
        await channel.close()
    (problem,) = problems
    assert problem.startswith("Discord rejected the bot token in $KAIWA_DISCORD_TOKEN")
    assert "not-the-token" not in problem


async def test_an_unreachable_discord_is_one_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        api = f"http://127.0.0.1:{probe.getsockname()[1]}/api/v10"
    channel = DiscordChannel(DiscordSettings(api_base=api), BOT_TOKEN)
    (problem,) = await channel.problems()
    await channel.close()
    assert problem.startswith(f"cannot reach Discord at {api} (")
    assert problem.endswith("check the network and [channels.discord].api_base")


def settings(fake: FakeDiscord) -> DiscordSettings:
    return DiscordSettings(api_base=fake.api_base, gateway_url=fake.gateway_url)


async def nowhere(message: ChannelMessage) -> None:
    raise AssertionError(f"nothing should be delivered, got {message}")


def without_author(channel: int, message_id: int, *, guild: bool) -> dict[str, Any]:
    """A MESSAGE_CREATE payload without `author`: in a server discord.py's parser fails on it,
    in a DM it makes a message with no author."""
    server = {"guild_id": str(GUILD_ID), "member": {"roles": [], "joined_at": None}}
    return {
        **(server if guild else {}),
        "id": str(message_id),
        "type": 0,
        "channel_id": str(channel),
        "content": "who wrote this?",
        "timestamp": "2026-01-01T00:00:00.000000+00:00",
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "components": [],
        "pinned": False,
        "flags": 0,
    }


@pytest.mark.parametrize("guild", [True, False], ids=["in a server", "in a DM"])
async def test_an_event_discord_py_cannot_read_is_one_line_and_skipped(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture, guild: bool
) -> None:
    """Regression: a MESSAGE_CREATE without `author` raised inside discord.py's gateway loop,
    which ended the channel (in a DM: a traceback for every such message)."""
    async with discord_platform(make_bot) as discord:
        fake = discord.fake
        discord.bot.ollama.script(Text("Still here."))
        dm = fake.open_dm(USER_ID)
        where = CHANNEL_ID if guild else dm
        for number in range(3):
            event = without_author(where, 1_100_000_000_000_099_000 + number, guild=guild)
            fake.dispatch("MESSAGE_CREATE", event)
        fake.dm(USER_ID, "hello")
        await fake.wait_until(lambda: said(fake, dm) == ["Still here."], what="the reply")
    (line,) = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert line.getMessage().startswith(
        "Discord event MESSAGE_CREATE (id 1100000000000099000) could not be read"
    )
    assert line.exc_info is None, "one line, no traceback"
    assert fake.identifies == 1 and fake.resumes == 0, "the gateway never dropped"


@pytest.mark.parametrize(
    ("form", "times"), [({"via": False}, 20), ({"scope": "global"}, 10)], ids=["no Via", "global"]
)
async def test_every_form_of_429_on_the_final_edit_ends_with_the_full_text(
    make_bot: BotFactory, form: dict[str, Any], times: int
) -> None:
    """Regression: discord.py raises a plain HTTPException 429 when it will not wait (no `Via`
    header) or gives up (five in a row); it truncated the reply and left its Stop button."""
    async with discord_platform(make_bot) as discord:
        fake, ollama = discord.fake, discord.bot.ollama
        ollama.script(Text("Storm"), Pause("storm"), Text(" over, every word kept."))
        thread = open_thread(discord, "go")
        await fake.wait_until(lambda: said(fake, thread) == ["Storm"], what="the first part")
        fake.fail_next("PATCH", f"/channels/{thread}/", retry_after=0.01, times=times, **form)
        ollama.release("storm")
        await fake.wait_until(
            lambda: fake.messages(thread)[0].components == [], what="the finished reply"
        )
    (reply,) = fake.messages(thread)
    assert reply.content == "Storm over, every word kept."
    assert [c.status for c in fake.calls_to("PATCH", f"/channels/{thread}/")].count(429) == times


async def test_run_starts_again_after_it_failed(make_bot: BotFactory) -> None:
    async with FakeDiscord() as fake:
        fake.fail_next("GET", "/users/@me", status=403)
        channel = DiscordChannel(settings(fake), BOT_TOKEN, guild_ready_timeout=0.01)
        bot = make_bot(channel=channel, access=Allowed(users=None))
        with pytest.raises(PlatformError, match="cannot reach Discord"):
            await channel.run(bot.dispatcher.handle)
        assert channel.problem is not None and not channel.connected.is_set()

        bot.ollama.script(Text("Back again."))
        async with running(channel, bot):
            await asyncio.wait_for(channel.connected.wait(), deadline())
            fake.dm(USER_ID, "hello")
            dm = fake.open_dm(USER_ID)
            await fake.wait_until(lambda: said(fake, dm) == ["Back again."], what="the reply")
        assert channel.problem is None


async def test_closing_while_the_gateway_cannot_reconnect_is_prompt(
    make_bot: BotFactory,
) -> None:
    async with FakeDiscord() as fake:
        channel = DiscordChannel(settings(fake), BOT_TOKEN, guild_ready_timeout=0.01)
        bot = make_bot(channel=channel)
        reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
        await asyncio.wait_for(channel.connected.wait(), deadline())
        fake.gateway_refused = True
        await fake.drop_gateway()
        await fake.wait_until(lambda: fake.refused_connections >= 1, what="a refused reconnect")
        assert not channel.connected.is_set()
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await bot.runner.shutdown()
        await asyncio.wait_for(channel.close(), deadline())  # not after discord.py's backoff
    gc.collect()  # a session left open warns here, and warnings fail the test
