"""Discord: a conversation is a thread.

Built on discord.py's `Client`, run inside our event loop (`login`, then `connect`, which
resumes or re-identifies by itself after a drop, a RECONNECT or an INVALID_SESSION). discord.py
has no per-client URLs, so the configured REST base and gateway URL are applied to its two
process-wide seams (`Route.BASE`, `DiscordWebSocket.DEFAULT_GATEWAY`) when the channel is built.

Which messages are ours, and where they belong:
- A mention of the bot in a text channel opens a thread on that message (named from its text);
  a thread made from a message takes the message's id, so the place `discord:<guild>:<thread>`
  is known before the thread exists, and the opening message is the conversation's first. The
  thread is opened only once the mention is taken: a notice for it (the dispatcher's refusal of
  a stranger, at most once an hour per person, so mentions cannot make the bot spam a channel;
  a command's answer) is a reply in the channel, no thread; the thread is opened when the turn
  the mention started first shows something there (its typing indicator), so a mention nothing
  answers (a duplicate, a stranger told already) opens none.
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
discord.py waits out a 429 itself (it honours `retry_after` and the bucket headers); a wait
longer than `max_ratelimit_timeout` comes back as `discord.RateLimited`, so a reply skips frames
instead of hanging for minutes, and a 429 it will not wait out (no `Via` header, which it takes
for a ban, or still limited after five tries) as a plain `HTTPException` 429: both map to
`RateLimited`, with the wait from the answer's headers. Other refusals map to `PlatformError`, a
post answered without a readable message to `LostMessage`.

An event discord.py cannot parse (a server's MESSAGE_CREATE without `author`, say) raises inside
its gateway loop and would end it: every parser of the client's connection state is wrapped
(`_Client._get_state`) so such an event is logged in one line with its name and id, at most one
such line every few seconds, and skipped. (A DM without `author` gets through the parser as a
message with no author at all; `received` skips it the same way.)

`connected` follows READY/RESUMED and disconnects; `run` can be called again after it raised
(with a fresh client when the old one was closed).

Concurrency: discord.py runs every event handler as a task of its own, so handlers interleave at
each await. A slash command's or click's answer is routed to its user by `channels.presses`, only
while that interaction's own command runs in the dispatcher, so a notice for another message in
the same thread cannot take it (test_a_private_answer_and_a_public_one_in_one_thread_do_not_swap).
`close` lets the handlers still at work finish before it closes the HTTP session, so a command
answered during shutdown is not cut off (test_a_command_at_shutdown_still_gets_its_answer); a
gateway still reconnecting is then cut short at once.
"""

import asyncio
import contextlib
import functools
import logging
import re
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp
import yarl

from channels.connection import ConnectionState, unreachable
from channels.formatting import split_message
from channels.places import DiscordPlace
from channels.presses import (
    PAYLOAD_PREFIX,
    Press,
    answered_privately,
    fitting,
    payload,
    pressed_command,
    pressing,
    without_mention,
)
from channels.rendering import (
    LostMessage,
    PlatformError,
    RateLimited,
    RenderSettings,
    StreamingReply,
    replace_notice,
    send_notice,
)
from channels.settings import DiscordSettings
from channels.throttled_log import ThrottledLog
from core.channel import COMMANDS, Button, ChannelMessage, ChannelTraits, Deliver, Reply
from core.errors import ChannelError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop (3.11)
    import discord
    from discord import app_commands

# Kaiwa never joins voice: keep discord.py from warning at every start that voice libraries are
# not installed.
discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False

logger = logging.getLogger(__name__)

PLATFORM = DiscordPlace.platform
MESSAGE_LIMIT = 2000
THREAD_NAME_LIMIT = 100
CUSTOM_ID_LIMIT = 100
COMMANDS_WITH_WORDS = {
    "agents": "a name or id; stop NAME; tell NAME MESSAGE",
    "tasks": "pause|resume|cancel|run ID",
    "memory": "forget ID",
    "plan": "the task to plan and carry out",
    "approve": "ID, or ID here",
    "edit": "ID, then what to change",
    "deny": "ID",
}
"""Slash commands that take what follows them (as typed after `!agents`), and its description."""
READ_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
THREAD_TYPES = (
    discord.ChannelType.public_thread,
    discord.ChannelType.private_thread,
    discord.ChannelType.news_thread,
)
LONGEST_LIBRARY_WAIT = 30.0  # seconds; a longer rate limit raises instead (discord.py's minimum)
LOGIN_SECONDS = 30.0
HANDLERS_CLOSE_SECONDS = 10.0
GATEWAY_CLOSE_SECONDS = 1.0  # a closed client's gateway ends at once unless it sleeps a backoff
PENDING_MENTIONS = 1000  # mentions whose thread is not opened yet, remembered at most
MAX_IMAGE_BYTES = 20 * 1024 * 1024
THREAD_EXISTS = 160004  # Discord's error code: a thread was already made from this message
INTENT_FIX = (
    "turn on the Message Content intent: Discord Developer Portal → your application → Bot → "
    "Privileged Gateway Intents → Message Content Intent"
)


