"""Each platform across a network as the conformance suite sees it: a real adapter on its real
client library, talking to the platform's fake on 127.0.0.1, wired to the whole turn path and the
fake Ollama. (The web chat, whose platform is this process's own board, has its harness in
tests/channels/web_platform.py; the `platform` fixture, in tests/channels/conftest.py, gives each.)

A platform harness knows how a person speaks on that platform (typing, or pressing the Stop
button of a streaming reply) and how to read what the bot shows there (to everyone, and to one
person alone): `Platform`. One across a network also knows how to make it misbehave (rate
limits, refusals, answers without ids, a "typing…" request kept in flight): `RemotePlatform`.
The suite in test_conformance.py asks for the same behaviours of every platform. A new platform
adds a harness and joins the `platform` fixture's parameters.

Each harness edits fast (`edit_interval` 0.05 s) and posts a reply's first words at once
(`post_grace` 0), so a case sees every step of a stream; the cases about the grace and the
platform's limits ask for the shipped values themselves.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from channels.discord.channel import DiscordChannel
from channels.presses import STOP, payload
from channels.settings import DiscordSettings, SlackSettings, TelegramSettings
from channels.slack.channel import SlackChannel, SlackTokens
from channels.telegram.channel import TelegramChannel
from core.agent.profile import AgentProfile
from core.channel import Channel, Reply
from core.dispatch.dispatcher import Allowed
from core.features.subagents.runs import SubagentSettings
from core.store import Store
from tests.fakes.discord import BOT_TOKEN as DISCORD_BOT_TOKEN
from tests.fakes.discord import USER_ID as DISCORD_USER_ID
from tests.fakes.discord import Call as DiscordCall
from tests.fakes.discord import FakeDiscord, user_object
from tests.fakes.discord import Sent as DiscordSent
from tests.fakes.ollama import ToolCall
from tests.fakes.patience import deadline
from tests.fakes.slack import APP_TOKEN as SLACK_APP_TOKEN
from tests.fakes.slack import BOT_TOKEN as SLACK_BOT_TOKEN
from tests.fakes.slack import TEAM as SLACK_TEAM
from tests.fakes.slack import Call as SlackCall
from tests.fakes.slack import FakeSlack, Posted
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.fakes.telegram import Call as TelegramCall
from tests.harness import Bot, BotFactory

ANN, BOB, MALLORY = 1001, 1002, 6666
POOL_SIZE = 32
"""Telegram's HTTP connection pool here (256 in production): small, so that a connection never
given back soon leaves a request waiting for a slot."""
ALLOWED = frozenset({str(ANN), str(BOB)})
SLACK_ALLOWED = frozenset({f"U{ANN}", f"U{BOB}"})

RESEARCHER = AgentProfile(
    name="researcher",
    model="test-model",
    system_prompt="You research one thing.",
    tools={},
    description="Looks one thing up.",
)
WITH_HELPERS: dict[str, Any] = {
    "agents": {"researcher": RESEARCHER},
    "delegates_to": ("researcher",),
    "subagents": SubagentSettings(status_message=False),
}
"""A bot whose agent may hand tasks to `researcher` sub-agents (`make_bot` settings)."""


def research(*instructions: str) -> ToolCall:
    """The model's call handing each instruction to a researcher."""
    tasks = [{"profile": "researcher", "instruction": text} for text in instructions]
    return ToolCall("delegate", {"tasks": tasks})


