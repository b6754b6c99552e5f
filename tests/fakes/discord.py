"""A fake Discord that speaks Discord's real wire protocols: the REST API and the gateway.

Tests point the real discord.py ``Client`` at this server instead of mocking it, so what the
library sends, parses, retries, resumes and reconnects on is exactly what production code sees.
discord.py has no per-client URL options; its seams are two process-wide class attributes,
``discord.http.Route.BASE`` and ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY``, which
``install()``/``uninstall()`` (or ``with fake.installed():``) set and restore. It is one
``aiohttp.web`` app on 127.0.0.1:

- ``/api/v10/...``: the REST API routes a bot uses (see ``_routes``), token checked from
  ``Authorization: Bot <token>``. JSON answers carry ``Content-Type: application/json`` exactly:
  discord.py parses a body only on that exact header, so ``web.json_response`` (which appends
  ``; charset=utf-8``) would hand it strings. Errors are Discord's ``{"message", "code"}``; a
  scripted 429 (``fail_next``) carries a JSON ``retry_after`` and, as Discord does, ``Via``
  (``via=False`` leaves it out: discord.py then takes the 429 for a Cloudflare ban and does not
  retry), whole-second ``Retry-After`` and, for a bucket's limit, the ``X-RateLimit-*`` headers
  (``Reset-After`` to the millisecond), or for ``scope="global"`` ``X-RateLimit-Global``.
  ``answer_without`` answers a route without a field (a message without its ``id``); ``holds``
  keeps answers waiting on a condition (by route, e.g. ``"POST /channels/{channel}/typing"``)
  and counts requests in flight and requests abandoned by the client.
- ``/gateway/`` (``DEFAULT_GATEWAY``) and ``/resume/`` (READY's ``resume_gateway_url``): the
  gateway websocket. HELLO, heartbeat ACKs, IDENTIFY → READY + GUILD_CREATE, RESUME → the missed
  dispatches then RESUMED, RECONNECT, INVALID_SESSION and an abrupt drop are all real. Frames are
  plain-text JSON whatever compression the client asks for; discord.py only decompresses binary
  frames.

People are simulated with ``user_message``/``dm``/``replay_message``/``button_click``/
``slash_command``/``user_thread``, which make a dispatch synchronously and return its payload (or
id); one writer task puts dispatches on the wire in sequence order. The guild's world changes
with ``add_text_channel``, ``add_role`` (authors and interaction users carry ``roles=``) and
``archive_thread``/``reopen_thread``; as on Discord, a message into an archived thread (a
person's or the bot's) reopens it first, only active threads are in GUILD_CREATE, and the bot
joins a thread with ``PUT /channels/{thread}/thread-members/@me`` (THREAD_MEMBERS_UPDATE; an
archived one refuses with 50083). Attachments, each an ``Upload`` (or a plain ``(filename,
content_type, bytes)``), are attachment objects shaped as Discord's (a voice message,
``Upload.voice_message``, with ``duration_secs``, a ``waveform`` and the message's
IS_VOICE_MESSAGE flag), served by the fake itself as Discord's CDN serves them: at their
``url`` under ``/attachments/``, signed (``?ex=&is=&hm=``) and valid for a day, so a link with
a wrong signature or past its expiry (``expire_attachment_links``) answers 404 "This content is
no longer available.", an unknown one 404 too, with no token asked for; ``fail_next`` scripts
the CDN's refusals as the API's, and its requests are ``calls`` too. An image's width and height
come from a PNG header, else ``IMAGE_SIZE``. Dispatches made while no socket is live wait in
the session and are replayed after a RESUME; an INVALID_SESSION (not resumable) loses those, as
on Discord, and dispatches made while there is no session at all go out after the next READY.
Without the MESSAGE_CONTENT intent (or with the portal switch ``message_content_intent_enabled``
off) content, embeds, attachments and components are blanked except in DMs, messages mentioning
the bot and the bot's own, as Discord does; the library does not warn. Asking for the intent
while the switch is off closes the gateway with 4014. The bot's own messages come back as
MESSAGE_CREATE and its edits as MESSAGE_UPDATE (``echo_bot_messages=False`` turns that off;
ephemeral interaction answers are never echoed). Interaction callbacks and the interaction
webhook (``@original`` edits, followups) need no bot token, as on Discord: the token in the path
is the credential. What the bot did is recorded as ``calls``, ``messages(channel)``,
``threads``, ``commands`` and ``interaction_callbacks``; ``wait_until`` re-checks a condition on
every call, frame and dispatch, so tests wait on what happened instead of sleeping. ``close()``
closes the websockets and stops the writer before the runner is cleaned up, and uninstalls.

With ``limits=True`` it keeps Discord's REST limits (``tests.fakes.rate_limits``, fixed windows:
a bucket's first call opens it, its allowance comes back whole when it ends, as Discord's
``X-RateLimit-Reset-After`` says). Per channel, the buckets Discord's headers describe
(``BUCKETS``): a message's create and edit share one, 5 in 5 seconds (one ``X-RateLimit-Bucket``
hash for both routes, as Discord answers); deleting a message is its own, 5 a second (a bot's
own, young messages); typing its own, 5 in 5 seconds. Every request with the bot's token counts
against the global limit too, 50 a second (interaction callbacks and webhooks, authorised by
their own token, do not, as on Discord); other routes have no bucket here. Every answer of a
bucketed route carries ``X-RateLimit-Limit``, ``-Remaining``, ``-Reset``, ``-Reset-After`` and
``-Bucket``, which discord.py reads to wait on its own once ``Remaining`` is 0. A request past a
limit gets Discord's 429: ``{"message": "You are being rate limited.", "retry_after": F,
"global": false}``, ``Retry-After``, ``Via`` and the bucket's headers with ``Remaining: 0``, or
for the global limit ``"global": true`` and ``X-RateLimit-Global``. Each refusal is kept in
``refused_429``, and when each counted request came in in ``rate_limits.admitted`` (on
``rate_limits.clock``, which a test may stop and move by hand).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import inspect
import itertools
import json
import math
import secrets
import struct
import time
import warnings
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from urllib.parse import quote

import yarl
from aiohttp import WSCloseCode, WSMsgType, web

from tests.fakes.changes import Changes
from tests.fakes.holds import Holds, hang_up
from tests.fakes.rate_limits import Limiter, Refusal, Window

with warnings.catch_warnings():
    # discord.py imports audioop, deprecated since 3.11; pytest turns warnings into errors
    warnings.simplefilter("ignore", DeprecationWarning)
    import discord.gateway
    import discord.http

BOT_TOKEN = "fake-discord-bot-token"
BOT_USER_ID = 1_100_000_000_000_000_001
BOT_NAME = "kaiwa"
APPLICATION_ID = BOT_USER_ID  # Discord gives a bot the same id as its application
GUILD_ID = 1_100_000_000_000_000_010
GUILD_NAME = "Test Guild"
CHANNEL_ID = 1_100_000_000_000_000_020
CHANNEL_NAME = "general"
USER_ID = 1_100_000_000_000_000_030  # the default person
OWNER_ID = 1_100_000_000_000_000_040
BOT_ROLE_ID = 1_100_000_000_000_000_050  # the role Discord gives a bot in each server it joins
SESSION_PREFIX = "fake-session-"
MAX_CONTENT_CHARS = 2000
MESSAGE_CONTENT_INTENT = 1 << 15
API_VERSION = 10
HEARTBEAT_INTERVAL_MS = 41_250  # Discord's usual value

# gateway opcodes
DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE, VOICE_STATE = 0, 1, 2, 3, 4
RESUME, RECONNECT, REQUEST_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 6, 7, 8, 9, 10, 11

# channel types
GUILD_TEXT, DM, PUBLIC_THREAD = 0, 1, 11

EVERYONE_PERMISSIONS = (1 << 41) - 1 & ~(1 << 3)  # all but administrator
IMAGE_SIZE = (640, 480)  # width and height of image bytes that are not a PNG
VOICE_MESSAGE_FLAG = 1 << 13  # a message's IS_VOICE_MESSAGE
VOICE_MESSAGE_NAME = "voice-message.ogg"  # what Discord's apps name a recorded voice message
WAVEFORM_SAMPLES = 256  # a voice message's waveform: at most 256 one-byte samples
CDN_LINK_SECONDS = 24 * 3600  # how long a signed attachment link works
LINK_GONE = "This content is no longer available."  # the CDN's 404 for an expired link

_Json = dict[str, Any]
_EPOCH_MS = 1_420_070_400_000  # Discord's snowflake epoch
GLOBAL_WINDOW = Window("global", 50, 1.0, fixed=True)
BUCKETS: dict[str, tuple[str, int, float]] = {
    "POST /channels/{channel}/messages": ("fake-messages", 5, 5.0),
    "PATCH /channels/{channel}/messages/{message}": ("fake-messages", 5, 5.0),
    "DELETE /channels/{channel}/messages/{message}": ("fake-deletions", 5, 1.0),
    "POST /channels/{channel}/typing": ("fake-typing", 5, 5.0),
}
"""Each bucketed route's bucket, counted per channel: its hash, calls and seconds."""


