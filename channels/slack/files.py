"""The files of Slack messages: described as `Attachment`s, pictures fetched, any file fetched
again later by its address.

A message event names its files by Slack's file objects (`files`, on a `file_share` message and
on a message posted with files through the newer upload API alike). Each becomes an `Attachment`
whose `source` is the file's `url_private_download` (else `url_private`): a plain address that
stays valid while the file exists, so the inbox can keep it and any process fetch it after a
restart. The bot token it needs is sent with each request (`Authorization: Bearer`), never
stored with the address, never logged, and only ever to Slack's own hosts (the API's host and
its subdomains, `files.slack.com` for `slack.com`): an address elsewhere is refused, not sent
the token.

Kinds: a clip recorded in Slack (`subtype: "slack_audio"`, with `duration_ms`) is a voice note;
another audio file is audio; the rest is a file. A picture (`image/*`) is fetched as the message
arrives, up to `MAX_PICTURE_BYTES` (Discord's cap), and goes to `images`; one that cannot be
fetched stays an attachment whose `unavailable` says why, so the person is told instead of
the picture silently missing.

Slack does not refuse a file request with an error status: a request without the files:read
scope, or with a token it does not take, is redirected to the workspace's sign-in page, which
answers HTTP 200 with HTML. HTML where a file was expected is read as that refusal
(`REFUSED`). Every failure is mapped to a `DownloadError` in one place (`_fetched`) and logged
once, in one line, by `download`.
"""

import logging
import mimetypes
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from channels.pictures import pictures_apart
from core.channel import Attachment, AttachmentKind
from core.errors import DownloadError
from core.text import size_in_words

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_PICTURE_BYTES = 20 * MIB
"""Pictures are fetched as a message arrives, each up to this many bytes (Discord's cap)."""
CHUNK = 64 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_read=30)
"""No limit on a whole download (a large file on a slow line), but Slack must answer within 10 s
and never fall silent for 30."""
REFUSED = "the Slack app needs the files:read scope (OAuth & Permissions, then reinstall the app)"
CLIP = "slack_audio"
NOT_FETCHED = {
    "tombstone": "{name} was deleted from Slack",
    "hidden_by_limit": "Slack no longer shows {name}: the workspace's plan keeps files for a while",
    "external": "{name} is a link to a file kept outside Slack, which Kaiwa does not fetch",
}
"""Why a file of each `mode` cannot be fetched at all."""

_File = dict[str, Any]


def described(file: _File) -> Attachment:
    """A Slack file object as an `Attachment`, before anything is downloaded."""
    kind = _kind(file)
    media_type = _media_type(file, kind)
    name = str(file.get("name") or file.get("title") or _unnamed(file, kind, media_type))
    source = str(file.get("url_private_download") or file.get("url_private") or "")
    mode = str(file.get("mode") or "")
    unavailable = NOT_FETCHED.get(mode, "" if source else "Slack sent {name} without its address")
    return Attachment(
        name=name,
        media_type=media_type,
        source=source,
        kind=kind,
        size=_number(file.get("size")),
        seconds=_seconds(file.get("duration_ms")),
        unavailable=unavailable.format(name=name),
    )