class Platform(Protocol):
    name: str
    limit: int
    bot: Bot

    def place(self, chat: int) -> str: ...
    def name_of(self, user: int) -> str:
        """The name the platform shows people for `user` (never the id alone)."""
        ...

    def say(self, chat: int, text: str, *, user: int | None = None) -> str:
        """A person writes in `chat`; returns the platform's id of the message."""
        ...

    def say_again(self, chat: int, message_id: str) -> None:
        """The platform delivers the same message a second time."""
        ...

    def reply(self, chat: int) -> Reply:
        """A reply in `chat`, opened on the channel as the core opens one for a person's
        message there (with that message, where the platform's "typing…" needs one)."""
        ...

    def shown(self, chat: int) -> list[str]:
        """What a person sees from the bot in `chat`, one entry per message, oldest first (what
        the bot shows one person alone aside)."""
        ...

    def seen(self, chat: int) -> list[str]:
        """`shown`, and what the reply being written says it is doing where a platform shows
        that apart from its messages (the web chat's status line)."""
        ...

    def buttons(self, chat: int) -> list[str]:
        """The payloads (`channels.presses.payload`) of the buttons the bot's messages in
        `chat` show now, oldest message first."""
        ...

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        """A person (the chat's own unless `user`) presses the newest button with payload
        `data` in `chat`."""
        ...

    def has_stop_button(self, chat: int) -> bool:
        """Whether a bot message in `chat` carries a Stop button now."""
        ...

    def press_stop(self, chat: int, *, user: int | None = None) -> None:
        """A person (the chat's own unless `user`) presses the Stop button in `chat`."""
        ...

    def told_privately(self, chat: int) -> list[str]:
        """What the bot showed in `chat` to one person alone (the answers to presses)."""
        ...

    def edit_times(self, chat: int) -> list[float]:
        """When the bot's messages in `chat` were changed (each edit the platform took)."""
        ...

    def fences_intact(self, chat: int) -> bool:
        """Every bot message in `chat` has its code formatting whole (nothing leaked as text)."""
        ...

    async def wait_until(self, condition: Callable[[], object], what: str) -> None: ...


class RemotePlatform(Platform, Protocol):
    """A platform across a network, which a harness can make misbehave as a real one does."""

    def edits_tried(self, chat: int) -> int:
        """How many edits of the bot's messages in `chat` were asked for, refused ones too."""
        ...

    def rate_limit_edits(self, retry_after: float, times: int = 1) -> None: ...
    def refuse_posts(self, chat: int) -> None:
        """From now on the platform refuses every new message of the bot in `chat`."""
        ...

    def answer_posts_without_ids(self) -> None:
        """From now on the platform posts the bot's messages but answers without their ids."""
        ...

    def hang_up_on_the_next_post(self, chat: int) -> None:
        """The platform posts the bot's next message in `chat`, then cuts the connection
        unanswered."""
        ...

    def fail_the_next_read_back(self, chat: int) -> None:
        """The platform refuses the bot's next reading of `chat`'s messages (Slack's look for
        a post whose answer was lost); a platform where a bot reads none back ignores this."""
        ...

    def typing_waits_for_text(self) -> None:
        """From now on a "typing…" request is answered only once the bot has shown new text in
        its chat, so it is still in flight when the reply's first text goes out."""
        ...

    def typing_waits_for_company(self, count: int) -> None:
        """From now on "typing…" requests are answered only once `count` are in flight at once."""
        ...

    def typing_in_flight(self) -> int: ...
    def most_typing_in_flight(self) -> int: ...
    def abandoned(self) -> list[str]:
        """Requests whose client went away before their answer (cut off mid-flight)."""
        ...


@contextlib.asynccontextmanager
async def running(channel: Channel, bot: Bot) -> AsyncIterator[None]:
    """`channel` delivering into the bot's dispatcher for the block; then stopped in the order
    the app stops: no more receiving, every turn ended, then the channel closed."""
    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    try:
        yield
    finally:
        await channel.stop_receiving()
        await asyncio.wait_for(reading, deadline())
        await bot.runner.shutdown()
        await channel.close()


class Harness:
    """What every platform harness derives from its own readings (`shown`, `buttons`, `press`):
    the Stop button among the buttons, Stop as a press, and the plain Markdown check of code
    fences."""

    def shown(self, chat: int) -> list[str]:
        raise NotImplementedError

    def buttons(self, chat: int) -> list[str]:
        raise NotImplementedError

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        raise NotImplementedError

    def seen(self, chat: int) -> list[str]:
        return self.shown(chat)  # a platform's status line is in its message's text

    def has_stop_button(self, chat: int) -> bool:
        return payload(STOP) in self.buttons(chat)

    def press_stop(self, chat: int, *, user: int | None = None) -> None:
        self.press(chat, payload(STOP), user=user)

    def fences_intact(self, chat: int) -> bool:
        return all(text.count("```") % 2 == 0 for text in self.shown(chat))


