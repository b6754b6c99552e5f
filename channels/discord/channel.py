"""The Discord adapter: logging in, running the gateway, handing events over, and sending.

Built on discord.py's `Client`, run inside our event loop (`login`, then `connect`, which
resumes or re-identifies by itself after a drop, a RECONNECT or an INVALID_SESSION). discord.py
has no per-client URLs, so the configured REST base and gateway URL are applied to its two
process-wide seams (`discord.http.Route.BASE`, `DiscordWebSocket.DEFAULT_GATEWAY`) when the
channel is built.
The client (`channels.discord.client`) reports every event here; what a message says and where
it belongs is `channels.discord.receiving`'s, a slash command's or click's
`channels.discord.interactions`', and replies go out through `channels.discord.transport`. The
files people attach are fetched for the core (`download`) by `channels.discord.files`.

`connected` follows READY/RESUMED and disconnects; `run` can be called again after it raised
(with a fresh client when the old one was closed). A gateway event discord.py cannot parse is
logged in one line with its name and id, at most one such line every few seconds, and skipped
(`unreadable_event`); a DM without `author` gets through the parser as a message with no author
at all, and `received` skips it the same way.

Concurrency: discord.py runs every event handler as a task of its own, so handlers interleave at
each await. `close` lets the handlers still at work finish before it closes the HTTP session, so
a command answered during shutdown is not cut off
(test_a_command_at_shutdown_still_gets_its_answer); a gateway still reconnecting is then cut
short at once.
"""

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import yarl

from channels.calls import PlatformError
from channels.connection import ConnectionState, unreachable
from channels.discord.client import INTENT_FIX, DiscordClient, new_client
from channels.discord.files import DiscordFiles
from channels.discord.interactions import command_tree, deliver_interaction
from channels.discord.library import app_commands, discord
from channels.discord.receiving import Messages, Threads
from channels.notices import replace_notice, send_notice
from channels.places import DiscordPlace
from channels.presses import answered_privately
from channels.rendering import RenderSettings, StreamingReply
from channels.settings import DiscordSettings
from channels.throttled_log import ThrottledLog
from core.channel import Attachment, Button, ChannelTraits, Deliver, OnPost, Reply
from core.errors import ChannelError

logger = logging.getLogger(__name__)

PLATFORM = DiscordPlace.platform
LOGIN_SECONDS = 30.0
HANDLERS_CLOSE_SECONDS = 10.0
GATEWAY_CLOSE_SECONDS = 1.0  # a closed client's gateway ends at once unless it sleeps a backoff


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
        self._handlers: set[asyncio.Task[Any]] = set()
        self._threads = Threads(settings)
        self._messages = Messages(settings, self._threads)
        self._files = DiscordFiles()
        self._unreadable = ThrottledLog(logger)

    def _new_client(self) -> tuple[DiscordClient, app_commands.CommandTree]:
        client = new_client(self, self._guild_ready_timeout)
        return client, command_tree(client, self._slash_command_used)

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
        then close the gateway and the sessions."""
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=HANDLERS_CLOSE_SECONDS)
        await self._client.close()
        await self._files.close()
        self.connected.clear()
        gateway = self._gateway
        if gateway is not None:
            await asyncio.wait({gateway}, timeout=GATEWAY_CLOSE_SECONDS)
            if not gateway.done():
                gateway.cancel()  # it sleeps out a reconnect's backoff: no request in flight
            await asyncio.gather(gateway, return_exceptions=True)

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        transport = self._threads.transport(self._client, place)
        return StreamingReply(transport, self._render, place, posted, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        if await self._threads.answered_in_channel(self._client, place, text):
            return ()
        seconds = self._settings.final_edit_seconds
        transport = self._threads.transport(self._client, place)
        return await send_notice(transport, text, seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        seconds = self._settings.final_edit_seconds
        await replace_notice(
            self._threads.transport(self._client, place), message_id, text, seconds
        )

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """An attached file's bytes, from Discord's CDN (`core.channel.Files`)."""
        return await self._files.download(attachment, limit)

    # -- receiving -----------------------------------------------------------------------------

    async def received(self, message: discord.Message) -> None:
        """A MESSAGE_CREATE, from discord.py: deliver it if it is for the bot."""
        if not hasattr(message, "author"):  # the library let a payload without one through
            self.unreadable_event("MESSAGE_CREATE", {"id": message.id}, KeyError("author"))
            return
        deliver = self._deliver
        if not (self._receiving and deliver):
            return
        with self._handling():
            read = await self._messages.message_of(self._client, message)
            if read is not None:
                await deliver(read)

    async def clicked(self, interaction: discord.Interaction, command: str) -> None:
        """A click on one of Kaiwa's buttons: `command`, from the person who clicked."""
        with self._handling():
            await interaction.response.defer()
            await self._hand_over(interaction, command)

    async def _slash_command_used(self, interaction: discord.Interaction, text: str) -> None:
        with self._handling():
            await interaction.response.defer(ephemeral=True, thinking=True)
            await self._hand_over(interaction, text)

    async def _hand_over(self, interaction: discord.Interaction, text: str) -> None:
        await deliver_interaction(interaction, text, self._deliver if self._receiving else None)

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
