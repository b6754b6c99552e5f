"""The fake Slack, proven against the real slack_sdk (3.48) and slack_bolt (1.30).

What the real libraries do against it, as these tests pin down:
- ``AsyncWebClient`` sends ``chat.postMessage``/``chat.update`` as JSON, ``auth.test``,
  ``reactions.*`` and ``apps.connections.open`` as a POST with the parameters in the query
  string, ``conversations.replies``/``users.info`` as a GET, and ``api_call(data=...)`` as a form;
  the token always goes in ``Authorization: Bearer``. Its default retry handlers are only
  ``AsyncConnectionErrorRetryHandler`` (one retry on a dropped connection): a 429 is NOT retried,
  it raises ``SlackApiError`` with ``status_code`` 429 and ``Retry-After`` in the headers;
  retrying 429s is opt-in (``AsyncRateLimitErrorRetryHandler``, which sleeps Retry-After + <1 s).
- ``AsyncSocketModeHandler(app, app_token)`` calls ``apps.connections.open`` through
  ``web_client`` if given, else ``app.client``: the app's own client, so its ``base_url`` is the
  fake's, with the app token passed per call. A ``disconnect`` message makes it open a new URL
  and connect again before closing the old socket; a websocket close frame makes it reconnect at
  once; a cut TCP connection is only noticed by its monitor task, after up to ``ping_interval``
  seconds (10 s by default in the bolt handler).
- bolt acks an envelope only when a listener (or the self-events middleware) handled it: an
  event nothing listens to gets a 404 inside bolt and is NOT acked, so Slack would redeliver it.
  bolt drops no retries: a redelivered envelope (Socket Mode) or an ``X-Slack-Retry-Num`` POST
  (HTTP) reaches the listener again, and in Socket Mode every event carries the header, "0" on
  the first delivery. bolt skips the bot's own messages (``user`` == auth.test ``user_id`` or
  ``bot_id`` == its ``bot_id``, edits included) but passes other bots' messages through.
- A button press is an ``interactive`` envelope in Socket Mode and a form POST with the JSON in
  its ``payload`` field over HTTP; either way bolt hands the ``block_actions`` payload to the
  ``app.action(action_id)`` listener. ``chat_update`` without ``blocks`` sends none (slack_sdk
  drops None values), while ``blocks=[]`` is sent as an empty list: the only way to take a
  message's blocks away.
- bolt's ``app.event("message")`` takes a ``file_share`` message as any other (it filters no
  subtype), its file objects in ``files``. A file's bytes come to aiohttp with the bot token in
  ``Authorization: Bearer``; without it, or without the files:read scope, the request ends, after
  one redirect, on an HTML sign-in page with HTTP 200, as on Slack.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from .patience import deadline
from .slack import (
    APP_TOKEN,
    BOT_ID,
    BOT_TOKEN,
    BOT_USER,
    MAX_TEXT_CHARS,
    SIGNING_SECRET,
    TEAM,
    Ephemeral,
    FakeSlack,
    Upload,
)

LIBRARY_SECONDS = deadline()
T = TypeVar("T")
MakeBolt = Callable[..., tuple[AsyncApp, AsyncSocketModeHandler]]


async def within(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(LIBRARY_SECONDS):
        return await awaitable


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def client(fake: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url)


@pytest.fixture
async def make_bolt(fake: FakeSlack) -> AsyncIterator[MakeBolt]:
    """Socket Mode bolt apps; ``process_before_response`` makes the ack follow the listener,
    so "acked" means "the listener has run"."""
    handlers: list[AsyncSocketModeHandler] = []

    def make(
        *, process_before_response: bool = True, ping_interval: float = 10.0
    ) -> tuple[AsyncApp, AsyncSocketModeHandler]:
        app = AsyncApp(
            client=AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url),
            process_before_response=process_before_response,
        )
        handler = AsyncSocketModeHandler(app, APP_TOKEN, ping_interval=ping_interval)
        handlers.append(handler)
        return app, handler

    yield make
    for handler in handlers:
        await within(handler.close_async())


async def connect(fake: FakeSlack, handler: AsyncSocketModeHandler, n: int = 1) -> None:
    await within(handler.connect_async())
    await fake.wait_connected(n)


def envelope_ids(fake: FakeSlack, kind: str, ts: str | None = None) -> list[str]:
    """Ids of the events_api envelopes whose event has that type (and ts)."""
    return [
        envelope["envelope_id"]
        for envelope in fake.envelopes
        if envelope["type"] == "events_api"
        and envelope["payload"]["event"]["type"] == kind
        and (ts is None or envelope["payload"]["event"].get("ts") == ts)
    ]


def all_acked(fake: FakeSlack) -> bool:
    return {envelope["envelope_id"] for envelope in fake.envelopes} <= fake.acked


# --- Web API ---


async def test_auth_test_answers_for_the_bot_token_only(fake: FakeSlack, client: AsyncWebClient):
    reply = await within(client.auth_test())

    assert reply.status_code == 200
    assert reply.data == {
        "ok": True,
        "url": "https://test.slack.com/",
        "team": "Test",
        "user": "kaiwa",
        "team_id": TEAM,
        "user_id": BOT_USER,
        "bot_id": BOT_ID,
        "is_enterprise_install": False,
    }
    for token, error in [
        ("xoxb-wrong", "invalid_auth"),
        (APP_TOKEN, "not_allowed_token_type"),
        (None, "not_authed"),
    ]:
        other = AsyncWebClient(token=token, base_url=fake.api_url)
        with pytest.raises(SlackApiError) as caught:
            await within(other.auth_test())
        assert (caught.value.response.status_code, caught.value.response["error"]) == (200, error)

    assert [(call.token, call.error) for call in fake.calls_to("auth.test")] == [
        (BOT_TOKEN, None),
        ("xoxb-wrong", "invalid_auth"),
        (APP_TOKEN, "not_allowed_token_type"),
        (None, "not_authed"),
    ]


async def test_post_update_and_replies_round_trip(fake: FakeSlack, client: AsyncWebClient):
    parent = fake.mention("C1", "hello")  # a person's message, so the thread has a root

    sent = await within(client.chat_postMessage(channel="C1", text="thinking", thread_ts=parent))
    assert (sent["channel"], sent["message"]["text"], sent["message"]["bot_id"]) == (
        "C1",
        "thinking",
        BOT_ID,
    )
    assert sent["ts"] > parent
    other = await within(client.chat_postMessage(channel="C1", text="top level"))
    assert other["ts"] > sent["ts"]

    updated = await within(client.chat_update(channel="C1", ts=sent["ts"], text="part"))
    assert (updated["ts"], updated["text"]) == (sent["ts"], "part")
    await within(client.chat_update(channel="C1", ts=sent["ts"], text="done"))

    [reply] = fake.posted("C1", thread_ts=parent)
    assert (reply.ts, reply.text, reply.thread_ts, reply.updates) == (
        sent["ts"],
        "done",
        parent,
        ["part", "done"],
    )
    assert [p.text for p in fake.posted("C1")] == ["top level"]  # top level only
    assert [p.text for p in fake.all_posted] == ["done", "top level"]

    for ts in (parent, sent["ts"]):  # the root or any reply gives the whole thread
        thread = await within(client.conversations_replies(channel="C1", ts=ts))
        messages = thread["messages"]
        assert [(m["ts"], m["user"], m["text"]) for m in messages] == [
            (parent, "U1", f"<@{BOT_USER}> hello"),
            (sent["ts"], BOT_USER, "done"),
        ]
        assert (messages[0]["reply_count"], messages[0]["latest_reply"]) == (1, sent["ts"])
        assert messages[1]["thread_ts"] == parent

    for ts, error in [("1.000001", "message_not_found"), (parent, "cant_update_message")]:
        with pytest.raises(SlackApiError) as caught:
            await within(client.chat_update(channel="C1", ts=ts, text="x"))
        assert caught.value.response["error"] == error
    with pytest.raises(SlackApiError) as caught:
        await within(client.conversations_replies(channel="C1", ts="1.000001"))
    assert caught.value.response["error"] == "thread_not_found"


STOP_BLOCKS = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "working"}},
    {
        "type": "actions",
        "block_id": "controls",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": "Stop"},
                "action_id": "stop",
                "value": "stop",
            }
        ],
    },
]


async def test_an_update_keeps_the_blocks_unless_it_sends_an_empty_list(
    fake: FakeSlack, client: AsyncWebClient
):
    """As Slack documents for chat.update: blocks left out are kept; ``blocks=[]`` removes them."""
    sent = await within(client.chat_postMessage(channel="D1", text="working", blocks=STOP_BLOCKS))
    await within(client.chat_update(channel="D1", ts=sent["ts"], text="still working"))
    [kept] = fake.posted("D1")
    assert (kept.text, kept.blocks) == ("still working", STOP_BLOCKS)

    await within(client.chat_update(channel="D1", ts=sent["ts"], text="done", blocks=[]))
    [done] = fake.posted("D1")
    assert (done.text, done.blocks) == ("done", None)
    thread = await within(client.conversations_replies(channel="D1", ts=sent["ts"]))
    assert "blocks" not in thread["messages"][0]


async def test_an_ephemeral_message_is_kept_apart_from_the_posted_ones(
    fake: FakeSlack, client: AsyncWebClient
):
    parent = fake.mention("C1", "hello")
    await within(
        client.chat_postEphemeral(channel="C1", user="U7", text="just for you", thread_ts=parent)
    )
    assert fake.ephemeral == [Ephemeral("C1", "U7", "just for you", parent)]
    assert fake.posted("C1", thread_ts=parent) == []


async def test_parameters_arrive_as_query_form_or_json(fake: FakeSlack, client: AsyncWebClient):
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}]
    await within(client.api_call("chat.postMessage", data={"channel": "C1", "text": "form"}))
    await within(
        client.api_call(
            "chat.postMessage", json={"channel": "C1", "text": "json", "blocks": blocks}
        )
    )
    await within(client.api_call("chat.postMessage", params={"channel": "C1", "text": "query"}))
    await within(
        client.api_call(
            "chat.postMessage", data={"channel": "C1", "text": "x", "blocks": json.dumps(blocks)}
        )
    )
    async with aiohttp.ClientSession() as session:  # the token as a form field, as curl users do
        form = {"token": BOT_TOKEN, "channel": "C1", "text": "curl"}
        async with session.post(f"{fake.api_url}chat.postMessage", data=form) as response:
            assert (await response.json())["ok"] is True

    posted = fake.posted("C1")
    assert [p.text for p in posted] == ["form", "json", "query", "x", "curl"]
    assert posted[1].blocks == blocks and posted[3].blocks == blocks
    assert [call.token for call in fake.calls] == [BOT_TOKEN] * 5
    assert all("token" not in call.params for call in fake.calls)


async def test_the_wrappers_use_json_query_and_get_as_slack_sdk_chooses(
    fake: FakeSlack, client: AsyncWebClient
):
    ts = fake.message("C1", "hi")
    await within(client.chat_postMessage(channel="C1", text="hello", unfurl_links=False))
    await within(client.reactions_add(channel="C1", timestamp=ts, name="eyes"))

    post = fake.calls_to("chat.postMessage")[0].params
    assert post == {"channel": "C1", "text": "hello", "unfurl_links": False}  # JSON keeps types
    reaction = fake.calls_to("reactions.add")[0].params
    assert reaction == {"channel": "C1", "timestamp": ts, "name": "eyes"}  # query strings


async def test_ratelimited_is_a_429_that_slack_sdk_does_not_retry_by_default(
    fake: FakeSlack, client: AsyncWebClient
):
    assert [type(handler).__name__ for handler in client.retry_handlers] == [
        "AsyncConnectionErrorRetryHandler"
    ]
    fake.fail_next("chat.postMessage", retry_after=7)

    with pytest.raises(SlackApiError) as caught:
        await within(client.chat_postMessage(channel="C1", text="hi"))

    response = caught.value.response
    assert (response.status_code, response["error"]) == (429, "ratelimited")
    assert response.headers["Retry-After"] == "7"
    [call] = fake.calls_to("chat.postMessage")
    assert (call.error, call.status) == ("ratelimited", 429)

    await within(client.chat_postMessage(channel="C1", text="hi"))  # the failure is used up
    assert [p.text for p in fake.posted("C1")] == ["hi"]


async def test_retrying_rate_limits_is_opt_in(fake: FakeSlack):
    retrying = AsyncWebClient(
        token=BOT_TOKEN,
        base_url=fake.api_url,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)],
    )
    fake.fail_next("chat.postMessage", retry_after=0)  # it sleeps Retry-After + random() < 1 s

    await within(retrying.chat_postMessage(channel="C1", text="hi"))

    assert [call.error for call in fake.calls_to("chat.postMessage")] == ["ratelimited", None]
    assert [p.text for p in fake.posted("C1")] == ["hi"]


async def test_other_scripted_errors_are_http_200(fake: FakeSlack, client: AsyncWebClient):
    fake.fail_next("chat.update", error="channel_not_found", times=2)
    sent = await within(client.chat_postMessage(channel="C1", text="a"))

    for _ in range(2):
        with pytest.raises(SlackApiError) as caught:
            await within(client.chat_update(channel="C1", ts=sent["ts"], text="b"))
        response = caught.value.response
        assert (response.status_code, response["error"]) == (200, "channel_not_found")
        assert "Retry-After" not in response.headers
    await within(client.chat_update(channel="C1", ts=sent["ts"], text="b"))
    assert fake.posted("C1")[0].updates == ["b"]
    with pytest.raises(ValueError, match="at least 1"):
        fake.fail_next("chat.update", times=0)


async def test_message_limits_and_unknown_methods(fake: FakeSlack, client: AsyncWebClient):
    longest = "x" * MAX_TEXT_CHARS
    sent = await within(client.chat_postMessage(channel="C1", text=longest))
    assert len(fake.posted("C1")[0].text) == MAX_TEXT_CHARS

    refusals: list[tuple[Callable[[], Awaitable[Any]], str]] = [
        (lambda: client.chat_postMessage(channel="C1", text=longest + "x"), "msg_too_long"),
        (
            lambda: client.chat_update(channel="C1", ts=sent["ts"], text=longest + "x"),
            "msg_too_long",
        ),
        # api_call: chat_postMessage() without text emits a UserWarning (an error here)
        (lambda: client.api_call("chat.postMessage", json={"channel": "C1"}), "no_text"),
        (lambda: client.chat_postMessage(channel="", text="x"), "channel_not_found"),
        (
            lambda: client.chat_postMessage(
                channel="C1", text="x", blocks=[{"type": "header", "text": {"text": "h" * 151}}]
            ),
            "invalid_blocks",
        ),
        (lambda: client.api_call("chat.fooBar"), "unknown_method"),
        (lambda: client.users_info(user="nobody"), "user_not_found"),
    ]
    for call, error in refusals:
        with pytest.raises(SlackApiError) as caught:
            await within(call())
        assert caught.value.response["error"] == error

    person = await within(client.users_info(user="U1"))
    me = await within(client.users_info(user=BOT_USER))
    assert (person["user"]["id"], person["user"]["is_bot"], me["user"]["is_bot"]) == (
        "U1",
        False,
        True,
    )
    assert [call.method for call in fake.calls if call.error == "unknown_method"] == ["chat.fooBar"]


async def test_reactions(fake: FakeSlack, client: AsyncWebClient):
    ts = fake.dm("D1", "hi")

    await within(client.reactions_add(channel="D1", timestamp=ts, name="eyes"))
    await within(client.reactions_add(channel="D1", timestamp=ts, name=":white_check_mark:"))
    assert fake.reactions("D1", ts) == {"eyes", "white_check_mark"}
    with pytest.raises(SlackApiError) as caught:
        await within(client.reactions_add(channel="D1", timestamp=ts, name="eyes"))
    assert caught.value.response["error"] == "already_reacted"

    await within(client.reactions_remove(channel="D1", timestamp=ts, name="eyes"))
    assert fake.reactions("D1", ts) == {"white_check_mark"}
    for call, error in [
        (lambda: client.reactions_remove(channel="D1", timestamp=ts, name="eyes"), "no_reaction"),
        (
            lambda: client.reactions_add(channel="D1", timestamp="9.9", name="x"),
            "message_not_found",
        ),
        (lambda: client.reactions_add(channel="D1", timestamp=ts, name=""), "invalid_name"),
    ]:
        with pytest.raises(SlackApiError) as caught:
            await within(call())
        assert caught.value.response["error"] == error

    thread = await within(client.conversations_replies(channel="D1", ts=ts))
    assert thread["messages"][0]["reactions"] == [
        {"name": "white_check_mark", "users": [BOT_USER], "count": 1}
    ]


# --- Slack's limits (limits=True) ---


@pytest.fixture
async def limited() -> AsyncIterator[FakeSlack]:
    """A fake keeping Slack's limits, on a clock that moves only when the test moves it."""
    async with FakeSlack(limits=True) as server:
        server.rate_limits.clock.stop()
        yield server


