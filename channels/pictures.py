"""Pictures among a message's files, fetched as the message arrives: they go to a vision model
as bytes (`ChannelMessage.images`), while every other file stays described for the core to read
in its turn. A picture that cannot be fetched stays an attachment whose `unavailable` says why,
so the person is told rather than the picture silently missing. Shared by the platforms whose
files arrive as one list (Telegram, Slack)."""

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from core.channel import Attachment
from core.errors import DownloadError


async def pictures_apart(
    attachments: Iterable[Attachment],
    download: Callable[[Attachment, int], Awaitable[bytes]],
    limit: int,
) -> tuple[tuple[bytes, ...], tuple[Attachment, ...]]:
    """The pictures among `attachments` fetched (each up to `limit` bytes), and the others,
    with every picture that could not be fetched saying why."""
    images: list[bytes] = []
    others: list[Attachment] = []
    for attachment in attachments:
        if not attachment.media_type.startswith("image/") or attachment.unavailable:
            others.append(attachment)
            continue
        try:
            images.append(await download(attachment, limit))
        except DownloadError as exc:
            others.append(replace(attachment, unavailable=str(exc)))
    return tuple(images), tuple(others)
