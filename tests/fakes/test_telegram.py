"""The fake Telegram Bot API, proven against the real python-telegram-bot (22.8).

What the real library does against it, as these tests pin down:
- every method is a POST with form-encoded values; strings go as they are, everything else as
  JSON (``chat_id=777``, ``reply_parameters={"message_id": 5}``); parameters left at None are
  not sent at all, so ``link_preview_options`` and ``parse_mode`` only appear when given, and
  ``reply_to_message_id=`` is sent as ``reply_parameters``;
- ``Application`` start-up sends ``getMe``, ``deleteWebhook`` (no parameters), then long polls
  ``getUpdates`` with ``timeout`` and ``offset`` (0 at first) and no ``allowed_updates`` unless
  ``start_polling`` is given some; ``updater.stop()`` cancels the parked poll and then calls
  ``getUpdates(offset=last + 1, timeout=0)`` once, so a graceful stop confirms everything the
  updater fetched, and that call's own result is thrown away unconfirmed;
- ``RetryAfter`` reads its deprecated int form in its own ``__init__``: without the opt-in
  ``PTB_TIMEDELTA=1`` even raising it emits ``PTBDeprecationWarning`` (an error here), with it
  ``retry_after`` is a ``timedelta``;
- error descriptions lose their "Bad Request: " prefix and are ``str.capitalize()``d, so
  "Bad Request: can't parse entities: Unsupported ..." surfaces as "Can't parse entities:
  unsupported ...".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any, TypeVar

import aiohttp
import pytest
from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    LinkPreviewOptions,
    MessageEntity,
    ReplyParameters,
    Update,
)
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, EndPointNotFound, InvalidToken, RetryAfter
from telegram.ext import Application, ContextTypes, MessageHandler, filters
from telegram.warnings import PTBDeprecationWarning

from .patience import deadline
from .telegram import (
    BOT_TOKEN,
    FILE_TOO_BIG,
    FIRST_UPDATE_ID,
    NOT_MODIFIED,
    CallbackAnswer,
    EntityParseError,
    FakeTelegram,
    render,
    visible_text,
)

CHAT = 777
LIBRARY_SECONDS = deadline()
T = TypeVar("T")


@pytest.fixture(autouse=True)
def _timedelta_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """PTB 22.8 warns when a ``RetryAfter`` is merely built unless this opt-in is set."""
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=BOT_TOKEN) as server:
        yield server


def make_bot(fake: FakeTelegram, token: str = BOT_TOKEN) -> Bot:
    return Bot(token, base_url=fake.base_url, base_file_url=fake.base_file_url)


@pytest.fixture
async def client(fake: FakeTelegram) -> AsyncIterator[Bot]:
    bot = make_bot(fake)
    await within(bot.initialize())
    yield bot
    await within(bot.shutdown())


async def within(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(LIBRARY_SECONDS):
        return await awaitable


# --- getMe and the token ---


async def test_get_me_returns_the_bot_user(fake: FakeTelegram, client: Bot) -> None:
    me = await within(client.get_me())

    assert (me.id, me.username, me.first_name, me.is_bot) == (
        999000,
        "kaiwa_test_bot",
        "Kaiwa",
        True,
    )
    assert fake.bot_user == {
        "id": 999000,
        "is_bot": True,
        "first_name": "Kaiwa",
        "username": "kaiwa_test_bot",
    }
    assert [call.method for call in fake.calls] == ["getMe", "getMe"]  # initialize() + ours


async def test_wrong_token_fails_initialize_with_invalid_token(fake: FakeTelegram) -> None:
    with pytest.raises(InvalidToken, match="654321:WRONG"):
        async with asyncio.timeout(LIBRARY_SECONDS), make_bot(fake, "654321:WRONG"):
            pass

    [call] = fake.calls
    assert call.method == "getMe"
    assert call.error == {"ok": False, "error_code": 401, "description": "Unauthorized"}


async def test_wire_format_by_hand(fake: FakeTelegram) -> None:
    """JSON bodies and query strings work too; strings stay strings; errors match Telegram."""
    api = f"{fake.base_url}{BOT_TOKEN}"
    async with aiohttp.ClientSession() as session, asyncio.timeout(LIBRARY_SECONDS):
        async with session.post(f"{api}/sendMessage", json={"chat_id": 5, "text": "123"}) as r:
            assert r.status == 200
            body = await r.json()
        assert body["ok"] is True
        assert (body["result"]["text"], body["result"]["chat"]["id"]) == ("123", 5)

        query = {"chat_id": "5", "text": "true"}
        async with session.get(f"{api}/sendMessage", params=query) as r:
            assert (await r.json())["result"]["text"] == "true"

        broken = {"data": b"{", "headers": {"Content-Type": "application/json"}}
        async with session.post(f"{api}/sendMessage", **broken) as r:
            assert (r.status, (await r.json())["description"]) == (
                400,
                "Bad Request: can't parse JSON object",
            )

        async with session.post(f"{fake.base_url}654321:nope/getMe") as r:
            assert r.status == 401
            assert await r.json() == {
                "ok": False,
                "error_code": 401,
                "description": "Unauthorized",
            }

        async with session.post(f"{api}/fooBar") as r:
            assert r.status == 404
            assert await r.json() == {"ok": False, "error_code": 404, "description": "Not Found"}

    assert [call.params for call in fake.calls_to("sendMessage")] == [
        {"chat_id": 5, "text": "123"},
        {"chat_id": 5, "text": "true"},
        {},  # the broken body, still recorded with its error
    ]


async def test_unknown_method_is_endpoint_not_found(fake: FakeTelegram, client: Bot) -> None:
    with pytest.raises(EndPointNotFound):
        await within(client.do_api_request("fooBar"))

    assert fake.calls_to("fooBar")[0].error == {
        "ok": False,
        "error_code": 404,
        "description": "Not Found",
    }


# --- sending and editing ---


async def test_send_and_edit_keep_raw_visible_and_edit_history(
    fake: FakeTelegram, client: Bot
) -> None:
    sent = await within(
        client.send_message(CHAT, "<b>Hello</b> &amp; welcome", parse_mode=ParseMode.HTML)
    )

    assert (sent.message_id, sent.text, sent.chat.id) == (1, "Hello & welcome", CHAT)
    assert sent.from_user is not None and sent.from_user.id == 999000
    assert sent.entities == (MessageEntity(MessageEntity.BOLD, 0, 5),)

    edited = await within(
        client.edit_message_text("Hello again", chat_id=CHAT, message_id=sent.message_id)
    )
    assert (edited.message_id, edited.text) == (1, "Hello again")
    assert edited.edit_date is not None
    await within(
        client.edit_message_text("<i>Bye</i>", chat_id=CHAT, message_id=1, parse_mode="HTML")
    )

    [message] = fake.sent(CHAT)
    assert (message.message_id, message.text, message.parse_mode, message.visible) == (
        1,
        "<i>Bye</i>",
        "HTML",
        "Bye",
    )
    assert message.edits == ["Hello again", "Bye"]
    assert (await within(client.send_message(CHAT, "next"))).message_id == 2
    assert [m.visible for m in fake.sent(CHAT)] == ["Bye", "next"]
    assert fake.sent(12345) == []


def keyboard(*data: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(f"Button {d}", callback_data=d)] for d in data]
    )


async def test_an_inline_keyboard_stays_until_an_edit_leaves_it_out(
    fake: FakeTelegram, client: Bot
) -> None:
    """As on Telegram: an edit without ``reply_markup`` takes the keyboard away, and that alone
    is a change (no "message is not modified")."""
    sent = await within(client.send_message(CHAT, "working", reply_markup=keyboard("stop")))
    assert sent.reply_markup == keyboard("stop")
    assert fake.sent(CHAT)[0].buttons == ["stop"]

    await within(
        client.edit_message_text(
            "working on", chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("stop")
        )
    )
    assert fake.sent(CHAT)[0].buttons == ["stop"]
    await within(client.edit_message_text("working on", chat_id=CHAT, message_id=sent.message_id))
    assert fake.sent(CHAT)[0].buttons == []
    assert fake.sent(CHAT)[0].edits == ["working on", "working on"]


async def test_a_keyboard_telegram_would_refuse_is_refused(client: Bot) -> None:
    with pytest.raises(BadRequest, match="Button_data_invalid"):
        await within(client.send_message(CHAT, "too much", reply_markup=keyboard("x" * 65)))


async def test_a_pressed_button_is_a_callback_query_answered_once(
    fake: FakeTelegram, client: Bot
) -> None:
    sent = await within(client.send_message(CHAT, "working", reply_markup=keyboard("stop")))
    fake.press_button(CHAT, sent.message_id, "stop", user_id=4242)

    (update,) = await within(client.get_updates(timeout=0))
    query = update.callback_query
    assert query is not None and query.data == "stop" and query.from_user.id == 4242
    assert query.message is not None and query.message.message_id == sent.message_id
    assert query.message.chat.id == CHAT

    with pytest.raises(BadRequest, match="Message_too_long"):
        await within(client.answer_callback_query(query.id, text="x" * 201))
    assert await within(client.answer_callback_query(query.id, text="Stopped."))
    assert fake.callback_answers == {query.id: CallbackAnswer("Stopped.", show_alert=False)}
    with pytest.raises(BadRequest, match="Query is too old"):
        await within(client.answer_callback_query(query.id))


async def test_only_a_button_the_message_shows_can_be_pressed(
    fake: FakeTelegram, client: Bot
) -> None:
    sent = await within(client.send_message(CHAT, "working", reply_markup=keyboard("stop")))
    await within(client.edit_message_text("done", chat_id=CHAT, message_id=sent.message_id))
    with pytest.raises(KeyError, match="no button 'stop'"):
        fake.press_button(CHAT, sent.message_id, "stop")
    with pytest.raises(KeyError):
        fake.press_button(CHAT, 99, "stop")


async def test_message_ids_count_per_chat_across_people_and_bot(
    fake: FakeTelegram, client: Bot
) -> None:
    assert fake.user_message(CHAT, "hi")["message"]["message_id"] == 1
    assert (await within(client.send_message(CHAT, "hello"))).message_id == 2
    assert fake.user_message(CHAT, "again")["message"]["message_id"] == 3
    assert (await within(client.send_message(888, "elsewhere"))).message_id == 1


async def test_what_ptb_sends_for_send_message(fake: FakeTelegram, client: Bot) -> None:
    fake.user_message(CHAT, "question", message_id=5)

    answer = await within(
        client.send_message(
            CHAT,
            "answer",
            parse_mode=ParseMode.HTML,
            reply_parameters=ReplyParameters(message_id=5),
            link_preview_options=LinkPreviewOptions(is_disabled=True),
        )
    )
    await within(client.send_message(CHAT, "plain"))

    assert answer.reply_to_message is not None
    assert (answer.reply_to_message.message_id, answer.reply_to_message.text) == (5, "question")
    assert [call.params for call in fake.calls_to("sendMessage")] == [
        {
            "chat_id": CHAT,
            "text": "answer",
            "parse_mode": "HTML",
            "reply_parameters": {"message_id": 5},
            "link_preview_options": {"is_disabled": True},
        },
        {"chat_id": CHAT, "text": "plain"},
    ]
    assert fake.sent(CHAT)[0].reply_to == 5


async def test_reply_to_a_missing_message_is_refused(fake: FakeTelegram, client: Bot) -> None:
    with pytest.raises(BadRequest, match=r"^Message to be replied not found$"):
        await within(client.send_message(CHAT, "x", reply_parameters=ReplyParameters(99)))

    lenient = ReplyParameters(99, allow_sending_without_reply=True)
    assert (await within(client.send_message(CHAT, "x", reply_parameters=lenient))).text == "x"


async def test_edit_to_the_same_content_is_not_modified(fake: FakeTelegram, client: Bot) -> None:
    await within(client.send_message(CHAT, "<b>same</b>", parse_mode="HTML"))

    with pytest.raises(BadRequest, match=r"^Message is not modified: specified new message"):
        await within(
            client.edit_message_text(
                "<strong>same</strong>", chat_id=CHAT, message_id=1, parse_mode="HTML"
            )
        )
    assert fake.calls_to("editMessageText")[0].error == {
        "ok": False,
        "error_code": 400,
        "description": NOT_MODIFIED,
    }
    assert fake.sent(CHAT)[0].edits == []

    await within(client.edit_message_text("same", chat_id=CHAT, message_id=1))  # bold dropped
    assert fake.sent(CHAT)[0].edits == ["same"]


async def test_edit_of_a_missing_or_foreign_message_is_refused(
    fake: FakeTelegram, client: Bot
) -> None:
    fake.user_message(CHAT, "mine")

    with pytest.raises(BadRequest, match=r"^Message to edit not found$"):
        await within(client.edit_message_text("x", chat_id=CHAT, message_id=42))
    with pytest.raises(BadRequest, match=r"^Message can't be edited$"):
        await within(client.edit_message_text("x", chat_id=CHAT, message_id=1))


# --- text limits ---


@pytest.mark.parametrize(
    ("text", "parse_mode", "fits"),
    [
        ("a" * 4096, None, True),
        ("a" * 4097, None, False),
        ("😀" * 2048, None, True),  # 4,096 UTF-16 code units
        ("😀" * 2049, None, False),  # 4,098 code units, though only 2,049 characters
        ("<b>" + "a" * 4096 + "</b>", ParseMode.HTML, True),  # tags are not counted
        ("&amp;" * 4096, ParseMode.HTML, True),  # entities count as the one character
        ("&amp;" * 4097, ParseMode.HTML, False),
    ],
    ids=["4096a", "4097a", "2048emoji", "2049emoji", "tags", "4096amp", "4097amp"],
)
async def test_text_limit_counts_visible_utf16_units(
    fake: FakeTelegram, client: Bot, text: str, parse_mode: str | None, fits: bool
) -> None:
    if fits:
        sent = await within(client.send_message(CHAT, text, parse_mode=parse_mode))
        assert sent.text == fake.sent(CHAT)[0].visible
        return
    with pytest.raises(BadRequest, match=r"^Message is too long$"):
        await within(client.send_message(CHAT, text, parse_mode=parse_mode))
    assert fake.sent(CHAT) == []


async def test_edit_is_held_to_the_same_limit(fake: FakeTelegram, client: Bot) -> None:
    await within(client.send_message(CHAT, "short"))

    with pytest.raises(BadRequest, match=r"^Message is too long$"):
        await within(client.edit_message_text("😀" * 2049, chat_id=CHAT, message_id=1))
    assert fake.sent(CHAT)[0].visible == "short"


@pytest.mark.parametrize("text", ["", "<b></b>", "<i> \n </i>"])
async def test_empty_visible_text_is_refused(client: Bot, text: str) -> None:
    with pytest.raises(BadRequest, match=r"^Message text is empty$"):
        await within(client.send_message(CHAT, text, parse_mode=ParseMode.HTML))


# --- HTML ---


@pytest.mark.parametrize(
    ("text", "byte_offset"),
    [
        ("<foo>x</foo>", 0),
        ("<b>x", 0),
        ("<b><i>x</b></i>", 7),
        ("x</b>", 1),
        ("1 < 2", 2),
        ("fish & chips", 5),
        ("&nbsp;", 0),
        ("&#xD800;", 0),
        ('<span class="x">y</span>', 0),
        ("<br/>", 0),
        ("😀 <x>", 5),  # the offset counts UTF-8 bytes
        ("é&bogus;", 2),
    ],
)
async def test_bad_html_cannot_be_parsed(
    fake: FakeTelegram, client: Bot, text: str, byte_offset: int
) -> None:
    with pytest.raises(
        BadRequest, match=f"^Can't parse entities: .* at byte offset {byte_offset}$"
    ):
        await within(client.send_message(CHAT, text, parse_mode=ParseMode.HTML))

    [call] = fake.calls_to("sendMessage")
    assert call.error is not None
    description = call.error["description"]
    assert description.startswith("Bad Request: can't parse entities: ")
    assert description.endswith(f" at byte offset {byte_offset}")
    assert fake.sent(CHAT) == []


async def test_valid_html_renders_visible_text_and_entities(client: Bot) -> None:
    text = (
        "<b>b</b><strong>s</strong><i>i</i><em>e</em><u>u</u><ins>n</ins><s>s</s>"
        "<strike>k</strike><del>d</del><tg-spoiler>p</tg-spoiler>"
        '<span class="tg-spoiler">q</span><code>c</code>'
        '<a href="https://example.com/?a=1&amp;b=2">link</a>\n'
        "<blockquote>quote</blockquote>\n"
        '<pre><code class="language-python">print(1 &lt; 2 &gt; 0)</code></pre>\n'
        "<pre>raw</pre>&#128512;&#x1F600;&quot;>"
    )

    sent = await within(client.send_message(CHAT, text, parse_mode=ParseMode.HTML))

    assert sent.text == 'bsieunskdpqclink\nquote\nprint(1 < 2 > 0)\nraw😀😀">'
    entities = {(e.type, sent.parse_entity(e)): e for e in sent.entities}
    assert list(entities)[:12] == [
        ("bold", "b"),
        ("bold", "s"),
        ("italic", "i"),
        ("italic", "e"),
        ("underline", "u"),
        ("underline", "n"),
        ("strikethrough", "s"),
        ("strikethrough", "k"),
        ("strikethrough", "d"),
        ("spoiler", "p"),
        ("spoiler", "q"),
        ("code", "c"),
    ]
    assert entities["text_link", "link"].url == "https://example.com/?a=1&b=2"
    assert ("blockquote", "quote") in entities
    assert entities["pre", "print(1 < 2 > 0)"].language == "python"
    assert entities["pre", "raw"].language is None


async def test_entity_offsets_count_utf16_units(client: Bot) -> None:
    sent = await within(client.send_message(CHAT, "😀 <b>x</b>", parse_mode="HTML"))

    assert sent.entities == (MessageEntity(MessageEntity.BOLD, 3, 1),)
    assert sent.parse_entities() == {sent.entities[0]: "x"}


async def test_without_parse_mode_text_is_literal(fake: FakeTelegram, client: Bot) -> None:
    text = "<b>not bold</b> & 1 < 2 &amp;"

    sent = await within(client.send_message(CHAT, text))

    assert sent.text == text
    assert fake.sent(CHAT)[0].visible == text
    assert sent.entities == ()


def test_render_and_visible_text_directly() -> None:
    assert visible_text("<i>a</i> &lt;b&gt;", "HTML") == "a <b>"
    assert visible_text("<i>a</i>") == "<i>a</i>"
    assert render("<u>x</u>y", "html").entities == (
        {"type": "underline", "offset": 0, "length": 1},
    )
    with pytest.raises(EntityParseError, match=r'^Unsupported start tag "img" at byte offset 1$'):
        render("x<img>", "HTML")
    with pytest.raises(ValueError, match="only speaks HTML"):
        render("*x*", "MarkdownV2")


# --- other methods ---


async def test_send_chat_action(fake: FakeTelegram, client: Bot) -> None:
    assert await within(client.send_chat_action(CHAT, ChatAction.TYPING)) is True

    assert fake.calls_to("sendChatAction")[0].params == {"chat_id": CHAT, "action": "typing"}
    with pytest.raises(BadRequest, match=r"^Wrong parameter action in request$"):
        await within(client.send_chat_action(CHAT, "dancing"))


async def test_set_and_delete_my_commands(fake: FakeTelegram, client: Bot) -> None:
    commands = [BotCommand("start", "Start a chat"), ("help", "Show help")]

    assert await within(client.set_my_commands(commands)) is True
    assert fake.commands == [
        {"command": "start", "description": "Start a chat"},
        {"command": "help", "description": "Show help"},
    ]
    assert [c.command for c in await within(client.get_my_commands())] == ["start", "help"]

    assert await within(client.delete_my_commands()) is True
    assert fake.commands == []


async def test_photo_is_served_through_get_file(fake: FakeTelegram, client: Bot) -> None:
    data = b"\x89PNG not really a picture" * 40
    fake.user_photo(CHAT, caption="look", file_bytes=data)

    [update] = await within(client.get_updates(timeout=0))
    assert update.message is not None
    assert update.message.caption == "look"
    photo = update.message.photo[-1]
    telegram_file = await within(client.get_file(photo.file_id))
    downloaded = await within(telegram_file.download_as_bytearray())

    assert bytes(downloaded) == data
    assert telegram_file.file_size == len(data)
    with pytest.raises(BadRequest, match=r"^Invalid file_id$"):
        await within(client.get_file("no-such-file"))


async def test_each_kind_of_file_parses_and_is_served_at_its_file_path(
    fake: FakeTelegram, client: Bot
) -> None:
    note, pdf, song, circle = b"OggS voice", b"%PDF-1.7 doc", b"ID3 song", b"mp4 circle"
    fake.user_file(CHAT, note, kind="voice", seconds=3, caption="listen")
    fake.user_file(CHAT, pdf, kind="document", name="report.pdf", mime="application/pdf")
    fake.user_file(CHAT, song, kind="audio", name="song.mp3", mime="audio/mpeg", seconds=61)
    fake.user_file(CHAT, circle, kind="video_note", seconds=9)

    voice, document, audio, video_note = [
        update.message for update in await within(client.get_updates(timeout=0))
    ]

    assert voice.voice.duration == timedelta(seconds=3) and voice.caption == "listen"
    assert (voice.voice.mime_type, voice.voice.file_size) == ("audio/ogg", len(note))
    assert (document.document.file_name, document.document.mime_type) == (
        "report.pdf",
        "application/pdf",
    )
    assert (audio.audio.file_name, audio.audio.duration) == ("song.mp3", timedelta(seconds=61))
    assert video_note.video_note.duration == timedelta(seconds=9)
    media = (voice.voice, document.document, audio.audio, video_note.video_note)
    served = []
    for medium in media:
        telegram_file = await within(client.get_file(medium.file_id))
        served.append((telegram_file.file_path, bytes(await telegram_file.download_as_bytearray())))
    root = f"{fake.base_file_url}{BOT_TOKEN}/"
    assert served == [
        (f"{root}voice/file_1.oga", note),
        (f"{root}documents/file_2.pdf", pdf),
        (f"{root}music/file_3.mp3", song),
        (f"{root}video_notes/file_4.mp4", circle),
    ]


async def test_get_file_refuses_a_file_past_20_mb_as_telegram_does(
    fake: FakeTelegram, client: Bot
) -> None:
    fake.user_file(CHAT, b"not all of it", name="big.zip", file_size=36_175_872)
    (update,) = await within(client.get_updates(timeout=0))

    assert update.message.document.file_size == 36_175_872
    with pytest.raises(BadRequest, match=r"^File is too big$"):
        await within(client.get_file(update.message.document.file_id))
    assert fake.calls_to("getFile")[-1].error == {
        "ok": False,
        "error_code": 400,
        "description": FILE_TOO_BIG,
    }


async def test_the_file_path_wants_the_token_and_a_known_path(fake: FakeTelegram) -> None:
    fake.user_file(CHAT, b"secret notes", name="notes.txt", mime="text/plain")
    path = "documents/file_1.txt"  # the first file the fake keeps
    async with aiohttp.ClientSession() as session, asyncio.timeout(LIBRARY_SECONDS):
        answers = []
        for url in (
            f"{fake.base_file_url}{BOT_TOKEN}/{path}",
            f"{fake.base_file_url}999:wrong/{path}",
            f"{fake.base_file_url}{BOT_TOKEN}/documents/file_99.txt",
        ):
            async with session.get(url) as response:
                answers.append((response.status, await response.read()))
    assert answers[0] == (200, b"secret notes")
    assert [status for status, _ in answers[1:]] == [401, 404]


async def test_an_expired_file_path_is_404_while_get_file_answers(
    fake: FakeTelegram, client: Bot
) -> None:
    update = fake.user_file(CHAT, b"old", name="old.txt", mime="text/plain")
    file_id = update["message"]["document"]["file_id"]
    fresh = await within(client.get_file(file_id))
    assert bytes(await within(fresh.download_as_bytearray())) == b"old"

    fake.expire_file_path(file_id)

    expired = await within(client.get_file(file_id))
    with pytest.raises(InvalidToken, match="Not Found"):  # the library's reading of any 404
        await within(expired.download_as_bytearray())
    assert fake.downloaded == ["documents/file_1.txt"], "served once"


def test_a_timed_file_needs_its_seconds(fake: FakeTelegram) -> None:
    with pytest.raises(ValueError, match="a voice needs its seconds"):
        fake.user_file(CHAT, b"OggS", kind="voice")


async def test_user_messages_parse_as_replies_and_mentions(fake: FakeTelegram, client: Bot) -> None:
    question = await within(client.send_message(CHAT, "question?"))
    fake.user_message(CHAT, "answer", reply_to_bot_message=question.message_id)
    mention = [{"type": "mention", "offset": 0, "length": 15}]
    fake.user_message(
        -100500, "@kaiwa_test_bot hi", chat_type="supergroup", user_id=42, entities=mention
    )

    reply, group = (u.message for u in await within(client.get_updates(timeout=0)))

    assert reply is not None and reply.reply_to_message is not None
    assert reply.reply_to_message.from_user is not None
    assert reply.reply_to_message.from_user.id == 999000
    assert reply.reply_to_message.text == "question?"
    assert reply.from_user is not None and reply.from_user.id == CHAT
    assert group is not None and group.from_user is not None
    assert (group.chat.type, group.from_user.id) == ("supergroup", 42)
    assert list(group.parse_entities().values()) == ["@kaiwa_test_bot"]


# --- getUpdates ---


async def test_get_updates_confirms_only_below_the_offset(fake: FakeTelegram, client: Bot) -> None:
    one = fake.user_message(CHAT, "one")["update_id"]
    raw = {"message": {"message_id": 9, "date": 0, "chat": {"id": 1, "type": "private"}}}
    two = fake.push_update(raw)["update_id"]
    assert (one, two) == (FIRST_UPDATE_ID, FIRST_UPDATE_ID + 1)

    ids = lambda updates: [u.update_id for u in updates]  # noqa: E731
    assert ids(await within(client.get_updates(timeout=0))) == [one, two]
    assert ids(await within(client.get_updates(timeout=0))) == [one, two]  # not confirmed
    assert ids(await within(client.get_updates(timeout=0, limit=1))) == [one]
    assert fake.confirmed_offset == 0

    assert ids(await within(client.get_updates(offset=two, timeout=0))) == [two]
    assert fake.confirmed_offset == two
    assert ids(await within(client.get_updates(timeout=0))) == [two]  # one is gone for good

    three = fake.user_message(CHAT, "three")["update_id"]
    assert ids(await within(client.get_updates(offset=-1, timeout=0))) == [three]  # drops two
    assert ids(await within(client.get_updates(offset=three + 1, timeout=0))) == []
    assert fake.confirmed_offset == three + 1


async def test_push_update_keeps_an_explicit_id(fake: FakeTelegram) -> None:
    raw = {"update_id": 200_000, "message": {"message_id": 1, "date": 0, "chat": {"id": 1}}}

    assert fake.push_update(raw)["update_id"] == 200_000
    assert fake.user_message(CHAT, "next")["update_id"] == 200_001
    plain: dict[str, Any] = {"edited_message": {}}
    assert fake.push_update(plain)["update_id"] == 200_002
    assert plain == {"edited_message": {}}  # the caller's dict is left alone


async def test_get_updates_parks_until_an_update_arrives(fake: FakeTelegram, client: Bot) -> None:
    poll = asyncio.create_task(within(client.get_updates(timeout=25)))
    await fake.wait_until(lambda: fake.calls_to("getUpdates"), what="the long poll")
    assert not poll.done()

    pushed = fake.user_message(CHAT, "wake up")

    [update] = await poll
    assert update.update_id == pushed["update_id"]
    assert update.message is not None and update.message.text == "wake up"


async def test_close_answers_a_parked_poll(fake: FakeTelegram, client: Bot) -> None:
    poll = asyncio.create_task(within(client.get_updates(timeout=25)))
    await fake.wait_until(lambda: fake.calls_to("getUpdates"), what="the long poll")

    await fake.close()
    await fake.close()  # idempotent

    assert await poll == ()


# --- scripted failures ---


async def test_flood_wait_raises_retry_after_with_its_value(
    fake: FakeTelegram, client: Bot
) -> None:
    fake.fail_next("sendMessage", retry_after=7)

    with pytest.raises(RetryAfter) as caught:
        await within(client.send_message(CHAT, "too fast"))

    assert caught.value.retry_after == timedelta(seconds=7)
    [failed] = fake.calls_to("sendMessage")
    assert failed.params == {"chat_id": CHAT, "text": "too fast"}
    assert failed.error == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 7",
        "parameters": {"retry_after": 7},
    }
    assert fake.sent(CHAT) == []
    await within(client.send_message(CHAT, "later"))  # only the next call failed
    assert [m.visible for m in fake.sent(CHAT)] == ["later"]


def test_ptb_warns_on_retry_after_without_the_timedelta_opt_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A canary for upgrades: this is why ``PTB_TIMEDELTA=1`` is set for these tests."""
    monkeypatch.delenv("PTB_TIMEDELTA")

    with pytest.warns(PTBDeprecationWarning, match="PTB_TIMEDELTA"):
        RetryAfter(3)


