"""Telegram beyond the shared conformance suite: what only Telegram has, through the real
python-telegram-bot against the fake Bot API and the fake Ollama."""

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from fpdf import FPDF

from channels.calls import PlatformError
from channels.places import TelegramPlace
from channels.presses import STOP, payload
from channels.settings import TelegramSettings
from channels.telegram.channel import TelegramChannel
from core.channel import COMMANDS, Attachment, AttachmentKind, ChannelMessage, Frame, Outcome
from core.errors import ChannelError, DownloadError
from core.store import Store
from tests.channels.platforms import ALLOWED, ANN, BOB, MALLORY, running, telegram_platform
from tests.databases import IMPATIENT, Outage, open_store
from tests.fakes.ollama import Pause, Text
from tests.fakes.patience import deadline
from tests.fakes.telegram import BOT_TOKEN, QUERY_GONE, FakeTelegram
from tests.fakes.voice import spoken_note
from tests.harness import BotFactory

GROUP = -100500
MIB = 1024 * 1024
MENTION = "@kaiwa_test_bot"


def mention_in_group(fake: FakeTelegram, text: str) -> None:
    """Ann writes in the group, mentioning the bot first."""
    entity = {"type": "mention", "offset": 0, "length": len(MENTION)}
    fake.user_message(GROUP, f"{MENTION} {text}", user_id=ANN, chat_type="group", entities=[entity])


async def test_start_up_registers_the_commands_and_a_reply_shows_typing_first(
    make_bot: BotFactory,
) -> None:
    async with telegram_platform(make_bot) as telegram:
        fake = telegram.fake
        telegram.bot.ollama.script(Pause("slow"), Text("Here."))
        telegram.say(ANN, "hi")
        await fake.wait_until(lambda: fake.calls_to("sendChatAction"), what="typing")
        telegram.bot.ollama.release("slow")
        await telegram.wait_until(lambda: telegram.shown(ANN) == ["Here."], "the reply")

    assert fake.commands == [{"command": name, "description": text} for name, text in COMMANDS]
    methods = [call.method for call in fake.calls if call.method != "getUpdates"]
    assert methods.index("sendChatAction") < methods.index("sendMessage")
    assert fake.calls_to("sendChatAction")[0].params["action"] == "typing"


async def test_the_reply_answers_the_persons_message(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        telegram.bot.ollama.script(Text("Answer."))
        asked = telegram.say(ANN, "question")
        await telegram.wait_until(lambda: telegram.shown(ANN) == ["Answer."], "the reply")
        (reply,) = telegram.fake.sent(ANN)
    assert reply.reply_to == int(asked)


async def test_a_9000_character_reply_with_code_across_the_limit_is_three_intact_messages(
    make_bot: BotFactory,
) -> None:
    prose = "Some explanation before the code, in plain words. " * 50
    code = "\n".join(f"total = total + {n}  # add the next number" for n in range(100))
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}"
    assert 8500 < len(answer) < 9500
    async with telegram_platform(make_bot) as telegram:
        telegram.bot.ollama.script(Text(answer, chunks=30))
        telegram.say(ANN, "explain")
        await telegram.wait_until(
            lambda: "".join(telegram.shown(ANN)).count("Some explanation") == 100, "all of it"
        )
        first, second, third = telegram.fake.sent(ANN)
    assert first.text.endswith("</code></pre>"), "the block is closed where the message ends"
    assert second.text.startswith('<pre><code class="language-python">'), "and reopened"
    assert all(m.parse_mode == "HTML" for m in (first, second, third))
    shown = "".join(m.visible for m in (first, second, third))
    assert shown.count("total = total +") == 100
    assert await telegram.bot.assistant_text(telegram.place(ANN)) == answer