@dataclass(frozen=True)
class Call:
    """One REST request (or CDN request) as received; ``status`` is what the fake answered."""

    method: str
    path: str  # after /api/v10, e.g. "/channels/123/messages"; the CDN's: "/attachments/..."
    body: Any
    query: dict[str, str]
    at: float
    status: int = 200
    token: str | None = None


@dataclass(frozen=True)
class Sent:
    """A bot message as it stands now; ``fake.messages`` returns snapshots.

    ``content`` and ``components`` are as last set; ``edits`` holds the content of every
    successful edit, in order.
    """

    id: int
    channel_id: int
    content: str
    components: list[_Json] = field(default_factory=list)
    embeds: list[_Json] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    reference: int | None = None  # the message replied to
    ephemeral: bool = False  # an interaction response only its user sees (never dispatched)
    interaction_id: int | None = None  # the interaction this answered, if any


@dataclass(frozen=True)
class Upload:
    """A file a person attaches. ``content_type`` None leaves it out of the attachment object
    (as Discord does when it could not tell); ``voice`` makes it a voice message (its message
    gets the IS_VOICE_MESSAGE flag, the attachment ``duration_secs`` of ``seconds`` and a
    ``waveform``); ``size`` is the size the attachment object declares, when a test wants it
    to differ from the bytes served (None: their length)."""

    filename: str
    content_type: str | None
    data: bytes
    voice: bool = False
    seconds: float | None = None
    size: int | None = None

    @classmethod
    def voice_message(cls, data: bytes, seconds: float) -> Upload:
        """A voice message as Discord's apps record one: ``voice-message.ogg``, OGG Opus."""
        return cls(VOICE_MESSAGE_NAME, "audio/ogg", data, voice=True, seconds=seconds)


Attached = Upload | tuple[str, str, bytes]
"""An attachment as a test gives it: an ``Upload``, or ``(filename, content_type, data)``."""


@dataclass(frozen=True)
class Frame:
    """A gateway frame the client sent (heartbeats included), with the connection number."""

    connection: int
    op: int
    d: Any
    at: float


@dataclass(frozen=True)
class _Bucket:
    """The bucket one request counts in: Discord's hash for it, and its window (per channel)."""

    hash: str
    window: Window


def _bucket_of(route: str, params: _Json) -> _Bucket | None:
    if route not in BUCKETS:
        return None
    name, calls, seconds = BUCKETS[route]
    return _Bucket(name, Window(f"{name} {params['channel']}", calls, seconds, fixed=True))


def _bucket_headers(limit: int, remaining: int, reset_after: float, name: str) -> dict[str, str]:
    reset_after = _millis_up(reset_after)
    return {
        "X-RateLimit-Limit": str(limit),
        "X-RateLimit-Remaining": str(remaining),
        "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
        "X-RateLimit-Reset-After": f"{reset_after:.3f}",
        "X-RateLimit-Bucket": name,
    }


def _millis_up(seconds: float) -> float:
    """A wait to the millisecond, as Discord states one, rounded up: a client that waits it out
    is never a moment early."""
    return math.ceil(round(seconds * 1000, 6)) / 1000


def _too_many(wait: float, scope: str, via: bool, bucket: dict[str, str]) -> web.Response:
    """A 429 as Discord sends it: with the bucket's headers, or the global limit's."""
    is_global = scope == "global"
    body = {"message": "You are being rate limited.", "retry_after": wait, "global": is_global}
    headers = {"Retry-After": str(max(1, math.ceil(wait))), "X-RateLimit-Scope": scope}
    if is_global:
        headers["X-RateLimit-Global"] = "true"
    else:
        headers.update(bucket)
    if via:
        headers["Via"] = "1.1 google"
    return _json_response(body, status=429, headers=headers)


@dataclass(frozen=True)
class _Failure:
    status: int
    retry_after: float
    via: bool = True
    scope: str = "user"


@dataclass
class _Session:
    id: str
    intents: int
    events: list[_Json] = field(default_factory=list)  # dispatch frames; events[i]["s"] == i + 1


@dataclass(eq=False)
class _Socket:
    number: int
    ws: web.WebSocketResponse
    request: web.Request
    path: str
    session: _Session | None = None
    sent: int = 0  # seq of the last dispatch written to this socket
    retired: bool = False  # gets no more dispatches
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _ApiError(Exception):
    def __init__(self, status: int, message: str, code: int = 0, extra: _Json | None = None):
        super().__init__(message)
        self.status = status
        self.body: _Json = {"message": message, "code": code, **(extra or {})}


