"""The fake speech-to-text server, spoken to with a bare httpx client: the three answer formats,
the models listing, the key, and the uploads it refuses because they are not a whole OGG Opus
stream (a voice note cut short, damaged, or of another kind), each refusal naming why.
"""

import asyncio
import io
import sys
import wave
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from .patience import deadline
from .transcription import (
    DEFAULT_MODEL,
    DEFAULT_TEXT,
    FakeTranscription,
    NotOpus,
    Refusal,
    read_ogg_opus,
)
from .voice import spoken_note

REPO_ROOT = Path(__file__).resolve().parents[2]
WORDS = "The fake hears nothing; it checks the file."


@pytest.fixture
async def fake() -> AsyncIterator[FakeTranscription]:
    async with FakeTranscription() as server:
        yield server


async def post(
    url: str, data: bytes, headers: dict[str, str] | None = None, **fields: str
) -> httpx.Response:
    form = {"model": DEFAULT_MODEL, **fields}
    async with httpx.AsyncClient(trust_env=False, timeout=deadline()) as client:
        return await client.post(
            f"{url}/v1/audio/transcriptions",
            data=form,
            files={"file": ("note.ogg", data, "audio/ogg")},
            headers=headers,
        )


def test_a_spoken_note_is_one_mono_opus_stream_of_the_length_asked() -> None:
    stream = read_ogg_opus(spoken_note(WORDS, seconds=7))

    assert stream.seconds == pytest.approx(7.0, abs=0.05)
    assert stream.channels == 1
    assert stream.packets > 2  # OpusHead, OpusTags, then audio


async def test_verbose_json_says_the_length_the_fake_measured(fake: FakeTranscription) -> None:
    response = await post(fake.url, spoken_note(WORDS, seconds=4), response_format="verbose_json")

    body = response.json()
    assert response.status_code == 200
    assert body["text"] == DEFAULT_TEXT
    assert body["duration"] == pytest.approx(4.0, abs=0.05)
    assert body["language"] == "en"
    assert body["segments"][0]["end"] == body["duration"]
    assert fake.uploads[0].seconds == body["duration"]


async def test_json_is_the_text_alone_and_text_is_plain(fake: FakeTranscription) -> None:
    note = spoken_note(WORDS)
    as_json = await post(fake.url, note)
    as_text = await post(fake.url, note, response_format="text")

    assert as_json.json() == {"text": DEFAULT_TEXT}
    assert as_text.headers["content-type"].startswith("text/plain")
    assert as_text.text == DEFAULT_TEXT + "\n"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda note: note[: len(note) - 100], "cut short"),
        (lambda note: note[:3000] + bytes([note[3000] ^ 0xFF]) + note[3001:], "fails its CRC"),
        (lambda note: note.replace(b"OpusTags", b"OpusTagz", 1), "fails its CRC"),
        (lambda note: b"RIFF" + note[4:], "not an Ogg file"),
    ],
)
async def test_an_upload_that_is_not_a_whole_opus_stream_is_refused_naming_why(
    fake: FakeTranscription, damage: Callable[[bytes], bytes], why: str
) -> None:
    response = await post(fake.url, damage(spoken_note(WORDS, seconds=3)))

    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith("Invalid audio file: ")
    assert why in message
    assert fake.uploads[0].seconds is None
    assert why in (fake.uploads[0].problem or "")


def test_a_wav_file_is_not_opus() -> None:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(bytes(3200))

    with pytest.raises(NotOpus, match="not an Ogg file"):
        read_ogg_opus(buffer.getvalue())


async def test_a_refusal_takes_each_servers_shape(fake: FakeTranscription) -> None:
    note = spoken_note(WORDS)
    fake.script(
        Refusal(415, "cannot decode", "fastapi"),
        Refusal(200, "failed to read audio data", "whisper.cpp"),
        Refusal(422, "bad format"),
    )

    shapes = [(await post(fake.url, note)) for _ in range(3)]

    assert [(r.status_code, r.json()) for r in shapes[:2]] == [
        (415, {"detail": "cannot decode"}),
        (200, {"error": "failed to read audio data"}),
    ]
    assert shapes[2].json()["error"]["message"] == "bad format"


async def test_an_unknown_model_is_404_and_keeps_the_script(fake: FakeTranscription) -> None:
    fake.script(Refusal(500, "scripted"))

    unknown = await post(fake.url, spoken_note(WORDS), model="whisper-huge")
    scripted = await post(fake.url, spoken_note(WORDS))

    assert unknown.status_code == 404
    assert scripted.status_code == 500


async def test_models_are_listed_and_a_key_is_required_when_set() -> None:
    async with FakeTranscription(["a", "b"], api_key="k") as fake:
        async with httpx.AsyncClient(trust_env=False, base_url=fake.url) as client:
            without = await client.get("/v1/models")
            listed = await client.get("/v1/models", headers={"Authorization": "Bearer k"})
        refused = await post(fake.url, spoken_note(WORDS), model="a")

    assert without.status_code == 401
    assert [entry["id"] for entry in listed.json()["data"]] == ["a", "b"]
    assert refused.status_code == 401
    assert fake.uploads[0].authorization is None


async def test_command_line_server_for_benchmarks() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.transcription",
        "--port",
        "0",
        "--text",
        WORDS,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(deadline()):
            ready = (await process.stdout.readline()).decode().split()
        assert ready[0] == "READY"
        response = await post(ready[1], spoken_note(WORDS))
    finally:
        process.terminate()
        async with asyncio.timeout(deadline()):
            await process.communicate()

    assert response.json() == {"text": WORDS}
