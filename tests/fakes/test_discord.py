"""The fake Discord, proven against the real discord.py (2.7.1).

What the real library does against it, as these tests pin down:
- discord.py has no per-client URLs: ``Route.BASE`` and ``DiscordWebSocket.DEFAULT_GATEWAY`` are
  class attributes (``fake.installed()``). A plain ``Client`` never calls ``GET /gateway``: it
  connects to ``DEFAULT_GATEWAY`` with ``?v=10&encoding=json&compress=zlib-stream`` (or
  ``zstd-stream``) and resumes at READY's ``resume_gateway_url``. Text frames are accepted
  whatever compression was asked for.
- ``login`` is ``GET /users/@me`` then ``GET /oauth2/applications/@me``; a 401 becomes
  ``LoginFailure``. REST bodies are parsed only with ``Content-Type`` exactly
  ``application/json``.
- ``on_ready`` comes ``guild_ready_timeout`` seconds (default 2) after the last GUILD_CREATE:
  tests pass ``guild_ready_timeout=0.01``. The first heartbeat goes out at once on HELLO.
- Without the MESSAGE_CONTENT intent message content arrives blank (mentions of the bot and DMs
  excepted) and the library says nothing; asking for the intent while the portal switch is off
  closes the gateway with 4014, which ``connect`` raises as ``PrivilegedIntentsRequired``.
- A 429 is retried only with a ``Via`` header, after the body's ``retry_after``, five tries in
  all (a global one holds every request meanwhile); without ``Via``, or on the fifth, it raises a
  plain ``HTTPException`` with status 429, whose ``response.headers`` still carry the wait. Other
  4xx raise at once (``Forbidden``, ``NotFound``, ``HTTPException``).
- A message answer without its ``id`` fails inside the library with ``KeyError``.
- RECONNECT, an abrupt drop and a resumable INVALID_SESSION make it RESUME at once (missed
  dispatches replayed once, then ``on_resumed``); a non-resumable INVALID_SESSION makes it
  IDENTIFY again (``on_ready`` again), but only after ``Client.before_identify_hook`` sleeps 5 s
  (every IDENTIFY but the first): tests override that hook. discord.py does not drop a dispatch
  seen twice: a replayed MESSAGE_CREATE reaches ``on_message`` twice, so the bot must
  deduplicate by message id.
- A thread made from a message (``Message.create_thread``) is a ``discord.Thread`` once
  THREAD_CREATE arrived, and messages in it carry that channel. A thread a person opened is one
  too, with ``me`` None until ``Thread.join()`` (THREAD_MEMBERS_UPDATE sets ``me``, a later
  GUILD_CREATE keeps it). THREAD_UPDATE with ``archived`` drops a thread from the cache
  (``get_channel`` gives None); a THREAD_UPDATE reopening an unknown thread makes a new
  ``Thread`` and calls it ``on_thread_join``, not ``on_thread_update``.
- ``Member.roles`` keeps only the role ids the guild cache knows (plus @everyone): a role must
  arrive (GUILD_ROLE_CREATE or GUILD_CREATE) before a message naming it.
- ``Attachment.read()`` fetches ``url`` with the bot's HTTP session and no token, whole, and
  raises ``NotFound``/``Forbidden`` for a 404/403; without the MESSAGE_CONTENT intent a guild
  message's attachments arrive empty, like its content. ``Attachment.is_voice_message()`` is
  true when the attachment has ``duration_secs`` and a ``waveform``; the message's
  IS_VOICE_MESSAGE flag is ``Message.flags.voice``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import warnings
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
import yarl

from .changes import Changes
from .discord import (
    APPLICATION_ID,
    BOT_ROLE_ID,
    BOT_TOKEN,
    BOT_USER_ID,
    CHANNEL_ID,
    GUILD_ID,
    IMAGE_SIZE,
    LINK_GONE,
    MAX_CONTENT_CHARS,
    OWNER_ID,
    USER_ID,
    FakeDiscord,
    Upload,
)
from .patience import deadline

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop
    import discord
    from discord import app_commands

LIBRARY_SECONDS = deadline()
FAST = {"guild_ready_timeout": 0.01}  # on_ready 10 ms after the last GUILD_CREATE, not 2 s
T = TypeVar("T")


async def lib(awaitable: Awaitable[T]) -> T:
    """Await the library with a deadline, so a hang fails the test instead of the run."""
    async with asyncio.timeout(LIBRARY_SECONDS):
        return await awaitable


def all_intents() -> discord.Intents:
    intents = discord.Intents.default()
    intents.message_content = True
    return intents


class NoIdentifyDelayClient(discord.Client):
    """discord.py sleeps 5 s before every IDENTIFY but the first (``before_identify_hook``, a
    documented override); a test of re-identifying skips that."""

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        return None


class Bot:
    """A real ``discord.Client`` plus what it saw, with a wait that re-checks on every event."""

    def __init__(self, client: discord.Client) -> None:
        self.client = client
        self.messages: list[discord.Message] = []
        self.edits: list[discord.Message] = []
        self.threads: list[discord.Thread] = []
        self.joined: list[discord.Thread] = []  # on_thread_join: joined, or back in the cache
        self.thread_updates: list[discord.Thread] = []
        self.readies = 0
        self.resumed = 0
        self.task: asyncio.Task[None] | None = None
        self._changes = Changes()  # notified on every event the client records

        @client.event
        async def on_message(message: discord.Message) -> None:
            self.messages.append(message)
            self.notify()

        @client.event
        async def on_message_edit(before: discord.Message, after: discord.Message) -> None:
            self.edits.append(after)
            self.notify()

        @client.event
        async def on_thread_create(thread: discord.Thread) -> None:
            self.threads.append(thread)
            self.notify()

        @client.event
        async def on_thread_join(thread: discord.Thread) -> None:
            self.joined.append(thread)
            self.notify()

        @client.event
        async def on_thread_update(before: discord.Thread, after: discord.Thread) -> None:
            self.thread_updates.append(after)
            self.notify()

        @client.event
        async def on_ready() -> None:
            self.readies += 1
            self.notify()

        @client.event
        async def on_resumed() -> None:
            self.resumed += 1
            self.notify()

    def notify(self) -> None:
        self._changes.notify()

    def from_people(self) -> list[discord.Message]:
        return [m for m in self.messages if m.author.id != BOT_USER_ID]

    async def wait_until(self, condition: Callable[[], object], what: str = "") -> None:
        """Return once the client has seen what `condition` asks for."""
        await self._changes.until(
            condition, LIBRARY_SECONDS, what or None, lambda: f"{self.readies} readies"
        )

    async def start(self, token: str = BOT_TOKEN) -> None:
        await lib(self.client.login(token))
        self.task = asyncio.create_task(self.client.connect(reconnect=True))
        await lib(self.client.wait_until_ready())

    async def close(self) -> None:
        await lib(self.client.close())
        if self.task is not None:
            with contextlib.suppress(Exception):
                await lib(self.task)
        # discord.py heartbeats from a thread; let it finish while the loop still runs
        for thread in threading.enumerate():
            if isinstance(thread, discord.gateway.KeepAliveHandler):
                await lib(asyncio.to_thread(thread.join, LIBRARY_SECONDS))


MakeBot = Callable[..., Awaitable[Bot]]


@pytest.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeDiscord]:
    """The fake, installed; keeping Discord's limits when a test is marked `LIMITS`."""
    async with FakeDiscord(limits=getattr(request, "param", False)) as fake:
        with fake.installed():
            yield fake


