"""Files people attach on Telegram: what a message's files are, and fetching them for the core.

A message names each file by a `file_id`, which stays valid for the bot across restarts, so an
`Attachment`'s `source` is that id and the bytes are fetched only when the core asks
(`TelegramFiles.download`), perhaps in another worker. Pictures (a photo, and a document whose
type is image/*) are the exception: the core takes them as bytes in `images`, so they are
fetched as the message arrives (`TelegramFiles.pictures`); one that cannot be fetched stays an
attachment saying why, so the person hears of it instead of it going missing.

The Bot API hands a bot files up to 20 MB (`getFile` answers "file is too big" past that): a
file whose size Telegram states as larger is `unavailable` from the start, in words for the
person, and nothing is tried.

A download is `getFile` through python-telegram-bot, then a GET of the file's path streamed by
httpx and stopped once it passes the limit (the library's own download reads a whole file into
memory first). That path carries the bot token, so no error text or log line here holds a URL
or an exception's words without the token taken out (`TelegramFiles._scrubbed`). Telegram's and
httpx's errors become `DownloadError` at one place, `TelegramFiles._mapped`, which logs one line
for each failure.
"""

import contextlib
import logging
import mimetypes
from collections.abc import Iterator, Sequence
from datetime import timedelta

import httpx
from telegram import Audio, Bot, Document, Message, PhotoSize, Video, VideoNote, Voice
from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter, TelegramError

from channels.pictures import pictures_apart
from channels.settings import TelegramSettings
from core.channel import Attachment, AttachmentKind
from core.errors import DownloadError
from core.metrics import PLATFORM_API_ERRORS
from core.text import size_in_words

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
BOT_API_DOWNLOAD_LIMIT = 20 * MIB
"""The largest file the Bot API lets a bot download (its server's `20 << 20`)."""
MAX_IMAGE_BYTES = BOT_API_DOWNLOAD_LIMIT
"""Pictures are fetched as they arrive, each up to what Telegram lets a bot download at all."""
UNKNOWN_MEDIA_TYPE = "application/octet-stream"
DOWNLOAD_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
Medium = Audio | Document | PhotoSize | Video | VideoNote | Voice


def attachments_of(message: Message) -> tuple[Attachment, ...]:
    """Every file of `message`, pictures included, as the message describes it."""
    found = (
        _photo(message.photo) if message.photo else None,
        _voice(message.voice) if message.voice else None,
        _video_note(message.video_note) if message.video_note else None,
        _audio(message.audio) if message.audio else None,
        _document(message.document) if message.document else None,
        _video(message.video) if message.video else None,
    )
    return tuple(attachment for attachment in found if attachment is not None)


def _photo(sizes: Sequence[PhotoSize]) -> Attachment:
    largest = max(sizes, key=lambda size: size.width * size.height)
    return _described(largest, "photo.jpg", "image/jpeg")


def _voice(voice: Voice) -> Attachment:
    media_type = voice.mime_type or "audio/ogg"
    name = f"voice note{_extension(media_type, '.ogg')}"
    return _described(voice, name, media_type, AttachmentKind.VOICE, voice.duration)


def _video_note(note: VideoNote) -> Attachment:
    """A round video note: heard like a voice note (Telegram gives it no media type: MP4)."""
    return _described(note, "video note.mp4", "video/mp4", AttachmentKind.VOICE, note.duration)


def _audio(audio: Audio) -> Attachment:
    media_type = audio.mime_type or _guessed(audio.file_name) or "audio/mpeg"
    name = audio.file_name or f"audio{_extension(media_type, '.mp3')}"
    return _described(audio, name, media_type, AttachmentKind.AUDIO, audio.duration)


def _document(document: Document) -> Attachment:
    name = document.file_name or "file"
    return _described(document, name, document.mime_type or _guessed(name) or UNKNOWN_MEDIA_TYPE)


def _video(video: Video) -> Attachment:
    name = video.file_name or "video.mp4"
    media_type = video.mime_type or _guessed(name) or "video/mp4"
    return _described(video, name, media_type, AttachmentKind.FILE, video.duration)


def _described(
    medium: Medium,
    name: str,
    media_type: str,
    kind: AttachmentKind = AttachmentKind.FILE,
    duration: timedelta | int | None = None,
) -> Attachment:
    size = medium.file_size
    too_big = size is not None and size > BOT_API_DOWNLOAD_LIMIT
    return Attachment(
        name=name,
        media_type=media_type,
        source=medium.file_id,
        kind=kind,
        size=size,
        seconds=_seconds(duration),
        unavailable=_beyond_telegram(name, size) if too_big else "",
    )


def _seconds(duration: timedelta | int | None) -> float | None:
    """A duration as python-telegram-bot gives it (a timedelta, or an int without
    `PTB_TIMEDELTA`), in seconds."""
    if duration is None:
        return None
    return duration.total_seconds() if isinstance(duration, timedelta) else float(duration)


def _extension(media_type: str, default: str) -> str:
    if media_type == "audio/ogg":
        return ".ogg"  # mimetypes says .oga, which people know less
    return mimetypes.guess_extension(media_type) or default


def _guessed(name: str | None) -> str | None:
    return mimetypes.guess_type(name)[0] if name else None


