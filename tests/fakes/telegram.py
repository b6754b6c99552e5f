"""A fake Telegram Bot API server that speaks the real Bot API wire protocol.

Tests point the real python-telegram-bot (``telegram.Bot`` and ``telegram.ext.Application``)
at this server through its ``base_url``/``base_file_url`` seam instead of mocking the library,
so what the library sends, parses and raises is exactly what production code sees. People are
simulated by queueing updates (``user_message``, ``user_photo``, ``user_file``, ``push_update``);
what the bot did is recorded as ``calls`` and, per chat, as ``sent`` messages with the text a
person sees. A file a person sends (a photo, a voice note, a document...) is kept by its
``file_id``: ``getFile`` answers its ``file_path`` and ``file_size`` (or 400 "file is too big"
past the Bot API's 20 MB, or "invalid file_id" for one it does not know), and its bytes are
served at ``/file/bot<token>/<file_path>``, as Telegram does (401 with a wrong token, 404 for a
path it does not know or one ``expire_file_path`` expired); ``downloaded`` lists what was served.

The server keeps Telegram's rules that bots trip over: ``getUpdates`` long polls and only
forgets updates once a later call's ``offset`` confirms them; message text is limited to 4096
UTF-16 code units of visible text; HTML is validated (``render``) with Telegram's error
prefixes; an edit to the same content is refused. A message may carry an inline keyboard
(``reply_markup``), and an edit without one takes it away, as on Telegram; ``press_button``
is a person pressing a button (a ``callback_query`` update), and each query may be answered
once (``answerCallbackQuery``, recorded in ``callback_answers``). ``fail_next`` scripts error
answers, such as a 429 flood wait (a test may ask for fractions of a second, where Telegram says
whole ones), and ``answer_without`` answers a method without a field (a message without its
``message_id``). ``holds`` keeps answers waiting on a condition and counts requests in flight
and requests abandoned by the client. ``wait_until`` re-checks a condition on every call and
update, so tests wait on what the bot did instead of sleeping; ``close()`` answers parked long
polls first.

With ``limits=True`` it keeps the Bot API's published limits (``tests.fakes.rate_limits``, sliding
windows: Telegram says no more of how it counts): 30 calls in any second for the whole bot, 3 in
any 3 seconds in one private chat ("about one a second", with the short bursts Telegram lets
through), 20 in any minute in a group or channel (an id below 0, or an ``@username``). Only the
calls that show or change something in a chat count (``LIMITED``: sending, editing and deleting
messages, and ``sendChatAction``, which counts for the bot alone, not its chat); ``getUpdates``,
``getMe``, ``getFile``, ``answerCallbackQuery`` and the rest never do. A call past a limit is
answered as Telegram does: HTTP 429, ``"Too Many Requests: retry after N"`` and
``parameters.retry_after`` N, the whole seconds until every window it counts in has room (at
least 1). Each refusal is kept in ``refused_429``, and when each counted call came in in
``rate_limits.admitted`` (``rate_limits.clock``, which a test may stop and move by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Self

import aiohttp
from aiohttp import web

from tests.fakes.changes import Changes
from tests.fakes.holds import Holds, hang_up
from tests.fakes.rate_limits import Limiter, Refusal, Window, whole_seconds

BOT_TOKEN = "123456:TEST-token"
MAX_TEXT_UNITS = 4096
MAX_CALLBACK_ANSWER_CHARS = 200
MAX_CALLBACK_DATA_BYTES = 64
QUERY_GONE = "Bad Request: query is too old and response timeout expired or query ID is invalid"
MAX_POLL_SECONDS = 30.0
FIRST_UPDATE_ID = 100_000
DEFAULT_GROUP_USER_ID = 4242
DEFAULT_PHOTO = b"\xff\xd8\xff\xe0fake-jpeg-bytes\xff\xd9"
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024
"""The largest file the Bot API lets a bot fetch (``getFile`` refuses a larger one)."""
FILE_TOO_BIG = "Bad Request: file is too big"
FileKind = Literal["voice", "video_note", "audio", "document", "video"]
"""The message fields a file may come in (besides ``photo``: ``user_photo``)."""
_FOLDERS: dict[str, tuple[str, str]] = {
    "voice": ("voice", "oga"),
    "video_note": ("video_notes", "mp4"),
    "audio": ("music", "mp3"),
    "document": ("documents", "bin"),
    "video": ("videos", "mp4"),
}
"""Each kind's folder in Telegram's file paths, and the extension of a file without a name."""
_TIMED = frozenset({"voice", "video_note", "audio", "video"})
_WITH_FILE_NAME = frozenset({"audio", "document", "video"})
"""The kinds whose object has a ``file_name`` (a voice note's and a video note's have none)."""
_MEDIUM_EXTRAS: dict[str, dict[str, Any]] = {
    "video_note": {"length": 240},
    "video": {"width": 640, "height": 360},
}

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)

# Parameters the Bot API types as strings. PTB form-encodes strings as they are (other values
# as JSON), so ``text=123`` must stay the string "123" rather than decode to a number.
_STRING_PARAMS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "action",
        "file_id",
        "language_code",
        "inline_message_id",
        "business_connection_id",
        "message_effect_id",
        "callback_query_id",
        "url",
    }
)

LIMITED = frozenset(
    {
        "sendmessage",
        "editmessagetext",
        "editmessagecaption",
        "editmessagemedia",
        "editmessagereplymarkup",
        "deletemessage",
        "deletemessages",
        "sendchataction",
        "sendphoto",
        "senddocument",
        "sendaudio",
        "sendvoice",
        "sendvideo",
        "sendvideonote",
        "sendanimation",
        "sendsticker",
        "sendmediagroup",
        "sendlocation",
        "sendpoll",
        "forwardmessage",
        "copymessage",
    }
)
"""The methods (lower-cased) Telegram's limits count: every one that shows something in a chat."""
BOT_WINDOW = Window("bot", 30, 1.0)
PRIVATE_CALLS, PRIVATE_SECONDS = 3, 3.0
GROUP_CALLS, GROUP_SECONDS = 20, 60.0

