"""Discord: a conversation is a thread.

Built on discord.py's `Client`, run inside our event loop (`login`, then `connect`, which
resumes or re-identifies by itself after a drop, a RECONNECT or an INVALID_SESSION). discord.py
has no per-client URLs, so the configured REST base and gateway URL are applied to its two
process-wide seams (`Route.BASE`, `DiscordWebSocket.DEFAULT_GATEWAY`) when the channel is built.

Which messages are ours, and where they belong:
- A mention of the bot in a text channel opens a thread on that message (named from its text)
  before the message is delivered; a thread made from a message takes the message's id, so the
  place is `discord:<guild>:<thread>` and the opening message is the conversation's first.
- A message in a thread continues it when the bot opened the thread (`owner_id`), joined it, or
  was mentioned there: a mention in someone else's thread makes the bot join it, which Discord
  remembers across restarts. A message in an archived thread reopens it (Discord does that), and
  the thread's id, hence its conversation, is unchanged.
- A direct message is one conversation per DM channel (`discord:dm:<channel>`); `/new` starts a
  fresh one there as anywhere.
- Commands: typed (`/stop`, `!stop`, or a mention followed by the bare word), as slash commands
  registered at start-up, which act on the thread they are used in, and as the Stop button a
  reply carries while it streams. Slash commands and the button are answered privately to the
  person who used them (an ephemeral interaction response), since the reply itself shows the
  outcome to everyone.
- discord.py delivers a replayed MESSAGE_CREATE twice; the message's id is its dedupe id, so the
  dispatcher drops the replay. Interactions are deduplicated by their own ids.

Replies are written by `channels.rendering.StreamingReply` through `DiscordTransport`: Markdown
as is, 2,000 characters a message, a typing indicator until text shows, and a Stop button on a
message while it is live. Mentions in the bot's text never ping anyone (`AllowedMentions.none`).
discord.py waits out a 429 itself (it honours `retry_after` and the bucket headers); only a wait
longer than `max_ratelimit_timeout` comes back as `RateLimited`, so a reply skips frames instead
of hanging for minutes.

Concurrency: discord.py runs every event handler as a task of its own, so handlers interleave at
each await. A slash command's or click's answer is routed by a context variable that is set only
while that interaction's own command runs in the dispatcher, so a notice for another message in
the same thread cannot take it (test_a_private_answer_and_a_public_one_in_one_thread_do_not_swap).
`close` lets the handlers still at work finish before it closes the HTTP session, so a command
answered during shutdown is not cut off (test_a_command_at_shutdown_still_gets_its_answer).
"""

import asyncio
import contextlib
import contextvars
import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp
import yarl

from channels.formatting import split_message
from channels.rendering import RateLimited, RenderSettings, StreamingReply, send_notice
from channels.settings import DiscordSettings
from core.channel import ChannelMessage, ChannelTraits, Deliver, Reply
from core.commands import COMMANDS
from core.errors import ChannelError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop (3.11)
    import discord
    from discord import app_commands

# Kaiwa never joins voice: keep discord.py from warning at every start that voice libraries are
# not installed.
discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False

logger = logging.getLogger(__name__)

PLATFORM = "discord"
DM = "dm"
MESSAGE_LIMIT = 2000
THREAD_NAME_LIMIT = 100
STOP_BUTTON_ID = "kaiwa:stop"
COMMAND_WORDS = {name for name, _ in COMMANDS}
READ_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
THREAD_TYPES = (
    discord.ChannelType.public_thread,
    discord.ChannelType.private_thread,
    discord.ChannelType.news_thread,
)
LONGEST_LIBRARY_WAIT = 30.0  # seconds; a longer rate limit raises instead (discord.py's minimum)
LOGIN_SECONDS = 30.0
HANDLERS_CLOSE_SECONDS = 10.0
MAX_IMAGE_BYTES = 20 * 1024 * 1024
THREAD_EXISTS = 160004  # Discord's error code: a thread was already made from this message
INTENT_FIX = (
    "turn on the Message Content intent: Discord Developer Portal → your application → Bot → "
    "Privileged Gateway Intents → Message Content Intent"
)


