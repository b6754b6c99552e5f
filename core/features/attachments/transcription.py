"""Voice notes as text, heard by a local speech-to-text server over the OpenAI-compatible API.

Why it is shaped so:
- Kaiwa runs on a local model, so its voice notes stay on the machine too. The local servers
  share one wire protocol, OpenAI's `POST /v1/audio/transcriptions`, a multipart upload of
  `file`, `model` and the optional `language` and `response_format`: the faster-whisper servers
  (speaches, once faster-whisper-server), LocalAI, and whisper.cpp's `whisper-server` when it is
  started with `--inference-path /v1/audio/transcriptions` (its own path is `/inference`). So
  one client speaks that, and `[transcription].url` names the server's base URL.
- The caps come first, before a byte is sent: a file over `max_bytes`, or a note over
  `max_seconds` by what the platform says of its length or by what the file says of itself.
  `audio_seconds` reads that from the container in pure Python (an OGG stream's last granule
  position, a WAV file's data size), so no ffprobe is needed at run time.
- `verbose_json` is asked for because it carries the note's `duration`; a server that answers
  only `{"text": ...}` is read the same, without it. The length kept with the transcript is the
  platform's when it gave one, else the server's, else the file's.
- Servers say no in three shapes, each read for the reason it gives: OpenAI's and LocalAI's
  `{"error": {"message", "type"}}`; FastAPI's `{"detail": ...}` (speaches: a format it cannot
  decode is a 415, a model it has not downloaded a 404); and whisper.cpp's `{"error": "..."}`,
  which comes with HTTP 200 ("failed to read audio data"), so a 200 without text is read for it.
- Every failure is one `TranscriptionError`, its `reason` a `Failure`, its message in words for
  the person with the fix. The API key lives in the environment variable `api_key_env` names;
  it is sent as a bearer token and appears in no message, log line or repr.
"""

import asyncio
import logging
import math
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from core.errors import KaiwaError
from core.text import clean, size_in_words

logger = logging.getLogger(__name__)

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
MODELS_PATH = "/v1/models"
DEFAULT_MODEL = "Systran/faster-whisper-small"
"""speaches' name of whisper small (multilingual, fast enough on a CPU); whisper.cpp's server
ignores the name and uses the model it was started with."""
CONNECT_SECONDS = 5.0
"""A local server that does not accept a connection within this is not running."""
REASON_CHARS = 300
"""How much of a server's own reason is quoted: a sentence, never a whole HTML page."""
OPUS_RATE = 48_000
"""Opus granule positions count samples at 48 kHz, whatever the input's rate was."""
PREFIX = "I could not transcribe your voice note: "
OFF = (
    "Voice notes are off: set [transcription].url in config.toml to a local speech-to-text "
    "server (see README, Voice notes and documents)"
)
OGG_PAGE = struct.Struct("<4sBBqIIIB")
"""An Ogg page header: capture pattern, version, flags, granule position, serial number,
sequence number, CRC, and the number of lacing values that follow."""


@dataclass(frozen=True)
class TranscriptionSettings:
    url: str = ""
    """The server's base URL (`http://127.0.0.1:8000`, a trailing /v1 is fine); empty: voice
    notes are off."""
    model: str = DEFAULT_MODEL
    api_key_env: str = ""
    """The name of the environment variable holding the server's API key; empty: none sent."""
    language: str = ""
    """The language the notes are spoken in, as an ISO-639-1 code ("en"); empty: detected."""
    max_seconds: float = 300.0
    max_bytes: int = 25 * 1024 * 1024
    timeout_seconds: float = 120.0
    """Seconds for one note's upload and transcription, whole."""

    @property
    def enabled(self) -> bool:
        return bool(self.url.strip())


class Failure(StrEnum):
    """Why a note was not transcribed."""

    OFF = "off"
    TOO_LARGE = "too large"
    TOO_LONG = "too long"
    UNREACHABLE = "unreachable"
    TIMED_OUT = "timed out"
    KEY = "key refused"
    NOT_FOUND = "not found"
    REJECTED = "rejected"
    FAILED = "failed"
    MALFORMED = "malformed"


class TranscriptionError(KaiwaError):
    """A voice note that was not transcribed. The message is for the person who sent it, with
    the fix; `detail` is the same without the opening words, for a line of `kaiwa check`."""

    def __init__(self, reason: Failure, detail: str, *, status: int | None = None) -> None:
        super().__init__(OFF if reason is Failure.OFF else PREFIX + detail)
        self.reason = reason
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class Transcript:
    text: str
    seconds: float | None
    """The note's length: the platform's, else the server's, else the file's; None if none
    of them said."""