LIMITS = pytest.mark.parametrize("fake", [True], indirect=True, ids=["limits"])
"""The `fake` of this test keeps Discord's limits (``limits=True``)."""


@pytest.fixture
async def make_bot(fake: FakeDiscord) -> AsyncIterator[MakeBot]:
    bots: list[Bot] = []

    async def make(
        *,
        intents: discord.Intents | None = None,
        start: bool = True,
        client_class: type[discord.Client] = discord.Client,
        **options: Any,
    ) -> Bot:
        client = client_class(intents=intents or all_intents(), **{**FAST, **options})
        bot = Bot(client)
        bots.append(bot)
        if start:
            await bot.start()
        return bot

    yield make
    for bot in bots:
        await bot.close()


@pytest.fixture
async def bot(make_bot: MakeBot) -> Bot:
    return await make_bot()


def channel(bot: Bot, channel_id: int = CHANNEL_ID) -> Any:
    found = bot.client.get_channel(channel_id)
    assert found is not None, f"channel {channel_id} not in the client's cache"
    return found


async def identify_again(fake: FakeDiscord, bot: Bot) -> None:
    """A new session for a ``NoIdentifyDelayClient``: a non-resumable INVALID_SESSION, then
    IDENTIFY, READY (which clears the client's cache) and GUILD_CREATE, then ``on_ready``.

    Counted against the fake's IDENTIFYs (one ``on_ready`` each), not ``bot.readies`` before:
    ``wait_until_ready`` can return before the first ``on_ready`` handler has run."""
    sessions = fake.identifies + 1
    await fake.invalid_session(resumable=False)
    await fake.wait_ready(sessions)
    await bot.wait_until(lambda: bot.readies == sessions, "on_ready in the new session")


def guild_create(fake: FakeDiscord) -> dict[str, Any]:
    """The current session's GUILD_CREATE payload."""
    return next(e["d"] for e in fake.dispatched if e["t"] == "GUILD_CREATE")


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and IHDR chunk: enough bytes to carry a size."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))


# --- login and ready ---


async def test_login_identify_and_ready(fake: FakeDiscord, bot: Bot) -> None:
    client = bot.client
    assert client.user is not None and client.user.id == BOT_USER_ID
    assert client.application_id == APPLICATION_ID
    guild = client.get_guild(GUILD_ID)
    assert guild is not None and not guild.unavailable
    assert isinstance(guild.get_channel(CHANNEL_ID), discord.TextChannel)
    assert guild.me is not None and guild.me.id == BOT_USER_ID
    assert bot.readies == 1 and fake.identifies == 1 and fake.resumes == 0
    assert [c.path for c in fake.calls] == ["/users/@me", "/oauth2/applications/@me"]
    assert all(c.token == BOT_TOKEN for c in fake.calls)
    assert fake.connections[0].startswith("/gateway/?v=10&encoding=json&compress=")
    identify = next(f for f in fake.frames if f.op == 2)
    assert identify.d["intents"] == all_intents().value
    await fake.wait_until(lambda: fake.heartbeats >= 1, what="the first heartbeat")


async def test_install_sets_and_restores_the_seams() -> None:
    base, gateway = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    async with FakeDiscord() as fake:
        with fake.installed():
            assert f"{fake.url}/api/v10" == discord.http.Route.BASE
            assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == fake.gateway_url
        assert base == discord.http.Route.BASE
        fake.install()
    # close() uninstalls too
    assert gateway == discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    assert base == discord.http.Route.BASE


async def test_raw_rest_headers_and_errors(fake: FakeDiscord) -> None:
    """JSON answers say exactly ``application/json`` (discord.py ignores the body otherwise);
    errors are ``{"message", "code"}``; a scripted 429 carries ``Via``."""
    auth = {"Authorization": f"Bot {BOT_TOKEN}"}
    async with aiohttp.ClientSession(f"{fake.url}/") as http:
        async with http.get("api/v10/users/@me", headers=auth) as response:
            assert response.headers["Content-Type"] == "application/json"
            assert (await response.json())["id"] == str(BOT_USER_ID)
        async with http.get("api/v10/users/@me", headers={"Authorization": "Bot nope"}) as r:
            assert r.status == 401
            assert await r.json() == {"message": "401: Unauthorized", "code": 0}
        async with http.get("api/v10/no/such/route", headers=auth) as response:
            assert response.status == 404
            assert await response.json() == {"message": "404: Not Found", "code": 0}
        fake.fail_next("GET", "/users/@me", retry_after=0.5)
        async with http.get("api/v10/users/@me", headers=auth) as response:
            assert response.status == 429 and response.headers["Via"]
            body = await response.json()
            assert body["retry_after"] == 0.5 and body["global"] is False


async def test_fetch_channel(fake: FakeDiscord, bot: Bot) -> None:
    fetched = await lib(bot.client.fetch_channel(CHANNEL_ID))
    assert isinstance(fetched, discord.TextChannel) and fetched.name == "general"
    with pytest.raises(discord.NotFound):
        await lib(bot.client.fetch_channel(CHANNEL_ID + 999))


