"""`Transcriber` against the fake speech-to-text server, with voice notes spoken by espeak-ng and
encoded by ffmpeg as Telegram sends them (`tests.fakes.voice.spoken_note`).

The fake checks each upload is a whole OGG Opus stream and measures its length itself, so a test
can say the server received a valid note of the right length. Every refusal has a test: off, too
large, too long (by the platform's length and by the file's own, both before any request), the
server down, a key refused, a 404, the server's own reason for a file it will not take (in
OpenAI's, speaches' and whisper.cpp's shapes), a timeout, a broken connection, a failure, and
an answer that is not a transcript.
"""

import asyncio
import io
import wave
from collections.abc import AsyncIterator

import pytest

from core.features.attachments.transcription import (
    OFF,
    Failure,
    ServerCheck,
    Transcriber,
    Transcript,
    TranscriptionError,
    TranscriptionSettings,
    audio_seconds,
)
from tests.fakes.patience import deadline, scaled
from tests.fakes.transcription import (
    DEFAULT_MODEL,
    Close,
    FakeTranscription,
    Hang,
    Raw,
    Refusal,
)
from tests.fakes.voice import spoken_note
from tests.ports import free_port

WORDS = "Hello from Kaiwa. Please water the plants on Friday."
KEY = "sk-local-7f3a9c"
KEY_ENV = "KAIWA_TEST_TRANSCRIPTION_KEY"


@pytest.fixture
def note() -> bytes:
    return spoken_note(WORDS, seconds=5)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTranscription]:
    async with FakeTranscription(text=WORDS) as server:
        yield server


def settings(url: str, **changes: object) -> TranscriptionSettings:
    return TranscriptionSettings(url=url, timeout_seconds=deadline(), **changes)  # type: ignore[arg-type]


async def transcribe(
    transcriber_settings: TranscriptionSettings,
    data: bytes,
    seconds: float | None = None,
    environ: dict[str, str] | None = None,
) -> Transcript:
    transcriber = Transcriber(transcriber_settings, environ or {})
    try:
        return await transcriber.transcribe("voice.ogg", data, "audio/ogg", seconds)
    finally:
        await transcriber.aclose()


async def refusal(
    transcriber_settings: TranscriptionSettings,
    data: bytes,
    seconds: float | None = None,
    environ: dict[str, str] | None = None,
) -> TranscriptionError:
    with pytest.raises(TranscriptionError) as caught:
        await transcribe(transcriber_settings, data, seconds, environ)
    return caught.value


async def checked(
    transcriber_settings: TranscriptionSettings, environ: dict[str, str] | None = None
) -> ServerCheck:
    transcriber = Transcriber(transcriber_settings, environ or {})
    try:
        return await transcriber.check()
    finally:
        await transcriber.aclose()


async def test_a_voice_note_is_transcribed_with_its_length(
    fake: FakeTranscription, note: bytes
) -> None:
    transcript = await transcribe(settings(fake.url, language="en"), note)

    assert transcript.text == WORDS
    assert transcript.seconds == pytest.approx(5.0, abs=0.5)
    [upload] = fake.uploads
    assert upload.problem is None
    assert upload.seconds == pytest.approx(5.0, abs=0.5)  # a valid OGG Opus file of 5 s
    assert (upload.filename, upload.content_type, upload.size) == (
        "voice.ogg",
        "audio/ogg",
        len(note),
    )
    assert (upload.model, upload.language, upload.response_format) == (
        DEFAULT_MODEL,
        "en",
        "verbose_json",
    )
    assert upload.authorization is None


async def test_the_platforms_length_is_kept_before_the_servers(
    fake: FakeTranscription, note: bytes
) -> None:
    transcript = await transcribe(settings(fake.url), note, seconds=6)

    assert transcript.seconds == 6
    assert fake.uploads[0].language is None  # no language configured: the server detects it


async def test_a_server_that_answers_only_the_text_leaves_the_length_to_the_file(
    fake: FakeTranscription, note: bytes
) -> None:
    fake.script(Raw('{"text": "  Water the plants.  "}'))

    transcript = await transcribe(settings(fake.url), note)

    assert transcript.text == "Water the plants."
    assert transcript.seconds == pytest.approx(5.0, abs=0.05)


async def test_a_base_url_ending_in_v1_reaches_the_same_paths(
    fake: FakeTranscription, note: bytes
) -> None:
    transcript = await transcribe(settings(fake.url + "/v1/"), note)

    assert transcript.text == WORDS


async def test_the_key_goes_as_a_bearer_token_from_the_named_variable(note: bytes) -> None:
    async with FakeTranscription(text=WORDS, api_key=KEY) as fake:
        keyed = settings(fake.url, api_key_env=KEY_ENV)
        transcript = await transcribe(keyed, note, environ={KEY_ENV: KEY})

        assert transcript.text == WORDS
        assert fake.uploads[0].authorization == f"Bearer {KEY}"
        assert KEY not in repr(keyed)