def _json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None):
    """A JSON answer whose Content-Type is exactly ``application/json``, as discord.py needs."""
    response = web.Response(body=json.dumps(data).encode(), status=status, headers=headers)
    response.headers["Content-Type"] = "application/json"
    return response


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def _image_size(data: bytes) -> tuple[int, int]:
    """A PNG's width and height from its header; ``IMAGE_SIZE`` for any other bytes."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    return IMAGE_SIZE


def _waveform(data: bytes) -> str:
    """A voice message's waveform, base64: up to 256 one-byte samples, here taken evenly from
    the bytes themselves (Discord's apps sample the loudness)."""
    step = max(1, len(data) // WAVEFORM_SAMPLES)
    return base64.b64encode(data[::step][:WAVEFORM_SAMPLES]).decode()


def user_object(user_id: int, name: str | None = None, *, bot: bool = False) -> _Json:
    """A Discord user object (new-style username: discriminator "0")."""
    name = name or (BOT_NAME if user_id == BOT_USER_ID else f"user{user_id % 10_000}")
    return {
        "id": str(user_id),
        "username": name,
        "discriminator": "0",
        "global_name": name.title(),
        "avatar": None,
        "bot": bot,
        "public_flags": 0,
        "flags": 0,
    }


class FakeDiscord:
    """An aiohttp server on 127.0.0.1: the REST API and the gateway for one guild."""

    def __init__(
        self,
        *,
        token: str = BOT_TOKEN,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        echo_bot_messages: bool = True,
        limits: bool = False,
    ) -> None:
        self.token = token
        self.rate_limits = Limiter(enabled=limits)
        """Discord's limits, kept only with ``limits`` (see the module's docstring)."""
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.echo_bot_messages = echo_bot_messages
        self.message_content_intent_enabled = True  # the developer portal switch
        self.gateway_refused = False
        """While true, every gateway connection is refused (HTTP 503), counted in
        ``refused_connections``: a gateway the bot cannot reach, for now."""
        self.refused_connections = 0
        self.url = ""
        self.port = 0
        self.calls: list[Call] = []
        self.frames: list[Frame] = []  # everything the client sent on any gateway socket
        self.connections: list[str] = []  # path + query of every gateway connection
        self.identifies = 0
        self.resumes = 0
        self.heartbeats = 0
        self.commands: list[_Json] = []  # the last bulk-overwritten global commands
        self.guild_commands: dict[int, list[_Json]] = {}
        self.interaction_callbacks: list[_Json] = []  # {"interaction_id", "token", "type", ...}
        self._interactions: dict[str, _Json] = {}  # token -> interaction state
        self.threads: dict[int, _Json] = {}  # thread id -> {parent_id, name, starter_id, ...}
        self._roles: dict[int, _Json] = {BOT_ROLE_ID: self._bot_role()}  # @everyone aside
        self._files: dict[tuple[int, int], Upload] = {}  # (channel, attachment id) -> file
        self._cdn_key = secrets.token_bytes(32)  # what the CDN signs its links with
        self._cdn_skew = 0.0  # the CDN's clock ahead of ours (`expire_attachment_links`)
        self._ids = itertools.count(1)
        self._guild_created = datetime.now(UTC) - timedelta(days=30)
        self._channels: dict[int, _Json] = {
            CHANNEL_ID: self._text_channel(CHANNEL_ID, CHANNEL_NAME, position=0)
        }
        self._dm_channels: dict[int, int] = {}  # user id -> DM channel id
        self._stored: dict[int, dict[int, _Json]] = {}  # channel -> message id -> message
        self._sent: dict[int, Sent] = {}  # bot message id -> Sent
        self._failures: dict[tuple[str, str], deque[_Failure]] = {}
        self._session: _Session | None = None
        self._sessions = 0
        self._orphans: list[tuple[str, _Json]] = []  # dispatches made with no session
        self._sockets: list[_Socket] = []
        self._live: _Socket | None = None
        self._changes = Changes()  # notified on each call, frame, dispatch and connection
        self.holds = Holds(self._changes)
        """Held answers, requests in flight and abandoned ones, by route ("POST /channels/...")."""
        self._without: dict[tuple[str, str], str] = {}  # (method, path prefix) -> field left out
        self._hang_ups: Counter[tuple[str, str]] = Counter()  # (method, path prefix) -> calls
        self._nonces: dict[tuple[int, str], int] = {}
        """(channel, nonce) -> the bot message created with it and `enforce_nonce`."""
        self._wake = asyncio.Event()  # wakes the writer
        self._runner: web.AppRunner | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._saved: tuple[str, Any] | None = None
        self.deleted: list[int] = []
        """Ids of the bot's messages it deleted, in order."""
        self._routes: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
            ("GET", "/users/@me", self._get_me),
            ("GET", "/oauth2/applications/@me", self._get_application),
            ("GET", "/applications/@me", self._get_application),
            ("POST", "/users/@me/channels", self._open_dm),
            ("GET", "/channels/{channel}", self._get_channel),
            ("POST", "/channels/{channel}/messages", self._create_message),
            ("GET", "/channels/{channel}/messages/{message}", self._get_message),
            ("PATCH", "/channels/{channel}/messages/{message}", self._edit_message),
            ("DELETE", "/channels/{channel}/messages/{message}", self._delete_message),
            ("POST", "/channels/{channel}/typing", self._typing),
            ("POST", "/channels/{channel}/messages/{message}/threads", self._start_thread),
            ("PUT", "/channels/{channel}/thread-members/@me", self._join_thread),
            ("PUT", "/applications/{app}/commands", self._put_commands),
            ("GET", "/applications/{app}/commands", self._get_commands),
            ("PUT", "/applications/{app}/guilds/{guild}/commands", self._put_guild_commands),
            ("POST", "/interactions/{interaction}/{token}/callback", self._interaction_callback),
            ("POST", "/webhooks/{app}/{token}", self._followup),
            ("GET", "/webhooks/{app}/{token}/messages/{message}", self._get_webhook_message),
            ("PATCH", "/webhooks/{app}/{token}/messages/{message}", self._edit_webhook_message),
        ]

    # --- lifecycle ---

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v{version}/{path:.*}", self._api)
        app.router.add_get("/gateway/", self._gateway)
        app.router.add_get("/resume/", self._gateway)
        app.router.add_get(r"/attachments/{channel:\d+}/{attachment:\d+}/{filename}", self._cdn)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        host, self.port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{self.port}"
        self._writer = asyncio.create_task(self._write_dispatches())

    async def close(self) -> None:
        """Stop the writer, close every websocket, stop the server; idempotent."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        self._closing = True
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        for sock in self._sockets:
            sock.retired = True
            if not sock.closed:
                with contextlib.suppress(Exception):
                    await sock.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        await runner.cleanup()
        self.uninstall()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def refused_429(self) -> list[Refusal]:
        """Every request answered 429 for a limit (``limits``), in order; scripted ones aside."""
        return self.rate_limits.refused

    @property
    def api_base(self) -> str:
        return f"{self.url}/api/v{API_VERSION}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway/"

    @property
    def resume_gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/resume/"

    def install(self) -> None:
        """Point discord.py (process-wide) at this fake; ``uninstall`` restores the originals."""
        if self._saved is None:
            self._saved = (
                discord.http.Route.BASE,
                discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY,
            )
        discord.http.Route.BASE = self.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.gateway_url)

    def uninstall(self) -> None:
        if self._saved is None:
            return
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = self._saved
        self._saved = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[Self]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    # --- what people do ---

    def user_message(
        self,
        channel_id: int,
        content: str,
        *,
        author_id: int = USER_ID,
        mentions_bot: bool = False,
        mentions_bot_role: bool = False,
        message_id: int | None = None,
        bot: bool = False,
        roles: list[int] | None = None,
        attachments: Sequence[Attached] = (),
    ) -> _Json:
        """A person's message in a guild channel or thread: dispatch MESSAGE_CREATE and return
        the full message (as stored, content unstripped). ``mentions_bot`` prefixes the
        content with ``<@BOT_USER_ID>`` and lists the bot in ``mentions`` (``mentions_bot_role``:
        ``<@&BOT_ROLE_ID>`` in ``mention_roles``, the bot's role, which Discord's autocomplete
        offers beside the bot); the author's member
        object carries ``roles`` (ids from ``add_role``); each of ``attachments`` (an
        ``Upload``, or ``(filename, content_type, data)``) is served at its attachment's
        ``url``, and a voice message among them flags the message IS_VOICE_MESSAGE. An
        archived thread is reopened first (THREAD_UPDATE), as Discord does."""
        if channel_id not in self._channels:
            raise KeyError(f"no guild channel or thread {channel_id}")
        if mentions_bot:
            content = f"<@{BOT_USER_ID}> {content}"
        if mentions_bot_role:
            content = f"<@&{BOT_ROLE_ID}> {content}"
        message = self._message(
            channel_id,
            content,
            user_object(author_id, bot=bot),
            message_id=message_id,
            mentions=[user_object(BOT_USER_ID, bot=True)] if mentions_bot else [],
            roles=roles,
        )
        self._attach(message, attachments)
        if mentions_bot_role:
            message["mention_roles"] = [str(BOT_ROLE_ID)]
        self._reopen_if_archived(channel_id)
        self._store(message)
        self._dispatch("MESSAGE_CREATE", message)
        return message

    def dm(
        self,
        user_id: int,
        content: str,
        *,
        message_id: int | None = None,
        attachments: Sequence[Attached] = (),
    ) -> _Json:
        """A direct message from ``user_id`` to the bot (opens the DM channel on first use);
        ``attachments`` as for ``user_message``."""
        channel_id = self._dm_channel(user_id)
        message = self._message(
            channel_id,
            content,
            user_object(user_id),
            message_id=message_id,
            guild=False,
        )
        self._attach(message, attachments)
        self._store(message)
        self._dispatch("MESSAGE_CREATE", message)
        return message

    def open_dm(self, user_id: int) -> int:
        """The DM channel with ``user_id``, opened without a message (as the bot's own
        ``POST /users/@me/channels`` would); returns its id."""
        return self._dm_channel(user_id)

    def replay_message(self, message: _Json) -> None:
        """Dispatch the same MESSAGE_CREATE again, with a new sequence number (a replay)."""
        self._dispatch("MESSAGE_CREATE", dict(message))

    def button_click(
        self,
        message: _Json | int,
        custom_id: str,
        *,
        user_id: int = USER_ID,
        component_type: int = 2,
        values: list[str] | None = None,
        roles: list[int] | None = None,
    ) -> _Json:
        """A person clicks a component (a button by default; ``values`` for a select) on a
        message: dispatch INTERACTION_CREATE type 3 and return the interaction. In a guild the
        interaction's member carries ``roles``."""
        message_id = int(message["id"]) if isinstance(message, dict) else int(message)
        stored = next((m[message_id] for m in self._stored.values() if message_id in m), None)
        if stored is None:
            raise KeyError(f"no message {message_id}")
        data: _Json = {"custom_id": custom_id, "component_type": component_type}
        if values is not None:
            data["values"] = values
        return self._interaction(3, data, int(stored["channel_id"]), user_id, roles, stored)

    def slash_command(
        self,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        channel_id: int = CHANNEL_ID,
        user_id: int = USER_ID,
        roles: list[int] | None = None,
    ) -> _Json:
        """A person runs ``/name`` with string, integer, boolean or number ``options``:
        dispatch INTERACTION_CREATE type 2 and return the interaction. The command's id is the
        one from the last bulk overwrite, if it was registered; in a guild the interaction's
        member carries ``roles``."""
        registered = [*self.commands, *self.guild_commands.get(GUILD_ID, [])]
        command = next((c for c in registered if c.get("name") == name), None)
        option_types = {bool: 5, int: 4, float: 10, str: 3}
        data: _Json = {
            "id": command["id"] if command else str(self._snowflake()),
            "name": name,
            "type": 1,
            "options": [
                {"name": key, "type": option_types.get(type(value), 3), "value": value}
                for key, value in (options or {}).items()
            ],
        }
        if command and "guild_id" in command:
            data["guild_id"] = command["guild_id"]
        return self._interaction(2, data, channel_id, user_id, roles)

    def interaction_state(self, interaction: _Json) -> _Json:
        """What became of an interaction: ``responded`` (callback type or None),
        ``original`` (response message id), ``followups``."""
        state = self._interactions[interaction["token"]]
        return {k: state[k] for k in ("responded", "original", "followups", "message_id")}

    def dispatch(self, event: str, data: _Json) -> None:
        """Dispatch any gateway event as given."""
        self._dispatch(event, data)

    def add_text_channel(self, name: str, *, channel_id: int | None = None) -> int:
        """Another text channel in the guild, announced with CHANNEL_CREATE; returns its id."""
        channel_id = channel_id or self._snowflake()
        self._channels[channel_id] = self._text_channel(channel_id, name, len(self._channels))
        self._dispatch("CHANNEL_CREATE", self._channels[channel_id])
        return channel_id

    def add_role(self, name: str) -> int:
        """A role in the guild, announced with GUILD_ROLE_CREATE (and in every later
        GUILD_CREATE); returns its id for ``roles=``."""
        role_id = self._snowflake()
        role = self._role(role_id, name, len(self._roles) + 1, 0)
        self._roles[role_id] = role
        self._dispatch("GUILD_ROLE_CREATE", {"guild_id": str(GUILD_ID), "role": role})
        return role_id

    def user_thread(self, channel_id: int, name: str, *, owner_id: int = USER_ID) -> int:
        """A public thread a person opened in a text channel, with no starter message and
        without the bot as a member: dispatch THREAD_CREATE and return its id. It is not in
        ``threads`` (the bot did not make it)."""
        parent = self._channels.get(channel_id)
        if parent is None or parent["type"] != GUILD_TEXT:
            raise KeyError(f"no text channel {channel_id}")
        thread_id = self._snowflake()
        self._channels[thread_id] = self._thread(thread_id, channel_id, name, owner_id)
        self._dispatch("THREAD_CREATE", {**self._channels[thread_id], "newly_created": True})
        return thread_id

    def archive_thread(self, thread_id: int) -> None:
        """Archive a thread (as Discord does after inactivity): THREAD_UPDATE; discord.py
        then drops it from its cache and it is left out of GUILD_CREATE."""
        self._set_archived(thread_id, archived=True)

    def reopen_thread(self, thread_id: int) -> None:
        """Unarchive a thread: THREAD_UPDATE with ``archived`` false."""
        self._set_archived(thread_id, archived=False)

    # --- what the gateway does ---

    async def wait_ready(self, n: int = 1, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until READY was sent ``n`` times in all."""
        await self.wait_until(lambda: self.identifies >= n, timeout, f"READY #{n}")
        await self._wait_drained()

    async def reconnect(self) -> None:
        """Send op 7 RECONNECT on the live socket after what was queued; the client closes it
        and RESUMEs on a new connection. Dispatches made from now on wait for that."""
        sock = await self._drained_live_socket()
        self._retire(sock)
        await self._send(sock, {"op": RECONNECT, "d": None, "s": None, "t": None})

    async def drop_gateway(self, *, abort: bool = True) -> None:
        """Close the live socket abruptly after what was queued: by default the TCP connection
        is cut with no close frame; with ``abort=False`` a close frame 1001. Either way the
        client RESUMEs."""
        sock = await self._drained_live_socket()
        self._retire(sock)
        if abort:
            if sock.request.transport is not None:
                sock.request.transport.abort()
            return
        await sock.ws.close(code=WSCloseCode.GOING_AWAY, message=b"dropped")

    async def invalid_session(self, resumable: bool = False) -> None:
        """Send op 9 INVALID_SESSION. Not resumable: the session is gone (with its undelivered
        dispatches) and the client IDENTIFYs again; resumable: it reconnects and RESUMEs."""
        sock = await self._drained_live_socket()
        self._retire(sock)
        if not resumable:
            self._session = None
        await self._send(sock, {"op": INVALID_SESSION, "d": resumable, "s": None, "t": None})

    @property
    def session_id(self) -> str | None:
        return None if self._session is None else self._session.id

    @property
    def sequence(self) -> int:
        return 0 if self._session is None else len(self._session.events)

    @property
    def dispatched(self) -> list[_Json]:
        """Every dispatch frame of the current session, in sequence order."""
        return [] if self._session is None else list(self._session.events)

    @property
    def open_sockets(self) -> int:
        return sum(1 for s in self._sockets if not s.closed)

    @property
    def live(self) -> bool:
        """A socket is identified or resumed and gets dispatches."""
        return self._live is not None

    # --- what the bot did ---

    def messages(self, channel_id: int) -> list[Sent]:
        """The bot's messages in a channel, oldest first, as they stand now."""
        return [s for s in self._sent.values() if s.channel_id == channel_id]

    def all_messages(self) -> list[Sent]:
        return list(self._sent.values())

    def stored(self, channel_id: int) -> list[_Json]:
        """Every message in a channel (people's and the bot's), oldest first."""
        return list(self._stored.get(channel_id, {}).values())

    def dm_channel(self, user_id: int) -> int | None:
        return self._dm_channels.get(user_id)

    def calls_to(self, method: str, path_prefix: str = "") -> list[Call]:
        return [c for c in self.calls if c.method == method and c.path.startswith(path_prefix)]

    async def wait_until(
        self,
        condition: Callable[[], object],
        timeout: float | None = None,  # noqa: ASYNC109  (None: `patience.deadline`)
        what: str | None = None,
    ) -> None:
        """Return once ``condition()`` is true, re-checking on every call, frame, dispatch and
        connection. Raises ``AssertionError`` naming ``what`` (else the condition) on timeout."""
        await self._changes.until(condition, timeout, what, self._state)

    def _state(self) -> str:
        calls = [f"{c.method} {c.path} {c.status}" for c in self.calls[-8:]]
        return (
            f"last calls: {calls}; identifies: {self.identifies}; resumes: {self.resumes}; "
            f"live: {self.live}; seq: {self.sequence}"
        )

    # --- scripted failures ---

    def fail_next(
        self,
        method: str,
        path_prefix: str,
        *,
        status: int = 429,
        retry_after: float = 0.2,
        times: int = 1,
        via: bool = True,
        scope: str = "user",
    ) -> None:
        """Refuse the next ``times`` requests ``method path_prefix...``: 429 is Discord's rate
        limit (JSON ``retry_after``; with ``Via``, which discord.py sleeps out and retries up to
        five times, or without, which it raises at once; ``scope`` "user", "shared" or
        "global"); any other status answers ``{"message", "code": 0}``. Use a 4xx for fast
        error tests: discord.py retries 500/502/504 with sleeps of 1, 3, 5... seconds. A path
        under ``/attachments/`` scripts the CDN's answers to attachment downloads."""
        if times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        failures = self._failures.setdefault((method.upper(), path_prefix), deque())
        failures.extend([_Failure(status, retry_after, via, scope)] * times)

    def expire_attachment_links(self) -> None:
        """As a day later: every attachment link handed out so far answers 404 "This content
        is no longer available." (links in messages made from now on work)."""
        self._cdn_skew += CDN_LINK_SECONDS + 1

    def answer_without(self, method: str, path_prefix: str, key: str) -> None:
        """From now on answer ``method path_prefix...`` as usual (it takes effect) but leave
        ``key`` out of the JSON answer."""
        self._without[(method.upper(), path_prefix)] = key

    def hang_up_after(self, method: str, path_prefix: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method path_prefix...`` take effect, and their
        connection is cut before the answer (`holds.hang_up`)."""
        self._hang_ups[(method.upper(), path_prefix)] += times

    # --- REST ---

    async def _api(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        arrived = self.rate_limits.clock()
        body = await self._read_body(request)
        header = request.headers.get("Authorization", "")
        token = header[4:] if header.startswith("Bot ") else header or None
        status = 200
        bucket: _Bucket | None = None
        try:
            if request.match_info["version"] != str(API_VERSION):
                raise _ApiError(404, "404: Not Found")
            # interaction callbacks and webhooks are authorised by the token in the path
            webhook = path.startswith(("/interactions/", "/webhooks/"))
            if token != self.token and not webhook:
                raise _ApiError(401, "401: Unauthorized")
            failure = self._take_failure(request.method, path)
            if failure is not None:
                status = failure.status
                return self._failure_response(failure)
            route, handler, params = self._route(request.method, path)
            bucket = _bucket_of(route, params)
            refusal = self.rate_limits.admit(route, self._windows(bucket, webhook), arrived)
            if refusal is not None:
                status = 429
                return self._refused(refusal, bucket)
            if "query" in inspect.signature(handler).parameters:
                params["query"] = dict(request.query)
            async with self.holds.answering(request, route, params):
                result = await handler(body, **params)
            if self._hung_up(request.method, path):
                return hang_up(request)
            result = self._answered_without(request.method, path, result)
            if result is None:
                status = 204
                return self._bucketed(web.Response(status=204), bucket)
            return self._bucketed(_json_response(result), bucket)
        except _ApiError as error:
            status = error.status
            return self._bucketed(_json_response(error.body, status=error.status), bucket)
        finally:
            call = Call(request.method, path, body, dict(request.query), time.time(), status, token)
            self.calls.append(call)
            self._notify()

    async def _read_body(self, request: web.Request) -> Any:
        if not request.can_read_body:
            return None
        if request.content_type == "application/json":
            try:
                return await request.json()
            except ValueError:
                return await request.text()
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload = form.get("payload_json")
            body: _Json = json.loads(payload) if isinstance(payload, str) else {}
            files = [name for name, v in form.items() if not isinstance(v, str)]
            return {**body, "_files": files}
        return await request.text()

    def _hung_up(self, method: str, path: str) -> bool:
        """Whether this call's answer is to be cut off (`hang_up_after`), counted once."""
        for (m, prefix), left in self._hang_ups.items():
            if m == method and path.startswith(prefix) and left > 0:
                self._hang_ups[(m, prefix)] -= 1
                return True
        return False

    def _take_failure(self, method: str, path: str) -> _Failure | None:
        for (m, prefix), failures in self._failures.items():
            if m == method and path.startswith(prefix) and failures:
                return failures.popleft()
        return None

    def _answered_without(self, method: str, path: str, result: Any) -> Any:
        for (m, prefix), left_out in self._without.items():
            if m == method and path.startswith(prefix) and isinstance(result, dict):
                return {k: v for k, v in result.items() if k != left_out}
        return result

    def _failure_response(self, failure: _Failure) -> web.Response:
        if failure.status == 429:
            return self._rate_limited(failure)
        messages = {
            400: "400: Bad Request",
            401: "401: Unauthorized",
            403: "Missing Access",
            404: "404: Not Found",
        }
        message = messages.get(failure.status, f"{failure.status}: Error")
        return _json_response({"message": message, "code": 0}, status=failure.status)

    @staticmethod
    def _rate_limited(failure: _Failure) -> web.Response:
        """A scripted 429 (`fail_next`), as if a bucket of 5 were spent."""
        wait = failure.retry_after
        bucket = _bucket_headers(5, 0, wait, "fake-bucket")
        return _too_many(wait, failure.scope, failure.via, bucket)

    @staticmethod
    def _windows(bucket: _Bucket | None, webhook: bool) -> list[Window]:
        """What a request counts against: the global limit (not with a webhook's own token)
        and its route's bucket."""
        windows = [] if webhook else [GLOBAL_WINDOW]
        return windows if bucket is None else [*windows, bucket.window]

    def _refused(self, refusal: Refusal, bucket: _Bucket | None) -> web.Response:
        wait = _millis_up(refusal.retry_after)
        if refusal.window.key == GLOBAL_WINDOW.key or bucket is None:
            return _too_many(wait, "global", True, {})
        return _too_many(
            wait, "user", True, _bucket_headers(bucket.window.calls, 0, wait, bucket.hash)
        )

    def _bucketed(self, response: web.Response, bucket: _Bucket | None) -> web.Response:
        """`response` with its bucket's headers, as Discord answers a bucketed route."""
        if bucket is not None and self.rate_limits.enabled:
            remaining, reset_after = self.rate_limits.state(bucket.window)
            limit = bucket.window.calls
            response.headers.update(_bucket_headers(limit, remaining, reset_after, bucket.hash))
        return response

    def _route(self, method: str, path: str) -> tuple[str, Callable[..., Awaitable[Any]], _Json]:
        """The route's name ("POST /channels/{channel}/typing"), its handler and parameters."""
        parts = path.rstrip("/").split("/")
        for m, pattern, handler in self._routes:
            want = pattern.split("/")
            if m != method or len(want) != len(parts):
                continue
            params: _Json = {}
            for w, p in zip(want, parts, strict=True):
                if w.startswith("{"):
                    params[w[1:-1]] = p
                elif w != p:
                    break
            else:
                return f"{m} {pattern}", handler, params
        raise _ApiError(404, "404: Not Found")

    async def _get_me(self, body: Any) -> _Json:
        return {
            **user_object(BOT_USER_ID, bot=True),
            "verified": True,
            "mfa_enabled": False,
            "email": None,
        }

    async def _get_application(self, body: Any) -> _Json:
        return {
            "id": str(APPLICATION_ID),
            "name": BOT_NAME,
            "icon": None,
            "description": "",
            "summary": "",
            "type": None,
            "bot_public": False,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "flags": self._application_flags(),
            "owner": user_object(OWNER_ID, "owner"),
            "team": None,
            "bot": user_object(BOT_USER_ID, bot=True),
            "interactions_endpoint_url": None,
            "approximate_guild_count": 1,
        }

    def _application_flags(self) -> int:
        # GATEWAY_MESSAGE_CONTENT_LIMITED (1 << 19): the portal switch for an unverified bot
        return 1 << 19 if self.message_content_intent_enabled else 0

    async def _open_dm(self, body: Any) -> _Json:
        recipient = int(self._field(body, "recipient_id"))
        return self._dm_channel_object(self._dm_channel(recipient))

    async def _get_channel(self, body: Any, channel: str) -> _Json:
        channel_id = int(channel)
        if channel_id in self._channels:
            return self._channels[channel_id]
        for user_id, dm_id in self._dm_channels.items():
            if dm_id == channel_id:
                return self._dm_channel_object(dm_id, user_id)
        raise _ApiError(404, "Unknown Channel", 10003)

    def _known_channel(self, channel: str) -> int:
        channel_id = int(channel)
        if channel_id not in self._channels and channel_id not in self._dm_channels.values():
            raise _ApiError(404, "Unknown Channel", 10003)
        return channel_id

    async def _create_message(self, body: Any, channel: str) -> _Json:
        return self._bot_message(self._known_channel(channel), body)

    def _bot_message(
        self,
        channel_id: int,
        body: Any,
        *,
        interaction: _Json | None = None,
        loading: bool = False,
    ) -> _Json:
        """Store a message the bot sent (REST, interaction response or followup) and echo it;
        like a person's, it reopens an archived thread first."""
        body = body if isinstance(body, dict) else {}
        content = str(body.get("content") or "")
        components = list(body.get("components") or [])
        embeds = list(body.get("embeds") or [])
        flags = int(body.get("flags") or 0)
        self._check_content(content)
        has_body = content or components or embeds or body.get("_files") or body.get("sticker_ids")
        if not (has_body or loading):
            raise _ApiError(400, "Cannot send an empty message", 50006)
        reference = body.get("message_reference") or None
        nonce = str(body.get("nonce")) if body.get("enforce_nonce") else None
        if nonce is not None and (channel_id, nonce) in self._nonces:  # a post sent again
            return self._stored[channel_id][self._nonces[(channel_id, nonce)]]
        message = self._message(
            channel_id,
            content,
            user_object(BOT_USER_ID, bot=True),
            components=components,
            embeds=embeds,
            guild=channel_id in self._channels,
        )
        message["flags"] = flags | (128 if loading else 0)  # 64 EPHEMERAL, 128 LOADING
        ref_id: int | None = None
        if reference and reference.get("message_id"):
            ref_id = int(reference["message_id"])
            message["type"] = 19  # REPLY
            message["message_reference"] = {
                "message_id": str(ref_id),
                "channel_id": str(channel_id),
                **({"guild_id": str(GUILD_ID)} if channel_id in self._channels else {}),
            }
            message["referenced_message"] = self._stored.get(channel_id, {}).get(ref_id)
        if interaction is not None:
            message["type"] = 20 if interaction["type"] == 2 else 0  # CHAT_INPUT_COMMAND
            message["application_id"] = str(APPLICATION_ID)
            message["webhook_id"] = str(APPLICATION_ID)
            message["interaction_metadata"] = {
                "id": interaction["id"],
                "type": interaction["type"],
                "user": interaction.get("member", {}).get("user") or interaction.get("user"),
                "authorizing_integration_owners": interaction["authorizing_integration_owners"],
            }
        if "nonce" in body:
            message["nonce"] = body["nonce"]
        if nonce is not None:
            self._nonces[(channel_id, nonce)] = int(message["id"])
        ephemeral = bool(flags & 64)
        self._reopen_if_archived(channel_id)
        self._store(message)
        self._sent[int(message["id"])] = Sent(
            int(message["id"]),
            channel_id,
            content,
            components,
            embeds,
            [],
            ref_id,
            ephemeral,
            None if interaction is None else int(interaction["id"]),
        )
        if self.echo_bot_messages and not ephemeral:
            self._dispatch("MESSAGE_CREATE", message)
        return message

    async def _get_message(self, body: Any, channel: str, message: str) -> _Json:
        stored = self._stored.get(int(channel), {}).get(int(message))
        if stored is None:
            raise _ApiError(404, "Unknown Message", 10008)
        return stored

    async def _edit_message(self, body: Any, channel: str, message: str) -> _Json:
        return self._apply_edit(int(channel), int(message), body)

    def _apply_edit(self, channel_id: int, message_id: int, body: Any) -> _Json:
        """Edit a bot message in place, record the edit and echo MESSAGE_UPDATE."""
        stored = self._stored.get(channel_id, {}).get(message_id)
        if stored is None:
            raise _ApiError(404, "Unknown Message", 10008)
        if int(stored["author"]["id"]) != BOT_USER_ID:
            raise _ApiError(403, "Cannot edit a message authored by another user", 50005)
        body = body if isinstance(body, dict) else {}
        if "content" in body:
            self._check_content(str(body["content"] or ""))
            stored["content"] = str(body["content"] or "")
        if "components" in body:
            stored["components"] = list(body["components"] or [])
        if "embeds" in body:
            stored["embeds"] = list(body["embeds"] or [])
        stored["flags"] = int(stored.get("flags", 0)) & ~128  # no longer loading
        stored["edited_timestamp"] = _iso(datetime.now(UTC))
        sent = self._sent[message_id]
        edits = [*sent.edits, stored["content"]] if "content" in body else sent.edits
        self._sent[message_id] = replace(
            sent,
            content=stored["content"],
            components=stored["components"],
            embeds=stored["embeds"],
            edits=edits,
        )
        if self.echo_bot_messages and not sent.ephemeral:
            self._dispatch("MESSAGE_UPDATE", dict(stored))
        return dict(stored)

    async def _delete_message(self, body: Any, channel: str, message: str) -> None:
        """Delete a bot message: it leaves the channel (and `messages`), MESSAGE_DELETE echoes."""
        channel_id, message_id = int(channel), int(message)
        stored = self._stored.get(channel_id, {}).get(message_id)
        if stored is None:
            raise _ApiError(404, "Unknown Message", 10008)
        if int(stored["author"]["id"]) != BOT_USER_ID:
            raise _ApiError(403, "Missing Permissions", 50013)
        del self._stored[channel_id][message_id]
        sent = self._sent.pop(message_id)
        self.deleted.append(message_id)
        if self.echo_bot_messages and not sent.ephemeral:
            self._dispatch("MESSAGE_DELETE", {"id": message, "channel_id": channel})
        return None

    async def _typing(self, body: Any, channel: str) -> None:
        self._known_channel(channel)
        return None

    async def _start_thread(self, body: Any, channel: str, message: str) -> _Json:
        channel_id, message_id = int(channel), int(message)
        parent = self._channels.get(channel_id)
        if parent is None or parent["type"] != GUILD_TEXT:
            raise _ApiError(400, "Cannot execute action on this channel type", 50024)
        starter = self._stored.get(channel_id, {}).get(message_id)
        if starter is None:
            raise _ApiError(404, "Unknown Message", 10008)
        if message_id in self.threads:
            raise _ApiError(400, "A thread has already been created for this message", 160004)
        body = body if isinstance(body, dict) else {}
        name = str(self._field(body, "name"))
        if not 1 <= len(name) <= 100:
            raise _ApiError(400, "Invalid Form Body", 50035)
        # a thread from a message takes the message's id
        thread = self._thread(
            message_id,
            channel_id,
            name,
            BOT_USER_ID,
            auto_archive_duration=int(body.get("auto_archive_duration") or 1440),
            rate_limit_per_user=int(body.get("rate_limit_per_user") or 0),
        )
        thread["member"] = self._bot_thread_member(message_id)
        self._channels[message_id] = thread
        self.threads[message_id] = {
            "parent_id": channel_id,
            "name": name,
            "starter_message_id": message_id,
            "starter": starter,
            "channel": thread,
        }
        starter["thread"] = thread
        self._dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return thread

    async def _join_thread(self, body: Any, channel: str) -> None:
        thread = self._channels.get(self._known_channel(channel))
        if thread is None or thread["type"] != PUBLIC_THREAD:
            raise _ApiError(400, "Cannot execute action on this channel type", 50024)
        if thread["thread_metadata"]["archived"]:
            raise _ApiError(400, "Thread is archived", 50083)
        if "member" in thread:  # already joined: nothing changes
            return None
        thread["member"] = self._bot_thread_member(int(thread["id"]))
        thread["member_count"] += 1
        members_update = {
            "id": thread["id"],
            "guild_id": str(GUILD_ID),
            "member_count": thread["member_count"],
            "added_members": [thread["member"]],
        }
        self._dispatch("THREAD_MEMBERS_UPDATE", members_update)
        return None

    async def _put_commands(self, body: Any, app: str) -> list[_Json]:
        self._check_app(app)
        self.commands = self._with_ids(body, None)
        return self.commands

    async def _get_commands(self, body: Any, app: str) -> list[_Json]:
        self._check_app(app)
        return self.commands

    async def _put_guild_commands(self, body: Any, app: str, guild: str) -> list[_Json]:
        self._check_app(app)
        self.guild_commands[int(guild)] = self._with_ids(body, int(guild))
        return self.guild_commands[int(guild)]

    async def _interaction_callback(
        self, body: Any, interaction: str, token: str, query: dict[str, str]
    ) -> _Json | None:
        state = self._interactions.get(token)
        if state is None or state["id"] != interaction:
            raise _ApiError(404, "Unknown interaction", 10062)
        if state["responded"] is not None:
            raise _ApiError(400, "Interaction has already been acknowledged.", 40060)
        body = body if isinstance(body, dict) else {}
        kind = int(body.get("type") or 0)
        data = body.get("data") or {}
        channel_id = int(state["payload"]["channel_id"])
        message: _Json | None = None
        if kind == 4:  # CHANNEL_MESSAGE_WITH_SOURCE
            message = self._bot_message(channel_id, data, interaction=state["payload"])
            state["original"] = int(message["id"])
        elif kind == 5:  # DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE: "thinking..."
            message = self._bot_message(
                channel_id, data, interaction=state["payload"], loading=True
            )
            state["original"] = int(message["id"])
        elif kind == 7:  # UPDATE_MESSAGE: edit the message the component is on
            if state["message_id"] is None:
                raise _ApiError(400, "Interaction has no message to update", 50035)
            message = self._apply_edit(channel_id, state["message_id"], data)
        elif kind not in (1, 6, 8, 9, 10, 12):
            raise _ApiError(400, "Invalid Form Body", 50035)
        state["responded"] = kind
        self.interaction_callbacks.append(
            {"interaction_id": int(interaction), "token": token, "type": kind, "data": data}
        )
        if "with_response" not in query:
            return None
        flags = int(data.get("flags") or 0) if isinstance(data, dict) else 0
        response: _Json = {
            "interaction": {
                "id": interaction,
                "type": state["payload"]["type"],
                "response_message_id": None if message is None else message["id"],
                "response_message_loading": kind == 5,
                "response_message_ephemeral": bool(flags & 64),
            }
        }
        if message is not None:
            response["resource"] = {"type": kind, "message": message}
        return response

    def _interaction_state(self, app: str, token: str) -> _Json:
        self._check_app(app)
        state = self._interactions.get(token)
        if state is None:
            raise _ApiError(401, "Invalid Webhook Token", 50027)
        return state

    def _webhook_target(self, state: _Json, message: str) -> int:
        if message != "@original":
            return int(message)
        original = state["original"] or state["message_id"]
        if original is None:
            raise _ApiError(404, "Unknown Message", 10008)
        return int(original)

    async def _followup(self, body: Any, app: str, token: str) -> _Json:
        state = self._interaction_state(app, token)
        if state["responded"] is None:
            raise _ApiError(404, "Unknown Webhook", 10015)
        channel_id = int(state["payload"]["channel_id"])
        message = self._bot_message(channel_id, body, interaction=state["payload"])
        state["followups"].append(int(message["id"]))
        return message

    async def _get_webhook_message(self, body: Any, app: str, token: str, message: str) -> _Json:
        state = self._interaction_state(app, token)
        channel_id = int(state["payload"]["channel_id"])
        return await self._get_message(
            None, str(channel_id), str(self._webhook_target(state, message))
        )

    async def _edit_webhook_message(self, body: Any, app: str, token: str, message: str) -> _Json:
        state = self._interaction_state(app, token)
        channel_id = int(state["payload"]["channel_id"])
        return self._apply_edit(channel_id, self._webhook_target(state, message), body)

    def _check_app(self, app: str) -> None:
        if app != str(APPLICATION_ID):
            raise _ApiError(403, "Missing Access", 50001)

    def _with_ids(self, body: Any, guild_id: int | None) -> list[_Json]:
        if not isinstance(body, list):
            raise _ApiError(400, "Invalid Form Body", 50035)
        commands = []
        for command in body:
            stored = {
                "id": str(self._snowflake()),
                "application_id": str(APPLICATION_ID),
                "version": str(self._snowflake()),
                "type": 1,
                "description": "",
                "default_member_permissions": None,
                "dm_permission": True,
                "nsfw": False,
                **command,
            }
            if guild_id is not None:
                stored["guild_id"] = str(guild_id)
            commands.append(stored)
        return commands

    @staticmethod
    def _field(body: Any, name: str) -> Any:
        if not isinstance(body, dict) or body.get(name) in (None, ""):
            raise _ApiError(
                400,
                "Invalid Form Body",
                50035,
                {"errors": {name: {"_errors": [{"code": "BASE_TYPE_REQUIRED"}]}}},
            )
        return body[name]

    @staticmethod
    def _check_content(content: str) -> None:
        if len(content) > MAX_CONTENT_CHARS:
            error = {
                "code": "BASE_TYPE_MAX_LENGTH",
                "message": f"Must be {MAX_CONTENT_CHARS} or fewer in length.",
            }
            raise _ApiError(
                400, "Invalid Form Body", 50035, {"errors": {"content": {"_errors": [error]}}}
            )

    # --- the world ---

    def _snowflake(self) -> int:
        ms = int(time.time() * 1000) - _EPOCH_MS
        return (ms << 22) | (next(self._ids) & 0x3FFFFF)

    def _text_channel(self, channel_id: int, name: str, position: int) -> _Json:
        return {
            "id": str(channel_id),
            "type": GUILD_TEXT,
            "guild_id": str(GUILD_ID),
            "name": name,
            "position": position,
            "permission_overwrites": [],
            "topic": None,
            "nsfw": False,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "parent_id": None,
            "flags": 0,
        }

    def _thread(
        self,
        thread_id: int,
        parent_id: int,
        name: str,
        owner_id: int,
        *,
        auto_archive_duration: int = 1440,
        rate_limit_per_user: int = 0,
    ) -> _Json:
        """An active public thread with its owner as its only member (no ``member`` field: the
        bot is not one)."""
        now = _iso(datetime.now(UTC))
        return {
            "id": str(thread_id),
            "type": PUBLIC_THREAD,
            "guild_id": str(GUILD_ID),
            "parent_id": str(parent_id),
            "owner_id": str(owner_id),
            "name": name,
            "last_message_id": None,
            "rate_limit_per_user": rate_limit_per_user,
            "message_count": 0,
            "member_count": 1,
            "total_message_sent": 0,
            "flags": 0,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": auto_archive_duration,
                "archive_timestamp": now,
                "locked": False,
                "create_timestamp": now,
            },
        }

    @staticmethod
    def _bot_thread_member(thread_id: int) -> _Json:
        return {
            "id": str(thread_id),
            "user_id": str(BOT_USER_ID),
            "join_timestamp": _iso(datetime.now(UTC)),
            "flags": 1,
        }

    def _set_archived(self, thread_id: int, *, archived: bool) -> None:
        thread = self._channels.get(thread_id)
        if thread is None or thread["type"] != PUBLIC_THREAD:
            raise KeyError(f"no thread {thread_id}")
        thread["thread_metadata"]["archived"] = archived
        thread["thread_metadata"]["archive_timestamp"] = _iso(datetime.now(UTC))
        self._dispatch("THREAD_UPDATE", thread)

    def _reopen_if_archived(self, channel_id: int) -> None:
        channel = self._channels.get(channel_id)
        if channel is not None and channel.get("thread_metadata", {}).get("archived"):
            self._set_archived(channel_id, archived=False)

    @staticmethod
    def _role(role_id: int, name: str, position: int, permissions: int) -> _Json:
        return {
            "id": str(role_id),
            "name": name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": position,
            "permissions": str(permissions),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }

    def _bot_role(self) -> _Json:
        """The managed role named after the bot, tagged with its id (`Guild.self_role`)."""
        role = self._role(BOT_ROLE_ID, BOT_NAME, 1, 0)
        return {**role, "managed": True, "tags": {"bot_id": str(BOT_USER_ID)}}

    def _member(self, roles: list[int] | None = None) -> _Json:
        """A guild member object without its ``user``, as a message's ``member`` is."""
        unknown = [r for r in roles or [] if r not in self._roles]
        if unknown:
            raise KeyError(f"no roles {unknown} (add_role makes them)")
        return {
            "roles": [str(r) for r in roles or []],
            "joined_at": _iso(self._guild_created),
            "deaf": False,
            "mute": False,
            "flags": 0,
            "nick": None,
            "avatar": None,
            "premium_since": None,
            "pending": False,
        }

    def _attach(self, message: _Json, files: Sequence[Attached]) -> None:
        """Give ``message`` the attachment objects of ``files``, their bytes served at ``url``
        (and ``proxy_url``) by ``_cdn``; a voice message flags the message."""
        uploads = [file if isinstance(file, Upload) else Upload(*file) for file in files]
        channel_id = int(message["channel_id"])
        message["attachments"] = [self._attachment(channel_id, upload) for upload in uploads]
        if any(upload.voice for upload in uploads):
            message["flags"] |= VOICE_MESSAGE_FLAG

    def _attachment(self, channel_id: int, upload: Upload) -> _Json:
        attachment_id = self._snowflake()
        self._files[(channel_id, attachment_id)] = upload
        url = self._signed_link(channel_id, attachment_id, upload.filename)
        attachment: _Json = {
            "id": str(attachment_id),
            "filename": upload.filename,
            "size": len(upload.data) if upload.size is None else upload.size,
            "url": url,
            "proxy_url": url,
            "flags": 0,
        }
        if upload.content_type is not None:
            attachment["content_type"] = upload.content_type
            if upload.content_type.startswith("image/"):
                attachment["width"], attachment["height"] = _image_size(upload.data)
        if upload.voice:
            attachment["duration_secs"] = upload.seconds
            attachment["waveform"] = _waveform(upload.data)
        return attachment

    def _signed_link(self, channel_id: int, attachment_id: int, filename: str) -> str:
        """The CDN's link: ``ex`` (expiry) and ``is`` (issued) in hex seconds, ``hm`` their
        signature, as Discord's CDN signs attachment URLs."""
        issued = int(time.time() + self._cdn_skew)
        validity = f"ex={issued + CDN_LINK_SECONDS:08x}&is={issued:08x}"
        signature = self._cdn_signature(f"{channel_id}/{attachment_id}/{filename}", validity)
        path = f"/attachments/{channel_id}/{attachment_id}/{quote(filename)}"
        return f"{self.url}{path}?{validity}&hm={signature}&"

    def _cdn_signature(self, where: str, validity: str) -> str:
        message = f"{where}?{validity}".encode()
        return hmac.new(self._cdn_key, message, hashlib.sha256).hexdigest()

    async def _cdn(self, request: web.Request) -> web.Response:
        """An attachment's bytes, as Discord's CDN serves them (no token asked for)."""
        header = request.headers.get("Authorization")
        response = self._cdn_answer(request)
        call = Call("GET", request.path, None, dict(request.query), time.time(), response.status)
        self.calls.append(replace(call, token=header))
        self._notify()
        return response

    def _cdn_answer(self, request: web.Request) -> web.Response:
        failure = self._take_failure("GET", request.path)
        if failure is not None:
            return self._failure_response(failure)
        info = request.match_info
        channel_id, attachment_id = int(info["channel"]), int(info["attachment"])
        upload = self._files.get((channel_id, attachment_id))
        if upload is None or upload.filename != info["filename"]:
            return web.Response(status=404, text="404: Not Found")
        if not self._valid_link(f"{channel_id}/{attachment_id}/{upload.filename}", request.query):
            return web.Response(status=404, text=LINK_GONE)
        content_type = upload.content_type or "application/octet-stream"
        return web.Response(body=upload.data, headers={"Content-Type": content_type})

    def _valid_link(self, where: str, query: Any) -> bool:
        """Whether the link's signature is the CDN's and its expiry still ahead."""
        expires, issued = query.get("ex", ""), query.get("is", "")
        validity = f"ex={expires}&is={issued}"
        signed = hmac.compare_digest(query.get("hm", ""), self._cdn_signature(where, validity))
        try:
            return signed and int(expires, 16) > time.time() + self._cdn_skew
        except ValueError:
            return False

    def _dm_channel(self, user_id: int) -> int:
        if user_id not in self._dm_channels:
            self._dm_channels[user_id] = self._snowflake()
        return self._dm_channels[user_id]

    def _dm_channel_object(self, channel_id: int, user_id: int | None = None) -> _Json:
        if user_id is None:
            user_id = next(u for u, c in self._dm_channels.items() if c == channel_id)
        return {
            "id": str(channel_id),
            "type": DM,
            "last_message_id": None,
            "flags": 0,
            "recipients": [user_object(user_id)],
        }

    def _members(self) -> list[_Json]:
        return [
            {"user": user_object(uid, bot=uid == BOT_USER_ID), **self._member()}
            for uid in (BOT_USER_ID, USER_ID, OWNER_ID)
        ]

    def _guild(self) -> _Json:
        joined = _iso(self._guild_created)
        everyone = self._role(GUILD_ID, "@everyone", 0, EVERYONE_PERMISSIONS)
        members = self._members()
        channels = [c for c in self._channels.values() if c["type"] == GUILD_TEXT]
        threads = [  # only active threads, as on Discord
            c
            for c in self._channels.values()
            if c["type"] == PUBLIC_THREAD and not c["thread_metadata"]["archived"]
        ]
        return {
            "id": str(GUILD_ID),
            "name": GUILD_NAME,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "owner_id": str(OWNER_ID),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "roles": [everyone, *self._roles.values()],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "application_id": None,
            "system_channel_id": str(CHANNEL_ID),
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "vanity_url_code": None,
            "description": None,
            "banner": None,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "preferred_locale": "en-US",
            "public_updates_channel_id": None,
            "nsfw_level": 0,
            "premium_progress_bar_enabled": False,
            "joined_at": joined,
            "large": False,
            "unavailable": False,
            "member_count": len(members),
            "voice_states": [],
            # only the bot, as for a client without GUILD_MEMBERS; the rest come by op 8
            "members": [m for m in members if m["user"]["id"] == str(BOT_USER_ID)],
            "channels": channels,
            "threads": threads,
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    def _message(
        self,
        channel_id: int,
        content: str,
        author: _Json,
        *,
        message_id: int | None = None,
        mentions: list[_Json] | None = None,
        components: list[_Json] | None = None,
        embeds: list[_Json] | None = None,
        roles: list[int] | None = None,
        guild: bool = True,
    ) -> _Json:
        message: _Json = {
            "id": str(message_id or self._snowflake()),
            "type": 0,
            "channel_id": str(channel_id),
            "author": author,
            "content": content,
            "timestamp": _iso(datetime.now(UTC)),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions or [],
            "mention_roles": [],
            "attachments": [],
            "embeds": embeds or [],
            "components": components or [],
            "pinned": False,
            "flags": 0,
        }
        if guild:
            message["guild_id"] = str(GUILD_ID)
            message["member"] = self._member(roles)
        return message

    def _store(self, message: _Json) -> None:
        channel_id, message_id = int(message["channel_id"]), int(message["id"])
        self._stored.setdefault(channel_id, {})[message_id] = message
        if channel_id in self._channels:
            self._channels[channel_id]["last_message_id"] = str(message_id)
            if self._channels[channel_id]["type"] == PUBLIC_THREAD:
                self._channels[channel_id]["message_count"] += 1
                self._channels[channel_id]["total_message_sent"] += 1

    def _interaction(
        self,
        kind: int,
        data: _Json,
        channel_id: int,
        user_id: int,
        roles: list[int] | None,
        message: _Json | None = None,
    ) -> _Json:
        interaction_id = self._snowflake()
        token = f"fake-interaction-token-{interaction_id}"
        in_guild = channel_id in self._channels
        payload: _Json = {
            "id": str(interaction_id),
            "application_id": str(APPLICATION_ID),
            "type": kind,
            "data": data,
            "channel_id": str(channel_id),
            "token": token,
            "version": 1,
            "locale": "en-US",
            "entitlements": [],
            "attachment_size_limit": 10 * 1024 * 1024,
            "app_permissions": str((1 << 41) - 1),
        }
        if in_guild:
            payload["channel"] = self._channels[channel_id]
            payload["guild_id"] = str(GUILD_ID)
            payload["guild_locale"] = "en-US"
            payload["guild"] = {"id": str(GUILD_ID), "locale": "en-US", "features": []}
            payload["member"] = {
                "user": user_object(user_id),
                **self._member(roles),
                "permissions": str(EVERYONE_PERMISSIONS),
            }
            payload["authorizing_integration_owners"] = {"0": str(GUILD_ID)}
            payload["context"] = 0  # GUILD
        else:
            payload["channel"] = self._dm_channel_object(channel_id)
            payload["user"] = user_object(user_id)
            payload["authorizing_integration_owners"] = {"0": "0", "1": str(user_id)}
            payload["context"] = 1  # BOT_DM
        if message is not None:
            payload["message"] = message
        self._interactions[token] = {
            "id": str(interaction_id),
            "payload": payload,
            "message_id": None if message is None else int(message["id"]),
            "responded": None,
            "original": None,
            "followups": [],
        }
        self._dispatch("INTERACTION_CREATE", payload)
        return payload

    def _content_visible(self, session: _Session, message: _Json) -> bool:
        if self.message_content_intent_enabled and session.intents & MESSAGE_CONTENT_INTENT:
            return True
        if "guild_id" not in message:  # a DM
            return True
        if int(message["author"]["id"]) == BOT_USER_ID:
            return True
        return any(int(u["id"]) == BOT_USER_ID for u in message.get("mentions", []))

    def _as_seen(self, session: _Session, event: str, data: _Json) -> _Json:
        """The payload as this session may see it: message content stripped without the
        MESSAGE_CONTENT intent, as Discord does."""
        if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE") or "content" not in data:
            return data
        if self._content_visible(session, data):
            return data
        return {**data, "content": "", "embeds": [], "attachments": [], "components": []}

    # --- the gateway ---

    def _dispatch(self, event: str, data: _Json) -> None:
        if self._session is None:
            self._orphans.append((event, data))
        else:
            self._append(self._session, event, data)
        self._notify()

    def _append(self, session: _Session, event: str, data: _Json) -> None:
        seq = len(session.events) + 1
        payload = self._as_seen(session, event, json.loads(json.dumps(data)))
        session.events.append({"op": DISPATCH, "d": payload, "s": seq, "t": event})

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            return web.Response(status=503, text="shutting down")
        if self.gateway_refused:
            self.refused_connections += 1
            self._notify()
            return web.Response(status=503, text="unavailable")
        ws = web.WebSocketResponse(timeout=2.0, max_msg_size=0)
        await ws.prepare(request)
        sock = _Socket(len(self._sockets) + 1, ws, request, request.path_qs)
        self._sockets.append(sock)
        self.connections.append(request.path_qs)
        try:
            hello = {"heartbeat_interval": self.heartbeat_interval_ms, "_trace": ["fake-gateway"]}
            await self._send(sock, {"op": HELLO, "d": hello, "s": None, "t": None})
            self._notify()
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    await self._receive(sock, message.data)
        finally:
            sock.closed = True
            self._retire(sock)
        return ws

    async def _receive(self, sock: _Socket, data: str) -> None:
        try:
            frame = json.loads(data)
        except ValueError:
            await self._close_socket(sock, 4002, "Error while decoding payload.")
            return
        op, d = frame.get("op"), frame.get("d")
        self.frames.append(Frame(sock.number, op, d, time.time()))
        if op == HEARTBEAT:
            self.heartbeats += 1
            await self._send(sock, {"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
        elif op == IDENTIFY:
            await self._identify(sock, d or {})
        elif op == RESUME:
            await self._resume(sock, d or {})
        elif op == REQUEST_MEMBERS:
            self._members_chunk(sock, d or {})
        elif op not in (PRESENCE, VOICE_STATE):
            await self._close_socket(sock, 4001, "Unknown opcode.")
        self._notify()

    async def _identify(self, sock: _Socket, d: _Json) -> None:
        if sock.session is not None:
            await self._close_socket(sock, 4005, "Already authenticated.")
            return
        if d.get("token") != self.token:
            await self._close_socket(sock, 4004, "Authentication failed.")
            return
        intents = int(d.get("intents") or 0)
        if intents & MESSAGE_CONTENT_INTENT and not self.message_content_intent_enabled:
            await self._close_socket(sock, 4014, "Disallowed intent(s).")
            return
        self._sessions += 1
        session = _Session(f"{SESSION_PREFIX}{self._sessions}", intents)
        self._session = session
        self.identifies += 1
        ready = {
            "v": API_VERSION,
            "user": {**user_object(BOT_USER_ID, bot=True), "verified": True, "mfa_enabled": False},
            "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.resume_gateway_url,
            "shard": d.get("shard", [0, 1]),
            "application": {"id": str(APPLICATION_ID), "flags": self._application_flags()},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "user_settings": {},
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": ["fake"],
            "auth": {},
            "_trace": ["fake-gateway"],
        }
        self._append(session, "READY", ready)
        self._append(session, "GUILD_CREATE", self._guild())
        orphans, self._orphans = self._orphans, []
        for event, data in orphans:
            self._append(session, event, data)
        self._go_live(sock, session, 0)

    async def _resume(self, sock: _Socket, d: _Json) -> None:
        session = self._session
        if d.get("token") != self.token:
            await self._close_socket(sock, 4004, "Authentication failed.")
            return
        seq = d.get("seq")
        if (
            session is None
            or d.get("session_id") != session.id
            or not isinstance(seq, int)
            or not 0 <= seq <= len(session.events)
        ):
            await self._send(sock, {"op": INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        self.resumes += 1
        self._append(session, "RESUMED", {"_trace": ["fake-gateway"]})
        self._go_live(sock, session, seq)

    def _go_live(self, sock: _Socket, session: _Session, sent: int) -> None:
        sock.session = session
        sock.sent = sent
        for other in self._sockets:
            if other is not sock:
                other.retired = True
        if not sock.retired and not sock.closed:
            self._live = sock
        self._wake.set()
        self._notify()

    def _members_chunk(self, sock: _Socket, d: _Json) -> None:
        if sock.session is None:
            return
        members = self._members()
        if d.get("user_ids"):
            wanted = {str(u) for u in d["user_ids"]}
            members = [m for m in members if m["user"]["id"] in wanted]
        elif d.get("query"):
            members = [m for m in members if m["user"]["username"].startswith(d["query"])]
        chunk: _Json = {
            "guild_id": str(d.get("guild_id", GUILD_ID)),
            "members": members,
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [],
        }
        if d.get("nonce") is not None:
            chunk["nonce"] = d["nonce"]
        self._dispatch("GUILD_MEMBERS_CHUNK", chunk)

    async def _send(self, sock: _Socket, frame: _Json) -> None:
        """Write one frame; a socket that is already gone is retired instead."""
        try:
            async with sock.lock:
                await sock.ws.send_str(json.dumps(frame))
        except (ConnectionError, RuntimeError):
            self._retire(sock)

    async def _close_socket(self, sock: _Socket, code: int, reason: str) -> None:
        self._retire(sock)
        await sock.ws.close(code=code, message=reason.encode())

    def _retire(self, sock: _Socket) -> None:
        sock.retired = True
        if self._live is sock:
            self._live = None
        self._notify()

    async def _write_dispatches(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            sock = self._live
            if sock is None or sock.session is None:
                continue
            session = sock.session
            try:
                while self._live is sock and sock.sent < len(session.events):
                    frame = session.events[sock.sent]
                    async with sock.lock:
                        if self._live is not sock:
                            break
                        await sock.ws.send_str(json.dumps(frame))
                        sock.sent = frame["s"]
                    self._notify()
            except (ConnectionError, RuntimeError):
                self._retire(sock)

    async def _drained_live_socket(self) -> _Socket:
        if self._live is None:
            raise AssertionError("no gateway connection is identified or resumed")
        sock = self._live
        await self._wait_drained()
        if self._live is not sock:
            raise AssertionError("the gateway connection went away")
        return sock

    async def _wait_drained(self) -> None:
        def drained() -> bool:
            sock = self._live
            return sock is None or sock.session is None or sock.sent >= len(sock.session.events)

        await self.wait_until(drained, what="dispatches written")

    def _notify(self) -> None:
        self._wake.set()
        self._changes.notify()