async def test_wrong_token_is_login_failure(fake: FakeDiscord, make_bot: MakeBot) -> None:
    bot = await make_bot(start=False)
    with pytest.raises(discord.LoginFailure):
        await lib(bot.client.login("not-the-token"))
    assert [(c.path, c.status) for c in fake.calls] == [("/users/@me", 401)]
    assert fake.identifies == 0


async def test_heartbeats_are_acked() -> None:
    async with FakeDiscord(heartbeat_interval_ms=50) as fake:
        with fake.installed():
            bot = Bot(discord.Client(intents=all_intents(), **FAST))
            try:
                await bot.start()
                await fake.wait_until(lambda: fake.heartbeats >= 3, what="three heartbeats")
                await bot.wait_until(lambda: bot.client.latency != float("inf"), "a latency")
                assert fake.resumes == 0 and fake.identifies == 1
            finally:
                await bot.close()


async def test_dispatches_are_numbered_per_session(fake: FakeDiscord, bot: Bot) -> None:
    """Dispatches are numbered from 1 per session: READY, then GUILD_CREATE."""
    assert [e["t"] for e in fake.dispatched[:2]] == ["READY", "GUILD_CREATE"]
    assert [e["s"] for e in fake.dispatched[:2]] == [1, 2]


# --- messages in ---


async def test_user_message_reaches_on_message(fake: FakeDiscord, bot: Bot) -> None:
    sent = fake.user_message(CHANNEL_ID, "hello bot", author_id=USER_ID)
    await bot.wait_until(lambda: bot.from_people(), "the message")
    [message] = bot.from_people()
    assert message.id == int(sent["id"])
    assert message.content == "hello bot"
    assert message.author.id == USER_ID
    assert isinstance(message.author, discord.Member)
    assert isinstance(message.channel, discord.TextChannel)
    assert message.channel.id == CHANNEL_ID
    assert message.guild is not None and message.guild.id == GUILD_ID


async def test_mention_of_the_bot(fake: FakeDiscord, bot: Bot) -> None:
    fake.user_message(CHANNEL_ID, "ping", mentions_bot=True)
    await bot.wait_until(lambda: bot.from_people(), "the mention")
    [message] = bot.from_people()
    assert bot.client.user is not None and bot.client.user.mentioned_in(message)
    assert message.content == f"<@{BOT_USER_ID}> ping"


async def test_content_is_stripped_without_the_intent(fake: FakeDiscord, make_bot: MakeBot) -> None:
    bot = await make_bot(intents=discord.Intents.default())
    fake.user_message(CHANNEL_ID, "secret words")
    fake.user_message(CHANNEL_ID, "to you", mentions_bot=True)
    fake.dm(USER_ID, "a direct message")
    await bot.wait_until(lambda: len(bot.from_people()) == 3, "three messages")
    assert [m.content for m in bot.from_people()] == [
        "",
        f"<@{BOT_USER_ID}> to you",
        "a direct message",
    ]
    # the bot's own messages keep their content
    await lib(channel(bot).send("mine"))
    await bot.wait_until(lambda: len(bot.messages) == 4, "the bot's own message")
    assert bot.messages[-1].content == "mine"


async def test_portal_switch_off_strips_content(fake: FakeDiscord, bot: Bot) -> None:
    fake.message_content_intent_enabled = False
    fake.user_message(CHANNEL_ID, "secret words")
    await bot.wait_until(lambda: bot.from_people(), "the message")
    assert bot.from_people()[0].content == ""


async def test_asking_for_a_disallowed_intent_closes_4014(
    fake: FakeDiscord, make_bot: MakeBot
) -> None:
    fake.message_content_intent_enabled = False
    bot = await make_bot(start=False)
    await lib(bot.client.login(BOT_TOKEN))
    with pytest.raises(discord.PrivilegedIntentsRequired):
        await lib(bot.client.connect(reconnect=True))
    assert fake.identifies == 0


async def test_dm_arrives_on_a_dm_channel_and_the_bot_replies(fake: FakeDiscord, bot: Bot) -> None:
    fake.dm(USER_ID, "psst")
    await bot.wait_until(lambda: bot.from_people(), "the DM")
    [message] = bot.from_people()
    assert isinstance(message.channel, discord.DMChannel)
    assert message.guild is None and message.content == "psst"
    await lib(message.channel.send("hi there"))
    dm_channel = fake.dm_channel(USER_ID)
    assert dm_channel is not None
    assert [s.content for s in fake.messages(dm_channel)] == ["hi there"]
    opened = await lib(bot.client.create_dm(discord.Object(id=USER_ID + 1)))
    assert opened.id == fake.dm_channel(USER_ID + 1)
    assert fake.calls_to("POST", "/users/@me/channels")[0].body == {"recipient_id": USER_ID + 1}


async def test_replayed_message_reaches_on_message_twice(fake: FakeDiscord, bot: Bot) -> None:
    message = fake.user_message(CHANNEL_ID, "once")
    fake.replay_message(message)
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "the replay")
    assert [m.id for m in bot.from_people()] == [int(message["id"])] * 2


# --- messages out ---


async def test_send_and_edit_a_message(fake: FakeDiscord, bot: Bot) -> None:
    text = channel(bot)
    async with text.typing():
        sent = await lib(text.send("thinking"))
    assert fake.calls_to("POST", f"/channels/{CHANNEL_ID}/typing")
    edited = await lib(sent.edit(content="done"))
    assert edited.content == "done"
    [stored] = fake.messages(CHANNEL_ID)
    assert (stored.id, stored.content, stored.edits) == (sent.id, "done", ["done"])
    # Discord echoes the bot's own message and its edit on the gateway
    await bot.wait_until(lambda: bot.messages and bot.edits, "the echo and the edit")
    assert bot.messages[0].author.id == BOT_USER_ID and bot.messages[0].id == sent.id
    assert bot.edits[0].content == "done"


async def test_reply_and_components(fake: FakeDiscord, bot: Bot) -> None:
    fake.user_message(CHANNEL_ID, "question")
    await bot.wait_until(lambda: bot.from_people(), "the question")
    view = discord.ui.View()
    view.add_item(discord.ui.Button(label="Stop", custom_id="stop"))
    reply = await lib(bot.from_people()[0].reply("answer", view=view))
    view.stop()
    [stored] = fake.messages(CHANNEL_ID)
    assert stored.reference == bot.from_people()[0].id
    assert stored.components[0]["components"][0]["custom_id"] == "stop"
    assert reply.reference is not None