_Json = dict[str, Any]


def limit_windows(method: str, params: Mapping[str, Any]) -> list[Window]:
    """The windows a call counts against: none, the bot's alone ("typing…"), or the bot's and
    its chat's (a group's, an id below 0 or an @username, is slower)."""
    method = method.lower()
    if method not in LIMITED:
        return []
    if method == "sendchataction":
        return [BOT_WINDOW]
    chat = str(params.get("chat_id", "")).strip()
    group = chat.startswith(("-", "@"))
    calls, seconds = (GROUP_CALLS, GROUP_SECONDS) if group else (PRIVATE_CALLS, PRIVATE_SECONDS)
    return [BOT_WINDOW, Window(f"chat {chat}", calls, seconds)]


@dataclass(frozen=True)
class Call:
    """One Bot API request as received; ``error`` is the error body when it was refused."""

    method: str
    params: dict[str, Any]
    at: float
    error: _Json | None = None


@dataclass(frozen=True)
class SentMessage:
    """A bot message as it stands now; ``fake.sent`` returns snapshots, later edits replace it.

    ``text`` and ``parse_mode`` are as last set; ``visible`` is what a person sees; ``edits``
    holds the visible text of every successful edit, in order.
    """

    chat_id: int | str
    message_id: int
    text: str
    parse_mode: str | None
    visible: str
    edits: list[str] = field(default_factory=list)
    entities: tuple[_Json, ...] = ()
    reply_to: int | None = None
    reply_markup: _Json | None = None

    @property
    def buttons(self) -> list[str]:
        """The ``callback_data`` of each inline keyboard button, row by row ([] without one)."""
        rows = (self.reply_markup or {}).get("inline_keyboard", [])
        return [button.get("callback_data", "") for row in rows for button in row]


@dataclass(frozen=True)
class CallbackAnswer:
    """An ``answerCallbackQuery``: what the person who pressed the button was shown."""

    text: str | None
    show_alert: bool


@dataclass(frozen=True)
class Rendered:
    """Text after entity parsing: what a person sees, and its entities (UTF-16 offsets)."""

    visible: str
    entities: tuple[_Json, ...] = ()


class EntityParseError(ValueError):
    """HTML Telegram refuses; ``str()`` is the reason plus ``at byte offset N``."""

    def __init__(self, reason: str, byte_offset: int) -> None:
        super().__init__(f"{reason} at byte offset {byte_offset}")
        self.reason = reason
        self.byte_offset = byte_offset


@dataclass(frozen=True)
class _Failure:
    status: int
    description: str
    retry_after: float | None = None


@dataclass(frozen=True)
class _StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    file_size: int
    """What Telegram says the file's size is (and judges "too big" by): ``len(data)`` unless a
    test states another."""


class _ApiError(Exception):
    def __init__(self, status: int, description: str, retry_after: float | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after

    def body(self) -> _Json:
        body: _Json = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


def _bad_request(reason: str) -> _ApiError:
    return _ApiError(400, f"Bad Request: {reason}")


# --- HTML parse mode ---------------------------------------------------------------------------

_TAG = re.compile(
    r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)"
    r"((?:\s+[^\s=<>/\"']+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'<>]+))?)*)\s*>"
)
_ATTRIBUTE = re.compile(r"([^\s=<>/\"']+)(?:\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'<>]+)))?")
_ENTITY = re.compile(r"&(?:(lt|gt|amp|quot);|#([0-9]{1,8});|#[xX]([0-9a-fA-F]{1,7});)")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_TAG_TYPES = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
}


@dataclass
class _Open:
    """A start tag waiting for its end tag; ``entity`` is None when it makes no entity."""

    name: str
    start: int  # in UTF-16 units of the visible text
    index: int  # of the "<" in the source, for the error offset
    entity: _Json | None


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's limits and entity offsets."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8", "surrogatepass"))


def _unescape(value: str) -> str:
    return _ENTITY.sub(lambda m: _entity_char(m) or m.group(0), value)


def _entity_char(match: re.Match[str]) -> str | None:
    named, decimal, hexadecimal = match.groups()
    if named:
        return _NAMED[named]
    code = int(decimal) if decimal else int(hexadecimal, 16)
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return None
    return chr(code)