async def test_other_failures_use_their_description_in_order(
    fake: FakeTelegram, client: Bot
) -> None:
    fake.fail_next("sendChatAction", status=400, description="Bad Request: chat not found")
    fake.fail_next("sendChatAction", retry_after=2, times=2)

    with pytest.raises(BadRequest, match=r"^Chat not found$"):
        await within(client.send_chat_action(CHAT, ChatAction.TYPING))
    for _ in range(2):
        with pytest.raises(RetryAfter):
            await within(client.send_chat_action(CHAT, ChatAction.TYPING))
    assert await within(client.send_chat_action(CHAT, ChatAction.TYPING)) is True
    assert [c.error and c.error["error_code"] for c in fake.calls_to("sendChatAction")] == [
        400,
        429,
        429,
        None,
    ]
    with pytest.raises(ValueError, match="needs a description"):
        fake.fail_next("sendMessage", status=500)


# --- the Bot API's limits (limits=True) ---


@pytest.fixture
async def limited() -> AsyncIterator[FakeTelegram]:
    """A fake keeping the Bot API's limits, on a clock that moves only when the test moves it."""
    async with FakeTelegram(limits=True) as server:
        server.rate_limits.clock.stop()
        yield server


@pytest.fixture
async def limited_client(limited: FakeTelegram) -> AsyncIterator[Bot]:
    bot = make_bot(limited)
    await within(bot.initialize())
    yield bot
    await within(bot.shutdown())