async def test_too_long_message_is_invalid_form_body(fake: FakeDiscord, bot: Bot) -> None:
    with pytest.raises(discord.HTTPException) as raised:
        await lib(channel(bot).send("x" * (MAX_CONTENT_CHARS + 1)))
    assert raised.value.status == 400 and raised.value.code == 50035
    await lib(channel(bot).send("x" * MAX_CONTENT_CHARS))
    assert len(fake.messages(CHANNEL_ID)) == 1


async def test_rate_limit_with_via_is_retried(fake: FakeDiscord, bot: Bot) -> None:
    fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages", retry_after=0.05)
    await lib(channel(bot).send("eventually"))
    statuses = [c.status for c in fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages")]
    assert statuses == [429, 200]
    assert [s.content for s in fake.messages(CHANNEL_ID)] == ["eventually"]


async def test_rate_limit_without_via_raises_at_once_with_the_wait_in_its_headers(
    fake: FakeDiscord, bot: Bot
) -> None:
    fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages", retry_after=0.05, via=False)
    with pytest.raises(discord.HTTPException) as raised:
        await lib(channel(bot).send("not now"))
    assert raised.value.status == 429
    headers = raised.value.response.headers
    assert headers["X-RateLimit-Reset-After"] == "0.050" and headers["Retry-After"] == "1"
    assert "Via" not in headers


async def test_five_rate_limits_in_a_row_raise_a_429(fake: FakeDiscord, bot: Bot) -> None:
    fake.fail_next("PATCH", f"/channels/{CHANNEL_ID}/messages/", retry_after=0.01, times=6)
    sent = await lib(channel(bot).send("first"))
    with pytest.raises(discord.HTTPException) as raised:
        await lib(sent.edit(content="second"))
    assert raised.value.status == 429
    await lib(sent.edit(content="second"))  # the sixth 429, slept out, then the edit
    edits = fake.calls_to("PATCH", f"/channels/{CHANNEL_ID}/messages/")
    assert [c.status for c in edits] == [429] * 6 + [200]


async def test_a_global_rate_limit_is_waited_out(fake: FakeDiscord, bot: Bot) -> None:
    fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages", retry_after=0.05, scope="global")
    await lib(channel(bot).send("eventually"))
    refused, sent = fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages")
    assert (refused.status, sent.status) == (429, 200)
    assert sent.at - refused.at >= 0.05


async def test_an_answer_can_leave_out_a_field(fake: FakeDiscord, bot: Bot) -> None:
    fake.answer_without("POST", f"/channels/{CHANNEL_ID}/messages", "id")
    with pytest.raises(KeyError, match="id"):
        await lib(channel(bot).send("sent all the same"))
    assert [s.content for s in fake.messages(CHANNEL_ID)] == ["sent all the same"]


async def test_a_held_answer_waits_for_its_condition(fake: FakeDiscord, bot: Bot) -> None:
    route = "POST /channels/{channel}/typing"
    fake.holds.hold(route, lambda params: lambda: fake.messages(int(params["channel"])))
    typing = asyncio.create_task(lib(channel(bot).typing()))
    await fake.wait_until(lambda: fake.holds.in_flight(route) == 1)
    assert not typing.done()
    await lib(channel(bot).send("the condition"))
    await lib(typing)
    assert fake.holds.in_flight(route) == 0 and fake.holds.abandoned == []


async def test_other_errors_raise_at_once(fake: FakeDiscord, bot: Bot) -> None:
    fake.fail_next("POST", f"/channels/{CHANNEL_ID}/messages", status=403)
    with pytest.raises(discord.Forbidden):
        await lib(channel(bot).send("no"))
    with pytest.raises(discord.NotFound) as raised:
        await lib(bot.client.fetch_user(USER_ID))  # GET /users/{id}: not implemented
    assert raised.value.text == "404: Not Found"
    assert fake.messages(CHANNEL_ID) == []


# --- Discord's limits (limits=True) ---

AUTH = {"Authorization": f"Bot {BOT_TOKEN}"}
MESSAGES = f"api/v10/channels/{CHANNEL_ID}/messages"


@LIMITS
async def test_a_bucketed_route_says_what_is_left_and_past_it_answers_discords_429(
    fake: FakeDiscord,
) -> None:
    """A message's post and edit share one bucket per channel; deleting and typing have their
    own."""
    fake.rate_limits.clock.stop()
    async with aiohttp.ClientSession(f"{fake.url}/") as http:
        left = []
        for n in range(5):
            async with http.post(MESSAGES, json={"content": f"post {n}"}, headers=AUTH) as r:
                assert r.status == 200
                left.append(r.headers["X-RateLimit-Remaining"])
                assert (r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Bucket"]) == (
                    "5",
                    "fake-messages",
                )
                assert r.headers["X-RateLimit-Reset-After"] == "5.000"
                message = (await r.json())["id"]
        edit = f"{MESSAGES}/{message}"
        async with http.patch(edit, json={"content": "edited"}, headers=AUTH) as refused:
            assert refused.status == 429
            assert await refused.json() == {
                "message": "You are being rate limited.",
                "retry_after": 5.0,
                "global": False,
            }
            headers = refused.headers
            assert (headers["Retry-After"], headers["X-RateLimit-Remaining"]) == ("5", "0")
            assert (headers["X-RateLimit-Bucket"], headers["X-RateLimit-Scope"]) == (
                "fake-messages",
                "user",
            )
            assert headers["Via"] and "X-RateLimit-Global" not in headers
        async with http.delete(edit, headers=AUTH) as deleted:
            assert deleted.status == 204
            assert deleted.headers["X-RateLimit-Bucket"] == "fake-deletions"
            assert deleted.headers["X-RateLimit-Reset-After"] == "1.000"
        async with http.post(f"api/v10/channels/{CHANNEL_ID}/typing", headers=AUTH) as typing:
            assert typing.headers["X-RateLimit-Bucket"] == "fake-typing"
        fake.rate_limits.clock.advance(5)
        async with http.post(MESSAGES, json={"content": "later"}, headers=AUTH) as r:
            assert (r.status, r.headers["X-RateLimit-Remaining"]) == (200, "4")
    assert left == ["4", "3", "2", "1", "0"]
    [refusal] = fake.refused_429
    assert refusal.window.key == f"fake-messages {CHANNEL_ID}"


@LIMITS
async def test_past_fifty_requests_a_second_the_limit_is_global(fake: FakeDiscord) -> None:
    fake.rate_limits.clock.stop()
    async with aiohttp.ClientSession(f"{fake.url}/") as http:
        for _ in range(50):
            async with http.get("api/v10/users/@me", headers=AUTH) as response:
                assert response.status == 200 and "X-RateLimit-Bucket" not in response.headers
        async with http.get("api/v10/users/@me", headers=AUTH) as refused:
            assert refused.status == 429
            assert (await refused.json())["global"] is True
            assert refused.headers["X-RateLimit-Global"] == "true"
            assert refused.headers["X-RateLimit-Scope"] == "global"
        fake.rate_limits.clock.advance(1)
        async with http.get("api/v10/users/@me", headers=AUTH) as response:
            assert response.status == 200
    assert [refusal.window.key for refusal in fake.refused_429] == ["global"]


@LIMITS
async def test_discord_py_waits_on_the_headers_instead_of_meeting_a_429(
    fake: FakeDiscord, bot: Bot
) -> None:
    """Four posts, then (the clock moved on) a fifth that leaves the bucket empty for half a
    second: discord.py sleeps that out itself, so the sixth comes once the bucket is full
    again, and the fake answers no 429."""
    fake.rate_limits.clock.stop()
    for n in range(4):
        await lib(channel(bot).send(f"post {n}"))
    fake.rate_limits.clock.advance(4.5)
    fake.rate_limits.clock.resume()

    await lib(channel(bot).send("the bucket's last"))
    await lib(channel(bot).send("after its reset"))

    posts = fake.calls_to("POST", f"/channels/{CHANNEL_ID}/messages")
    assert [call.status for call in posts] == [200] * 6
    assert fake.refused_429 == []
    assert len(fake.messages(CHANNEL_ID)) == 6


async def test_without_limits_no_bucket_headers_and_nothing_refused(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession(f"{fake.url}/") as http:
        for n in range(8):
            async with http.post(MESSAGES, json={"content": f"post {n}"}, headers=AUTH) as r:
                assert r.status == 200 and "X-RateLimit-Remaining" not in r.headers
    assert fake.refused_429 == [] and fake.rate_limits.admitted == []


# --- threads ---


async def test_thread_from_a_message(fake: FakeDiscord, bot: Bot) -> None:
    fake.user_message(CHANNEL_ID, "start here")
    await bot.wait_until(lambda: bot.from_people(), "the starter")
    starter = bot.from_people()[0]
    thread = await lib(starter.create_thread(name="a topic"))
    assert isinstance(thread, discord.Thread)
    assert thread.id == starter.id and thread.parent_id == CHANNEL_ID
    assert fake.threads[thread.id]["name"] == "a topic"
    assert fake.threads[thread.id]["parent_id"] == CHANNEL_ID
    await bot.wait_until(lambda: bot.threads, "THREAD_CREATE")
    fake.user_message(thread.id, "inside")
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "the message in the thread")
    inside = bot.from_people()[1]
    assert isinstance(inside.channel, discord.Thread)
    assert inside.channel.id == thread.id and inside.channel.parent_id == CHANNEL_ID
    assert inside.content == "inside"
    await lib(inside.channel.send("answer in thread"))
    assert [s.content for s in fake.messages(thread.id)] == ["answer in thread"]
    with pytest.raises(discord.HTTPException) as raised:
        await lib(starter.create_thread(name="again"))
    assert raised.value.code == 160004


async def test_thread_a_person_opened(fake: FakeDiscord, bot: Bot) -> None:
    thread_id = fake.user_thread(CHANNEL_ID, "my question", owner_id=OWNER_ID)
    await bot.wait_until(lambda: bot.threads, "THREAD_CREATE")
    [thread] = bot.threads
    assert isinstance(thread, discord.Thread)
    assert (thread.id, thread.parent_id, thread.name) == (thread_id, CHANNEL_ID, "my question")
    assert thread.owner_id == OWNER_ID and thread.me is None
    assert thread_id not in fake.threads  # the bot did not make it
    fake.user_message(thread_id, "inside")
    await bot.wait_until(lambda: bot.from_people(), "the message in the thread")
    [message] = bot.from_people()
    assert message.channel is thread and message.content == "inside"
    await lib(message.channel.send("answer"))
    assert [s.content for s in fake.messages(thread_id)] == ["answer"]


async def test_joining_a_thread(fake: FakeDiscord, make_bot: MakeBot) -> None:
    bot = await make_bot(client_class=NoIdentifyDelayClient)
    thread_id = fake.user_thread(CHANNEL_ID, "help")
    await bot.wait_until(lambda: bot.threads, "THREAD_CREATE")
    await lib(channel(bot, thread_id).join())
    await bot.wait_until(lambda: bot.joined, "THREAD_MEMBERS_UPDATE")
    me = channel(bot, thread_id).me
    assert me is not None and (me.id, me.thread_id) == (BOT_USER_ID, thread_id)
    # joining again answers 204 and changes nothing
    await lib(channel(bot, thread_id).join())
    calls = fake.calls_to("PUT", f"/channels/{thread_id}/thread-members/@me")
    assert [c.status for c in calls] == [204, 204]
    assert [e["t"] for e in fake.dispatched].count("THREAD_MEMBERS_UPDATE") == 1
    with pytest.raises(discord.HTTPException) as not_a_thread:
        await lib(bot.client.http.join_thread(CHANNEL_ID))
    assert (not_a_thread.value.status, not_a_thread.value.code) == (400, 50024)
    with pytest.raises(discord.NotFound) as unknown:
        await lib(bot.client.http.join_thread(CHANNEL_ID + 999))
    assert unknown.value.code == 10003
    # a new session's GUILD_CREATE carries the membership
    await identify_again(fake, bot)
    [thread] = guild_create(fake)["threads"]
    assert thread["member"]["user_id"] == str(BOT_USER_ID)
    rebuilt = channel(bot, thread_id)
    assert isinstance(rebuilt, discord.Thread) and rebuilt.me is not None


async def test_archived_thread_leaves_the_cache_and_a_message_reopens_it(
    fake: FakeDiscord, bot: Bot
) -> None:
    thread_id = fake.user_thread(CHANNEL_ID, "old topic")
    await bot.wait_until(lambda: bot.threads, "THREAD_CREATE")
    fake.archive_thread(thread_id)
    await bot.wait_until(lambda: bot.thread_updates, "THREAD_UPDATE")
    assert bot.thread_updates[0].archived and bot.client.get_channel(thread_id) is None
    fetched = await lib(bot.client.fetch_channel(thread_id))  # REST still has it
    assert isinstance(fetched, discord.Thread) and fetched.archived
    with pytest.raises(discord.HTTPException) as archived:
        await lib(fetched.join())
    assert archived.value.code == 50083
    fake.user_message(thread_id, "anyone?")
    await bot.wait_until(lambda: bot.from_people(), "the message")
    assert [e["t"] for e in fake.dispatched[-2:]] == ["THREAD_UPDATE", "MESSAGE_CREATE"]
    reopened = channel(bot, thread_id)
    assert isinstance(reopened, discord.Thread) and not reopened.archived
    assert bot.from_people()[0].channel is reopened
    assert bot.joined == [reopened]  # back in the cache by on_thread_join, not on_thread_update
    assert len(bot.thread_updates) == 1


async def test_only_active_threads_are_in_guild_create(
    fake: FakeDiscord, make_bot: MakeBot
) -> None:
    bot = await make_bot(client_class=NoIdentifyDelayClient)
    active = fake.user_thread(CHANNEL_ID, "active")
    archived = fake.user_thread(CHANNEL_ID, "archived")
    fake.archive_thread(archived)
    await identify_again(fake, bot)
    assert [t["id"] for t in guild_create(fake)["threads"]] == [str(active)]
    assert isinstance(channel(bot, active), discord.Thread)
    assert bot.client.get_channel(archived) is None
    fake.reopen_thread(archived)
    await bot.wait_until(lambda: bot.joined, "the reopened thread")
    assert not channel(bot, archived).archived
    # the bot's own message into an archived thread reopens it too
    fake.archive_thread(active)
    await bot.wait_until(lambda: bot.client.get_channel(active) is None, "the archiving")
    thread = await lib(bot.client.fetch_channel(active))
    assert isinstance(thread, discord.Thread)
    await lib(thread.send("bumping this"))
    await bot.wait_until(lambda: len(bot.joined) == 2 and bot.messages, "the reopening")
    assert not channel(bot, active).archived
    assert bot.messages[0].channel is channel(bot, active)
    assert [s.content for s in fake.messages(active)] == ["bumping this"]


# --- roles ---


async def test_roles_of_authors_and_interaction_users(fake: FakeDiscord, make_bot: MakeBot) -> None:
    bot = await make_bot(client_class=NoIdentifyDelayClient)
    interactions: list[discord.Interaction] = []

    @bot.client.event
    async def on_interaction(interaction: discord.Interaction) -> None:
        interactions.append(interaction)
        bot.notify()

    role_id = fake.add_role("helpers")
    message = fake.user_message(CHANNEL_ID, "hi", roles=[role_id])
    await bot.wait_until(lambda: bot.from_people(), "the message")
    author = bot.from_people()[0].author
    assert isinstance(author, discord.Member)
    assert [(r.id, r.name) for r in author.roles] == [(GUILD_ID, "@everyone"), (role_id, "helpers")]
    fake.slash_command("whoami", roles=[role_id])
    fake.button_click(message, "pick", roles=[role_id])
    await bot.wait_until(lambda: len(interactions) == 2, "the two interactions")
    for interaction in interactions:
        assert isinstance(interaction.user, discord.Member)
        assert role_id in [r.id for r in interaction.user.roles]
    with pytest.raises(KeyError):
        fake.user_message(CHANNEL_ID, "no such role", roles=[role_id + 1])
    # a later session gets the role in GUILD_CREATE
    await identify_again(fake, bot)
    guild = bot.client.get_guild(GUILD_ID)
    assert guild is not None
    role = guild.get_role(role_id)
    assert role is not None and role.name == "helpers"


async def test_the_bots_own_role_and_a_mention_of_it(fake: FakeDiscord, bot: Bot) -> None:
    fake.user_message(CHANNEL_ID, "hi", mentions_bot_role=True)
    await bot.wait_until(lambda: bot.from_people(), "the message")
    message = bot.from_people()[0]
    assert message.guild is not None and message.guild.self_role is not None
    assert message.guild.self_role.id == BOT_ROLE_ID
    assert message.role_mentions == [message.guild.self_role]
    assert message.content == f"<@&{BOT_ROLE_ID}> hi"


# --- attachments ---


async def test_attachments_are_served_by_the_fake(fake: FakeDiscord, bot: Bot) -> None:
    image = png_header(3, 2)
    fake.user_message(
        CHANNEL_ID,
        "look",
        attachments=[("a cat.png", "image/png", image), ("notes.txt", "text/plain", b"hello")],
    )
    fake.dm(USER_ID, "", attachments=[("dm.jpg", "image/jpeg", b"\xff\xd8 not decoded")])
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "both messages")
    picture, notes = bot.from_people()[0].attachments
    assert (picture.filename, picture.content_type) == ("a cat.png", "image/png")
    assert (picture.size, picture.width, picture.height) == (len(image), 3, 2)
    assert await lib(picture.read()) == image
    assert await lib(picture.read(use_cached=True)) == image  # proxy_url
    assert (notes.content_type, notes.width, notes.height) == ("text/plain", None, None)
    assert await lib(notes.read()) == b"hello"
    [photo] = bot.from_people()[1].attachments
    assert (photo.width, photo.height) == IMAGE_SIZE
    assert await lib(photo.read()) == b"\xff\xd8 not decoded"
    async with aiohttp.ClientSession() as http:
        async with http.get(picture.url) as response:
            assert response.headers["Content-Type"] == "image/png"
        async with http.get(picture.url.replace("a%20cat.png", "dog.png")) as response:
            assert response.status == 404


