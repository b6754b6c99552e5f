"""The Slack adapter: starting, receiving over Socket Mode or HTTP, and sending.

Built on slack-bolt's `AsyncApp` over Socket Mode (the default: no public URL needed) or HTTP
Events (signed requests, verified by bolt). Bolt acknowledges an event when our listener returns
(`process_before_response`), and the listener returns as soon as the dispatcher has recorded the
message (the turn, or a command, runs on in the background), so a slow turn never makes Slack
redeliver, and a message that could not be recorded is not acknowledged: Slack delivers it again
(up to three retries; on the last one the person is asked to send it again instead). The
listeners here only hand over what `channels.slack.receiving` (messages) and
`channels.slack.interactions` (the slash command, button presses) make of an event; whatever
else Slack sends (a shortcut, another app's button, an event Kaiwa does not read) is
acknowledged all the same and logged once (`Unoffered`), so Slack never waits for it or sends
it again. Who the bot is, bolt learns from the channel (`_authorized`), not from an `auth.test`
of its own at the first event, which a Slack in trouble would answer by dropping the event.

Connecting: who the bot is (`auth.test`), then the Socket Mode URL, from `apps.connections.open`,
asked once per connection by `SocketClient` (slack_sdk's client, reporting to the channel:
`channels.slack.socket_mode`). `problems` asks both for `kaiwa check` and keeps the URL, which
`run` then uses if it is still fresh, so a start asks Slack once. Slack's refusals
(`channels.slack.refusals`) are met as they deserve, at start as later: a rate limit is waited
out, as long as Slack asks; a refused token (`needs_a_person`) is a `ChannelError` (the bot
stops: a person must fix it); anything else, a server error above all, is said as Slack's
trouble and is no problem for the start: `run` meets it again and raises a `PlatformError`, and
the supervisor tries again with backoff, as for a Slack it cannot reach. `connected` is cleared
while a new URL is asked for and set once the socket is up; a URL Slack will not hand out sets
`problem` and ends `run`, closing the client and its session, and `run` can be called again.
Stopping closes the client at once, whatever it was doing, and cuts a rate limit's wait short.
In HTTP mode a body that cannot be read gets 400 (Slack retries a 5xx).

Replies and notices go out through `channels.slack.transport`; the files people attach are
fetched through `channels.slack.files` (`download`).
"""

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.authorization.async_authorize import AsyncAuthorize
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.budget import Budget
from channels.calls import PlatformError
from channels.connection import ConnectionState, unreachable
from channels.notices import replace_notice, send_notice
from channels.places import SlackPlace
from channels.presses import answered_privately
from channels.rendering import RenderSettings, StreamingReply
from channels.settings import SlackSettings
from channels.slack.files import SlackFiles
from channels.slack.interactions import (
    PRESSES,
    Unoffered,
    ack_command,
    ack_press,
    command_message,
    deliver_press,
)
from channels.slack.names import DisplayNames
from channels.slack.receiving import Messages
from channels.slack.refusals import Refusal
from channels.slack.socket_mode import PING_SECONDS, KeptUrl, SocketClient, serve_socket_mode
from channels.slack.transport import OnlyIdempotentRetries, SlackTransport, thread_limits
from channels.throttled_log import ThrottledLog
from core.channel import Attachment, Button, ChannelTraits, Deliver, OnPost, Reply
from core.errors import ChannelError, StoreError
from core.metrics import PLATFORM_API_ERRORS, PLATFORM_RATE_LIMITS

logger = logging.getLogger(__name__)

PLATFORM = SlackPlace.platform
SLASH_COMMANDS = re.compile("^/")
"""Every slash command of the app is Kaiwa's, whatever its settings name it."""
T = TypeVar("T")


@dataclass(frozen=True)
class SlackTokens:
    bot: str
    app: str = ""
    signing_secret: str = ""


class _KnownBot(AsyncAuthorize):
    """Who the bot is, for bolt (which skips the bot's own events with it), as the channel's
    `run` learnt it: bolt would otherwise ask `auth.test` itself, at the first event."""

    def __init__(self, messages: Messages, token: str) -> None:
        self._messages = messages
        self._token = token

    async def __call__(
        self,
        *,
        context: AsyncBoltContext,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None,
        **actor: str | None,
    ) -> AuthorizeResult:
        itself = await self._messages.who_am_i()
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id,
            bot_token=self._token,
            bot_id=itself.bot_id,
            bot_user_id=itself.user_id,
        )


