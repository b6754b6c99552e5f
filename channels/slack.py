"""Slack: a conversation is a thread.

Built on slack-bolt's `AsyncApp` over Socket Mode (the default: no public URL needed) or HTTP
Events (signed requests, verified by bolt). Bolt acknowledges an event when our listener returns
(`process_before_response`), and the listener returns as soon as the dispatcher has recorded the
message (the turn, or a command, runs on in the background), so a slow turn never makes Slack
redeliver, and a message that could not be recorded is not acknowledged: Slack delivers it again
(up to three retries; on the last one the person is asked to send it again instead).

Which messages are ours, and where they belong:
- A mention of the bot in a channel opens a thread on that message: the place is
  `slack:<team>:<channel>:<ts of the mention>` and the reply goes into that thread.
- A message in a thread continues it if the bot is part of the thread (it was mentioned there,
  or has posted there: asked once of `conversations.replies`, then remembered); other threads
  are ignored unless the bot is mentioned in them.
- A direct message is one conversation per DM (`slack:<team>:<dm>:top`), or per DM thread.
- Slack does not deliver slash commands inside threads, so `!stop`, `!new`, ... (and a mention
  followed by the bare word: "@kaiwa stop") are the commands there; `/kaiwa stop <thread>` works
  from the channel.
- The same message can arrive as `app_mention` and `message`, and again on a retry or a Socket
  Mode redelivery: its dedupe id is `<channel>:<ts>`, the same every time.

Replies are written by `channels.rendering.StreamingReply` through `SlackTransport`
(`chat.postMessage`, then `chat.update`), in Slack mrkdwn. While a reply streams, its message is
Block Kit: the text in a section block, then a Stop button (an actions block; the buttons under a
command's answer, such as each running sub-agent's Stop under `/agents`, go there the same way);
the final edit sends `blocks=[]`, since Slack keeps a message's blocks when an update leaves them
out. A section holds 3,000
characters, so a message's piece of the reply is measured as the mrkdwn it becomes (escaping
lengthens `<`, `>` and `&`). A press comes to the `action` listener, which acknowledges it at
once and then delivers its command (`/stop`) in the button's thread from the presser (lazily,
since a stop may take longer than Slack waits for an ack), so the access rules apply as to a
typed command; the command's answer goes to the presser alone, as an ephemeral message
(`channels.presses`).

While nothing is visible yet, a reaction (`working_reaction`) on the person's message says the
bot is working; it goes away when the reply starts (after the reaction's own request, if that is
still in flight, so it cannot land after its removal). Slack's errors are mapped here and nowhere
else: HTTP 429 or `ratelimited` → `RateLimited`, any other refusal or network failure →
`PlatformError`, a post answered without its `ts` → `LostMessage` (never the text "None" as a
message id).

Connecting: the Socket Mode URL comes from `apps.connections.open`, asked once per connection by
`_SocketClient` (slack_sdk's client, reporting to the channel). `problems` asks it for `kaiwa
check` and keeps the URL, which `run` then uses if it is still fresh, so a start asks Slack once.
`connected` is cleared while a new URL is asked for and set once the socket is up; a URL Slack
will not hand out sets `problem` and ends `run`, closing the client and its session: with a
`ChannelError` when a token is refused (a person must fix it), else with a `PlatformError`
(trying again later may do), and `run` can be called again. Stopping closes the client at once,
whatever it was doing. In HTTP mode a body that cannot be read gets 400 (Slack retries a 5xx).
"""

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from channels.connection import ConnectionState, unreachable
from channels.formatting import slack_mrkdwn
from channels.places import SlackPlace
from channels.presses import (
    PAYLOAD_PREFIX,
    Press,
    answered_privately,
    fitting,
    payload,
    pressed_command,
    pressing,
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
from channels.settings import SlackSettings
from channels.throttled_log import ThrottledLog
from core.channel import COMMANDS, Button, ChannelMessage, ChannelTraits, Deliver, Reply
from core.errors import ChannelError, StoreError

logger = logging.getLogger(__name__)

PLATFORM = SlackPlace.platform
MESSAGE_LIMIT = 3000  # the text of a section block, which carries a live message's text
PRESSES = re.compile("^" + re.escape(PAYLOAD_PREFIX))
"""The action ids of Kaiwa's buttons (`channels.presses`)."""
ACTION_ID_LIMIT = 255
ACTIONS_PER_BLOCK = 25
COMMAND_WORDS = {name for name, _ in COMMANDS}
SLASH_COMMAND = "/kaiwa"
LAST_RETRY = 3  # Slack retries an unacknowledged event three times
IGNORED_SUBTYPES = {"message_changed", "message_deleted", "channel_join", "channel_leave"}
THREAD_LINK = re.compile(r"p(\d{10})(\d{6})")
FRESH_URL_SECONDS = 10.0  # a Socket Mode URL kept from `problems` is used only this soon
PING_SECONDS = 10.0  # Socket Mode keepalive, and the library's pause between failed connects
PASSING_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable"}


@dataclass(frozen=True)
class SlackTokens:
    bot: str
    app: str = ""
    signing_secret: str = ""


class SlackTransport:
    """One Slack thread (or top-level DM) as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = True

    def __init__(
        self,
        client: AsyncWebClient,
        where: SlackPlace,
        working_on: str | None = None,
        reaction: str = "",
    ) -> None:
        self._client = client
        self._channel = where.channel
        self._thread = where.thread_ts
        self._working_on = working_on
        self._reaction = reaction
        self._working = asyncio.Lock()
        self._reacted = False
        self._replied = False

    @staticmethod
    def measure(text: str) -> int:
        """The length of what Slack is sent for `text` (Markdown becomes mrkdwn)."""
        return len(slack_mrkdwn(text))

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        mrkdwn = slack_mrkdwn(text)
        with _mapped_errors("chat.postMessage"):
            posted = await self._client.chat_postMessage(
                channel=self._channel,
                thread_ts=self._thread,
                text=mrkdwn,
                blocks=_with_buttons(mrkdwn, buttons) if buttons else None,
            )
        await self._stop_working()
        ts = posted.get("ts")
        if not isinstance(ts, str) or not ts:
            raise LostMessage("Slack answered chat.postMessage without the message's ts")
        return ts

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        mrkdwn = slack_mrkdwn(text)
        with _mapped_errors("chat.update"):
            await self._client.chat_update(
                channel=self._channel,
                ts=message_id,
                text=mrkdwn,
                blocks=_with_buttons(mrkdwn, buttons) if buttons else [],  # []: drops them
            )

    async def delete(self, message_id: str) -> None:
        with _mapped_errors("chat.delete"):
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


class _SocketClient(SocketModeClient):
    """slack_sdk's Socket Mode client, reporting to its channel. Every (re)connection asks
    `issue_new_wss_url` first, so the channel is not connected from then until `connect`
    succeeds; a URL that cannot be had marks the client closed (its loops then end quietly
    instead of retrying the same failure forever), keeps the error in `failure` and sets
    `lost`."""

    def __init__(
        self,
        channel: "SlackChannel",
        app_token: str,
        web_client: AsyncWebClient,
        sdk_logger: logging.Logger,
    ) -> None:
        super().__init__(
            app_token, logger=sdk_logger, web_client=web_client, ping_interval=PING_SECONDS
        )
        self._channel = channel
        self.lost = asyncio.Event()
        self.failure: Exception | None = None
        self.asking = False
        """An `apps.connections.open` is in flight (and is let finish)."""

    async def issue_new_wss_url(self) -> str:
        self._channel.connected.clear()
        self.asking = True
        try:
            return await self._channel.socket_url()
        except (ChannelError, PlatformError) as exc:
            self.failure = exc
            self.lost.set()
            self.closed = True  # the connect loop ends quietly; the channel closes the client
            raise
        finally:
            self.asking = False

    async def connect(self) -> None:
        await super().connect()
        if await self.is_connected():
            self._channel.socket_connected()


class _SocketModeHandler(AsyncSocketModeHandler):
    """bolt's Socket Mode handler on a `_SocketClient` (bolt's own constructor would open a
    stock client, with a session of its own, which is why it is not called)."""

    def __init__(self, app: AsyncApp, client: _SocketClient) -> None:
        self.app = app
        self.app_token = client.app_token
        self.client = client
        client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _KeptUrl:
    url: str
    at: float

    @property
    def fresh(self) -> bool:
        return time.monotonic() - self.at < FRESH_URL_SECONDS


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
        self.web_client = AsyncWebClient(token=tokens.bot, base_url=settings.api_url)
        self._app = AsyncApp(
            client=self.web_client,
            signing_secret=tokens.signing_secret or None,
            request_verification_enabled=settings.mode == "http",
            process_before_response=True,
        )
        self._app.event("message")(self._on_event)
        self._app.event("app_mention")(self._on_event)
        # Lazy: the command is acknowledged at once, then handed over (which waits for a stop).
        self._app.command(SLASH_COMMAND)(ack=self._ack_command, lazy=[self._on_command])
        self._app.action(PRESSES)(ack=_ack_press, lazy=[self._on_press])
        self._app.error(self._on_error)
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self._kept_url: _KeptUrl | None = None
        self._identity: dict[str, str] = {}
        self._threads: dict[tuple[str, str], bool] = {}
        self._unreadable = ThrottledLog(logger)

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Slack: tokens Slack does not accept, a Slack it
        cannot reach. The Socket Mode URL asked for here is kept for `run`."""
        problems = self._missing_secrets()
        try:
            await self._who_am_i()
        except SlackApiError as exc:
            problems.append(_token_problem("bot token", self._settings.bot_token_env, exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return [*problems, self._unreachable(exc)]
        if self._settings.mode == "socket" and self._tokens.app:
            try:
                self._kept_url = _KeptUrl(await self._open_socket_url(), time.monotonic())
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
            await self._who_am_i()
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

    def open_reply(self, place: str, reply_to: str | None, posted: Sequence[str] = ()) -> Reply:
        working_on = reply_to.split(":", 1)[1] if reply_to else None
        transport = SlackTransport(
            self.web_client, SlackPlace.of(place), working_on, self._settings.working_reaction
        )
        return StreamingReply(transport, self._render, place, posted)

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
        logger.info("Slack: connected over Socket Mode as %s", self._identity.get("user_id"))

    # -- receiving -----------------------------------------------------------------------------

    async def _serve_socket_mode(self) -> None:
        client = _SocketClient(self, self._tokens.app, self.web_client, self._app.logger)
        handler = _SocketModeHandler(self._app, client)
        connecting = asyncio.create_task(handler.connect_async(), name="slack socket mode")
        try:
            await _first_of(self._stopping, client.lost)
        finally:
            await handler.close_async()
            await _ended(connecting, client)
        if client.failure is not None and not self._stopping.is_set():
            raise client.failure

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
        if self._deliver is None or not self._is_from_a_person(event):
            return
        where = await self._where(event, body)
        if where is None:
            return
        self._threads[(where.channel, where.thread)] = True
        text, _ = self._without_mention(event.get("text", ""))
        await self._deliver(
            ChannelMessage(
                platform=PLATFORM,
                place=where.key,
                message_id=f"{event['channel']}:{event['ts']}",
                author_id=event.get("user", ""),
                text=text,
                room=event["channel"],
                redeliverable=_retry_number(request) < LAST_RETRY,
            )
        )

    async def _ack_command(self, ack: Any, command: dict[str, Any]) -> None:
        target = _command_target(command)
        if target is None:
            await ack(
                f"Use `{SLASH_COMMAND} stop <thread link>` here, or type `!stop`, `!new`, "
                "`!usage` or `!help` inside the thread (Slack does not send slash commands "
                "from threads)."
            )
        else:
            await ack(f"`!{target[0]}` sent to the thread.")

    async def _on_command(self, command: dict[str, Any]) -> None:
        target = _command_target(command)
        if target is None or self._deliver is None:
            return
        word, where = target
        await self._deliver(
            ChannelMessage(
                platform=PLATFORM,
                place=where.key,
                message_id=f"command:{command.get('trigger_id', '')}",
                author_id=command.get("user_id", ""),
                text=f"!{word}",
                room=where.channel,
            )
        )

    async def _on_press(self, body: dict[str, Any]) -> None:
        """A button pressed: its command in the button's thread, from the presser."""
        where, user = _pressed_in(body), (body.get("user") or {}).get("id", "")
        actions = body.get("actions") or [{}]
        command = pressed_command(actions[0].get("action_id"))
        if where is None or not user or command is None or self._deliver is None:
            return
        press = Press(where.key, functools.partial(self._answer_privately, where, user))
        with pressing(press):
            await self._deliver(
                ChannelMessage(
                    platform=PLATFORM,
                    place=where.key,
                    message_id=f"press:{body.get('trigger_id', '')}",
                    author_id=user,
                    text=command,
                    room=where.channel,
                )
            )

    async def _answer_privately(
        self, where: SlackPlace, user: str, text: str, buttons: Sequence[Button]
    ) -> None:
        mrkdwn = slack_mrkdwn(text)
        with _mapped_errors("chat.postEphemeral"):
            await self.web_client.chat_postEphemeral(
                channel=where.channel,
                user=user,
                text=mrkdwn,
                blocks=_with_buttons(mrkdwn, buttons) if buttons else None,
                thread_ts=where.thread_ts,
            )

    async def _on_error(self, error: Exception) -> None:
        """A listener failed, so the event is not acknowledged and Slack delivers it again. A
        message the store could not record was already logged by the dispatcher."""
        if not isinstance(error, StoreError):
            logger.error("Slack: handling an event failed", exc_info=error)

    def _is_from_a_person(self, event: dict[str, Any]) -> bool:
        if event.get("subtype") in IGNORED_SUBTYPES or "channel" not in event:
            return False
        if event.get("bot_id") or event.get("subtype") == "bot_message":
            own = event.get("bot_id") == self._identity.get("bot_id")
            return not own and self._settings.answer_bots
        return event.get("user") != self._identity.get("user_id")

    async def _where(self, event: dict[str, Any], body: dict[str, Any]) -> SlackPlace | None:
        """The conversation `event` belongs to, or None when it is not for the bot."""
        team = event.get("team") or body.get("team_id", "")
        channel, thread = event["channel"], event.get("thread_ts")
        if event.get("channel_type") == "im":
            return SlackPlace(team, channel, thread or SlackPlace.TOP)
        _, mentioned = self._without_mention(event.get("text", ""))
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
                replies = await self.web_client.conversations_replies(channel=channel, ts=thread)
            except SlackApiError as exc:  # not cached: the next message in the thread asks again
                logger.warning("Slack: cannot read thread %s in %s: %s", thread, channel, exc)
                return False
            own = self._identity.get("user_id")
            known = any(
                message.get("user") == own or message.get("bot_id") == self._identity.get("bot_id")
                for message in replies.get("messages", [])
            )
            self._threads[(channel, thread)] = known
        return known

    def _without_mention(self, text: str) -> tuple[str, bool]:
        """The text with the bot's mention removed (line breaks kept), and whether there was
        one. A mention followed by a bare command word ("@kaiwa stop") is that command."""
        mention = f"<@{self._identity.get('user_id')}>"
        if mention not in text:
            return text, False
        rest = re.sub(rf"[ \t]*{re.escape(mention)}[ \t]*", " ", text).strip()
        return (f"!{rest}" if rest.lower() in COMMAND_WORDS else rest), True

    async def _who_am_i(self) -> None:
        if not self._identity:
            identity = await self.web_client.auth_test()
            self._identity = {
                "user_id": identity.get("user_id", ""),
                "bot_id": identity.get("bot_id", ""),
            }


@contextlib.contextmanager
def _mapped_errors(method: str) -> Iterator[None]:
    try:
        yield
    except SlackApiError as exc:
        if exc.response.status_code == 429 or exc.response.get("error") == "ratelimited":
            raise RateLimited(float(exc.response.headers.get("Retry-After", 1))) from exc
        error = exc.response.get("error", f"HTTP {exc.response.status_code}")
        raise PlatformError(f"Slack refused {method} ({error})") from exc
    except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
        raise PlatformError(f"Slack {method} failed: {exc or type(exc).__name__}") from exc


def _with_buttons(mrkdwn: str, buttons: Sequence[Button]) -> list[dict[str, Any]]:
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


async def _ack_press(ack: Any) -> None:
    await ack()


def _pressed_in(body: dict[str, Any]) -> SlackPlace | None:
    """The conversation of the message whose button was pressed: its thread, or the DM's top
    level for a message outside any thread."""
    channel = (body.get("channel") or {}).get("id")
    if not channel:
        return None
    team = (body.get("team") or {}).get("id") or (body.get("user") or {}).get("team_id", "")
    message = body.get("message") or body.get("container") or {}  # an ephemeral has no message
    thread = message.get("thread_ts") or SlackPlace.TOP
    return SlackPlace(team, channel, thread)


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _ended(connecting: asyncio.Task[None], client: _SocketClient) -> None:
    """Let a closed client's connect task end: an `apps.connections.open` in flight is let
    finish; otherwise it is at most waiting to try again, which is cut short."""
    if not connecting.done() and not client.asking:
        connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)


def _refusal(exc: SlackApiError, kind: str, variable: str) -> Exception:
    """A refusal that passes (Slack busy, rate limited) as a `PlatformError`, to try again
    later; any other (a token refused, revoked, of the wrong kind) as a `ChannelError`."""
    error = exc.response.get("error", f"HTTP {exc.response.status_code}")
    if exc.response.status_code >= 500 or error in PASSING_ERRORS:
        return PlatformError(f"Slack will not connect for now ({error}); it is tried again")
    return ChannelError(_token_problem(kind, variable, exc))


def _command_target(command: dict[str, Any]) -> tuple[str, SlackPlace] | None:
    """`/kaiwa <word> <thread>`: the command word and the thread it acts on, or None if either
    is missing (in a DM, the DM itself is the thread)."""
    word, _, target = (command.get("text") or "").strip().partition(" ")
    channel, team = command["channel_id"], command.get("team_id", "")
    thread = _thread_from(target) or (SlackPlace.TOP if channel.startswith("D") else None)
    if word not in COMMAND_WORDS or thread is None:
        return None
    return word, SlackPlace(team, channel, thread)


def _retry_number(request: AsyncBoltRequest) -> int:
    """How many times Slack has already delivered this event (its retry header; 0 at first)."""
    values = request.headers.get("x-slack-retry-num") or ["0"]
    try:
        return int(values[0])
    except ValueError:
        return 0


def _thread_from(target: str) -> str | None:
    """A thread's ts from a raw ts ("1700000000.000100") or a link (".../p1700000000000100")."""
    if re.fullmatch(r"\d{10}\.\d{6}", target):
        return target
    found = THREAD_LINK.search(target)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def _token_problem(kind: str, variable: str, exc: SlackApiError) -> str:
    error = exc.response.get("error", "error")
    return (
        f"Slack rejected the {kind} in ${variable} ({error}): copy it again from your app's "
        "settings"
    )