async def test_attachments_are_stripped_without_the_intent(
    fake: FakeDiscord, make_bot: MakeBot
) -> None:
    bot = await make_bot(intents=discord.Intents.default())
    files = [("cat.png", "image/png", png_header(1, 1))]
    fake.user_message(CHANNEL_ID, "a picture", attachments=files)
    fake.dm(USER_ID, "a picture", attachments=files)
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "both messages")
    assert [len(m.attachments) for m in bot.from_people()] == [0, 1]


async def test_a_voice_message_is_shaped_as_discords(fake: FakeDiscord, bot: Bot) -> None:
    thread = fake.user_thread(CHANNEL_ID, "talk")
    fake.user_message(thread, "", attachments=[Upload.voice_message(b"OggS voice", seconds=3.5)])
    fake.dm(USER_ID, "", attachments=[Upload("report", None, b"%PDF-1.7")])
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "both messages")
    voice, unlabelled = bot.from_people()
    (note,) = voice.attachments
    assert voice.flags.voice and note.is_voice_message()
    assert (note.filename, note.content_type, note.duration) == (
        "voice-message.ogg",
        "audio/ogg",
        3.5,
    )
    assert note.waveform and len(note.waveform) <= 256
    assert await lib(note.read()) == b"OggS voice"
    (report,) = unlabelled.attachments
    assert (report.content_type, report.is_voice_message()) == (None, False)
    assert not unlabelled.flags.voice


