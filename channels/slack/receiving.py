"""Slack's message events as `ChannelMessage`s: which are for the bot, and in which thread.

Which messages are ours, and where they belong:
- A mention of the bot in a channel opens a thread on that message: the place is
  `slack:<team>:<channel>:<ts of the mention>` and the reply goes into that thread.
- A message in a thread continues it if the bot is part of the thread (it was mentioned there,
  or has posted there: asked once of `conversations.replies`, then remembered); other threads
  are ignored unless the bot is mentioned in them.
- A direct message is one conversation per DM (`slack:<team>:<dm>:top`), or per DM thread.
- The same message can arrive as `app_mention` and `message`, and again on a retry or a Socket
  Mode redelivery: its dedupe id is `<channel>:<ts>`, the same every time. On Slack's last retry
  it is no longer `redeliverable`: if it cannot be recorded then, the person is asked to send it
  again.
- The bot sees its own messages as events: they are ignored (another bot's only unless
  `answer_bots`).
- An event names its author by member id alone: the name people know them by comes from
  `channels.slack.names` (another bot's from the event itself).
- Files come with the message (`file_share`, or `files` on a plain message): its pictures
  fetched, its other files described (`channels.slack.files`). A message of files alone, with
  no words, is a message all the same. The pictures are fetched before the event is
  acknowledged, so a slow one may make Slack deliver the event again: the same message, which
  the dispatcher answers once.

Who the bot is (`who_am_i`: its user and bot ids, from `auth.test`) is asked once, before the
first event is read.
"""

import logging
import re
from dataclasses import dataclass
from typing import Any

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.places import SlackPlace
from channels.presses import without_mention
from channels.settings import SlackSettings
from channels.slack.files import SlackFiles
from channels.slack.names import DisplayNames
from core.channel import ChannelMessage

logger = logging.getLogger(__name__)

LAST_RETRY = 3  # Slack retries an unacknowledged event three times
IGNORED_SUBTYPES = {"message_changed", "message_deleted", "channel_join", "channel_leave"}


@dataclass(frozen=True)
class Identity:
    """Who the bot is on Slack: its member id (what mentions name) and its bot id."""

    user_id: str = ""
    bot_id: str = ""

    def wrote(self, message: dict[str, Any]) -> bool:
        """Whether `message` (an event, or one read back from Slack) is the bot's own."""
        if self.bot_id and message.get("bot_id") == self.bot_id:
            return True
        return bool(self.user_id) and message.get("user") == self.user_id


class Messages:
    """The message events of one bot's workspace, read as the dispatcher's messages."""

    def __init__(
        self,
        settings: SlackSettings,
        client: AsyncWebClient,
        names: DisplayNames,
        files: SlackFiles,
    ) -> None:
        self._settings = settings
        self._client = client
        self._names = names
        self._files = files
        self.identity: Identity | None = None
        """Who the bot is, once `who_am_i` has asked."""
        self._threads: dict[tuple[str, str], bool] = {}

    async def who_am_i(self) -> Identity:
        """Who the bot is: asked of `auth.test` once (raises slack_sdk's errors)."""
        if self.identity is None:
            answer = await self._client.auth_test()
            self.identity = Identity(answer.get("user_id") or "", answer.get("bot_id") or "")
        return self.identity

    async def message_of(
        self, event: dict[str, Any], body: dict[str, Any], request: AsyncBoltRequest
    ) -> ChannelMessage | None:
        """The message an event carries, or None when it is not for the bot."""
        if not self._is_from_a_person(event):
            return None
        where = await self._where(event, body)
        if where is None:
            return None
        self._threads[(where.channel, where.thread)] = True
        text, _ = without_mention(event.get("text", ""), self._mention())
        images, attachments = await self._files.of_message(_files(event))
        return ChannelMessage(
            platform=SlackPlace.platform,
            place=where.key,
            message_id=f"{event['channel']}:{event['ts']}",
            author_id=event.get("user", ""),
            author_name=await self._author_name(event),
            text=text,
            room=event["channel"],
            redeliverable=_retry_number(request) < LAST_RETRY,
            images=images,
            attachments=attachments,
        )

    def _is_from_a_person(self, event: dict[str, Any]) -> bool:
        if event.get("subtype") in IGNORED_SUBTYPES or "channel" not in event:
            return False
        itself = self.identity or Identity()
        if event.get("bot_id") or event.get("subtype") == "bot_message":
            own = event.get("bot_id") == itself.bot_id
            return not own and self._settings.answer_bots
        return event.get("user") != itself.user_id

    async def _author_name(self, event: dict[str, Any]) -> str:
        """A person's name from Slack; another bot's as its message shows it."""
        bot_name = event.get("username") or (event.get("bot_profile") or {}).get("name")
        if event.get("bot_id") and bot_name:
            return str(bot_name)
        return await self._names.of(event.get("user", ""))

    async def _where(self, event: dict[str, Any], body: dict[str, Any]) -> SlackPlace | None:
        """The conversation `event` belongs to, or None when it is not for the bot."""
        team = event.get("team") or body.get("team_id", "")
        channel, thread = event["channel"], event.get("thread_ts")
        if event.get("channel_type") == "im":
            return SlackPlace(team, channel, thread or SlackPlace.TOP)
        _, mentioned = without_mention(event.get("text", ""), self._mention())
        if thread is None:
            return SlackPlace(team, channel, event["ts"]) if mentioned else None
        if mentioned or await self._takes_part_in(channel, thread):
            return SlackPlace(team, channel, thread)
        return None

    async def _takes_part_in(self, channel: str, thread: str) -> bool:
        """Whether the bot is part of a thread: remembered, else asked of Slack once."""
        known = self._threads.get((channel, thread))
        if known is None:
            try:
                replies = await self._client.conversations_replies(channel=channel, ts=thread)
            except SlackApiError as exc:  # not cached: the next message in the thread asks again
                logger.warning("Slack: cannot read thread %s in %s: %s", thread, channel, exc)
                return False
            itself = self.identity or Identity()
            known = any(itself.wrote(message) for message in replies.get("messages", []))
            self._threads[(channel, thread)] = known
        return known

    def _mention(self) -> re.Pattern[str]:
        """The bot's mention, with the blanks around it."""
        mention = f"<@{(self.identity or Identity()).user_id}>"
        return re.compile(rf"[ \t]*{re.escape(mention)}[ \t]*")


def _files(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The file objects an event carries (none when it has no `files`, or an odd one)."""
    files = event.get("files")
    return [file for file in files if isinstance(file, dict)] if isinstance(files, list) else []


def _retry_number(request: AsyncBoltRequest) -> int:
    """How many times Slack has already delivered this event (its retry header; 0 at first)."""
    values = request.headers.get("x-slack-retry-num") or ["0"]
    try:
        return int(values[0])
    except ValueError:
        return 0