class SlackFiles:
    """Fetches the files of one bot's workspace with its bot token, from Slack's hosts alone."""

    def __init__(self, bot_token: str, api_url: str) -> None:
        self._token = bot_token
        self._api = urlsplit(api_url)

    async def of_message(
        self, files: list[_File]
    ) -> tuple[tuple[bytes, ...], tuple[Attachment, ...]]:
        """A message's pictures, fetched, and its other files, described (with a picture that
        could not be fetched, and why)."""
        return await pictures_apart(map(described, files), self.download, MAX_PICTURE_BYTES)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The file's bytes, at most `limit` of them (`core.channel.Files`)."""
        try:
            return await self._fetched(attachment, limit)
        except DownloadError as exc:
            logger.warning("Slack: a file was not downloaded: %s", exc)
            raise

    async def _fetched(self, attachment: Attachment, limit: int) -> bytes:
        name = attachment.name
        if attachment.unavailable:
            raise DownloadError(attachment.unavailable)
        if not self._is_slacks(attachment.source):
            host = urlsplit(attachment.source).hostname or "no host"
            raise DownloadError(
                f"{name} is not on Slack's servers ({host}): Kaiwa does not fetch it"
            )
        if attachment.size is not None and attachment.size > limit:
            raise DownloadError(_too_large(name, limit, attachment.size))
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with (
                aiohttp.ClientSession(timeout=TIMEOUT) as session,
                session.get(attachment.source, headers=headers) as response,
            ):
                problem = _problem(response, attachment)
                if problem:
                    raise DownloadError(problem)
                return await _capped(response, name, limit)
        except (aiohttp.ClientError, TimeoutError) as exc:
            cause = str(exc) or type(exc).__name__
            raise DownloadError(
                f"Slack could not be reached for {name} ({cause}): try again in a while"
            ) from exc

    def _is_slacks(self, url: str) -> bool:
        """Whether `url` is on the API's host or one of its subdomains, as the API is reached."""
        address, api = urlsplit(url), self._api
        if address.scheme != api.scheme or not address.hostname or not api.hostname:
            return False
        if address.hostname == api.hostname:
            return address.port == api.port
        return address.hostname.endswith(f".{api.hostname}")


def _problem(response: aiohttp.ClientResponse, attachment: Attachment) -> str:
    """Why Slack's answer is not the file, in words for the person; empty when it is."""
    name, status = attachment.name, response.status
    if status in (404, 410):
        return f"{name} is no longer on Slack (it was deleted, or its message was): share it again"
    if status in (401, 403) or _is_sign_in_page(response, attachment):
        return f"Slack would not hand over {name}: {REFUSED}"
    if status == 429:
        return f"Slack is limiting how fast files are fetched: send {name} again in a minute"
    if status != 200:
        return f"Slack answered HTTP {status} when asked for {name}: try again in a while"
    return ""


def _is_sign_in_page(response: aiohttp.ClientResponse, attachment: Attachment) -> bool:
    """HTML where a file was expected: the sign-in page Slack redirects a refused request to.
    (An HTML file is that page only when the request was redirected to it.)"""
    if response.content_type != "text/html":
        return False
    return bool(response.history) or attachment.media_type.split(";")[0] != "text/html"


async def _capped(response: aiohttp.ClientResponse, name: str, limit: int) -> bytes:
    """The body, refused as soon as it is known to be past `limit` (by its length, or while
    it streams)."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise DownloadError(_too_large(name, limit, declared))
    body = bytearray()
    async for chunk in response.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > limit:
            raise DownloadError(_too_large(name, limit))
    return bytes(body)


def _too_large(name: str, limit: int, size: int | None = None) -> str:
    what = f"{name} is {size_in_words(size)}, " if size is not None else f"{name} is "
    return f"{what}larger than the {size_in_words(limit)} Kaiwa downloads"


def _kind(file: _File) -> AttachmentKind:
    if file.get("subtype") == CLIP:
        return AttachmentKind.VOICE
    if _media_type(file, AttachmentKind.FILE).startswith("audio/"):
        return AttachmentKind.AUDIO
    return AttachmentKind.FILE


def _media_type(file: _File, kind: AttachmentKind) -> str:
    """Slack's media type, else one guessed from the name; a clip's is audio even where Slack
    calls its container video (the clip is heard)."""
    given = str(file.get("mimetype") or "")
    guessed = mimetypes.guess_type(str(file.get("name") or ""))[0]
    media_type = given or guessed or "application/octet-stream"
    if kind is AttachmentKind.VOICE and media_type.startswith("video/"):
        return "audio/" + media_type.removeprefix("video/")
    return media_type


def _unnamed(file: _File, kind: AttachmentKind, media_type: str) -> str:
    """A name for a file Slack gave none: "voice note.webm", with Slack's file type (else one
    guessed from the media type) as its extension."""
    stem = "voice note" if kind is AttachmentKind.VOICE else "file"
    filetype = str(file.get("filetype") or "")
    extension = f".{filetype}" if filetype else mimetypes.guess_extension(media_type) or ""
    return stem + extension


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(duration_ms: object) -> float | None:
    milliseconds = _number(duration_ms)
    return None if milliseconds is None else milliseconds / 1000
