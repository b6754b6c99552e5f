"""The attachments part through the real turn path: voice notes heard, documents read, what the
model is sent, what is stored and shown, and every refusal. The channel is the recording one
(its files served by `download`), the model the fake Ollama, the speech-to-text server the fake
one, the notes real OGG Opus made by espeak-ng and ffmpeg."""

import io
from collections.abc import AsyncIterator
from typing import Any

import docx
import pytest
from fpdf import FPDF
from fpdf.enums import EncryptionMethod

from core.channel import AttachmentKind, Outcome
from core.dispatch.recovery import Recovery, leftovers
from core.features.attachments import apart
from core.features.attachments.formats import DocumentLimits
from core.features.attachments.transcription import TranscriptionSettings
from core.store import Store
from tests.fakes.ollama import Pause, Text
from tests.fakes.transcription import FakeTranscription, Hang, Refusal
from tests.fakes.voice import spoken_note
from tests.harness import Bot, BotFactory
from tests.ports import free_port

HEARD = "What is the weather tomorrow in Lisbon?"


@pytest.fixture
async def speech() -> AsyncIterator[FakeTranscription]:
    async with FakeTranscription(text=HEARD) as server:
        yield server


@pytest.fixture
def note() -> bytes:
    return spoken_note("what is the weather tomorrow in Lisbon", seconds=3)


def hearing(speech: FakeTranscription, make_bot: BotFactory, **changes: Any) -> Bot:
    return make_bot(transcription=TranscriptionSettings(url=speech.url, **changes))


def voice(bot: Bot, note: bytes, seconds: float | None = 3.0):  # type: ignore[no-untyped-def]
    return bot.channel.attach(
        "voice note.ogg", note, "audio/ogg", kind=AttachmentKind.VOICE, seconds=seconds
    )


