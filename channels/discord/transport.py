"""How Discord shows a reply: `DiscordTransport`, a place as `channels.rendering` sees it.

Replies are written by `channels.rendering.StreamingReply` through `DiscordTransport`: Markdown
as is, 2,000 characters a message, a typing indicator until text shows, and a Stop button on a
message while it is live (`view`). Mentions in the bot's text never ping anyone
(`AllowedMentions.none`, set on the client). discord.py waits out a 429 itself (it honours
`retry_after` and the bucket headers); a wait longer than `max_ratelimit_timeout` comes back as
`discord.RateLimited`, so a reply skips frames instead of hanging for minutes, and a 429 it will
not wait out (no `Via` header, which it takes for a ban, or still limited after five tries) as a
plain `HTTPException` 429: both map to `RateLimited`, with the wait from the answer's headers.
Other refusals map to `PlatformError`, a post answered without a readable message to
`LostMessage`; all of it here (`_mapped_errors`) and nowhere else.

A post can be sent again safely: each new message of a reply carries a nonce Discord enforces
(`enforce_nonce`), so a post whose answer never came, sent again with the same nonce (by
discord.py's own retries of a 5xx, or by the reply's next frame), returns the message the first
made instead of a second one; its text is then brought up to date.

Discord's limits (`channel_limits`, one budget per bot, `channels.budget`): 50 requests a second
for the whole bot (Kaiwa's replies keep to 40, leaving the rest to discord.py's own calls), and
per channel the buckets its rate-limit headers describe: 5 posts and edits
in 5 seconds, 5 deletions a second, 5 typing indicators in 5 seconds. Kaiwa's budget orders the
calls by what people read; discord.py still paces each bucket by the headers it is sent.
"""

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

import aiohttp

from channels.budget import Action, Limit, Limits, Pace
from channels.calls import LostMessage, PlatformError, RateLimited, counted_refusals
from channels.discord.client import CommandButton
from channels.discord.library import discord
from channels.presses import fitting, payload
from core.channel import Button

MESSAGE_LIMIT = 2000
CUSTOM_ID_LIMIT = 100
BOT_LIMIT = Limit("bot", 40, 1.0, shared=True)
"""Discord's global 50 requests a second, less a fifth for the calls discord.py makes itself
(the login, the commands' sync, interaction answers), which no budget of ours counts."""


def channel_limits(channel_id: int) -> Limits:
    """What one channel's calls count against: the bot's limit and the channel's bucket for
    the call (posts and edits share one)."""
    messages = Limit(f"{channel_id} messages", 5, 5.0)
    limits = {
        Action.POST: (BOT_LIMIT, messages),
        Action.EDIT: (BOT_LIMIT, messages),
        Action.DELETE: (BOT_LIMIT, Limit(f"{channel_id} deletions", 5, 1.0)),
        Action.TYPING: (BOT_LIMIT, Limit(f"{channel_id} typing", 5, 5.0)),
    }
    return limits.__getitem__


class DiscordTransport:
    """One thread, channel or DM channel as `channels.rendering` sees it. `opening`: what to
    await before the first call (the thread of a mention, opened on first use); `reply_to`: a
    message the first post answers; `pace`: the channel's share of the bot's limits."""

    limit = MESSAGE_LIMIT
    controls = True
    buttons_after_post = False  # a post without an answer is sent again with its nonce
    measure = staticmethod(len)

    def __init__(
        self,
        client: discord.Client,
        channel_id: int,
        pace: Pace,
        *,
        opening: Callable[[], Awaitable[None]] | None = None,
        reply_to: discord.Message | None = None,
    ) -> None:
        self.pace = pace
        self._channel = client.get_partial_messageable(channel_id)
        self._opening = opening
        self._reply_to = reply_to
        self._nonce: str | None = None
        """The nonce of the message being posted, kept until a post of it is answered."""

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        await self._opened()
        self._nonce = self._nonce or secrets.token_hex(12)  # 24 of Discord's 25 characters
        with _mapped_errors("a message post"):
            try:
                message = await self._channel.send(
                    text,
                    view=view(buttons),
                    reference=self._reply_to,  # type: ignore[arg-type]
                    nonce=self._nonce,
                )
            except (KeyError, TypeError, ValueError) as exc:  # the answer could not be read
                self._nonce = None  # that message is out: the next one is another
                raise LostMessage(
                    f"Discord answered a message post without a usable message ({exc!r})"
                ) from exc
        self._nonce = self._reply_to = None
        message_id = str(message.id)
        if message.content.strip() != text.strip():  # an earlier post, made with its nonce
            await self.edit(message_id, text, buttons=buttons)
        return message_id

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        await self._opened()
        message = self._channel.get_partial_message(int(message_id))
        with _mapped_errors("a message edit"):
            await message.edit(content=text, view=view(buttons))

    async def delete(self, message_id: str) -> None:
        await self._opened()
        with _mapped_errors("a message delete"):
            await self._channel.get_partial_message(int(message_id)).delete()

    async def typing(self) -> None:
        await self._opened()
        with _mapped_errors("the typing indicator"):
            await self._channel.typing()

    async def _opened(self) -> None:
        if self._opening is not None:
            await self._opening()


def view(buttons: Sequence[Button]) -> discord.ui.View | None:
    """The buttons as a message's components (five to a row, as Discord lays them out)."""
    if not buttons:
        return None
    components = discord.ui.View(timeout=None)
    for button in fitting(buttons, CUSTOM_ID_LIMIT)[:25]:
        components.add_item(CommandButton(button.label[:80], payload(button)))
    return components


@contextlib.contextmanager
def _mapped_errors(what: str) -> Iterator[None]:
    with counted_refusals("discord", rate_limits=False):  # every 429 is counted by the client
        try:
            yield
        except discord.RateLimited as exc:
            raise RateLimited(exc.retry_after) from exc
        except discord.HTTPException as exc:
            if exc.status == 429:  # a limit discord.py would not (or no longer) wait out itself
                raise RateLimited(_retry_after(exc.response.headers)) from exc
            raise PlatformError(f"Discord refused {what} ({exc.status}: {exc.text})") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PlatformError(f"Discord: {what} failed ({exc!r})") from exc


def _retry_after(headers: Mapping[str, str]) -> float:
    """The wait a 429's headers ask for: the bucket's exact reset, else `Retry-After`."""
    for name in ("X-RateLimit-Reset-After", "Retry-After"):
        with contextlib.suppress(TypeError, ValueError):
            return max(0.0, float(headers.get(name)))  # type: ignore[arg-type]
    return 1.0