class OnAFake(Harness):
    """What every harness of a platform across a network shares: the platform's fake, the bot,
    waiting on the fake, and holding "typing…" requests (each harness names its typing request,
    `typing`, and counts the bot's messages where one is, `posts_near`)."""

    typing: str

    def __init__(self, fake: Any, bot: Bot) -> None:
        self.fake = fake
        self.bot = bot

    def fail_the_next_read_back(self, chat: int) -> None:
        """Nothing to refuse: only Slack's bot reads its messages back (Telegram's Bot API has
        no method for it, and Discord's nonce makes a repeated post return the first)."""

    def posts_near(self, params: Mapping[str, Any]) -> Callable[[], int]:
        """A live count of the bot's messages in the chat of a typing request."""
        raise NotImplementedError

    async def wait_until(self, condition: Callable[[], object], what: str) -> None:
        await self.fake.wait_until(condition, what=what)

    def typing_waits_for_text(self) -> None:
        def until(params: Mapping[str, Any]) -> Callable[[], bool]:
            posts = self.posts_near(params)
            before = posts()
            return lambda: posts() > before

        self.fake.holds.hold(self.typing, until)

    def typing_waits_for_company(self, count: int) -> None:
        self.fake.holds.hold(self.typing, lambda _: lambda: self.most_typing_in_flight() >= count)

    def typing_in_flight(self) -> int:
        return self.fake.holds.in_flight(self.typing)

    def most_typing_in_flight(self) -> int:
        return self.fake.holds.most_in_flight(self.typing)

    def abandoned(self) -> list[str]:
        return list(self.fake.holds.abandoned)


class TelegramPlatform(OnAFake):
    name = "telegram"
    limit = 4096
    typing = "sendchataction"
    fake: FakeTelegram

    def __init__(self, fake: FakeTelegram, bot: Bot) -> None:
        super().__init__(fake, bot)
        self._presses: dict[int, list[str]] = {}
        """The callback queries of the Stop presses in each chat."""

    def place(self, chat: int) -> str:
        return f"telegram:{chat}"

    def name_of(self, user: int) -> str:
        return f"Person {user}"  # the first name the fake gives a presser, and messages here

    def say(self, chat: int, text: str, *, user: int | None = None) -> str:
        person = user or chat
        update = self.fake.user_message(chat, text, user_id=person, first_name=self.name_of(person))
        return str(update["message"]["message_id"])

    def say_again(self, chat: int, message_id: str) -> None:
        original = self.fake._user_messages[chat][int(message_id)]  # the same message, re-sent
        self.fake.push_update({"message": dict(original)})

    def reply(self, chat: int) -> Reply:
        return self.bot.channel.open_reply(self.place(chat), None)

    def shown(self, chat: int) -> list[str]:
        return [message.visible for message in self.fake.sent(chat)]

    def edit_times(self, chat: int) -> list[float]:
        return [call.at for call in self._edits(chat) if call.error is None]

    def edits_tried(self, chat: int) -> int:
        return len(self._edits(chat))

    def _edits(self, chat: int) -> list[TelegramCall]:
        calls = self.fake.calls_to("editMessageText")
        return [call for call in calls if int(call.params["chat_id"]) == chat]

    def rate_limit_edits(self, retry_after: float, times: int = 1) -> None:
        self.fake.fail_next("editMessageText", retry_after=retry_after, times=times)

    def refuse_posts(self, chat: int) -> None:
        refusal = "Bad Request: chat not found"
        self.fake.fail_next("sendMessage", status=400, description=refusal, times=100)

    def answer_posts_without_ids(self) -> None:
        self.fake.answer_without("sendMessage", "message_id")

    def hang_up_on_the_next_post(self, chat: int) -> None:
        self.fake.hang_up_after("sendMessage")

    def posts_near(self, params: Mapping[str, Any]) -> Callable[[], int]:
        chat = int(params["chat_id"])
        return lambda: len(self.fake.sent(chat))

    def fences_intact(self, chat: int) -> bool:
        formatted = [m for m in self.fake.sent(chat) if "```" in m.visible]
        return not formatted and all(m.parse_mode == "HTML" for m in self.fake.sent(chat))

    def buttons(self, chat: int) -> list[str]:
        return [data for message in self.fake.sent(chat) for data in message.buttons]

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        shown = [m for m in self.fake.sent(chat) if data in m.buttons][-1]
        pressed = self.fake.press_button(chat, shown.message_id, data, user_id=user or chat)
        self._presses.setdefault(chat, []).append(pressed["callback_query"]["id"])

    def told_privately(self, chat: int) -> list[str]:
        answers = [self.fake.callback_answers.get(query) for query in self._presses.get(chat, [])]
        return [answer.text for answer in answers if answer is not None and answer.text]


