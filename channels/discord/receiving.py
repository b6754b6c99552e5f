"""Discord messages as `ChannelMessage`s: which are for the bot, and the thread each belongs to.

Which messages are ours, and where they belong:
- A mention of the bot in a text channel opens a thread on that message (named from its text);
  a thread made from a message takes the message's id, so the place `discord:<guild>:<thread>`
  is known before the thread exists, and the opening message is the conversation's first. The
  thread is opened only once the mention is taken: a notice for it (the dispatcher's refusal of
  a stranger, at most once an hour per person, so mentions cannot make the bot spam a channel;
  a command's answer) is a reply in the channel, no thread; the thread is opened when the turn
  the mention started first shows something there (its typing indicator), so a mention nothing
  answers (a duplicate, a stranger told already) opens none. `Threads` keeps those mentions
  (the last `PENDING_MENTIONS`) and opens their threads.
- A message in a thread continues it when the bot opened the thread (`owner_id`), joined it, or
  was mentioned there: a mention in someone else's thread makes the bot join it, which Discord
  remembers across restarts. A message in an archived thread reopens it (Discord does that), and
  the thread's id, hence its conversation, is unchanged.
- A direct message is one conversation per DM channel (`discord:dm:<channel>`); `/new` starts a
  fresh one there as anywhere.
- A mention followed by a bare command word ("@kaiwa stop") is that command
  (`channels.presses.without_mention`); the bot's own role counts as the bot.
- A message with files and no text (a voice message, a document dropped in a thread) is a
  message like any other: its pictures are `images`, every other file one of its `attachments`
  (`channels.discord.files`).
- discord.py delivers a replayed MESSAGE_CREATE twice; the message's id is its dedupe id, so the
  dispatcher drops the replay.
"""

import asyncio
import contextlib
import functools
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from channels.budget import Budget
from channels.calls import PlatformError
from channels.discord.client import INTENT_FIX
from channels.discord.files import attachments_of, images_of
from channels.discord.library import discord
from channels.discord.transport import DiscordTransport, channel_limits
from channels.notices import send_notice
from channels.places import DiscordPlace
from channels.presses import without_mention
from channels.settings import DiscordSettings
from core.channel import ChannelMessage

logger = logging.getLogger(__name__)

THREAD_NAME_LIMIT = 100
PENDING_MENTIONS = 1000  # mentions whose thread is not opened yet, remembered at most
THREAD_EXISTS = 160004  # Discord's error code: a thread was already made from this message
READ_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


@dataclass
class _Mention:
    """A mention in a text channel whose thread is not opened yet (see the module docstring)."""

    message: discord.Message
    text: str
    opening: asyncio.Task[discord.Thread | None] | None = field(default=None, repr=False)


class Threads:
    """The threads the bot takes part in, the mentions whose thread it opens on first use, and
    the limits every call to them shares (`transport`)."""

    def __init__(self, settings: DiscordSettings) -> None:
        self._settings = settings
        self._budget = Budget(paced=settings.paced)
        self._joined: set[int] = set()
        self._mentions: OrderedDict[int, _Mention] = OrderedDict()

    async def where(
        self,
        me: discord.ClientUser | None,
        message: discord.Message,
        channel: object,
        text: str,
        mentioned: bool,
    ) -> DiscordPlace | None:
        """The conversation `message` (in `channel`; `text` without the bot's mention) belongs
        to, or None when it is not for the bot."""
        if message.guild is None:
            return DiscordPlace.direct(message.channel.id)
        guild = str(message.guild.id)
        if isinstance(channel, discord.Thread):
            if mentioned:
                await self._join(me, channel)
            return DiscordPlace(guild, channel.id) if self._takes_part_in(me, channel) else None
        if mentioned and isinstance(channel, discord.TextChannel):
            if message.thread is None:  # a replay of a mention may know its thread already
                self._remember(_Mention(message, text))
            return DiscordPlace(guild, message.thread.id if message.thread else message.id)
        return None

    def transport(self, client: discord.Client, place: str) -> DiscordTransport:
        """The transport to `place`, which opens the thread of a mention on first use."""
        channel = DiscordPlace.of(place).channel
        mention = self._mentions.get(channel)
        pace = self._budget.pace(channel_limits(channel))
        if mention is None:
            return DiscordTransport(client, channel, pace)
        opening = functools.partial(self._thread_of, client, mention)
        return DiscordTransport(client, channel, pace, opening=opening)

    async def answered_in_channel(self, client: discord.Client, place: str, text: str) -> bool:
        """A notice for a mention that has no thread (a refusal, a command's answer): a reply
        to it in the channel; False when `place` is not such a mention's. (How often a
        stranger is refused is the dispatcher's rule.)"""
        mention = self._mentions.get(DiscordPlace.of(place).channel)
        if mention is None or mention.opening is not None:
            return False
        self._mentions.pop(mention.message.id, None)
        channel = mention.message.channel.id
        pace = self._budget.pace(channel_limits(channel))
        transport = DiscordTransport(client, channel, pace, reply_to=mention.message)
        await send_notice(transport, text, self._settings.final_edit_seconds)
        return True

    def _takes_part_in(self, me: discord.ClientUser | None, thread: discord.Thread) -> bool:
        return (
            (me is not None and thread.owner_id == me.id)
            or thread.me is not None
            or thread.id in self._joined
        )

    async def _join(self, me: discord.ClientUser | None, thread: discord.Thread) -> None:
        """Take part in someone else's thread, remembered by Discord across restarts."""
        if self._takes_part_in(me, thread):
            return
        self._joined.add(thread.id)
        try:
            await thread.join()
        except discord.HTTPException as exc:
            logger.warning("Discord: could not join thread %s: %s", thread.id, exc)

    def _remember(self, mention: _Mention) -> None:
        self._mentions[mention.message.id] = mention
        while len(self._mentions) > PENDING_MENTIONS:
            self._mentions.popitem(last=False)

    async def _thread_of(self, client: discord.Client, mention: _Mention) -> None:
        """Open the mention's thread, once however many calls ask; `PlatformError` if it could
        not be opened (the person was told in the channel)."""
        if mention.opening is None:
            name = f"thread for {mention.message.id}"
            mention.opening = asyncio.create_task(self._open_thread(client, mention), name=name)
        thread = await asyncio.shield(mention.opening)
        self._mentions.pop(mention.message.id, None)
        if thread is None:
            raise PlatformError(f"no thread could be opened on message {mention.message.id}")

    async def _open_thread(
        self, client: discord.Client, mention: _Mention
    ) -> discord.Thread | None:
        """The thread on a mention: made now, or found if a replay of it made one already."""
        message = mention.message
        name = _thread_name(mention.text, message.author)
        try:
            return await message.create_thread(
                name=name, auto_archive_duration=self._settings.thread_archive_minutes
            )
        except discord.HTTPException as exc:
            if exc.code == THREAD_EXISTS:
                found = await _fetch_channel(client, message.id)
                return found if isinstance(found, discord.Thread) else None
            logger.error(
                "Discord: cannot open a thread in #%s (%s): give the bot the Create Public "
                "Threads and Send Messages in Threads permissions there",
                message.channel,
                exc,
            )
            with contextlib.suppress(discord.HTTPException):
                await message.reply(
                    "I can't open a thread here. Ask an admin to give me the Create Public "
                    "Threads and Send Messages in Threads permissions in this channel."
                )
            return None