async def test_past_a_private_chats_limit_a_call_raises_retry_after(
    limited: FakeTelegram, limited_client: Bot
) -> None:
    """Three calls in any three seconds in one chat, edits and deletions counted too."""
    first = await within(limited_client.send_message(CHAT, "one"))
    await within(limited_client.edit_message_text("one, edited", CHAT, first.message_id))
    await within(limited_client.delete_message(CHAT, first.message_id))

    with pytest.raises(RetryAfter) as caught:
        await within(limited_client.send_message(CHAT, "too soon"))

    assert caught.value.retry_after == timedelta(seconds=3)
    assert limited.calls_to("sendMessage")[-1].error == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 3",
        "parameters": {"retry_after": 3},
    }
    [refused] = limited.refused_429
    assert (refused.what, refused.window.key, refused.retry_after) == ("sendMessage", "chat 777", 3)
    await within(limited_client.send_message(CHAT + 1, "another chat"))  # its own window
    limited.rate_limits.clock.advance(2.5)
    with pytest.raises(RetryAfter) as caught:
        await within(limited_client.send_message(CHAT, "still too soon"))
    assert caught.value.retry_after == timedelta(seconds=1), "half a second, in whole seconds"
    limited.rate_limits.clock.advance(0.5)
    await within(limited_client.send_message(CHAT, "in time"))
    assert [m.visible for m in limited.sent(CHAT)] == ["in time"]
    assert len(limited.rate_limits.admitted) == 5