async def test_the_cdn_serves_signed_links_for_a_day_to_anyone(fake: FakeDiscord, bot: Bot) -> None:
    fake.dm(USER_ID, "", attachments=[Upload("a.txt", "text/plain", b"hello", size=99)])
    await bot.wait_until(lambda: bot.from_people(), "the message")
    (attachment,) = bot.from_people()[0].attachments
    assert attachment.size == 99, "the size declared, whatever is served"
    url = yarl.URL(attachment.url)
    assert set(url.query) == {"ex", "is", "hm"}
    assert int(url.query["ex"], 16) - int(url.query["is"], 16) == 24 * 3600
    assert await lib(attachment.read()) == b"hello"
    (fetch,) = fake.calls_to("GET", "/attachments/")
    assert (fetch.status, fetch.token) == (200, None), "discord.py sends no token to the CDN"
    async with aiohttp.ClientSession() as http:
        forged = url.update_query(hm="0" * 64)
        async with http.get(forged) as response:
            assert (response.status, await response.text()) == (404, LINK_GONE)
        fake.expire_attachment_links()
        async with http.get(url) as response:
            assert (response.status, await response.text()) == (404, LINK_GONE)
    fake.dm(USER_ID, "", attachments=[("b.txt", "text/plain", b"fresh")])
    await bot.wait_until(lambda: len(bot.from_people()) == 2, "the second message")
    assert await lib(bot.from_people()[1].attachments[0].read()) == b"fresh"


