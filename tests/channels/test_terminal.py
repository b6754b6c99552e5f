"""The terminal channel, driven line by line through the whole turn path."""

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

from channels.terminal import TerminalChannel, TerminalSettings, stdin_lines
from core.agent.profile import AgentProfile
from core.agent.tools import tool
from tests.fakes.ollama import FakeOllama, Pause, Text, Thinking, ToolCall
from tests.fakes.patience import deadline
from tests.harness import BotFactory

WAIT_SECONDS = deadline()


class Screen(io.StringIO):
    """What the terminal shows, with a handshake for 'this text has appeared'."""

    def __init__(self) -> None:
        super().__init__()
        self._tick = asyncio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        self._tick.set()
        self._tick = asyncio.Event()
        return written

    async def shows(self, text: str) -> None:
        async with asyncio.timeout(WAIT_SECONDS):
            while text not in self.getvalue():
                await self._tick.wait()


class Keyboard:
    """Lines typed by a test; `close()` is Ctrl-D."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    def type(self, line: str) -> None:
        self._queue.put_nowait(line + "\n")

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def lines(self) -> AsyncIterator[str]:
        while (line := await self._queue.get()) is not None:
            yield line


def terminal(screen: Screen, keyboard: Keyboard, **settings: bool) -> TerminalChannel:
    return TerminalChannel.plain(
        keyboard.lines(), screen, TerminalSettings(frame_interval=0, **settings), color=False
    )


async def test_a_reply_streams_and_ctrl_d_ends_the_channel(
    make_bot: BotFactory, ollama: FakeOllama
) -> None:
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    bot = make_bot(channel=channel)
    ollama.script(Text("Hello from Kaiwa.", chunks=3))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("hi")
    await screen.shows("kaiwa> Hello from Kaiwa.\n")
    keyboard.close()
    async with asyncio.timeout(WAIT_SECONDS):
        await reading
    assert (await bot.history("terminal:local"))[-1].text == "Hello from Kaiwa."


async def test_stop_typed_while_a_reply_streams(make_bot: BotFactory, ollama: FakeOllama) -> None:
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    bot = make_bot(channel=channel)
    ollama.script(Text("Once upon a time"), Pause("story"), Text(" there was more"))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("tell a story")
    await screen.shows("Once upon a time")
    keyboard.type("/stop")
    await screen.shows("Stopped.")

    assert "kaiwa> Once upon a time (stopped)\nStopped.\n" in screen.getvalue()
    assert (await bot.history("terminal:local"))[-1].text == "Once upon a time"
    keyboard.close()
    await reading


async def test_a_notice_during_a_reply_waits_for_it_to_end_on_a_line_of_its_own(
    make_bot: BotFactory, ollama: FakeOllama
) -> None:
    """The bug: in pipe mode a notice (a sub-agent's board, a `/tasks run` answer) was printed
    in the middle of a streaming reply's text."""
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    bot = make_bot(channel=channel)
    ollama.script(Text("Once upon a time"), Pause("story"), Text(" there was more."))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("tell a story")
    await screen.shows("Once upon a time")
    await channel.notify(channel.place, "Sub-agent a1 is done.")
    assert "Sub-agent a1 is done." not in screen.getvalue(), "held while the reply prints"
    ollama.release("story")
    await screen.shows("Sub-agent a1 is done.")

    assert screen.getvalue().endswith(
        "kaiwa> Once upon a time there was more.\nSub-agent a1 is done.\n"
    )
    keyboard.close()
    await reading


async def test_sub_agents_in_a_pipe_are_one_notice_between_replies(
    make_bot: BotFactory, ollama: FakeOllama
) -> None:
    """The bug: their status message, edited as they ran, printed each change below the last,
    in the middle of the reply that launched them. A pipe cannot edit: it gets the summary."""
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    helper = AgentProfile("helper", "test-model", "You look up.", tools={})
    bot = make_bot(channel=channel, agents={"helper": helper}, delegates_to=("helper",))
    task = {"profile": "helper", "instruction": "look up mountain heights"}
    ollama.script(ToolCall("delegate", {"tasks": [task]}))
    ollama.script(Text("A helper is on it."))
    ollama.script_for("heights", Pause("helper"), ToolCall("report", {"summary": "Everest."}))
    ollama.script(Text("Everest is the tallest."))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("which mountain is tallest?")
    await screen.shows("A helper is on it.\n")
    ollama.release("helper")
    await screen.shows("kaiwa> Everest is the tallest.\n")

    assert screen.getvalue().endswith(
        "A helper is on it.\n"
        "Sub-agents: look-up-mountain-heights done.\n"
        "kaiwa> Everest is the tallest.\n"
    )
    keyboard.close()
    await reading


async def test_thinking_and_tools_are_shown_when_enabled(
    make_bot: BotFactory, ollama: FakeOllama
) -> None:
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    looked_at = asyncio.Event()

    @tool()
    async def clock() -> str:
        """Read the clock (until the test has seen the tool line)."""
        await looked_at.wait()
        return "noon"

    bot = make_bot(channel=channel, tools=[clock])
    ollama.script(Thinking("Which zone?"), ToolCall("clock", {}))
    ollama.script(Text("It is noon."))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("time?")
    await screen.shows("using clock…")
    looked_at.set()
    await screen.shows("It is noon.\n")
    keyboard.close()
    await reading

    shown = screen.getvalue()
    assert shown.index("Which zone?") < shown.index("using clock…")
    assert shown.index("using clock…") < shown.index("It is noon.")


async def test_thinking_and_tools_can_be_hidden(make_bot: BotFactory, ollama: FakeOllama) -> None:
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard, show_thinking=False, show_tools=False)
    bot = make_bot(channel=channel)
    ollama.script(Thinking("secret musing"), ToolCall("current_time", {}))
    ollama.script(Text("It is noon."))

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("time?")
    await screen.shows("It is noon.\n")
    keyboard.close()
    await reading

    assert screen.getvalue() == "kaiwa> It is noon.\n"


async def test_a_failure_is_one_clear_line(make_bot: BotFactory, ollama: FakeOllama) -> None:
    screen, keyboard = Screen(), Keyboard()
    channel = terminal(screen, keyboard)
    bot = make_bot(channel=channel)
    ollama.models.clear()

    reading = asyncio.create_task(channel.run(bot.dispatcher.handle))
    keyboard.type("hi")
    await screen.shows("[failed]")
    keyboard.close()
    await reading

    assert screen.getvalue() == (
        "kaiwa> [failed] model test-model not found: run `ollama pull test-model`\n"
    )


async def test_stdin_lines_reads_a_file_to_its_end(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("first\nsecond\n")
    with source.open() as stream:
        lines = [line async for line in stdin_lines(stream)]
    assert lines == ["first\n", "second\n"]


async def test_stdin_lines_replaces_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Regression: a Latin-1 byte typed into a UTF-8 terminal reached the store as a lone
    surrogate, which the database refused, and the turn died without a word."""
    source = tmp_path / "input.txt"
    source.write_bytes(b"caf\xe9\nfine\n")
    with source.open(encoding="utf-8") as stream:
        lines = [line async for line in stdin_lines(stream)]
    assert lines == ["caf\ufffd\n", "fine\n"]
