"""A fake Slack that speaks Slack's real wire protocols: the Web API, Socket Mode and HTTP Events.

Tests point the real slack_sdk ``AsyncWebClient`` (``base_url=fake.api_url``), slack_sdk's
aiohttp ``SocketModeClient`` and slack_bolt's ``AsyncApp`` + ``AsyncSocketModeHandler`` at this
server instead of mocking them, so what the libraries send, parse, retry and reconnect on is
exactly what production code sees. It is one ``aiohttp.web`` app on 127.0.0.1:

- ``/api/<method>``: the Web API. Parameters are read from the query string, a JSON body and a
  form body (slack_sdk uses all three: ``params=`` goes in the query, ``json=`` as JSON, ``data=``
  as a form), the token from ``Authorization: Bearer`` or a ``token`` parameter. Answers are
  Slack's: ``{"ok": true, ...}``, errors ``{"ok": false, "error": ...}`` with HTTP 200, and a rate
  limit is HTTP 429 with ``Retry-After`` (``fail_next``; a test may ask for fractions of a
  second, where Slack says whole ones), a server error an HTTP 5xx (``fail_next(status=500)``).
  Like the doubles in Slack's own test suites, it can refuse a method outright (``refuse``) or
  answer one without a field (``answer_without``: a ``chat.postMessage`` without its ``ts``),
  and it can cut a call's connection after it took effect or before (``hang_up_after``,
  ``hang_up_before``). ``holds`` keeps answers waiting on a condition and counts requests in
  flight and requests abandoned by the client. Messages can be read back as a bot reads them:
  ``conversations.replies`` (a thread, its parent first) and ``conversations.history`` (the top
  level, newest first), both within ``oldest``/``latest``; ``users.info`` describes members as
  Slack does (``person`` sets one's display name, real name and handle).
- ``/socket``: the Socket Mode websocket, whose URL ``apps.connections.open`` hands out for the
  app-level token. Each connection gets ``hello``; envelopes go to the newest connection, and
  envelopes made while none is connected wait for the next ``hello``, as on Slack. Acks are
  recorded; an envelope that was not acked can be sent again with ``redeliver``.
- HTTP Events mode: ``post_event`` signs a body with the signing secret and POSTs it to the
  bot's endpoint; setting ``events_url`` sends every envelope's payload there instead of over
  the socket, so the same test can drive either mode.

People are simulated with ``mention``/``message``/``dm``/``bot_message``/``slash_command``/
``press_button``, which make envelopes synchronously and return what a test needs next (a ``ts``
or envelope id); ``deliver`` sends any payload as given (Slack's documented samples); one writer
task puts them on the wire in order. A bot message may carry Block
Kit ``blocks``; as on Slack, a ``chat.update`` without ``blocks`` keeps the message's blocks and
``blocks=[]`` takes them away, and a button can be pressed only while its message shows it (an
``interactive`` envelope with a ``block_actions`` payload). ``chat.postEphemeral`` messages are
kept apart, in ``ephemeral``, as only their one person sees them. The bot's own messages come
back as ``message`` events (with ``bot_id``) and its edits as ``message_changed`` events, as on
Slack when the app subscribes to message events (``echo_bot_messages=False`` turns that off).
What the bot did is recorded as ``calls`` and as ``posted`` messages and ``reactions``;
``wait_until`` re-checks a condition on every call, envelope, ack and connection, so tests wait
on what happened instead of sleeping. ``close()`` closes the websockets before stopping the server.

Files: ``share`` is a person's message with files (``Upload``: bytes, name, media type, and for
an audio clip recorded in Slack ``audio_clip`` and ``duration_ms``), a ``file_share`` message
event whose ``files`` are Slack's file objects (``files_in`` reads them back). Their bytes are
served where the objects say, on Slack's paths (``/files-pri/<team>-<file id>/<name>`` and
``.../download/<name>``), to a request carrying ``Authorization: Bearer <bot token>`` while the
app has the files:read scope (``files_read_scope``). Any other request is answered as Slack
answers it: a redirect to the workspace's sign-in page, HTML with HTTP 200, never an error
status; a file never shared, or deleted (``delete_file``), is a 404. Each request is recorded in
``downloads``.

With ``limits=True`` it keeps Slack's published Web API limits (``tests.fakes.rate_limits``,
sliding windows; the fake is one workspace): ``chat.postMessage`` 3 in any 3 seconds in one
channel ("one a second", with the short bursts Slack allows), and per method for the workspace
``chat.update``, ``chat.delete`` and ``reactions.add`` at Tier 3 (50 in any minute) and
``reactions.remove`` at Tier 2 (20 in any minute). Other methods are not limited here (Slack's
hundreds of posts a minute per workspace, Tier 4 ``chat.postEphemeral`` and ``users.info``, and
the reads' tiers are beyond what a test's bot makes). A call past a limit is answered as Slack
does: HTTP 429, ``Retry-After: N`` (the whole seconds until its window has room, at least 1) and
``{"ok": false, "error": "ratelimited"}``. Each refusal is kept in ``refused_429``, and when each
counted call came in in ``rate_limits.admitted`` (on ``rate_limits.clock``, which a test may stop
and move by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from tests.fakes.changes import Changes
from tests.fakes.holds import Holds, hang_up
from tests.fakes.rate_limits import Limiter, Refusal, Window, whole_seconds

BOT_TOKEN = "xoxb-test"
APP_TOKEN = "xapp-test"
SIGNING_SECRET = "shh"
TEAM = "T1"
TEAM_NAME = "Test"
BOT_USER = "UBOT"
BOT_NAME = "kaiwa"
BOT_ID = "BBOT"
APP_ID = "A1"
VERIFICATION_TOKEN = "fake-verification-token"
MAX_TEXT_CHARS = 40_000  # longer text is refused with msg_too_long
RECOMMENDED_TEXT_CHARS = 4_000  # Slack's advice for message text; not enforced
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3_000
MAX_HEADER_TEXT = 150
SIGN_IN_PAGE = (
    "<!DOCTYPE html><html><head><title>Slack</title></head><body>"
    '<h1>Sign in to Test</h1><form action="/signin" method="post"></form></body></html>'
)
"""What Slack answers a file request it will not serve: its sign-in page, not an error."""
FILE_CHUNK = 64 * 1024
POSTS_CALLS, POSTS_SECONDS = 3, 3.0
TIER_SECONDS = 60.0
TIERED = {"chat.update": 50, "chat.delete": 50, "reactions.add": 50, "reactions.remove": 20}
"""Each limited method's calls a minute in a workspace (Tier 3: 50, Tier 2: 20)."""

_Json = dict[str, Any]


