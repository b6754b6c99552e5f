"""The files a person attaches in the web chat (`channels.web.uploads`): over real HTTP on
127.0.0.1 as the page sends them, to the dispatcher as `ChannelMessage.attachments`, back to
their sender alone as downloads, and to the core through `WebChannel.download`; and what is
refused (past a cap, a stranger's), in the words the person reads."""

import asyncio
import base64
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from channels.settings import WebSettings
from channels.web.board import Board
from channels.web.channel import WebChannel
from channels.web.uploads import FileUpload, disposition, media_type, safe_name
from core.channel import Attachment, AttachmentKind, ChannelMessage
from core.dispatch.dispatcher import Allowed
from core.errors import DownloadError
from tests.channels.web.test_channel import WebClient, browser_session, signed_in
from tests.channels.web.test_team import Proxied, team, web_of  # noqa: F401
from tests.core.features.attachments.test_documents import pdf
from tests.fakes.ollama import Text
from tests.fakes.patience import deadline
from tests.fakes.voice import spoken_note
from tests.harness import Bot, BotFactory

MB = 1024 * 1024


class Heard:
    """What the dispatcher was handed, in order, and an event for each."""

    def __init__(self) -> None:
        self.messages: list[ChannelMessage] = []
        self.came = asyncio.Event()

    async def heard(self, count: int) -> list[ChannelMessage]:
        async with asyncio.timeout(deadline()):
            while len(self.messages) < count:
                self.came.clear()
                await self.came.wait()
        return self.messages


@pytest.fixture
async def listening(
    make_bot: BotFactory, tmp_path: Path
) -> AsyncIterator[tuple[Bot, WebChannel, Heard]]:
    """The channel delivering into the bot's dispatcher through a recorder of what it hands in."""
    channel = WebChannel(WebSettings(enabled=True, port=0), tmp_path, announce=lambda _: None)
    bot = make_bot(channel=channel, access=Allowed(users=None))
    heard = Heard()

    async def deliver(message: ChannelMessage) -> None:
        heard.messages.append(message)
        heard.came.set()
        await bot.dispatcher.handle(message)

    reading = asyncio.create_task(channel.run(deliver))
    await asyncio.wait_for(channel.connected.wait(), deadline())
    try:
        yield bot, channel, heard
    finally:
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await bot.runner.shutdown()
        await channel.close()


@pytest.fixture
async def client(listening: tuple[Bot, WebChannel, Heard]) -> AsyncIterator[WebClient]:
    async for each in signed_in(listening[1]):
        yield each


def sent(name: str, data: bytes, kind: str = "") -> dict[str, str]:
    """A file as the page sends it (`type` is the browser's, empty when it does not know)."""
    return {"name": name, "type": kind, "data": base64.b64encode(data).decode()}


async def message(
    client: WebClient, conversation: str, files: list[Any], text: str = "", client_id: str = "c1"
) -> tuple[int, dict[str, Any]]:
    """The page's POST of a message; its body a stream, as aiohttp asks of one this large."""
    body = {"conversation": conversation, "text": text, "client_id": client_id, "files": files}
    streamed = io.BytesIO(json.dumps(body).encode())
    headers = client.headers | {"Content-Type": "application/json"}
    async with client.session.post(
        client.url + "/api/messages", data=streamed, headers=headers
    ) as answer:
        return answer.status, await answer.json()


async def fetched(client: WebClient, file_id: str) -> tuple[int, dict[str, str], bytes]:
    async with client.session.get(f"{client.url}/api/file", params={"id": file_id}) as answer:
        return answer.status, dict(answer.headers), await answer.read()


async def test_files_reach_the_dispatcher_and_come_back_exactly_as_sent(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient
) -> None:
    bot, channel, heard = listening
    bot.ollama.script(Text("Read them."))
    note, report = spoken_note("hello there"), pdf(2)
    conversation = await client.new_conversation()
    files = [
        sent("notes.txt", b"buy apples\n", "text/plain"),
        sent("note.ogg", note, "audio/ogg"),
        sent("report.pdf", report),  # the browser knew no type: the name says it
    ]
    assert await message(client, conversation, files, "what do these say?") == (202, {"ok": True})

    (delivered,) = await heard.heard(1)
    described = [(a.name, a.media_type, a.kind, a.size) for a in delivered.attachments]
    assert described == [
        ("notes.txt", "text/plain", AttachmentKind.FILE, 11),
        ("note.ogg", "audio/ogg", AttachmentKind.AUDIO, len(note)),
        ("report.pdf", "application/pdf", AttachmentKind.FILE, len(report)),
    ]
    assert (delivered.text, delivered.images) == ("what do these say?", ())
    for attachment, data in zip(
        delivered.attachments, (b"buy apples\n", note, report), strict=True
    ):
        assert await channel.download(attachment, 25 * MB) == data
        status, headers, body = await fetched(client, attachment.source)
        assert (status, body) == (200, data)
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["Content-Disposition"].startswith(
            f'attachment; filename="{attachment.name}"'
        )
        assert headers["X-Content-Type-Options"] == "nosniff"
    (bubble,) = [b for b in channel.board.bubbles(conversation) if b.role == "person"]
    assert [each.attachment() for each in bubble.files] == list(delivered.attachments)
    await bot.runner.wait_idle(delivered.place)


