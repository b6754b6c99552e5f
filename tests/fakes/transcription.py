"""A fake local speech-to-text server speaking the OpenAI-compatible transcription API.

What the local servers share (speaches, LocalAI, whisper.cpp's `whisper-server` started with
`--inference-path /v1/audio/transcriptions`): ``POST /v1/audio/transcriptions``, a multipart
upload of ``file``, ``model`` and the optional ``language`` and ``response_format`` (``json``:
``{"text"}``; ``text``: the words as text/plain; ``verbose_json``: with ``task``, ``language``,
``duration`` and ``segments``), and ``GET /v1/models``, ``{"object": "list", "data": [{"id":
...}]}``. It refuses OpenAI's way, ``{"error": {"message", "type"}}``; a scripted ``Refusal``
can take speaches' shape instead (FastAPI's ``{"detail": ...}``) or whisper.cpp's (``{"error":
"..."}``, which whisper.cpp sends with HTTP 200). ``api_key`` set, every request needs it as a
bearer token (401 without); ``lists_models`` off, ``/v1/models`` is a 404 as on whisper.cpp.

It hears nothing: it answers a scripted text. What it checks is the upload: ``file`` must be a
whole OGG Opus stream, as Telegram sends voice notes (``read_ogg_opus``: every page's capture
pattern, version and CRC, one logical stream with its pages in sequence, an OpusHead packet
alone on the first page, OpusTags next, audio after, the last page marked end of stream), and
it takes the length from the stream itself (the last granule position less the pre-skip, at 48
kHz), so a test can say the server received a valid audio file of so many seconds. Anything
else is refused with HTTP 400 naming why, as a real server refuses a file it cannot decode.
This reading of the Ogg container is written apart from Kaiwa's own
(``core.features.attachments.transcription.audio_seconds``), and checks more: the fakes import
nothing of Kaiwa, and Kaiwa's reading is best tested against another.

``uploads`` records every transcription request, valid or not. ``script`` queues one step per
valid request (``Answer``, ``Refusal``, ``Hang``, ``Close``, ``Raw``); without one, ``text`` is
answered. ``python -m tests.fakes.transcription`` serves it on its own and prints
``READY <url>`` (benchmarks, and a real `kaiwa` tried by hand).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Self

from aiohttp import web

DEFAULT_TEXT = "Hello from Kaiwa. This is a voice note."
DEFAULT_MODEL = "Systran/faster-whisper-small"
RESPONSE_FORMATS = ("json", "text", "verbose_json")
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
OPUS_RATE = 48_000
_PAGE = struct.Struct("<4sBBqIIIB")
_CONTINUED, _FIRST, _LAST = 0x01, 0x02, 0x04
Style = Literal["openai", "fastapi", "whisper.cpp"]


@dataclass(frozen=True)
class Answer:
    """Answer this text instead of the fake's ``text``."""

    text: str


@dataclass(frozen=True)
class Refusal:
    """Answer HTTP ``status`` with ``message``, in the error shape of ``style``."""

    status: int
    message: str
    style: Style = "openai"


@dataclass(frozen=True)
class Hang:
    """Answer nothing until ``release()`` (or ``close()``); ``hanging()`` resolves here."""


@dataclass(frozen=True)
class Close:
    """Read the upload, then close the connection without an answer."""


@dataclass(frozen=True)
class Raw:
    """Answer HTTP 200 with ``body`` as it is (an answer that is not a transcript)."""

    body: str
    content_type: str = "application/json"


Step = Answer | Refusal | Hang | Close | Raw


@dataclass(frozen=True)
class Upload:
    """One ``POST /v1/audio/transcriptions`` as the fake read it. ``seconds`` is the length of
    the Opus stream received, None with ``problem`` saying why the file is not one."""

    model: str | None
    language: str | None
    response_format: str | None
    filename: str | None
    content_type: str | None
    size: int
    seconds: float | None
    problem: str | None
    authorization: str | None


class NotOpus(ValueError):
    """A file that is not a whole OGG Opus stream; the message says why."""


@dataclass(frozen=True)
class OpusStream:
    seconds: float
    channels: int
    pages: int
    packets: int


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return tuple(table)


_CRC = _crc_table()