async def test_two_chats_stream_at_the_same_time(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        ollama = telegram.bot.ollama
        ollama.script(Text("Ann, part one"), Pause("ann"), Text(", part two."))
        ollama.script(Text("Bob, part one"), Pause("bob"), Text(", part two."))
        telegram.say(ANN, "hello")
        await telegram.wait_until(lambda: telegram.shown(ANN), "Ann's first part")
        telegram.say(BOB, "hello")

        await telegram.wait_until(
            lambda: (
                telegram.shown(ANN) == ["Ann, part one"]
                and telegram.shown(BOB) == ["Bob, part one"]
            ),
            "both replies streaming at once",
        )
        ollama.release("bob")
        ollama.release("ann")
        await telegram.wait_until(
            lambda: (
                telegram.shown(ANN) == ["Ann, part one, part two."]
                and telegram.shown(BOB) == ["Bob, part one, part two."]
            ),
            "both replies complete",
        )


async def test_a_429_storm_delays_but_loses_nothing(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        fake, ollama = telegram.fake, telegram.bot.ollama
        ollama.script(Text("Storm"), Pause("storm"), Text(" over, every word kept."))
        telegram.say(ANN, "go")
        await telegram.wait_until(lambda: telegram.shown(ANN) == ["Storm"], "the first part")
        fake.fail_next("editMessageText", retry_after=1, times=2)
        ollama.release("storm")

        await telegram.wait_until(
            lambda: telegram.shown(ANN) == ["Storm over, every word kept."], "the whole reply"
        )
    edits = fake.calls_to("editMessageText")
    refused = [index for index, call in enumerate(edits) if call.error is not None]
    assert len(refused) == 2
    for index in refused:
        assert edits[index + 1].at - edits[index].at >= 0.99, "the next try waited as asked"
    assert await telegram.bot.assistant_text(telegram.place(ANN)) == "Storm over, every word kept."


async def test_formatting_telegram_rejects_is_sent_as_plain_text(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        fake = telegram.fake
        fake.fail_next(
            "sendMessage",
            status=400,
            description="Bad Request: can't parse entities: unsupported start tag at byte offset 3",
        )
        telegram.bot.ollama.script(Text("**Bold** claim."))
        telegram.say(ANN, "go")
        await telegram.wait_until(lambda: telegram.shown(ANN), "the reply")
        (message,) = fake.sent(ANN)
    assert message.parse_mode is None
    assert message.visible == "**Bold** claim."


async def test_a_restart_does_not_answer_a_redelivered_message_again(
    make_bot: BotFactory,
) -> None:
    async with FakeTelegram() as fake:
        async with telegram_platform(make_bot, fake=fake) as first:
            first.bot.ollama.script(Text("Answered once."))
            first.say(ANN, "hello")
            await first.wait_until(lambda: first.shown(ANN) == ["Answered once."], "the reply")
            original = dict(fake.sent(ANN)[0].__dict__)
        async with telegram_platform(make_bot, fake=fake) as second:
            user_message_id = original["reply_to"]
            second.say_again(ANN, str(user_message_id))
            second.say(ANN, "/usage")
            await second.wait_until(lambda: len(second.shown(ANN)) == 2, "the /usage answer")
    assert len(first.bot.ollama.requests) == 1, "the redelivered message reached no model"
    assert second.shown(ANN)[1].startswith("Usage of this conversation (1 turn)")


async def test_a_wrong_token_is_named_at_start_up(make_bot: BotFactory) -> None:
    async with FakeTelegram() as fake:
        settings = TelegramSettings(base_url=fake.base_url, base_file_url=fake.base_file_url)
        channel = TelegramChannel(settings, "999:wrong")
        problems = await channel.problems()
        with pytest.raises(ChannelError, match=r"rejected the bot token in \$KAIWA_TELEGRAM_TOKEN"):
            await channel.run(make_bot(channel=channel).dispatcher.handle)
        await channel.close()
    assert problems == [
        "Telegram rejected the bot token in $KAIWA_TELEGRAM_TOKEN (401 Unauthorized): copy the "
        "token @BotFather gave you into that variable"
    ]


async def test_group_chats_are_ignored_unless_enabled(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        telegram.fake.user_message(GROUP, "@kaiwa_test_bot hello", user_id=ANN, chat_type="group")
        telegram.say(ANN, "/help")
        await telegram.wait_until(lambda: telegram.shown(ANN), "the /help answer")
    assert telegram.fake.sent(GROUP) == []
    assert telegram.bot.ollama.requests == []


async def test_in_enabled_groups_only_mentions_and_replies_are_answered(
    make_bot: BotFactory,
) -> None:
    async with telegram_platform(make_bot, groups=True) as telegram:
        fake, ollama = telegram.fake, telegram.bot.ollama
        ollama.script(Text("You called?"))
        ollama.script(Text("Replying to your reply."))
        fake.user_message(GROUP, "just chatting", user_id=ANN, chat_type="group")
        mention_in_group(fake, "what time is it")
        await telegram.wait_until(lambda: telegram.shown(GROUP) == ["You called?"], "answer")
        answer = fake.sent(GROUP)[0].message_id
        fake.user_message(
            GROUP, "and tomorrow?", user_id=BOB, chat_type="group", reply_to_bot_message=answer
        )
        await telegram.wait_until(lambda: len(telegram.shown(GROUP)) == 2, "the second answer")
    asked = [request["messages"][-1]["content"] for request in ollama.requests]
    assert asked == ["what time is it", "and tomorrow?"]


async def test_in_a_group_anyone_allowed_may_press_stop_and_a_stranger_is_told_alone(
    make_bot: BotFactory,
) -> None:
    """A group's Stop button is in front of everyone: a stranger's press is refused, to them
    alone, and stops nothing (pressing again, they are not told again; that press's answer,
    which Telegram refuses as too old, is only logged); Bob (allowed, though Ann asked) stops
    the reply."""
    async with telegram_platform(make_bot, groups=True) as telegram:
        fake, ollama = telegram.fake, telegram.bot.ollama
        ollama.script(Text("A long answer"), Pause("long"), Text(" that goes on"))
        mention_in_group(fake, "explain everything")
        await telegram.wait_until(lambda: telegram.shown(GROUP) == ["A long answer"], "stream")
        await telegram.wait_until(lambda: telegram.has_stop_button(GROUP), "the Stop button")

        telegram.press_stop(GROUP, user=MALLORY)
        await telegram.wait_until(lambda: telegram.told_privately(GROUP), "the refusal")
        (refusal,) = telegram.told_privately(GROUP)
        assert "not allowed" in refusal and str(MALLORY) in refusal
        assert telegram.shown(GROUP) == ["A long answer"] and telegram.has_stop_button(GROUP)
        fake.fail_next("answerCallbackQuery", status=400, description=QUERY_GONE)
        telegram.press_stop(GROUP, user=MALLORY)
        await fake.wait_until(lambda: len(fake.calls_to("answerCallbackQuery")) == 2)
        assert fake.calls_to("answerCallbackQuery")[1].error is not None

        telegram.press_stop(GROUP, user=BOB)
        await telegram.wait_until(lambda: "Stopped." in telegram.told_privately(GROUP), "stop")
    assert telegram.shown(GROUP) == ["A long answer (stopped)"]
    assert not telegram.has_stop_button(GROUP)
    assert (await telegram.bot.turns(telegram.place(GROUP)))[-1].status == "stopped"


async def test_an_answer_too_long_for_a_press_goes_to_the_chat() -> None:
    """Telegram shows at most 200 characters as a press's answer: a longer one is sent in the
    chat instead, and the press is still answered."""
    notice = "A notice much longer than Telegram lets a button's answer be. " * 4
    place = TelegramPlace(ANN).key

    async with FakeTelegram() as fake:
        channel = channel_on(fake, poll_timeout=1, edit_interval=0.05)

        async def deliver(message: ChannelMessage) -> None:
            await channel.notify(message.place, notice)

        reading = asyncio.create_task(channel.run(deliver))
        await fake.wait_until(lambda: fake.calls_to("getUpdates"), what="a poll")
        reply = channel.open_reply(place, None)
        await reply.update(Frame("Working"))
        await fake.wait_until(
            lambda: fake.sent(ANN) and fake.sent(ANN)[0].buttons, what="the Stop button"
        )
        (live,) = fake.sent(ANN)
        fake.press_button(ANN, live.message_id, payload(STOP))
        await fake.wait_until(lambda: len(fake.sent(ANN)) == 2, what="the notice")
        await fake.wait_until(lambda: fake.callback_answers, what="the press answered")
        await reply.finish("Working", Outcome.STOPPED, None)
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await channel.close()
    assert fake.sent(ANN)[1].visible == notice
    assert [answer.text for answer in fake.callback_answers.values()] == [None]


async def test_a_photo_with_a_caption_reaches_a_vision_model(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot, vision=True) as telegram:
        telegram.bot.ollama.script(Text("A red square."))
        telegram.fake.user_photo(ANN, caption="what is this?", file_bytes=b"red-square-bytes")
        await telegram.wait_until(lambda: telegram.shown(ANN) == ["A red square."], "the reply")
    sent = telegram.bot.ollama.requests[0]["messages"][-1]
    assert sent["content"] == "what is this?"
    assert sent["images"] == [base64.b64encode(b"red-square-bytes").decode()]


async def test_a_photo_for_a_model_without_vision_is_explained(make_bot: BotFactory) -> None:
    async with telegram_platform(make_bot) as telegram:
        telegram.fake.user_photo(ANN, caption="what is this?")
        await telegram.wait_until(lambda: telegram.shown(ANN), "the explanation")
    assert "does not read them" in telegram.shown(ANN)[0]
    assert telegram.bot.ollama.requests == []


async def test_a_message_is_confirmed_to_telegram_only_once_it_is_recorded(
    make_bot: BotFactory, outage: Outage, closing: list[Store]
) -> None:
    """While the database is away, the update stays unconfirmed, so Telegram keeps it; once the
    database is back, the same update is fetched again and answered."""
    store = await open_store(outage.url, IMPATIENT, closing)
    async with telegram_platform(make_bot, store=store) as telegram:
        fake = telegram.fake
        telegram.bot.ollama.script(Text("Recorded, then answered."))
        outage.begin()
        update = fake.user_message(ANN, "hello", user_id=ANN)["update_id"]
        await fake.wait_until(
            lambda: fake.handed_out.count(update) >= 2, what="the update fetched again"
        )
        assert fake.confirmed_offset <= update
        assert telegram.shown(ANN) == []
        outage.end()
        await telegram.wait_until(
            lambda: telegram.shown(ANN) == ["Recorded, then answered."], "the reply"
        )
        await fake.wait_until(lambda: fake.confirmed_offset > update, what="the confirmation")


def channel_on(fake: FakeTelegram, **settings: Any) -> TelegramChannel:
    return TelegramChannel(
        TelegramSettings(base_url=fake.base_url, base_file_url=fake.base_file_url, **settings),
        BOT_TOKEN,
    )


async def test_an_unreadable_update_is_one_line_confirmed_and_skipped(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: an update python-telegram-bot could not parse was never confirmed, so it was
    fetched again hundreds of times a second, each time with a traceback, and every message
    behind it waited."""
    async with telegram_platform(make_bot) as telegram:
        fake = telegram.fake
        telegram.bot.ollama.script(Text("Still here."))
        unreadable = [  # no date, no sender: the library cannot parse them
            fake.push_update({"message": {"message_id": 500 + n, "chat": {"id": ANN}}})
            for n in range(3)
        ]
        telegram.say(ANN, "hello")
        await telegram.wait_until(lambda: telegram.shown(ANN) == ["Still here."], "the reply")
        last = unreadable[-1]["update_id"]
        await fake.wait_until(lambda: fake.confirmed_offset > last, what="the confirmation")
    (line,) = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert line.getMessage().startswith(f"Telegram update {unreadable[0]['update_id']} could not")
    assert line.exc_info is None, "one line, no traceback"
    assert all(fake.handed_out.count(update["update_id"]) == 1 for update in unreadable)


async def test_a_sticker_is_handed_over_without_text_and_gets_a_hint(
    make_bot: BotFactory,
) -> None:
    async with telegram_platform(make_bot) as telegram:
        telegram.fake.user_sticker(ANN)
        await telegram.wait_until(lambda: telegram.shown(ANN), "the hint")
    (hint,) = telegram.shown(ANN)
    assert "Ask me something" in hint
    assert telegram.bot.ollama.requests == []


async def test_while_polls_fail_the_channel_is_not_connected_and_says_why(
    make_bot: BotFactory,
) -> None:
    async with telegram_platform(make_bot) as telegram:
        fake, channel = telegram.fake, telegram.bot.channel
        assert channel.connected.is_set() and channel.problem is None
        fake.fail_next("getUpdates", status=502, description="Bad Gateway")
        await fake.wait_until(lambda: channel.problem is not None, what="the problem")
        assert not channel.connected.is_set()
        assert channel.problem.startswith(f"cannot reach Telegram at {fake.base_url} (")
        await fake.wait_until(
            lambda: channel.connected.is_set() and channel.problem is None, what="a good poll"
        )


async def test_stopping_returns_at_once_and_leaves_the_long_poll_in_flight(
    make_bot: BotFactory,
) -> None:
    """Regression: stopping cancelled the long poll in flight (with httpx, that can leave its
    pooled connection taken for good); now it is left to end with the connections."""
    async with FakeTelegram() as fake:
        channel = channel_on(fake, poll_timeout=30)
        bot = make_bot(channel=channel, allowed=ALLOWED)
        reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
        await fake.wait_until(lambda: fake.holds.in_flight("getupdates") == 1, what="a poll")
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        assert fake.holds.in_flight("getupdates") == 1 and fake.holds.abandoned == []
        assert not channel.connected.is_set()
        await bot.runner.shutdown()
        await asyncio.wait_for(channel.close(), deadline())


async def test_run_starts_again_after_it_failed(make_bot: BotFactory) -> None:
    async with FakeTelegram() as fake:
        fake.fail_next("getMe", status=502, description="Bad Gateway")
        channel = channel_on(fake, poll_timeout=1, edit_interval=0.05)
        bot = make_bot(channel=channel, allowed=ALLOWED)
        with pytest.raises(PlatformError, match="cannot reach Telegram"):
            await channel.run(bot.dispatcher.handle)
        assert channel.problem is not None and not channel.connected.is_set()

        bot.ollama.script(Text("Back again."))
        async with running(channel, bot):
            fake.user_message(ANN, "hello")
            await fake.wait_until(lambda: [m.visible for m in fake.sent(ANN)] == ["Back again."])
        assert channel.problem is None


async def test_webhook_mode_answers_posted_updates_and_refuses_a_wrong_secret(
    make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telegram posts updates to every worker behind a load balancer: an update is answered
    once whichever worker gets it, a post without the registered secret changes nothing."""
    monkeypatch.setenv("KAIWA_TELEGRAM_WEBHOOK_SECRET", "s3cret")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with FakeTelegram() as fake:
        settings = TelegramSettings(
            base_url=fake.base_url,
            base_file_url=fake.base_file_url,
            edit_interval=0.05,
            mode="webhook",
            webhook_url="https://kaiwa.example/telegram",
            webhook_port=port,
        )
        channel = TelegramChannel(settings, BOT_TOKEN)
        bot = make_bot(channel=channel, allowed=ALLOWED)
        bot.ollama.script(Text("Over the webhook."))
        url = f"http://127.0.0.1:{port}/telegram"
        async with running(channel, bot):
            await asyncio.wait_for(channel.connected.wait(), deadline())
            update = {"update_id": 900_001, **fake.text_update(ANN, "hello", user_id=ANN)}
            forged = await fake.post_update(url, update, "wrong")
            accepted = await fake.post_update(url, update, "s3cret")
            again = await fake.post_update(url, update, "s3cret")  # Telegram retries
            await fake.wait_until(
                lambda: [m.visible for m in fake.sent(ANN)] == ["Over the webhook."],
                what="the reply",
            )
    assert fake.webhook == {"url": "https://kaiwa.example/telegram", "secret": "s3cret"}
    assert (forged, accepted, again) == (401, 200, 200)
    assert len(bot.ollama.requests) == 1, "answered once"


# --- files people attach ---


@contextlib.asynccontextmanager
async def listening(
    fake: FakeTelegram, token: str = BOT_TOKEN, **settings: Any
) -> AsyncIterator[tuple[TelegramChannel, list[ChannelMessage]]]:
    """A Telegram channel receiving from `fake` into the list it yields (no core behind it)."""
    channel = TelegramChannel(
        TelegramSettings(
            base_url=fake.base_url, base_file_url=fake.base_file_url, poll_timeout=1, **settings
        ),
        token,
    )
    messages: list[ChannelMessage] = []

    async def deliver(message: ChannelMessage) -> None:
        messages.append(message)

    reading = asyncio.create_task(channel.run(deliver))
    try:
        yield channel, messages
    finally:
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await channel.close()


async def arrived(fake: FakeTelegram, messages: list[ChannelMessage], count: int) -> None:
    await fake.wait_until(lambda: len(messages) == count, what=f"{count} messages delivered")


def small_pdf() -> bytes:
    document = FPDF()
    document.set_font("helvetica", size=12)
    document.add_page()
    document.multi_cell(0, 6, "Section 3: the budget is 300 euros.")
    return bytes(document.output())


def file_id(update: dict[str, Any], kind: str) -> str:
    return str(update["message"][kind]["file_id"])


async def refused(
    channel: TelegramChannel,
    attachment: Attachment,
    limit: int,
    caplog: pytest.LogCaptureFixture,
) -> str:
    """What the download of `attachment` was refused with; the refusal is logged in one line,
    and the bot token is in neither."""
    caplog.clear()
    with pytest.raises(DownloadError) as refusal:
        await channel.download(attachment, limit)
    (line,) = [record for record in caplog.records if "not downloaded" in record.getMessage()]
    assert BOT_TOKEN not in str(refusal.value) and BOT_TOKEN not in line.getMessage()
    assert BOT_TOKEN.split(":")[1] not in caplog.text
    return str(refusal.value)


async def test_each_kind_of_file_arrives_as_an_attachment_with_its_fields() -> None:
    note = spoken_note("testing one two", seconds=2)
    async with FakeTelegram() as fake, listening(fake) as (_, messages):
        voice = fake.user_file(ANN, note, kind="voice", seconds=2)
        circle = fake.user_file(ANN, b"mp4 circle", kind="video_note", seconds=9)
        song = fake.user_file(
            ANN, b"ID3 song", kind="audio", name="song.mp3", mime="audio/mpeg", seconds=61
        )
        report = fake.user_file(
            ANN, b"%PDF report", name="report.pdf", mime="application/pdf", caption="section 3?"
        )
        notes = fake.user_file(ANN, b"# Notes", name="notes.md")  # no mime_type: inferred
        await arrived(fake, messages, 5)

    assert [m.text for m in messages] == ["", "", "", "section 3?", ""]
    assert all(m.images == () for m in messages)
    assert [m.attachments for m in messages] == [
        (Attachment("voice note.ogg", "audio/ogg", file_id(voice, "voice"),
                    AttachmentKind.VOICE, len(note), 2.0),),
        (Attachment("video note.mp4", "video/mp4", file_id(circle, "video_note"),
                    AttachmentKind.VOICE, 10, 9.0),),
        (Attachment("song.mp3", "audio/mpeg", file_id(song, "audio"),
                    AttachmentKind.AUDIO, 8, 61.0),),
        (Attachment("report.pdf", "application/pdf", file_id(report, "document"),
                    AttachmentKind.FILE, 11),),
        (Attachment("notes.md", "text/markdown", file_id(notes, "document"),
                    AttachmentKind.FILE, 7),),
    ]  # fmt: skip


async def test_a_voice_note_and_a_pdf_download_to_their_exact_bytes() -> None:
    note, document = spoken_note("what does section three say", seconds=3), small_pdf()
    async with FakeTelegram() as fake, listening(fake) as (channel, messages):
        fake.user_file(ANN, note, kind="voice", seconds=3)
        fake.user_file(ANN, document, name="budget.pdf", mime="application/pdf")
        await arrived(fake, messages, 2)
        (voice,), (pdf,) = [message.attachments for message in messages]
        downloaded = [await channel.download(each, 20 * MIB) for each in (voice, pdf)]
    assert downloaded == [note, document]
    assert note.startswith(b"OggS") and document.startswith(b"%PDF")


async def test_a_picture_sent_as_a_document_is_an_image_and_one_past_20_mb_is_said() -> None:
    picture = b"\x89PNG\r\n\x1a\n not decoded"
    async with FakeTelegram() as fake, listening(fake) as (_, messages):
        fake.user_file(ANN, picture, name="chart.png", mime="image/png", caption="and this?")
        huge = fake.user_file(ANN, b"...", name="scan.tiff", mime="image/tiff", file_size=25 * MIB)
        await arrived(fake, messages, 2)
    shown, too_big = messages
    assert (shown.text, shown.images, shown.attachments) == ("and this?", (picture,), ())
    assert too_big.images == ()
    assert too_big.attachments == (
        Attachment(
            "scan.tiff",
            "image/tiff",
            file_id(huge, "document"),
            size=25 * MIB,
            unavailable="Telegram lets bots download files up to 20 MB, and scan.tiff is 25 MB: "
            "send a smaller file, or a link to it",
        ),
    )
    assert fake.downloaded == ["documents/file_1.png"], "the large one was never fetched"


async def test_a_photo_that_cannot_be_fetched_arrives_saying_why() -> None:
    async with FakeTelegram() as fake, listening(fake) as (_, messages):
        fake.fail_next("getFile", status=502, description="Bad Gateway")
        fake.user_photo(ANN, caption="look")
        await arrived(fake, messages, 1)
    ((photo,),) = [message.attachments for message in messages]
    assert (messages[0].text, messages[0].images, photo.name) == ("look", (), "photo.jpg")
    assert photo.unavailable.startswith("Kaiwa could not reach Telegram to fetch photo.jpg")


async def test_a_file_past_the_bot_apis_20_mb_is_unavailable_and_never_asked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    words = (
        "Telegram lets bots download files up to 20 MB, and big.zip is 34.5 MB: send a smaller "
        "file, or a link to it"
    )
    async with FakeTelegram() as fake, listening(fake) as (channel, messages):
        update = fake.user_file(ANN, b"not all of it", name="big.zip", file_size=36_175_872)
        await arrived(fake, messages, 1)
        ((attachment,),) = [message.attachments for message in messages]
        before = await refused(channel, attachment, 100 * MIB, caplog)
        unstated = replace(attachment, size=None, unavailable="")  # Telegram's own refusal
        after = await refused(channel, unstated, 100 * MIB, caplog)
    assert attachment.unavailable == before == words
    assert after == words.replace("is 34.5 MB", "is larger")
    assert [call.params["file_id"] for call in fake.calls_to("getFile")] == [
        file_id(update, "document")
    ]
    assert fake.calls_to("getFile")[0].error is not None


async def test_past_the_limit_is_refused_before_or_while_downloading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stated size past the limit is refused before anything is fetched; a file that runs
    past it anyway (its size stated too small, or not at all) is given up while streaming."""
    async with FakeTelegram() as fake, listening(fake) as (channel, messages):
        fake.user_file(ANN, b"x" * 3000, name="log.txt", mime="text/plain")
        fake.user_file(ANN, b"y" * 300_000, name="dump.txt", mime="text/plain", file_size=100)
        await arrived(fake, messages, 2)
        (stated,), (understated,) = [message.attachments for message in messages]
        at_once = await refused(channel, stated, 2048, caplog)
        asked = len(fake.calls_to("getFile"))
        unknown = await refused(channel, replace(stated, size=None), 2048, caplog)
        streamed = await refused(channel, understated, 64 * 1024, caplog)
    assert at_once == "log.txt is 2.9 KB, larger than the 2 KB Kaiwa downloads"
    assert asked == 0, "refused before getFile"
    assert unknown == at_once, "getFile's file_size is checked too"
    assert streamed == "dump.txt is larger than the 64 KB Kaiwa downloads"
    assert fake.downloaded == ["documents/file_2.txt"], "only the understated one was fetched"


async def test_a_file_telegram_no_longer_has_is_said(caplog: pytest.LogCaptureFixture) -> None:
    async with FakeTelegram() as fake, listening(fake) as (channel, messages):
        update = fake.user_file(ANN, b"%PDF", name="old.pdf", mime="application/pdf")
        await arrived(fake, messages, 1)
        ((attachment,),) = [message.attachments for message in messages]
        unknown_id = await refused(channel, replace(attachment, source="gone-id"), MIB, caplog)
        fake.expire_file_path(file_id(update, "document"))
        expired_path = await refused(channel, attachment, MIB, caplog)
    assert unknown_id == expired_path == "Telegram no longer has old.pdf; send it again"


async def test_a_token_telegram_refuses_is_named_to_fix(caplog: pytest.LogCaptureFixture) -> None:
    async with FakeTelegram() as fake:
        update = fake.user_file(ANN, b"%PDF", name="old.pdf", mime="application/pdf")
        channel = channel_on(fake)
        source = file_id(update, "document")
        good = await channel.download(Attachment("old.pdf", "application/pdf", source), MIB)
        await channel.close()
        wrong = TelegramChannel(
            TelegramSettings(base_url=fake.base_url, base_file_url=fake.base_file_url),
            "123456:WRONG-token",
        )
        words = await refused(wrong, Attachment("old.pdf", "application/pdf", source), MIB, caplog)
        await wrong.close()
    assert good == b"%PDF"
    assert words == (
        "Telegram refused to hand over old.pdf: it does not accept Kaiwa's bot token. Whoever "
        "runs Kaiwa should put the token @BotFather gave into $KAIWA_TELEGRAM_TOKEN"
    )
    assert "WRONG-token" not in caplog.text


async def test_a_file_server_out_of_reach_is_said_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/file/bot"
    async with FakeTelegram() as fake:
        update = fake.user_file(ANN, b"%PDF", name="far.pdf", mime="application/pdf")
        channel = TelegramChannel(
            TelegramSettings(base_url=fake.base_url, base_file_url=closed), BOT_TOKEN
        )
        attachment = Attachment("far.pdf", "application/pdf", file_id(update, "document"))
        words = await refused(channel, attachment, MIB, caplog)
        await channel.close()
    assert words.startswith("Kaiwa could not reach Telegram to fetch far.pdf: send it again")
    assert "ConnectError" in caplog.text


async def test_a_redelivered_file_arrives_with_the_same_attachments() -> None:
    async with FakeTelegram() as fake, listening(fake) as (_, messages):
        update = fake.user_file(ANN, spoken_note("hello", seconds=1), kind="voice", seconds=1)
        await arrived(fake, messages, 1)
        fake.push_update({"message": dict(update["message"])})
        await arrived(fake, messages, 2)
    first, again = messages
    assert first.message_id == again.message_id
    assert first.attachments == again.attachments and first.attachments


async def test_in_a_group_a_file_is_for_the_bot_when_its_caption_mentions_it() -> None:
    entity = {"type": "mention", "offset": 0, "length": len(MENTION)}
    async with FakeTelegram() as fake, listening(fake, groups=True) as (_, messages):
        fake.user_file(GROUP, b"a,b", name="plain.csv", user_id=ANN, chat_type="group")
        fake.user_file(
            GROUP,
            b"a,b",
            name="for-the-bot.csv",
            user_id=ANN,
            chat_type="group",
            caption=f"{MENTION} sum column b",
            caption_entities=[entity],
        )
        last = fake.user_file(GROUP, b"", kind="voice", seconds=1, user_id=BOB, chat_type="group")
        await fake.wait_until(lambda: fake.confirmed_offset > last["update_id"], what="all read")
    (message,) = messages
    assert message.text == "sum column b"
    assert [attachment.name for attachment in message.attachments] == ["for-the-bot.csv"]