async def test_a_message_of_files_alone_is_delivered_and_titled_by_them(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient
) -> None:
    _, channel, heard = listening
    conversation = await client.new_conversation()
    assert (await message(client, conversation, [sent("plan.md", b"# Plan")]))[0] == 202
    (delivered,) = await heard.heard(1)
    assert delivered.text == "" and [a.name for a in delivered.attachments] == ["plan.md"]
    assert channel.board.conversations("operator")[0].title == "plan.md"


async def test_a_message_sent_again_is_delivered_with_the_same_files_kept_once(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient
) -> None:
    """The page sends a message again when its answer was lost: the same client id."""
    _, channel, heard = listening
    conversation = await client.new_conversation()
    files = [sent("a.txt", b"a"), sent("b.txt", b"b")]
    for _ in range(2):
        assert (await message(client, conversation, files, client_id="same"))[0] == 202
    first, again = await heard.heard(2)
    assert first.message_id == again.message_id == "same"
    assert first.attachments == again.attachments and len(first.attachments) == 2
    (bubble,) = [b for b in channel.board.bubbles(conversation) if b.role == "person"]
    assert len(bubble.files) == 2


async def test_a_large_file_arrives_whole(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient
) -> None:
    """Regression: the body was one read of the stream, which gives only what has arrived so
    far, so a message of a few MB was refused as not JSON."""
    _, channel, heard = listening
    data = bytes(range(256)) * (20 * MB // 256)
    conversation = await client.new_conversation()
    assert (await message(client, conversation, [sent("big.bin", data)]))[0] == 202
    (delivered,) = await heard.heard(1)
    (big,) = delivered.attachments
    assert await channel.download(big, 25 * MB) == data
    assert (await fetched(client, big.source))[0::2] == (200, data)


async def test_the_core_is_refused_a_file_past_its_limit_or_gone_in_words(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient
) -> None:
    _, channel, heard = listening
    conversation = await client.new_conversation()
    assert (await message(client, conversation, [sent("scan.pdf", b"%PDF" * MB)]))[0] == 202
    (delivered,) = await heard.heard(1)
    (scan,) = delivered.attachments

    with pytest.raises(DownloadError) as large:
        await channel.download(scan, 2 * MB)
    assert str(large.value) == "scan.pdf is 4 MB, larger than the 2 MB Kaiwa downloads"
    gone = Attachment("old.txt", "text/plain", "no-such-id")
    with pytest.raises(DownloadError) as missing:
        await channel.download(gone, 2 * MB)
    assert str(missing.value) == "old.txt is no longer kept by the web chat: attach it again"


def test_a_board_that_cannot_be_read_refuses_in_words(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    posted = board.post(entry.id, "person", "", files=(FileUpload("a.txt", "text/plain", b"a"),))
    (kept,) = posted.files
    board.close()
    with pytest.raises(DownloadError) as refused:
        board.uploads.fetch(kept.attachment(), MB)
    assert str(refused.value).startswith("the web chat could not read a.txt from its file (web.db")


def many(count: int, size: int) -> list[dict[str, str]]:
    return [sent(f"part{number}.bin", b"x" * size) for number in range(1, count + 1)]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (
            [sent("report.pdf", b"x" * (31 * MB))],
            "report.pdf is 31 MB; the web chat takes files up to 25 MB",
        ),
        (
            many(3, 20 * MB),
            "these files are 60 MB together; the web chat takes up to 50 MB in one message: "
            "send some with the next message",
        ),
        (
            many(11, 1),
            "a message takes at most 10 files, and this one has 11: send the others with the "
            "next message",
        ),
        (
            [{"name": "a.txt", "data": "not base64!"}],
            "a.txt did not come as base64: attach it again",
        ),
        ([{"name": "a.txt"}], "each file must be {name, type, data}, its data in base64"),
        ({"name": "a.txt"}, "files must be a list of {name, type, data}"),
    ],
    ids=["one too large", "too large together", "too many", "not base64", "no data", "no list"],
)
async def test_files_past_a_cap_are_refused_with_why_and_nothing_is_kept(
    listening: tuple[Bot, WebChannel, Heard], client: WebClient, files: Any, error: str
) -> None:
    _, channel, heard = listening
    conversation = await client.new_conversation()
    assert await message(client, conversation, files, "look") == (400, {"error": error})
    assert channel.board.bubbles(conversation) == [] and heard.messages == []