@dataclass(frozen=True)
class ServerCheck:
    """What `kaiwa check` prints of the transcription server: lines that are fine, problems."""

    fine: list[str]
    problems: list[str]


class Transcriber:
    """One transcription server's client: a connection pool of its own, closed by `aclose`."""

    def __init__(
        self, settings: TranscriptionSettings, environ: Mapping[str, str] = os.environ
    ) -> None:
        self.settings = settings
        self._url = settings.url.strip()
        self._base = _base_url(self._url)
        key = environ.get(settings.api_key_env, "").strip() if settings.api_key_env else ""
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._key_unset = bool(settings.api_key_env) and not key
        connect = min(CONNECT_SECONDS, settings.timeout_seconds)
        self._client = httpx.AsyncClient(
            trust_env=False, timeout=httpx.Timeout(settings.timeout_seconds, connect=connect)
        )

    async def transcribe(
        self, name: str, data: bytes, media_type: str | None, seconds: float | None = None
    ) -> Transcript:
        """The words of the note `data` (a file called `name`, of `media_type`; `seconds` long
        if the platform says). Raises `TranscriptionError`, checking the caps before sending."""
        try:
            file_seconds = self._within_caps(data, seconds)
            started = time.perf_counter()
            response = await self._post(name, data, media_type)
            transcript = self._transcript(response, seconds, file_seconds)
        except TranscriptionError as exc:
            level = logging.INFO if exc.reason is Failure.OFF else logging.WARNING
            logger.log(level, "voice note %s (%d bytes) not transcribed: %s", name, len(data), exc)
            raise
        logger.info(
            "voice note %s transcribed: %d bytes, %s s long, %d characters, in %.2f s",
            name,
            len(data),
            "?" if transcript.seconds is None else f"{transcript.seconds:.1f}",
            len(transcript.text),
            time.perf_counter() - started,
        )
        return transcript

    async def check(self) -> ServerCheck:
        """Whether the server answers (`GET /v1/models`), and whether it has the model."""
        if not self.settings.enabled:
            return ServerCheck(["voice notes: off (set [transcription].url to hear them)"], [])
        limit = min(2 * CONNECT_SECONDS, self.settings.timeout_seconds)
        try:
            async with asyncio.timeout(limit):
                response = await self._client.get(self._base + MODELS_PATH, headers=self._headers)
        except (TimeoutError, httpx.HTTPError) as exc:
            failure = self._transport_failure(exc, limit)
            return ServerCheck([], [*self._unset_key(), failure.detail])
        if response.status_code in (401, 403):  # the refusal's fix names the key
            return ServerCheck([], [self._refusal(response, None).detail])
        listing = self._listing(response)
        return ServerCheck(listing.fine, [*self._unset_key(), *listing.problems])

    def _listing(self, response: httpx.Response) -> ServerCheck:
        """What the answer to `GET /v1/models` says of the server and the model."""
        if response.status_code == 404:
            return ServerCheck([self._answers_unlisted()], [])
        if not response.is_success:
            return ServerCheck([], [self._refusal(response, None).detail])
        models = _model_ids(response)
        if models is None:
            return ServerCheck([], [self._malformed(response, "a list of models").detail])
        model = self.settings.model
        if model in models:
            return ServerCheck([f"ok: the transcription server at {self._url} has {model}"], [])
        return ServerCheck(
            [],
            [
                f"the transcription server at {self._url} does not have the model {model} (it "
                f"lists: {', '.join(models) or 'none'}): set [transcription].model to one it "
                f"has, or install it there (speaches: `curl -X POST "
                f"{self._base}{MODELS_PATH}/{model}`)"
            ],
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _within_caps(self, data: bytes, seconds: float | None) -> float | None:
        """The file's own length (None if it does not say), once it is known to be within the
        caps; `TranscriptionError` otherwise, or when transcription is off."""
        file_seconds = audio_seconds(data)
        longest = max((s for s in (seconds, file_seconds) if s is not None), default=None)
        refusal = refusal_before(self.settings, len(data), longest)
        if refusal is not None:
            raise refusal
        return file_seconds

    async def _post(self, name: str, data: bytes, media_type: str | None) -> httpx.Response:
        settings = self.settings
        form = {"model": settings.model, "response_format": "verbose_json"}
        if settings.language:
            form["language"] = settings.language
        upload = (name or "voice-note", data, media_type or "application/octet-stream")
        try:
            async with asyncio.timeout(settings.timeout_seconds):
                return await self._client.post(
                    self._base + TRANSCRIPTIONS_PATH,
                    data=form,
                    files={"file": upload},
                    headers=self._headers,
                )
        except (TimeoutError, httpx.HTTPError) as exc:
            raise self._transport_failure(exc, settings.timeout_seconds) from exc

    def _transcript(
        self, response: httpx.Response, seconds: float | None, file_seconds: float | None
    ) -> Transcript:
        if not response.is_success:
            raise self._refusal(response, self.settings.model)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise self._malformed(response, "a transcript")
        text = body.get("text")
        if not isinstance(text, str):
            reason = _reason(body)
            if reason:  # whisper.cpp's refusal, with HTTP 200
                raise TranscriptionError(Failure.REJECTED, self._rejected(reason, None))
            raise self._malformed(response, "a transcript")
        known = [
            s for s in (seconds, _seconds(body.get("duration")), file_seconds) if s is not None
        ]
        return Transcript(clean(text).strip(), known[0] if known else None)

    def _transport_failure(self, exc: BaseException, limit: float) -> TranscriptionError:
        """What a request that got no answer (within `limit` seconds) tells the person."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return TranscriptionError(
                Failure.UNREACHABLE,
                f"the transcription server at {self._url} does not answer. Start it, or check "
                "[transcription].url",
            )
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            return TranscriptionError(
                Failure.TIMED_OUT,
                f"the transcription server at {self._url} did not answer within "
                f"{limit:g} s. It may be busy; try again, or raise "
                "[transcription].timeout_seconds",
            )
        return TranscriptionError(
            Failure.FAILED,
            f"the transcription server at {self._url} broke off without an answer "
            f"({type(exc).__name__}). Try again; its log says why if it keeps happening",
        )

    def _refusal(self, response: httpx.Response, model: str | None) -> TranscriptionError:
        """What an error status tells the person; `model` is None for the models listing."""
        status = response.status_code
        reason = _reason(_json_or_none(response)) or _plain(response.text)
        said = f"HTTP {status}: {reason}" if reason else f"HTTP {status}"
        path = response.request.url.path
        if status in (401, 403):
            detail = f"the transcription server at {self._url} refused the request ({said}). "
            return TranscriptionError(Failure.KEY, detail + self._key_fix(), status=status)
        if status == 404:
            installed = "" if model is None else f", and that it has the model {model}"
            return TranscriptionError(
                Failure.NOT_FOUND,
                f"the transcription server at {self._url} answered {said} for {path}. Check "
                f"[transcription].url (whisper.cpp's server needs --inference-path "
                f"{TRANSCRIPTIONS_PATH}){installed}",
                status=status,
            )
        if status == 413:
            return TranscriptionError(
                Failure.TOO_LARGE,
                f"the transcription server at {self._url} took the file for too large ({said}). "
                "Lower [transcription].max_bytes to its limit, or raise the server's",
                status=status,
            )
        if status in (400, 415, 422):
            return TranscriptionError(
                Failure.REJECTED, self._rejected(reason, status), status=status
            )
        return TranscriptionError(
            Failure.FAILED,
            f"the transcription server at {self._url} failed ({said}); its log says why",
            status=status,
        )

    def _rejected(self, reason: str, status: int | None) -> str:
        """A refusal of the file itself, its reason quoted. A 415, or whisper.cpp's refusal
        with HTTP 200 ("failed to read audio data"), is a format the server cannot decode."""
        code = "" if status is None else f" (HTTP {status})"
        said = f'"{reason}"' if reason else "no reason given"
        undecoded = status in (None, 415)
        hint = (
            ". If it cannot read this kind of audio, give it ffmpeg (whisper.cpp's server: "
            "--convert)"
            if undecoded
            else ""
        )
        return f"the transcription server at {self._url} refused it{code}: {said}{hint}"

    def _malformed(self, response: httpx.Response, wanted: str) -> TranscriptionError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        return TranscriptionError(
            Failure.MALFORMED,
            f"the transcription server at {self._url} answered something that is not "
            f"{wanted} ({kind}: {_plain(response.text)[:80]!r}). Check that [transcription].url "
            "points at an OpenAI-compatible speech-to-text server",
            status=response.status_code,
        )

    def _key_fix(self) -> str:
        env = self.settings.api_key_env
        if not env:
            return (
                "It wants an API key: put it in an environment variable and name that in "
                "[transcription].api_key_env"
            )
        if self._key_unset:
            return f"${env} ([transcription].api_key_env) is not set: set it to the server's key"
        return f"Check the key in ${env} ([transcription].api_key_env)"

    def _unset_key(self) -> list[str]:
        """The problem of a key variable that is named but not set, if it is."""
        if not self._key_unset:
            return []
        env = self.settings.api_key_env
        return [f"${env} ([transcription].api_key_env) is not set: no key is sent to the server"]

    def _answers_unlisted(self) -> str:
        return (
            f"ok: the transcription server at {self._url} answers; it lists no models at "
            f"{MODELS_PATH} (whisper.cpp's server does not: it uses the model it was started "
            "with), so [transcription].model is not checked"
        )


def refusal_before(
    settings: TranscriptionSettings, size: int | None, seconds: float | None
) -> TranscriptionError | None:
    """Why a note of `size` bytes and `seconds` long (None: not known) will not be transcribed
    whatever the server says: off, or past a cap; None if it may be. For the dispatcher, before
    a byte is downloaded, and again once the file is in hand."""
    if not settings.enabled:
        return TranscriptionError(Failure.OFF, OFF)
    if size is not None and size > settings.max_bytes:
        return TranscriptionError(
            Failure.TOO_LARGE,
            f"it is {size_in_words(size)}, and I take files up to "
            f"{size_in_words(settings.max_bytes)} ([transcription].max_bytes)",
        )
    if seconds is not None and seconds > settings.max_seconds:
        return TranscriptionError(
            Failure.TOO_LONG,
            f"it is {length_in_words(seconds)} long, and I take notes up to "
            f"{length_in_words(settings.max_seconds)} ([transcription].max_seconds); send a "
            "shorter one",
        )
    return None


def audio_seconds(data: bytes) -> float | None:
    """The length in seconds of an OGG Opus or WAV file, read from its container; None for
    any other kind of file, or one whose container is broken or cut short."""
    if data[:4] == b"OggS":
        return _ogg_opus_seconds(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav_seconds(data)
    return None


def _ogg_opus_seconds(data: bytes) -> float | None:
    """The Opus stream's last granule position less its pre-skip (from the OpusHead packet
    that opens the stream), at 48 kHz. Every page is walked, so a broken one is noticed."""
    pre_skip: int | None = None
    serial, last, offset = 0, None, 0
    while offset < len(data):
        if len(data) - offset < OGG_PAGE.size:
            return None
        capture, version, _, granule, page_serial, _, _, count = OGG_PAGE.unpack_from(data, offset)
        table = offset + OGG_PAGE.size
        body = table + count
        end = body + sum(data[table:body])
        if capture != b"OggS" or version != 0 or end > len(data):
            return None
        if pre_skip is None:
            head = data[body:end]
            if len(head) < 19 or not head.startswith(b"OpusHead"):
                return None
            pre_skip, serial = int.from_bytes(head[10:12], "little"), page_serial
        elif page_serial == serial and granule >= 0:  # -1: no packet ends on this page
            last = granule
        offset = end
    if last is None or pre_skip is None:
        return None
    return max(last - pre_skip, 0) / OPUS_RATE


def _wav_seconds(data: bytes) -> float | None:
    """The data chunk's size over the format's bytes per second. A streamed WAV file says
    0xFFFFFFFF for its size: what is there is what counts."""
    offset, byte_rate = 12, 0
    while offset + 8 <= len(data):
        kind, body = data[offset : offset + 4], offset + 8
        size = int.from_bytes(data[offset + 4 : body], "little")
        if kind == b"fmt " and size >= 16:
            byte_rate = int.from_bytes(data[body + 8 : body + 12], "little")
        elif kind == b"data":
            return min(size, len(data) - body) / byte_rate if byte_rate else None
        offset = body + size + (size & 1)
    return None


def _seconds(value: Any) -> float | None:
    """A server's `duration`, if it is a length in seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _base_url(url: str) -> str:
    base = url.strip().rstrip("/")
    return base.removesuffix("/v1")


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _reason(body: Any) -> str:
    """The reason an error body gives, in any of the servers' shapes; "" if none."""
    if not isinstance(body, dict):
        return ""
    said = body.get("error", body.get("detail", body.get("message")))
    if isinstance(said, dict):
        said = said.get("message", said.get("detail"))
    if isinstance(said, list):  # FastAPI's 422: [{"loc": [...], "msg": "...", ...}, ...]
        said = "; ".join(
            " ".join(filter(None, [".".join(map(str, item.get("loc", []))), item.get("msg", "")]))
            for item in said
            if isinstance(item, dict)
        )
    return _plain(said) if isinstance(said, str) else ""


def _plain(text: str) -> str:
    """`text` on one line, cut to `REASON_CHARS`."""
    line = " ".join(clean(text).split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def _model_ids(response: httpx.Response) -> list[str] | None:
    """The `id` of each entry of `{"data": [...]}`, or None if the body is not that."""
    body = _json_or_none(response)
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    return [
        entry["id"]
        for entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("id"), str)
    ]


def length_in_words(seconds: float) -> str:
    """5 min 12 s; rounded up, so a note just over a limit never reads as at it."""
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    if not minutes:
        return f"{rest} s"
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"