@pytest.fixture
def limited_client(limited: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=BOT_TOKEN, base_url=limited.api_url)


async def refused(call: Awaitable[Any]) -> tuple[int, str, str]:
    """The HTTP status, error and Retry-After of a call slack_sdk raised for."""
    with pytest.raises(SlackApiError) as caught:
        await within(call)
    response = caught.value.response
    return response.status_code, response["error"], response.headers.get("Retry-After", "")


async def test_past_a_channels_posting_limit_a_post_is_a_429_with_retry_after(
    limited: FakeSlack, limited_client: AsyncWebClient
) -> None:
    for n in range(3):
        await within(limited_client.chat_postMessage(channel="C1", text=f"post {n}"))

    answer = await refused(limited_client.chat_postMessage(channel="C1", text="too soon"))

    assert answer == (429, "ratelimited", "3")
    assert [(r.what, r.window.key) for r in limited.refused_429] == [
        ("chat.postMessage", "C1 posts")
    ]
    await within(limited_client.chat_postMessage(channel="C2", text="elsewhere"))  # its own
    limited.rate_limits.clock.advance(3)
    await within(limited_client.chat_postMessage(channel="C1", text="in time"))
    assert len(limited.posted("C1")) == 4


async def test_each_tiered_method_has_its_own_minute_for_the_workspace(
    limited: FakeSlack, limited_client: AsyncWebClient
) -> None:
    """Tier 3 (50 a minute) for updates and adding reactions, Tier 2 (20) for removing one."""
    sent = await within(limited_client.chat_postMessage(channel="C1", text="hi"))
    for n in range(50):
        await within(limited_client.chat_update(channel="C1", ts=sent["ts"], text=f"v{n}"))
    for _ in range(20):
        await within(limited_client.reactions_add(channel="C1", timestamp=sent["ts"], name="eyes"))
        await within(
            limited_client.reactions_remove(channel="C1", timestamp=sent["ts"], name="eyes")
        )
    await within(limited_client.reactions_add(channel="C1", timestamp=sent["ts"], name="eyes"))

    update = limited_client.chat_update(channel="C1", ts=sent["ts"], text="one too many")
    assert await refused(update) == (429, "ratelimited", "60")
    removal = limited_client.reactions_remove(channel="C1", timestamp=sent["ts"], name="eyes")
    assert await refused(removal) == (429, "ratelimited", "60")
    assert [r.window.key for r in limited.refused_429] == ["chat.update", "reactions.remove"]
    limited.rate_limits.clock.advance(60)
    await within(limited_client.chat_update(channel="C1", ts=sent["ts"], text="a minute on"))