async def test_a_body_past_its_limit_is_refused_saying_its_size(client: WebClient) -> None:
    body = {"conversation": "c", "command": "/stop " + "x" * 300_000}
    async with client.session.post(
        client.url + "/api/press", json=body, headers=client.headers
    ) as answer:
        assert answer.status == 413
        assert await answer.text() == "the request is too large (this one is 293 KB)"


async def test_a_file_is_its_senders_alone(team: Bot) -> None:  # noqa: F811
    team.ollama.script(Text("Got it."))
    async with Proxied(team, "ann") as ann, Proxied(team, "bob") as bob:
        hers = await ann.new_conversation()
        assert (await message(ann, hers, [sent("diary.txt", b"secret")], "keep this"))[0] == 202
        await team.runner.wait_idle(f"web:ann:{hers}")
        (bubble,) = [b for b in web_of(team).board.bubbles(hers) if b.role == "person"]
        (kept,) = bubble.files
        assert (await fetched(ann, kept.id))[0::2] == (200, b"secret")
        assert (await fetched(bob, kept.id))[0::2] == (404, b'{"error": "no such file"}')
    async with browser_session() as nobody:
        assert (await fetched(WebClient(nobody, web_of(team).url), kept.id))[0] == 401


async def test_a_strangers_files_are_never_kept(team: Bot, tmp_path: Path) -> None:  # noqa: F811
    async with Proxied(team, "mallory") as mallory:
        conversation = await mallory.new_conversation()
        files = [sent("huge.bin", b"x" * MB), sent("more.bin", b"y")]
        assert (await message(mallory, conversation, files))[0] == 202
        stream = mallory.events(conversation)
        await mallory.until(
            stream,
            lambda: any(role == "notice" for role, _, _ in mallory.bubbles(conversation)),
        )
        await stream.aclose()
    (kept,) = [b for b in web_of(team).board.bubbles(conversation) if b.role == "person"]
    assert kept.files == ()
    assert team.ollama.requests == []
    with sqlite3.connect(tmp_path / "web.db") as board:
        assert board.execute("SELECT count(*) FROM files").fetchone() == (0,)


# -- names and types, a stranger's input ---------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\ann\\report.pdf", "report.pdf"),
        ("invoice\u202efdp.exe", "invoicefdp.exe"),  # a right-to-left override dropped
        ("two\nlines\r.txt", "twolines.txt"),
        ("tab\there\u00a0.txt", "tabhere .txt"),  # a tab is a control; a no-break space a space
        ("<img src=x onerror=alert(1)>.html", "<img src=x onerror=alert(1)>.html"),  # text
        ("..", "file 3"),
        ("", "file 3"),
        (None, "file 3"),
        ("a" * 300 + ".pdf", "a" * 196 + ".pdf"),
    ],
)
def test_a_name_is_kept_as_text_without_folders_or_hidden_characters(given: Any, kept: str) -> None:
    assert safe_name(given, 3) == kept


@pytest.mark.parametrize(
    ("given", "name", "kept"),
    [
        ("audio/ogg; codecs=opus", "note", "audio/ogg"),
        ("", "report.pdf", "application/pdf"),
        ("application/octet-stream", "notes.txt", "text/plain"),
        ("text/html<script>", "page.bin", "application/octet-stream"),
        (None, "no-extension", "application/octet-stream"),
    ],
)
def test_a_media_type_is_the_pages_when_it_is_one_else_the_names(
    given: Any, name: str, kept: str
) -> None:
    assert media_type(given, name) == kept


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("notes.txt", "attachment; filename=\"notes.txt\"; filename*=UTF-8''notes.txt"),
        (
            'résumé "final".pdf',
            'attachment; filename="r_sum_ _final_.pdf"; '
            "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22.pdf",
        ),
    ],
)
def test_a_download_is_named_safely_for_every_client(name: str, header: str) -> None:
    assert disposition(name) == header