async def test_a_refused_key_says_which_variable_and_never_the_key(note: bytes) -> None:
    async with FakeTranscription(api_key="the-right-one") as fake:
        keyed = settings(fake.url, api_key_env=KEY_ENV)
        wrong = await refusal(keyed, note, environ={KEY_ENV: KEY})
        unset = await refusal(keyed, note, environ={})
        unnamed = await refusal(settings(fake.url), note)

    for error in (wrong, unset, unnamed):
        assert (error.reason, error.status) == (Failure.KEY, 401)
        assert "Incorrect API key provided" in str(error)
        assert KEY not in str(error)
    assert f"Check the key in ${KEY_ENV}" in str(wrong)
    assert f"${KEY_ENV} ([transcription].api_key_env) is not set" in str(unset)
    assert "name that in [transcription].api_key_env" in str(unnamed)


async def test_voice_notes_off_say_how_to_turn_them_on(note: bytes) -> None:
    error = await refusal(TranscriptionSettings(), note)

    assert error.reason is Failure.OFF
    assert str(error) == OFF
    assert "[transcription].url" in str(error)


async def test_a_server_that_is_down_is_named_with_the_fix(note: bytes) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    error = await refusal(settings(url), note)

    assert error.reason is Failure.UNREACHABLE
    assert str(error) == (
        f"I could not transcribe your voice note: the transcription server at {url} does not "
        "answer. Start it, or check [transcription].url"
    )


async def test_a_model_the_server_does_not_have_is_a_404_with_its_reason(
    fake: FakeTranscription, note: bytes
) -> None:
    error = await refusal(settings(fake.url, model="whisper-huge"), note)

    assert (error.reason, error.status) == (Failure.NOT_FOUND, 404)
    assert "The model 'whisper-huge' does not exist." in str(error)
    assert "Check [transcription].url" in str(error)
    assert "that it has the model whisper-huge" in str(error)


async def test_a_wrong_path_is_a_404_naming_the_url(fake: FakeTranscription, note: bytes) -> None:
    error = await refusal(settings(fake.url + "/whisper"), note)

    assert (error.reason, error.status) == (Failure.NOT_FOUND, 404)
    assert "for /whisper/v1/audio/transcriptions" in str(error)
    assert "--inference-path /v1/audio/transcriptions" in str(error)


async def test_a_file_the_server_cannot_read_is_refused_with_its_reason_quoted(
    fake: FakeTranscription,
) -> None:
    error = await refusal(settings(fake.url), b"ID3\x04not really an mp3 at all")

    assert (error.reason, error.status) == (Failure.REJECTED, 400)
    assert str(error) == (
        f"I could not transcribe your voice note: the transcription server at {fake.url} "
        'refused it (HTTP 400): "Invalid audio file: not an Ogg file: it does not start with '
        'the capture pattern OggS"'
    )
    assert fake.uploads[0].problem is not None


@pytest.mark.parametrize(
    ("refused", "status", "hint"),
    [
        (Refusal(415, "Failed to decode audio. The provided file type is not supported.",
                 "fastapi"), 415, True),
        (Refusal(422, "response_format: Input should be 'json' or 'text'", "openai"), 422, False),
        (Refusal(200, "failed to read audio data", "whisper.cpp"), None, True),
    ],
)  # fmt: skip
async def test_each_servers_shape_of_refusal_is_quoted(
    fake: FakeTranscription, note: bytes, refused: Refusal, status: int | None, hint: bool
) -> None:
    fake.script(refused)

    error = await refusal(settings(fake.url), note)

    assert (error.reason, error.status) == (Failure.REJECTED, status)
    assert f'"{refused.message}"' in str(error)
    assert ("give it ffmpeg (whisper.cpp's server: --convert)" in str(error)) is hint


async def test_a_server_that_hangs_times_out_with_the_setting_to_raise(
    fake: FakeTranscription, note: bytes
) -> None:
    fake.script(Hang())

    patience = scaled(1.0)  # long enough for the upload to arrive, short for a test to wait

    error = await refusal(TranscriptionSettings(url=fake.url, timeout_seconds=patience), note)
    async with asyncio.timeout(deadline()):
        await fake.hanging()  # the upload arrived whole; the answer never came
    fake.release()

    assert error.reason is Failure.TIMED_OUT
    assert fake.uploads[0].problem is None
    assert f"did not answer within {patience:g} s" in str(error)
    assert "[transcription].timeout_seconds" in str(error)


async def test_a_connection_closed_without_an_answer_is_a_failure(
    fake: FakeTranscription, note: bytes
) -> None:
    fake.script(Close())

    error = await refusal(settings(fake.url), note)

    assert error.reason is Failure.FAILED
    assert "broke off without an answer" in str(error)


async def test_a_server_error_is_a_failure_with_its_reason(
    fake: FakeTranscription, note: bytes
) -> None:
    fake.script(Refusal(500, "CUDA out of memory"))

    error = await refusal(settings(fake.url), note)

    assert (error.reason, error.status) == (Failure.FAILED, 500)
    assert "failed (HTTP 500: CUDA out of memory); its log says why" in str(error)