async def test_methods_without_a_limit_here_are_never_refused(
    limited: FakeSlack, limited_client: AsyncWebClient
) -> None:
    for _ in range(60):
        await within(limited_client.auth_test())

    assert limited.refused_429 == [] and limited.rate_limits.admitted == []


async def test_without_limits_nothing_is_refused(fake: FakeSlack, client: AsyncWebClient) -> None:
    for n in range(10):
        await within(client.chat_postMessage(channel="C1", text=f"post {n}"))

    assert len(fake.posted("C1")) == 10
    assert fake.refused_429 == [] and fake.rate_limits.admitted == []


# --- Socket Mode ---


async def test_bolt_gets_messages_and_mentions_and_acks_them(fake: FakeSlack, make_bolt: MakeBolt):
    app, handler = make_bolt(process_before_response=False)  # bolt's default
    seen: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        await seen.put(("message", event))

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: Any) -> None:
        await seen.put(("app_mention", event))
        await say(text="hi back", thread_ts=event["ts"])

    await connect(fake, handler)
    plain = fake.message("C1", "just chatting")
    kind, event = await within(seen.get())
    assert (kind, event["ts"], event["text"], event["channel_type"]) == (
        "message",
        plain,
        "just chatting",
        "channel",
    )

    ts = fake.mention("C1", "hello")
    got = [await within(seen.get()), await within(seen.get())]
    assert sorted(kind for kind, _ in got) == ["app_mention", "message"]
    assert {event["ts"] for _, event in got} == {ts}
    assert {event["text"] for _, event in got} == {f"<@{BOT_USER}> hello"}
    [mention_envelope] = envelope_ids(fake, "app_mention")
    event_ids = {e["payload"]["event_id"] for e in fake.envelopes}
    assert len(event_ids) == len(fake.envelopes)  # each envelope has its own event id

    await fake.wait_until(lambda: fake.posted("C1", thread_ts=ts), what="the threaded reply")
    assert fake.posted("C1", thread_ts=ts)[0].text == "hi back"
    # the reply comes back as a message event with bot_id (the echo) and is acked too
    await fake.wait_until(lambda: len(fake.envelopes) == 4 and all_acked(fake))
    echo = fake.envelopes[-1]["payload"]["event"]
    assert (echo["bot_id"], echo["user"], echo["thread_ts"]) == (BOT_ID, BOT_USER, ts)
    assert mention_envelope in fake.acked
    assert all(ack.payload is None for ack in fake.acks)


