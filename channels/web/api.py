"""What the web chat answers over HTTP: the page, the sign-in, and the API the page talks to.

Every request passes the checks of `channels.web.security` first (its Host, its Origin, a POST's
`X-Kaiwa` header) and every answer carries its headers (a strict Content-Security-Policy, no
caching of the page or the API). Who is asking is `security.People`'s: the operator by the signed
session cookie, a team's people by the name their trusted proxy gives. A request from no one gets
the sign-in page, a person not allowed the refusal page (their messages reach the dispatcher,
which refuses them as on any platform), and a conversation that is not the person's is answered
as if it did not exist (never shown, never acted on).

The routes are exact paths (the shared server matches method and path), so what varies goes in
the JSON body or the query string:
- `GET /` the page; `GET /login?key=` a one-time link exchanged for the cookie (the key leaves
  the address bar by a redirect); `GET /static/...` the page's files.
- `GET /api/conversations`, `POST /api/conversations` (a new one).
- `POST /api/messages` `{conversation, text, client_id, images, files}`: the person's message.
  `client_id` is the page's own id for it and the message's id for the dispatcher, so a page
  that sends it again (its answer was lost) sends the same message: shown once, answered once,
  with the files kept the first time. It answers only once the message is recorded (503 when
  the store refused it, and the page tries again). Up to `uploads.MAX_IMAGES` pictures may come
  with it (`images`, base64; PNG, JPEG, GIF or WebP, told by their bytes, never by what the
  page says), and up to `uploads.MAX_FILES` files of any kind (`files`, `[{name, type, data}]`,
  data in base64), each refused past its cap with the sizes in words (`channels.web.uploads`).
  Both are kept with the bubble, unless the person may not use Kaiwa (the dispatcher refuses
  them, and a stranger is left no storage), and served back to the person alone: a picture
  inline (`GET /api/image?id=`), a file as a download (`GET /api/file?id=`). The dispatcher
  gets the pictures' bytes and the files as `ChannelMessage.attachments` (`source`: the file's
  id), which the core fetches through `WebChannel.download`.
- `POST /api/press` `{conversation, command}`: a button's press, delivered as that command.
  Its answer is for the presser alone, as a platform's private answer is
  (`channels.presses`): it comes back in the response (`answer`: text, html and buttons), for
  the page that pressed to show apart from the conversation, never as a bubble everyone sees.
- `GET /api/events?conversation=`: Server-Sent Events of the person's list and of the
  conversation the page has open (none: the list alone), resumed by `Last-Event-ID`
  (`channels.web.board`); a page that opens another conversation opens another stream.

Server-Sent Events rather than a WebSocket: the stream only goes one way (what the person does
is a POST, which a CSRF-safe check covers like any other), the browser's `EventSource`
reconnects by itself and sends `Last-Event-ID`, which is all a resume needs, and it passes
proxies as plain HTTP.
"""

