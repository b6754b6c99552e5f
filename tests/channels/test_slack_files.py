"""Slack's files (channels/slack/files.py): a message's files as attachments and pictures, and
their download with the bot token, through the real slack-bolt and aiohttp against the fake
Slack, which serves each file on Slack's own paths and refuses as Slack does (a sign-in page)."""

import asyncio
import base64
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from fpdf import FPDF

from channels.settings import SlackSettings
from channels.slack.channel import SlackChannel, SlackTokens
from channels.slack.files import MAX_PICTURE_BYTES, REFUSED, described
from core.channel import Attachment, AttachmentKind, ChannelMessage
from core.errors import DownloadError
from tests.channels.platforms import slack_platform
from tests.fakes.ollama import Text
from tests.fakes.patience import deadline
from tests.fakes.slack import APP_TOKEN, BOT_TOKEN, TEAM, FakeSlack, Upload
from tests.fakes.voice import spoken_note
from tests.harness import BotFactory

DM, ROOM, ANN = "D7", "C1", "U1001"
PICTURE = b"\x89PNG\r\n\x1a\n a tiny picture"
MB = 1024 * 1024


def small_pdf(text: str) -> bytes:
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(text=text)
    return bytes(pdf.output())


@dataclass
class Receiving:
    """A Slack channel over Socket Mode on the fake, with what it delivered."""

    fake: FakeSlack
    channel: SlackChannel
    delivered: list[ChannelMessage] = field(default_factory=list)

    async def deliver(self, message: ChannelMessage) -> None:
        self.delivered.append(message)

    async def next_message(self, count: int = 1) -> ChannelMessage:
        """The `count`-th message delivered (waited for: bolt acknowledges it once delivered)."""
        await self.fake.wait_until(lambda: len(self.delivered) >= count, what="a delivery")
        return self.delivered[count - 1]

    async def attachments_of(self, *uploads: Upload) -> tuple[Attachment, ...]:
        """What a DM of `uploads` alone is delivered with, besides its pictures."""
        self.fake.share(DM, *uploads, user=ANN)
        return (await self.next_message(len(self.delivered) + 1)).attachments

    def all_acknowledged(self) -> bool:
        return {envelope["envelope_id"] for envelope in self.fake.envelopes} <= self.fake.acked

    async def downloaded(self, upload: Upload, limit: int = 20 * MB) -> bytes:
        (attachment,) = await self.attachments_of(upload)
        return await self.channel.download(attachment, limit)


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Receiving]:
    async with FakeSlack() as fake:
        channel = SlackChannel(
            SlackSettings(api_url=fake.api_url), SlackTokens(bot=BOT_TOKEN, app=APP_TOKEN)
        )
        slack = Receiving(fake, channel)
        reading = asyncio.create_task(channel.run(slack.deliver))
        try:
            await fake.wait_connected()
            yield slack
        finally:
            await channel.stop_receiving()
            await asyncio.wait_for(reading, deadline())
            await channel.close()


async def test_a_document_alone_is_a_message_with_its_attachment() -> None:
    content = small_pdf("Section 3 says hello.")
    async with receiving() as slack:
        ts = slack.fake.share(DM, Upload(content, "report.pdf", "application/pdf"), user=ANN)
        message = await slack.next_message()
    (file,) = slack.fake.files_in(DM, ts)
    assert (message.text, message.images, message.message_id) == ("", (), f"{DM}:{ts}")
    assert message.attachments == (
        Attachment(
            name="report.pdf",
            media_type="application/pdf",
            source=file["url_private_download"],
            kind=AttachmentKind.FILE,
            size=len(content),
        ),
    )
    assert BOT_TOKEN not in repr(message)


async def test_each_kind_of_file_in_one_message_with_its_words() -> None:
    clip = Upload(b"a clip", "audio_message.webm", "audio/webm", audio_clip=True, duration_ms=4250)
    song = Upload(b"ID3 a song", "song.mp3", "audio/mpeg")
    code = Upload(b"print('hi')\n", "hello.py", "text/x-python")
    async with receiving() as slack:
        ts = slack.fake.share(DM, clip, song, code, text="what is in these?", user=ANN)
        message = await slack.next_message()
    assert message.text == "what is in these?"
    kinds = [(a.kind, a.name, a.media_type, a.size, a.seconds) for a in message.attachments]
    assert kinds == [
        (AttachmentKind.VOICE, "audio_message.webm", "audio/webm", 6, 4.25),
        (AttachmentKind.AUDIO, "song.mp3", "audio/mpeg", 10, None),
        (AttachmentKind.FILE, "hello.py", "text/x-python", 12, None),
    ]
    sources = [file["url_private_download"] for file in slack.fake.files_in(DM, ts)]
    assert [a.source for a in message.attachments] == sources