@contextlib.asynccontextmanager
async def telegram_platform(
    make_bot: BotFactory,
    *,
    fake: FakeTelegram | None = None,
    limits: bool = False,
    token: str = BOT_TOKEN,
    vision: bool = False,
    edit_interval: float = 0.05,
    post_grace: float = 0.0,
    store: Store | None = None,
    **settings: Any,
) -> AsyncIterator[TelegramPlatform]:
    """A running Telegram channel on the fake Bot API (a new one unless `fake` is given, keeping
    the Bot API's limits with `limits`); stops in the order the app does."""
    async with contextlib.AsyncExitStack() as stack:
        if fake is None:
            fake = await stack.enter_async_context(FakeTelegram(limits=limits))
        channel = TelegramChannel(
            TelegramSettings(
                base_url=fake.base_url,
                base_file_url=fake.base_file_url,
                edit_interval=edit_interval,
                post_grace=post_grace,
                poll_timeout=1,
                **settings,
            ),
            token,
            connection_pool_size=POOL_SIZE,
        )
        bot = make_bot(channel=channel, allowed=ALLOWED, images=vision, bot_store=store)
        polls = len(fake.calls_to("getUpdates"))
        async with running(channel, bot):
            await fake.wait_until(lambda: len(fake.calls_to("getUpdates")) > polls, what="a poll")
            yield TelegramPlatform(fake, bot)


class SlackPlatform(OnAFake):
    """Each chat is a direct message channel (`D<chat>`), the Slack shape closest to a chat."""

    name = "slack"
    limit = 3000
    typing = "reactions.add"  # Slack's "typing…" for bots: a reaction on the person's message
    fake: FakeSlack

    def place(self, chat: int) -> str:
        return f"slack:{SLACK_TEAM}:D{chat}:top"

    def name_of(self, user: int) -> str:
        return f"Person {user}"  # each person's display name (`slack_platform`)

    def say(self, chat: int, text: str, *, user: int | None = None) -> str:
        return self.fake.dm(f"D{chat}", text, user=f"U{user or chat}")

    def say_again(self, chat: int, message_id: str) -> None:
        (envelope,) = [
            envelope
            for envelope in self.fake.envelopes
            if envelope.get("payload", {}).get("event", {}).get("ts") == message_id
        ]
        self.fake.redeliver(envelope["envelope_id"])

    def reply(self, chat: int) -> Reply:
        said = self.fake.unseen_message(f"D{chat}", "a question", user=f"U{chat}")
        return self.bot.channel.open_reply(self.place(chat), f"D{chat}:{said}")

    def shown(self, chat: int) -> list[str]:
        return [posted.text for posted in self.fake.posted(f"D{chat}")]

    def edit_times(self, chat: int) -> list[float]:
        return [call.at for call in self._edits(chat) if call.error is None]

    def edits_tried(self, chat: int) -> int:
        return len(self._edits(chat))

    def _edits(self, chat: int) -> list[SlackCall]:
        calls = self.fake.calls_to("chat.update")
        return [call for call in calls if call.params.get("channel") == f"D{chat}"]

    def rate_limit_edits(self, retry_after: float, times: int = 1) -> None:
        self.fake.fail_next("chat.update", retry_after=retry_after, times=times)

    def refuse_posts(self, chat: int) -> None:
        self.fake.refuse("chat.postMessage", "channel_not_found")

    def answer_posts_without_ids(self) -> None:
        self.fake.answer_without("chat.postMessage", "ts")

    def hang_up_on_the_next_post(self, chat: int) -> None:
        self.fake.hang_up_after("chat.postMessage")

    def fail_the_next_read_back(self, chat: int) -> None:
        self.fake.fail_next("conversations.history", error="internal_error")  # a DM's top level

    def posts_near(self, params: Mapping[str, Any]) -> Callable[[], int]:
        channel = str(params["channel"])
        return lambda: len(self.fake.posted(channel))

    def buttons(self, chat: int) -> list[str]:
        return [data for posted in self.fake.posted(f"D{chat}") for data in slack_buttons(posted)]

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        shown = [p for p in self.fake.posted(f"D{chat}") if data in slack_buttons(p)][-1]
        self.fake.press_button(f"D{chat}", shown.ts, data, user=f"U{user or chat}")

    def told_privately(self, chat: int) -> list[str]:
        return [said.text for said in self.fake.ephemeral if said.channel == f"D{chat}"]