async def test_the_cdns_refusals_can_be_scripted(fake: FakeDiscord, bot: Bot) -> None:
    fake.dm(USER_ID, "", attachments=[("a.txt", "text/plain", b"hello")])
    await bot.wait_until(lambda: bot.from_people(), "the message")
    (attachment,) = bot.from_people()[0].attachments
    fake.fail_next("GET", "/attachments/", status=403)
    with pytest.raises(discord.Forbidden):
        await lib(attachment.read())
    assert await lib(attachment.read()) == b"hello", "only the next one"


# --- application commands ---


async def test_command_tree_sync(fake: FakeDiscord, bot: Bot) -> None:
    tree = app_commands.CommandTree(bot.client)

    @tree.command(name="ask", description="Ask the agent")
    async def ask(interaction: discord.Interaction, question: str) -> None:
        raise AssertionError("not invoked")

    synced = await lib(tree.sync())
    assert [c.name for c in synced] == ["ask"]
    assert [c["name"] for c in fake.commands] == ["ask"]
    assert fake.calls_to("PUT", f"/applications/{APPLICATION_ID}/commands")


# --- reconnecting ---


async def _one_missed_message_then_a_sentinel(fake: FakeDiscord, bot: Bot) -> None:
    """A message made while the client was away arrives once, before a later sentinel."""
    missed = fake.user_message(CHANNEL_ID, "while away")
    await bot.wait_until(lambda: bot.resumed == 1, "on_resumed")
    sentinel = fake.user_message(CHANNEL_ID, "after")
    await bot.wait_until(lambda: len(bot.from_people()) >= 2, "the sentinel")
    assert [m.id for m in bot.from_people()] == [int(missed["id"]), int(sentinel["id"])]
    assert fake.resumes == 1 and fake.identifies == 1 and bot.readies == 1


async def test_reconnect_resumes_and_replays_once(fake: FakeDiscord, bot: Bot) -> None:
    await fake.reconnect()
    await _one_missed_message_then_a_sentinel(fake, bot)
    assert fake.connections[-1].startswith("/resume/?v=10")
    resume = next(f for f in fake.frames if f.op == 6)
    assert resume.d["session_id"] == fake.session_id and resume.d["seq"] == 2


async def test_dropped_socket_resumes_and_replays_once(fake: FakeDiscord, bot: Bot) -> None:
    await fake.drop_gateway()
    await _one_missed_message_then_a_sentinel(fake, bot)
    assert fake.connections[-1].startswith("/resume/")


async def test_closed_socket_resumes(fake: FakeDiscord, bot: Bot) -> None:
    await fake.drop_gateway(abort=False)
    await _one_missed_message_then_a_sentinel(fake, bot)


async def test_resumable_invalid_session_resumes(fake: FakeDiscord, bot: Bot) -> None:
    await fake.invalid_session(resumable=True)
    await _one_missed_message_then_a_sentinel(fake, bot)


async def test_invalid_session_identifies_again(fake: FakeDiscord, make_bot: MakeBot) -> None:
    bot = await make_bot(client_class=NoIdentifyDelayClient)
    first_session = fake.session_id
    await fake.invalid_session(resumable=False)
    await fake.wait_ready(2)
    await bot.wait_until(lambda: bot.readies == 2, "the second on_ready")
    assert fake.session_id != first_session and fake.resumes == 0
    fake.user_message(CHANNEL_ID, "new session")
    await bot.wait_until(lambda: bot.from_people(), "a message in the new session")
    assert bot.client.get_guild(GUILD_ID) is not None


async def test_client_close_is_clean(fake: FakeDiscord, bot: Bot) -> None:
    await bot.close()
    assert bot.task is not None and bot.task.done() and bot.task.exception() is None
    await fake.wait_until(lambda: fake.open_sockets == 0, what="the socket to close")
    assert not fake.live