async def test_a_file_in_a_thread_the_bot_is_part_of_needs_no_mention() -> None:
    async with receiving() as slack:
        fake = slack.fake
        opened = fake.mention(ROOM, "hello", user=ANN)
        await slack.next_message()
        fake.share(ROOM, Upload(b"a,b\n1,2\n", "t.csv", "text/csv"), user=ANN, thread_ts=opened)
        message = await slack.next_message(3)  # the mention came as app_mention and message
        fake.share(ROOM, Upload(b"x", "elsewhere.txt", "text/plain"), user=ANN)
        mentioning = fake.share(ROOM, Upload(b"y", "it.txt", "text/plain"), user=ANN, mention=True)
        await fake.wait_until(slack.all_acknowledged, what="every event handled")
    assert message.place == f"slack:{TEAM}:{ROOM}:{opened}"
    assert [a.name for a in message.attachments] == ["t.csv"]
    mentioned = slack.delivered[3:]
    assert [m.place for m in mentioned] == [f"slack:{TEAM}:{ROOM}:{mentioning}"] * 2
    assert [(m.text, m.attachments) for m in mentioned] == [("", mentioned[0].attachments)] * 2
    assert [a.name for a in mentioned[0].attachments] == ["it.txt"], "not elsewhere.txt"


async def test_a_redelivered_message_comes_with_the_same_attachments() -> None:
    async with receiving() as slack:
        fake = slack.fake
        ts = fake.share(DM, Upload(spoken_note("hello there"), "note.ogg", "audio/ogg"), user=ANN)
        first = await slack.next_message()
        (envelope,) = [e for e in fake.envelopes if e["payload"]["event"].get("ts") == ts]
        fake.redeliver(envelope["envelope_id"])
        again = await slack.next_message(2)
    assert again.message_id == first.message_id
    assert again.attachments == first.attachments and first.attachments


async def test_a_voice_note_and_a_pdf_download_to_their_exact_bytes() -> None:
    note, pdf = spoken_note("what does section three say", seconds=3), small_pdf("Section 3.")
    async with receiving() as slack:
        assert await slack.downloaded(Upload(note, "voice.ogg", "audio/ogg")) == note
        assert await slack.downloaded(Upload(pdf, "report.pdf", "application/pdf")) == pdf
    assert [(d.token, d.status) for d in slack.fake.downloads] == [(BOT_TOKEN, 200)] * 2
    assert all("/download/" in d.path for d in slack.fake.downloads)


async def test_a_file_declared_past_the_limit_is_refused_before_it_is_asked_for() -> None:
    async with receiving() as slack:
        with pytest.raises(DownloadError) as refused:
            await slack.downloaded(Upload(b"x" * (3 * MB), "big.pdf", "application/pdf"), MB)
    assert str(refused.value) == "big.pdf is 3 MB, larger than the 1 MB Kaiwa downloads"
    assert slack.fake.downloads == []


@pytest.mark.parametrize("chunked", [False, True], ids=["by its length", "while it streams"])
async def test_a_file_larger_than_it_said_is_refused_past_the_limit(chunked: bool) -> None:
    lying = Upload(b"x" * (3 * MB), "big.bin", "", declared_size=100, chunked=chunked)
    async with receiving() as slack:
        with pytest.raises(DownloadError) as refused:
            await slack.downloaded(lying, MB)
    assert str(refused.value) == (
        "big.bin is 3 MB, larger than the 1 MB Kaiwa downloads"
        if not chunked
        else "big.bin is larger than the 1 MB Kaiwa downloads"
    )
    assert [d.status for d in slack.fake.downloads] == [200]


async def test_a_deleted_file_is_said_to_be_gone() -> None:
    async with receiving() as slack:
        (attachment,) = await slack.attachments_of(Upload(b"x", "notes.txt", "text/plain"))
        (file,) = slack.fake.files_in(DM, slack.delivered[0].message_id.split(":")[1])
        slack.fake.delete_file(file["id"])
        with pytest.raises(DownloadError) as gone:
            await slack.channel.download(attachment, MB)
    assert str(gone.value) == (
        "notes.txt is no longer on Slack (it was deleted, or its message was): share it again"
    )


async def test_without_the_files_read_scope_the_sign_in_page_is_a_refusal_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "channels.slack")
    async with receiving() as slack:
        slack.fake.files_read_scope = False
        with pytest.raises(DownloadError) as refused:
            await slack.downloaded(Upload(b"<p>a page</p>", "page.html", "text/html"))
    assert str(refused.value) == f"Slack would not hand over page.html: {REFUSED}"
    assert "files:read scope (OAuth & Permissions, then reinstall the app)" in REFUSED
    (line,) = [record.getMessage() for record in caplog.records]
    assert "page.html" in line and "files:read" in line and BOT_TOKEN not in caplog.text


async def test_an_html_file_itself_is_no_refusal() -> None:
    page = b"<!DOCTYPE html><p>minutes of the meeting</p>"
    async with receiving() as slack:
        assert await slack.downloaded(Upload(page, "minutes.html", "text/html")) == page


