"""Finding a message the bot has just posted, when Slack's answer did not say which one it was.

A `chat.postMessage` answered `ok` without its `ts` did post; one whose answer never came (the
connection dropped after sending) may have. Either way the reply cannot edit a message it cannot
name, and posting again might show the words twice. But a bot may read the conversations it
posts in, so `find_own_post` looks: the bot's own messages in that thread
(`conversations.replies`), or at a DM's top level (`conversations.history`), newer than the
newest message the reply knew of (`since`), with exactly the text sent; the newest such message
is the post. None found means it did not land. A lookup Slack refuses, or that fails, says
nothing either way: `LostMessage`, and the post is never sent again.

`since` bounds the search in Slack's own time: the person's message the reply answers, or the
reply's previous post. Without either (a notice), it is `LOOKBACK_SECONDS` before the post by
this machine's clock, which a synchronized clock keeps well within Slack's.
"""

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from channels.calls import LostMessage
from channels.places import SlackPlace
from channels.slack.receiving import Identity
from channels.slack.refusals import Refusal

LOOKBACK_SECONDS = 120.0
READ_LIMIT = 100  # messages read back: a post is among the newest in its conversation
SLACK_TS = re.compile(r"\d+\.\d+")

WhoAmI = Callable[[], Awaitable[Identity]]


def is_ts(value: str | None) -> bool:
    """Whether `value` is a Slack message timestamp ("1700000000.000100")."""
    return value is not None and SLACK_TS.fullmatch(value) is not None


def lookback_ts() -> str:
    """A `since` from this machine's clock, when the reply knows no message of Slack's."""
    return f"{time.time() - LOOKBACK_SECONDS:.6f}"


async def find_own_post(
    client: AsyncWebClient, where: SlackPlace, text: str, since: str, who_am_i: WhoAmI
) -> str | None:
    """The ts of the bot's message in `where` with `text`, newer than `since`; None when there
    is none. Raises `LostMessage` when Slack cannot be asked."""
    method = "conversations.replies" if where.thread_ts else "conversations.history"
    try:
        itself = await who_am_i()
        if where.thread_ts:
            answer = await client.conversations_replies(
                channel=where.channel, ts=where.thread_ts, oldest=since, limit=READ_LIMIT
            )
        else:
            answer = await client.conversations_history(
                channel=where.channel, oldest=since, limit=READ_LIMIT
            )
    except SlackApiError as exc:
        raise LostMessage(_unknown(Refusal.of(exc, method).described())) from exc
    except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
        raise LostMessage(_unknown(f"{method} failed: {exc or type(exc).__name__}")) from exc
    found = [
        str(message["ts"])
        for message in answer.get("messages") or []
        if _is_the_post(message, text, since, itself)
    ]
    return max(found, key=_ts_key, default=None)


def _is_the_post(message: dict[str, Any], text: str, since: str, itself: Identity) -> bool:
    ts = message.get("ts")
    return (
        isinstance(ts, str)
        and _ts_key(ts) > _ts_key(since)
        and message.get("text") == text
        and itself.wrote(message)
    )


def _unknown(why: str) -> str:
    return (
        f"Slack did not say which message a chat.postMessage made, and looking for it failed "
        f"({why}): it may have posted, so it is not sent again"
    )


def _ts_key(ts: str) -> tuple[int, int]:
    """A ts as a number pair: its seconds, then its microseconds."""
    seconds, _, fraction = ts.partition(".")
    return int(seconds or 0), int((fraction + "000000")[:6])
