"""Voice notes and documents through a real `kaiwa` process, on every platform: a voice note
is transcribed and answered, and a PDF, a DOCX and a code file are read and answered.

Each platform's fake serves the files the way the platform does (Telegram's `getFile` and file
path, Slack's `url_private` behind the bot token, Discord's CDN, the web chat's own upload);
the speech-to-text server is the fake one, the notes real OGG Opus (espeak-ng and ffmpeg), the
PDF made by fpdf2 and the DOCX by python-docx. What is checked is what a person sees (the quote
of what was heard, the answer) and what the model was sent (the transcript marked as spoken,
each document in its block). Nothing is timed: each step waits on what the fakes saw.
"""

import asyncio
import base64
import contextlib
import io
import itertools
import signal
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import docx
import pytest
from fpdf import FPDF

from tests.fakes.discord import BOT_TOKEN as DISCORD_TOKEN
from tests.fakes.discord import FakeDiscord
from tests.fakes.discord import Upload as DiscordUpload
from tests.fakes.ollama import FakeOllama, Text
from tests.fakes.slack import APP_TOKEN as SLACK_APP
from tests.fakes.slack import BOT_TOKEN as SLACK_BOT
from tests.fakes.slack import FakeSlack, Upload
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.fakes.transcription import FakeTranscription, Hang
from tests.fakes.voice import spoken_note
from tests.ports import free_port
from tests.processes import WAIT_SECONDS, finish, kaiwa, reply_recorded, write_config

HEARD = "Please remind me to water the plants on Friday."
ANSWERS = (
    "I will remind you on Friday.",
    "The plan's budget is 12 k.",
    "Meet on Monday.",
    "It prints hello.",
)


CLIENT_IDS = itertools.count(1)


@dataclass
class Sent:
    """What a platform's harness does for the test: send a note or a file, read the replies."""

    config: str
    environment: dict[str, str]
    """The platform's tokens, as Kaiwa reads them from its environment."""
    voice: Callable[[bytes, int], None]
    file: Callable[[str, bytes, str, str], None]
    replies: Callable[[], list[str]]
    wait_until: Callable[[Callable[[], object]], Awaitable[None]]
    ready: Callable[[Path], Awaitable[None]] = lambda config: asyncio.sleep(0)
    """Called once `kaiwa run` is started on `config` (the web chat signs in then)."""


def report_pdf() -> bytes:
    document = FPDF()
    document.set_font("helvetica", size=12)
    for text in ("Introduction", "Section 3: the budget is 12 k."):
        document.add_page()
        document.multi_cell(0, 8, text)
    return bytes(document.output())


