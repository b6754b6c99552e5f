"""Slack beyond the shared conformance suite: threads, commands in threads, double deliveries,
reconnects and HTTP mode, through the real slack-bolt against the fake Slack and fake Ollama."""

import asyncio
import contextlib
import functools
import gc
import logging
import socket
from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from channels.calls import PlatformError
from channels.presses import STOP, payload
from channels.settings import SlackSettings
from channels.slack.channel import SlackChannel, SlackTokens
from channels.slack.names import DisplayNames
from core.agent.tools import ToolContext
from core.channel import Delivery, Frame, Outcome
from core.errors import ChannelError
from core.features.schedule.timing import ScheduleSettings, When
from core.store import Store
from tests.channels.platforms import (
    ANN,
    BOB,
    SLACK_ALLOWED,
    running,
    slack_buttons,
    slack_platform,
    slack_stop_button,
)
from tests.databases import IMPATIENT, Outage, open_store
from tests.fakes.ollama import Pause, Text
from tests.fakes.patience import deadline
from tests.fakes.slack import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, TEAM, Ephemeral, FakeSlack
from tests.harness import Bot, BotFactory

ROOM = "C1"
DM = "D7"
ANN_ID, BOB_ID = f"U{ANN}", f"U{BOB}"
ESCAPED = "&lt;p&gt;&amp;nbsp;&lt;/p&gt;"  # "<p>&nbsp;</p>" in mrkdwn


def place(thread: str, channel: str = ROOM) -> str:
    return f"slack:{TEAM}:{channel}:{thread}"


