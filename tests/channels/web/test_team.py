"""The web chat for a team behind a reverse proxy, over real HTTP on 127.0.0.1: the proxy names
each person in `X-Forwarded-User`, and only a request from its address (127.0.0.2 here, a client
bound there standing in for it) counts; the access rules are `bot.wiring`'s, as `kaiwa run`
builds them, so a stranger meets the dispatcher's own refusal."""

import asyncio
import dataclasses
from base64 import b64encode
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.config import ChannelsConfig, Config
from bot.wiring import access_rules
from channels.settings import WebSettings
from channels.web.channel import WebChannel
from core.errors import ConfigError
from tests.channels.platforms import running
from tests.channels.web.test_channel import PNG, WebClient, browser_session, signed_in
from tests.fakes.ollama import Text
from tests.fakes.patience import deadline
from tests.harness import Bot, BotFactory

PROXY = "127.0.0.2"
TEAM = WebSettings(
    enabled=True,
    port=0,
    user_header="X-Forwarded-User",
    trusted_proxies=[PROXY],
    allowed_users=["ann", "bob"],
)


@pytest.fixture
async def team(make_bot: BotFactory, tmp_path: Path) -> AsyncIterator[Bot]:
    channel = WebChannel(TEAM, tmp_path, announce=lambda _: None)
    rules = access_rules(Config(channels=ChannelsConfig(web=TEAM)))
    bot = make_bot(channel=channel, access=rules.platforms["web"])
    async with running(channel, bot):
        await asyncio.wait_for(channel.connected.wait(), deadline())
        yield bot


def web_of(bot: Bot) -> WebChannel:
    channel = bot.channel
    assert isinstance(channel, WebChannel)
    return channel


@dataclasses.dataclass
class Proxied:
    """Someone's browser, as the proxy forwards it: from `address`, naming `person`."""

    bot: Bot
    person: str
    address: str = PROXY

    async def __aenter__(self) -> WebClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(self.address, 0)),
            headers={"X-Forwarded-User": self.person},
        )
        return WebClient(self._session, web_of(self.bot).url)

    async def __aexit__(self, *_: object) -> None:
        await self._session.close()


async def page_of(client: WebClient) -> tuple[int, str]:
    async with client.session.get(client.url + "/") as answer:
        return answer.status, await answer.text()


async def test_the_proxys_header_signs_ann_in_and_her_conversations_are_hers(team: Bot) -> None:
    team.ollama.script(Text("Hello, Ann."))
    async with Proxied(team, "ann") as ann, Proxied(team, "bob") as bob:
        assert (await page_of(ann))[0] == 200
        hers = await ann.new_conversation()
        assert await ann.say(hers, "hi", "a1") == 202
        await team.runner.wait_idle(f"web:ann:{hers}")
        shown = [(b.role, b.text) for b in web_of(team).board.bubbles(hers)]
        assert shown == [("person", "hi"), ("kaiwa", "Hello, Ann.")]

        his = await bob.new_conversation()
        assert await ann.say(his, "let me in", "a2") == 404
        pressed = await ann.post("/api/press", {"conversation": his, "command": "/stop"})
        assert pressed.status == 404
        query = {"conversation": his}
        async with ann.session.get(ann.url + "/api/events", params=query) as answer:
            assert answer.status == 404, "his conversation's stream is not hers to follow"
        async with ann.session.get(ann.url + "/api/conversations") as answer:
            assert [each["id"] for each in (await answer.json())["conversations"]] == [hers]
        async with bob.session.get(bob.url + "/api/conversations") as answer:
            assert [each["id"] for each in (await answer.json())["conversations"]] == [his]
        assert len(team.ollama.requests) == 1


async def test_the_header_from_an_address_not_the_proxys_is_ignored(team: Bot) -> None:
    async with Proxied(team, "ann", address="127.0.0.1") as stranger:
        status, text = await page_of(stranger)
        assert status == 401
        assert "through your team's sign-in" in text
        async with stranger.session.get(stranger.url + "/api/conversations") as answer:
            assert answer.status == 401
        created = await stranger.post("/api/conversations", {})
        assert created.status == 401


async def test_a_stranger_the_proxy_names_is_refused_the_page_and_by_the_dispatcher(
    team: Bot,
) -> None:
    async with Proxied(team, "mallory<b>") as mallory:
        status, text = await page_of(mallory)
        assert status == 403
        assert "signed in as <strong>mallory&lt;b&gt;</strong>" in text
        assert "[channels.web].allowed_users" in text

        conversation = await mallory.new_conversation()
        body = {"conversation": conversation, "text": "hello?", "client_id": "m1"}
        sent = await mallory.post("/api/messages", {**body, "images": [b64encode(PNG).decode()]})
        assert sent.status == 202
        kept = web_of(team).board.bubbles(conversation)[0]
        assert (kept.text, kept.images) == ("hello?", ()), (
            "regression: a stranger's pictures filled the board"
        )
        stream = mallory.events(conversation)
        refusal = (
            "Sorry, mallory<b>, you are not allowed to use this bot. Ask its operator to add your "
            "user id mallory<b> to [channels.web].allowed_users."
        )
        await mallory.until(
            stream, lambda: ("notice", refusal, False) in mallory.bubbles(conversation)
        )
        await stream.aclose()
    assert team.ollama.requests == []


async def test_the_operators_link_still_signs_the_operator_in_beside_the_team(team: Bot) -> None:
    """The operator is not in allowed_users, and is still answered: the access rules add them."""
    team.ollama.script(Text("Yes, operator."))
    async for operator in signed_in(web_of(team)):
        assert (await page_of(operator))[0] == 200
        conversation = await operator.new_conversation()
        assert await operator.say(conversation, "still me?", "o1") == 202
        await team.runner.wait_idle(f"web:operator:{conversation}")
        shown = [(b.role, b.text) for b in web_of(team).board.bubbles(conversation)]
        assert shown == [("person", "still me?"), ("kaiwa", "Yes, operator.")]


async def test_without_a_link_or_the_proxy_the_page_says_both_ways(team: Bot) -> None:
    async with browser_session() as session:
        status, text = await page_of(WebClient(session, web_of(team).url))
    assert status == 401
    assert "through your team's sign-in" in text and "kaiwa web-link" in text


# -- the settings --------------------------------------------------------------------------------


def test_a_team_behind_a_proxy_may_be_served_on_an_address_others_reach(
    tmp_path: Path,
) -> None:
    WebChannel(dataclasses.replace(TEAM, host="0.0.0.0"), tmp_path)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"trusted_proxies": []}, "[channels.web].trusted_proxies is empty"),
        ({"trusted_proxies": ["proxy.lan"]}, 'trusted_proxies has "proxy.lan"'),
        ({"user_header": "X Forwarded User"}, '[channels.web].user_header is "X Forwarded User"'),
        ({"user_header": "", "host": "0.0.0.0"}, "[channels.web].user_header and trusted_proxies"),
    ],
)
def test_team_settings_that_would_leave_the_chat_open_are_refused_naming_the_key(
    tmp_path: Path, changes: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        WebChannel(dataclasses.replace(TEAM, **changes), tmp_path)
    assert named in str(refused.value)
