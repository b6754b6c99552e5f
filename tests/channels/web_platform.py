"""The web chat as the conformance suite sees it: the real `WebChannel` serving its HTTP API on
127.0.0.1, wired to the whole turn path and the fake Ollama.

Its platform is this process's own board (`channels.web.board`), so there is no fake here to
make misbehave: the harness speaks and reads, as `Platform` asks (not `RemotePlatform`). It
signs people in as a team's proxy does (`[channels.web].user_header`): requests from 127.0.0.2
name their person in `X-Forwarded-User`, so ANN and BOB (in `allowed_users`) and MALLORY (a
stranger) are three people, each with a conversation of their own, which is the suite's chat of
that number (a web conversation is one person's: no one else can write or press in it).

A person speaks through the API as the page does: a message is a POST of /api/messages with the
page's own id for it (sent again, it is the same message), a press a POST of /api/press, whose
answer, the presser's alone, comes back in the response. The requests of one chat go one after
the other, as one page sends them; each is a task, answered before the harness ends. What the
bot shows is read from the board (its `kaiwa` and `notice` bubbles), and the board's stream of
changes, as a page watches it, times the edits and wakes `wait_until`.
"""

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bot.config import ChannelsConfig, Config
from bot.wiring import access_rules
from channels.places import WebPlace
from channels.presses import payload
from channels.settings import WebSettings
from channels.web.board import Bubble, Event
from channels.web.channel import WebChannel
from channels.web.transport import MESSAGE_LIMIT
from core.channel import Reply
from tests.channels.platforms import ANN, BOB, MALLORY, Harness, running
from tests.fakes.changes import Changes
from tests.fakes.patience import deadline
from tests.harness import Bot, BotFactory

PROXY = "127.0.0.2"
USER_HEADER = "X-Forwarded-User"
PEOPLE = (ANN, BOB, MALLORY)
EDIT_INTERVAL = 0.05