def ogg_crc(page: bytes | bytearray) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, starting from 0) of a page whose
    CRC field is zeroed."""
    crc = 0
    for byte in page:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC[(crc >> 24) ^ byte]
    return crc


def read_ogg_opus(data: bytes) -> OpusStream:
    """The Opus stream in ``data``, checked whole (RFC 3533's pages, RFC 7845's headers).
    Raises ``NotOpus`` naming the first thing wrong."""
    if not data.startswith(b"OggS"):
        raise NotOpus("not an Ogg file: it does not start with the capture pattern OggS")
    packets: list[bytes] = []
    pending: bytearray | None = None
    offset, serial, index, last_flags, granule = 0, 0, 0, 0, -1
    while offset < len(data):
        page, flags, granule_here, page_serial, sequence = _page(data, offset, index)
        if index == 0:
            if not flags & _FIRST:
                raise NotOpus("the first page does not begin the stream (no BOS flag)")
            serial = page_serial
        elif page_serial != serial:
            raise NotOpus(f"page {index} belongs to another stream (serial {page_serial:#x})")
        if sequence != index:
            raise NotOpus(f"page {index} has sequence number {sequence}: a page is missing")
        if bool(flags & _CONTINUED) != (pending is not None):
            raise NotOpus(f"page {index}: its continuation flag does not match the packet before")
        pending = _packets(page, pending, packets)
        if index == 0 and (len(packets) != 1 or pending is not None):
            raise NotOpus("the first page must hold the OpusHead packet alone")
        if granule_here >= 0:
            granule = granule_here
        offset, index, last_flags = offset + len(page), index + 1, flags
    return _opus(packets, pending, last_flags, granule, index)


def _page(data: bytes, offset: int, index: int) -> tuple[bytes, int, int, int, int]:
    """The page at ``offset`` (its CRC checked): its bytes, flags, granule, serial, sequence."""
    if len(data) - offset < _PAGE.size:
        raise NotOpus(f"the file ends inside page {index}'s header (cut short)")
    capture, version, flags, granule, serial, sequence, crc, count = _PAGE.unpack_from(data, offset)
    if capture != b"OggS":
        raise NotOpus(f"page {index} does not start with OggS: the pages are broken")
    if version != 0:
        raise NotOpus(f"page {index} has Ogg version {version}; only 0 exists")
    table = offset + _PAGE.size
    end = table + count + sum(data[table : table + count])
    if end > len(data):
        raise NotOpus(f"the file ends inside page {index} (cut short)")
    page = bytearray(data[offset:end])
    page[22:26] = b"\0\0\0\0"
    if ogg_crc(page) != crc:
        raise NotOpus(f"page {index} fails its CRC check: the file is damaged")
    return data[offset:end], flags, granule, serial, sequence


def _packets(page: bytes, pending: bytearray | None, packets: list[bytes]) -> bytearray | None:
    """Adds the packets that end on ``page`` to ``packets`` (the first two kept whole, the rest
    as empty markers); returns the packet still open at its end, if one is."""
    count = page[_PAGE.size - 1]
    lacing = page[_PAGE.size : _PAGE.size + count]
    position = _PAGE.size + count
    for size in lacing:
        if pending is None:
            pending = bytearray()
        if len(packets) < 2:
            pending += page[position : position + size]
        position += size
        if size < 255:
            packets.append(bytes(pending))
            pending = None
    return pending


def _opus(
    packets: list[bytes], pending: bytearray | None, flags: int, granule: int, pages: int
) -> OpusStream:
    head = packets[0]
    if not head.startswith(b"OpusHead"):
        raise NotOpus(f"the stream is not Opus: its first packet starts {head[:8]!r}")
    if len(head) < 19 or head[8] >> 4 != 0:
        raise NotOpus("the OpusHead packet is too short or of an unknown version")
    channels, pre_skip = head[9], int.from_bytes(head[10:12], "little")
    if channels == 0:
        raise NotOpus("the OpusHead packet says 0 channels")
    if len(packets) < 2 or not packets[1].startswith(b"OpusTags"):
        raise NotOpus("the OpusHead packet is not followed by an OpusTags packet")
    if len(packets) < 3:
        raise NotOpus("the stream holds no audio packet")
    if pending is not None or not flags & _LAST:
        raise NotOpus("the stream does not end (no EOS page): the file is cut short")
    if granule < pre_skip:
        raise NotOpus(f"the last granule position {granule} is before the pre-skip {pre_skip}")
    return OpusStream((granule - pre_skip) / OPUS_RATE, channels, pages, len(packets))


def _error(status: int, message: str, style: Style = "openai") -> web.Response:
    if style == "fastapi":
        return web.json_response({"detail": message}, status=status)
    if style == "whisper.cpp":
        return web.json_response({"error": message}, status=status)
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status)


def _transcript(text: str, response_format: str, language: str, seconds: float) -> web.Response:
    if response_format == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if response_format == "json":
        return web.json_response({"text": text})
    duration = round(seconds, 3)
    segment = {"id": 0, "start": 0.0, "end": duration, "text": text}
    body = {
        "task": "transcribe",
        "language": language,
        "duration": duration,
        "text": text,
        "segments": [segment],
    }
    return web.json_response(body)


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


class FakeTranscription:
    """The fake server on 127.0.0.1; ``url`` is its base URL once started."""

    def __init__(
        self,
        models: Iterable[str] = (DEFAULT_MODEL,),
        *,
        text: str = DEFAULT_TEXT,
        api_key: str | None = None,
        lists_models: bool = True,
    ) -> None:
        self.models = list(models)
        self.text = text
        self.api_key = api_key
        self.lists_models = lists_models
        self.uploads: list[Upload] = []
        self.model_listings = 0
        self.url = ""
        self._queue: deque[Step] = deque()
        self._hanging = asyncio.Event()
        self._released = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None

    def script(self, *steps: Step) -> None:
        """Queue steps, one for each valid request to come (FIFO)."""
        self._queue.extend(steps)

    async def hanging(self) -> None:
        """Wait until a request is held at a ``Hang``."""
        await self._hanging.wait()

    def release(self) -> None:
        """Let requests held at ``Hang`` be answered; a later ``Hang`` does not hold."""
        self._released.set()

    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=MAX_UPLOAD_BYTES)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        host, bound = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{bound}"

    async def close(self) -> None:
        """Cut every request still held, then stop the server."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        for task in self._handlers:
            task.cancel()
        if self._handlers:
            await asyncio.wait(set(self._handlers))
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return _error(401, "Incorrect API key provided.")

    async def _models(self, request: web.Request) -> web.Response:
        self.model_listings += 1
        refused = self._unauthorized(request)
        if refused is not None:
            return refused
        if not self.lists_models:
            return web.Response(status=404, text=f"File Not Found ({request.path})")
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": name.split("/")[0]}
            for name in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._answer(request)
        finally:
            self._handlers.discard(task)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload, problem = self._recorded(request, form)
        refused = self._unauthorized(request)
        if refused is not None:
            return refused
        if upload.filename is None:
            return _error(400, "No file was uploaded: the form has no 'file' field.")
        if not upload.model:
            return _error(400, "You must provide a model parameter.")
        if upload.model not in self.models:
            return _error(404, f"The model '{upload.model}' does not exist.")
        if problem is not None or upload.seconds is None:
            return _error(400, f"Invalid audio file: {problem}")
        response_format = upload.response_format or "json"
        if response_format not in RESPONSE_FORMATS:
            return _error(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}.")
        step = self._queue.popleft() if self._queue else Answer(self.text)
        return await self._step(request, step, response_format, upload)

    def _recorded(self, request: web.Request, form: Any) -> tuple[Upload, str | None]:
        file = form.get("file")
        data = b""
        seconds, problem = None, None
        if isinstance(file, web.FileField):
            with file.file:
                data = file.file.read()
            try:
                seconds = read_ogg_opus(data).seconds
            except NotOpus as exc:
                problem = str(exc)
        upload = Upload(
            model=_field(form, "model"),
            language=_field(form, "language"),
            response_format=_field(form, "response_format"),
            filename=file.filename if isinstance(file, web.FileField) else None,
            content_type=file.content_type if isinstance(file, web.FileField) else None,
            size=len(data),
            seconds=seconds,
            problem=problem,
            authorization=request.headers.get("Authorization"),
        )
        self.uploads.append(upload)
        return upload, problem

    async def _step(
        self, request: web.Request, step: Step, response_format: str, upload: Upload
    ) -> web.StreamResponse:
        assert upload.seconds is not None
        match step:
            case Refusal(status=status, message=message, style=style):
                return _error(status, message, style)
            case Raw(body=body, content_type=content_type):
                return web.Response(text=body, content_type=content_type)
            case Close():
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            case Hang():
                self._hanging.set()
                await self._released.wait()
                return _transcript(self.text, response_format, "en", upload.seconds)
            case Answer(text=text):
                return _transcript(text, response_format, upload.language or "en", upload.seconds)


async def _forever() -> NoReturn:
    never = asyncio.Event()
    while True:
        await never.wait()


async def _serve(port: int, text: str, models: Sequence[str], api_key: str | None) -> None:
    fake = FakeTranscription(models, text=text, api_key=api_key)
    await fake.start(port)
    print(f"READY {fake.url}", flush=True)
    try:
        await _forever()
    finally:
        await fake.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a fake speech-to-text server.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="what every note is heard to say")
    parser.add_argument(
        "--model", action="append", help=f"a model it has (repeatable; default {DEFAULT_MODEL})"
    )
    parser.add_argument("--api-key", help="the bearer token every request must carry")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.text, args.model or [DEFAULT_MODEL], args.api_key))


if __name__ == "__main__":
    main()
