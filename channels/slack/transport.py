"""How Slack shows a reply: `SlackTransport`, one thread as `channels.rendering` sees it.

Replies are written by `channels.rendering.StreamingReply` through `SlackTransport`
(`chat.postMessage`, then `chat.update`), in Slack mrkdwn. While a reply streams, its message is
Block Kit (`with_buttons`): the text in a section block, then a Stop button (an actions block; the
buttons under a command's answer, such as each running sub-agent's Stop under `/agents`, go
there the same way); the final edit sends `blocks=[]`, since Slack keeps a message's blocks when
an update leaves them out. A section holds 3,000 characters, so a message's piece of the reply is
measured as the mrkdwn it becomes (escaping lengthens `<`, `>` and `&`).

While nothing is visible yet, a reaction (`working_reaction`) on the person's message says the
bot is working; it goes away when the reply starts (after the reaction's own request, if that is
still in flight, so it cannot land after its removal). Slack's errors are mapped here
(`mapped_errors`) and nowhere else: HTTP 429 or `ratelimited` → `RateLimited`, any other refusal
or network failure → `PlatformError`.

A post answered without its `ts` (never the text "None" as a message id), or whose answer never
came, is looked for among the bot's newest messages (`channels.slack.own_posts`): found, the
reply goes on with it; a post without an answer that is not there did not land, and is posted
once more; whatever is still unknown is a `LostMessage`: it may be out, so it is not sent again.
The reply looks for it once more as it finishes (`LostMessage.find`): found then, the message
shows the final text, and the Stop button it was posted with goes; only a Slack that cannot be
asked then either leaves it as it was.
slack_sdk's own retries follow the same rule (`OnlyIdempotentRetries`): a call that creates a
message is never sent twice by the library.

Slack's limits (`thread_limits`, one budget per app, `channels.budget`) are per method and
workspace: `chat.postMessage` about one a second in a channel with short bursts (3 in any 3
seconds), `chat.update`, `chat.delete` and `reactions.add` Tier 3 (50 a minute), and
`reactions.remove` Tier 2 (20 a minute), each counted over a minute as Slack counts them, so a
burst may spend a minute's calls at once. The working reaction counts
against both reactions' limits, so one put on can always be taken off.
"""

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

from channels.budget import Action, Limit, Limits, Pace
from channels.calls import LostMessage, PlatformError, RateLimited, counted_refusals
from channels.formatting import slack_mrkdwn
from channels.places import SlackPlace
from channels.presses import fitting, payload
from channels.slack.own_posts import WhoAmI, find_own_post, is_ts, lookback_ts
from channels.slack.refusals import Refusal
from core.channel import Button

logger = logging.getLogger(__name__)

MESSAGE_LIMIT = 3000  # the text of a section block, which carries a live message's text
ACTION_ID_LIMIT = 255
ACTIONS_PER_BLOCK = 25
POSTS_TRIED = 2  # a post without an answer that did not land is posted once more

Find = Callable[[str, str], Awaitable[str | None]]
"""A look for a post by its mrkdwn and the newest ts before it (`SlackTransport._find`)."""


POSTS_CALLS, POSTS_SECONDS = 3, 3.0
TIER_2_CALLS, TIER_2_SECONDS = 20, 60.0
TIER_3_CALLS, TIER_3_SECONDS = 50, 60.0


def thread_limits(where: SlackPlace) -> Limits:
    """What one thread's calls count against: its channel's posting rate, and its workspace's
    tier for each other method."""

    def tier_3(method: str) -> Limit:
        return Limit(f"{where.team} {method}", TIER_3_CALLS, TIER_3_SECONDS, shared=True)

    posts = Limit(f"{where.team} {where.channel} posts", POSTS_CALLS, POSTS_SECONDS)
    removals = Limit(f"{where.team} reactions.remove", TIER_2_CALLS, TIER_2_SECONDS, shared=True)
    limits = {
        Action.POST: (posts,),
        Action.EDIT: (tier_3("chat.update"),),
        Action.DELETE: (tier_3("chat.delete"),),
        Action.TYPING: (tier_3("reactions.add"), removals),
    }
    return limits.__getitem__