class DiscordTransport:
    """One thread, channel or DM channel as `channels.rendering` sees it. `opening`: what to
    await before the first call (the thread of a mention, opened on first use); `reply_to`: a
    message the first post answers."""

    limit = MESSAGE_LIMIT
    controls = True
    measure = staticmethod(len)

    def __init__(
        self,
        client: discord.Client,
        channel_id: int,
        *,
        opening: Callable[[], Awaitable[None]] | None = None,
        reply_to: discord.Message | None = None,
    ) -> None:
        self._channel = client.get_partial_messageable(channel_id)
        self._opening = opening
        self._reply_to = reply_to

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        await self._opened()
        reference, self._reply_to = self._reply_to, None
        with _mapped_errors("a message post"):
            try:
                message = await self._channel.send(
                    text,
                    view=_view(buttons),
                    reference=reference,  # type: ignore[arg-type]
                )
            except (KeyError, TypeError, ValueError) as exc:  # the answer could not be read
                raise LostMessage(
                    f"Discord answered a message post without a usable message ({exc!r})"
                ) from exc
        return str(message.id)

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        await self._opened()
        message = self._channel.get_partial_message(int(message_id))
        with _mapped_errors("a message edit"):
            await message.edit(content=text, view=_view(buttons))

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


class _CommandButton(
    discord.ui.DynamicItem[discord.ui.Button], template=re.escape(PAYLOAD_PREFIX) + r"(?s:.+)"
):
    """A button that is a command (`channels.presses`): a Stop button, an agent's Stop. A
    dynamic item: discord.py routes a click on any message carrying one here, across restarts,
    without keeping a view per message."""

    def __init__(self, label: str, custom_id: str) -> None:
        super().__init__(
            discord.ui.Button(label=label, style=discord.ButtonStyle.secondary, custom_id=custom_id)
        )

    @classmethod
    async def from_custom_id(
        cls,
        interaction: discord.Interaction,
        item: discord.ui.Item,
        match: re.Match[str],
    ) -> "_CommandButton":
        return cls(str(getattr(item, "label", "") or ""), match.string)

    async def callback(self, interaction: discord.Interaction) -> None:
        client, command = interaction.client, pressed_command(self.custom_id)
        if isinstance(client, _Client) and command is not None:
            await client.channel.clicked(interaction, command)


def _view(buttons: Sequence[Button]) -> discord.ui.View | None:
    """The buttons as a message's components (five to a row, as Discord lays them out)."""
    if not buttons:
        return None
    view = discord.ui.View(timeout=None)
    for button in fitting(buttons, CUSTOM_ID_LIMIT)[:25]:
        view.add_item(_CommandButton(button.label[:80], payload(button)))
    return view


class _Client(discord.Client):
    """discord.py's client, with the gateway events Kaiwa listens to."""

    def __init__(self, channel: "DiscordChannel", **options: Any) -> None:
        self.channel = channel  # before the library's constructor, which calls `_get_state`
        super().__init__(**options)

    def _get_state(self, **options: Any) -> Any:
        """The library's connection state, every gateway event parser contained: one that raises
        is reported to the channel instead of ending the gateway task. (`_get_state` and the
        state's `parsers` are the library's only seam for this.)"""
        state = super()._get_state(**options)
        for event, parse in list(state.parsers.items()):
            state.parsers[event] = _contained(event, parse, self.channel.unreadable_event)
        return state

    async def setup_hook(self) -> None:
        self.add_dynamic_items(_CommandButton)

    async def on_message(self, message: discord.Message) -> None:
        await self.channel.received(message)

    async def on_ready(self) -> None:
        self.channel.now_connected()
        logger.info(
            "Discord: connected as %s (%s) in %d servers", self.user, self.user.id, len(self.guilds)
        )

    async def on_resumed(self) -> None:
        self.channel.now_connected()
        logger.info("Discord: gateway session resumed")

    async def on_disconnect(self) -> None:
        self.channel.connected.clear()


