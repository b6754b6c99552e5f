"""Discord's attachments (channels/discord/files.py): each kind of file described as it arrives,
and fetched from the CDN by its URL, capped, with every refusal in the person's words; through
the real discord.py and aiohttp against the fake Discord, whose CDN signs and expires its links
as Discord's does."""

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from fpdf import FPDF

from channels.discord.channel import DiscordChannel
from channels.settings import DiscordSettings
from core.channel import Attachment, AttachmentKind, ChannelMessage
from core.errors import DownloadError
from tests.fakes.changes import Changes
from tests.fakes.discord import BOT_TOKEN, CHANNEL_ID, GUILD_ID, USER_ID, FakeDiscord, Upload
from tests.fakes.patience import deadline
from tests.fakes.voice import spoken_note

MIB = 1024 * 1024
PICTURE = b"\x89PNG\r\n\x1a\n a tiny picture"


class Inbox:
    """What the channel delivers, with a wait that re-checks on each delivery."""

    def __init__(self) -> None:
        self.messages: list[ChannelMessage] = []
        self._changes = Changes()

    async def deliver(self, message: ChannelMessage) -> None:
        self.messages.append(message)
        self._changes.notify()

    async def received(self, count: int) -> list[ChannelMessage]:
        await self._changes.until(
            lambda: len(self.messages) >= count,
            None,
            f"{count} messages",
            lambda: f"{len(self.messages)} delivered",
        )
        return self.messages


@contextlib.asynccontextmanager
async def receiving(fake: FakeDiscord) -> AsyncIterator[tuple[DiscordChannel, Inbox]]:
    """A Discord channel on the fake, delivering into an inbox; stopped as the app stops it."""
    channel = discord_channel(fake)
    inbox = Inbox()
    reading = asyncio.create_task(channel.run(inbox.deliver))
    try:
        await asyncio.wait_for(channel.connected.wait(), deadline())
        yield channel, inbox
    finally:
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await channel.close()


def discord_channel(fake: FakeDiscord) -> DiscordChannel:
    settings = DiscordSettings(api_base=fake.api_base, gateway_url=fake.gateway_url)
    return DiscordChannel(settings, BOT_TOKEN, guild_ready_timeout=0.01)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        yield fake


def a_pdf() -> bytes:
    """A one-page PDF made by fpdf2."""
    document = FPDF()
    document.set_font("helvetica", size=12)
    document.add_page()
    document.multi_cell(0, 6, "Section 3: the budget is 300 euros.")
    return bytes(document.output())


async def sent_in_a_dm(fake: FakeDiscord, *files: Upload) -> Attachment:
    """The one attachment of a DM carrying `files`, as the channel describes it."""
    async with receiving(fake) as (_, inbox):
        fake.dm(USER_ID, "", attachments=files)
        (message,) = await inbox.received(1)
    (attachment,) = message.attachments
    return attachment


# --- what arrives ---


async def test_each_kind_of_file_is_described_and_a_message_of_files_alone_is_delivered(
    fake: FakeDiscord,
) -> None:
    document, song = a_pdf(), b"ID3 a song"
    files = [
        Upload("report.pdf", "application/pdf", document),
        Upload("song.mp3", "audio/mpeg", song),
        Upload("notes.md", None, b"# notes"),
        Upload("cat.png", "image/png", PICTURE),
        Upload("photo.jpg", None, b"\xff\xd8 a photo Discord gave no type"),
    ]
    async with receiving(fake) as (_, inbox):
        sent = fake.dm(USER_ID, "", attachments=files)
        (message,) = await inbox.received(1)
    assert message.text == "", "no text, still a message"
    assert message.images == (PICTURE, b"\xff\xd8 a photo Discord gave no type")
    urls = [attachment["url"] for attachment in sent["attachments"]]
    assert message.attachments == (
        Attachment("report.pdf", "application/pdf", urls[0], AttachmentKind.FILE, len(document)),
        Attachment("song.mp3", "audio/mpeg", urls[1], AttachmentKind.AUDIO, len(song)),
        Attachment("notes.md", "text/markdown", urls[2], AttachmentKind.FILE, 7),
    ), "the type guessed from the name when Discord gave none"


async def test_a_voice_message_in_a_thread_is_a_voice_note_with_its_length(
    fake: FakeDiscord,
) -> None:
    note = spoken_note("what does section three say", seconds=2.5)
    thread = fake.user_thread(CHANNEL_ID, "budget")
    async with receiving(fake) as (_, inbox):
        fake.user_message(thread, "join us", mentions_bot=True)
        await inbox.received(1)  # the bot is in the thread now
        fake.user_message(thread, "", attachments=[Upload.voice_message(note, seconds=2.5)])
        _, message = await inbox.received(2)
    assert (message.place, message.text) == (f"discord:{GUILD_ID}:{thread}", "")
    (voice,) = message.attachments
    assert (voice.kind, voice.name, voice.media_type) == (
        AttachmentKind.VOICE,
        "voice-message.ogg",
        "audio/ogg",
    )
    assert (voice.size, voice.seconds, voice.unavailable) == (len(note), 2.5, "")


