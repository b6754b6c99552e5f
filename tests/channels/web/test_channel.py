"""The web chat through the whole turn path, over real HTTP on 127.0.0.1: the page's API as a
browser uses it (aiohttp's client standing in for the page), the fake Ollama as the model.

Every change reaches a page as a Server-Sent Event (`WebClient.events`); the tests wait on the
events themselves, and on the fake's pauses, never on time.
"""

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from channels.web.channel import WebChannel
from tests.fakes.ollama import Pause, Text
from tests.fakes.patience import deadline
from tests.harness import Bot


@dataclass
class WebClient:
    """A page's side: its session (the cookie jar) and the origin it speaks from."""

    session: aiohttp.ClientSession
    url: str
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every bubble seen, by id, as its latest event left it."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Origin": self.url, "X-Kaiwa": "1"}

    async def post(self, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        async with self.session.post(self.url + path, json=body, headers=self.headers) as answer:
            await answer.read()
            return answer

    async def new_conversation(self) -> str:
        async with self.session.post(
            self.url + "/api/conversations", json={}, headers=self.headers
        ) as answer:
            assert answer.status == 200, await answer.text()
            return str((await answer.json())["id"])

    async def say(self, conversation: str, text: str, client_id: str) -> int:
        body = {"conversation": conversation, "text": text, "client_id": client_id}
        return (await self.post("/api/messages", body)).status

    async def events(
        self, conversation: str | None = None, last: int | None = None
    ) -> AsyncIterator[tuple[int, str, Any]]:
        """The stream following `conversation`, as `EventSource` reads it: (id, kind, data)
        each."""
        headers = {"Last-Event-ID": str(last)} if last is not None else {}
        query = {"conversation": conversation} if conversation else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=deadline())
        async with self.session.get(
            self.url + "/api/events", params=query, headers=headers, timeout=timeout
        ) as stream:
            assert stream.status == 200, await stream.text()
            fields: dict[str, str] = {}
            async for raw in stream.content:
                line = raw.decode().rstrip("\n")
                if line.startswith(":"):
                    continue
                if line:
                    name, _, value = line.partition(": ")
                    fields[name] = value
                    continue
                if not fields:  # the blank line after a comment
                    continue
                data = json.loads(fields["data"])
                if fields["event"] == "bubble":
                    self.seen[data["id"]] = data
                yield int(fields["id"]), fields["event"], data
                fields = {}

    async def until(self, stream: AsyncIterator[tuple[int, str, Any]], condition: Any) -> None:
        async with asyncio.timeout(deadline()):
            async for _ in stream:
                if condition():
                    return

    def bubbles(self, conversation: str) -> list[tuple[str, str, bool]]:
        return [
            (b["role"], b["text"], b["streaming"])
            for b in sorted(self.seen.values(), key=lambda b: (b["at"], b["seq"]))
            if b["conversation"] == conversation and not b["deleted"]
        ]


def browser_session() -> aiohttp.ClientSession:
    """A client that keeps cookies from an IP address, as a browser does (aiohttp's jar does
    not, by default)."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def signed_in(channel: WebChannel) -> AsyncIterator[WebClient]:
    async with browser_session() as session:
        async with session.get(channel.sign_in_link(), allow_redirects=False) as answer:
            assert answer.status == 303 and answer.headers["Location"] == "/"
        yield WebClient(session, channel.url)


@pytest.fixture
async def client(web: tuple[Bot, WebChannel]) -> AsyncIterator[WebClient]:
    async for each in signed_in(web[1]):
        yield each


async def test_a_message_is_answered_in_a_streaming_bubble_that_ends_without_stop(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    bot, _ = web
    bot.ollama.script(Text("Sunny"), Pause("mid"), Text(" all day."))
    conversation = await client.new_conversation()
    stream = client.events(conversation)
    assert await client.say(conversation, "What is the weather?", "c1") == 202

    await client.until(stream, lambda: ("kaiwa", "Sunny", True) in client.bubbles(conversation))
    bot.ollama.release("mid")
    await client.until(
        stream, lambda: ("kaiwa", "Sunny all day.", False) in client.bubbles(conversation)
    )

    assert client.bubbles(conversation) == [
        ("person", "What is the weather?", False),
        ("kaiwa", "Sunny all day.", False),
    ]
    reply = next(b for b in client.seen.values() if b["role"] == "kaiwa")
    assert reply["buttons"] == [] and reply["html"] == "<p>Sunny all day.</p>\n"
    await stream.aclose()


async def test_a_message_sent_twice_by_a_page_is_shown_and_answered_once(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    """A page whose POST's answer was lost sends it again with the same client id."""
    bot, channel = web
    bot.ollama.script(Text("Once."))
    conversation = await client.new_conversation()
    assert await client.say(conversation, "hello", "same") == 202
    assert await client.say(conversation, "hello", "same") == 202
    await bot.runner.wait_idle(f"web:operator:{conversation}")

    shown = [(b.role, b.text) for b in channel.board.bubbles(conversation)]
    assert shown == [("person", "hello"), ("kaiwa", "Once.")]
    assert len(bot.ollama.requests) == 1


