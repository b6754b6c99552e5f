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
(`chat.postMessage`, then `chat.update`), in Slack mrkdwn. While nothing is visible yet, a
reaction (`working_reaction`) on the person's message says the bot is working; it goes away when
the reply starts. Slack's errors are mapped here and nowhere else: HTTP 429 → `RateLimited`.
"""

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.formatting import slack_mrkdwn
from channels.rendering import RateLimited, RenderSettings, StreamingReply, send_notice
from channels.settings import SlackSettings
from core.channel import ChannelMessage, ChannelTraits, Deliver, Reply
from core.commands import COMMANDS
from core.errors import ChannelError, StoreError

logger = logging.getLogger(__name__)

PLATFORM = "slack"
MESSAGE_LIMIT = 4000
TOP = "top"
COMMAND_WORDS = {name for name, _ in COMMANDS}
SLASH_COMMAND = "/kaiwa"
LAST_RETRY = 3  # Slack retries an unacknowledged event three times
IGNORED_SUBTYPES = {"message_changed", "message_deleted", "channel_join", "channel_leave"}
THREAD_LINK = re.compile(r"p(\d{10})(\d{6})")


@dataclass(frozen=True)
class SlackTokens:
    bot: str
    app: str = ""
    signing_secret: str = ""


@dataclass(frozen=True)
class _Where:
    team: str
    channel: str
    thread: str

    @property
    def place(self) -> str:
        return f"{PLATFORM}:{self.team}:{self.channel}:{self.thread}"

    @classmethod
    def of(cls, place: str) -> "_Where":
        _, team, channel, thread = place.split(":", 3)
        return cls(team, channel, thread)


class SlackTransport:
    """One Slack thread (or top-level DM) as `channels.rendering` sees it."""

    limit = MESSAGE_LIMIT
    controls = False  # no Stop control: `live` changes nothing

    def __init__(
        self,
        client: AsyncWebClient,
        where: _Where,
        working_on: str | None = None,
        reaction: str = "",
    ) -> None:
        self._client = client
        self._channel = where.channel
        self._thread = None if where.thread == TOP else where.thread
        self._working_on = working_on
        self._reaction = reaction
        self._reacted = False

    @staticmethod
    def measure(text: str) -> int:
        return len(text)

    async def send(self, text: str, *, live: bool) -> str:
        with _mapped_errors():
            posted = await self._client.chat_postMessage(
                channel=self._channel, thread_ts=self._thread, text=slack_mrkdwn(text)
            )
        await self._stop_working()
        return str(posted["ts"])

    async def edit(self, message_id: str, text: str, *, live: bool) -> None:
        with _mapped_errors():
            await self._client.chat_update(
                channel=self._channel, ts=message_id, text=slack_mrkdwn(text)
            )

    async def typing(self) -> None:
        """Slack has no typing indicator for bots: a reaction on the person's message instead."""
        if self._reacted or not (self._working_on and self._reaction):
            return
        self._reacted = True
        with contextlib.suppress(SlackApiError):
            await self._client.reactions_add(
                channel=self._channel, timestamp=self._working_on, name=self._reaction
            )

    async def _stop_working(self) -> None:
        if not self._reacted:
            return
        self._reacted = False
        with contextlib.suppress(SlackApiError):
            await self._client.reactions_remove(
                channel=self._channel, timestamp=self._working_on, name=self._reaction
            )