async def test_a_bot_token_slack_does_not_take_for_files_is_the_same_refusal() -> None:
    async with FakeSlack() as fake:
        ts = fake.share(DM, Upload(b"x", "notes.txt", "text/plain"), user=ANN)
        (attachment,) = [described(file) for file in fake.files_in(DM, ts)]
        channel = SlackChannel(
            SlackSettings(api_url=fake.api_url), SlackTokens(bot="xoxb-another-app")
        )
        with pytest.raises(DownloadError) as refused:
            await channel.download(attachment, MB)
    assert str(refused.value) == f"Slack would not hand over notes.txt: {REFUSED}"
    assert [(d.token, d.status) for d in fake.downloads] == [("xoxb-another-app", 302)]


async def test_an_address_off_slack_is_never_sent_the_token() -> None:
    async with receiving() as slack:
        (attachment,) = await slack.attachments_of(Upload(b"x", "notes.txt", "text/plain"))
        elsewhere = attachment.source.replace("127.0.0.1", "localhost")
        with pytest.raises(DownloadError) as refused:
            await slack.channel.download(
                Attachment(attachment.name, attachment.media_type, elsewhere), MB
            )
    assert str(refused.value) == (
        "notes.txt is not on Slack's servers (localhost): Kaiwa does not fetch it"
    )
    assert slack.fake.downloads == []


async def test_a_slack_that_cannot_be_reached_is_said() -> None:
    async with receiving() as slack:
        (attachment,) = await slack.attachments_of(Upload(b"x", "notes.txt", "text/plain"))
    await slack.fake.close()
    with pytest.raises(DownloadError) as unreachable:
        await slack.channel.download(attachment, MB)
    said = str(unreachable.value)
    assert said.startswith("Slack could not be reached for notes.txt (")
    assert said.endswith("): try again in a while")


async def test_a_picture_reaches_a_model_that_can_see(make_bot: BotFactory) -> None:
    seeing = functools.partial(make_bot, images=True)
    async with slack_platform(seeing) as slack:
        slack.bot.ollama.script(Text("A tiny picture."))
        picture = Upload(PICTURE, "p.png", "image/png")
        slack.fake.share("D1001", picture, text="what is this?", user=ANN)
        await slack.fake.wait_until(lambda: slack.shown(1001), what="the reply")
    (request,) = slack.bot.ollama.requests
    assert request["messages"][-1]["content"] == "what is this?"
    assert request["messages"][-1]["images"] == [base64.b64encode(PICTURE).decode()]


async def test_a_picture_is_fetched_into_images_and_is_no_attachment() -> None:
    async with receiving() as slack:
        slack.fake.share(DM, Upload(PICTURE, "p.png", "image/png"), user=ANN)
        message = await slack.next_message()
    assert (message.images, message.attachments) == ((PICTURE,), ())


async def test_a_picture_that_cannot_be_fetched_stays_an_attachment_saying_why() -> None:
    large = Upload(b"x", "huge.png", "image/png", declared_size=MAX_PICTURE_BYTES + 5 * MB)
    async with receiving() as slack:
        slack.fake.files_read_scope = False
        unread, too_large = await slack.attachments_of(Upload(PICTURE, "p.png", "image/png"), large)
        assert slack.delivered[0].images == ()
    assert unread.unavailable == f"Slack would not hand over p.png: {REFUSED}"
    assert too_large.unavailable == "huge.png is 25 MB, larger than the 20 MB Kaiwa downloads"
    with pytest.raises(DownloadError, match="files:read"):
        await slack.channel.download(unread, MB)


def test_a_file_object_without_a_name_or_a_media_type_gets_sensible_ones() -> None:
    clip = {
        "subtype": "slack_audio",
        "mimetype": "video/mp4",
        "filetype": "mp4",
        "url_private": "u",
    }
    assert described(clip) == Attachment(
        name="voice note.mp4", media_type="audio/mp4", source="u", kind=AttachmentKind.VOICE
    )
    guessed = described({"name": "t.csv", "url_private_download": "d", "url_private": "u"})
    assert (guessed.media_type, guessed.source, guessed.kind) == ("text/csv", "d", "file")
    unknown = described({"name": "blob", "url_private": "u"})
    assert unknown.media_type == "application/octet-stream"


@pytest.mark.parametrize(
    ("file", "why"),
    [
        ({"name": "a.pdf", "mode": "tombstone"}, "a.pdf was deleted from Slack"),
        (
            {"name": "a.pdf", "mode": "external", "url_private": "https://drive.example/a"},
            "a.pdf is a link to a file kept outside Slack, which Kaiwa does not fetch",
        ),
        ({"id": "F1", "name": "a.pdf"}, "Slack sent a.pdf without its address"),
    ],
)
def test_a_file_that_cannot_be_fetched_says_why(file: dict[str, str], why: str) -> None:
    assert described(file).unavailable == why