def _contained(
    event: str,
    parse: Callable[[Any], None],
    report: Callable[[str, Any, Exception], None],
) -> Callable[[Any], None]:
    def parse_or_report(data: Any) -> None:
        try:
            parse(data)
        except Exception as exc:
            report(event, data, exc)

    return parse_or_report


async def _answer_privately(
    interaction: discord.Interaction, text: str, buttons: Sequence[Button]
) -> None:
    """A command's answer to the person who used a slash command (its deferred response) or
    clicked a button (a private follow-up), `buttons` under its last piece."""
    pieces = split_message(text, MESSAGE_LIMIT, len)
    views = [None] * (len(pieces) - 1) + [_view(buttons)]
    if interaction.type is discord.InteractionType.application_command:
        await interaction.edit_original_response(content=pieces.pop(0), view=views.pop(0))
    for piece, view in zip(pieces, views, strict=True):
        await interaction.followup.send(piece, ephemeral=True, view=view or discord.utils.MISSING)


@dataclass
class _Mention:
    """A mention in a text channel whose thread is not opened yet (see the module docstring)."""

    message: discord.Message
    text: str
    answered: bool = False
    """A notice answered it in the channel: no thread for it."""
    opening: asyncio.Task[discord.Thread | None] | None = field(default=None, repr=False)