class SlackChannel:
    platform = PLATFORM

    def __init__(self, settings: SlackSettings, tokens: SlackTokens) -> None:
        self._settings = settings
        self._tokens = tokens
        self.traits = ChannelTraits(frame_interval=settings.edit_interval)
        self._render = RenderSettings(
            settings.show_thinking, settings.show_tools, min_interval=settings.edit_interval
        )
        self._client = AsyncWebClient(token=tokens.bot, base_url=settings.api_url)
        self._app = AsyncApp(
            client=self._client,
            signing_secret=tokens.signing_secret or None,
            request_verification_enabled=settings.mode == "http",
            process_before_response=True,
        )
        self._app.event("message")(self._on_event)
        self._app.event("app_mention")(self._on_event)
        # Lazy: the command is acknowledged at once, then handed over (which waits for a stop).
        self._app.command(SLASH_COMMAND)(ack=self._ack_command, lazy=[self._on_command])
        self._app.error(self._on_error)
        self._deliver: Deliver | None = None
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()
        """Set once events can arrive (the socket is connected, or the HTTP server listens)."""
        self.problem: str | None = None
        self._identity: dict[str, str] = {}
        self._threads: dict[tuple[str, str], bool] = {}

    async def problems(self) -> list[str]:
        """What `kaiwa check` reports for Slack: tokens Slack does not accept."""
        problems = self._missing_secrets()
        try:
            await self._who_am_i()
        except SlackApiError as exc:
            problems.append(_token_problem("bot token", self._settings.bot_token_env, exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return [*problems, f"cannot reach Slack at {self._settings.api_url}: {exc}"]
        if self._settings.mode == "socket" and self._tokens.app:
            try:
                await self._client.apps_connections_open(app_token=self._tokens.app)
            except SlackApiError as exc:
                problems.append(
                    _token_problem("app-level token", self._settings.app_token_env, exc)
                )
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
            raise ChannelError(
                _token_problem("bot token", self._settings.bot_token_env, exc)
            ) from exc
        if self._settings.mode == "http":
            await self._serve_http()
        else:
            await self._serve_socket_mode()

    async def stop_receiving(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        """Nothing left open: each Web API call opens and closes its own session."""

    def open_reply(self, place: str, reply_to: str | None, posted: Sequence[str] = ()) -> Reply:
        working_on = reply_to.split(":", 1)[1] if reply_to else None
        transport = SlackTransport(
            self._client, _Where.of(place), working_on, self._settings.working_reaction
        )
        return StreamingReply(transport, self._render, place, posted)

    async def notify(self, place: str, text: str) -> None:
        await send_notice(SlackTransport(self._client, _Where.of(place)), text)

    # -- receiving -----------------------------------------------------------------------------

    async def _serve_socket_mode(self) -> None:
        handler = AsyncSocketModeHandler(self._app, self._tokens.app, web_client=self._client)
        await handler.connect_async()
        self.connected.set()
        logger.info("Slack: connected over Socket Mode as %s", self._identity.get("user_id"))
        try:
            await self._stopping.wait()
        finally:
            await handler.close_async()

    async def _serve_http(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            response = await self._app.async_dispatch(await to_bolt_request(request))
            return await to_aiohttp_response(response)

        server = web.Application()
        server.router.add_post(self._settings.http_path, handle)
        runner = web.AppRunner(server, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._settings.http_host, self._settings.http_port)
        await site.start()
        self.connected.set()
        logger.info(
            "Slack: receiving events on http://%s:%d%s",
            self._settings.http_host,
            self._settings.http_port,
            self._settings.http_path,
        )
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()

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
                place=where.place,
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
                place=where.place,
                message_id=f"command:{command.get('trigger_id', '')}",
                author_id=command.get("user_id", ""),
                text=f"!{word}",
                room=where.channel,
            )
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

    async def _where(self, event: dict[str, Any], body: dict[str, Any]) -> _Where | None:
        """The conversation `event` belongs to, or None when it is not for the bot."""
        team = event.get("team") or body.get("team_id", "")
        channel, thread = event["channel"], event.get("thread_ts")
        if event.get("channel_type") == "im":
            return _Where(team, channel, thread or TOP)
        _, mentioned = self._without_mention(event.get("text", ""))
        if thread is None:
            return _Where(team, channel, event["ts"]) if mentioned else None
        if mentioned or await self._takes_part_in(channel, thread):
            return _Where(team, channel, thread)
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
            identity = await self._client.auth_test()
            self._identity = {
                "user_id": identity.get("user_id", ""),
                "bot_id": identity.get("bot_id", ""),
            }


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except SlackApiError as exc:
        if exc.response.status_code == 429 or exc.response.get("error") == "ratelimited":
            raise RateLimited(float(exc.response.headers.get("Retry-After", 1))) from exc
        raise


def _command_target(command: dict[str, Any]) -> tuple[str, _Where] | None:
    """`/kaiwa <word> <thread>`: the command word and the thread it acts on, or None if either
    is missing (in a DM, the DM itself is the thread)."""
    word, _, target = (command.get("text") or "").strip().partition(" ")
    channel, team = command["channel_id"], command.get("team_id", "")
    thread = _thread_from(target) or (TOP if channel.startswith("D") else None)
    if word not in COMMAND_WORDS or thread is None:
        return None
    return word, _Where(team, channel, thread)


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