class WebPlatform(Harness):
    name = "web"
    limit = MESSAGE_LIMIT

    def __init__(self, bot: Bot, channel: WebChannel, session: aiohttp.ClientSession) -> None:
        self.bot = bot
        self.channel = channel
        self._session = session
        """Bound to the proxy's address, so the person each request names counts."""
        self._conversations: dict[int, str] = {}
        self._said: dict[str, tuple[int, str]] = {}
        """Each message sent, by the page's id for it: its chat and its text."""
        self._told: dict[int, list[str]] = {}
        self._edits: dict[str, list[float]] = {}
        """When each edit of a bot bubble was seen on the board's stream, by conversation."""
        self._client_ids = itertools.count(1)
        self._lines: dict[int, asyncio.Lock] = {}
        self._requests: list[asyncio.Task[None]] = []
        self._changes = Changes()
        """Notified on each change of the board and each request answered."""

    async def open_conversations(self) -> None:
        """Each person's conversation, made as their page makes it."""
        for person in PEOPLE:
            async with self._post(person, "/api/conversations", {}) as answer:
                assert answer.status == 200, await answer.text()
                self._conversations[person] = str((await answer.json())["id"])

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """The board's changes of every person's conversation for the block, as a page open on
        it sees them."""
        with contextlib.ExitStack() as subscribed:
            board = self.channel.board
            streams = [
                subscribed.enter_context(board.streams.subscribe(str(p), self._conversations[p]))
                for p in PEOPLE
            ]
            watchers = [asyncio.create_task(self._watch(stream)) for stream in streams]
            try:
                yield
            finally:
                for stream in streams:
                    stream.put_nowait(None)  # the block is over: each watcher ends
                await asyncio.wait_for(asyncio.gather(*watchers), deadline())

    async def settle(self) -> None:
        """Every request made answered (a failed one raises here, if `wait_until` did not)."""
        await asyncio.wait_for(asyncio.gather(*self._requests), deadline())

    def place(self, chat: int) -> str:
        return WebPlace(str(chat), self._conversations[chat]).key

    def name_of(self, user: int) -> str:
        """The name the proxy gives: a team's person is known by it alone (here their id)."""
        return str(user)

    def say(self, chat: int, text: str, *, user: int | None = None) -> str:
        _owner(chat, user)
        client_id = f"c{next(self._client_ids)}"
        self._said[client_id] = (chat, text)
        self._send(chat, client_id, text)
        return client_id

    def say_again(self, chat: int, message_id: str) -> None:
        """The page sends the message again (its answer was lost), with the same id."""
        said_in, text = self._said[message_id]
        assert said_in == chat
        self._send(chat, message_id, text)

    def reply(self, chat: int) -> Reply:
        return self.channel.open_reply(self.place(chat), None)

    def shown(self, chat: int) -> list[str]:
        return [bubble.text for bubble in self._bots(chat)]

    def seen(self, chat: int) -> list[str]:
        status = self.channel.board.activity(self._conversations[chat]).status
        return [*self.shown(chat), status] if status else self.shown(chat)

    def buttons(self, chat: int) -> list[str]:
        return [payload(button) for bubble in self._bots(chat) for button in bubble.buttons]

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        _owner(chat, user)
        shown = [b for bubble in self._bots(chat) for b in bubble.buttons if payload(b) == data]
        body = {"conversation": self._conversations[chat], "command": shown[-1].command}
        self._in_line(chat, functools.partial(self._press, chat, body))

    def told_privately(self, chat: int) -> list[str]:
        return list(self._told.get(chat, ()))

    def edit_times(self, chat: int) -> list[float]:
        return list(self._edits.get(self._conversations[chat], ()))

    async def wait_until(self, condition: Callable[[], object], what: str) -> None:
        def answered() -> object:
            failed = [t for t in self._requests if t.done() and not t.cancelled() and t.exception()]
            if failed:
                raise AssertionError(f"a request failed while waiting for {what}") from (
                    failed[0].exception()
                )
            return condition()

        await self._changes.until(answered, None, what, self._state)

    # -- inside ----------------------------------------------------------------------------------

    def _bots(self, chat: int) -> list[Bubble]:
        """The bot's bubbles in `chat` (its replies' and its notices), oldest first."""
        bubbles = self.channel.board.bubbles(self._conversations[chat])
        return [bubble for bubble in bubbles if bubble.role != "person"]

    def _send(self, chat: int, client_id: str, text: str) -> None:
        body = {"conversation": self._conversations[chat], "text": text, "client_id": client_id}
        self._in_line(chat, functools.partial(self._message, chat, body))

    def _in_line(self, chat: int, request: Callable[[], Awaitable[None]]) -> None:
        """`request` as a task, made once the chat's earlier ones are answered."""
        line = self._lines.setdefault(chat, asyncio.Lock())  # a fair lock: first come, first in

        async def in_turn() -> None:
            async with line:
                try:
                    await request()
                finally:
                    self._changes.notify()

        self._requests.append(asyncio.create_task(in_turn(), name=f"web request in {chat}"))

    async def _message(self, chat: int, body: dict[str, Any]) -> None:
        async with self._post(chat, "/api/messages", body) as answer:
            assert answer.status == 202, await answer.text()

    async def _press(self, chat: int, body: dict[str, Any]) -> None:
        async with self._post(chat, "/api/press", body) as answer:
            assert answer.status == 200, await answer.text()
            private = (await answer.json())["answer"]
        if private is not None and private["text"]:
            self._told.setdefault(chat, []).append(private["text"])

    @contextlib.asynccontextmanager
    async def _post(
        self, person: int, path: str, body: dict[str, Any]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A POST from `person`'s page, through the proxy."""
        headers = {"Origin": self.channel.url, "X-Kaiwa": "1", USER_HEADER: str(person)}
        async with self._session.post(self.channel.url + path, json=body, headers=headers) as sent:
            yield sent

    async def _watch(self, stream: "asyncio.Queue[Event | None]") -> None:
        seen: set[str] = set()
        while (event := await stream.get()) is not None:
            kind, _, bubble = event
            if kind == "bubble" and bubble["role"] != "person" and not bubble["deleted"]:
                if bubble["id"] in seen:
                    self._edits.setdefault(bubble["conversation"], []).append(time.monotonic())
                seen.add(bubble["id"])
            self._changes.notify()

    def _state(self) -> str:
        waiting = sum(not task.done() for task in self._requests)
        return f"{waiting} requests unanswered; the bot shows {[self.shown(p) for p in PEOPLE]}"


def _owner(chat: int, user: int | None) -> None:
    assert user in (None, chat), "a web conversation is one person's: no one else speaks in it"


@contextlib.asynccontextmanager
async def web_platform(make_bot: BotFactory, *, data_dir: Path) -> AsyncIterator[WebPlatform]:
    """A running web chat for a team behind a proxy (ANN and BOB allowed), its data in
    `data_dir`, with the access rules `kaiwa run` builds from its settings; stops as the app
    does, every request answered first."""
    settings = WebSettings(
        enabled=True,
        port=0,
        edit_interval=EDIT_INTERVAL,
        user_header=USER_HEADER,
        trusted_proxies=[PROXY],
        allowed_users=[str(ANN), str(BOB)],
    )
    channel = WebChannel(settings, data_dir, announce=lambda _: None)
    rules = access_rules(Config(channels=ChannelsConfig(web=settings)))
    bot = make_bot(channel=channel, access=rules.platforms["web"])
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(PROXY, 0)))
        )
        platform = WebPlatform(bot, channel, session)
        await stack.enter_async_context(running(channel, bot))
        await asyncio.wait_for(channel.connected.wait(), deadline())
        await platform.open_conversations()
        await stack.enter_async_context(platform.watching())
        stack.push_async_callback(platform.settle)
        yield platform