def slack_buttons(posted: Posted) -> list[str]:
    """The action ids of the buttons a Slack message shows (in its actions blocks)."""
    actions = [block for block in posted.blocks or [] if block.get("type") == "actions"]
    return [e.get("action_id", "") for block in actions for e in block["elements"]]


def slack_stop_button(posted: Posted) -> bool:
    """Whether a Slack message shows the Stop button."""
    return payload(STOP) in slack_buttons(posted)


@contextlib.asynccontextmanager
async def slack_platform(
    make_bot: BotFactory,
    *,
    fake: FakeSlack | None = None,
    limits: bool = False,
    edit_interval: float = 0.05,
    post_grace: float = 0.0,
    store: Store | None = None,
    **settings: Any,
) -> AsyncIterator[SlackPlatform]:
    """A running Slack channel over Socket Mode on the fake Slack (a new one unless `fake` is
    given, keeping Slack's limits with `limits`); stops as the app does."""
    async with contextlib.AsyncExitStack() as stack:
        if fake is None:
            fake = await stack.enter_async_context(FakeSlack(limits=limits))
        for person in (ANN, BOB, MALLORY):
            fake.person(f"U{person}", display_name=f"Person {person}", real_name="Someone Else")
        channel = SlackChannel(
            SlackSettings(
                api_url=fake.api_url, edit_interval=edit_interval, post_grace=post_grace, **settings
            ),
            SlackTokens(bot=SLACK_BOT_TOKEN, app=SLACK_APP_TOKEN),
        )
        rooms = frozenset(settings.get("allowed_channels", ()))
        bot = make_bot(channel=channel, allowed=SLACK_ALLOWED, rooms=rooms, bot_store=store)
        connected = fake.hellos
        async with running(channel, bot):
            await fake.wait_connected(connected + 1)
            yield SlackPlatform(fake, bot)