@dataclass(frozen=True)
class Upload:
    """A file a person attaches to a message: its bytes, name and media type (``mimetype``,
    which Slack leaves empty when it cannot tell: ``""``). ``audio_clip``: recorded in Slack
    (a file of ``subtype: "slack_audio"``, ``duration_ms`` long). ``declared_size`` is the
    ``size`` its file object claims (the content's length unless given), and ``chunked``
    serves it without a Content-Length, as a stream: together, a file that turns out larger
    than said."""

    content: bytes
    name: str
    mimetype: str
    audio_clip: bool = False
    duration_ms: int | None = None
    title: str = ""
    declared_size: int | None = None
    chunked: bool = False


@dataclass(frozen=True)
class FileDownload:
    """One request for a file's bytes: which file (``""`` for an unknown path), the token it
    carried (None without one), and the HTTP status answered (302 for the sign-in redirect)."""

    file_id: str
    path: str
    token: str | None
    status: int


@dataclass
class _SharedFile:
    upload: Upload
    object: _Json
    deleted: bool = False


@dataclass(frozen=True)
class Call:
    """One Web API request as received; ``error`` is the error code when it was refused."""

    method: str
    params: dict[str, Any]
    at: float
    error: str | None = None
    token: str | None = None
    status: int = 200


@dataclass(frozen=True)
class Posted:
    """A bot message as it stands now; ``fake.posted`` returns snapshots.

    ``text`` and ``blocks`` are as last set; ``updates`` holds the text of every successful
    ``chat.update``, in order.
    """

    channel: str
    ts: str
    text: str
    blocks: list[_Json] | None = None
    thread_ts: str | None = None
    updates: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Ephemeral:
    """A ``chat.postEphemeral``: a message only ``user`` sees, in a channel or a thread."""

    channel: str
    user: str
    text: str
    thread_ts: str | None = None


@dataclass(frozen=True)
class Ack:
    """An envelope acknowledgement received on the socket, with its payload if any."""

    envelope_id: str
    payload: _Json | None
    at: float


@dataclass(frozen=True)
class HttpDelivery:
    """One envelope payload POSTed to ``events_url``; ``status`` 0 when the POST failed."""

    envelope_id: str
    url: str
    retry_num: int
    status: int
    text: str


@dataclass(frozen=True)
class ResponseUrlPost:
    """A POST to a slash command's ``response_url`` (bolt's ``respond``)."""

    envelope_id: str
    body: _Json


@dataclass(frozen=True)
class _Failure:
    error: str
    retry_after: float
    status: int | None = None


@dataclass(eq=False)
class _Socket:
    number: int
    ws: web.WebSocketResponse
    request: web.Request
    retired: bool = False  # sent a disconnect or dropped: gets no more envelopes
    closed: bool = False


class _ApiError(Exception):
    def __init__(self, error: str, status: int = 200, retry_after: float | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.retry_after = retry_after

    def response(self) -> web.Response:
        headers = {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}
        if not self.error:  # a server in front of Slack's API, answering with its own page
            page = f"<html><body><h1>{self.status} Server Error</h1></body></html>"
            return web.Response(status=self.status, text=page, content_type="text/html")
        return web.json_response(
            {"ok": False, "error": self.error}, status=self.status, headers=headers
        )


def limit_windows(method: str, params: Mapping[str, Any]) -> list[Window]:
    """The windows a call counts against: its channel's posts, its method's tier, or none."""
    if method == "chat.postMessage":
        return [Window(f"{_text_param(params, 'channel')} posts", POSTS_CALLS, POSTS_SECONDS)]
    if method in TIERED:
        return [Window(method, TIERED[method], TIER_SECONDS)]
    return []


def signature(secret: str, timestamp: str, body: str) -> str:
    """Slack's request signature: ``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}``."""
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256)
    return "v0=" + digest.hexdigest()


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, micros = ts.partition(".")
    return int(seconds or 0), int((micros + "000000")[:6])


def _channel_name(channel: str) -> str:
    return "general" if channel.startswith("C") else "directmessage"


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")


def _is_a_message(event: Mapping[str, Any]) -> bool:
    """A message event that stands for a message (not an edit or deletion notice)."""
    return (
        event.get("type") == "message"
        and bool(event.get("channel"))
        and bool(event.get("ts"))
        and event.get("subtype") not in ("message_changed", "message_deleted")
    )


def _in_range(messages: list[_Json], params: Mapping[str, Any]) -> list[_Json]:
    """The messages within ``oldest`` and ``latest`` (either bound itself only if
    ``inclusive``), as ``conversations.history`` and ``conversations.replies`` read them."""
    inclusive = str(params.get("inclusive", "")).lower() in ("1", "true")
    oldest, latest = _text_param(params, "oldest"), _text_param(params, "latest")

    def within(ts: str) -> bool:
        key = _ts_key(ts)
        after = not oldest or key > _ts_key(oldest) or (inclusive and key == _ts_key(oldest))
        before = not latest or key < _ts_key(latest) or (inclusive and key == _ts_key(latest))
        return after and before

    return [m for m in messages if within(str(m["ts"]))]


