"""The web chat as a person sees it: the real page (`channels/web/static/`) in chromium, signed
in by the printed link, on the real channel and the fake Ollama.

Each test asserts what is on screen (bubbles, buttons, the status line), through Playwright's
`expect`, which waits for the page to get there; the model's pauses (`Pause`, `release`) say
when a reply is half written. A test asks for `web` before `page`, so the page closes before
the channel stops.
"""

import asyncio
import base64
import os
import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, Locator, Page, Route, expect

from channels.web.channel import WebChannel
from core.features.approvals.questions import ApprovalSettings
from tests.channels.web.test_channel import PNG
from tests.core.features.test_subagents import QUIET, RESEARCHER, reports, task
from tests.fakes.ollama import Pause, Text, ToolCall
from tests.fakes.voice import spoken_note
from tests.harness import Bot

SHOT_ENV = "KAIWA_README_SHOT"
"""Set (to any value) to write README's screenshot, docs/web-chat.png; otherwise the test
takes it into its own temporary folder, leaving the work tree as it was."""
README_SHOT = Path(__file__).parents[3] / "docs" / "web-chat.png"
HOSTILE = (
    "<script>window.hacked=1</script> "
    '<img src=x onerror="window.hacked=2"> '
    "[click](javascript:window.hacked=3)"
)


async def signed_in(page: Page, channel: WebChannel) -> None:
    """The page opened by a fresh sign-in link, the key gone from the address bar."""
    await page.goto(channel.sign_in_link())
    await expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    assert "key=" not in page.url


async def new_conversation(page: Page) -> str:
    """A press of "New conversation"; its id, once the page has it open."""
    await page.get_by_role("button", name="New conversation").click()
    await expect(page).to_have_url(re.compile(r"#[a-z0-9]{12}$"))
    return page.url.rsplit("#", 1)[1]