class _FileAnswer(Exception):
    """The file server answered a download with `status`, not the file."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class TelegramFiles:
    """`core.channel.Files` for Telegram: fetching an attachment by its file id."""

    def __init__(self, bot: Bot, settings: TelegramSettings) -> None:
        self._bot = bot
        self._settings = settings
        self._client = httpx.AsyncClient(timeout=DOWNLOAD_TIMEOUT)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The file's bytes, at most `limit` of them; `DownloadError` otherwise."""
        with self._mapped(attachment):
            if attachment.unavailable:
                raise DownloadError(attachment.unavailable)
            _checksize_in_words(attachment.name, attachment.size, limit)
            file = await self._bot.get_file(attachment.source)
            _checksize_in_words(attachment.name, file.file_size, limit)
            if not file.file_path:
                raise _FileAnswer(404)
            return await self._fetch(file.file_path, attachment.name, limit)

    async def pictures(
        self, attachments: Sequence[Attachment]
    ) -> tuple[tuple[bytes, ...], tuple[Attachment, ...]]:
        """The pictures among `attachments` fetched (each up to `MAX_IMAGE_BYTES`), and the
        other attachments, with every picture that could not be fetched saying why."""
        return await pictures_apart(attachments, self.download, MAX_IMAGE_BYTES)

    async def close(self) -> None:
        await self._client.aclose()

    async def _fetch(self, url: str, name: str, limit: int) -> bytes:
        """The file at `url`, streamed, given up as soon as it passes `limit` bytes."""
        received = bytearray()
        async with self._client.stream("GET", url) as response:
            if response.status_code != httpx.codes.OK:
                raise _FileAnswer(response.status_code)
            async for chunk in response.aiter_bytes():
                received += chunk
                if len(received) > limit:
                    raise DownloadError(_past_limit(name, None, limit))
        return bytes(received)

    @contextlib.contextmanager
    def _mapped(self, attachment: Attachment) -> Iterator[None]:
        """Every failure of a download as a `DownloadError` in words for the person, logged in
        one line (with the cause, the token taken out)."""
        try:
            yield
        except DownloadError as exc:
            self._log(attachment, exc, "")
            raise
        except (TelegramError, httpx.HTTPError, _FileAnswer) as exc:
            PLATFORM_API_ERRORS.labels("telegram").inc()
            error = DownloadError(self._words(attachment, exc))
            self._log(attachment, error, f" ({type(exc).__name__}: {exc})")
            raise error from exc

    def _words(self, attachment: Attachment, exc: Exception) -> str:
        """What a failure of Telegram's (a refusal, a file server's answer, no answer) means for
        the person who sent the file."""
        name = attachment.name
        if isinstance(exc, BadRequest) and "too big" in exc.message.lower():
            return _beyond_telegram(name, attachment.size)
        if isinstance(exc, BadRequest) and "file_id" in exc.message.lower():
            return _gone(name)
        if isinstance(exc, InvalidToken | Forbidden) or (
            isinstance(exc, _FileAnswer) and exc.status in (401, 403)
        ):
            return (
                f"Telegram refused to hand over {name}: it does not accept Kaiwa's bot token. "
                f"Whoever runs Kaiwa should put the token @BotFather gave into "
                f"${self._settings.token_env}"
            )
        if isinstance(exc, _FileAnswer) and exc.status == 404:
            return _gone(name)
        if isinstance(exc, RetryAfter):
            return f"Telegram asked Kaiwa to wait before fetching {name}: send it again in a minute"
        if isinstance(exc, BadRequest | _FileAnswer):
            return f"Telegram would not hand over {name} ({exc}): send it again, or as a link"
        return (
            f"Kaiwa could not reach Telegram to fetch {name}: send it again in a moment (if it "
            "keeps happening, whoever runs Kaiwa should check the network and "
            "[channels.telegram].base_file_url)"
        )

    def _log(self, attachment: Attachment, error: DownloadError, cause: str) -> None:
        logger.warning(
            "Telegram: %s (file %s) not downloaded: %s%s",
            attachment.name,
            attachment.source,
            error,
            self._scrubbed(cause),
        )

    def _scrubbed(self, text: str) -> str:
        """`text` without the bot token (a file URL holds it)."""
        return text.replace(self._bot.token, "<token>")


def _checksize_in_words(name: str, size: int | None, limit: int) -> None:
    """Refuse at once a file whose stated size is past `limit`."""
    if size is not None and size > limit:
        raise DownloadError(_past_limit(name, size, limit))


def _past_limit(name: str, size: int | None, limit: int) -> str:
    stated = f"{size_in_words(size)}, " if size is not None else ""
    return f"{name} is {stated}larger than the {size_in_words(limit)} Kaiwa downloads"


def _beyond_telegram(name: str, size: int | None) -> str:
    stated = size_in_words(size) if size is not None else "larger"
    return (
        f"Telegram lets bots download files up to {size_in_words(BOT_API_DOWNLOAD_LIMIT)}, and "
        f"{name} is {stated}: send a smaller file, or a link to it"
    )


def _gone(name: str) -> str:
    return f"Telegram no longer has {name}; send it again"
