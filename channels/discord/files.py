"""Discord's attachments: which are pictures, how the others are described, and fetching them.

A message's files are told apart by their media type (Discord's `content_type`, else one
guessed from the file's name): pictures are read at once, as vision models take them
(`images_of`); every other file is only described (`attachments_of`, a `core.channel.Attachment`)
and fetched when the core asks (`DiscordFiles.download`), in this process or in another after a
restart. A voice message (`discord.Attachment.is_voice_message`: a duration and a waveform; or
the message's IS_VOICE_MESSAGE flag) is a VOICE note, any other audio an AUDIO file, the rest a
FILE.

The `source` is the attachment's CDN URL. Discord's CDN asks for no token (the link itself is
signed, and expires after about a day), so a download sends no secret and the URL may be kept in
the inbox. It is fetched on a session of its own: `discord.Attachment.read` reads a body whole,
with no cap. A size the attachment declares past the limit is refused before any request;
the body is streamed and dropped the moment it goes past the limit. Every failure becomes a
`DownloadError` here and nowhere else (`_mapped_errors`), logged in one line naming the file and
its URL without the signature: an expired link (Discord's CDN answers 404, or 403), another
answer, a CDN that cannot be reached.
"""

import contextlib
import logging
import mimetypes
from collections.abc import Iterator

import aiohttp
import yarl

from channels.discord.library import discord
from core.channel import Attachment, AttachmentKind
from core.errors import DownloadError
from core.text import size_in_words

logger = logging.getLogger(__name__)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MIB = 1024 * 1024
UNKNOWN_TYPE = "application/octet-stream"
VOICE_NOTE_NAME = "voice note.ogg"  # for a voice message that came without a file name
UNNAMED = "attachment"
CHUNK_BYTES = 64 * 1024
CDN_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10, sock_read=30)
EXPIRED = (403, 404, 410)  # what Discord's CDN answers for a link past its expiry


def media_type_of(attachment: discord.Attachment) -> str:
    """Discord's media type for the file, else the one its name says."""
    if attachment.content_type:
        return attachment.content_type
    return mimetypes.guess_type(attachment.filename)[0] or UNKNOWN_TYPE


def _is_picture(attachment: discord.Attachment) -> bool:
    return media_type_of(attachment).startswith("image/")


async def images_of(message: discord.Message) -> tuple[bytes, ...]:
    """The pictures attached to a message (at most MAX_IMAGE_BYTES each)."""
    images = []
    for attachment in filter(_is_picture, message.attachments):
        if attachment.size > MAX_IMAGE_BYTES:
            logger.warning("Discord: skipped %s (%d bytes)", attachment.filename, attachment.size)
            continue
        try:
            images.append(await attachment.read())
        except discord.HTTPException as exc:
            logger.warning("Discord: cannot download %s: %s", attachment.filename, exc)
    return tuple(images)


def attachments_of(message: discord.Message) -> tuple[Attachment, ...]:
    """Every file of a message but its pictures, described for `DiscordFiles.download`."""
    voice_message = message.flags.voice
    return tuple(
        described(attachment, voice_message=voice_message)
        for attachment in message.attachments
        if not _is_picture(attachment)
    )


def described(attachment: discord.Attachment, *, voice_message: bool) -> Attachment:
    """One file, as the core keeps it; `voice_message`: its message is flagged as one."""
    media_type = media_type_of(attachment)
    voice = voice_message or attachment.is_voice_message()
    if voice:
        kind = AttachmentKind.VOICE
    elif media_type.startswith("audio/"):
        kind = AttachmentKind.AUDIO
    else:
        kind = AttachmentKind.FILE
    return Attachment(
        name=attachment.filename or (VOICE_NOTE_NAME if voice else UNNAMED),
        media_type=media_type,
        source=attachment.url,
        kind=kind,
        size=attachment.size,
        seconds=attachment.duration,
    )


class _TooLarge(Exception):
    """Past the limit; `size` when the platform said how large (else the stream went past)."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


class DiscordFiles:
    """Attachments fetched from Discord's CDN, on a session of their own opened on first use
    (a worker that never downloads opens none)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The attachment's bytes, at most `limit`; `DownloadError` in words for the person."""
        with _mapped_errors(attachment, limit):
            if attachment.size is not None and attachment.size > limit:
                raise _TooLarge(attachment.size)
            # identity: what is counted against the limit is what arrives, nothing inflates
            headers = {"Accept-Encoding": "identity"}
            async with self._opened().get(attachment.source, headers=headers) as response:
                response.raise_for_status()
                return await _capped(response, limit)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=CDN_TIMEOUT)
        return self._session


async def _capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, streamed; `_TooLarge` the moment it goes past `limit` bytes (whatever its
    Content-Length said: what is held is what counts)."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise _TooLarge(None)
    return bytes(body)


@contextlib.contextmanager
def _mapped_errors(attachment: Attachment, limit: int) -> Iterator[None]:
    """A failed download as a `DownloadError` in the person's words, logged in one line."""
    name = attachment.name
    try:
        yield
    except _TooLarge as exc:
        size = "" if exc.size is None else f" ({size_in_words(exc.size)})"
        words = f"{name}{size} is larger than the {size_in_words(limit)} Kaiwa downloads"
        raise _failed(attachment, words, "too large") from exc
    except aiohttp.ClientResponseError as exc:
        if exc.status in EXPIRED:
            words = f"Discord no longer serves {name} (its link expired): send it again"
        else:
            words = (
                f"Discord's file server would not send {name} ({exc.status} {exc.message}): "
                "send it again in a moment"
            )
        raise _failed(attachment, words, f"answered {exc.status}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        words = f"Kaiwa could not reach Discord to fetch {name}: send it again in a moment"
        raise _failed(attachment, words, type(exc).__name__) from exc


def _failed(attachment: Attachment, words: str, why: str) -> DownloadError:
    url = yarl.URL(attachment.source).with_query(None)  # the signature stays out of the log
    logger.warning("Discord: could not download %s from %s: %s", attachment.name, url, why)
    return DownloadError(words)