class DiscordChannel(ConnectionState):
    platform = PLATFORM

    def __init__(
        self, settings: DiscordSettings, token: str, *, guild_ready_timeout: float = 2.0
    ) -> None:
        """`connected` is set while the gateway session is ready (every server known):
        messages arrive."""
        super().__init__()
        self._settings = settings
        self._token = token
        self._guild_ready_timeout = guild_ready_timeout
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings.of(settings)
        discord.http.Route.BASE = settings.api_base.rstrip("/")
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.gateway_url)
        self._client, self._commands = self._new_client()
        self._commands_registered = False
        self._deliver: Deliver | None = None
        self._receiving = False
        self._stopping = asyncio.Event()
        self._gateway: asyncio.Task[None] | None = None
        self._joined: set[int] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._warned_blank = False
        self._mentions: OrderedDict[int, _Mention] = OrderedDict()
        self._unreadable = ThrottledLog(logger)

    def _new_client(self) -> tuple[_Client, app_commands.CommandTree]:
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = True
        intents.message_content = True
        client = _Client(
            self,
            intents=intents,
            allowed_mentions=discord.AllowedMentions.none(),
            max_ratelimit_timeout=LONGEST_LIBRARY_WAIT,
            guild_ready_timeout=self._guild_ready_timeout,
        )
        commands = app_commands.CommandTree(client)
        for name, summary in COMMANDS:
            commands.add_command(self._slash_command(name, summary))
        return client, commands

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Discord: a token Discord does not accept, an API it
        cannot reach, a missing Message Content intent."""
        try:
            await self._logged_in()
        except (ChannelError, PlatformError) as exc:
            return [str(exc)]
        application = self._client.application
        if application is None:
            return []
        flags = application.flags
        if not (flags.gateway_message_content or flags.gateway_message_content_limited):
            return [f"Discord would send every message without its text: {INTENT_FIX}"]
        return []

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        if self._client.is_closed():  # a failed run closed it: start again with a new one
            self._client, self._commands = self._new_client()
        try:
            await self._logged_in()
        except (ChannelError, PlatformError) as exc:
            raise self.cannot_connect(exc) from exc
        await self._register_commands()
        self._receiving = True
        self._gateway = asyncio.create_task(self._client.connect(), name="discord gateway")
        stopping = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({self._gateway, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not self._stopping.is_set():  # the gateway ended by itself
            self.connected.clear()
            await self._client.close()
            raise self.cannot_connect(self._gateway_failure(self._gateway))

    async def open_for_sending(self) -> None:
        """Log in to the REST API only; the gateway is another worker's."""
        try:
            await self._logged_in()
        except (ChannelError, PlatformError) as exc:
            raise self.cannot_connect(exc) from exc
        self.now_connected()

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
        self.connected.clear()
        gateway = self._gateway
        if gateway is not None:
            await asyncio.wait({gateway}, timeout=GATEWAY_CLOSE_SECONDS)
            if not gateway.done():
                gateway.cancel()  # it sleeps out a reconnect's backoff: no request in flight
            await asyncio.gather(gateway, return_exceptions=True)

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

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        mention = self._mentions.get(DiscordPlace.of(place).channel)
        if mention is not None and mention.opening is None:
            await self._answer_in_channel(mention, text)
            return ()
        seconds = self._settings.final_edit_seconds
        return await send_notice(self._transport(place), text, seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        seconds = self._settings.final_edit_seconds
        await replace_notice(self._transport(place), message_id, text, seconds)

    def _transport(self, place: str) -> DiscordTransport:
        channel = DiscordPlace.of(place).channel
        mention = self._mentions.get(channel)
        if mention is None:
            return DiscordTransport(self._client, channel)
        return DiscordTransport(self._client, channel, opening=lambda: self._thread_of(mention))

    # -- mentions in a channel -----------------------------------------------------------------

    def _remember(self, mention: _Mention) -> None:
        self._mentions[mention.message.id] = mention
        while len(self._mentions) > PENDING_MENTIONS:
            self._mentions.popitem(last=False)

    async def _thread_of(self, mention: _Mention) -> None:
        """Open the mention's thread, once however many calls ask; `PlatformError` if it could
        not be opened (the person was told in the channel)."""
        if mention.opening is None:
            name = f"thread for {mention.message.id}"
            mention.opening = asyncio.create_task(self._open_thread(mention), name=name)
        thread = await asyncio.shield(mention.opening)
        self._mentions.pop(mention.message.id, None)
        if thread is None:
            raise PlatformError(f"no thread could be opened on message {mention.message.id}")

    async def _answer_in_channel(self, mention: _Mention, text: str) -> None:
        """A notice for a mention that has no thread (a refusal, a command's answer): a reply
        to it in the channel. (How often a stranger is refused is the dispatcher's rule.)"""
        mention.answered = True
        self._mentions.pop(mention.message.id, None)
        transport = DiscordTransport(
            self._client, mention.message.channel.id, reply_to=mention.message
        )
        await send_notice(transport, text, self._settings.final_edit_seconds)

    # -- starting ------------------------------------------------------------------------------

    async def _log_in(self) -> None:
        """Log in, once per client; a client that could not is closed."""
        if self._client.user is not None:
            return
        try:
            async with asyncio.timeout(LOGIN_SECONDS):
                await self._client.login(self._token)
        except BaseException:
            await self._client.close()  # its session; the next `run` starts a new client
            raise

    async def _logged_in(self) -> None:
        """`_log_in`, its failures in words with the fix: `ChannelError` for a token Discord
        refuses (a person must fix it), `PlatformError` for a Discord it cannot reach."""
        try:
            await self._log_in()
        except discord.LoginFailure as exc:
            raise ChannelError(self._token_problem()) from exc
        except (aiohttp.ClientError, OSError, TimeoutError, discord.HTTPException) as exc:
            api_base = self._settings.api_base
            raise PlatformError(
                unreachable("Discord", api_base, "[channels.discord].api_base", exc)
            ) from exc

    def _token_problem(self) -> str:
        return (
            f"Discord rejected the bot token in ${self._settings.token_env} (401 Unauthorized): "
            "copy it again from the Developer Portal → your application → Bot → Reset Token"
        )

    async def _register_commands(self) -> None:
        if not self._settings.slash_commands or self._commands_registered:
            return
        try:
            await self._commands.sync()
            self._commands_registered = True
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            logger.warning(
                "Discord: could not register the slash commands (%s); invite the bot with the "
                "applications.commands scope. Typed commands (/stop as text) still work.",
                exc,
            )

    def _gateway_failure(self, gateway: asyncio.Task[None]) -> Exception:
        """What ended the gateway, in words with the fix: `ChannelError` when a person must act
        (the intent, the token), else `PlatformError` (trying again later may do)."""
        error = gateway.exception() if not gateway.cancelled() else None
        if isinstance(error, discord.PrivilegedIntentsRequired):
            return ChannelError(f"Discord refused the Message Content intent: {INTENT_FIX}")
        if isinstance(error, discord.LoginFailure):
            return ChannelError(self._token_problem())
        return PlatformError(f"Discord's gateway connection ended ({error!r}); see the log")

    def unreadable_event(self, event: str, data: Any, exc: Exception) -> None:
        """A gateway event discord.py could not parse: logged (one line, throttled), skipped."""
        event_id = data.get("id") if isinstance(data, Mapping) else None
        self._unreadable.warning(
            "Discord event %s (id %s) could not be read (%s: %s); skipped",
            event,
            event_id,
            type(exc).__name__,
            exc,
        )

    # -- receiving -----------------------------------------------------------------------------

    async def received(self, message: discord.Message) -> None:
        """A MESSAGE_CREATE, from discord.py: deliver it if it is for the bot."""
        if not hasattr(message, "author"):  # the library let a payload without one through
            self.unreadable_event("MESSAGE_CREATE", {"id": message.id}, KeyError("author"))
            return
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
                place=where.key,
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

    async def clicked(self, interaction: discord.Interaction, command: str) -> None:
        with self._handling():
            await interaction.response.defer()
            await self._deliver_interaction(interaction, command)

    def _slash_command(self, name: str, summary: str) -> app_commands.Command:
        async def run_command(interaction: discord.Interaction, what: str = "") -> None:
            if _place_of(interaction) is None:
                await interaction.response.send_message(
                    "Kaiwa's conversations live in threads: mention me in a channel to open "
                    f"one, then use /{name} inside it.",
                    ephemeral=True,
                )
                return
            with self._handling():
                await interaction.response.defer(ephemeral=True, thinking=True)
                await self._deliver_interaction(interaction, f"/{name} {what}".strip())

        if name in COMMANDS_WITH_WORDS:
            described = app_commands.describe(what=COMMANDS_WITH_WORDS[name])(run_command)
            return app_commands.Command(name=name, description=summary, callback=described)

        async def bare(interaction: discord.Interaction) -> None:
            await run_command(interaction)

        return app_commands.Command(name=name, description=summary, callback=bare)

    async def _deliver_interaction(self, interaction: discord.Interaction, text: str) -> None:
        """Deliver a slash command or click as a typed command; its answer (or, if there is none,
        nothing: the "thinking…" goes away) is the interaction's response."""
        answer = functools.partial(_answer_privately, interaction)
        press = Press(_place_of(interaction) or "", answer)
        origin = _origin(interaction.user, interaction.channel, interaction.guild_id)
        with pressing(press):
            if self._receiving and self._deliver and press.place:
                await self._deliver(
                    ChannelMessage(
                        platform=PLATFORM,
                        place=press.place,
                        message_id=f"interaction:{interaction.id}",
                        author_id=str(interaction.user.id),
                        author_name=interaction.user.display_name,
                        text=text,
                        room=origin.room,
                        space=origin.space,
                        author_roles=origin.roles,
                    )
                )
        if not press.answered and interaction.type is discord.InteractionType.application_command:
            with contextlib.suppress(discord.HTTPException):
                await interaction.delete_original_response()

    def _from_a_person(self, message: discord.Message) -> bool:
        me = self._client.user
        if message.type not in READ_MESSAGE_TYPES or me is None or message.author.id == me.id:
            return False
        return self._settings.answer_bots or not message.author.bot

    async def _where(
        self, message: discord.Message, channel: object, text: str, mentioned: bool
    ) -> DiscordPlace | None:
        """The conversation `message` (in `channel`; `text` without the bot's mention) belongs
        to, or None when it is not for the bot."""
        if message.guild is None:
            return DiscordPlace.direct(message.channel.id)
        guild = str(message.guild.id)
        if isinstance(channel, discord.Thread):
            if mentioned:
                await self._join(channel)
            return DiscordPlace(guild, channel.id) if self._takes_part_in(channel) else None
        if mentioned and isinstance(channel, discord.TextChannel):
            if message.thread is None:  # a replay of a mention may know its thread already
                self._remember(_Mention(message, text))
            return DiscordPlace(guild, message.thread.id if message.thread else message.id)
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

    async def _open_thread(self, mention: _Mention) -> discord.Thread | None:
        """The thread on a mention: made now, or found if a replay of it made one already."""
        message = mention.message
        name = _thread_name(mention.text, message.author)
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
        if not ids:
            return text, False
        return without_mention(text, re.compile(rf"[ \t]*<@[!&]?(?:{'|'.join(ids)})>[ \t]*"))

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
        return DiscordPlace.direct(interaction.channel_id or 0).key
    channel = interaction.channel
    is_thread = isinstance(channel, discord.Thread) or (
        isinstance(channel, discord.PartialMessageable) and channel.type in THREAD_TYPES
    )
    if not (is_thread and channel):
        return None
    return DiscordPlace(str(interaction.guild_id), channel.id).key


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
def _mapped_errors(what: str) -> Iterator[None]:
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