async def say(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    await box.fill(text)
    await box.press("Enter")


def answer(page: Page) -> Locator:
    """The panel showing a press's answer, which is for this page alone (a region named by
    the label of the button pressed)."""
    return page.locator("#answer")


def bubbles(page: Page, role: str = "") -> Locator:
    return page.locator(f"#log .bubble{'.' + role if role else ''}[data-id]")


async def on_screen(page: Page) -> list[tuple[str, str, str]]:
    """Every bubble shown, in order: (id, role, text)."""
    return [
        (
            await each.get_attribute("data-id") or "",
            (await each.get_attribute("class") or "").split()[1],
            await each.locator(".body").inner_text(),
        )
        for each in await bubbles(page).all()
    ]


async def shown_once(page: Page, person: str, reply: str) -> None:
    """The conversation on screen is the person's message and the finished reply, once each."""
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text(reply)
    await expect(bubbles(page, "kaiwa")).not_to_have_class(re.compile("streaming"))
    await expect(bubbles(page)).to_have_count(2)
    await expect(bubbles(page, "person").locator(".body")).to_have_text(person)


async def pinned(page: Page, bubble: Locator) -> Locator:
    """The bubble `bubble` finds now, by its id, whatever its text and class become."""
    return page.locator(f'#log .bubble[data-id="{await bubble.get_attribute("data-id")}"]')


async def streaming(page: Page, partial: str) -> Locator:
    """The reply being written, showing `partial` and its Stop button; the bubble, by its id
    (so it is the same bubble once it has ended)."""
    bubble = page.locator("#log .bubble.kaiwa.streaming[data-id]")
    await expect(bubble.locator(".body")).to_have_text(partial)
    await expect(bubble).to_have_attribute("aria-busy", "true")
    await expect(bubble.get_by_role("button", name="Stop")).to_be_visible()
    return await pinned(page, bubble)


async def test_a_reply_shows_its_first_words_with_stop_then_ends_without_it(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("First words"), Pause("mid"), Text(" and the rest."))
    await signed_in(page, channel)
    await new_conversation(page)

    box = page.get_by_role("textbox", name="Message")
    await box.fill("line one")
    await box.press("Shift+Enter")  # a new line in the box, not a message
    await box.press_sequentially("line two")
    await expect(box).to_have_value("line one\nline two")
    await box.press("Enter")
    await expect(box).to_have_value("")

    reply = await streaming(page, "First words")
    bot.ollama.release("mid")
    await expect(reply.locator(".body")).to_have_text("First words and the rest.")
    await expect(reply).to_have_attribute("aria-busy", "false")
    await expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    await expect(bubbles(page, "person")).to_have_count(1)
    await expect(bubbles(page, "person").locator(".body")).to_have_text("line one\nline two")


async def test_stop_keeps_the_partial_across_a_reload(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Half an answer"), Pause("forever"), Text(" never"))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "talk")
    reply = await streaming(page, "Half an answer")

    await reply.get_by_role("button", name="Stop").click()
    await expect(reply.locator(".body")).to_have_text("Half an answer (stopped)")
    await expect(reply).to_have_attribute("aria-busy", "false")
    await expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    await expect(answer(page).locator(".body")).to_have_text("Stopped.")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    before = await on_screen(page)

    await page.reload()
    await expect(bubbles(page)).to_have_count(len(before))
    assert await on_screen(page) == before
    assert [role for _, role, _ in before] == ["person", "kaiwa"], (
        "regression: Stop showed '(stopped)' and a 'Stopped.' bubble, the same news twice"
    )


async def test_a_reload_mid_reply_shows_every_bubble_once_and_the_reply_goes_on(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Half"), Pause("mid"), Text(" and whole."))
    await signed_in(page, channel)
    await new_conversation(page)
    await say(page, "go")
    await streaming(page, "Half")

    await page.reload()
    await streaming(page, "Half")
    bot.ollama.release("mid")
    await shown_once(page, "go", "Half and whole.")


async def test_a_dropped_stream_mid_reply_shows_every_bubble_once_and_the_reply_goes_on(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    """The server ends the page's stream and the page cannot get back for a while (its
    reconnections fail): it says so, and once back it shows the reply finished meanwhile."""
    bot, channel = web
    bot.ollama.script(Text("Half"), Pause("mid"), Text(" and whole."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "go")
    await streaming(page, "Half")

    async def unreachable(route: Route) -> None:
        await route.abort("connectionrefused")

    await page.route("**/api/events*", unreachable)
    channel.board.streams.end()
    await expect(page.get_by_role("status", name="Connection")).to_have_text("Reconnecting…")
    bot.ollama.release("mid")
    await bot.runner.wait_idle(f"web:operator:{conversation}")

    await page.unroute("**/api/events*", unreachable)
    await expect(page.get_by_role("status", name="Connection")).to_have_text("")
    await shown_once(page, "go", "Half and whole.")


async def test_a_second_tab_shows_the_message_and_the_reply_as_they_come(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Coming"), Pause("mid"), Text(" along."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    other = await page.context.new_page()
    await other.goto(f"{channel.url}/#{conversation}")
    await expect(other.get_by_role("textbox", name="Message")).to_be_visible()

    await say(page, "hello from tab one")
    await expect(bubbles(other, "person").locator(".body")).to_have_text("hello from tab one")
    await streaming(other, "Coming")
    bot.ollama.release("mid")
    await shown_once(other, "hello from tab one", "Coming along.")
    await shown_once(page, "hello from tab one", "Coming along.")


async def test_a_reply_with_script_and_hostile_links_shows_as_text_and_runs_nothing(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text(HOSTILE))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "hi")
    await bot.runner.wait_idle(f"web:operator:{conversation}")

    reply = bubbles(page, "kaiwa").locator(".body")
    await expect(reply).to_contain_text("<script>window.hacked=1</script>")
    await expect(reply).to_contain_text('<img src=x onerror="window.hacked=2">')
    await expect(reply).to_contain_text("javascript:window.hacked=3")
    for hostile in ("#log script", "#log img", '#log a[href^="javascript"]'):
        await expect(page.locator(hostile)).to_have_count(0)
    assert await page.evaluate("window.hacked") is None


async def test_without_a_session_the_sign_in_page_is_shown_and_no_message_box(
    web: tuple[Bot, WebChannel], page: Page, browser: Browser
) -> None:
    """Signed in in one context, another (no cookie) gets the sign-in page, and the used link
    does not sign it in either."""
    _, channel = web
    link = channel.sign_in_link()
    await page.goto(link)
    await expect(page.get_by_role("textbox", name="Message")).to_be_visible()

    stranger = await browser.new_context()
    try:
        other = await stranger.new_page()
        answer = await other.goto(channel.url)
        assert answer is not None and answer.status == 401
        await expect(other.locator("body")).to_contain_text("kaiwa web-link")
        await expect(other.get_by_role("textbox", name="Message")).to_have_count(0)
        used = await other.goto(link)
        assert used is not None and used.status == 403
        await expect(other.locator("body")).to_contain_text("not valid")
        await expect(other.get_by_role("textbox", name="Message")).to_have_count(0)
    finally:
        await stranger.close()


@pytest.mark.bot(approvals=ApprovalSettings(ask=["echo"]))
async def test_an_approval_is_answered_by_its_button(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(ToolCall("echo", {"word": "hello"}))
    bot.ollama.script(Text("The tool said hello."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "say hello")

    allow = page.get_by_role("button", name="Allow once")
    question = await pinned(page, bubbles(page, "notice").filter(has=allow))
    await expect(question.locator(".body")).to_contain_text("echo(hello)")
    await question.get_by_role("button", name="Allow once").click()
    await expect(question.locator(".body")).to_contain_text("operator allowed it once.")
    await expect(question.get_by_role("button")).to_have_count(0)
    await expect(bubbles(page, "kaiwa").last).to_contain_text("The tool said hello.")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    await expect(answer(page).locator(".body")).to_have_text("You allowed it once: echo(hello).")
    shown = [(role, text) for _, role, text in await on_screen(page)]
    assert shown == [
        ("person", "say hello"),
        ("notice", "echo(hello): operator allowed it once."),
        ("kaiwa", "The tool said hello."),
    ]
    tool = [m for m in bot.ollama.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool] == ["echo hello"]


@pytest.mark.bot(images=True)
async def test_a_chosen_picture_goes_with_the_message_and_shows_after_a_reload(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("A single pixel."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    files = [
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"},
        {"name": "dot.png", "mimeType": "image/png", "buffer": PNG},
    ]
    await page.set_input_files("#picture-file", files=files)  # what "Add picture" opens

    await expect(page.get_by_role("alert")).to_contain_text("notes.txt is not a picture")
    await expect(page.get_by_role("button", name="Remove dot.png")).to_be_visible()
    await say(page, "what is this?")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text("A single pixel.")
    await expect(page.get_by_role("button", name="Remove dot.png")).to_have_count(0)

    (asked,) = [m for m in bot.ollama.requests[0]["messages"] if m["role"] == "user"]
    assert asked["images"] == [base64.b64encode(PNG).decode()]
    await page.reload()
    sent = bubbles(page, "person").get_by_role("img", name="A picture you sent")
    await expect(sent).to_have_count(1)
    loaded = await sent.evaluate("image => image.complete && image.naturalWidth")
    assert loaded == 1, "the picture is served back from the board"


async def test_attached_files_show_as_chips_go_with_the_message_and_download_back(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Two files, noted."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    chosen = [
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"buy apples\n"},
        {"name": "<b>draft</b>.md", "mimeType": "", "buffer": b"# Draft"},
        {"name": "note.ogg", "mimeType": "audio/ogg", "buffer": spoken_note("hello")},
    ]
    async with page.expect_file_chooser() as choosing:
        await page.get_by_role("button", name="Attach files").click()
    await (await choosing.value).set_files(files=chosen)

    to_send = page.get_by_role("list", name="To send with the message")
    await expect(to_send.get_by_role("listitem")).to_have_count(3)
    await expect(to_send).to_contain_text("notes.txt (11 bytes)")
    await page.get_by_role("button", name="Remove <b>draft</b>.md").click()
    await expect(to_send.get_by_role("listitem")).to_have_count(2)
    await say(page, "keep these")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    await expect(to_send.get_by_role("listitem")).to_have_count(0)

    sent = bubbles(page, "person")
    await expect(sent.get_by_role("link")).to_have_text(["notes.txt", "note.ogg"])
    await expect(sent.locator(".files li").first).to_have_text("notes.txt 11 bytes")
    async with page.expect_download() as downloading:
        await sent.get_by_role("link", name="notes.txt").click()
    download = await downloading.value
    assert download.suggested_filename == "notes.txt"
    assert await asyncio.to_thread(Path(await download.path()).read_bytes) == b"buy apples\n"
    (person,) = [b for b in channel.board.bubbles(conversation) if b.role == "person"]
    assert [(f.name, f.kind) for f in person.files] == [
        ("notes.txt", "file"),
        ("note.ogg", "audio"),
    ]


async def test_a_dropped_file_past_the_cap_is_refused_by_the_page_saying_the_sizes(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    """Dropped on the message box with a small one: the small one is taken. The large one is
    made in the page (sending 26 MB into chromium would take the test most of a minute)."""
    _, channel = web
    await signed_in(page, channel)
    await new_conversation(page)
    await page.locator("#composer").evaluate(
        """composer => {
            const dropped = new DataTransfer();
            const large = new Uint8Array(26 * 1024 * 1024);
            dropped.items.add(new File([large], "report.pdf", { type: "application/pdf" }));
            dropped.items.add(new File(["buy apples"], "notes.txt", { type: "text/plain" }));
            composer.dispatchEvent(new DragEvent("drop", { dataTransfer: dropped, bubbles: true }));
        }"""
    )
    await expect(page.get_by_role("alert")).to_have_text(
        "report.pdf is 26 MB; the web chat takes files up to 25 MB."
    )
    chips = page.get_by_role("list", name="To send with the message").get_by_role("listitem")
    await expect(chips).to_have_text(["notes.txt (10 bytes)Remove notes.txt"])


@pytest.mark.bot(agents={"researcher": RESEARCHER}, delegates_to=("researcher",), subagents=QUIET)
async def test_one_sub_agent_is_stopped_from_the_page_and_the_other_goes_on(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples"), task("find pears")]}))
    bot.ollama.script(Text("Two helpers are on it."))
    bot.ollama.script_for("apples", Pause("apples"), reports("Apples: 3 kinds."))
    bot.ollama.script_for("pears", Pause("pears"), reports("Pears: 2 kinds."))
    bot.ollama.script(Text("The apples helper was stopped."))
    bot.ollama.script(Text("Pears came back: 2 kinds."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "what fruit is there?")
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text("Two helpers are on it.")
    await bot.ollama.reached("apples")
    await bot.ollama.reached("pears")

    await page.get_by_role("button", name="Sub-agents").click()
    listing = answer(page)
    await expect(listing).to_contain_text("Sub-agents here:")
    await listing.get_by_role("button", name="Stop find-apples").click()
    await expect(listing).to_contain_text("stopped find-apples")
    last_reply = bubbles(page, "kaiwa").last.locator(".body")
    await expect(last_reply).to_have_text("The apples helper was stopped.")  # its report's turn
    bot.ollama.release("pears")
    await expect(last_reply).to_have_text("Pears came back: 2 kinds.")
    stored = await bot.store.active_conversation(f"web:operator:{conversation}")
    assert stored is not None and stored.id is not None
    runs = await bot.store.runs(stored.id)
    assert [(run.key, run.status) for run in runs] == [("a1", "stopped"), ("a2", "done")]


@pytest.mark.bot(agents={"researcher": RESEARCHER}, delegates_to=("researcher",), subagents=QUIET)
async def test_a_tab_closed_while_a_sub_agent_works_shows_its_report_when_opened_again(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    """Kaiwa, not the tab, owns the work: the report's turn runs with no page open, and the
    page opened later shows it, once."""
    bot, channel = web
    bot.ollama.script(ToolCall("delegate", {"tasks": [task("find apples")]}))
    bot.ollama.script(Text("A helper is on it."))
    bot.ollama.script_for("apples", Pause("apples"), reports("Apples: 3 kinds."))
    bot.ollama.script(Text("The helper found 3 kinds of apples."))
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "what fruit is there?")
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text("A helper is on it.")
    await bot.ollama.reached("apples")
    place = f"web:operator:{conversation}"
    run = bot.subagents.find(place, "a1")
    assert run is not None
    context = page.context
    await page.close()  # the tab goes away while the sub-agent works

    bot.ollama.release("apples")
    await run.finished.wait()
    await bot.runner.wait_idle(place)
    reopened = await context.new_page()
    await reopened.goto(f"{channel.url}/#{conversation}")

    replies = bubbles(reopened, "kaiwa").locator(".body")
    found = "The helper found 3 kinds of apples."
    await expect(replies).to_have_text(["A helper is on it.", found])


async def test_the_usage_view_shows_the_conversations_figures(
    web: tuple[Bot, WebChannel], page: Page
) -> None:
    bot, channel = web
    bot.ollama.script(Text("Hello."))
    await signed_in(page, channel)
    await new_conversation(page)
    await say(page, "hi")
    await expect(bubbles(page, "kaiwa").locator(".body")).to_have_text("Hello.")
    await page.get_by_role("button", name="Usage").click()
    await expect(answer(page).locator(".body")).to_contain_text("model call")
    await expect(bubbles(page, "notice")).to_have_count(0)
    await answer(page).get_by_role("button", name="Close").click()
    await expect(answer(page)).to_be_hidden()


async def test_the_screenshot_for_the_readme(
    web: tuple[Bot, WebChannel], page: Page, tmp_path: Path
) -> None:
    """docs/web-chat.png, which README.md shows: a conversation with a Markdown answer, its
    code highlighted, and the next reply being written (`KAIWA_README_SHOT=1` writes it)."""
    bot, channel = web
    bot.ollama.script(
        Text(
            "Use **`pathlib`**: it reads the whole file in one call.\n\n"
            "```python\nfrom pathlib import Path\n\n"
            "def words(name: str) -> int:\n"
            '    """How many words the file holds."""\n'
            "    return len(Path(name).read_text().split())\n```\n\n"
            "- `read_text()` closes the file for you\n"
            "- `split()` with no argument splits on any whitespace"
        )
    )
    bot.ollama.script(Text("It counts each run of"), Pause("shot"), Text(" whitespace once."))
    await page.set_viewport_size({"width": 1100, "height": 700})
    await signed_in(page, channel)
    conversation = await new_conversation(page)
    await say(page, "How do I count the words in a file in Python?")
    await bot.runner.wait_idle(f"web:operator:{conversation}")
    await expect(bubbles(page, "kaiwa").locator("pre")).to_be_visible()
    await say(page, "And two spaces in a row?")
    await streaming(page, "It counts each run of")

    shot = README_SHOT if os.environ.get(SHOT_ENV) else tmp_path / "web-chat.png"
    await page.screenshot(path=shot, animations="disabled")
    assert shot.stat().st_size > 0
    bot.ollama.release("shot")
    await expect(page.get_by_role("button", name="Stop")).to_have_count(0)