async def test_the_handler_opens_its_url_through_the_app_client_with_the_app_token(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    assert handler.client.web_client is app.client  # no web_client given: the app's client
    await connect(fake, handler)

    [call] = fake.calls_to("apps.connections.open")
    assert (call.token, call.error, fake.connections_opened) == (APP_TOKEN, None, 1)
    assert handler.client.wss_uri is not None
    assert handler.client.wss_uri.startswith(fake.url.replace("http://", "ws://") + "/socket?")
    assert fake.open_sockets == 1


async def test_a_wrong_app_token_is_refused(fake: FakeSlack):
    web_client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url)
    for token, error in [("xapp-wrong", "invalid_auth"), (BOT_TOKEN, "not_allowed_token_type")]:
        with pytest.raises(SlackApiError) as caught:
            await within(web_client.apps_connections_open(app_token=token))
        assert caught.value.response["error"] == error


async def test_bolt_ignores_its_own_messages_but_not_other_bots(
    fake: FakeSlack, make_bolt: MakeBolt, client: AsyncWebClient
):
    app, handler = make_bolt()
    seen: list[dict[str, Any]] = []

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        seen.append(event)

    await connect(fake, handler)
    mine = await within(client.chat_postMessage(channel="C1", text="mine"))
    await within(client.chat_update(channel="C1", ts=mine["ts"], text="mine, edited"))
    classic = fake.bot_message("C1", "beep")
    modern = fake.bot_message("C1", "boop", user="UOTHER", bot_id="BOTHER2")
    await fake.wait_until(lambda: len(fake.envelopes) == 4 and all_acked(fake))

    assert sorted(event["ts"] for event in seen) == [classic, modern]
    kinds = [e["payload"]["event"].get("subtype") for e in fake.envelopes]
    assert kinds == [None, "message_changed", "bot_message", None]