def minutes_docx() -> bytes:
    document = docx.Document()
    document.add_heading("Minutes", level=1)
    document.add_paragraph("We meet again on Monday.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture
async def speech() -> AsyncIterator[FakeTranscription]:
    async with FakeTranscription(text=HEARD) as server:
        yield server


@asynccontextmanager
async def telegram() -> AsyncIterator[Sent]:
    async with FakeTelegram() as fake:
        chat = 4242

        def voice(note: bytes, seconds: int) -> None:
            fake.user_file(chat, note, kind="voice", seconds=seconds)

        def file(name: str, data: bytes, mime: str, caption: str) -> None:
            fake.user_file(chat, data, name=name, mime=mime, caption=caption)

        config = (
            f'[channels.telegram]\nbase_url = "{fake.base_url}"\n'
            f'base_file_url = "{fake.base_file_url}"\nallowed_users = [{chat}]\n'
            "poll_timeout = 1\nedit_interval = 0.05\n"
        )
        yield Sent(
            config,
            {"KAIWA_TELEGRAM_TOKEN": BOT_TOKEN},
            voice,
            file,
            lambda: [message.visible for message in fake.sent(chat)],
            lambda condition: fake.wait_until(condition),
        )


@asynccontextmanager
async def slack() -> AsyncIterator[Sent]:
    async with FakeSlack() as fake:
        dm = "D1001"

        def voice(note: bytes, seconds: int) -> None:
            clip = Upload(note, "audio_message.ogg", "audio/ogg", audio_clip=True,
                          duration_ms=seconds * 1000)  # fmt: skip
            fake.share(dm, clip, user="U1")

        def file(name: str, data: bytes, mime: str, caption: str) -> None:
            fake.share(dm, Upload(data, name, mime), text=caption, user="U1")

        config = f'[channels.slack]\napi_url = "{fake.api_url}"\nallowed_users = ["U1"]\n'
        yield Sent(
            config,
            {"KAIWA_SLACK_BOT_TOKEN": SLACK_BOT, "KAIWA_SLACK_APP_TOKEN": SLACK_APP},
            voice,
            file,
            lambda: [posted.text for posted in fake.all_posted],
            lambda condition: fake.wait_until(condition),
        )


@asynccontextmanager
async def discord() -> AsyncIterator[Sent]:
    async with FakeDiscord() as fake:
        person = 4242

        def voice(note: bytes, seconds: int) -> None:
            fake.dm(person, "", attachments=[DiscordUpload.voice_message(note, seconds)])

        def file(name: str, data: bytes, mime: str, caption: str) -> None:
            fake.dm(person, caption, attachments=[DiscordUpload(name, mime or None, data)])

        config = (
            f'[channels.discord]\napi_base = "{fake.api_base}"\n'
            f'gateway_url = "{fake.gateway_url}"\nallowed_users = [{person}]\n'
        )
        yield Sent(
            config,
            {"KAIWA_DISCORD_TOKEN": DISCORD_TOKEN},
            voice,
            file,
            lambda: [message.content for message in fake.all_messages()],
            lambda condition: fake.wait_until(condition),
        )


@asynccontextmanager
async def web_chat() -> AsyncIterator[Sent]:
    """The web chat's platform is Kaiwa's own board: a page's requests are made here with
    aiohttp (signed in by `kaiwa web-link`), and what the page would show is read from the
    board's file, web.db (another process's: polled)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(
        cookie_jar=jar, headers={"Origin": base, "X-Kaiwa": "1"}
    ) as page:
        state: dict[str, Any] = {"sending": asyncio.sleep(0)}

        async def ready(config: Path) -> None:
            code, out, err = await finish(await kaiwa("web-link", "--config", str(config)))
            assert code == 0, err
            link = out.strip().rsplit(" ", 1)[-1]
            async with asyncio.timeout(WAIT_SECONDS):
                while True:
                    try:
                        async with page.get(link) as answer:
                            assert answer.status == 200, await answer.text()
                        break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.02)
            async with page.post(f"{base}/api/conversations", json={}) as answer:
                state["conversation"] = (await answer.json())["id"]
            state["board"] = config.parent / "state" / "web.db"

        def post(text: str, files: list[dict[str, str]]) -> None:
            before = state["sending"]

            async def send() -> None:
                await before  # in the order a person sends them
                body = {
                    "conversation": state["conversation"],
                    "text": text,
                    "client_id": f"c{next(CLIENT_IDS)}",
                    "files": files,
                }
                async with page.post(f"{base}/api/messages", json=body) as answer:
                    assert answer.status == 202, await answer.text()

            state["sending"] = asyncio.ensure_future(send())

        def voice(note: bytes, seconds: int) -> None:
            post("", [_upload("voice note.ogg", "audio/ogg", note)])

        def file(name: str, data: bytes, mime: str, caption: str) -> None:
            post(caption, [_upload(name, mime, data)])

        def replies() -> list[str]:
            if "board" not in state or not state["board"].exists():
                return []
            with contextlib.closing(sqlite3.connect(state["board"])) as board:
                rows = board.execute(
                    "SELECT text FROM bubbles WHERE role != 'person' ORDER BY seq"
                ).fetchall()
            return [row[0] for row in rows]

        async def wait_until(condition: Callable[[], object]) -> None:
            async with asyncio.timeout(WAIT_SECONDS):
                while not condition():  # noqa: ASYNC110  (another process's file)
                    await asyncio.sleep(0.02)

        config = f"[channels.web]\nenabled = true\nport = {port}\n"
        yield Sent(config, {}, voice, file, replies, wait_until, ready)
        await state["sending"]


def _upload(name: str, media_type: str, data: bytes) -> dict[str, str]:
    return {"name": name, "type": media_type, "data": base64.b64encode(data).decode()}


HARNESSES: dict[str, Callable[[], AbstractAsyncContextManager[Sent]]] = {
    "web": web_chat,
    "discord": discord,
    "telegram": telegram,
    "slack": slack,
}


@pytest.fixture(params=sorted(HARNESSES))
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[Sent]:
    async with HARNESSES[request.param]() as sent:
        yield sent


def configured(tmp_path: Path, ollama: FakeOllama, speech: FakeTranscription, sent: Sent) -> Path:
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            "[channels.terminal]\n", "[channels.terminal]\nenabled = false\n"
        )
        + f'\n[transcription]\nurl = "{speech.url}"\n\n'
        + sent.config
    )
    return config


def last_asked(ollama: FakeOllama, index: int) -> str:
    users = [m for m in ollama.requests[index]["messages"] if m["role"] == "user"]
    return str(users[-1]["content"])


async def test_a_voice_note_a_pdf_a_docx_and_a_code_file_are_heard_read_and_answered(
    platform: Sent, tmp_path: Path, ollama: FakeOllama, speech: FakeTranscription
) -> None:
    sent = platform
    for answer in ANSWERS:
        ollama.script(Text(answer))
    config = configured(tmp_path, ollama, speech, sent)
    bot = await kaiwa("run", "--config", str(config), env=sent.environment)
    await sent.ready(config)

    sent.voice(spoken_note("please remind me to water the plants on friday", seconds=4), 4)
    await sent.wait_until(lambda: any(ANSWERS[0] in text for text in sent.replies()))
    sent.file("plan.pdf", report_pdf(), "application/pdf", "What does section 3 say?")
    sent.file("minutes.docx", minutes_docx(), "", "When do we meet?")
    sent.file("hello.py", b"print('hello')\n", "text/x-python", "What does this do?")
    await sent.wait_until(lambda: any(ANSWERS[3] in text for text in sent.replies()))

    (upload,) = speech.uploads
    assert upload.problem is None and upload.seconds == pytest.approx(4.0, abs=0.05)
    heard = next(text for text in sent.replies() if ANSWERS[0] in text)
    assert f"🎙 Heard (4 s): “{HEARD}”" in heard
    assert last_asked(ollama, 0).endswith(f"the person's own words, spoken]\n{HEARD}")
    pdf_asked, docx_asked, code_asked = (last_asked(ollama, n) for n in (1, 2, 3))
    assert pdf_asked.startswith('What does section 3 say?\n\n<document name="plan.pdf" kind="pdf"')
    assert "Section 3: the budget is 12 k." in pdf_asked
    assert '<document name="minutes.docx" kind="docx">' in docx_asked
    assert "We meet again on Monday." in docx_asked
    assert '<document name="hello.py" kind="text">\nprint(\'hello\')\n</document>' in code_asked
    bot.terminate()
    await bot.wait()


async def test_a_kaiwa_killed_while_transcribing_says_which_note_to_send_again_and_loses_it_not(
    tmp_path: Path, ollama: FakeOllama, speech: FakeTranscription
) -> None:
    """Killed at any instruction: here while the server hears the note, its status line out.
    A reply that showed something is never run again (it could answer twice), so the next
    start ends it saying what to send again; sent again, the note is heard and answered."""
    async with telegram() as sent:
        config = configured(tmp_path, ollama, speech, sent)
        speech.script(Hang())
        first = await kaiwa("run", "--config", str(config), env=sent.environment)
        note = spoken_note("please remind me to water the plants on friday", seconds=4)
        sent.voice(note, 4)
        await speech.hanging()
        await reply_recorded(f"sqlite:///{tmp_path / 'state' / 'kaiwa.db'}")  # its status line
        first.send_signal(signal.SIGKILL)
        await first.wait()
        speech.release()

        ollama.script(Text(ANSWERS[0]))
        second = await kaiwa("run", "--config", str(config), env=sent.environment)
        resend = "I was restarted before I could finish answering your voice note."
        await sent.wait_until(lambda: any(resend in text for text in sent.replies()))
        sent.voice(note, 4)
        await sent.wait_until(lambda: any(ANSWERS[0] in text for text in sent.replies()))
        second.send_signal(signal.SIGTERM)
        code, _, err = await finish(second)

    assert code == 0, err
    first_reply, second_reply = sent.replies()
    assert first_reply == f"{resend} Please send it again. (interrupted by a restart)"
    assert f"🎙 Heard (4 s): “{HEARD}”" in second_reply and ANSWERS[0] in second_reply
    assert len(ollama.requests) == 1