async def test_the_whole_bot_has_thirty_calls_a_second_and_typing_counts_only_there(
    limited: FakeTelegram, limited_client: Bot
) -> None:
    for _ in range(30):
        await within(limited_client.send_chat_action(CHAT, ChatAction.TYPING))

    with pytest.raises(RetryAfter) as caught:
        await within(limited_client.send_message(CHAT + 1, "a chat of its own"))

    assert caught.value.retry_after == timedelta(seconds=1)
    assert [r.window.key for r in limited.refused_429] == ["bot"]
    limited.rate_limits.clock.advance(1)
    await within(limited_client.send_message(CHAT + 1, "a second later"))


async def test_a_group_has_twenty_messages_a_minute(
    limited: FakeTelegram, limited_client: Bot
) -> None:
    group = -100123
    for n in range(20):
        await within(limited_client.send_message(group, f"message {n}"))

    with pytest.raises(RetryAfter) as caught:
        await within(limited_client.send_message(group, "one too many"))

    assert caught.value.retry_after == timedelta(seconds=60)
    limited.rate_limits.clock.advance(60)
    await within(limited_client.send_message(group, "a minute later"))
    assert len(limited.sent(group)) == 21


async def test_calls_that_show_nothing_in_a_chat_are_not_limited(
    limited: FakeTelegram, limited_client: Bot
) -> None:
    for _ in range(40):
        await within(limited_client.get_me())
    await within(limited_client.get_updates(timeout=0))

    assert limited.refused_429 == [] and limited.rate_limits.admitted == []


