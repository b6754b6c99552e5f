"""The Slack adapter: starting, receiving over Socket Mode or HTTP, and sending.

Built on slack-bolt's `AsyncApp` over Socket Mode (the default: no public URL needed) or HTTP
Events (signed requests, verified by bolt). Bolt acknowledges an event when our listener returns
(`process_before_response`), and the listener returns as soon as the dispatcher has recorded the
message (the turn, or a command, runs on in the background), so a slow turn never makes Slack
redeliver, and a message that could not be recorded is not acknowledged: Slack delivers it again
(up to three retries; on the last one the person is asked to send it again instead). The
listeners here only hand over what `channels.slack.receiving` (messages) and
`channels.slack.interactions` (the slash command, button presses) make of an event.

Connecting: the Socket Mode URL comes from `apps.connections.open`, asked once per connection by
`SocketClient` (slack_sdk's client, reporting to the channel: `channels.slack.socket_mode`).
`problems` asks it for `kaiwa check` and keeps the URL, which `run` then uses if it is still
fresh, so a start asks Slack once. `connected` is cleared while a new URL is asked for and set
once the socket is up; a URL Slack will not hand out sets `problem` and ends `run`, closing the
client and its session: with a `ChannelError` when a token is refused (a person must fix it),
else with a `PlatformError` (trying again later may do), and `run` can be called again.
Stopping closes the client at once, whatever it was doing. In HTTP mode a body that cannot be
read gets 400 (Slack retries a 5xx).

Replies and notices go out through `channels.slack.transport`.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.connection import ConnectionState, unreachable
from channels.places import SlackPlace
from channels.presses import answered_privately
from channels.rendering import (
    PlatformError,
    RenderSettings,
    StreamingReply,
    replace_notice,
    send_notice,
)
from channels.settings import SlackSettings
from channels.slack.interactions import (
    PRESSES,
    SLASH_COMMAND,
    ack_command,
    ack_press,
    command_message,
    deliver_press,
)
from channels.slack.receiving import Messages
from channels.slack.socket_mode import KeptUrl, SocketClient, serve_socket_mode
from channels.slack.transport import OnlyIdempotentRetries, SlackTransport
from channels.throttled_log import ThrottledLog
from core.channel import Button, ChannelTraits, Deliver, OnPost, Reply
from core.errors import ChannelError, StoreError

logger = logging.getLogger(__name__)

PLATFORM = SlackPlace.platform
PASSING_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable"}


@dataclass(frozen=True)
class SlackTokens:
    bot: str
    app: str = ""
    signing_secret: str = ""


class SlackChannel(ConnectionState):
    platform = PLATFORM

    def __init__(self, settings: SlackSettings, tokens: SlackTokens) -> None:
        """`connected` is set while events can arrive (the socket is up, or the HTTP server
        listens)."""
        super().__init__()
        self._settings = settings
        self._tokens = tokens
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings.of(settings)
        self.web_client = AsyncWebClient(
            token=tokens.bot, base_url=settings.api_url, retry_handlers=[OnlyIdempotentRetries()]
        )
        self._app = AsyncApp(
            client=self.web_client,
            signing_secret=tokens.signing_secret or None,
            request_verification_enabled=settings.mode == "http",
            process_before_response=True,
        )
        self._app.event("message")(self._on_event)
        self._app.event("app_mention")(self._on_event)
        # Lazy: the command is acknowledged at once, then handed over (which waits for a stop).
        self._app.command(SLASH_COMMAND)(ack=ack_command, lazy=[self._on_command])
        self._app.action(PRESSES)(ack=ack_press, lazy=[self._on_press])
        self._app.error(self._on_error)
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self._kept_url: KeptUrl | None = None
        self._messages = Messages(settings, self.web_client)
        self._unreadable = ThrottledLog(logger)

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Slack: tokens Slack does not accept, a Slack it
        cannot reach. The Socket Mode URL asked for here is kept for `run`."""
        problems = self._missing_secrets()
        try:
            await self._messages.who_am_i()
        except SlackApiError as exc:
            problems.append(_token_problem("bot token", self._settings.bot_token_env, exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return [*problems, self._unreachable(exc)]
        if self._settings.mode == "socket" and self._tokens.app:
            try:
                self._kept_url = KeptUrl(await self._open_socket_url(), time.monotonic())
            except (ChannelError, PlatformError) as exc:
                problems.append(str(exc))
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
        try:
            await self._messages.who_am_i()
        except SlackApiError as exc:
            refusal = _refusal(exc, "bot token", self._settings.bot_token_env)
            raise self.cannot_connect(refusal) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self.cannot_connect(PlatformError(self._unreachable(exc))) from exc
        try:
            if self._settings.mode == "http":
                await self._serve_http()
            else:
                await self._serve_socket_mode()
        finally:
            self.connected.clear()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def open_for_sending(self) -> None:
        """The Web API needs nothing opened: each call opens its own session."""
        self.now_connected()

    async def close(self) -> None:
        """Nothing left open: `run` closes the socket client, and each Web API call opens and
        closes its own session."""

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        working_on = reply_to.split(":", 1)[1] if reply_to else None
        transport = SlackTransport(
            self.web_client, SlackPlace.of(place), working_on, self._settings.working_reaction
        )
        return StreamingReply(transport, self._render, place, posted, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        if await answered_privately(place, text, buttons):
            return ()
        transport = SlackTransport(self.web_client, SlackPlace.of(place))
        return await send_notice(transport, text, self._settings.final_edit_seconds, buttons)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        transport = SlackTransport(self.web_client, SlackPlace.of(place))
        await replace_notice(transport, message_id, text, self._settings.final_edit_seconds)

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
        try:
            return await self._open_socket_url()
        except (ChannelError, PlatformError) as exc:
            raise self.cannot_connect(exc) from exc

    async def _open_socket_url(self) -> str:
        try:
            opened = await self.web_client.apps_connections_open(app_token=self._tokens.app)
        except SlackApiError as exc:
            raise _refusal(exc, "app-level token", self._settings.app_token_env) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PlatformError(self._unreachable(exc)) from exc
        url = opened.get("url")
        if not isinstance(url, str) or not url:
            raise PlatformError("Slack answered apps.connections.open without a Socket Mode URL")
        return url

    def socket_connected(self) -> None:
        self.now_connected()
        logger.info(
            "Slack: connected over Socket Mode as %s", self._messages.identity.get("user_id")
        )

    # -- receiving -----------------------------------------------------------------------------

    async def _serve_socket_mode(self) -> None:
        client = SocketClient(self, self._tokens.app, self.web_client, self._app.logger)
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
        message = command_message(command)
        if message is not None and self._deliver is not None:
            await self._deliver(message)

    async def _on_press(self, body: dict[str, Any]) -> None:
        if self._deliver is not None:
            await deliver_press(self.web_client, body, self._deliver)

    async def _on_error(self, error: Exception) -> None:
        """A listener failed, so the event is not acknowledged and Slack delivers it again. A
        message the store could not record was already logged by the dispatcher."""
        if not isinstance(error, StoreError):
            logger.error("Slack: handling an event failed", exc_info=error)


def _refusal(exc: SlackApiError, kind: str, variable: str) -> Exception:
    """A refusal that passes (Slack busy, rate limited) as a `PlatformError`, to try again
    later; any other (a token refused, revoked, of the wrong kind) as a `ChannelError`."""
    error = exc.response.get("error", f"HTTP {exc.response.status_code}")
    if exc.response.status_code >= 500 or error in PASSING_ERRORS:
        return PlatformError(f"Slack will not connect for now ({error}); it is tried again")
    return ChannelError(_token_problem(kind, variable, exc))


def _token_problem(kind: str, variable: str, exc: SlackApiError) -> str:
    error = exc.response.get("error", "error")
    return (
        f"Slack rejected the {kind} in ${variable} ({error}): copy it again from your app's "
        "settings"
    )