async def test_a_stream_resumed_after_a_drop_shows_every_bubble_once_and_goes_on(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    bot, _ = web
    bot.ollama.script(Text("Half"), Pause("mid"), Text(" and whole."))
    conversation = await client.new_conversation()
    stream = client.events(conversation)
    await client.say(conversation, "go", "c1")
    await client.until(stream, lambda: ("kaiwa", "Half", True) in client.bubbles(conversation))
    last = max(b["seq"] for b in client.seen.values())
    await stream.aclose()  # the connection drops mid-reply

    bot.ollama.release("mid")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    resumed = client.events(conversation, last)
    await client.until(
        resumed,
        lambda: ("kaiwa", "Half and whole.", False) in client.bubbles(conversation),
    )
    assert client.bubbles(conversation) == [
        ("person", "go", False),
        ("kaiwa", "Half and whole.", False),
    ]
    await resumed.aclose()


async def test_stop_pressed_keeps_the_partial_marked_stopped(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Half an answer"), Pause("forever"), Text(" never"))
    conversation = await client.new_conversation()
    stream = client.events(conversation)
    await client.say(conversation, "talk", "c1")
    await client.until(
        stream, lambda: ("kaiwa", "Half an answer", True) in client.bubbles(conversation)
    )
    streaming = next(b for b in client.seen.values() if b["role"] == "kaiwa")
    assert streaming["buttons"] == [{"label": "Stop", "command": "/stop"}]

    answer = await client.post("/api/press", {"conversation": conversation, "command": "/stop"})
    assert answer.status == 200
    assert (await answer.json())["answer"]["text"] == "Stopped.", "the presser's own answer"
    await client.until(
        stream,
        lambda: any(
            role == "kaiwa" and not live and "(stopped)" in text
            for role, text, live in client.bubbles(conversation)
        ),
    )
    (kept,) = [b.text for b in channel.board.bubbles(conversation) if b.role == "kaiwa"]
    assert kept.startswith("Half an answer")
    assert [b.role for b in channel.board.bubbles(conversation)] == ["person", "kaiwa"]
    await stream.aclose()


async def test_a_reply_with_markup_and_script_shows_as_text(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    bot, _ = web
    hostile = "<script>alert(1)</script> <img src=x onerror=alert(2)> [see](javascript:alert(3))"
    bot.ollama.script(Text(hostile))
    conversation = await client.new_conversation()
    await client.say(conversation, "hi", "c1")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    stream = client.events(conversation)
    await client.until(stream, lambda: any(b["role"] == "kaiwa" for b in client.seen.values()))

    (reply,) = [b for b in client.seen.values() if b["role"] == "kaiwa"]
    assert "<script" not in reply["html"] and "onerror" not in reply["html"].replace(
        "onerror=alert(2)", ""
    )
    assert 'href="javascript' not in reply["html"].lower()
    assert "&lt;script&gt;" in reply["html"]
    await stream.aclose()


async def test_what_is_not_the_pages_own_is_refused(web: tuple[Bot, WebChannel]) -> None:
    _, channel = web
    theirs = channel.board.new_conversation("ann").id
    async for client in signed_in(channel):
        body = {"conversation": theirs, "text": "hi", "client_id": "x"}
        assert (await client.post("/api/messages", body)).status == 404
        async with client.session.post(
            client.url + "/api/conversations", json={}, headers={"X-Kaiwa": "1"}
        ) as no_origin:
            assert no_origin.status == 403
        async with client.session.post(
            client.url + "/api/conversations",
            json={},
            headers={"Origin": "http://evil.example", "X-Kaiwa": "1"},
        ) as foreign:
            assert foreign.status == 403
        async with client.session.get(
            client.url + "/api/conversations", headers={"Host": "evil.example"}
        ) as rebound:
            assert rebound.status == 421
        async with client.session.get(client.url + "/api/conversations") as listed:
            ids = [each["id"] for each in (await listed.json())["conversations"]]
            assert theirs not in ids
    async with aiohttp.ClientSession() as stranger:
        async with stranger.get(channel.url + "/api/conversations") as unsigned:
            assert unsigned.status == 401
        async with stranger.get(channel.url + "/") as page:
            assert page.status == 401 and "kaiwa web-link" in await page.text()
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]


async def test_a_sign_in_link_works_once(web: tuple[Bot, WebChannel]) -> None:
    _, channel = web
    link = channel.sign_in_link()
    async with browser_session() as first, browser_session() as second:
        async with first.get(link, allow_redirects=False) as used:
            assert used.status == 303
            assert "HttpOnly" in used.headers["Set-Cookie"]
            assert "SameSite=Strict" in used.headers["Set-Cookie"]
        async with second.get(link, allow_redirects=False) as again:
            assert again.status == 403
        async with first.get(channel.url + "/") as page:
            assert page.status == 200 and "/static/app.js" in await page.text()


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.mark.bot(images=True)
async def test_a_pasted_picture_reaches_a_vision_model_and_shows_to_its_sender_only(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    bot, channel = web
    bot.ollama.script(Text("A single pixel."))
    conversation = await client.new_conversation()
    body = {
        "conversation": conversation,
        "text": "what is this?",
        "client_id": "c1",
        "images": [base64.b64encode(PNG).decode()],
    }
    assert (await client.post("/api/messages", body)).status == 202
    await bot.runner.wait_idle(f"web:operator:{conversation}")

    (asked,) = [m for m in bot.ollama.requests[0]["messages"] if m["role"] == "user"]
    assert asked["images"] == [base64.b64encode(PNG).decode()]
    (bubble,) = [b for b in channel.board.bubbles(conversation) if b.role == "person"]
    (image_id,) = bubble.images
    async with client.session.get(f"{client.url}/api/image?id={image_id}") as shown:
        assert (shown.status, shown.content_type, await shown.read()) == (200, "image/png", PNG)
    async with (
        browser_session() as stranger,
        stranger.get(f"{client.url}/api/image?id={image_id}") as refused,
    ):
        assert refused.status == 401


@pytest.mark.parametrize(
    ("images", "error"),
    [
        (["PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"], "only PNG, JPEG, GIF and WebP pictures are taken"),
        (["not base64!"], "a picture must be base64"),
        ([base64.b64encode(PNG).decode()] * 5, "a message takes at most 4 pictures"),
    ],
)
async def test_a_picture_kaiwa_does_not_take_is_refused_with_why(
    web: tuple[Bot, WebChannel], client: WebClient, images: list[str], error: str
) -> None:
    """An SVG (it can carry script), something that is not base64, too many pictures."""
    bot, channel = web
    conversation = await client.new_conversation()
    body = {"conversation": conversation, "text": "look", "client_id": "c1", "images": images}
    async with client.session.post(
        client.url + "/api/messages", json=body, headers=client.headers
    ) as answer:
        assert (answer.status, (await answer.json())["error"]) == (400, error)
    assert channel.board.bubbles(conversation) == [] and bot.ollama.requests == []


@pytest.mark.bot(images=True)
async def test_a_picture_of_some_megabytes_arrives_whole(
    web: tuple[Bot, WebChannel], client: WebClient
) -> None:
    """Regression: the body was one read of the stream, which gives only what has arrived so
    far, so a message with a picture of a few MB was refused as not JSON."""
    bot, channel = web
    bot.ollama.script(Text("A large picture."))
    conversation = await client.new_conversation()
    large = PNG + bytes(range(256)) * (3 * 1024 * 1024 // 256)
    body = {
        "conversation": conversation,
        "text": "look",
        "client_id": "c1",
        "images": [base64.b64encode(large).decode()],
    }
    streamed = io.BytesIO(json.dumps(body).encode())
    headers = client.headers | {"Content-Type": "application/json"}
    async with client.session.post(
        client.url + "/api/messages", data=streamed, headers=headers
    ) as answer:
        assert answer.status == 202, await answer.text()
    (bubble,) = [b for b in channel.board.bubbles(conversation) if b.role == "person"]
    (image_id,) = bubble.images
    async with client.session.get(f"{client.url}/api/image?id={image_id}") as shown:
        assert await shown.read() == large