async def test_without_limits_nothing_is_refused(fake: FakeTelegram, client: Bot) -> None:
    for n in range(40):
        await within(client.send_message(CHAT, f"message {n}"))

    assert len(fake.sent(CHAT)) == 40
    assert fake.refused_429 == [] and fake.rate_limits.admitted == []


# --- waiting ---


async def test_wait_until_names_what_timed_out(fake: FakeTelegram) -> None:
    await fake.wait_until(lambda: True)

    with pytest.raises(AssertionError, match=r"timed out after 0\.05s waiting for a reply"):
        await fake.wait_until(lambda: fake.sent(CHAT), timeout=0.05, what="a reply")
    with pytest.raises(
        AssertionError, match=r'waiting for lambda: fake\.calls_to\("sendMessage"\), timeout'
    ):
        await fake.wait_until(lambda: fake.calls_to("sendMessage"), timeout=0.05)


# --- a whole Application ---


def build_app(fake: FakeTelegram, seen: list[str]) -> Application[Any, Any, Any, Any, Any, Any]:
    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        seen.append(update.message.text)
        await update.message.reply_text(f"echo: {update.message.text}")

    app = (
        Application.builder()
        .token(BOT_TOKEN)
        .base_url(fake.base_url)
        .base_file_url(fake.base_file_url)
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT, echo))
    return app