@dataclass(frozen=True)
class _Where:
    """A conversation: a thread in a guild, or a DM channel (`guild` is "dm")."""

    guild: str
    channel: int

    @property
    def place(self) -> str:
        return f"{PLATFORM}:{self.guild}:{self.channel}"

    @classmethod
    def of(cls, place: str) -> "_Where":
        _, guild, channel = place.split(":", 2)
        return cls(guild, int(channel))


class DiscordTransport:
    """One thread or DM channel as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = True
    measure = staticmethod(len)

    def __init__(self, client: discord.Client, channel_id: int) -> None:
        self._channel = client.get_partial_messageable(channel_id)

    async def send(self, text: str, *, live: bool) -> str:
        with _mapped_errors():
            message = await self._channel.send(text, view=_controls(live))
        return str(message.id)

    async def edit(self, message_id: str, text: str, *, live: bool) -> None:
        message = self._channel.get_partial_message(int(message_id))
        with _mapped_errors():
            await message.edit(content=text, view=_controls(live))

    async def typing(self) -> None:
        with _mapped_errors():
            await self._channel.typing()


class _StopButton(discord.ui.DynamicItem[discord.ui.Button], template=STOP_BUTTON_ID):
    """The Stop button on a live reply. A dynamic item: discord.py routes a click on any message
    carrying it here, across restarts, without keeping a view per message."""

    def __init__(self) -> None:
        super().__init__(
            discord.ui.Button(
                label="Stop", style=discord.ButtonStyle.secondary, custom_id=STOP_BUTTON_ID
            )
        )

    @classmethod
    async def from_custom_id(
        cls,
        interaction: discord.Interaction,
        item: discord.ui.Item,
        match: re.Match[str],
    ) -> "_StopButton":
        return cls()

    async def callback(self, interaction: discord.Interaction) -> None:
        client = interaction.client
        if isinstance(client, _Client):
            await client.channel.stop_clicked(interaction)


def _controls(live: bool) -> discord.ui.View | None:
    if not live:
        return None
    view = discord.ui.View(timeout=None)
    view.add_item(_StopButton())
    return view


class _Client(discord.Client):
    """discord.py's client, with the gateway events Kaiwa listens to."""

    def __init__(self, channel: "DiscordChannel", **options: object) -> None:
        super().__init__(**options)
        self.channel = channel

    async def setup_hook(self) -> None:
        self.add_dynamic_items(_StopButton)

    async def on_message(self, message: discord.Message) -> None:
        await self.channel.received(message)

    async def on_ready(self) -> None:
        self.channel.connected.set()
        logger.info(
            "Discord: connected as %s (%s) in %d servers", self.user, self.user.id, len(self.guilds)
        )

    async def on_resumed(self) -> None:
        logger.info("Discord: gateway session resumed")


_answering: contextvars.ContextVar["_Interaction | None"] = contextvars.ContextVar(
    "discord interaction being answered", default=None
)


@dataclass
class _Interaction:
    """A slash command or button click while its command runs: the command's answer in
    `place` goes to the person privately, as the interaction's response."""

    interaction: discord.Interaction
    place: str
    answered: bool = False

    async def answer(self, text: str) -> None:
        pieces = split_message(text, MESSAGE_LIMIT, len)
        if self.interaction.type is discord.InteractionType.application_command:
            await self.interaction.edit_original_response(content=pieces.pop(0))
        for piece in pieces:
            await self.interaction.followup.send(piece, ephemeral=True)
        self.answered = True