class SlackChannel(ConnectionState):
    platform = PLATFORM

    def __init__(
        self, settings: SlackSettings, tokens: SlackTokens, *, socket_ping: float = PING_SECONDS
    ) -> None:
        """`connected` is set while events can arrive (the socket is up, or the HTTP server
        listens). `socket_ping`: Socket Mode's keepalive, and its pause between failed tries."""
        super().__init__()
        self._settings = settings
        self._tokens = tokens
        self._socket_ping = socket_ping
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings.of(settings)
        self.web_client = self._web_client(tokens.bot)
        self._names = DisplayNames(self.web_client)
        self._files = SlackFiles(tokens.bot, settings.api_url)
        self._messages = Messages(settings, self.web_client, self._names, self._files)
        self._budget = Budget(paced=settings.paced)
        self._app = AsyncApp(
            client=self._web_client(None),  # bolt's requests carry the token `_authorized` gives
            authorize=_KnownBot(self._messages, tokens.bot),
            signing_secret=tokens.signing_secret or None,
            request_verification_enabled=settings.mode == "http",
            process_before_response=True,
            raise_error_for_unhandled_request=True,  # to `_on_error`, which acknowledges it
        )
        self._app.event("message")(self._on_event)
        self._app.event("app_mention")(self._on_event)
        # Lazy: the command is acknowledged at once, then handed over (which waits for a stop).
        self._app.command(SLASH_COMMANDS)(ack=ack_command, lazy=[self._on_command])
        self._app.action(PRESSES)(ack=ack_press, lazy=[self._on_press])
        self._app.error(self._on_error)
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self._kept_url: KeptUrl | None = None
        self._unreadable = ThrottledLog(logger)
        self._unoffered = Unoffered()

    def _web_client(self, token: str | None) -> AsyncWebClient:
        return AsyncWebClient(
            token=token, base_url=self._settings.api_url, retry_handlers=[OnlyIdempotentRetries()]
        )

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Slack: tokens Slack does not accept, a Slack it
        cannot reach. Slack's own trouble (a server error) is logged, and is no problem: the
        start goes on, and `run` tries again. The Socket Mode URL asked for here is kept for
        `run`."""
        problems = self._missing_secrets()
        try:
            await self._who_am_i()
            if self._settings.mode == "socket" and self._tokens.app:
                self._kept_url = KeptUrl(await self._open_socket_url(), time.monotonic())
        except ChannelError as exc:
            problems.append(str(exc))
        except PlatformError as exc:
            logger.warning(
                "%s (Slack's trouble, not the settings: Kaiwa starts all the same, and connects "
                "once Slack answers)",
                exc,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            problems.append(self._unreachable(exc))
        return problems

    def _missing_secrets(self) -> list[str]:
        settings = self._settings
        if settings.mode == "socket" and not self._tokens.app:
            return [
                f"Slack Socket Mode needs an app-level token (xapp-..., with connections:write) "
                f'in ${settings.app_token_env}, or set [channels.slack].mode = "http"'
            ]
        if settings.mode == "http" and not self._tokens.signing_secret:
            return [
                f"Slack HTTP mode needs the app's signing secret in ${settings.signing_secret_env}"
            ]
        return []

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        with self._giving_up():
            await self._who_am_i()
        try:
            if self._settings.mode == "http":
                await self._serve_http()
            else:
                await self._serve_socket_mode()
        finally:
            self.connected.clear()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """An attached file's bytes (`core.channel.Files`), fetched with the bot token."""
        return await self._files.download(attachment, limit)

    async def open_for_sending(self) -> None:
        """The Web API needs nothing opened: each call opens its own session."""
        self.now_connected()

    async def close(self) -> None:
        """Ends the name lookups still running; nothing else is left open: `run` closes the
        socket client, and each Web API call opens and closes its own session."""
        await self._names.close()

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        working_on = reply_to.split(":", 1)[1] if reply_to else None
        transport = self._transport(place, working_on, self._settings.working_reaction)
        return StreamingReply(transport, self._render, place, posted, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        transport = self._transport(place)
        return await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        transport = self._transport(place)
        await replace_notice(transport, message_id, text, self._settings.final_edit_seconds)

    def _transport(
        self, place: str, working_on: str | None = None, reaction: str = ""
    ) -> SlackTransport:
        where = SlackPlace.of(place)
        pace = self._budget.pace(thread_limits(where))
        who_am_i = self._messages.who_am_i
        return SlackTransport(self.web_client, where, who_am_i, pace, working_on, reaction)

    # -- connecting ----------------------------------------------------------------------------

    def _unreachable(self, exc: Exception) -> str:
        return unreachable("Slack", self._settings.api_url, "[channels.slack].api_url", exc)

    async def socket_url(self) -> str:
        """A Socket Mode URL for the next connection: the one `problems` kept, if still fresh,
        else a new one. Raises (with `problem` set) when Slack will not give one: `ChannelError`
        if it refused the app-level token, else `PlatformError`."""
        kept, self._kept_url = self._kept_url, None
        if kept is not None and kept.fresh:
            return kept.url
        with self._giving_up():
            return await self._open_socket_url()

    async def _who_am_i(self) -> None:
        bot = ("bot token", self._settings.bot_token_env)
        await self._asking("auth.test", self._messages.who_am_i, *bot)

    async def _open_socket_url(self) -> str:
        app = ("app-level token", self._settings.app_token_env)
        opened = await self._asking(
            "apps.connections.open",
            lambda: self.web_client.apps_connections_open(app_token=self._tokens.app),
            *app,
        )
        url = opened.get("url")
        if not isinstance(url, str) or not url:
            raise PlatformError("Slack answered apps.connections.open without a Socket Mode URL")
        return url

    async def _asking(
        self, method: str, call: Callable[[], Awaitable[T]], kind: str, variable: str
    ) -> T:
        """`call`'s answer, through every rate limit on it. A token Slack refuses is a
        `ChannelError` naming `kind` and its `variable`, any other refusal a `PlatformError`;
        a network failure is raised as it is."""
        while True:
            try:
                return await call()
            except SlackApiError as exc:
                refusal = Refusal.of(exc, method)
                counted = PLATFORM_RATE_LIMITS if refusal.rate_limited else PLATFORM_API_ERRORS
                counted.labels(self.platform).inc()
                if refusal.needs_a_person:
                    raise ChannelError(refusal.token_problem(kind, variable)) from exc
                if not refusal.rate_limited:
                    raise PlatformError(f"{refusal.described()}; it is tried again") from exc
            await self._wait_out(refusal)

    async def _wait_out(self, limit: Refusal) -> None:
        """A rate limit, waited out as long as Slack asks (`problem` says so meanwhile); a stop
        cuts it short, with a `PlatformError`."""
        waiting = f"{limit.described()}; it is tried again then"
        self.lost(waiting)
        logger.warning("Slack: %s", waiting)
        try:
            await asyncio.wait_for(self._stopping.wait(), limit.retry_after)
        except TimeoutError:
            return
        raise PlatformError(f"stopped while {limit.described()}")

    @contextmanager
    def _giving_up(self) -> Iterator[None]:
        """A failure to connect, recorded as `problem` and raised; a Slack it cannot reach as a
        `PlatformError` (tried again later)."""
        try:
            yield
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc
        except (ChannelError, PlatformError) as exc:
            self.cannot_connect(exc)
            raise

    def socket_connected(self) -> None:
        self.now_connected()
        itself = self._messages.identity
        logger.info("Slack: connected over Socket Mode as %s", itself and itself.user_id)

    # -- receiving -----------------------------------------------------------------------------

    async def _serve_socket_mode(self) -> None:
        client = SocketClient(self, self._tokens.app, self.web_client, self._socket_ping)
        await serve_socket_mode(self._app, client, self._stopping)

    async def _serve_http(self) -> None:
        settings = self._settings
        address = (settings.http_host, settings.http_port, settings.http_path)
        receiving = self.receiving_posts(
            self._on_http_request, address, "Slack events", "[channels.slack].http_port"
        )
        async with receiving:
            logger.info("Slack: receiving events on http://%s:%d%s", *address)
            await self._stopping.wait()

    async def _on_http_request(self, request: web.Request) -> web.Response:
        """A signed event or command from Slack; a body that cannot be read gets 400, since
        Slack would retry a 500 that the same body can only fail again."""
        try:
            bolt_request = await to_bolt_request(request)
        except (ValueError, TypeError, AttributeError) as exc:
            self._unreadable.warning(
                "Slack: an HTTP request to %s could not be read (%s: %s); answered 400",
                request.path,
                type(exc).__name__,
                exc,
            )
            return web.Response(status=400, text="unreadable body")
        return await to_aiohttp_response(await self._app.async_dispatch(bolt_request))

    async def _on_event(
        self, event: dict[str, Any], body: dict[str, Any], request: AsyncBoltRequest
    ) -> None:
        if self._deliver is None:
            return
        message = await self._messages.message_of(event, body, request)
        if message is not None:
            await self._deliver(message)

    async def _on_command(self, command: dict[str, Any]) -> None:
        message = await command_message(command, self._names)
        if message is not None and self._deliver is not None:
            await self._deliver(message)

    async def _on_press(self, body: dict[str, Any]) -> None:
        if self._deliver is not None:
            await deliver_press(self.web_client, body, self._deliver, self._names)

    async def _on_error(self, error: Exception, body: dict[str, Any]) -> BoltResponse | None:
        """An envelope no listener takes is acknowledged (`Unoffered`). A listener that failed
        leaves its event unacknowledged, so Slack delivers it again; a message the store could
        not record was already logged by the dispatcher."""
        if isinstance(error, BoltUnhandledRequestError):
            return self._unoffered.acknowledged(body)
        if not isinstance(error, StoreError):
            logger.error("Slack: handling an event failed", exc_info=error)
        return None