@contextlib.asynccontextmanager
async def polling(app: Application[Any, Any, Any, Any, Any, Any]) -> AsyncIterator[None]:
    """Start as production does; stop whatever the test has not stopped itself."""
    async with asyncio.timeout(LIBRARY_SECONDS):
        await app.initialize()
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(timeout=1, poll_interval=0)
    try:
        yield
    finally:
        async with asyncio.timeout(LIBRARY_SECONDS):
            if app.updater.running:
                await app.updater.stop()
            if app.running:
                await app.stop()
            await app.shutdown()


async def test_application_restart_redelivers_only_unconfirmed_updates(
    fake: FakeTelegram,
) -> None:
    first_seen: list[str] = []
    first = build_app(fake, first_seen)
    async with polling(first):
        await fake.wait_until(lambda: fake.calls_to("getUpdates"), what="the first poll")
        assert [call.method for call in fake.calls[:3]] == ["getMe", "deleteWebhook", "getUpdates"]
        assert fake.calls[1].params == {}
        assert fake.calls[2].params == {"offset": 0, "timeout": 1}  # no allowed_updates

        fake.user_message(CHAT, "one")
        two = fake.user_message(CHAT, "two")["update_id"]
        await fake.wait_until(lambda: len(fake.sent(CHAT)) == 2, what="both echoes")
        assert first.updater is not None
        await within(first.updater.stop())

        # stop() cancels the parked poll, then confirms what it fetched with a last short poll
        assert fake.calls_to("getUpdates")[-1].params == {"offset": two + 1, "timeout": 0}
        assert fake.confirmed_offset == two + 1

        # Fetched with no offset that covers it, as by a bot that dies before its next poll:
        # delivered once, never confirmed.
        three = fake.user_message(CHAT, "three")["update_id"]
        peeked = await within(first.bot.get_updates(timeout=0))
        assert [update.update_id for update in peeked] == [three]
    assert first_seen == ["one", "two"]
    assert fake.confirmed_offset == two + 1

    second_seen: list[str] = []
    second = build_app(fake, second_seen)
    async with polling(second):
        await fake.wait_until(lambda: len(fake.sent(CHAT)) == 3, what="the third echo")
        await fake.wait_until(lambda: fake.confirmed_offset == three + 1, what="confirmation")

    assert second_seen == ["three"]  # one and two were confirmed, so never come back
    assert [m.visible for m in fake.sent(CHAT)] == ["echo: one", "echo: two", "echo: three"]