def _attributes(source: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(source):
        name, *values = match.groups()
        value = next((v for v in values if v is not None), "")
        found[name.lower()] = _unescape(value)
    return found


def _start_entity(name: str, attributes: Mapping[str, str], stack: list[_Open]) -> _Json | None:
    kind = _TAG_TYPES.get(name)
    if kind is None or (name == "span" and attributes.get("class") != "tg-spoiler"):
        raise ValueError(f'Unsupported start tag "{name}"')
    if name == "a":
        href = attributes.get("href", "")
        return {"type": kind, "url": href} if href else None
    if name == "blockquote" and "expandable" in attributes:
        return {"type": "expandable_blockquote"}
    if name == "code" and stack and stack[-1].entity and stack[-1].name == "pre":
        # <pre><code class="language-x">: one pre entity, with the language
        language = attributes.get("class", "").partition("language-")[2]
        if language and attributes["class"].startswith("language-"):
            stack[-1].entity["language"] = language
        return None
    return {"type": kind}


def _parse_html(text: str) -> Rendered:
    shown: list[str] = []
    units = 0
    stack: list[_Open] = []
    entities: list[_Json] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "<":
            tag = _TAG.match(text, index)
            if tag is None:
                raise EntityParseError("Unclosed start tag", _byte_offset(text, index))
            closing, name, attribute_source = tag.group(1), tag.group(2).lower(), tag.group(3)
            if closing:
                if attribute_source.strip():
                    reason = f'Unexpected attributes in end tag "{name}"'
                    raise EntityParseError(reason, _byte_offset(text, index))
                if not stack:
                    raise EntityParseError(
                        f'Unexpected end tag "{name}"', _byte_offset(text, index)
                    )
                opened = stack.pop()
                if opened.name != name:
                    reason = f'Unmatched end tag "{name}", expected end tag "{opened.name}"'
                    raise EntityParseError(reason, _byte_offset(text, index))
                if opened.entity is not None and units > opened.start:
                    length = units - opened.start
                    entities.append({**opened.entity, "offset": opened.start, "length": length})
            else:
                try:
                    entity = _start_entity(name, _attributes(attribute_source), stack)
                except ValueError as error:
                    raise EntityParseError(str(error), _byte_offset(text, index)) from None
                stack.append(_Open(name, units, index, entity))
            index = tag.end()
            continue
        if char == "&":
            match = _ENTITY.match(text, index)
            decoded = _entity_char(match) if match else None
            if match is None or decoded is None:
                raise EntityParseError(
                    "Can't find end of the entity starting", _byte_offset(text, index)
                )
            char = decoded
            index = match.end()
        else:
            index += 1
        shown.append(char)
        units += utf16_len(char)
    if stack:
        opened = stack[-1]
        reason = f'Can\'t find end tag corresponding to start tag "{opened.name}"'
        raise EntityParseError(reason, _byte_offset(text, opened.index))
    entities.sort(key=lambda entity: (entity["offset"], -entity["length"]))
    return Rendered("".join(shown), tuple(entities))


def render(text: str, parse_mode: str | None = None) -> Rendered:
    """What Telegram makes of ``text``: HTML is parsed and checked, no parse mode is literal.

    Raises ``EntityParseError`` for HTML Telegram refuses, ``ValueError`` for a parse mode this
    fake does not implement (Markdown, MarkdownV2).
    """
    if not parse_mode:
        return Rendered(text)
    if parse_mode.lower() == "html":
        return _parse_html(text)
    raise ValueError(f"unsupported parse_mode {parse_mode!r} (the fake only speaks HTML)")


def visible_text(text: str, parse_mode: str | None = None) -> str:
    """The text a person sees: for HTML, tags removed and entities unescaped."""
    return render(text, parse_mode).visible


def _checked_text(params: Mapping[str, Any]) -> tuple[str, str | None, Rendered]:
    """Parse a message text as Telegram does, with its errors, in its order."""
    text = params.get("text")
    text = "" if text is None else str(text)
    parse_mode = params.get("parse_mode") or None
    try:
        rendered = render(text, parse_mode)
    except EntityParseError as error:
        raise _bad_request(f"can't parse entities: {error}") from None
    except ValueError:
        raise _bad_request("unsupported parse_mode") from None
    if parse_mode is None and isinstance(params.get("entities"), list):
        rendered = Rendered(rendered.visible, tuple(params["entities"]))
    if not rendered.visible.strip():
        raise _bad_request("message text is empty")
    if utf16_len(rendered.visible) > MAX_TEXT_UNITS:
        raise _bad_request("message is too long")
    return text, parse_mode, rendered


# --- request decoding --------------------------------------------------------------------------


def _decode(name: str, value: str) -> Any:
    if name in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Query string, then the body: JSON, form-encoded or multipart (files become bytes)."""
    params: dict[str, Any] = {name: _decode(name, v) for name, v in request.query.items()}
    if not request.can_read_body:
        return params
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError:
            raise _bad_request("can't parse JSON object") from None
        if isinstance(body, dict):
            params.update(body)
        return params
    form = await request.post()
    for name, value in form.items():
        if isinstance(value, web.FileField):
            params[name] = value.file.read()
        else:
            params[name] = _decode(name, str(value))
    return params


def _inline_keyboard(params: Mapping[str, Any]) -> _Json | None:
    """``reply_markup`` as an inline keyboard (None without one), checked as Telegram does."""
    markup = params.get("reply_markup")
    if markup is None:
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise _bad_request("can't parse inline keyboard markup JSON object")
    for button in (button for row in rows for button in row):
        if not isinstance(button, dict) or not button.get("text"):
            raise _bad_request(
                'can\'t parse inline keyboard button: Field "text" must be of type String'
            )
        data = button.get("callback_data")
        if data is not None and not 0 < len(str(data).encode()) <= MAX_CALLBACK_DATA_BYTES:
            raise _bad_request("BUTTON_DATA_INVALID")
    return markup


def _chat_key(value: Any) -> int | str:
    if isinstance(value, bool):
        raise _bad_request("chat not found")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if text.startswith("@") and len(text) > 1:
        return text
    raise _bad_request("chat not found" if text else "chat_id is empty")


def _int_param(params: Mapping[str, Any], name: str, default: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _bad_request(f"wrong parameter {name} in request") from None


def _number_param(params: Mapping[str, Any], name: str) -> float:
    value = params.get(name)
    if value is None or value == "":
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _bad_request(f"wrong parameter {name} in request") from None


class FakeTelegram:
    """An aiohttp server on 127.0.0.1 answering ``/bot<TOKEN>/<method>`` and file downloads."""

    def __init__(self, token: str = BOT_TOKEN, *, limits: bool = False) -> None:
        self.token = token
        self.rate_limits = Limiter(enabled=limits)
        """The Bot API's limits, kept only with ``limits`` (see the module's docstring)."""
        self.bot_user: _Json = {
            "id": 999000,
            "is_bot": True,
            "first_name": "Kaiwa",
            "username": "kaiwa_test_bot",
        }
        self.calls: list[Call] = []
        self.commands: list[_Json] = []
        self.url = ""
        self._updates: list[_Json] = []  # unconfirmed, in update_id order
        self.handed_out: list[int] = []
        """Update ids in the order getUpdates answered with them (an unconfirmed one again)."""
        self._next_update_id = FIRST_UPDATE_ID
        self._confirmed_offset = 0
        self._chats: dict[int | str, _Json] = {}
        self._last_message_id: dict[int | str, int] = {}
        self._user_messages: dict[int | str, dict[int, _Json]] = {}
        self._sent: dict[int | str, dict[int, SentMessage]] = {}
        self.deleted: list[int] = []
        """Ids of the bot's messages it deleted, in order."""
        self.webhook: dict[str, Any] = {}
        """What `setWebhook` was last given: its url and secret token."""
        self._files: dict[str, _StoredFile] = {}
        self._expired_paths: set[str] = set()
        self.downloaded: list[str] = []
        """The file paths whose bytes were served, in order (a refused download is not)."""
        self._queries: dict[str, _Json] = {}  # callback queries not answered yet, by id
        self._query_ids = itertools.count(4_400_000_000_000_001)
        self.callback_answers: dict[str, CallbackAnswer] = {}
        """Each answered callback query's answer, by the query's id."""
        self._failures: dict[str, deque[_Failure]] = {}
        self._arrival = asyncio.Event()  # replaced after each push, so waiters see new ones
        self._changes = Changes()  # notified on each call and update
        self.holds = Holds(self._changes)
        """Held answers, requests in flight and abandoned ones, by lower-cased method name."""
        self._without: dict[str, str] = {}  # lower-cased method -> result field left out
        self._round_trip = 0.0
        self._hang_ups: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._methods: dict[str, Callable[[dict[str, Any]], Any]] = {
            "getme": self._get_me,
            "deletewebhook": lambda params: True,
            "setwebhook": self._set_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "sendmessage": self._send_message,
            "editmessagetext": self._edit_message_text,
            "deletemessage": self._delete_message,
            "sendchataction": self._send_chat_action,
            "setmycommands": self._set_my_commands,
            "getmycommands": lambda params: list(self.commands),
            "deletemycommands": self._delete_my_commands,
            "getfile": self._get_file,
            "answercallbackquery": self._answer_callback_query,
        }

    # --- lifecycle ---

    @property
    def refused_429(self) -> list[Refusal]:
        """Every call answered 429 for a limit (``limits``), in order; scripted ones aside."""
        return self.rate_limits.refused

    @property
    def base_url(self) -> str:
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        return f"{self.url}/file/bot"

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        app.router.add_route("*", "/{tail:.*}", self._unknown_path)
        # A client that gives up on a long poll (PTB cancels it on stop) ends the handler too.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{bound_port}"

    async def close(self) -> None:
        """Answer every parked ``getUpdates`` (with what is pending), then stop the server."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        self._closing = True
        self._arrival.set()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- what people send ---

    def user_message(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        chat_type: str = "private",
        first_name: str = "Ann",
        message_id: int | None = None,
        reply_to_bot_message: int | None = None,
        entities: list[_Json] | None = None,
    ) -> _Json:
        """Queue a text message from a person; returns the queued Update."""
        message = self._user_message_base(chat_id, user_id, chat_type, first_name, message_id)
        message["text"] = text
        if entities:
            message["entities"] = [dict(entity) for entity in entities]
        if reply_to_bot_message is not None:
            message["reply_to_message"] = self._bot_message_stub(chat_id, reply_to_bot_message)
        return self.push_update({"message": message})

    def user_photo(
        self,
        chat_id: int,
        *,
        caption: str = "",
        file_bytes: bytes = DEFAULT_PHOTO,
        user_id: int | None = None,
        message_id: int | None = None,
        chat_type: str = "private",
        first_name: str = "Ann",
    ) -> _Json:
        """Queue a photo from a person; ``getFile`` and the file URL serve ``file_bytes``."""
        message = self._user_message_base(chat_id, user_id, chat_type, first_name, message_id)
        stored = self._store_file(file_bytes, "photos", "jpg")
        message["photo"] = [
            {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "width": 640,
                "height": 480,
                "file_size": len(file_bytes),
            }
        ]
        if caption:
            message["caption"] = caption
        return self.push_update({"message": message})

    def user_file(
        self,
        chat_id: int,
        data: bytes,
        *,
        kind: FileKind = "document",
        name: str = "",
        mime: str = "",
        seconds: int | None = None,
        caption: str = "",
        caption_entities: list[_Json] | None = None,
        file_size: int | None = None,
        user_id: int | None = None,
        message_id: int | None = None,
        chat_type: str = "private",
        first_name: str = "Ann",
        reply_to_bot_message: int | None = None,
    ) -> _Json:
        """Queue a message from a person carrying a file in the field ``kind`` (a voice note,
        a round video note, an audio file, a document, a video), with ``caption``; returns the
        queued Update. ``name`` and ``mime`` become ``file_name`` and ``mime_type`` (left out
        when empty, as Telegram may; a voice note has no name and is "audio/ogg" unless told,
        a video note has neither); ``seconds`` is the
        ``duration`` a voice note, video note, audio or video must have; ``file_size`` is the
        size Telegram states, in the message and ``getFile`` (``len(data)`` unless given: a
        test may state 30 MB without making the bytes). ``getFile`` and the file path serve
        ``data``."""
        if kind in _TIMED and seconds is None:
            raise ValueError(f"a {kind} needs its seconds (Telegram's duration)")
        folder, extension = _FOLDERS[kind]
        extension = name.rpartition(".")[2] if "." in name else extension
        stored = self._store_file(data, folder, extension, file_size)
        medium: _Json = {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": stored.file_size,
            **_MEDIUM_EXTRAS.get(kind, {}),
        }
        if kind in _TIMED:
            medium["duration"] = seconds
        if name and kind in _WITH_FILE_NAME:
            medium["file_name"] = name
        if kind == "voice" or (mime and kind != "video_note"):
            medium["mime_type"] = mime or "audio/ogg"  # Telegram's for every recorded note
        message = self._user_message_base(chat_id, user_id, chat_type, first_name, message_id)
        message[kind] = medium
        if caption:
            message["caption"] = caption
        if caption_entities:
            message["caption_entities"] = [dict(entity) for entity in caption_entities]
        if reply_to_bot_message is not None:
            message["reply_to_message"] = self._bot_message_stub(chat_id, reply_to_bot_message)
        return self.push_update({"message": message})

    def expire_file_path(self, file_id: str) -> None:
        """The file's path answers 404 from now on (a download link Telegram no longer
        serves), while ``getFile`` still answers with it."""
        self._expired_paths.add(self._files[file_id].file_path)

    def user_sticker(self, chat_id: int, *, emoji: str = "👍", user_id: int | None = None) -> _Json:
        """Queue a sticker from a person (no text, no caption); returns the queued Update."""
        message = self._user_message_base(chat_id, user_id, "private", "Ann", None)
        message["sticker"] = {
            "file_id": f"fake-sticker-{message['message_id']}",
            "file_unique_id": f"unique-sticker-{message['message_id']}",
            "type": "regular",
            "width": 512,
            "height": 512,
            "is_animated": False,
            "is_video": False,
            "emoji": emoji,
        }
        return self.push_update({"message": message})

    def press_button(
        self, chat_id: int, message_id: int, data: str, *, user_id: int | None = None
    ) -> _Json:
        """A person presses the inline keyboard button with ``data`` on a bot message: queue a
        ``callback_query`` update and return it. Raises ``KeyError`` when the message, as it
        stands now, has no such button (Telegram shows none to press)."""
        sent = self._sent.get(chat_id, {}).get(message_id)
        if sent is None or data not in sent.buttons:
            raise KeyError(f"no button {data!r} on message {message_id} in chat {chat_id}")
        presser = user_id if user_id is not None else chat_id
        query = {
            "id": str(next(self._query_ids)),
            "from": {"id": presser, "is_bot": False, "first_name": f"Person {presser}"},
            "message": self._message_json(sent),
            "chat_instance": f"instance-{chat_id}",
            "data": data,
        }
        self._queries[query["id"]] = query
        return self.push_update({"callback_query": query})

    def text_update(self, chat_id: int, text: str, *, user_id: int | None = None) -> _Json:
        """A person's text message as an update, not queued (for `post_update`)."""
        message = self._user_message_base(chat_id, user_id, "private", "Ann", None)
        message["text"] = text
        return {"message": message}

    def _numbered(self, raw: _Json) -> _Json:
        """`raw` with its `update_id` (the next one if missing), its chat and message known."""
        update = dict(raw)
        if "update_id" not in update:
            update["update_id"] = self._next_update_id
        self._next_update_id = max(self._next_update_id, update["update_id"] + 1)
        message = update.get("message")
        if isinstance(message, dict) and "chat" in message and "message_id" in message:
            chat_id = message["chat"]["id"]
            self._chats.setdefault(chat_id, message["chat"])
            self._take_message_id(chat_id, message["message_id"])
            self._user_messages.setdefault(chat_id, {})[message["message_id"]] = message
        return update

    async def post_update(self, url: str, raw: _Json, secret: str | None) -> int:
        """POST an update to a bot's webhook, as Telegram does (with `secret` as its
        secret-token header); the status the bot answered."""
        update = self._numbered(raw)
        headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=update, headers=headers) as response,
        ):
            return response.status

    def push_update(self, raw: _Json) -> _Json:
        """Queue any update as Telegram would send it; ``update_id`` is filled in if missing."""
        update = self._numbered(raw)
        self._updates.append(update)
        self._updates.sort(key=lambda queued: queued["update_id"])
        self._arrival.set()
        self._arrival = asyncio.Event()
        self._notify()
        return update

    @property
    def confirmed_offset(self) -> int:
        """The highest ``offset`` a ``getUpdates`` has acknowledged (0 before any)."""
        return self._confirmed_offset

    # --- what the bot did ---

    def calls_to(self, method: str) -> list[Call]:
        wanted = method.lower()  # Telegram's method names are case-insensitive
        return [call for call in self.calls if call.method.lower() == wanted]

    def sent(self, chat_id: int | str) -> list[SentMessage]:
        """The bot's messages in that chat, in send order, as they stand now."""
        return list(self._sent.get(chat_id, {}).values())

    async def wait_until(
        self,
        condition: Callable[[], object],
        timeout: float | None = None,  # noqa: ASYNC109  (None: `patience.deadline`)
        what: str | None = None,
    ) -> None:
        """Return once ``condition()`` is true, re-checking on every call and update received.

        Raises ``AssertionError`` naming ``what`` (else the condition's source) on timeout.
        """
        await self._changes.until(condition, timeout, what, self._state)

    def _state(self) -> str:
        return f"last calls: {[call.method for call in self.calls[-10:]]}"

    # --- scripted failures ---

    def fail_next(
        self,
        method: str,
        *,
        status: int = 429,
        retry_after: float = 1,
        description: str | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with an error, in order.

        429 is a flood wait ("Too Many Requests: retry after N" with ``parameters``); any other
        status needs the ``description`` Telegram would send, e.g. "Bad Request: chat not found".
        """
        if status == 429:
            failure = _Failure(429, f"Too Many Requests: retry after {retry_after:g}", retry_after)
        elif description is None:
            raise ValueError(f"fail_next({method!r}, status={status}) needs a description")
        else:
            failure = _Failure(status, description)
        if times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        self._failures.setdefault(method.lower(), deque()).extend([failure] * times)

    def answer_without(self, method: str, key: str) -> None:
        """From now on answer ``method`` as usual (it takes effect) but leave ``key`` out of
        the result, as a broken proxy or a test double might."""
        self._without[method.lower()] = key

    def hang_up_after(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` take effect, and their connection is cut
        before the answer (`holds.hang_up`)."""
        self._hang_ups[method.lower()] += times

    def answer_after(self, seconds: float) -> None:
        """From now on answer every Bot API call but getUpdates `seconds` late, as a real
        round trip to Telegram takes (for benchmarks; a test orders by holds, not time)."""
        self._round_trip = seconds

    # --- HTTP ---

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        arrived = self.rate_limits.clock()
        params: dict[str, Any] = {}
        try:
            params = await _read_params(request)
            if request.match_info["token"] != self.token:
                raise _ApiError(401, "Unauthorized")
            failures = self._failures.get(method.lower())
            if failures:
                failure = failures.popleft()
                raise _ApiError(failure.status, failure.description, failure.retry_after)
            refusal = self.rate_limits.admit(method, limit_windows(method, params), arrived)
            if refusal is not None:
                wait = whole_seconds(refusal.retry_after)
                raise _ApiError(429, f"Too Many Requests: retry after {wait}", wait)
            if method.lower() == "getupdates":
                async with self.holds.answering(request, "getupdates", params):
                    return await self._get_updates(method, params)
            handler = self._methods.get(method.lower())
            if handler is None:
                raise _ApiError(404, "Not Found")
            async with self.holds.answering(request, method.lower(), params):
                if self._round_trip:
                    await asyncio.sleep(self._round_trip)
                result = handler(params)
            if self._hang_ups[method.lower()] > 0:
                self._hang_ups[method.lower()] -= 1
                self._record(Call(method, params, time.time()))
                return hang_up(request)
            if method.lower() in self._without and isinstance(result, dict):
                result = {k: v for k, v in result.items() if k != self._without[method.lower()]}
        except _ApiError as error:
            body = error.body()
            self._record(Call(method, params, time.time(), body))
            return web.json_response(body, status=error.status)
        self._record(Call(method, params, time.time()))
        return web.json_response({"ok": True, "result": result})

    async def _download(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.json_response(_ApiError(401, "Unauthorized").body(), status=401)
        path = request.match_info["path"]
        stored = next((f for f in self._files.values() if f.file_path == path), None)
        if stored is None or path in self._expired_paths:
            return web.json_response(_ApiError(404, "Not Found").body(), status=404)
        self.downloaded.append(path)
        self._notify()
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _unknown_path(self, request: web.Request) -> web.Response:
        return web.json_response(_ApiError(404, "Not Found").body(), status=404)

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self._notify()

    def _notify(self) -> None:
        self._changes.notify()

    # --- getUpdates ---

    async def _get_updates(self, method: str, params: dict[str, Any]) -> web.Response:
        offset = _int_param(params, "offset", 0)
        limit = min(max(_int_param(params, "limit", 100), 1), 100)
        timeout = min(max(_number_param(params, "timeout"), 0.0), MAX_POLL_SECONDS)
        self._confirm(offset)
        self._record(Call(method, params, time.time()))
        if not self._updates and timeout > 0 and not self._closing:
            arrival = self._arrival
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await arrival.wait()
        answer = self._updates[:limit]
        self.handed_out += [update["update_id"] for update in answer]
        self._notify()
        return web.json_response({"ok": True, "result": answer})

    def _confirm(self, offset: int) -> None:
        if offset > 0:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
            self._confirmed_offset = max(self._confirmed_offset, offset)
        elif offset < 0:  # "-N": keep the last N, forget everything before them
            forgotten, self._updates = self._updates[:offset], self._updates[offset:]
            if forgotten:
                self._confirmed_offset = max(self._confirmed_offset, forgotten[-1]["update_id"] + 1)

    # --- methods ---

    def _get_me(self, params: Mapping[str, Any]) -> _Json:
        return {
            **self.bot_user,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _set_webhook(self, params: Mapping[str, Any]) -> bool:
        self.webhook = {"url": str(params.get("url", "")), "secret": params.get("secret_token")}
        return True

    def _get_webhook_info(self, params: Mapping[str, Any]) -> _Json:
        return {"url": "", "has_custom_certificate": False, "pending_update_count": 0}

    def _send_message(self, params: Mapping[str, Any]) -> _Json:
        chat_id = _chat_key(params.get("chat_id", ""))
        text, parse_mode, rendered = _checked_text(params)
        reply_to = self._reply_target(chat_id, params.get("reply_parameters"))
        reply_markup = _inline_keyboard(params)
        sent = SentMessage(
            chat_id=chat_id,
            message_id=self._take_message_id(chat_id),
            text=text,
            parse_mode=parse_mode,
            visible=rendered.visible,
            entities=rendered.entities,
            reply_to=reply_to,
            reply_markup=reply_markup,
        )
        self._sent.setdefault(chat_id, {})[sent.message_id] = sent
        return self._message_json(sent)

    def _edit_message_text(self, params: Mapping[str, Any]) -> _Json:
        if params.get("inline_message_id"):
            raise _bad_request("message to edit not found")
        chat_id = _chat_key(params.get("chat_id", ""))
        message_id = _int_param(params, "message_id", 0)
        text, parse_mode, rendered = _checked_text(params)
        current = self._sent.get(chat_id, {}).get(message_id)
        if current is None:
            if message_id in self._user_messages.get(chat_id, {}):
                raise _bad_request("message can't be edited")
            raise _bad_request("message to edit not found")
        reply_markup = _inline_keyboard(params)
        if (rendered.visible, rendered.entities, reply_markup) == (
            current.visible,
            current.entities,
            current.reply_markup,
        ):
            raise _ApiError(400, NOT_MODIFIED)
        edited = replace(
            current,
            text=text,
            parse_mode=parse_mode,
            visible=rendered.visible,
            entities=rendered.entities,
            reply_markup=reply_markup,
            edits=[*current.edits, rendered.visible],
        )
        self._sent[chat_id][message_id] = edited
        return {**self._message_json(edited), "edit_date": int(time.time())}

    def _delete_message(self, params: Mapping[str, Any]) -> bool:
        chat_id = _chat_key(params.get("chat_id", ""))
        message_id = _int_param(params, "message_id", 0)
        if self._sent.get(chat_id, {}).pop(message_id, None) is None:
            raise _bad_request("message to delete not found")
        self.deleted.append(message_id)
        return True

    def _send_chat_action(self, params: Mapping[str, Any]) -> bool:
        _chat_key(params.get("chat_id", ""))
        if params.get("action") not in CHAT_ACTIONS:
            raise _bad_request("wrong parameter action in request")
        return True

    def _answer_callback_query(self, params: Mapping[str, Any]) -> bool:
        query = self._queries.pop(str(params.get("callback_query_id", "")), None)
        if query is None:
            raise _ApiError(400, QUERY_GONE)
        text = params.get("text")
        if text is not None and len(str(text)) > MAX_CALLBACK_ANSWER_CHARS:
            self._queries[query["id"]] = query  # refused: it may still be answered
            raise _bad_request("MESSAGE_TOO_LONG")
        answer = CallbackAnswer(None if text is None else str(text), bool(params.get("show_alert")))
        self.callback_answers[query["id"]] = answer
        return True

    def _set_my_commands(self, params: Mapping[str, Any]) -> bool:
        commands = params.get("commands")
        if not isinstance(commands, list):
            raise _bad_request('parameter "commands" is required')
        self.commands = [dict(command) for command in commands]
        return True

    def _delete_my_commands(self, params: Mapping[str, Any]) -> bool:
        self.commands = []
        return True

    def _get_file(self, params: Mapping[str, Any]) -> _Json:
        stored = self._files.get(str(params.get("file_id", "")))
        if stored is None:
            raise _bad_request("invalid file_id")
        if stored.file_size > MAX_DOWNLOAD_BYTES:
            raise _ApiError(400, FILE_TOO_BIG)
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": stored.file_size,
            "file_path": stored.file_path,
        }

    # --- helpers ---

    def _take_message_id(self, chat_id: int | str, explicit: int | None = None) -> int:
        """Message ids count per chat, shared by the person's and the bot's messages."""
        last = self._last_message_id.get(chat_id, 0)
        message_id = last + 1 if explicit is None else explicit
        self._last_message_id[chat_id] = max(last, message_id)
        return message_id

    def _chat(self, chat_id: int | str) -> _Json:
        known = self._chats.get(chat_id)
        if known is not None:
            return dict(known)
        if isinstance(chat_id, str):
            return {"id": -1001000000000, "type": "channel", "username": chat_id[1:]}
        if chat_id > 0:
            return {"id": chat_id, "type": "private"}
        kind = "supergroup" if str(chat_id).startswith("-100") else "group"
        return {"id": chat_id, "type": kind, "title": "Test group"}

    def _user_message_base(
        self,
        chat_id: int,
        user_id: int | None,
        chat_type: str,
        first_name: str,
        message_id: int | None,
    ) -> _Json:
        if user_id is None:
            user_id = chat_id if chat_type == "private" else DEFAULT_GROUP_USER_ID
        chat: _Json = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        else:
            chat["title"] = "Test group"
        self._chats[chat_id] = chat
        return {
            "message_id": self._take_message_id(chat_id, message_id),
            "date": int(time.time()),
            "chat": dict(chat),
            "from": {"id": user_id, "is_bot": False, "first_name": first_name},
        }

    def _bot_message_stub(self, chat_id: int, message_id: int) -> _Json:
        sent = self._sent.get(chat_id, {}).get(message_id)
        if sent is not None:
            return self._message_json(sent)
        return {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": self._chat(chat_id),
            "from": dict(self.bot_user),
            "text": "",
        }

    def _reply_target(self, chat_id: int | str, reply_parameters: Any) -> int | None:
        if not isinstance(reply_parameters, dict) or "message_id" not in reply_parameters:
            return None
        message_id = reply_parameters["message_id"]
        target_chat = _chat_key(reply_parameters.get("chat_id", chat_id))
        known = message_id in self._user_messages.get(target_chat, {}) or message_id in (
            self._sent.get(target_chat, {})
        )
        if known:
            return message_id
        if reply_parameters.get("allow_sending_without_reply"):
            return None
        raise _bad_request("message to be replied not found")

    def _message_json(self, sent: SentMessage) -> _Json:
        message: _Json = {
            "message_id": sent.message_id,
            "date": int(time.time()),
            "chat": self._chat(sent.chat_id),
            "from": dict(self.bot_user),
            "text": sent.visible,
        }
        if sent.entities:
            message["entities"] = [dict(entity) for entity in sent.entities]
        if sent.reply_markup is not None:
            message["reply_markup"] = sent.reply_markup
        if sent.reply_to is not None:
            replied = self._user_messages.get(sent.chat_id, {}).get(sent.reply_to)
            if replied is None and sent.reply_to in self._sent.get(sent.chat_id, {}):
                replied = self._message_json(self._sent[sent.chat_id][sent.reply_to])
                replied.pop("reply_to_message", None)  # Telegram nests one level only
            if replied is not None:
                message["reply_to_message"] = replied
        return message

    def _store_file(
        self, data: bytes, folder: str, extension: str, file_size: int | None = None
    ) -> _StoredFile:
        number = len(self._files) + 1
        stored = _StoredFile(
            file_id=f"fake-{folder}-{number}",
            file_unique_id=f"unique-{folder}-{number}",
            file_path=f"{folder}/file_{number}.{extension}",
            data=data,
            file_size=len(data) if file_size is None else file_size,
        )
        self._files[stored.file_id] = stored
        return stored