class DiscordChannel:
    platform = PLATFORM

    def __init__(
        self, settings: DiscordSettings, token: str, *, guild_ready_timeout: float = 2.0
    ) -> None:
        self._settings = settings
        self._token = token
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings(
            settings.show_thinking, settings.show_tools, min_interval=settings.edit_interval
        )
        discord.http.Route.BASE = settings.api_base.rstrip("/")
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.gateway_url)
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = True
        intents.message_content = True
        self._client = _Client(
            self,
            intents=intents,
            allowed_mentions=discord.AllowedMentions.none(),
            max_ratelimit_timeout=LONGEST_LIBRARY_WAIT,
            guild_ready_timeout=guild_ready_timeout,
        )
        self._commands = app_commands.CommandTree(self._client)
        for name, summary in COMMANDS:
            self._commands.add_command(self._slash_command(name, summary))
        self._deliver: Deliver | None = None
        self.connected = asyncio.Event()
        """Set once the gateway session is ready (every server known): messages arrive."""
        self.problem: str | None = None
        self._receiving = False
        self._stopping = asyncio.Event()
        self._gateway: asyncio.Task[None] | None = None
        self._joined: set[int] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._warned_blank = False

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Discord: a token Discord does not accept, an API it
        cannot reach, a missing Message Content intent."""
        try:
            await self._log_in()
        except ChannelError as exc:
            return [str(exc)]
        except (aiohttp.ClientError, OSError, TimeoutError, discord.HTTPException) as exc:
            return [f"cannot reach Discord at {self._settings.api_base}: {exc}"]
        application = self._client.application
        if application is None:
            return []
        flags = application.flags
        if not (flags.gateway_message_content or flags.gateway_message_content_limited):
            return [f"Discord would send every message without its text: {INTENT_FIX}"]
        return []

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        await self._log_in()
        if self._settings.slash_commands:
            await self._register_commands()
        self._receiving = True
        self._gateway = asyncio.create_task(self._client.connect(), name="discord gateway")
        stopping = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({self._gateway, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if self._gateway.done():
            self._gateway_result(self._gateway)

    async def stop_receiving(self) -> None:
        """Ignore new events; the gateway stays open until `close`, so replies still edit."""
        self._receiving = False
        self._stopping.set()

    async def close(self) -> None:
        """Let the handlers still at work finish (a command's answer needs the HTTP session),
        then close the gateway and the session."""
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=HANDLERS_CLOSE_SECONDS)
        await self._client.close()
        if self._gateway is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._gateway

    @contextlib.contextmanager
    def _handling(self) -> Iterator[None]:
        """Mark the running task (discord.py runs each event in one) as at work until it ends."""
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            yield
        finally:
            self._handlers.discard(task)

    def open_reply(self, place: str, reply_to: str | None, posted: Sequence[str] = ()) -> Reply:
        return StreamingReply(self._transport(place), self._render, place, posted)

    async def notify(self, place: str, text: str) -> None:
        pending = _answering.get()
        if pending is not None and pending.place == place and not pending.answered:
            await pending.answer(text)
            return
        await send_notice(self._transport(place), text)

    def _transport(self, place: str) -> DiscordTransport:
        return DiscordTransport(self._client, _Where.of(place).channel)

    # -- starting ------------------------------------------------------------------------------

    async def _log_in(self) -> None:
        if self._client.user is not None:
            return
        try:
            async with asyncio.timeout(LOGIN_SECONDS):
                await self._client.login(self._token)
        except discord.LoginFailure as exc:
            raise ChannelError(self._token_problem()) from exc

    def _token_problem(self) -> str:
        return (
            f"Discord rejected the bot token in ${self._settings.token_env} (401 Unauthorized): "
            "copy it again from the Developer Portal → your application → Bot → Reset Token"
        )

    async def _register_commands(self) -> None:
        try:
            await self._commands.sync()
        except discord.HTTPException as exc:
            logger.warning(
                "Discord: could not register the slash commands (%s); invite the bot with the "
                "applications.commands scope. Typed commands (/stop as text) still work.",
                exc,
            )

    def _gateway_result(self, gateway: asyncio.Task[None]) -> None:
        """Raise what ended the gateway, in words with the fix."""
        try:
            gateway.result()
        except discord.PrivilegedIntentsRequired as exc:
            raise ChannelError(f"Discord refused the Message Content intent: {INTENT_FIX}") from exc
        except discord.LoginFailure as exc:
            raise ChannelError(self._token_problem()) from exc

    # -- receiving -----------------------------------------------------------------------------

    async def received(self, message: discord.Message) -> None:
        """A MESSAGE_CREATE, from discord.py: deliver it if it is for the bot."""
        if not (self._receiving and self._deliver and self._from_a_person(message)):
            return
        with self._handling():
            await self._deliver_message(self._deliver, message)

    async def _deliver_message(self, deliver: Deliver, message: discord.Message) -> None:
        channel = message.channel
        if isinstance(channel, discord.PartialMessageable) and message.guild is not None:
            channel = await self._fetch_channel(channel.id)  # a thread not in the cache
        text, mentioned = self._without_mention(message)
        where = await self._where(message, channel, text, mentioned)
        if where is None:
            return
        if not (message.content or message.attachments):
            self._warn_blank(message)
            return
        origin = _origin(message.author, channel, message.guild and message.guild.id)
        await deliver(
            ChannelMessage(
                platform=PLATFORM,
                place=where.place,
                message_id=str(message.id),
                author_id=str(message.author.id),
                author_name=message.author.display_name,
                text=text,
                images=await _images(message),
                room=origin.room,
                space=origin.space,
                author_roles=origin.roles,
            )
        )

    async def stop_clicked(self, interaction: discord.Interaction) -> None:
        with self._handling():
            await interaction.response.defer()
            await self._deliver_interaction(interaction, "/stop")

    def _slash_command(self, name: str, summary: str) -> app_commands.Command:
        async def run_command(interaction: discord.Interaction) -> None:
            if _place_of(interaction) is None:
                await interaction.response.send_message(
                    "Kaiwa's conversations live in threads: mention me in a channel to open "
                    f"one, then use /{name} inside it.",
                    ephemeral=True,
                )
                return
            with self._handling():
                await interaction.response.defer(ephemeral=True, thinking=True)
                await self._deliver_interaction(interaction, f"/{name}")

        return app_commands.Command(name=name, description=summary, callback=run_command)

    async def _deliver_interaction(self, interaction: discord.Interaction, text: str) -> None:
        """Deliver a slash command or click as a typed command; its answer (or, if there is none,
        nothing: the "thinking…" goes away) is the interaction's response."""
        pending = _Interaction(interaction, _place_of(interaction) or "")
        origin = _origin(interaction.user, interaction.channel, interaction.guild_id)
        token = _answering.set(pending)
        try:
            if self._receiving and self._deliver and pending.place:
                await self._deliver(
                    ChannelMessage(
                        platform=PLATFORM,
                        place=pending.place,
                        message_id=f"interaction:{interaction.id}",
                        author_id=str(interaction.user.id),
                        author_name=interaction.user.display_name,
                        text=text,
                        room=origin.room,
                        space=origin.space,
                        author_roles=origin.roles,
                    )
                )
        finally:
            _answering.reset(token)
        if not pending.answered and interaction.type is discord.InteractionType.application_command:
            with contextlib.suppress(discord.HTTPException):
                await interaction.delete_original_response()

    def _from_a_person(self, message: discord.Message) -> bool:
        me = self._client.user
        if message.type not in READ_MESSAGE_TYPES or me is None or message.author.id == me.id:
            return False
        return self._settings.answer_bots or not message.author.bot

    async def _where(
        self, message: discord.Message, channel: object, text: str, mentioned: bool
    ) -> _Where | None:
        """The conversation `message` (in `channel`; `text` without the bot's mention) belongs
        to, or None when it is not for the bot."""
        if message.guild is None:
            return _Where(DM, message.channel.id)
        guild = str(message.guild.id)
        if isinstance(channel, discord.Thread):
            if mentioned:
                await self._join(channel)
            return _Where(guild, channel.id) if self._takes_part_in(channel) else None
        if mentioned and isinstance(channel, discord.TextChannel):
            thread = await self._open_thread(message, text)
            return None if thread is None else _Where(guild, thread.id)
        return None

    def _takes_part_in(self, thread: discord.Thread) -> bool:
        me = self._client.user
        return (
            (me is not None and thread.owner_id == me.id)
            or thread.me is not None
            or thread.id in self._joined
        )

    async def _join(self, thread: discord.Thread) -> None:
        """Take part in someone else's thread, remembered by Discord across restarts."""
        if self._takes_part_in(thread):
            return
        self._joined.add(thread.id)
        try:
            await thread.join()
        except discord.HTTPException as exc:
            logger.warning("Discord: could not join thread %s: %s", thread.id, exc)

    async def _open_thread(self, message: discord.Message, text: str) -> discord.Thread | None:
        """The thread on a mention: made now, or found if a replay of it made one already."""
        if message.thread is not None:
            return message.thread
        name = _thread_name(text, message.author)
        try:
            return await message.create_thread(
                name=name, auto_archive_duration=self._settings.thread_archive_minutes
            )
        except discord.HTTPException as exc:
            if exc.code == THREAD_EXISTS:
                found = await self._fetch_channel(message.id)
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

    async def _fetch_channel(self, channel_id: int) -> object:
        try:
            return await self._client.fetch_channel(channel_id)
        except discord.HTTPException as exc:
            logger.warning("Discord: cannot look up channel %s: %s", channel_id, exc)
            return None

    def _without_mention(self, message: discord.Message) -> tuple[str, bool]:
        """The text with the bot's mention removed (line breaks kept), and whether there was
        one. The bot's own role counts as the bot: Discord's autocomplete offers it beside the
        bot. A mention followed by a bare command word ("@kaiwa stop") is that command."""
        me, text = self._client.user, message.content
        own_role = message.guild.self_role if message.guild else None
        ids = [str(me.id)] if me else []
        ids += [str(own_role.id)] if own_role else []
        mention = re.compile(rf"[ \t]*<@[!&]?(?:{'|'.join(ids)})>[ \t]*")
        if not ids or not mention.search(text):
            return text, False
        rest = mention.sub(" ", text).strip()
        return (f"!{rest}" if rest.lower() in COMMAND_WORDS else rest), True

    def _warn_blank(self, message: discord.Message) -> None:
        if not self._warned_blank:
            self._warned_blank = True
            logger.warning(
                "Discord sent a message in %s without any text; if messages to the bot arrive "
                "empty, %s",
                message.channel,
                INTENT_FIX,
            )


class _Origin(NamedTuple):
    """What the access rules read: the server, the channel (a thread's parent), the roles."""

    space: str = ""
    room: str = ""
    roles: tuple[str, ...] = ()


def _origin(author: discord.abc.User, channel: object, guild_id: int | None) -> _Origin:
    if guild_id is None:
        return _Origin()
    room = getattr(channel, "parent_id", None) or getattr(channel, "id", "")
    roles = tuple(str(role.id) for role in getattr(author, "roles", ()))
    return _Origin(str(guild_id), str(room), roles)


def _place_of(interaction: discord.Interaction) -> str | None:
    """Where a slash command or button acts: the thread or DM it was used in."""
    if interaction.guild_id is None:
        return _Where(DM, interaction.channel_id or 0).place
    channel = interaction.channel
    is_thread = isinstance(channel, discord.Thread) or (
        isinstance(channel, discord.PartialMessageable) and channel.type in THREAD_TYPES
    )
    return _Where(str(interaction.guild_id), channel.id).place if is_thread and channel else None


def _thread_name(text: str, author: discord.User | discord.Member) -> str:
    first_line = " ".join(text.strip().split("\n", 1)[0].split())
    name = first_line or f"Kaiwa and {author.display_name}"
    if len(name) <= THREAD_NAME_LIMIT:
        return name
    return name[: THREAD_NAME_LIMIT - 1].rstrip() + "…"


async def _images(message: discord.Message) -> tuple[bytes, ...]:
    """The pictures attached to a message (at most MAX_IMAGE_BYTES each)."""
    images = []
    for attachment in message.attachments:
        if not (attachment.content_type or "").startswith("image/"):
            continue
        if attachment.size > MAX_IMAGE_BYTES:
            logger.warning("Discord: skipped %s (%d bytes)", attachment.filename, attachment.size)
            continue
        try:
            images.append(await attachment.read())
        except discord.HTTPException as exc:
            logger.warning("Discord: cannot download %s: %s", attachment.filename, exc)
    return tuple(images)


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except discord.RateLimited as exc:
        raise RateLimited(exc.retry_after) from exc