class Messages:
    """MESSAGE_CREATEs read as the dispatcher's messages."""

    def __init__(self, settings: DiscordSettings, threads: Threads) -> None:
        self._settings = settings
        self._threads = threads
        self._warned_blank = False

    async def message_of(
        self, client: discord.Client, message: discord.Message
    ) -> ChannelMessage | None:
        """What `message` says to the bot, or None when it is not for the bot."""
        if not self._from_a_person(client.user, message):
            return None
        channel = message.channel
        if isinstance(channel, discord.PartialMessageable) and message.guild is not None:
            channel = await _fetch_channel(client, channel.id)  # a thread not in the cache
        text, mentioned = _without_mention(client.user, message)
        where = await self._threads.where(client.user, message, channel, text, mentioned)
        if where is None:
            return None
        if not (message.content or message.attachments):
            self._warn_blank(message)
            return None
        origin = origin_of(message.author, channel, message.guild and message.guild.id)
        return ChannelMessage(
            platform=DiscordPlace.platform,
            place=where.key,
            message_id=str(message.id),
            author_id=str(message.author.id),
            author_name=message.author.display_name,
            text=text,
            images=await images_of(message),
            attachments=attachments_of(message),
            room=origin.room,
            space=origin.space,
            author_roles=origin.roles,
        )

    def _from_a_person(self, me: discord.ClientUser | None, message: discord.Message) -> bool:
        if message.type not in READ_MESSAGE_TYPES or me is None or message.author.id == me.id:
            return False
        return self._settings.answer_bots or not message.author.bot

    def _warn_blank(self, message: discord.Message) -> None:
        if not self._warned_blank:
            self._warned_blank = True
            logger.warning(
                "Discord sent a message in %s without any text; if messages to the bot arrive "
                "empty, %s",
                message.channel,
                INTENT_FIX,
            )


class Origin(NamedTuple):
    """What the access rules read: the server, the channel (a thread's parent), the roles."""

    space: str = ""
    room: str = ""
    roles: tuple[str, ...] = ()


def origin_of(author: discord.abc.User, channel: object, guild_id: int | None) -> Origin:
    if guild_id is None:
        return Origin()
    room = getattr(channel, "parent_id", None) or getattr(channel, "id", "")
    roles = tuple(str(role.id) for role in getattr(author, "roles", ()))
    return Origin(str(guild_id), str(room), roles)


async def _fetch_channel(client: discord.Client, channel_id: int) -> object:
    try:
        return await client.fetch_channel(channel_id)
    except discord.HTTPException as exc:
        logger.warning("Discord: cannot look up channel %s: %s", channel_id, exc)
        return None


def _without_mention(me: discord.ClientUser | None, message: discord.Message) -> tuple[str, bool]:
    """The text with the bot's mention removed (line breaks kept), and whether there was
    one. The bot's own role counts as the bot: Discord's autocomplete offers it beside the
    bot. A mention followed by a bare command word ("@kaiwa stop") is that command."""
    text = message.content
    own_role = message.guild.self_role if message.guild else None
    ids = [str(me.id)] if me else []
    ids += [str(own_role.id)] if own_role else []
    if not ids:
        return text, False
    return without_mention(text, re.compile(rf"[ \t]*<@[!&]?(?:{'|'.join(ids)})>[ \t]*"))


def _thread_name(text: str, author: discord.User | discord.Member) -> str:
    first_line = " ".join(text.strip().split("\n", 1)[0].split())
    name = first_line or f"Kaiwa and {author.display_name}"
    if len(name) <= THREAD_NAME_LIMIT:
        return name
    return name[: THREAD_NAME_LIMIT - 1].rstrip() + "…"