class DiscordPlatform(OnAFake):
    """Each chat is the direct message channel of the person with that id."""

    name = "discord"
    limit = 2000
    typing = "POST /channels/{channel}/typing"
    fake: FakeDiscord

    def __init__(self, fake: FakeDiscord, bot: Bot) -> None:
        super().__init__(fake, bot)
        self._said: dict[str, dict[str, Any]] = {}

    def place(self, chat: int) -> str:
        return f"discord:dm:{self.fake.open_dm(chat)}"

    def name_of(self, user: int) -> str:
        return str(user_object(user)["global_name"])

    def say(self, chat: int, text: str, *, user: int | None = None) -> str:
        assert user in (None, chat), "a Discord DM channel belongs to one person"
        message = self.fake.dm(chat, text)
        self._said[message["id"]] = message
        return str(message["id"])

    def say_again(self, chat: int, message_id: str) -> None:
        self.fake.replay_message(self._said[message_id])

    def reply(self, chat: int) -> Reply:
        return self.bot.channel.open_reply(self.place(chat), None)

    def shown(self, chat: int) -> list[str]:
        return [sent.content for sent in self._messages(chat) if not sent.ephemeral]

    def told_privately(self, chat: int) -> list[str]:
        return [sent.content for sent in self._messages(chat) if sent.ephemeral]

    def buttons(self, chat: int) -> list[str]:
        return [data for sent in self._messages(chat) for data in discord_buttons(sent)]

    def press(self, chat: int, data: str, *, user: int | None = None) -> None:
        shown = [sent for sent in self._messages(chat) if data in discord_buttons(sent)][-1]
        self.fake.button_click(shown.id, data, user_id=user or chat)

    def _messages(self, chat: int) -> list[DiscordSent]:
        channel = self.fake.dm_channel(chat)
        return [] if channel is None else self.fake.messages(channel)

    def edit_times(self, chat: int) -> list[float]:
        return [call.at for call in self._edits(chat) if call.status == 200]

    def edits_tried(self, chat: int) -> int:
        return len(self._edits(chat))

    def _edits(self, chat: int) -> list[DiscordCall]:
        return self.fake.calls_to("PATCH", f"/channels/{self.fake.open_dm(chat)}/messages/")

    def rate_limit_edits(self, retry_after: float, times: int = 1) -> None:
        self.fake.fail_next("PATCH", "/channels/", retry_after=retry_after, times=times)

    def refuse_posts(self, chat: int) -> None:
        path = f"/channels/{self.fake.open_dm(chat)}/messages"
        self.fake.fail_next("POST", path, status=403, times=100)

    def answer_posts_without_ids(self) -> None:
        self.fake.answer_without("POST", "/channels/", "id")

    def hang_up_on_the_next_post(self, chat: int) -> None:
        self.fake.hang_up_after("POST", f"/channels/{self.fake.open_dm(chat)}/messages")

    def posts_near(self, params: Mapping[str, Any]) -> Callable[[], int]:
        channel = int(params["channel"])
        return lambda: len(self.fake.messages(channel))


def discord_buttons(sent: DiscordSent) -> list[str]:
    """The custom ids of the buttons a Discord message carries."""
    return [c.get("custom_id", "") for row in sent.components for c in row.get("components", [])]


def has_stop_button(sent: DiscordSent) -> bool:
    """Whether a Discord message carries the Stop button (and nothing else)."""
    return discord_buttons(sent) == [payload(STOP)]


@contextlib.asynccontextmanager
async def discord_platform(
    make_bot: BotFactory,
    *,
    fake: FakeDiscord | None = None,
    limits: bool = False,
    access: Allowed | None = None,
    vision: bool = False,
    edit_interval: float = 0.05,
    post_grace: float = 0.0,
    **settings: Any,
) -> AsyncIterator[DiscordPlatform]:
    """A running Discord channel on the fake Discord, REST and gateway (a new one unless `fake`
    is given, keeping Discord's limits with `limits`); stops as the app does."""
    async with contextlib.AsyncExitStack() as stack:
        if fake is None:
            fake = await stack.enter_async_context(FakeDiscord(limits=limits))
        channel = DiscordChannel(
            DiscordSettings(
                api_base=fake.api_base,
                gateway_url=fake.gateway_url,
                edit_interval=edit_interval,
                post_grace=post_grace,
                **settings,
            ),
            DISCORD_BOT_TOKEN,
            guild_ready_timeout=0.01,
        )
        people = Allowed(users=ALLOWED | {str(DISCORD_USER_ID)})
        bot = make_bot(channel=channel, access=access or people, images=vision)
        async with running(channel, bot):
            await asyncio.wait_for(channel.connected.wait(), deadline())
            yield DiscordPlatform(fake, bot)