# --- interactions ---


async def test_button_click_reaches_the_view(fake: FakeDiscord, bot: Bot) -> None:
    clicks: list[discord.Interaction] = []
    view = discord.ui.View(timeout=None)
    stop = discord.ui.Button(label="Stop", custom_id="stop")
    more = discord.ui.Button(label="More", custom_id="more")

    async def on_stop(interaction: discord.Interaction) -> None:
        clicks.append(interaction)
        await interaction.response.edit_message(content="stopped", view=None)
        bot.notify()

    async def on_more(interaction: discord.Interaction) -> None:
        clicks.append(interaction)
        await interaction.response.send_message("only you see this", ephemeral=True)
        bot.notify()

    stop.callback = on_stop
    more.callback = on_more
    view.add_item(stop)
    view.add_item(more)
    sent = await lib(channel(bot).send("working", view=view))
    try:
        more_click = fake.button_click(sent.id, "more")
        await bot.wait_until(lambda: len(clicks) == 1 and fake.interaction_callbacks, "more")
        assert fake.interaction_state(more_click)["responded"] == 4
        [_, ephemeral] = fake.messages(CHANNEL_ID)
        assert ephemeral.ephemeral and ephemeral.content == "only you see this"
        assert ephemeral.interaction_id == int(more_click["id"])

        fake.button_click(sent.id, "stop", user_id=USER_ID)
        await bot.wait_until(lambda: len(fake.interaction_callbacks) == 2, "stop")
        assert [c["type"] for c in fake.interaction_callbacks] == [4, 7]
        assert clicks[1].user.id == USER_ID and clicks[1].message is not None
        original = fake.messages(CHANNEL_ID)[0]
        assert (original.content, original.components, original.edits) == (
            "stopped",
            [],
            ["stopped"],
        )
        # the ephemeral answer was not echoed on the gateway; the edit was
        await bot.wait_until(lambda: bot.edits, "the edit echo")
        assert [m.id for m in bot.messages] == [sent.id]
    finally:
        view.stop()


async def test_slash_command_defer_then_edit_and_follow_up(fake: FakeDiscord, bot: Bot) -> None:
    tree = app_commands.CommandTree(bot.client)
    answered = asyncio.Event()
    questions: list[str] = []

    @tree.command(name="ask", description="Ask the agent")
    async def ask(interaction: discord.Interaction, question: str) -> None:
        questions.append(question)
        await interaction.response.defer(thinking=True)
        await interaction.edit_original_response(content="the answer")
        await interaction.followup.send("and one more thing")
        answered.set()

    await lib(tree.sync())
    command = fake.slash_command("ask", {"question": "why?"})
    await lib(answered.wait())
    assert questions == ["why?"]
    state = fake.interaction_state(command)
    assert state["responded"] == 5 and len(state["followups"]) == 1
    assert [(m.content, m.edits) for m in fake.messages(CHANNEL_ID)] == [
        ("the answer", ["the answer"]),
        ("and one more thing", []),
    ]
    assert fake.messages(CHANNEL_ID)[0].id == state["original"]
    # callbacks and webhooks carry no bot token: the path's token is the credential
    webhook_calls = [c for c in fake.calls if c.path.startswith(("/interactions", "/webhooks"))]
    assert webhook_calls and all(c.status < 300 for c in webhook_calls)


async def test_slash_command_in_a_dm(fake: FakeDiscord, bot: Bot) -> None:
    tree = app_commands.CommandTree(bot.client)
    seen: list[discord.Interaction] = []

    @tree.command(name="ping", description="Ping")
    async def ping(interaction: discord.Interaction) -> None:
        seen.append(interaction)
        await interaction.response.send_message("pong")

    await lib(tree.sync())
    fake.dm(USER_ID, "hello")  # opens the DM channel
    dm_channel = fake.dm_channel(USER_ID)
    assert dm_channel is not None
    fake.slash_command("ping", channel_id=dm_channel)
    await fake.wait_until(lambda: fake.interaction_callbacks, what="the pong")
    assert seen[0].guild is None and isinstance(seen[0].channel, discord.DMChannel)
    assert [m.content for m in fake.messages(dm_channel)] == ["pong"]


async def test_member_chunking_at_startup(fake: FakeDiscord, make_bot: MakeBot) -> None:
    """With the members intent discord.py asks for the members (op 8) before on_ready."""
    intents = all_intents()
    intents.members = True
    bot = await make_bot(intents=intents)
    guild = bot.client.get_guild(GUILD_ID)
    assert guild is not None and guild.chunked
    assert {m.id for m in guild.members} >= {BOT_USER_ID, USER_ID}
    assert [f.d["guild_id"] for f in fake.frames if f.op == 8] == [GUILD_ID]


async def test_new_channel_is_announced(fake: FakeDiscord, bot: Bot) -> None:
    channel_id = fake.add_text_channel("random")
    fake.user_message(channel_id, "over here")
    await bot.wait_until(lambda: bot.from_people(), "the message in the new channel")
    message = bot.from_people()[0]
    assert isinstance(message.channel, discord.TextChannel) and message.channel.name == "random"
    await lib(message.channel.send("hi"))
    assert [s.content for s in fake.messages(channel_id)] == ["hi"]


async def test_a_dm_channel_opened_without_a_message(fake: FakeDiscord, bot: Bot) -> None:
    dm = fake.open_dm(USER_ID)
    assert fake.dm_channel(USER_ID) == dm and fake.open_dm(USER_ID) == dm
    await lib(bot.client.get_partial_messageable(dm).send("hello"))
    assert [s.content for s in fake.messages(dm)] == ["hello"]
    assert [e["t"] for e in fake.dispatched].count("MESSAGE_CREATE") == 1, "only the bot's echo"


async def test_a_refused_gateway_counts_the_attempts(fake: FakeDiscord, bot: Bot) -> None:
    fake.gateway_refused = True
    await fake.drop_gateway()
    await fake.wait_until(lambda: fake.refused_connections >= 1, what="a refused reconnect")
    assert not fake.live
    fake.gateway_refused = False
    await fake.wait_until(lambda: fake.live, what="the resumed session", timeout=LIBRARY_SECONDS)
    assert fake.resumes == 1