import asyncio
import contextlib
import html
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from channels.places import WebPlace
from channels.presses import Press, pressing
from channels.web import markup, security, uploads
from channels.web.board import Board, Entry
from channels.web.streams import Event
from core.channel import Attachment, Button, ChannelMessage, Deliver
from core.errors import StoreError
from core.text import size_in_words

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
STATIC_FILES = {
    "/static/app.js": ("app.js", "text/javascript"),
    "/static/app.css": ("app.css", "text/css"),
}
PING_SECONDS = 15.0
MAX_BODY = 256 * 1024
MAX_MESSAGE_BODY = MAX_BODY + uploads.MOST_ENCODED
"""A message's body: its text, and its pictures and files at their caps, base64 in JSON (about
126 MB)."""
MESSAGE_TOO_LARGE = (
    f"a message takes files up to {size_in_words(uploads.MAX_FILE_BYTES)} each and "
    f"{size_in_words(uploads.MAX_FILES_BYTES)} together, and {uploads.MAX_IMAGES} pictures "
    f"up to {size_in_words(uploads.MAX_IMAGE_BYTES)} each: send fewer with this one"
)
READ_CHUNK = 1 << 16
SIGN_IN = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>Kaiwa: sign in</title>"
    "<body><main><h1>Kaiwa</h1><p>{what}</p></main></body></html>"
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebApi:
    """The handlers, over one board, for the people `people` signs in."""

    def __init__(
        self,
        board: Board,
        people: security.People,
        links: security.Links,
        host: str,
        allowed_hosts: Sequence[str],
    ) -> None:
        self._board = board
        self._people = people
        self._links = links
        self._host = host
        self._allowed_hosts = allowed_hosts
        self.port = 0
        """The port served, once known (a Host header must name it)."""
        self._limiter = security.LoginLimiter()
        self._deliver: Deliver | None = None
        self._code_css = markup.code_css()

    def routes(self, deliver: Deliver) -> dict[tuple[str, str], Handler]:
        self._deliver = deliver
        routes: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self._page,
            ("GET", "/login"): self._login,
            ("GET", "/static/code.css"): self._css,
            ("GET", "/api/conversations"): self._conversations,
            ("POST", "/api/conversations"): self._new_conversation,
            ("POST", "/api/messages"): self._message,
            ("POST", "/api/press"): self._press,
            ("GET", "/api/events"): self._events,
            ("GET", "/api/image"): self._image,
            ("GET", "/api/file"): self._file,
        }
        routes |= {("GET", path): self._static for path in STATIC_FILES}
        return {route: self._checked(handler, route[0]) for route, handler in routes.items()}

    def _checked(self, handler: Handler, method: str) -> Handler:
        async def answer(request: web.Request) -> web.StreamResponse:
            refusal = security.check_request(
                request,
                served_host=self._host,
                served_port=self.port,
                allowed_hosts=self._allowed_hosts,
                post=method == "POST",
            )
            if refusal is not None:
                return refusal
            response = await handler(request)
            if not response.prepared:
                security.with_headers(response, page=not request.path.startswith("/static/"))
            return response

        return answer

    # -- the page and signing in -----------------------------------------------------------------

    async def _page(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _sign_in_page(401, self._sign_in_text())
        if not self._people.may_use(person):
            what = (
                f"You are signed in as <strong>{html.escape(person)}</strong>, who may not use "
                "this Kaiwa: ask its operator to add you to "
                "<code>[channels.web].allowed_users</code>."
            )
            return _sign_in_page(403, what)
        return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html"})

    def _sign_in_text(self) -> str:
        link = (
            "the link Kaiwa printed when it started (<code>web chat: …</code>), or run "
            "<code>kaiwa web-link</code> for a new one."
        )
        if self._people.team:
            return f"Open Kaiwa through your team's sign-in (its proxy). The operator: open {link}"
        return f"Open {link}"

    async def _login(self, request: web.Request) -> web.StreamResponse:
        client = self._people.client(request)
        wait = self._limiter.allowed(client)
        if wait is not None:
            return web.Response(
                status=429,
                text=SIGN_IN.format(what="Too many wrong links from here: try again later."),
                content_type="text/html",
                headers={"Retry-After": str(int(wait) + 1)},
            )
        if not self._links.redeem(request.query.get("key", "")):
            self._limiter.failed(client)
            what = (
                "This link is not valid (it may have been used already): run "
                "<code>kaiwa web-link</code> for a new one."
            )
            return _sign_in_page(403, what)
        logger.info("web chat: the operator signed in from %s", client)
        response = web.Response(status=303, headers={"Location": "/"})
        self._people.sign_in_operator(response)
        return response

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name, kind = STATIC_FILES[request.path]
        return web.FileResponse(STATIC / name, headers={"Content-Type": kind})

    async def _css(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=self._code_css, content_type="text/css")

    # -- the API ---------------------------------------------------------------------------------

    async def _conversations(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        entries = self._board.conversations(person)
        return web.json_response({"conversations": [_entry(each) for each in entries]})

    async def _new_conversation(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        return web.json_response({"id": self._board.new_conversation(person).id})

    async def _message(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        body = await _json(request, MAX_MESSAGE_BODY, MESSAGE_TOO_LARGE)
        conversation, text = _text(body, "conversation"), _text(body, "text")
        client_id = _text(body, "client_id")
        if not self._owns(person, conversation):
            return _missing()
        pictures, files = uploads.pictures(body.get("images")), uploads.files(body.get("files"))
        if isinstance(pictures, str) or isinstance(files, str):
            return _refused(pictures if isinstance(pictures, str) else str(files))
        if not (text.strip() or pictures or files) or not client_id or len(client_id) > 64:
            return _refused("a message needs text, a picture or a file, and a client_id")
        if not self._people.may_use(person):
            pictures, files = (), ()  # the dispatcher refuses them: a stranger gets no storage
        bubble_id = f"p-{client_id}"
        bubble = self._board.bubble(bubble_id) or self._board.post(
            conversation, "person", text, bubble_id=bubble_id, images=pictures, files=files
        )
        if bubble.conversation != conversation:
            return _refused("that client_id is another message's: send it with a new one")
        images = tuple(each.data for each in pictures)
        attachments = tuple(each.attachment() for each in bubble.files)
        return await self._delivered(person, conversation, client_id, text, images, attachments)

    async def _press(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        body = await _json(request)
        conversation, command = _text(body, "conversation"), _text(body, "command")
        if not self._owns(person, conversation):
            return _missing()
        if not command.startswith("/"):
            return web.json_response({"error": "a press carries a command"}, status=400)
        answers: list[dict[str, Any]] = []

        async def answer(text: str, buttons: Sequence[Button]) -> None:
            answers.append(await _answer(text, buttons))

        press = Press(WebPlace(person, conversation).key, answer)
        with pressing(press):
            delivered = await self._delivered(
                person, conversation, f"press-{secrets.token_hex(8)}", command
            )
        if delivered.status != 202:
            return delivered
        return web.json_response({"ok": True, "answer": answers[0] if answers else None})

    async def _image(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        found = self._board.uploads.image(request.query.get("id", ""))
        if found is None or not self._owns(person, found[0]):
            return _missing("picture")
        picture = found[1]
        return web.Response(
            body=picture.data,
            content_type=picture.type,
            headers={"Content-Disposition": "inline", "Cache-Control": "private, max-age=86400"},
        )

    async def _file(self, request: web.Request) -> web.StreamResponse:
        """A file a person sent, for them alone, always as a download of bytes: whatever it
        says it is, it is never shown in the page's origin."""
        person = self._person(request)
        if person is None:
            return _unsigned()
        found = self._board.uploads.file(request.query.get("id", ""))
        if found is None or not self._owns(person, found[0]):
            return _missing("file")
        data = self._board.uploads.data(found[1].id)
        if data is None:
            return _missing("file")
        return web.Response(
            body=data,
            content_type=uploads.UNKNOWN_TYPE,
            headers={"Content-Disposition": uploads.disposition(found[1].name)},
        )

    async def _delivered(
        self,
        person: str,
        conversation: str,
        message_id: str,
        text: str,
        images: tuple[bytes, ...] = (),
        attachments: tuple[Attachment, ...] = (),
    ) -> web.Response:
        assert self._deliver is not None
        message = ChannelMessage(
            platform=WebPlace.platform,
            place=WebPlace(person, conversation).key,
            message_id=message_id,
            author_id=person,
            text=text,
            author_name=person,
            images=images,
            redeliverable=True,
            attachments=attachments,
        )
        try:
            await self._deliver(message)
        except StoreError as exc:
            logger.warning(
                "web chat: a message was not recorded (%s); the page sends it again", exc
            )
            return web.json_response(
                {"error": "Kaiwa cannot save messages right now; it is sent again shortly"},
                status=503,
            )
        return web.json_response({"ok": True}, status=202)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        person = self._person(request)
        if person is None:
            return _unsigned()
        last = _number(request.headers.get("Last-Event-ID") or request.query.get("last"))
        conversation = request.query.get("conversation") or None
        if conversation is not None and not self._owns(person, conversation):
            return _missing()
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        security.with_headers(response, page=True)
        await response.prepare(request)
        following = self._board.streams.subscribe(person, conversation)
        with following as live, contextlib.suppress(ConnectionResetError):
            sent = last
            for event in self._board.since(person, last, conversation):
                sent = await _send(response, event, sent)
            while (event := await _next(live, response)) is not None:
                sent = await _send(response, event, sent)
        return response

    # -- inside ----------------------------------------------------------------------------------

    def _person(self, request: web.Request) -> str | None:
        return self._people.of(request)

    def _owns(self, person: str, conversation: str) -> bool:
        entry = self._board.entry(conversation)
        return entry is not None and entry.person == person


async def _next(live: "asyncio.Queue[Event | None]", response: web.StreamResponse) -> Event | None:
    """The next change for the stream, with a comment line for each quiet `PING_SECONDS` (so a
    proxy keeps it open, and a page that went away is noticed); None: the stream ends."""
    while True:
        try:
            async with asyncio.timeout(PING_SECONDS):
                return await live.get()
        except TimeoutError:
            await response.write(b": ping\n\n")


async def _send(response: web.StreamResponse, event: Event, sent: int) -> int:
    """Write `event` unless the stream sent it already (a change seen live and in `since`)."""
    kind, seq, data = event
    if seq <= sent:
        return sent
    if kind == "bubble":
        data = {**data, "html": await _html(data["text"])}
    payload = json.dumps(data, separators=(",", ":"))
    await response.write(f"id: {seq}\nevent: {kind}\ndata: {payload}\n\n".encode())
    return seq


_RENDERED: OrderedDict[str, str] = OrderedDict()
RENDERED_KEPT = 256


async def _html(text: str) -> str:
    """A bubble's text as the page shows it, rendered once however many pages show it, on a
    thread (a long reply takes markdown-it-py a noticeable time, which the event loop must not
    wait out)."""
    html = _RENDERED.get(text)
    if html is None:
        html = await asyncio.to_thread(markup.to_html, text)
        _RENDERED[text] = html
        if len(_RENDERED) > RENDERED_KEPT:
            _RENDERED.popitem(last=False)
    _RENDERED.move_to_end(text)
    return html


async def _answer(text: str, buttons: Sequence[Button]) -> dict[str, Any]:
    """A press's private answer as the page shows it."""
    listed = [{"label": button.label, "command": button.command} for button in buttons]
    return {"text": text, "html": await _html(text), "buttons": listed}


def _entry(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "title": entry.title,
        "updated": entry.updated,
        "writing": entry.writing,
    }


async def _json(
    request: web.Request, most: int = MAX_BODY, too_large: str = "the request is too large"
) -> dict[str, Any]:
    """The request's JSON object, read whole up to `most` bytes, or refused (413, saying
    `too_large`) once it is past them (the shared server's own cap is for the platforms' small
    posts; a message with pictures and files is larger). Read chunk by chunk: one read gives
    only what has arrived so far."""
    raw = bytearray()
    if (request.content_length or 0) <= most:
        async for chunk in request.content.iter_chunked(READ_CHUNK):
            raw += chunk
            if len(raw) > most:
                break
    size = max(request.content_length or 0, len(raw))
    if size > most:
        words = f"{too_large} (this one is {size_in_words(size)})"
        raise web.HTTPRequestEntityTooLarge(max_size=most, actual_size=size, text=words)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(text="the body must be JSON") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    return body


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    return value if isinstance(value, str) else ""


def _number(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def _sign_in_page(status: int, what: str) -> web.Response:
    return web.Response(status=status, text=SIGN_IN.format(what=what), content_type="text/html")


def _unsigned() -> web.Response:
    return web.json_response({"error": "not signed in: open the link Kaiwa printed"}, status=401)


def _refused(why: str) -> web.Response:
    return web.json_response({"error": why}, status=400)


def _missing(what: str = "conversation") -> web.Response:
    return web.json_response({"error": f"no such {what}"}, status=404)