async def test_a_flood_wait_may_be_a_fraction_of_a_second(fake: FakeTelegram, client: Bot) -> None:
    fake.fail_next("editMessageText", retry_after=0.05)

    with pytest.raises(RetryAfter) as caught:
        await within(client.edit_message_text("x", chat_id=CHAT, message_id=1))

    assert caught.value.retry_after == timedelta(seconds=0.05)


async def test_an_answer_can_leave_out_a_field(fake: FakeTelegram, client: Bot) -> None:
    """The message is sent, but without ``message_id`` the library cannot read the answer."""
    fake.answer_without("sendMessage", "message_id")

    with pytest.raises(TypeError, match="message_id"):
        await within(client.send_message(CHAT, "sent all the same"))

    assert [m.visible for m in fake.sent(CHAT)] == ["sent all the same"]


async def test_a_sticker_arrives_without_text(fake: FakeTelegram, client: Bot) -> None:
    fake.user_sticker(CHAT, emoji="🦉")

    (update,) = await within(client.get_updates(timeout=0))

    message = update.message
    assert message is not None and message.text is None and message.caption is None
    assert message.sticker is not None and message.sticker.emoji == "🦉"


async def test_a_held_answer_waits_and_a_request_given_up_is_noted(
    fake: FakeTelegram, client: Bot
) -> None:
    """The client here cancels its own request on purpose: the server cancels the held
    handler when the connection goes, and notes the request as abandoned."""
    fake.holds.hold("sendchataction", lambda params: lambda: fake.sent(CHAT))
    typing = asyncio.create_task(client.send_chat_action(CHAT, ChatAction.TYPING))
    await fake.wait_until(lambda: fake.holds.in_flight("sendchataction") == 1)
    typing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await typing

    await fake.wait_until(lambda: fake.holds.abandoned == ["sendchataction"])
    assert fake.holds.in_flight("sendchataction") == 0
    assert fake.calls_to("sendChatAction") == [], "never answered"


async def test_long_polls_in_flight_are_counted(fake: FakeTelegram, client: Bot) -> None:
    poll = asyncio.create_task(client.get_updates(timeout=5))
    await fake.wait_until(lambda: fake.holds.in_flight("getupdates") == 1)
    fake.user_message(CHAT, "wake up")
    (update,) = await within(poll)
    assert update.message is not None and update.message.text == "wake up"
    assert fake.holds.in_flight("getupdates") == 0
    assert fake.holds.most_in_flight("getupdates") == 1 and fake.holds.abandoned == []