def _limit(params: Mapping[str, Any]) -> int:
    try:
        return max(1, int(params.get("limit") or 100))
    except ValueError:
        raise _ApiError("invalid_limit") from None


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Query string, then the body: JSON or form-encoded (later sources win)."""
    params: dict[str, Any] = dict(request.query)
    if not request.can_read_body:
        return params
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError:
            raise _ApiError("invalid_json") from None
        if not isinstance(body, dict):
            raise _ApiError("invalid_json")
        params.update(body)
    else:
        form = await request.post()
        params.update({name: v for name, v in form.items() if isinstance(v, str)})
    return params


def _token(request: web.Request, params: dict[str, Any]) -> str | None:
    """The token from ``Authorization: Bearer``, else a ``token`` parameter (removed)."""
    token = params.pop("token", None)
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None if token is None else str(token)


def _text_param(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    return "" if value is None else str(value)


def _blocks(params: Mapping[str, Any]) -> list[_Json] | None:
    """``blocks`` as a list, decoding the JSON string a form or query carries; checks limits."""
    blocks = params.get("blocks")
    if blocks is None or blocks == "":
        return None
    if isinstance(blocks, str):
        try:
            blocks = json.loads(blocks)
        except ValueError:
            raise _ApiError("invalid_blocks_format") from None
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and b.get("type") for b in blocks
    ):
        raise _ApiError("invalid_blocks_format")
    if len(blocks) > MAX_BLOCKS:
        raise _ApiError("invalid_blocks")
    for block in blocks:
        text = block.get("text")
        text = text.get("text", "") if isinstance(text, dict) else ""
        limit = {"section": MAX_SECTION_TEXT, "header": MAX_HEADER_TEXT}.get(block["type"])
        if limit is not None and len(text) > limit:
            raise _ApiError("invalid_blocks")
    return blocks


class FakeSlack:
    """An aiohttp server on 127.0.0.1: Web API, Socket Mode websocket and a signed-event poster."""

    def __init__(
        self,
        *,
        bot_token: str = BOT_TOKEN,
        app_token: str = APP_TOKEN,
        signing_secret: str = SIGNING_SECRET,
        echo_bot_messages: bool = True,
        limits: bool = False,
    ) -> None:
        self.bot_token = bot_token
        self.rate_limits = Limiter(enabled=limits)
        """Slack's limits, kept only with ``limits`` (see the module's docstring)."""
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.echo_bot_messages = echo_bot_messages
        self.url = ""
        self.calls: list[Call] = []
        self.acks: list[Ack] = []
        self.acked: set[str] = set()
        self.http_deliveries: list[HttpDelivery] = []
        self.responses: list[ResponseUrlPost] = []
        self.ephemeral: list[Ephemeral] = []
        """Every ``chat.postEphemeral``, in order."""
        self.socket_messages: list[_Json] = []  # everything the client sent that was not an ack
        self._envelopes: list[_Json] = []
        self._latest: dict[str, _Json] = {}  # envelope id -> latest version sent
        self._outbox: deque[_Json] = deque()
        self._events_url: str | None = None
        self._sockets: list[_Socket] = []
        self._live: _Socket | None = None
        self._hellos = 0
        self._tickets: set[str] = set()
        self._messages: dict[str, dict[str, _Json]] = {}  # channel -> ts -> message as stored
        self._posted: dict[tuple[str, str], Posted] = {}
        self.deleted: list[str] = []
        """The ts of each bot message it deleted, in order."""
        self._reactions: dict[tuple[str, str], set[str]] = {}
        self._failures: dict[str, deque[_Failure]] = {}
        self._clock = int(time.time()) * 1_000_000
        self._event_ids = itertools.count(1)
        self._changes = Changes()  # notified on each call, envelope, ack and connection
        self.holds = Holds(self._changes)
        """Held answers, requests in flight and abandoned ones, by Web API method."""
        self._refused: dict[str, str] = {}  # method -> error, for every call
        self.sockets_refused = False
        """While true, every Socket Mode connection is refused (HTTP 503), counted in
        ``refused_sockets``: a Slack the bot cannot connect to, for now."""
        self.refused_sockets = 0
        self._without: dict[str, str] = {}  # method -> answer field left out
        self._people: dict[str, tuple[str, str, str]] = {}  # id -> name, display, real name
        self._hang_ups: Counter[str] = Counter()  # method -> calls whose answer never comes
        self._cut_short: Counter[str] = Counter()  # method -> calls cut before taking effect
        self._files: dict[str, _SharedFile] = {}  # file id -> what was shared
        self._file_ids = itertools.count(1)
        self.files_read_scope = True
        """The app has the files:read scope; while False, every file request is redirected to
        the sign-in page, however good its token, as Slack answers an app without it."""
        self.downloads: list[FileDownload] = []
        """Every request for a file's bytes, in order."""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._methods: dict[str, tuple[str, Callable[[dict[str, Any]], _Json]]] = {
            "auth.test": ("bot", self._auth_test),
            "apps.connections.open": ("app", self._connections_open),
            "chat.postMessage": ("bot", self._post_message),
            "chat.update": ("bot", self._update),
            "chat.delete": ("bot", self._delete),
            "chat.postEphemeral": ("bot", self._post_ephemeral),
            "conversations.replies": ("bot", self._replies),
            "conversations.history": ("bot", self._history),
            "reactions.add": ("bot", self._reaction_add),
            "reactions.remove": ("bot", self._reaction_remove),
            "users.info": ("bot", self._users_info),
        }

    # --- lifecycle ---

    @property
    def refused_429(self) -> list[Refusal]:
        """Every call answered 429 for a limit (``limits``), in order; scripted ones aside."""
        return self.rate_limits.refused

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/response/{envelope_id}", self._response_url)
        app.router.add_get("/files-pri/{team_file}/download/{name}", self._file)
        app.router.add_get("/files-pri/{team_file}/{name}", self._file)
        app.router.add_get("/", self._sign_in_page)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{bound_port}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._writer = asyncio.create_task(self._write_envelopes())

    async def close(self) -> None:
        """Stop the envelope writer, close every websocket, stop the server; idempotent."""
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
            with contextlib.suppress(Exception):
                await sock.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- what people do ---

    def mention(
        self, channel: str, text: str, *, user: str = "U1", thread_ts: str | None = None
    ) -> str:
        """A message "<@UBOT> text": an ``app_mention`` and a ``message`` envelope, one ts."""
        ts = self._new_ts()
        full = f"<@{BOT_USER}> {text}"
        message = self._person_event(channel, full, user, ts, thread_ts, _channel_type(channel))
        mention = {k: v for k, v in message.items() if k != "channel_type"}
        mention["type"] = "app_mention"
        self._remember(channel, message)
        self._emit_event(mention)
        self._emit_event(message)
        return ts

    def message(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        thread_ts: str | None = None,
        channel_type: str = "channel",
    ) -> str:
        """A person's plain message event; returns its ts."""
        ts = self._new_ts()
        event = self._person_event(channel, text, user, ts, thread_ts, channel_type)
        self._remember(channel, event)
        self._emit_event(event)
        return ts

    def dm(self, channel: str, text: str, *, user: str = "U1", thread_ts: str | None = None) -> str:
        """A direct message to the bot (``channel_type`` "im", channel like "D1")."""
        return self.message(channel, text, user=user, thread_ts=thread_ts, channel_type="im")

    def share(
        self,
        channel: str,
        *uploads: Upload,
        text: str = "",
        user: str = "U1",
        thread_ts: str | None = None,
        mention: bool = False,
    ) -> str:
        """A person's message with files, ``text`` its words (empty: the files alone): a
        ``message`` event of ``subtype: "file_share"`` carrying ``files``, in a DM when
        ``channel`` starts with "D". With ``mention`` the text starts with the bot's mention,
        and an ``app_mention`` (with the same files) comes first, as for ``mention``. Returns
        the message's ts."""
        ts = self._new_ts()
        words = f"<@{BOT_USER}> {text}".rstrip() if mention else text
        event = self._person_event(channel, words, user, ts, thread_ts, _channel_type(channel))
        files = [self._shared(upload, user, ts) for upload in uploads]
        event.update(subtype="file_share", files=files, upload=False, display_as_bot=False)
        self._remember(channel, event)
        if mention:
            said = {k: v for k, v in event.items() if k not in ("channel_type", "subtype")}
            self._emit_event({**said, "type": "app_mention"})
        self._emit_event(event)
        return ts

    def files_in(self, channel: str, ts: str) -> list[_Json]:
        """The file objects of a message, as its event carried them."""
        return [dict(file) for file in self._messages[channel][ts].get("files", [])]

    def delete_file(self, file_id: str) -> None:
        """The file is deleted: its addresses answer 404 from now on."""
        self._files[file_id].deleted = True

    def bot_message(
        self,
        channel: str,
        text: str,
        *,
        thread_ts: str | None = None,
        bot_id: str = "BOTHER",
        user: str | None = None,
    ) -> str:
        """Another bot's message: ``subtype: bot_message`` and ``bot_id``; with ``user``, the
        modern app-bot shape instead (``bot_id`` and ``user``, no subtype). Returns its ts."""
        ts = self._new_ts()
        event: _Json = {
            "type": "message",
            "text": text,
            "ts": ts,
            "bot_id": bot_id,
            "channel": channel,
            "channel_type": _channel_type(channel),
            "event_ts": ts,
            "team": TEAM,
        }
        if user is None:
            event["subtype"] = "bot_message"
            event["username"] = "other bot"
        else:
            event["user"] = user
            event["app_id"] = "AOTHER"
        if thread_ts:
            event["thread_ts"] = thread_ts
        self._remember(channel, event)
        self._emit_event(event)
        return ts

    def unseen_message(self, channel: str, text: str, *, user: str = "U1") -> str:
        """A person's message that Slack keeps (replies and reactions find it) but sends to no
        one; returns its ts."""
        ts = self._new_ts()
        self._remember(channel, self._person_event(channel, text, user, ts, None, "im"))
        return ts

    def slash_command(
        self, command: str, text: str, *, channel: str = "C1", user: str = "U1"
    ) -> str:
        """A ``slash_commands`` envelope; returns its envelope id."""
        envelope_id = str(uuid.uuid4())
        self._send(
            {
                "envelope_id": envelope_id,
                "type": "slash_commands",
                "accepts_response_payload": True,
                "payload": self._command_payload(envelope_id, command, text, channel, user),
            }
        )
        return envelope_id

    def deliver(self, kind: str, payload: _Json) -> str:
        """An envelope of ``kind`` (``events_api``, ``slash_commands`` or ``interactive``) that
        carries ``payload`` exactly as given, such as one of the samples in Slack's
        documentation (a shortcut, someone else's button); returns its envelope id."""
        envelope_id = str(uuid.uuid4())
        self._send(
            {
                "envelope_id": envelope_id,
                "type": kind,
                "accepts_response_payload": kind == "slash_commands",
                "payload": payload,
            }
        )
        return envelope_id

    def press_button(self, channel: str, ts: str, action_id: str, *, user: str = "U1") -> str:
        """A person presses the button ``action_id`` on a bot message: an ``interactive``
        envelope with a ``block_actions`` payload; returns its envelope id. Raises ``KeyError``
        when the message, as it stands now, shows no such button."""
        posted = self._posted.get((channel, ts))
        blocks = (posted.blocks or []) if posted is not None else []
        found = [
            (block, element)
            for block in blocks
            if block.get("type") == "actions"
            for element in block.get("elements", [])
            if element.get("action_id") == action_id
        ]
        if posted is None or not found:
            raise KeyError(f"no button {action_id!r} on message {ts} in {channel}")
        block, button = found[0]
        envelope_id = str(uuid.uuid4())
        self._send(
            {
                "envelope_id": envelope_id,
                "type": "interactive",
                "accepts_response_payload": False,
                "payload": self._action_payload(envelope_id, posted, block, button, user),
            }
        )
        return envelope_id

    def event_body(self, event: _Json) -> _Json:
        """Wrap an event in an ``event_callback`` body with a fresh event id.

        A message event with a channel and ts is remembered, so replies and reactions find it.
        """
        event = dict(event)
        if _is_a_message(event):
            self._remember(str(event["channel"]), event)
        return self._event_body(event)

    def _event_body(self, event: _Json) -> _Json:
        event_time = event.get("event_ts") or event.get("ts") or time.time()
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM,
            "context_team_id": TEAM,
            "context_enterprise_id": None,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{next(self._event_ids):010d}",
            "event_time": int(float(event_time)),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": TEAM,
                    "user_id": BOT_USER,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-fake",
        }

    # --- envelopes and the socket ---

    @property
    def envelopes(self) -> list[_Json]:
        """Every envelope made or redelivered, in order (including ones waiting for a socket)."""
        return list(self._envelopes)

    @property
    def pending(self) -> list[_Json]:
        """Envelopes not yet written to a socket (or POSTed to ``events_url``)."""
        return list(self._outbox)

    @property
    def connections_opened(self) -> int:
        """How many ``apps.connections.open`` calls were made (refused ones included)."""
        return len(self.calls_to("apps.connections.open"))

    @property
    def hellos(self) -> int:
        """How many websockets have been sent ``hello``."""
        return self._hellos

    @property
    def open_sockets(self) -> int:
        return sum(not sock.closed for sock in self._sockets)

    @property
    def events_url(self) -> str | None:
        """When set, envelope payloads are POSTed here, signed (HTTP Events mode), not sent on
        the socket; a 200 answer counts as the ack, and redeliveries carry X-Slack-Retry-Num."""
        return self._events_url

    @events_url.setter
    def events_url(self, url: str | None) -> None:
        self._events_url = url
        self._notify()

    def redeliver(self, envelope_id: str, *, reason: str | None = None) -> _Json:
        """Send an envelope again: same id, ``retry_attempt`` + 1; returns the new version."""
        latest = self._latest[envelope_id]
        default_reason = "http_timeout" if self._events_url else "timeout"
        again = {
            **latest,
            "retry_attempt": int(latest.get("retry_attempt") or 0) + 1,
            "retry_reason": reason or default_reason,
        }
        self._send(again)
        return again

    async def wait_connected(self, n: int = 1, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the ``n``-th websocket has been sent ``hello``."""
        await self.wait_until(lambda: self._hellos >= n, timeout, f"websocket #{n} to get hello")

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        """Send ``{"type": "disconnect"}`` on the live socket after what was queued before it;
        that socket gets no more envelopes (they wait for the next ``hello``)."""
        sock = await self._drained_live_socket()
        self._retire(sock)
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-slack"}}
        await sock.ws.send_str(json.dumps(message))

    async def drop_socket(self, *, abort: bool = False) -> None:
        """Close the live socket without a disconnect message, after what was queued before.

        By default with a websocket close frame (code 1001, as a load balancer would); with
        ``abort=True`` the TCP connection is cut with no close frame (a network failure).
        """
        sock = await self._drained_live_socket()
        self._retire(sock)
        if abort:
            if sock.request.transport is not None:
                sock.request.transport.abort()
            return
        await sock.ws.close(code=WSCloseCode.GOING_AWAY, message=b"dropped")

    # --- HTTP Events mode ---

    async def post_event(
        self,
        url: str,
        body: _Json,
        *,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        secret: str | None = None,
        timestamp: int | None = None,
    ) -> tuple[int, str]:
        """POST a signed JSON body (event_callback, url_verification) to the bot's endpoint."""
        event = body.get("event")
        if isinstance(event, dict) and _is_a_message(event):
            self._remember(str(event["channel"]), event)
        return await self._post_signed(
            url,
            json.dumps(body),
            "application/json",
            retry_num=retry_num,
            retry_reason=retry_reason,
            secret=secret,
            timestamp=timestamp,
        )

    async def post_raw(
        self, url: str, body: str, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """POST ``body`` exactly as given, signed, to the bot's endpoint."""
        return await self._post_signed(url, body, content_type)

    async def post_command(
        self,
        url: str,
        command: str,
        text: str,
        *,
        channel: str = "C1",
        user: str = "U1",
        secret: str | None = None,
    ) -> tuple[int, str]:
        """POST a signed, form-encoded slash command to the bot's endpoint, as Slack does in
        HTTP mode; ``responses`` records what is later POSTed to its ``response_url``."""
        payload = self._command_payload(str(uuid.uuid4()), command, text, channel, user)
        return await self._post_signed(
            url, urlencode(payload), "application/x-www-form-urlencoded", secret=secret
        )

    # --- what the bot did ---

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def posted(self, channel: str, thread_ts: str | None = None) -> list[Posted]:
        """The bot's messages as they stand now, oldest first: with ``thread_ts`` None those at
        the channel's top level, else the replies in that thread."""
        found = [p for p in self._posted.values() if p.channel == channel]
        found = [p for p in found if p.thread_ts == thread_ts]
        return sorted(found, key=lambda p: _ts_key(p.ts))

    @property
    def all_posted(self) -> list[Posted]:
        """Every bot message in every channel and thread, in post order."""
        return list(self._posted.values())

    def reactions(self, channel: str, ts: str) -> set[str]:
        """The reactions the bot currently has on a message."""
        return set(self._reactions.get((channel, ts), ()))

    async def wait_until(
        self,
        condition: Callable[[], object],
        timeout: float | None = None,  # noqa: ASYNC109  (None: `patience.deadline`)
        what: str | None = None,
    ) -> None:
        """Return once ``condition()`` is true, re-checking on every call, envelope, ack and
        connection. Raises ``AssertionError`` naming ``what`` (else the condition) on timeout."""
        await self._changes.until(condition, timeout, what, self._state)

    def _state(self) -> str:
        last = [call.method for call in self.calls[-10:]]
        return f"last calls: {last}; hellos: {self._hellos}; pending: {len(self._outbox)}"

    # --- scripted failures ---

    def fail_next(
        self,
        method: str,
        *,
        error: str = "ratelimited",
        retry_after: float = 1,
        times: int = 1,
        status: int | None = None,
    ) -> None:
        """Refuse the next ``times`` calls of ``method``: "ratelimited" is HTTP 429 with
        ``Retry-After: retry_after``; any other error is HTTP 200 ``{"ok": false, "error": ...}``.
        With ``status`` (a server error: 500, 503, ...) the answer has that HTTP status, its body
        ``{"ok": false, "error": error}``, or with ``error=""`` an HTML error page, as a proxy in
        front of Slack's API answers when Slack is down.
        """
        if times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        failures = self._failures.setdefault(method, deque())
        failures.extend([_Failure(error, retry_after, status)] * times)

    def refuse(self, method: str, error: str = "invalid_auth") -> None:
        """Refuse every call of ``method`` from now on with ``{"ok": false, "error": error}``;
        ``allow`` ends it."""
        self._refused[method] = error

    def allow(self, method: str) -> None:
        self._refused.pop(method, None)

    def person(
        self, user: str, *, display_name: str = "", real_name: str = "", name: str = ""
    ) -> None:
        """Give member ``user`` a profile, as ``users.info`` answers for them: a display name
        (empty when they never set one), a real name and a handle (``name``)."""
        self._people[user] = (name or f"user-{user.lower()}", display_name, real_name)

    def answer_without(self, method: str, key: str) -> None:
        """From now on answer ``method`` as usual (it takes effect) but leave ``key`` out of
        the answer, as Slack's own test doubles do with ``chat.postMessage`` and ``ts``."""
        self._without[method] = key

    def hang_up_after(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` take effect, and their connection is cut
        before the answer (`holds.hang_up`)."""
        self._hang_ups[method] += times

    def hang_up_before(self, method: str, times: int = 1) -> None:
        """The connection of the next ``times`` calls of ``method`` is cut as they arrive, before
        they take effect (recorded with the error ``connection_cut``): to the client, the same
        silence as ``hang_up_after``."""
        self._cut_short[method] += times

    # --- Web API ---

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        arrived = self.rate_limits.clock()
        params: dict[str, Any] = {}
        token: str | None = None
        try:
            params = await _read_params(request)
            token = _token(request, params)
            if self._cut_short[method] > 0:
                self._cut_short[method] -= 1
                self._record(Call(method, params, time.time(), "connection_cut", token, 0))
                return hang_up(request)
            failures = self._failures.get(method)
            if failures:
                failure = failures.popleft()
                if failure.status is not None:
                    raise _ApiError(failure.error, failure.status)
                if failure.error == "ratelimited":
                    raise _ApiError("ratelimited", 429, failure.retry_after)
                raise _ApiError(failure.error)
            if method in self._refused:
                raise _ApiError(self._refused[method])
            if method not in self._methods:
                raise _ApiError("unknown_method")
            kind, handler = self._methods[method]
            self._check_token(token, kind)
            refusal = self.rate_limits.admit(method, limit_windows(method, params), arrived)
            if refusal is not None:
                raise _ApiError("ratelimited", 429, whole_seconds(refusal.retry_after))
            async with self.holds.answering(request, method, params):
                result = handler(params)
            if self._hang_ups[method] > 0:
                self._hang_ups[method] -= 1
                self._record(Call(method, params, time.time(), None, token))
                return hang_up(request)
            result = {k: v for k, v in result.items() if k != self._without.get(method)}
        except _ApiError as error:
            self._record(Call(method, params, time.time(), error.error, token, error.status))
            return error.response()
        self._record(Call(method, params, time.time(), None, token))
        return web.json_response({"ok": True, **result})

    def _check_token(self, token: str | None, kind: str) -> None:
        if not token:
            raise _ApiError("not_authed")
        expected, other = (
            (self.app_token, ("xoxb-", "xoxp-")) if kind == "app" else (self.bot_token, ("xapp-",))
        )
        if token == expected:
            return
        if token.startswith(other):
            raise _ApiError("not_allowed_token_type")
        raise _ApiError("invalid_auth")

    def _auth_test(self, params: dict[str, Any]) -> _Json:
        return {
            "url": "https://test.slack.com/",
            "team": TEAM_NAME,
            "user": BOT_NAME,
            "team_id": TEAM,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _connections_open(self, params: dict[str, Any]) -> _Json:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        host = self.url.removeprefix("http://")
        return {"url": f"ws://{host}/socket?ticket={ticket}&app_id={APP_ID}"}

    def _post_message(self, params: dict[str, Any]) -> _Json:
        channel = _text_param(params, "channel")
        if not channel:
            raise _ApiError("channel_not_found")
        text = _text_param(params, "text")
        blocks = _blocks(params)
        if not text.strip() and not blocks and not params.get("attachments"):
            raise _ApiError("no_text")
        if len(text) > MAX_TEXT_CHARS:
            raise _ApiError("msg_too_long")
        thread_ts = _text_param(params, "thread_ts") or None
        ts = self._new_ts()
        message: _Json = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "text": text,
            "ts": ts,
            "team": TEAM,
            "bot_profile": {"id": BOT_ID, "app_id": APP_ID, "name": BOT_NAME, "team_id": TEAM},
        }
        if blocks:
            message["blocks"] = blocks
        if thread_ts:
            message["thread_ts"] = thread_ts
            parent = self._messages.get(channel, {}).get(thread_ts)
            if parent is not None and parent.get("user"):
                message["parent_user_id"] = parent["user"]
        self._remember(channel, message)
        self._posted[(channel, ts)] = Posted(channel, ts, text, blocks or None, thread_ts)
        if self.echo_bot_messages:
            event = {**message, "channel": channel, "channel_type": _channel_type(channel)}
            self._emit_event({**event, "event_ts": ts})
        return {"channel": channel, "ts": ts, "message": dict(message)}

    def _delete(self, params: dict[str, Any]) -> _Json:
        channel = _text_param(params, "channel")
        ts = _text_param(params, "ts")
        if self._posted.pop((channel, ts), None) is None:
            if ts in self._messages.get(channel, {}):
                raise _ApiError("cant_delete_message")
            raise _ApiError("message_not_found")
        self._messages[channel].pop(ts, None)
        self.deleted.append(ts)
        return {"channel": channel, "ts": ts}

    def _update(self, params: dict[str, Any]) -> _Json:
        channel = _text_param(params, "channel")
        ts = _text_param(params, "ts")
        current = self._posted.get((channel, ts))
        if current is None:
            if ts in self._messages.get(channel, {}):
                raise _ApiError("cant_update_message")
            raise _ApiError("message_not_found")
        text = _text_param(params, "text")
        blocks = _blocks(params)
        if not text.strip() and not blocks and not params.get("attachments"):
            raise _ApiError("no_text")
        if len(text) > MAX_TEXT_CHARS:
            raise _ApiError("msg_too_long")
        blocks = current.blocks if blocks is None else blocks or None  # omitted: kept; []: gone
        self._posted[(channel, ts)] = replace(
            current, text=text, blocks=blocks, updates=[*current.updates, text]
        )
        stored = self._messages[channel][ts]
        previous = dict(stored)
        stored["text"] = text
        stored.pop("blocks", None)
        if blocks:
            stored["blocks"] = blocks
        edit_ts = self._new_ts()
        stored["edited"] = {"user": BOT_USER, "ts": edit_ts}
        if self.echo_bot_messages:
            self._emit_event(
                {
                    "type": "message",
                    "subtype": "message_changed",
                    "hidden": True,
                    "message": dict(stored),
                    "previous_message": previous,
                    "channel": channel,
                    "channel_type": _channel_type(channel),
                    "ts": edit_ts,
                    "event_ts": edit_ts,
                }
            )
        return {"channel": channel, "ts": ts, "text": text, "message": dict(stored)}

    def _post_ephemeral(self, params: dict[str, Any]) -> _Json:
        channel, user = _text_param(params, "channel"), _text_param(params, "user")
        if not channel:
            raise _ApiError("channel_not_found")
        if not user:
            raise _ApiError("user_not_in_channel")
        text = _text_param(params, "text")
        if not text.strip() and not _blocks(params):
            raise _ApiError("no_text")
        thread_ts = _text_param(params, "thread_ts") or None
        self.ephemeral.append(Ephemeral(channel, user, text, thread_ts))
        return {"message_ts": self._new_ts()}

    def _replies(self, params: dict[str, Any]) -> _Json:
        channel = _text_param(params, "channel")
        ts = _text_param(params, "ts")
        if not channel:
            raise _ApiError("channel_not_found")
        messages = self._messages.get(channel, {})
        found = messages.get(ts)
        if found is None:
            raise _ApiError("thread_not_found")
        root = str(found.get("thread_ts") or ts)
        thread = [m for m in messages.values() if m["ts"] == root or m.get("thread_ts") == root]
        thread.sort(key=lambda m: _ts_key(m["ts"]))
        replies = _in_range(thread[1:], params)[: _limit(params)]
        shown = [thread[0], *replies]  # the parent comes first, whatever the range
        return {
            "messages": [self._as_returned(channel, m, root, thread) for m in shown],
            "has_more": False,
            "response_metadata": {"next_cursor": ""},
        }

    def _history(self, params: dict[str, Any]) -> _Json:
        """A conversation's top level, newest first: messages outside threads and the parents
        of threads (the replies stay in their threads), within ``oldest``/``latest``."""
        channel = _text_param(params, "channel")
        if not channel:
            raise _ApiError("channel_not_found")
        messages = self._messages.get(channel, {})
        top = [m for m in messages.values() if m.get("thread_ts") in (None, m["ts"])]
        top.sort(key=lambda m: _ts_key(m["ts"]), reverse=True)
        shown = _in_range(top, params)[: _limit(params)]
        return {
            "messages": [
                self._as_returned(channel, m, m["ts"], self._thread_of(channel, m["ts"]))
                for m in shown
            ],
            "has_more": False,
            "pin_count": 0,
            "response_metadata": {"next_cursor": ""},
        }

    def _thread_of(self, channel: str, root: str) -> list[_Json]:
        messages = self._messages.get(channel, {}).values()
        thread = [m for m in messages if m["ts"] == root or m.get("thread_ts") == root]
        return sorted(thread, key=lambda m: _ts_key(m["ts"]))

    def _as_returned(self, channel: str, message: _Json, root: str, thread: list[_Json]) -> _Json:
        shown = dict(message)
        replies = [m for m in thread if m["ts"] != root]
        if message["ts"] == root and replies:
            users = list(dict.fromkeys(m.get("user") or m.get("bot_id") for m in replies))
            shown.update(
                thread_ts=root,
                reply_count=len(replies),
                reply_users=users,
                reply_users_count=len(users),
                latest_reply=replies[-1]["ts"],
            )
        names = self._reactions.get((channel, message["ts"]))
        if names:
            shown["reactions"] = [
                {"name": name, "users": [BOT_USER], "count": 1} for name in sorted(names)
            ]
        return shown

    def _reaction_target(self, params: dict[str, Any]) -> tuple[tuple[str, str], str]:
        channel = _text_param(params, "channel")
        ts = _text_param(params, "timestamp")
        name = _text_param(params, "name").strip(":")
        if not name:
            raise _ApiError("invalid_name")
        if not channel:
            raise _ApiError("channel_not_found")
        if ts not in self._messages.get(channel, {}):
            raise _ApiError("message_not_found")
        return (channel, ts), name

    def _reaction_add(self, params: dict[str, Any]) -> _Json:
        key, name = self._reaction_target(params)
        names = self._reactions.setdefault(key, set())
        if name in names:
            raise _ApiError("already_reacted")
        names.add(name)
        return {}

    def _reaction_remove(self, params: dict[str, Any]) -> _Json:
        key, name = self._reaction_target(params)
        names = self._reactions.get(key, set())
        if name not in names:
            raise _ApiError("no_reaction")
        names.discard(name)
        return {}

    def _users_info(self, params: dict[str, Any]) -> _Json:
        """A member as Slack describes one: ``name`` is the old handle, ``real_name`` the full
        name, and ``profile.display_name`` what Slack shows, empty when the person never set
        one (then Slack shows the real name)."""
        user = _text_param(params, "user")
        if user == BOT_USER:
            name, display_name, real_name, is_bot = BOT_NAME, "", BOT_NAME.title(), True
        elif user in self._people:
            (name, display_name, real_name), is_bot = self._people[user], False
        elif user[:1] in ("U", "W") and len(user) > 1:
            name, display_name, is_bot = f"user-{user.lower()}", "", False
            real_name = name.title()
        else:
            raise _ApiError("user_not_found")
        profile = {
            "real_name": real_name,
            "real_name_normalized": real_name,
            "display_name": display_name,
            "display_name_normalized": display_name,
            "status_text": "",
            "status_emoji": "",
            "team": TEAM,
        }
        return {
            "user": {
                "id": user,
                "team_id": TEAM,
                "name": name,
                "deleted": False,
                "real_name": real_name,
                "tz": "Europe/London",
                "tz_label": "Greenwich Mean Time",
                "tz_offset": 0,
                "profile": profile,
                "is_admin": False,
                "is_owner": False,
                "is_bot": is_bot,
                "is_app_user": False,
                "updated": 1_700_000_000,
            }
        }

    async def _response_url(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(ResponseUrlPost(request.match_info["envelope_id"], body))
        self._notify()
        return web.json_response({"ok": True})

    # --- files ---

    def _shared(self, upload: Upload, user: str, ts: str) -> _Json:
        """A file object as Slack puts it in a message event, its bytes kept to be served."""
        file_id = f"F{next(self._file_ids):08d}"
        name = quote(upload.name, safe="")
        base = f"{self.url}/files-pri/{TEAM}-{file_id}"
        created = int(float(ts))
        filetype = upload.name.rpartition(".")[2].lower() if "." in upload.name else "binary"
        file: _Json = {
            "id": file_id,
            "created": created,
            "timestamp": created,
            "name": upload.name,
            "title": upload.title or upload.name,
            "mimetype": upload.mimetype,
            "filetype": filetype,
            "pretty_type": filetype.upper(),
            "user": user,
            "user_team": TEAM,
            "editable": False,
            "size": len(upload.content) if upload.declared_size is None else upload.declared_size,
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": f"{base}/{name}",
            "url_private_download": f"{base}/download/{name}",
            "permalink": f"https://test.slack.com/files/{user}/{file_id}/{name}",
            "permalink_public": f"https://slack-files.com/{TEAM}-{file_id}-0000000000",
            "has_rich_preview": False,
            "file_access": "visible",
        }
        if upload.audio_clip:
            file.update(subtype="slack_audio", media_display_type="audio")
            if upload.duration_ms is not None:
                file["duration_ms"] = upload.duration_ms
        self._files[file_id] = _SharedFile(upload, file)
        return file

    async def _file(self, request: web.Request) -> web.StreamResponse:
        """A file's bytes for the bot token (with files:read), else Slack's sign-in redirect;
        404 for a file never shared or deleted."""
        team, _, file_id = request.match_info["team_file"].partition("-")
        shared = self._files.get(file_id) if team == TEAM else None
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        if shared is None or shared.deleted:
            self._downloaded(FileDownload("", request.path, token, 404))
            return web.Response(status=404, text="file_not_found")
        if token != self.bot_token or not self.files_read_scope:
            self._downloaded(FileDownload(file_id, request.path, token, 302))
            raise web.HTTPFound(f"/?redir={quote(request.path, safe='')}")
        self._downloaded(FileDownload(file_id, request.path, token, 200))
        return await self._served(request, shared.upload)

    async def _served(self, request: web.Request, upload: Upload) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": upload.mimetype or "application/octet-stream",
                "Content-Disposition": f"attachment; filename*=UTF-8''{quote(upload.name)}",
            }
        )
        if not upload.chunked:
            response.content_length = len(upload.content)
        await response.prepare(request)
        try:
            for start in range(0, len(upload.content), FILE_CHUNK):
                await response.write(upload.content[start : start + FILE_CHUNK])
            await response.write_eof()
        except ConnectionResetError:  # the client stopped reading: it had enough
            pass
        return response

    async def _sign_in_page(self, request: web.Request) -> web.Response:
        return web.Response(text=SIGN_IN_PAGE, content_type="text/html")

    def _downloaded(self, download: FileDownload) -> None:
        self.downloads.append(download)
        self._notify()

    # --- the websocket ---

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            return web.Response(status=503, text="shutting down")
        if self.sockets_refused:
            self.refused_sockets += 1
            self._notify()
            return web.Response(status=503, text="unavailable")
        if request.query.get("ticket") not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(timeout=2.0)
        await ws.prepare(request)
        sock = _Socket(len(self._sockets) + 1, ws, request)
        self._sockets.append(sock)
        try:
            hello = {
                "type": "hello",
                "num_connections": self.open_sockets,
                "debug_info": {
                    "host": "fake-slack",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": APP_ID},
            }
            await ws.send_str(json.dumps(hello))
            self._hellos += 1
            if not sock.retired:
                self._live = sock
            self._notify()
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    self._receive(message.data)
        finally:
            sock.closed = True
            self._retire(sock)
        return ws

    def _receive(self, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            message = {"unparsed": data}
        if isinstance(message, dict) and "envelope_id" in message:
            envelope_id = str(message["envelope_id"])
            self.acks.append(Ack(envelope_id, message.get("payload"), time.time()))
            self.acked.add(envelope_id)
        else:
            self.socket_messages.append(message if isinstance(message, dict) else {"raw": data})
        self._notify()

    def _retire(self, sock: _Socket) -> None:
        sock.retired = True
        if self._live is sock:
            usable = [s for s in self._sockets if not s.retired and not s.closed]
            self._live = usable[-1] if usable else None
        self._notify()

    async def _drained_live_socket(self) -> _Socket:
        if self._live is None:
            raise AssertionError("no Socket Mode connection is open")
        sock = self._live
        await self.wait_until(
            lambda: not self._outbox or self._live is not sock, what="envelopes written"
        )
        if self._live is not sock:
            raise AssertionError("the Socket Mode connection went away")
        return sock

    # --- sending envelopes ---

    def _emit_event(self, event: _Json) -> None:
        self._send(
            {
                "envelope_id": str(uuid.uuid4()),
                "type": "events_api",
                "accepts_response_payload": False,
                "retry_attempt": 0,
                "retry_reason": "",
                "payload": self._event_body(event),
            }
        )

    def _send(self, envelope: _Json) -> None:
        self._envelopes.append(envelope)
        self._latest[envelope["envelope_id"]] = envelope
        self._outbox.append(envelope)
        self._notify()

    def _ready(self) -> bool:
        return bool(self._outbox) and (self._events_url is not None or self._live is not None)

    async def _write_envelopes(self) -> None:
        """The one writer: envelopes go out in order, to ``events_url`` or the live socket."""
        while True:
            while not self._ready():
                await self._changes.next()
            envelope = self._outbox[0]
            if self._events_url is not None:
                await self._post_envelope(self._events_url, envelope)
            else:
                sock = self._live
                assert sock is not None
                try:
                    await sock.ws.send_str(json.dumps(envelope))
                except Exception:  # the socket is going away; this writer must not die
                    self._retire(sock)  # not written: it stays first in line for the next socket
                    continue
            self._outbox.popleft()
            self._notify()

    async def _post_envelope(self, url: str, envelope: _Json) -> None:
        retry_num = int(envelope.get("retry_attempt") or 0)
        payload = envelope["payload"]
        if envelope["type"] == "slash_commands":
            body, content_type = urlencode(payload), "application/x-www-form-urlencoded"
        elif envelope["type"] == "interactive":
            body = urlencode({"payload": json.dumps(payload)})
            content_type = "application/x-www-form-urlencoded"
        else:
            body, content_type = json.dumps(payload), "application/json"
        try:
            status, text = await self._post_signed(
                url,
                body,
                content_type,
                retry_num=retry_num or None,
                retry_reason=envelope.get("retry_reason") or "http_timeout",
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            status, text = 0, f"{type(error).__name__}: {error}"
        self.http_deliveries.append(
            HttpDelivery(envelope["envelope_id"], url, retry_num, status, text)
        )
        if status == 200:
            self.acked.add(envelope["envelope_id"])

    async def _post_signed(
        self,
        url: str,
        body: str,
        content_type: str,
        *,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        secret: str | None = None,
        timestamp: int | None = None,
    ) -> tuple[int, str]:
        if self._session is None:
            raise RuntimeError("FakeSlack is not started")
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature(
                self.signing_secret if secret is None else secret, stamp, body
            ),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        async with self._session.post(url, data=body.encode(), headers=headers) as response:
            text = await response.text()
            status = response.status
        self._notify()
        return status, text

    # --- helpers ---

    def _command_payload(
        self, response_id: str, command: str, text: str, channel: str, user: str
    ) -> dict[str, str]:
        number = next(self._event_ids)
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM,
            "team_domain": "test",
            "channel_id": channel,
            "channel_name": _channel_name(channel),
            "user_id": user,
            "user_name": f"user-{user.lower()}",
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": f"{self.url}/response/{response_id}",
            "trigger_id": f"{number}.{number}.fake-trigger",
        }

    def _action_payload(
        self, response_id: str, posted: Posted, block: _Json, button: _Json, user: str
    ) -> _Json:
        """A ``block_actions`` payload: ``user`` pressed ``button`` in ``block`` of ``posted``."""
        number = next(self._event_ids)
        container: _Json = {
            "type": "message",
            "message_ts": posted.ts,
            "channel_id": posted.channel,
            "is_ephemeral": False,
        }
        if posted.thread_ts:
            container["thread_ts"] = posted.thread_ts
        return {
            "type": "block_actions",
            "user": {"id": user, "username": f"user-{user.lower()}", "team_id": TEAM},
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": container,
            "trigger_id": f"{number}.{number}.fake-trigger",
            "team": {"id": TEAM, "domain": "test"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": posted.channel, "name": _channel_name(posted.channel)},
            "message": dict(self._messages[posted.channel][posted.ts]),
            "state": {"values": {}},
            "response_url": f"{self.url}/response/{response_id}",
            "actions": [
                {
                    "action_id": button["action_id"],
                    "block_id": block.get("block_id", "fake-block"),
                    "text": button.get("text"),
                    "value": button.get("value"),
                    "type": button.get("type", "button"),
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    def _new_ts(self) -> str:
        """Unique, increasing message timestamps shared by people and the bot."""
        self._clock += 100
        return f"{self._clock // 1_000_000}.{self._clock % 1_000_000:06d}"

    def _person_event(
        self,
        channel: str,
        text: str,
        user: str,
        ts: str,
        thread_ts: str | None,
        channel_type: str,
    ) -> _Json:
        event: _Json = {
            "type": "message",
            "client_msg_id": str(uuid.uuid4()),
            "user": user,
            "text": text,
            "ts": ts,
            "team": TEAM,
            "channel": channel,
            "channel_type": channel_type,
            "event_ts": ts,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
            parent = self._messages.get(channel, {}).get(thread_ts)
            if parent is not None and parent.get("user"):
                event["parent_user_id"] = parent["user"]
        return event

    def _remember(self, channel: str, event: _Json) -> None:
        """Store a message as ``conversations.replies`` returns it (no channel fields)."""
        stored = {k: v for k, v in event.items() if k not in ("channel", "channel_type")}
        stored.pop("event_ts", None)
        self._messages.setdefault(channel, {})[str(event["ts"])] = stored

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self._notify()

    def _notify(self) -> None:
        self._changes.notify()