async def test_a_mention_with_a_document_carries_it(fake: FakeDiscord) -> None:
    async with receiving(fake) as (_, inbox):
        fake.user_message(
            CHANNEL_ID,
            "what does section 3 say?",
            mentions_bot=True,
            attachments=[Upload("report.pdf", "application/pdf", a_pdf())],
        )
        (message,) = await inbox.received(1)
    assert message.text == "what does section 3 say?"
    assert [a.name for a in message.attachments] == ["report.pdf"]


async def test_a_redelivered_message_comes_with_the_same_attachments(fake: FakeDiscord) -> None:
    async with receiving(fake) as (_, inbox):
        sent = fake.dm(USER_ID, "", attachments=[Upload("a.txt", "text/plain", b"hello")])
        fake.replay_message(sent)
        first, again = await inbox.received(2)
    assert again.message_id == first.message_id == sent["id"], "the core drops it by its id"
    assert again.attachments == first.attachments


# --- downloads ---


@pytest.mark.parametrize(
    "upload",
    [
        Upload.voice_message(spoken_note("hello there", seconds=1.5), seconds=1.5),
        Upload("report.pdf", "application/pdf", a_pdf()),
    ],
    ids=["voice message", "pdf"],
)
async def test_a_download_is_the_files_exact_bytes_and_sends_no_token(
    fake: FakeDiscord, upload: Upload
) -> None:
    attachment = await sent_in_a_dm(fake, upload)
    later = discord_channel(fake)  # another process, after a restart: never connected
    try:
        data = await later.download(attachment, 10 * MIB)
    finally:
        await later.close()
    assert data == upload.data
    (fetch,) = fake.calls_to("GET", "/attachments/")
    assert (fetch.status, fetch.token) == (200, None)


async def test_a_file_declared_past_the_limit_is_refused_before_any_request(
    fake: FakeDiscord,
) -> None:
    attachment = await sent_in_a_dm(fake, Upload("big.pdf", "application/pdf", b"x" * 3 * MIB))
    channel = discord_channel(fake)
    with pytest.raises(DownloadError) as refused:
        await channel.download(attachment, MIB)
    await channel.close()
    assert str(refused.value) == "big.pdf (3 MB) is larger than the 1 MB Kaiwa downloads"
    assert fake.calls_to("GET", "/attachments/") == []


async def test_a_file_past_the_limit_is_cut_off_while_it_downloads(fake: FakeDiscord) -> None:
    """Its size understated: the stream itself stops past the limit."""
    upload = Upload("big.log", "text/plain", b"x" * 3 * MIB, size=10)
    attachment = await sent_in_a_dm(fake, upload)
    channel = discord_channel(fake)
    with pytest.raises(DownloadError) as refused:
        await channel.download(attachment, int(1.5 * MIB))
    await channel.close()
    assert str(refused.value) == "big.log is larger than the 1.5 MB Kaiwa downloads"


@pytest.mark.parametrize("expiry", ["a day later", "a 403"])
async def test_an_expired_link_says_to_send_the_file_again(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, expiry: str
) -> None:
    attachment = await sent_in_a_dm(fake, Upload("report.pdf", "application/pdf", a_pdf()))
    if expiry == "a day later":
        fake.expire_attachment_links()
    else:
        fake.fail_next("GET", "/attachments/", status=403)
    channel = discord_channel(fake)
    caplog.clear()
    with pytest.raises(DownloadError) as refused:
        await channel.download(attachment, 10 * MIB)
    await channel.close()
    assert str(refused.value) == (
        "Discord no longer serves report.pdf (its link expired): send it again"
    )
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.getMessage().startswith("Discord: could not download report.pdf from http")
    assert "hm=" not in caplog.text, "the link's signature stays out of the log"


async def test_a_cdn_failing_otherwise_says_so(fake: FakeDiscord) -> None:
    attachment = await sent_in_a_dm(fake, Upload("a.txt", "text/plain", b"hello"))
    fake.fail_next("GET", "/attachments/", status=500)
    channel = discord_channel(fake)
    with pytest.raises(DownloadError) as refused:
        await channel.download(attachment, MIB)
    assert await channel.download(attachment, MIB) == b"hello", "the next one works"
    await channel.close()
    assert str(refused.value) == (
        "Discord's file server would not send a.txt (500 Internal Server Error): "
        "send it again in a moment"
    )


async def test_an_unreachable_cdn_says_so(fake: FakeDiscord) -> None:
    attachment = await sent_in_a_dm(fake, Upload("a.txt", "text/plain", b"hello"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}/attachments/1/2/a.txt"
    channel = discord_channel(fake)
    with pytest.raises(DownloadError) as refused:
        await channel.download(replace(attachment, source=nowhere), MIB)
    await channel.close()
    assert str(refused.value) == (
        "Kaiwa could not reach Discord to fetch a.txt: send it again in a moment"
    )