async def test_a_mention_opens_a_thread_and_the_reply_streams_there(
    make_bot: BotFactory,
) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Hello"), Pause("mid"), Text(", Ann."))
        opened = fake.mention(ROOM, "hi there", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the first part")
        slack.bot.ollama.release("mid")
        await fake.wait_until(
            lambda: [p.text for p in fake.posted(ROOM, opened)] == ["Hello, Ann."], what="all"
        )
    assert fake.posted(ROOM) == [], "nothing at the channel's top level"
    (reply,) = fake.posted(ROOM, opened)
    assert reply.updates == ["Hello, Ann."], "one message, edited in place"
    assert [m.text for m in await slack.bot.history(place(opened))] == ["hi there", "Hello, Ann."]
    assert len(slack.bot.ollama.requests) == 1, "app_mention and message were answered once"


async def test_a_scheduled_task_posts_in_the_thread_it_was_made_in(make_bot: BotFactory) -> None:
    scheduling = functools.partial(make_bot, schedule=ScheduleSettings())
    async with slack_platform(scheduling) as slack:
        fake, scheduler = slack.fake, slack.bot.scheduler
        assert scheduler is not None
        slack.bot.ollama.script(Text("Noted."))
        opened = fake.mention(ROOM, "post the digest here", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
        asked = ToolContext("slack", place(opened), ANN_ID, "person")
        task = await scheduler.create(asked, "assistant", "the digest", When(every_minutes=60))
        slack.bot.ollama.default = [Text("Today's digest.")]
        await scheduler.run_now(task)
        await scheduler.settled()
    assert [p.text for p in fake.posted(ROOM, opened)] == ["Noted.", "Today's digest."]
    assert fake.posted(ROOM) == [], "nothing at the channel's top level"


async def test_a_mention_keeps_the_line_breaks_of_the_message(make_bot: BotFactory) -> None:
    """Regression: removing the mention used to squash the whole message onto one line, code
    blocks included."""
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Looks fine."))
        opened = fake.mention(ROOM, "check this:\n```\nx = 1\n```", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
    assert (await slack.bot.history(place(opened)))[0].text == "check this:\n```\nx = 1\n```"


async def test_a_follow_up_in_the_thread_needs_no_mention(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake, ollama = slack.fake, slack.bot.ollama
        ollama.script(Text("Noted: 42."))
        ollama.script(Text("You said 42."))
        opened = fake.mention(ROOM, "remember 42", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the first reply")
        fake.message(ROOM, "what did I say?", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the second")
    sent = [m["content"] for m in ollama.requests[1]["messages"]]
    assert sent[-3:] == ["remember 42", "Noted: 42.", "what did I say?"]


async def test_two_threads_in_one_channel_are_two_conversations(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake, ollama = slack.fake, slack.bot.ollama
        ollama.script(Text("First thread."))
        ollama.script(Text("Second thread."))
        first = fake.mention(ROOM, "one", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, first), what="the first reply")
        second = fake.mention(ROOM, "two", user=BOB_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, second), what="the second reply")
    assert [m["content"] for m in ollama.requests[1]["messages"]][1:] == ["two"]
    assert await slack.bot.store.active_conversation(place(first)) is not None
    assert await slack.bot.store.active_conversation(place(second)) is not None


async def test_bang_stop_in_the_thread_keeps_the_partial_text(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("A long answer begins"), Pause("long"), Text(" never"))
        opened = fake.mention(ROOM, "explain", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the partial reply")
        fake.message(ROOM, "!stop", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the notice")
    reply, notice = (p.text for p in fake.posted(ROOM, opened))
    assert reply == "A long answer begins (stopped)"
    assert notice == "Stopped."
    assert await slack.bot.assistant_text(place(opened)) == "A long answer begins"


async def test_the_stop_button_in_a_channel_thread_stops_that_thread(
    make_bot: BotFactory,
) -> None:
    """Bob, allowed but not the one who asked, presses Stop in Ann's thread: the thread's reply
    stops, and only Bob is told, in that thread."""
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("A long answer begins"), Pause("long"), Text(" never"))
        opened = fake.mention(ROOM, "explain", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the partial reply")
        (live,) = fake.posted(ROOM, opened)
        assert slack_stop_button(live)
        fake.press_button(ROOM, live.ts, payload(STOP), user=BOB_ID)
        await fake.wait_until(lambda: fake.ephemeral, what="the answer to Bob")
    assert fake.ephemeral == [Ephemeral(ROOM, BOB_ID, "Stopped.", opened)]
    (reply,) = fake.posted(ROOM, opened)
    assert reply.text == "A long answer begins (stopped)" and reply.blocks is None
    assert await slack.bot.assistant_text(place(opened)) == "A long answer begins"


async def test_a_post_found_only_as_the_reply_ends_shows_the_final_text_without_stop(
    make_bot: BotFactory,
) -> None:
    """The bug of issue 33, in a channel's thread: Slack answered the first post without its ts
    and then refused to show the thread, so the post stayed with its first words and its Stop
    button for ever, under a notice that part of the reply may be missing. Looked for again as
    the reply ends, it is found: edited to the final text, its button gone, never posted
    twice."""
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        asked = fake.unseen_message(ROOM, "a question", user=ANN_ID)
        reply = slack.bot.channel.open_reply(place(asked), f"{ROOM}:{asked}")
        fake.answer_without("chat.postMessage", "ts")
        fake.fail_next("conversations.replies", error="internal_error")
        await reply.update(Frame("First words"))
        await reply.update(Frame("First words and more"))
        await reply.finish("First words and more, all of them.", Outcome.DONE, None)

    (posted,) = fake.posted(ROOM, asked)
    assert posted.text == "First words and more, all of them." and not slack_buttons(posted)
    assert len(fake.calls_to("chat.postMessage")) == 1
    assert len(fake.calls_to("conversations.replies")) == 2, "refused, then asked again"
    assert reply.posted == (posted.ts,) and reply.delivery is Delivery.SHOWN


async def test_a_post_known_only_as_the_reply_ends_not_to_have_landed_is_posted_then(
    make_bot: BotFactory,
) -> None:
    """A post cut off before Slack took it, while Slack would not show the DM: the reply could
    not tell whether it landed, and stopped. Asked again as it ends, Slack shows no such post,
    so the final text is posted, once: nothing said is lost, nothing shows twice."""
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        fake.hang_up_before("chat.postMessage")
        slack.fail_the_next_read_back(ANN)
        reply = slack.reply(ANN)
        await reply.update(Frame("First words"))
        await reply.finish("First words, and the rest.", Outcome.DONE, None)

    assert slack.shown(ANN) == ["First words, and the rest."] and not slack.has_stop_button(ANN)
    assert reply.delivery is Delivery.SHOWN


async def test_a_press_is_acknowledged_before_the_stop_it_asks_for_is_over(
    make_bot: BotFactory,
) -> None:
    """Slack waits three seconds for an ack, and a stop lasts until the reply's last edit. Here
    Slack holds that edit until it has the press's ack: were the ack sent only once the stop is
    over, neither would ever come."""
    async with slack_platform(make_bot) as slack:
        fake, ollama = slack.fake, slack.bot.ollama
        ollama.script(Text("Half"), Pause("half"), Text(" and the rest"))
        slack.say(ANN, "go")
        await slack.wait_until(lambda: slack.shown(ANN) == ["Half"], "streaming")
        (live,) = fake.posted(f"D{ANN}")
        pressed = fake.press_button(f"D{ANN}", live.ts, payload(STOP), user=ANN_ID)
        fake.holds.hold("chat.update", lambda params: lambda: pressed in fake.acked)
        await slack.wait_until(lambda: slack.told_privately(ANN) == ["Stopped."], "the answer")
    assert slack.shown(ANN) == ["Half (stopped)"]
    assert fake.holds.abandoned == []


async def test_a_reply_of_escaped_characters_fits_its_section_block(make_bot: BotFactory) -> None:
    """A live message's text sits in a section block (3,000 characters at most); &, < and >
    grow into entities in mrkdwn, so a message is measured as what Slack is sent."""
    html = "<p>&nbsp;</p>\n" * 500
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text(f"```\n{html}```", chunks=20), Pause("end"), Text("\n"))
        slack.say(ANN, "some html please")
        await asyncio.wait_for(slack.bot.ollama.reached("end"), deadline())
        await slack.wait_until(
            lambda: "".join(slack.shown(ANN)).count(ESCAPED) == 500, "all of it, still live"
        )
        assert slack.has_stop_button(ANN)
        slack.bot.ollama.release("end")
        await slack.wait_until(lambda: not slack.has_stop_button(ANN), "the finished reply")
    assert [call.error for call in fake.calls if call.error] == []
    assert "".join(slack.shown(ANN)).count(ESCAPED) == 500


async def test_a_mention_followed_by_the_word_is_the_command(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Hello."))
        opened = fake.mention(ROOM, "hi", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
        fake.mention(ROOM, "usage", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the usage")
    assert fake.posted(ROOM, opened)[1].text.startswith("Usage of this conversation (1 turn)")
    assert len(slack.bot.ollama.requests) == 1


async def test_threads_the_bot_is_not_part_of_are_ignored(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        root = fake.message(ROOM, "people talking", user=BOB_ID)
        fake.message(ROOM, "among themselves", user=ANN_ID, thread_ts=root)
        fake.message(ROOM, "top-level chatter", user=ANN_ID)
        await fake.wait_until(lambda: fake.calls_to("conversations.replies"), what="a look")
        slack.bot.ollama.script(Text("Now I am here."))
        fake.mention(ROOM, "join us", user=ANN_ID, thread_ts=root)
        await fake.wait_until(lambda: fake.posted(ROOM, root), what="the reply in the thread")
    assert [r["messages"][-1]["content"] for r in slack.bot.ollama.requests] == ["join us"]


async def test_a_thread_slack_will_not_show_is_skipped_and_asked_about_again(
    make_bot: BotFactory,
) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        root = fake.message(ROOM, "people talking", user=BOB_ID)
        fake.fail_next("conversations.replies", error="ratelimited", retry_after=1)
        fake.message(ROOM, "first reply", user=ANN_ID, thread_ts=root)
        fake.message(ROOM, "second reply", user=ANN_ID, thread_ts=root)
        await fake.wait_until(
            lambda: len(fake.calls_to("conversations.replies")) == 2, what="a second look"
        )
    assert slack.bot.ollama.requests == []


async def test_other_bots_are_ignored_unless_configured(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Hi."))
        opened = fake.mention(ROOM, "hello", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
        fake.bot_message(ROOM, "beep", thread_ts=opened)
        fake.message(ROOM, "!help", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the help")
    assert len(slack.bot.ollama.requests) == 1, "neither the other bot nor our own echoes"


async def test_a_redelivered_envelope_is_answered_once(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Once."))
        opened = fake.mention(ROOM, "hello", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
        for envelope in [e for e in fake.envelopes if e.get("type") == "events_api"][:2]:
            fake.redeliver(envelope["envelope_id"])
        fake.message(ROOM, "!usage", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the usage")
    assert len(slack.bot.ollama.requests) == 1


async def test_a_disconnect_mid_reply_reconnects_and_the_reply_completes(
    make_bot: BotFactory,
) -> None:
    async with slack_platform(make_bot) as slack:
        fake, ollama = slack.fake, slack.bot.ollama
        ollama.script(Text("Before the drop"), Pause("drop"), Text(", after it."))
        ollama.script(Text("Still here."))
        opened = fake.mention(ROOM, "go", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the partial reply")
        await fake.disconnect()
        await fake.wait_connected(2)
        ollama.release("drop")
        fake.message(ROOM, "and now?", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(
            lambda: (
                [p.text for p in fake.posted(ROOM, opened)]
                == ["Before the drop, after it.", "Still here."]
            ),
            what="both replies",
        )
    assert fake.connections_opened == 2
    assert len(ollama.requests) == 2


async def test_a_dropped_socket_reconnects_without_losing_or_repeating_events(
    make_bot: BotFactory,
) -> None:
    async with slack_platform(make_bot) as slack:
        fake, ollama = slack.fake, slack.bot.ollama
        ollama.script(Text("First."))
        ollama.script(Text("Second."))
        opened = fake.mention(ROOM, "one", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the first reply")
        await fake.drop_socket()
        fake.message(ROOM, "two", user=ANN_ID, thread_ts=opened)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the second")
    assert [p.text for p in fake.posted(ROOM, opened)] == ["First.", "Second."]
    assert len(ollama.requests) == 2


async def test_the_working_reaction_is_removed_when_the_reply_starts(
    make_bot: BotFactory,
) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Pause("think"), Text("Done thinking."))
        opened = fake.mention(ROOM, "hard question", user=ANN_ID)
        await fake.wait_until(
            lambda: fake.reactions(ROOM, opened) == {"hourglass_flowing_sand"}, what="reaction"
        )
        slack.bot.ollama.release("think")
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
        await fake.wait_until(lambda: not fake.reactions(ROOM, opened), what="no reaction")


async def test_markdown_is_sent_as_mrkdwn(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("**Bold** and [a link](https://example.com)."))
        opened = fake.mention(ROOM, "format", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the reply")
    assert fake.posted(ROOM, opened)[0].text == "*Bold* and <https://example.com|a link>."
    assert (
        await slack.bot.assistant_text(place(opened))
        == "**Bold** and [a link](https://example.com)."
    )


async def test_a_channel_not_on_the_list_is_refused(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot, allowed_channels=["C-OK"]) as slack:
        fake = slack.fake
        opened = fake.mention(ROOM, "hello", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the refusal")
    assert "does not answer here" in fake.posted(ROOM, opened)[0].text
    assert slack.bot.ollama.requests == []


async def test_the_slash_command_acts_on_the_thread_given(make_bot: BotFactory) -> None:
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Working"), Pause("busy"), Text(" on it"))
        opened = fake.mention(ROOM, "long task", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(ROOM, opened), what="the partial reply")
        usage = fake.slash_command("/kaiwa", "", channel=ROOM, user=ANN_ID)
        stop = fake.slash_command("/kaiwa", f"stop {opened}", channel=ROOM, user=ANN_ID)
        await fake.wait_until(lambda: len(fake.posted(ROOM, opened)) == 2, what="the notice")
    acks = {ack.envelope_id: (ack.payload or {}).get("text", "") for ack in fake.acks}
    assert "inside the thread" in acks[usage]
    assert acks[stop] == "`!stop` sent to the thread."
    assert fake.posted(ROOM, opened)[0].text == "Working (stopped)"


@contextlib.asynccontextmanager
async def over_http(make_bot: BotFactory, fake: FakeSlack) -> AsyncIterator[tuple[Bot, str]]:
    """A Slack channel in HTTP mode, receiving on a free port: the bot, and its events URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = SlackSettings(mode="http", api_url=fake.api_url, http_port=port, edit_interval=0.05)
    channel = SlackChannel(settings, SlackTokens(bot=BOT_TOKEN, signing_secret=SIGNING_SECRET))
    bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
    async with running(channel, bot):
        await asyncio.wait_for(channel.connected.wait(), deadline())
        yield bot, f"http://127.0.0.1:{port}/slack/events"


async def test_http_mode_answers_signed_events_and_refuses_bad_signatures(
    make_bot: BotFactory,
) -> None:
    async with FakeSlack() as fake, over_http(make_bot, fake) as (bot, url):
        bot.ollama.script(Text("Over HTTP."))
        challenge = {"type": "url_verification", "challenge": "abc", "token": "x"}
        verified = await fake.post_event(url, challenge)
        event = {
            "type": "app_mention",
            "channel": ROOM,
            "user": ANN_ID,
            "text": "<@UBOT> hello",
            "ts": "1700000000.000100",
            "team": TEAM,
        }
        body = fake.event_body(event)
        accepted = await fake.post_event(url, body)
        retried = await fake.post_event(url, body, retry_num=1)
        forged = await fake.post_event(url, fake.event_body(event), secret="wrong")
        await fake.wait_until(lambda: fake.posted(ROOM, "1700000000.000100"), what="the reply")
    assert verified[0] == 200 and '"abc"' in verified[1]
    assert accepted[0] == 200 and retried[0] == 200
    assert forged[0] == 401
    assert [p.text for p in fake.posted(ROOM, "1700000000.000100")] == ["Over HTTP."]
    assert len(bot.ollama.requests) == 1


async def test_tokens_slack_rejects_are_named() -> None:
    async with FakeSlack() as fake:
        channel = SlackChannel(
            SlackSettings(api_url=fake.api_url), SlackTokens(bot="xoxb-wrong", app=APP_TOKEN)
        )
        problems = await channel.problems()
    assert problems == [
        "Slack rejected the bot token in $KAIWA_SLACK_BOT_TOKEN (invalid_auth): copy it again "
        "from your app's settings"
    ]


async def test_socket_mode_without_an_app_token_says_what_to_do() -> None:
    async with FakeSlack() as fake:
        channel = SlackChannel(SlackSettings(api_url=fake.api_url), SlackTokens(bot=BOT_TOKEN))
        problems = await channel.problems()
    assert problems == [
        "Slack Socket Mode needs an app-level token (xapp-..., with connections:write) in "
        '$KAIWA_SLACK_APP_TOKEN, or set [channels.slack].mode = "http"'
    ]


async def test_an_unreachable_slack_is_one_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/api/"
    channel = SlackChannel(SlackSettings(api_url=url), SlackTokens(bot=BOT_TOKEN, app=APP_TOKEN))
    (problem,) = await channel.problems()
    assert problem.startswith(f"cannot reach Slack at {url} (")
    assert problem.endswith("check the network and [channels.slack].api_url")


def envelope_of(fake: FakeSlack, ts: str) -> str:
    (envelope,) = [
        envelope
        for envelope in fake.envelopes
        if envelope.get("payload", {}).get("event", {}).get("ts") == ts
    ]
    return str(envelope["envelope_id"])


async def test_an_event_is_acknowledged_only_once_its_message_is_recorded(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    """Not recorded, the event is not acknowledged, so Slack delivers it again; the retry after
    the database is back is recorded, acknowledged and answered."""
    store = await open_store(outage.url, IMPATIENT, closing)
    async with slack_platform(make_bot, store=store) as slack:
        fake = slack.fake
        slack.bot.ollama.script(Text("Here after all."))
        outage.begin()
        ts = fake.dm(DM, "hello", user=ANN_ID)
        envelope = envelope_of(fake, ts)
        await outage.log.line_with("left for the platform to deliver again")
        assert envelope not in {ack.envelope_id for ack in fake.acks}
        outage.end()

        fake.redeliver(envelope)
        await fake.wait_until(lambda: fake.posted(DM), what="the reply")
        await fake.wait_until(
            lambda: envelope in {ack.envelope_id for ack in fake.acks}, what="the ack"
        )
    assert [posted.text for posted in fake.posted(DM)] == ["Here after all."]


async def test_on_slacks_last_retry_the_person_is_asked_to_send_it_again(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    store = await open_store(outage.url, IMPATIENT, closing)
    async with slack_platform(make_bot, store=store) as slack:
        fake = slack.fake
        outage.begin()
        envelope = envelope_of(fake, fake.dm(DM, "hello", user=ANN_ID))
        for attempt in range(1, 4):  # the first delivery and Slack's first two retries
            await outage.log.line_with("left for the platform to deliver again", attempt)
            fake.redeliver(envelope)
        await fake.wait_until(lambda: fake.posted(DM), what="the notice")
        outage.end()
    (notice,) = [posted.text for posted in fake.posted(DM)]
    assert notice.startswith("I could not save your message")


def socket_mode_channel(fake: FakeSlack) -> SlackChannel:
    settings = SlackSettings(api_url=fake.api_url, edit_interval=0.05)
    return SlackChannel(settings, SlackTokens(bot=BOT_TOKEN, app=APP_TOKEN))


async def test_a_start_asks_slack_for_a_socket_mode_url_once(make_bot: BotFactory) -> None:
    """Regression: `kaiwa run` asked `apps.connections.open` in its checks, then again to
    connect."""
    async with FakeSlack() as fake:
        channel = socket_mode_channel(fake)
        assert await channel.problems() == []
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        async with running(channel, bot):
            await fake.wait_connected(1)
            await asyncio.wait_for(channel.connected.wait(), deadline())
    assert fake.connections_opened == 1


async def test_a_refused_socket_mode_url_is_a_problem_and_no_connection(
    make_bot: BotFactory,
) -> None:
    """Regression: with `apps.connections.open` refused, Kaiwa said it was ready, never said
    Slack was not connected, took 10 s to stop and left sessions unclosed."""
    async with FakeSlack() as fake:
        fake.refuse("apps.connections.open", "invalid_auth")
        channel = socket_mode_channel(fake)
        (problem,) = await channel.problems()
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        with pytest.raises(ChannelError) as raised:
            await asyncio.wait_for(channel.run(bot.dispatcher.handle), deadline())
        await channel.close()
    assert str(raised.value) == problem == channel.problem
    assert problem.startswith("Slack rejected the app-level token in $KAIWA_SLACK_APP_TOKEN")
    assert not channel.connected.is_set()
    gc.collect()  # a session left open warns here, and warnings fail the test


async def test_stopping_while_the_socket_cannot_connect_is_prompt(
    make_bot: BotFactory,
) -> None:
    async with FakeSlack() as fake:
        fake.sockets_refused = True
        settings = SlackSettings(api_url=fake.api_url, edit_interval=0.05)
        pause = 4 * deadline()  # the library's pause between tries, which a stop cuts short
        channel = SlackChannel(settings, SlackTokens(BOT_TOKEN, APP_TOKEN), socket_ping=pause)
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
        await fake.wait_until(lambda: fake.refused_sockets >= 1, what="a refused socket")
        assert not channel.connected.is_set()
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await channel.close()
    gc.collect()  # a session left open warns here, and warnings fail the test


async def test_a_rate_limit_at_start_is_waited_out_and_said_meanwhile(
    make_bot: BotFactory,
) -> None:
    """Regression: a 429 on `apps.connections.open` at start exited with "it is tried again",
    and nothing tried again."""
    async with FakeSlack() as fake:
        fake.fail_next("apps.connections.open", retry_after=0.3)
        channel = socket_mode_channel(fake)
        assert await channel.problems() == [], "a rate limit is nobody's mistake"
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        bot.ollama.script(Text("Connected after all."))
        async with running(channel, bot):
            await fake.wait_connected(1)
            fake.dm(DM, "hello", user=ANN_ID)
            await fake.wait_until(lambda: fake.posted(DM), what="the reply")
    assert [posted.text for posted in fake.posted(DM)] == ["Connected after all."]
    assert channel.problem is None


@pytest.mark.parametrize("error", ["", "fatal_error"], ids=["http-500-page", "fatal-error"])
async def test_a_slack_server_error_at_start_is_not_called_a_token_problem(
    make_bot: BotFactory, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: `auth.test` answering HTTP 500 (or `fatal_error`) was reported as "Slack
    rejected the bot token … copy it again". A server error is said as one, the start goes on,
    and `run` raises a `PlatformError` (tried again with backoff), then connects."""
    async with FakeSlack() as fake:
        fake.fail_next("auth.test", error=error, status=500, times=2)
        channel = socket_mode_channel(fake)
        assert await channel.problems() == []
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        with pytest.raises(PlatformError) as raised:
            await asyncio.wait_for(channel.run(bot.dispatcher.handle), deadline())
        async with running(channel, bot):
            await fake.wait_connected(1)
    said = f"Slack had a server error answering auth.test (HTTP 500{', ' + error if error else ''})"
    assert str(raised.value) == f"{said}; it is tried again"
    assert "token" not in caplog.text and "token" not in str(raised.value)
    assert f"{said}; it is tried again (Slack's trouble, not the settings" in caplog.text


async def test_a_socket_that_keeps_failing_is_one_line_per_cause_without_tracebacks(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: while Socket Mode refused connections, Kaiwa said only "still trying", and
    slack_sdk logged why with a 48-line traceback at every try, on stderr too."""
    caplog.set_level(logging.INFO)
    async with FakeSlack() as fake:
        fake.sockets_refused = True
        settings = SlackSettings(api_url=fake.api_url, edit_interval=0.05)
        channel = SlackChannel(settings, SlackTokens(BOT_TOKEN, APP_TOKEN), socket_ping=0.05)
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED)
        reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
        await fake.wait_until(lambda: fake.refused_sockets >= 4, what="four refused sockets")
        problem = channel.problem
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await channel.close()
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [f"Slack: {problem}"], "one line for one cause"
    assert problem is not None and "Socket Mode connection failed (Slack answered HTTP 503)" in (
        problem
    )
    assert "ticket=" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]


SHORTCUT = {
    "type": "shortcut",
    "token": "verification-token",
    "action_ts": "1700000001.000200",
    "team": {"id": TEAM, "domain": "example"},
    "user": {"id": ANN_ID, "username": "ann", "team_id": TEAM},
    "is_enterprise_install": False,
    "callback_id": "summarize_everything",
    "trigger_id": "1700000001.1.abc",
}
MESSAGE_SHORTCUT = {
    **SHORTCUT,
    "type": "message_action",
    "callback_id": "save_message",
    "message_ts": "1700000000.000100",
    "channel": {"id": ROOM, "name": "general"},
    "message": {"type": "message", "user": ANN_ID, "ts": "1700000000.000100", "text": "hi"},
    "response_url": "https://hooks.slack.com/app/T1/1/abc",
}
SOMEONE_ELSES_BUTTON = {
    "type": "block_actions",
    "team": {"id": TEAM, "domain": "example"},
    "user": {"id": ANN_ID, "username": "ann", "team_id": TEAM},
    "api_app_id": "A1",
    "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": ROOM},
    "trigger_id": "1700000001.2.def",
    "channel": {"id": ROOM, "name": "general"},
    "actions": [
        {
            "type": "button",
            "action_id": "approve_request",
            "block_id": "b1",
            "value": "42",
            "action_ts": "1700000001.000300",
        }
    ],
}


async def test_envelopes_kaiwa_does_not_offer_are_acknowledged_and_logged_once(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: Slack's sample shortcut, message shortcut and button envelopes were never
    acknowledged, so Slack showed the person an error and sent them again."""
    caplog.set_level(logging.INFO)
    async with slack_platform(make_bot) as slack:
        fake = slack.fake
        sent = [
            fake.deliver("interactive", SHORTCUT),
            fake.deliver("interactive", MESSAGE_SHORTCUT),
            fake.deliver("interactive", SOMEONE_ELSES_BUTTON),
            fake.deliver("interactive", SHORTCUT),
            fake.slash_command("/ask-kaiwa", "", channel=ROOM, user=ANN_ID),
        ]
        acked = lambda: {ack.envelope_id for ack in fake.acks}  # noqa: E731
        await fake.wait_until(lambda: set(sent) <= acked(), what="every envelope acknowledged")
    logged = [r.getMessage() for r in caplog.records if "Kaiwa does not offer" in r.getMessage()]
    assert [line.split(",")[0] for line in logged] == [
        "Slack sent the global shortcut 'summarize_everything'",
        "Slack sent the message shortcut 'save_message'",
        "Slack sent a press of a button Kaiwa did not make (approve_request)",
    ], "once per kind"
    (usage,) = [ack.payload for ack in fake.acks if ack.envelope_id == sent[-1]]
    assert "/ask-kaiwa stop <thread link>" in str(usage), "any slash command of the app is Kaiwa's"
    assert fake.posted(ROOM) == [] and slack.bot.ollama.requests == []


async def test_http_mode_answers_a_body_it_cannot_read_with_400(make_bot: BotFactory) -> None:
    """Regression: a signed body that was not JSON got 500, which Slack retries."""
    async with FakeSlack() as fake, over_http(make_bot, fake) as (_, url):
        garbled = await fake.post_raw(url, '{"type": "event_callback", ')
        listed = await fake.post_raw(url, "[1, 2]")
    assert garbled[0] == 400 and listed[0] == 400


async def test_http_mode_takes_a_stop_button_press_too(make_bot: BotFactory) -> None:
    async with FakeSlack() as fake, over_http(make_bot, fake) as (bot, url):
        bot.ollama.script(Text("Half"), Pause("half"), Text(" never"))
        fake.events_url = url
        fake.dm(DM, "go", user=ANN_ID)
        await fake.wait_until(lambda: fake.posted(DM), what="the partial reply")
        (live,) = fake.posted(DM)
        fake.press_button(DM, live.ts, payload(STOP), user=ANN_ID)
        await fake.wait_until(lambda: fake.ephemeral, what="the answer")
    assert [said.text for said in fake.ephemeral] == ["Stopped."]
    assert [posted.text for posted in fake.posted(DM)] == ["Half (stopped)"]


async def test_a_name_is_asked_once_and_without_the_scope_the_member_id_stands_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: Slack showed member ids where names belong ("UHUMAN01 allowed it once")."""
    async with FakeSlack() as fake:
        fake.person("U7", display_name="", real_name="Ann Example")
        names = DisplayNames(AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url))
        assert [await names.of("U7"), await names.of("U7")] == ["Ann Example"] * 2
        assert len(fake.calls_to("users.info")) == 1, "remembered"

        fake.refuse("users.info", "missing_scope")
        assert [await names.of("U8"), await names.of("U9")] == ["U8", "U9"]
        await names.close()
    (said,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said.startswith("Slack: no name for U8, its member id stands in: Slack refused")
    assert "give the app the users:read scope" in said