async def test_disconnect_makes_it_reconnect_and_later_events_arrive_once(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    seen: list[str] = []

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        seen.append(event["text"])

    await connect(fake, handler)
    before = fake.message("C1", "before")
    await fake.wait_until(lambda: all_acked(fake))
    await fake.disconnect()
    await fake.wait_connected(2)
    assert fake.connections_opened == 2
    await fake.wait_until(lambda: fake.open_sockets == 1, what="the old socket closed")

    after = fake.message("C1", "after")
    await fake.wait_until(lambda: all_acked(fake))
    assert sorted(seen) == ["after", "before"]
    assert [len(envelope_ids(fake, "message", ts)) for ts in (before, after)] == [1, 1]


async def test_a_close_frame_makes_it_reconnect_at_once(fake: FakeSlack, make_bolt: MakeBolt):
    app, handler = make_bolt(ping_interval=60)  # so only the CLOSE frame can explain a reconnect
    seen: list[str] = []

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        seen.append(event["text"])

    await connect(fake, handler)
    await fake.drop_socket()
    fake.message("C1", "while away")  # waits for the next hello
    await fake.wait_connected(2)

    await fake.wait_until(lambda: all_acked(fake) and fake.envelopes)
    assert seen == ["while away"]
    assert fake.connections_opened == 2


async def test_a_cut_connection_is_noticed_after_ping_interval(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt(ping_interval=0.2)
    seen: list[str] = []

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        seen.append(event["text"])

    await connect(fake, handler)
    await fake.drop_socket(abort=True)
    fake.message("C1", "while away")
    assert len(fake.pending) == 1
    await fake.wait_connected(2)

    await fake.wait_until(lambda: all_acked(fake) and fake.envelopes)
    assert seen == ["while away"]
    assert fake.pending == []


async def test_envelopes_made_before_the_first_connection_wait_for_hello(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    seen: list[str] = []

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        seen.append(event["text"])

    fake.dm("D1", "first")
    fake.dm("D1", "second")
    assert len(fake.pending) == 2
    await connect(fake, handler)

    await fake.wait_until(lambda: len(fake.acked) == 2)
    assert sorted(seen) == ["first", "second"]


async def test_an_unhandled_event_is_not_acked_and_can_be_redelivered(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()

    @app.event("app_mention")
    async def on_mention() -> None:
        pass

    async def probe(client: Any, request: SocketModeRequest) -> None:
        """Runs after bolt's listener; its message follows bolt's ack (if any) on the socket."""
        note = {"probe": request.envelope_id, "retry_attempt": request.retry_attempt}
        await client.send_message(json.dumps(note))

    handler.client.socket_mode_request_listeners.append(probe)
    await connect(fake, handler)

    fake.message("C1", "nobody listens to plain messages")
    [envelope_id] = envelope_ids(fake, "message")
    await fake.wait_until(lambda: len(fake.socket_messages) == 1)
    assert envelope_id not in fake.acked  # bolt answered 404 inside, so no ack

    again = fake.redeliver(envelope_id)
    assert (again["envelope_id"], again["retry_attempt"], again["retry_reason"]) == (
        envelope_id,
        1,
        "timeout",
    )
    await fake.wait_until(lambda: len(fake.socket_messages) == 2)
    assert fake.socket_messages == [
        {"probe": envelope_id, "retry_attempt": 0},
        {"probe": envelope_id, "retry_attempt": 1},
    ]
    assert fake.acked == set()
    assert [e["retry_attempt"] for e in fake.envelopes] == [0, 1]


async def test_bolt_passes_redeliveries_to_the_listener_with_the_retry_header(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    seen: list[tuple[str, list[str] | None]] = []

    @app.event("message")
    async def on_message(event: dict[str, Any], request: Any) -> None:
        seen.append((event["ts"], request.headers.get("x-slack-retry-num")))

    await connect(fake, handler)
    ts = fake.message("C1", "hi")
    [envelope_id] = envelope_ids(fake, "message")
    await fake.wait_until(lambda: envelope_id in fake.acked)
    fake.redeliver(envelope_id)  # as if the ack had been lost
    await fake.wait_until(lambda: len(fake.acks) == 2)

    assert seen == [(ts, ["0"]), (ts, ["1"])]


async def test_a_slash_command_reaches_bolt_and_its_ack_payload_is_recorded(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt(process_before_response=False)
    commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @app.command("/kaiwa")
    async def kaiwa(ack: Any, command: dict[str, Any], respond: Any) -> None:
        await ack("on it")
        await commands.put(command)
        await respond("done")

    await connect(fake, handler)
    envelope_id = fake.slash_command("/kaiwa", "status please", channel="C9", user="U7")

    command = await within(commands.get())
    assert (command["command"], command["text"], command["channel_id"], command["user_id"]) == (
        "/kaiwa",
        "status please",
        "C9",
        "U7",
    )
    await fake.wait_until(lambda: envelope_id in fake.acked)
    [ack] = fake.acks
    assert (ack.envelope_id, ack.payload) == (envelope_id, {"text": "on it"})
    await fake.wait_until(lambda: fake.responses)
    assert fake.responses[0].envelope_id == envelope_id
    assert fake.responses[0].body["text"] == "done"


async def test_a_pressed_button_reaches_bolts_action_listener(
    fake: FakeSlack, make_bolt: MakeBolt, client: AsyncWebClient
):
    app, handler = make_bolt()
    pressed: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @app.action("stop")
    async def stop(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        await pressed.put({"body": body, "action": action})

    await connect(fake, handler)
    parent = fake.mention("C1", "hello")
    sent = await within(
        client.chat_postMessage(channel="C1", thread_ts=parent, text="working", blocks=STOP_BLOCKS)
    )
    envelope_id = fake.press_button("C1", sent["ts"], "stop", user="U7")

    got = await within(pressed.get())
    body, action = got["body"], got["action"]
    assert (body["type"], body["user"]["id"], body["team"]["id"]) == ("block_actions", "U7", TEAM)
    assert (body["channel"]["id"], body["message"]["ts"]) == ("C1", sent["ts"])
    assert body["message"]["thread_ts"] == body["container"]["thread_ts"] == parent
    assert (action["action_id"], action["block_id"], action["value"]) == (
        "stop",
        "controls",
        "stop",
    )
    await fake.wait_until(lambda: envelope_id in fake.acked)


async def test_only_a_button_the_message_shows_can_be_pressed(
    fake: FakeSlack, client: AsyncWebClient
):
    sent = await within(client.chat_postMessage(channel="D1", text="working", blocks=STOP_BLOCKS))
    await within(client.chat_update(channel="D1", ts=sent["ts"], text="done", blocks=[]))
    with pytest.raises(KeyError, match="no button 'stop'"):
        fake.press_button("D1", sent["ts"], "stop")
    with pytest.raises(KeyError):
        fake.press_button("D1", "1.000001", "stop")


async def test_slack_sdks_own_socket_mode_client(fake: FakeSlack):
    web_client = AsyncWebClient(base_url=fake.api_url)
    socket = SocketModeClient(app_token=APP_TOKEN, web_client=web_client)
    got: asyncio.Queue[SocketModeRequest] = asyncio.Queue()

    async def listener(client: Any, request: SocketModeRequest) -> None:
        await got.put(request)
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=request.envelope_id, payload={"ok": 1})
        )

    socket.socket_mode_request_listeners.append(listener)
    try:
        await within(socket.connect())
        await fake.wait_connected()
        ts = fake.mention("C1", "raw")
        requests = [await within(got.get()), await within(got.get())]
        await fake.wait_until(lambda: len(fake.acked) == 2)
    finally:
        await within(socket.close())

    assert {r.payload["event"]["type"] for r in requests} == {"app_mention", "message"}
    assert {r.payload["event"]["ts"] for r in requests} == {ts}
    assert {r.type for r in requests} == {"events_api"}
    assert [ack.payload for ack in fake.acks] == [{"ok": 1}, {"ok": 1}]


# --- HTTP Events mode ---


@pytest.fixture
async def http_app(fake: FakeSlack) -> AsyncIterator[tuple[AsyncApp, str]]:
    """A bolt app served in this loop: ``app.web_app()`` is an aiohttp Application."""
    app = AsyncApp(
        client=AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url),
        signing_secret=SIGNING_SECRET,
    )
    runner = web.AppRunner(app.web_app(path="/slack/events"), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield app, f"http://{host}:{port}/slack/events"
    await runner.cleanup()


async def test_a_signed_event_is_handled_and_a_bad_signature_is_refused(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    app, url = http_app
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: Any) -> None:
        await seen.put(event)
        await say(text="hello", thread_ts=event["ts"])

    event = {"type": "app_mention", "user": "U1", "text": "<@UBOT> hi", "ts": "1.000100"}
    event |= {"channel": "C1", "event_ts": "1.000100"}
    for kwargs in ({"secret": "wrong"}, {"timestamp": int(time.time()) - 600}):
        status, _ = await within(fake.post_event(url, fake.event_body(event), **kwargs))
        assert status == 401
    assert seen.empty()  # refused before any listener was started

    status, text = await within(fake.post_event(url, fake.event_body(event)))
    assert (status, text) == (200, "")
    assert (await within(seen.get()))["ts"] == "1.000100"
    await fake.wait_until(lambda: fake.posted("C1", thread_ts="1.000100"))


async def test_a_signed_slash_command_is_acked_in_the_response(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    app, url = http_app

    @app.command("/kaiwa")
    async def kaiwa(ack: Any, command: dict[str, Any], respond: Any) -> None:
        await ack(f"you said {command['text']}")
        await respond("later")

    status, text = await within(fake.post_command(url, "/kaiwa", "ping", user="U7"))
    assert (status, text) == (200, "you said ping")
    await fake.wait_until(lambda: fake.responses)
    assert fake.responses[0].body["text"] == "later"

    status, _ = await within(fake.post_command(url, "/kaiwa", "x", secret="wrong"))
    assert status == 401


async def test_url_verification_is_answered_with_the_challenge(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    _, url = http_app
    body = {"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    body["type"] = "url_verification"

    status, text = await within(fake.post_event(url, body))

    assert status == 200
    assert json.loads(text) == {"challenge": body["challenge"]}


async def test_bolt_passes_http_retries_to_the_listener(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    app, url = http_app
    seen: asyncio.Queue[tuple[str, list[str] | None]] = asyncio.Queue()

    @app.event("message")
    async def on_message(body: dict[str, Any], request: Any) -> None:
        await seen.put((body["event_id"], request.headers.get("x-slack-retry-num")))

    body = fake.event_body({"type": "message", "channel": "C1", "user": "U1", "text": "hi"})
    body["event"] |= {"ts": "2.000100", "event_ts": "2.000100", "channel_type": "channel"}
    assert (await within(fake.post_event(url, body)))[0] == 200
    assert (await within(fake.post_event(url, body, retry_num=1)))[0] == 200

    first, retry = await within(seen.get()), await within(seen.get())
    assert sorted([first, retry], key=lambda got: got[1] is not None) == [
        (body["event_id"], None),  # bolt has no retry filter: both reach the listener
        (body["event_id"], ["1"]),
    ]


async def test_events_url_sends_every_envelope_over_http(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    app, url = http_app
    seen: asyncio.Queue[str] = asyncio.Queue()

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: Any) -> None:
        await seen.put(event["text"])
        await say(text="hello", thread_ts=event["ts"])

    @app.event("message")
    async def on_message() -> None:
        pass

    @app.command("/kaiwa")
    async def kaiwa(ack: Any, command: dict[str, Any]) -> None:
        await ack(f"you said {command['text']}")

    fake.events_url = url
    ts = fake.mention("C1", "over http")
    assert await within(seen.get()) == f"<@{BOT_USER}> over http"
    await fake.wait_until(lambda: fake.posted("C1", thread_ts=ts))
    envelope_id = fake.slash_command("/kaiwa", "ping")
    await fake.wait_until(lambda: len(fake.envelopes) == 4 and all_acked(fake))

    statuses = [(d.status, d.retry_num) for d in fake.http_deliveries]
    assert statuses == [(200, 0)] * 4  # mention, message, the reply's echo, the command
    [command] = [d for d in fake.http_deliveries if d.envelope_id == envelope_id]
    assert command.text == "you said ping"  # HTTP: plain text; Socket Mode wraps it as {"text"}

    fake.redeliver(envelope_id)
    await fake.wait_until(lambda: len(fake.http_deliveries) == 5)
    assert (fake.http_deliveries[-1].status, fake.http_deliveries[-1].retry_num) == (200, 1)


async def test_a_button_press_goes_over_http_as_a_form_payload(
    fake: FakeSlack, http_app: tuple[AsyncApp, str], client: AsyncWebClient
):
    app, url = http_app
    pressed: asyncio.Queue[str] = asyncio.Queue()

    @app.action("stop")
    async def stop(ack: Any, body: dict[str, Any]) -> None:
        await ack()
        await pressed.put(body["user"]["id"])

    fake.events_url = url
    sent = await within(client.chat_postMessage(channel="D1", text="working", blocks=STOP_BLOCKS))
    fake.press_button("D1", sent["ts"], "stop", user="U7")
    assert await within(pressed.get()) == "U7"
    await fake.wait_until(lambda: all_acked(fake))


# --- answering like Slack's own test doubles ---


async def test_a_refused_method_is_refused_until_allowed(fake: FakeSlack, client: AsyncWebClient):
    fake.refuse("chat.postMessage", "channel_not_found")
    for _ in range(2):
        with pytest.raises(SlackApiError) as raised:
            await within(client.chat_postMessage(channel="C1", text="hello"))
        assert raised.value.response.status_code == 200
        assert raised.value.response["error"] == "channel_not_found"
    fake.allow("chat.postMessage")
    await within(client.chat_postMessage(channel="C1", text="now"))
    assert [p.text for p in fake.posted("C1")] == ["now"]


async def test_an_answer_can_leave_out_a_field(fake: FakeSlack, client: AsyncWebClient):
    fake.answer_without("chat.postMessage", "ts")
    answer = await within(client.chat_postMessage(channel="C1", text="posted all the same"))
    assert answer["ok"] is True and "ts" not in answer.data
    assert [p.text for p in fake.posted("C1")] == ["posted all the same"]


async def test_a_rate_limit_can_ask_for_a_fraction_of_a_second(
    fake: FakeSlack, client: AsyncWebClient
):
    fake.fail_next("chat.postMessage", retry_after=0.05)
    with pytest.raises(SlackApiError) as raised:
        await within(client.chat_postMessage(channel="C1", text="too fast"))
    assert raised.value.response.headers["Retry-After"] == "0.05"


async def test_a_held_answer_waits_and_a_request_given_up_is_noted(
    fake: FakeSlack, client: AsyncWebClient
):
    """The client here cancels its own request on purpose: the fake notices the abandoned
    request once its held answer is due."""
    fake.holds.hold("reactions.add", lambda params: lambda: fake.posted("C1"))
    ts = fake.message("C1", "react to me")
    reacting = asyncio.create_task(client.reactions_add(channel="C1", timestamp=ts, name="eyes"))
    await fake.wait_until(lambda: fake.holds.in_flight("reactions.add") == 1)
    assert fake.reactions("C1", ts) == set(), "not answered while held"
    reacting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reacting
    await within(client.chat_postMessage(channel="C1", text="the condition"))
    await fake.wait_until(lambda: fake.holds.in_flight("reactions.add") == 0)
    assert fake.holds.abandoned == ["reactions.add"]


async def test_a_raw_body_is_posted_signed_as_given(
    fake: FakeSlack, http_app: tuple[AsyncApp, str]
):
    """A body bolt cannot read fails inside bolt's own web app (500); the fake only posts it."""
    _, url = http_app
    status, _ = await within(fake.post_raw(url, '{"type": "event_callback", '))
    assert status == 500


async def test_an_unseen_message_is_kept_but_sent_to_no_one(
    fake: FakeSlack, client: AsyncWebClient
):
    ts = fake.unseen_message("D7", "a question", user="U7")
    replies = await within(client.conversations_replies(channel="D7", ts=ts))
    assert [m["text"] for m in replies["messages"]] == ["a question"]
    assert fake.envelopes == []
    await within(client.reactions_add(channel="D7", timestamp=ts, name="eyes"))
    assert fake.reactions("D7", ts) == {"eyes"}


async def test_refused_sockets_are_counted_and_none_connects(
    fake: FakeSlack, client: AsyncWebClient
):
    fake.sockets_refused = True
    opened = await within(client.apps_connections_open(app_token=APP_TOKEN))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await within(session.ws_connect(opened["url"]))
    assert refused.value.status == 503
    assert fake.refused_sockets == 1 and fake.hellos == 0


async def test_a_server_error_is_an_http_5xx_with_slacks_json_or_a_page(
    fake: FakeSlack, client: AsyncWebClient
):
    fake.fail_next("auth.test", error="fatal_error", status=500)
    fake.fail_next("auth.test", error="", status=503)
    with pytest.raises(SlackApiError) as json_answer:
        await within(client.auth_test())
    with pytest.raises(SlackApiError) as page_answer:
        await within(client.auth_test())
    assert (json_answer.value.response.status_code, json_answer.value.response["error"]) == (
        500,
        "fatal_error",
    )
    assert (page_answer.value.response.status_code, page_answer.value.response.data) == (503, {})
    assert (await within(client.auth_test()))["user_id"] == BOT_USER


async def test_a_call_cut_before_it_takes_effect_leaves_nothing(fake: FakeSlack):
    """slack_sdk's default retry handler would send the call again: without it, the client
    sees the cut connection itself."""
    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url, retry_handlers=[])
    fake.hang_up_before("chat.postMessage")
    with pytest.raises(aiohttp.ClientError):
        await within(client.chat_postMessage(channel="D1", text="lost on the way"))
    assert fake.posted("D1") == []
    assert [call.error for call in fake.calls_to("chat.postMessage")] == ["connection_cut"]
    await within(client.chat_postMessage(channel="D1", text="arrives"))
    assert [p.text for p in fake.posted("D1")] == ["arrives"]


async def test_the_bot_reads_back_a_thread_and_a_top_level_within_a_range(
    fake: FakeSlack, client: AsyncWebClient
):
    root = fake.message("C1", "a question", user="U1")
    first = await within(client.chat_postMessage(channel="C1", thread_ts=root, text="one"))
    await within(client.chat_postMessage(channel="C1", thread_ts=root, text="two"))
    top = await within(client.chat_postMessage(channel="C1", text="top level"))

    replies = await within(
        client.conversations_replies(channel="C1", ts=root, oldest=first["ts"], limit=10)
    )
    history = await within(client.conversations_history(channel="C1", oldest=root))
    inclusive = await within(
        client.conversations_history(channel="C1", oldest=root, inclusive=True)
    )

    assert [m["text"] for m in replies["messages"]] == ["a question", "two"]
    assert [m["text"] for m in history["messages"]] == ["top level"]
    assert [m["text"] for m in inclusive["messages"]] == ["top level", "a question"]
    assert history["messages"][0]["ts"] == top["ts"]
    assert history["messages"][0]["bot_id"] == BOT_ID


async def test_users_info_describes_a_person_as_slack_does(fake: FakeSlack, client: AsyncWebClient):
    fake.person("U7", display_name="Ann", real_name="Ann Example", name="ann.example")
    ann = (await within(client.users_info(user="U7")))["user"]
    unnamed = (await within(client.users_info(user="U8")))["user"]
    assert (ann["name"], ann["real_name"]) == ("ann.example", "Ann Example")
    assert (ann["profile"]["display_name"], ann["profile"]["real_name"]) == ("Ann", "Ann Example")
    assert unnamed["profile"]["display_name"] == "", "never set: Slack shows the real name"
    assert unnamed["real_name"] == unnamed["profile"]["real_name"] != ""


async def test_a_payload_is_delivered_as_given(fake: FakeSlack, make_bolt: MakeBolt):
    app, handler = make_bolt()
    shortcuts: list[dict[str, Any]] = []

    @app.shortcut("sample-shortcut")
    async def on_shortcut(ack: Any, shortcut: dict[str, Any]) -> None:
        shortcuts.append(shortcut)
        await ack()

    await connect(fake, handler)
    sample = {
        "type": "shortcut",
        "token": "verification_token",
        "action_ts": "111.111",
        "team": {"id": TEAM, "domain": "test"},
        "user": {"id": "U7", "username": "ann", "team_id": TEAM},
        "callback_id": "sample-shortcut",
        "trigger_id": "111.111.xxxxxx",
    }
    envelope_id = fake.deliver("interactive", sample)
    await fake.wait_until(lambda: envelope_id in fake.acked)
    assert shortcuts == [sample]


# --- files ---

PDF = Upload(b"%PDF-1.4 a small document", "report.pdf", "application/pdf")
CLIP = Upload(b"OggS a clip", "audio_message.webm", "audio/webm", audio_clip=True, duration_ms=4200)


async def fetch(url: str, token: str | None = BOT_TOKEN) -> tuple[int, str, bytes, int]:
    """A GET as a bot fetches a file: status, content type, body, and redirects followed."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers) as response,
    ):
        body = await within(response.read())
        return response.status, response.content_type, body, len(response.history)


async def test_a_shared_file_reaches_bolt_as_a_file_share_message(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        await seen.put(event)

    await connect(fake, handler)
    ts = fake.share("D1", PDF, CLIP, text="read this")
    event = await within(seen.get())
    assert (event["subtype"], event["ts"], event["text"], event["channel_type"]) == (
        "file_share",
        ts,
        "read this",
        "im",
    )
    pdf, clip = event["files"]
    assert event["files"] == fake.files_in("D1", ts)
    assert (pdf["name"], pdf["mimetype"], pdf["filetype"], pdf["size"]) == (
        "report.pdf",
        "application/pdf",
        "pdf",
        len(PDF.content),
    )
    assert pdf["url_private"] == f"{fake.url}/files-pri/{TEAM}-{pdf['id']}/report.pdf"
    assert pdf["url_private_download"] == (
        f"{fake.url}/files-pri/{TEAM}-{pdf['id']}/download/report.pdf"
    )
    assert "subtype" not in pdf and "duration_ms" not in pdf
    assert (clip["subtype"], clip["duration_ms"], clip["mimetype"]) == (
        "slack_audio",
        4200,
        "audio/webm",
    )


async def test_a_mention_with_files_comes_as_app_mention_and_message(
    fake: FakeSlack, make_bolt: MakeBolt
):
    app, handler = make_bolt()
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        await seen.put(event)

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any]) -> None:
        await seen.put(event)

    await connect(fake, handler)
    ts = fake.share("C1", PDF, mention=True)
    mention, message = await within(seen.get()), await within(seen.get())
    assert (mention["type"], message["type"], message["subtype"]) == (
        "app_mention",
        "message",
        "file_share",
    )
    assert mention["text"] == message["text"] == f"<@{BOT_USER}>"
    assert mention["files"] == message["files"] == fake.files_in("C1", ts)


async def test_a_file_is_served_on_both_its_addresses_for_the_bot_token(fake: FakeSlack):
    ts = fake.share("D1", PDF)
    (file,) = fake.files_in("D1", ts)
    for url in (file["url_private"], file["url_private_download"]):
        assert await fetch(url) == (200, "application/pdf", PDF.content, 0)
    assert [(d.file_id, d.token, d.status) for d in fake.downloads] == [
        (file["id"], BOT_TOKEN, 200)
    ] * 2


async def test_a_refused_file_request_ends_on_the_sign_in_page_with_200(fake: FakeSlack):
    """Slack's way of refusing: a redirect to HTML, never 401 or 403."""
    ts = fake.share("D1", PDF)
    (file,) = fake.files_in("D1", ts)
    url = file["url_private_download"]
    for token in (None, "xoxb-someone-else", APP_TOKEN):
        status, content_type, body, redirects = await fetch(url, token)
        assert (status, content_type, redirects) == (200, "text/html", 1)
        assert b"Sign in" in body
    fake.files_read_scope = False
    status, content_type, body, _ = await fetch(url)
    assert (status, content_type) == (200, "text/html") and b"Sign in" in body
    assert [d.status for d in fake.downloads] == [302] * 4
    fake.files_read_scope = True
    assert (await fetch(url))[2] == PDF.content


async def test_a_deleted_or_unknown_file_is_a_404(fake: FakeSlack):
    ts = fake.share("D1", PDF)
    (file,) = fake.files_in("D1", ts)
    fake.delete_file(file["id"])
    assert (await fetch(file["url_private_download"]))[0] == 404
    assert (await fetch(f"{fake.url}/files-pri/{TEAM}-F99999999/download/x.pdf"))[0] == 404
    assert [d.file_id for d in fake.downloads] == ["", ""]


async def test_a_file_can_claim_a_smaller_size_and_stream_without_a_length(fake: FakeSlack):
    content = bytes(range(256)) * 1024
    ts = fake.share("D1", Upload(content, "big.bin", "", declared_size=10, chunked=True))
    (file,) = fake.files_in("D1", ts)
    assert (file["size"], file["mimetype"], file["filetype"]) == (10, "", "bin")
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            file["url_private_download"], headers={"Authorization": f"Bearer {BOT_TOKEN}"}
        ) as response,
    ):
        assert response.content_length is None
        assert response.content_type == "application/octet-stream"
        assert await within(response.read()) == content