def user_messages(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def pdf(*pages: str, password: str | None = None) -> bytes:
    document = FPDF()
    document.set_font("helvetica", size=12)
    for text in pages:
        document.add_page()
        document.multi_cell(0, 8, text)
    if password is not None:
        document.set_encryption(owner_password=password, user_password=password,
                                encryption_method=EncryptionMethod.AES_128)  # fmt: skip
    return bytes(document.output())


def word(*paragraphs: str) -> bytes:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# -- voice notes ----------------------------------------------------------------------------------


async def test_a_voice_note_is_heard_quoted_and_answered_as_the_persons_spoken_words(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    bot.ollama.script(Text("Sunny, 24 °C."))
    speech.script(Hang())  # the status line is shown while the server works, not raced past

    await bot.send("", attachments=(voice(bot, note),))
    await speech.hanging()
    await bot.channel.wait_until(
        lambda: any(
            frame.activity == "transcribing your voice note…"
            for reply in bot.channel.replies
            for frame in reply.frames
        ),
        "the status line of a transcription",
    )
    speech.release()
    (reply,) = await bot.channel.finished()

    (upload,) = speech.uploads
    assert upload.problem is None and upload.seconds == pytest.approx(3.0, abs=0.05)
    asked = user_messages(bot.ollama.requests[-1])[-1]
    assert asked == (
        "[a voice note, 3 s, transcribed: these are the person's own words, spoken]\n" + HEARD
    )
    assert reply.outcome is Outcome.DONE
    assert reply.text == f"> 🎙 Heard (3 s): “{HEARD}”\n\nSunny, 24 °C."
    stored = [m for m in await bot.history() if m.role == "user"]
    assert [m.text for m in stored] == [asked]
    assert stored[0].author == "ann"
    assert await bot.assistant_text() == "Sunny, 24 °C."  # the quote is not the model's


async def test_a_caption_stays_the_question_above_the_transcript(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    bot.ollama.script(Text("Yes."))

    await bot.send("Is this right?", attachments=(voice(bot, note),))
    await bot.channel.finished()

    asked = user_messages(bot.ollama.requests[-1])[-1]
    assert asked.startswith("Is this right?\n\n[a voice note, 3 s, transcribed")


async def test_voice_notes_off_are_refused_in_one_line_naming_the_setting(
    make_bot: BotFactory, note: bytes
) -> None:
    bot = make_bot()

    await bot.send("", attachments=(voice(bot, note),))

    await bot.channel.wait_until(lambda: bot.channel.notices)
    ((_, said),) = bot.channel.notices
    assert "[transcription].url" in said and "\n" not in said
    assert bot.channel.downloads == [] and bot.ollama.requests == []


async def test_a_note_longer_than_max_seconds_is_refused_with_the_limit_before_a_download(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot, max_seconds=60)

    await bot.send("", attachments=(voice(bot, note, seconds=90),))

    await bot.channel.wait_until(lambda: bot.channel.notices)
    ((_, said),) = bot.channel.notices
    assert "1 min 30 s long" in said and "1 min ([transcription].max_seconds)" in said
    assert bot.channel.downloads == [] and speech.uploads == []


async def test_a_server_down_fails_the_turn_with_the_fix_and_keeps_the_note_untranscribed(
    make_bot: BotFactory, note: bytes
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    bot = make_bot(transcription=TranscriptionSettings(url=url))

    await bot.send("", attachments=(voice(bot, note),))
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note is not None and url in reply.note and "[transcription].url" in reply.note
    assert bot.ollama.requests == []
    (stored,) = [m.text for m in await bot.history() if m.role == "user"]
    assert stored.startswith("[a voice note, 3 s: attached, not read: I could not transcribe")


async def test_a_format_the_server_rejects_is_answered_with_its_reason(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    speech.script(Refusal(415, "Unsupported audio format: audio/x-flac", style="fastapi"))

    await bot.send("", attachments=(voice(bot, note),))
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert reply.note is not None and "Unsupported audio format" in reply.note


async def test_a_redelivered_voice_note_is_transcribed_and_answered_once(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    bot.ollama.script(Text("Once."))
    attached = (voice(bot, note),)

    await bot.send("", message_id="v-1", attachments=attached)
    await bot.channel.finished()
    await bot.send("", message_id="v-1", attachments=attached)  # the platform, again
    await bot.runner.wait_idle(bot.channel.replies[0].place)

    assert len(speech.uploads) == 1 and len(bot.channel.replies) == 1


async def test_a_stop_while_transcribing_ends_the_turn_stopped_and_says_what_was_attached(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    speech.script(Hang())

    await bot.send("", attachments=(voice(bot, note),))
    await speech.hanging()
    await bot.send("/stop")
    (reply,) = await bot.channel.finished()
    speech.release()

    assert reply.outcome is Outcome.STOPPED
    (stored,) = [m.text for m in await bot.history() if m.role == "user"]
    assert stored == "[a voice note, 3 s: attached, not read yet]"
    assert bot.ollama.requests == []


async def test_a_voice_note_recorded_at_shutdown_is_heard_at_the_next_start(
    speech: FakeTranscription, make_bot: BotFactory, store: Store, note: bytes
) -> None:
    """The inbox keeps what the note was, so the next process fetches it again."""
    first = hearing(speech, make_bot)
    first.ollama.script(Text("Busy"), Pause("busy"), Text(" still"))
    await first.send("first")
    await first.ollama.reached("busy")
    await first.send("", message_id="v-2", attachments=(voice(first, note),))  # queued
    await first.runner.shutdown()

    second = make_bot(bot_store=store, transcription=TranscriptionSettings(url=speech.url))
    second.channel.files.update(first.channel.files)
    second.ollama.script(Text("Sunny."))
    await Recovery(store, second.runner, {"test": second.channel}).resolve(
        await leftovers(store, second.runner.parts)
    )

    (reply,) = await second.channel.finished()
    assert reply.reply_to == "v-2" and reply.text is not None and HEARD in reply.text
    assert len(speech.uploads) == 1


# -- documents ------------------------------------------------------------------------------------


async def test_a_pdf_a_docx_and_a_code_file_join_the_question_as_named_blocks(
    make_bot: BotFactory,
) -> None:
    bot = make_bot()
    bot.ollama.script(Text("Section 3 says the budget is 12 k."))
    files = (
        bot.channel.attach(
            "plan.pdf", pdf("Intro", "Section 3: the budget is 12 k."), "application/pdf"
        ),
        bot.channel.attach("notes.docx", word("Meeting on Friday.")),
        bot.channel.attach("main.py", b"print('hello')\n", "text/x-python"),
    )

    await bot.send("What does section 3 say?", attachments=files)
    (reply,) = await bot.channel.finished()

    asked = user_messages(bot.ollama.requests[-1])[-1]
    assert asked.startswith("What does section 3 say?\n\n")
    assert '<document name="plan.pdf" kind="pdf" pages="2">' in asked
    assert "Section 3: the budget is 12 k." in asked
    assert '<document name="notes.docx" kind="docx">\nMeeting on Friday.\n</document>' in asked
    assert '<document name="main.py" kind="text">\nprint(\'hello\')\n</document>' in asked
    assert reply.text == "Section 3 says the budget is 12 k."  # nothing cut, nothing said
    assert [m.text for m in await bot.history() if m.role == "user"] == [asked]


async def test_a_document_larger_than_the_window_is_cut_to_fit_with_a_mark_told_to_the_person(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(context_window=4096)
    bot.ollama.script(Text("It is long."))
    long_text = "".join(f"Line {n}: nothing to see here.\n" for n in range(3000))

    await bot.send("Summarize", attachments=(bot.channel.attach("log.txt", long_text.encode()),))
    (reply,) = await bot.channel.finished()

    body = bot.ollama.requests[-1]
    asked = user_messages(body)[-1]
    assert "characters, all that fits the model's context window]\n</document>" in asked
    assert sum(len(m["content"]) for m in body["messages"]) < 4096 * 4
    assert reply.outcome is Outcome.DONE
    assert reply.text is not None and reply.text.startswith("> 📄 log.txt: kept the first 60,000")


async def test_a_scanned_pdf_and_an_encrypted_one_say_so_and_the_model_is_not_asked(
    make_bot: BotFactory,
) -> None:
    bot = make_bot()
    scanned = FPDF()
    scanned.add_page()  # a page with no text on it, as a scan's image-only page reads
    files = (bot.channel.attach("scan.pdf", bytes(scanned.output())),)

    await bot.send("Read this", attachments=files)
    await bot.send(
        "And this", attachments=(bot.channel.attach("secret.pdf", pdf("x", password="pw")),)
    )
    first, second = await bot.channel.finished(2)

    assert first.outcome is Outcome.FAILED and "scan.pdf" in (first.note or "")
    assert "no text" in (first.note or "")
    assert second.outcome is Outcome.FAILED and "password" in (second.note or "")
    assert bot.ollama.requests == []


async def test_a_file_type_kaiwa_cannot_read_is_named_before_anything_is_downloaded(
    make_bot: BotFactory,
) -> None:
    bot = make_bot()

    await bot.send("Run this", attachments=(bot.channel.attach("setup.exe", b"MZ\x90\x00"),))

    await bot.channel.wait_until(lambda: bot.channel.notices)
    ((_, said),) = bot.channel.notices
    assert said.startswith("Kaiwa cannot read .exe files; it reads PDF, DOCX and text files")
    assert bot.channel.downloads == []


async def test_a_document_past_max_bytes_is_refused_by_its_declared_size(
    make_bot: BotFactory,
) -> None:
    bot = make_bot(documents=DocumentLimits(max_bytes=1024))
    big = bot.channel.attach("big.csv", b"a,b\n", size=5000)

    await bot.send("Total?", attachments=(big,))

    await bot.channel.wait_until(lambda: bot.channel.notices)
    ((_, said),) = bot.channel.notices
    assert "big.csv is 4.9 KB" in said and "([documents].max_bytes)" in said


async def test_a_file_gone_from_the_platform_fails_with_the_channels_words(
    make_bot: BotFactory,
) -> None:
    bot = make_bot()
    gone = bot.channel.attach("notes.md", b"# Notes\n")
    del bot.channel.files[gone.source]

    await bot.send("Read it", attachments=(gone,))
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED and reply.note == "notes.md is gone: send it again"


async def test_a_voice_note_and_a_document_in_one_message_are_both_read(
    speech: FakeTranscription, make_bot: BotFactory, note: bytes
) -> None:
    bot = hearing(speech, make_bot)
    bot.ollama.script(Text("Both."))
    files = (voice(bot, note), bot.channel.attach("data.json", b'{"city": "Lisbon"}'))

    await bot.send("", attachments=files)
    (reply,) = await bot.channel.finished()

    asked = user_messages(bot.ollama.requests[-1])[-1]
    assert asked.index("transcribed") < asked.index('<document name="data.json"')
    assert reply.text is not None and reply.text.startswith("> 🎙 Heard (3 s)")


async def test_a_read_that_takes_too_long_is_stopped_and_said(
    make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child reading a document is killed past its deadline (a pathological PDF)."""
    monkeypatch.setattr(apart, "READ_SECONDS", 0.001)
    bot = make_bot()

    await bot.send("Read", attachments=(bot.channel.attach("slow.txt", b"words\n"),))
    (reply,) = await bot.channel.finished()

    assert reply.outcome is Outcome.FAILED
    assert "slow.txt took longer than" in (reply.note or "")