@pytest.mark.parametrize(
    "answer",
    [Raw("<html><body>It works!</body></html>", "text/html"), Raw('{"words": "Hello"}'), Raw("[]")],
)
async def test_an_answer_that_is_not_a_transcript_is_malformed(
    fake: FakeTranscription, note: bytes, answer: Raw
) -> None:
    fake.script(answer)

    error = await refusal(settings(fake.url), note)

    assert error.reason is Failure.MALFORMED
    assert "answered something that is not a transcript" in str(error)
    assert "OpenAI-compatible speech-to-text server" in str(error)


async def test_a_note_longer_than_the_limit_by_the_platforms_length_is_not_sent(
    fake: FakeTranscription, note: bytes
) -> None:
    error = await refusal(settings(fake.url), note, seconds=312)

    assert error.reason is Failure.TOO_LONG
    assert str(error) == (
        "I could not transcribe your voice note: it is 5 min 12 s long, and I take notes up to "
        "5 min ([transcription].max_seconds); send a shorter one"
    )
    assert fake.uploads == []


async def test_a_note_longer_than_the_limit_by_its_own_length_is_not_sent(
    fake: FakeTranscription, note: bytes
) -> None:
    error = await refusal(settings(fake.url, max_seconds=3), note)  # the platform said nothing

    assert error.reason is Failure.TOO_LONG
    assert "it is 5 s long, and I take notes up to 3 s" in str(error)
    assert fake.uploads == []


async def test_a_file_larger_than_the_limit_is_not_sent(
    fake: FakeTranscription, note: bytes
) -> None:
    error = await refusal(settings(fake.url, max_bytes=4096), note)

    assert error.reason is Failure.TOO_LARGE
    size = f"{len(note) / 1024:.1f}".removesuffix(".0")
    assert str(error) == (
        f"I could not transcribe your voice note: it is {size} KB, and I take files up to "
        "4 KB ([transcription].max_bytes)"
    )
    assert fake.uploads == []


def test_audio_seconds_reads_an_ogg_opus_note_and_a_wav_file() -> None:
    assert audio_seconds(spoken_note(WORDS, seconds=5)) == pytest.approx(5.0, abs=0.05)
    assert audio_seconds(spoken_note(WORDS, seconds=30)) == pytest.approx(30.0, abs=0.05)
    assert audio_seconds(_wav(frames=36_000, rate=16_000)) == 2.25


def test_audio_seconds_is_none_for_what_it_cannot_measure() -> None:
    note = spoken_note(WORDS, seconds=5)

    assert audio_seconds(b"") is None
    assert audio_seconds(b"\xff\xfb\x90\x00 an mp3 frame") is None
    assert audio_seconds(b"OggS" + bytes(200)) is None
    assert audio_seconds(note[: len(note) // 2]) is None  # cut inside a page
    assert audio_seconds(note.replace(b"OpusHead", b"OpusHeat")) is None  # not Opus


async def test_check_says_the_server_has_the_model(fake: FakeTranscription) -> None:
    found = await checked(settings(fake.url))

    assert found.fine == [f"ok: the transcription server at {fake.url} has {DEFAULT_MODEL}"]
    assert found.problems == []


async def test_check_flags_a_model_the_server_does_not_have() -> None:
    async with FakeTranscription(["Systran/faster-whisper-tiny", "whisper-1"]) as fake:
        found = await checked(settings(fake.url))

    assert found.fine == []
    assert found.problems == [
        f"the transcription server at {fake.url} does not have the model {DEFAULT_MODEL} (it "
        "lists: Systran/faster-whisper-tiny, whisper-1): set [transcription].model to one it "
        f"has, or install it there (speaches: `curl -X POST {fake.url}/v1/models/"
        f"{DEFAULT_MODEL}`)"
    ]


async def test_check_flags_a_server_that_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    found = await checked(settings(url))

    assert found.fine == []
    assert found.problems == [
        f"the transcription server at {url} does not answer. Start it, or check [transcription].url"
    ]


async def test_check_takes_a_server_that_lists_no_models_as_answering() -> None:
    async with FakeTranscription(lists_models=False) as fake:
        found = await checked(settings(fake.url))

    assert [line.split(";")[0] for line in found.fine] == [
        f"ok: the transcription server at {fake.url} answers"
    ]
    assert "[transcription].model is not checked" in found.fine[0]
    assert found.problems == []


async def test_check_flags_a_key_variable_that_is_not_set() -> None:
    async with FakeTranscription(api_key=KEY) as fake:
        keyed = settings(fake.url, api_key_env=KEY_ENV)
        refused = await checked(keyed)
        accepted = await checked(keyed, {KEY_ENV: KEY})

    [problem] = refused.problems
    assert problem.startswith(f"the transcription server at {fake.url} refused the request")
    assert f"${KEY_ENV} ([transcription].api_key_env) is not set" in problem
    assert accepted.problems == []
    assert fake.model_listings == 2


async def test_check_with_voice_notes_off_finds_nothing_wrong() -> None:
    found = await checked(TranscriptionSettings())

    assert found.problems == []
    assert found.fine == ["voice notes: off (set [transcription].url to hear them)"]


def _wav(frames: int, rate: int) -> bytes:
    """A mono 16-bit WAV file of silence, written by the standard library's `wave`."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(2 * frames))
    return buffer.getvalue()
