"""Standalone messages on a chat platform (a command's answer, a refusal, a notice edited later),
shared by every adapter that has a `channels.rendering.Transport`.

A notice is a final text from the start: each piece waits for room in the place's budget as a
reply's final text does (`channels.calls.paced`), and is sent whole through rate limits
for up to `seconds`, so a notice is never lost to a burst; only past that deadline is it given
up, raised to the caller.
"""

from collections.abc import Sequence

from channels.budget import Action
from channels.calls import keep_trying, paced
from channels.formatting import split_message
from channels.rendering import FINAL_EDIT_SECONDS, Transport
from core.channel import Button


async def send_notice(
    transport: Transport,
    text: str,
    seconds: float = FINAL_EDIT_SECONDS,
    buttons: Sequence[Button] = (),
) -> tuple[str, ...]:
    """A standalone message (a command's answer, a refusal), split at the limit, sent in full
    through rate limits for up to `seconds` a piece, `buttons` under its last piece; the ids of
    the messages posted. Raises `PlatformError` (or `RateLimited` past the deadline) when a
    piece cannot be sent."""
    pieces = split_message(text, transport.limit, transport.measure)
    under = [()] * (len(pieces) - 1) + [tuple(buttons) if transport.controls else ()]
    posted: list[str] = []

    async def send(piece: str, its_buttons: tuple[Button, ...]) -> None:
        async with paced(transport.pace, Action.POST):
            posted.append(await transport.send(piece, buttons=its_buttons))

    for piece, its_buttons in zip(pieces, under, strict=True):
        await keep_trying(lambda piece=piece, b=its_buttons: send(piece, b), seconds)
    return tuple(posted)


async def replace_notice(
    transport: Transport, message_id: str, text: str, seconds: float = FINAL_EDIT_SECONDS
) -> None:
    """Replace a notice's text (cut to one message) and take its buttons away."""
    piece = split_message(text, transport.limit, transport.measure)[0]

    async def edit() -> None:
        async with paced(transport.pace, Action.EDIT):
            await transport.edit(message_id, piece)

    await keep_trying(edit, seconds)