class SlackTransport:
    """One Slack thread (or top-level DM) as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = True
    buttons_after_post = False  # a lost post is read back (`own_posts`), its button then taken away

    def __init__(
        self,
        client: AsyncWebClient,
        where: SlackPlace,
        who_am_i: WhoAmI,
        pace: Pace,
        working_on: str | None = None,
        reaction: str = "",
    ) -> None:
        """`who_am_i` tells the bot's own messages apart when a post is looked for; `pace` is
        the thread's share of the app's limits."""
        self.pace = pace
        self._client = client
        self._where = where
        self._channel = where.channel
        self._thread = where.thread_ts
        self._who_am_i = who_am_i
        self._working_on = working_on
        self._reaction = reaction
        self._working = asyncio.Lock()
        self._reacted = False
        self._replied = False
        self._newest = working_on if is_ts(working_on) else None
        """The newest message of Slack's this reply knows of: a lost post is newer."""

    @staticmethod
    def measure(text: str) -> int:
        """The length of what Slack is sent for `text` (Markdown becomes mrkdwn)."""
        return len(slack_mrkdwn(text))

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        mrkdwn = slack_mrkdwn(text)
        blocks = with_buttons(mrkdwn, buttons) if buttons else None
        for _ in range(POSTS_TRIED):
            since = self._newest or lookback_ts()
            try:
                ts = await self._post(mrkdwn, blocks)
            except LostMessage:  # sent, and no answer came
                ts = await self._looking(self._find, mrkdwn, since)
                if ts is None:
                    logger.info("Slack: a chat.postMessage got no answer and did not land")
                    continue
            else:
                ts = ts or await self._looking(self._found, mrkdwn, since)
            await self._landed(ts)
            return ts
        raise PlatformError(f"Slack answered none of {POSTS_TRIED} chat.postMessage calls")

    async def _landed(self, ts: str) -> None:
        await self._stop_working()
        self._newest = ts

    async def _looking(self, find: Find, mrkdwn: str, since: str) -> str | None:
        """What `find` says of a post whose ts Slack did not give. While that cannot be told,
        a `LostMessage` that can look once more later (`LostMessage.find`): the reply does so
        as it finishes, to show its final text in the message, and no Stop button."""
        try:
            return await find(mrkdwn, since)
        except LostMessage as lost:
            later = functools.partial(self._found_later, find, mrkdwn, since)
            raise LostMessage(str(lost), find=later) from lost

    async def _found_later(self, find: Find, mrkdwn: str, since: str) -> str | None:
        ts = await find(mrkdwn, since)
        if ts is not None:
            await self._landed(ts)
        return ts

    async def _post(self, mrkdwn: str, blocks: list[dict[str, Any]] | None) -> str | None:
        """The new message's ts; None when Slack's answer leaves it out."""
        with mapped_errors("chat.postMessage", creates=True):
            posted = await self._client.chat_postMessage(
                channel=self._channel, thread_ts=self._thread, text=mrkdwn, blocks=blocks
            )
        ts = posted.get("ts")
        return ts if isinstance(ts, str) and ts else None

    async def _found(self, mrkdwn: str, since: str) -> str:
        """The ts of a post Slack took without saying its ts."""
        ts = await self._find(mrkdwn, since)
        if ts is None:
            raise LostMessage(
                "Slack answered chat.postMessage without the message's ts, and the message is "
                "not among the newest: it is not sent again"
            )
        return ts

    async def _find(self, mrkdwn: str, since: str) -> str | None:
        """The ts of a post without an answer; None if it did not land."""
        return await find_own_post(self._client, self._where, mrkdwn, since, self._who_am_i)

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        mrkdwn = slack_mrkdwn(text)
        with mapped_errors("chat.update"):
            await self._client.chat_update(
                channel=self._channel,
                ts=message_id,
                text=mrkdwn,
                blocks=with_buttons(mrkdwn, buttons) if buttons else [],  # []: drops them
            )

    async def delete(self, message_id: str) -> None:
        with mapped_errors("chat.delete"):
            await self._client.chat_delete(channel=self._channel, ts=message_id)

    async def typing(self) -> None:
        """Slack has no typing indicator for bots: a reaction on the person's message instead,
        put there once and never after the reply has started."""
        async with self._working:
            if self._reacted or self._replied or not (self._working_on and self._reaction):
                return
            self._reacted = True
            with contextlib.suppress(SlackApiError):
                await self._client.reactions_add(
                    channel=self._channel, timestamp=self._working_on, name=self._reaction
                )

    async def _stop_working(self) -> None:
        async with self._working:  # a reaction still on its way is let through, then removed
            self._replied = True
            if not self._reacted:
                return
            self._reacted = False
            with contextlib.suppress(SlackApiError):
                await self._client.reactions_remove(
                    channel=self._channel, timestamp=self._working_on, name=self._reaction
                )


CREATES = frozenset({"chat.postMessage", "chat.postEphemeral"})
"""Web API methods that make a message: sent twice, they show it twice."""


class OnlyIdempotentRetries(AsyncConnectionErrorRetryHandler):
    """slack_sdk's retry of a call whose connection failed, for every method but those that
    create a message (`CREATES`): the first may have landed."""

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if request.url.rstrip("/").rsplit("/", 1)[-1] in CREATES:
            return False
        return await super()._can_retry_async(
            state=state, request=request, response=response, error=error
        )


@contextlib.contextmanager
def mapped_errors(method: str, *, creates: bool = False) -> Iterator[None]:
    """Slack's errors as `channels.rendering` knows them; with `creates`, a call whose answer
    never came (it was sent, then the connection failed or timed out) is a `LostMessage`."""
    with counted_refusals("slack"):
        try:
            yield
        except SlackApiError as exc:
            refusal = Refusal.of(exc, method)
            if refusal.rate_limited:
                raise RateLimited(refusal.retry_after) from exc
            raise PlatformError(refusal.described()) from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            failed = f"Slack {method} failed: {exc or type(exc).__name__}"
            if creates and not isinstance(exc, aiohttp.ClientConnectorError | SlackClientError):
                raise LostMessage(f"{failed}; it may have posted, so it is not sent again") from exc
            raise PlatformError(failed) from exc


def with_buttons(mrkdwn: str, buttons: Sequence[Button]) -> list[dict[str, Any]]:
    """A message's blocks: its text, then its buttons (each one's action id is its payload)."""
    elements = [
        {
            "type": "button",
            "text": {"type": "plain_text", "text": button.label[:75]},
            "action_id": payload(button),
            "value": button.command,
        }
        for button in fitting(buttons, ACTION_ID_LIMIT)[:ACTIONS_PER_BLOCK]
    ]
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn}},
        {"type": "actions", "elements": elements},
    ]
