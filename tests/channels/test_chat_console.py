"""The terminal chat as a person uses it: a real `kaiwa` process on a real pseudo-terminal.

The process sees a terminal (its stdin and stdout are the pty), so it runs the chat console;
what it draws is fed to pyte, a terminal emulator, and the tests read the screen a person would
see. Keys are bytes written to the pty. Every wait is on the screen or the fake model, never a
sleep.
"""

import asyncio
import fcntl
import os
import pty
import struct
import sys
import termios
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pyte
import pytest

from tests.fakes.ollama import FakeOllama, Pause, Text, ToolCall
from tests.fakes.patience import deadline
from tests.processes import write_config

WAIT = deadline()
ROWS, COLUMNS = 30, 100
ENTER, CTRL_D, UP = "\r", "\x04", "\x1b[A"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


class Terminal:
    """`kaiwa` on a pseudo-terminal, and the screen it draws."""

    def __init__(self) -> None:
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self._stream = pyte.ByteStream(self.screen)
        self._changed = asyncio.Event()
        self.process: asyncio.subprocess.Process | None = None
        self._master = -1

    async def start(self, config: Path) -> None:
        self._master, child = pty.openpty()
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = {**os.environ, "KAIWA_CONFIG": "", "PROMPT_TOOLKIT_NO_CPR": "1"}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--config", str(config),
            stdin=child, stdout=child, stderr=child, env={**env, "TERM": "xterm-256color"},
        )  # fmt: skip
        os.close(child)
        asyncio.get_running_loop().add_reader(self._master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._master, 65536)
        except OSError:  # the process ended and the pty closed
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self._master)
        self._stream.feed(data)
        self._changed.set()

    def type(self, keys: str) -> None:
        os.write(self._master, keys.encode())

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    @property
    def input_line(self) -> str:
        """The line the cursor is on: where the person types."""
        return self.screen.display[self.screen.cursor.y].rstrip()

    async def shows(self, condition: str | Callable[[], bool]) -> None:
        check = condition if callable(condition) else (lambda: condition in self.text)
        try:
            async with asyncio.timeout(WAIT):
                while not check():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"the screen never showed {condition!r}:\n{self.text}") from None

    async def ended(self) -> int:
        assert self.process is not None
        try:
            async with asyncio.timeout(WAIT):
                return await self.process.wait()
        except TimeoutError:
            raise AssertionError(f"kaiwa did not end; the screen:\n{self.text}") from None

    def hang_up(self) -> None:
        """Close the terminal, as a closed window or a lost SSH connection does."""
        asyncio.get_running_loop().remove_reader(self._master)
        os.close(self._master)
        self._master = -1

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self._master >= 0:
            self.hang_up()


@pytest.fixture
async def terminal(ollama: FakeOllama, tmp_path: Path) -> AsyncIterator[Terminal]:
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text().replace("show_thinking = false\n", ""))
    started = Terminal()
    await started.start(config)
    await started.shows(lambda: "Kaiwa is ready" in started.text and "you>" in started.text)
    yield started
    await started.close()


async def test_a_reply_streams_above_the_input_line_while_the_person_types(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    """Regression: text typed during a reply was mixed into it."""
    ollama.script(Text("The first half"), Pause("mid"), Text(", and the second."))
    terminal.type("tell me" + ENTER)
    await terminal.shows("The first half")
    await ollama.reached("mid")
    terminal.type("next question")

    await terminal.shows(lambda: terminal.input_line == "you> next question")
    assert "The first half" in terminal.text.split("you> next question")[0]
    ollama.release("mid")
    await terminal.shows("The first half, and the second.")
    await terminal.shows(lambda: terminal.input_line == "you> next question")  # still there
    reply_end = terminal.text.index("The first half, and the second.")
    assert "next question" not in terminal.text[:reply_end], "the reply is whole, unmixed"


async def test_a_message_sent_mid_reply_is_printed_after_the_reply(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    ollama.script(Text("The first half"), Pause("mid"), Text(", and the second."))
    ollama.script(Text("Second answer."))
    terminal.type("tell me" + ENTER)
    await ollama.reached("mid")
    terminal.type("and then?" + ENTER)
    await terminal.shows("you> and then?")  # shown at once, under the reply being written

    ollama.release("mid")

    await terminal.shows("Second answer.")
    lines = terminal.text.splitlines()
    assert lines.index("The first half, and the second.") < lines.index("you> and then?")
    assert lines.index("you> and then?") < lines.index("Second answer.")


async def test_ctrl_d_leaves_as_soon_as_the_last_turn_is_stored(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    """Regression: Ctrl-D always waited ten seconds (and swallowed what was typed meanwhile)."""
    ollama.script(Text("Done."))
    terminal.type("hi" + ENTER)
    await terminal.shows("Done.")

    terminal.type(CTRL_D)

    assert await terminal.ended() == 0  # well within the old ten-second wait


async def test_a_closed_terminal_ends_kaiwa(terminal: Terminal) -> None:
    """Regression: reading a terminal that was gone failed, and the channel was restarted every
    minute, for ever."""
    terminal.hang_up()

    assert await terminal.ended() == 0


async def test_history_recalls_what_was_sent(terminal: Terminal, ollama: FakeOllama) -> None:
    ollama.script(Text("One."))
    ollama.script(Text("Again."))
    terminal.type("the same question" + ENTER)
    await terminal.shows("One.")

    terminal.type(UP)
    await terminal.shows(lambda: terminal.input_line == "you> the same question")
    terminal.type(ENTER)

    await terminal.shows("Again.")
    asked = [request["messages"][-1]["content"] for request in ollama.requests]
    assert asked == ["the same question", "the same question"]


async def test_a_pasted_block_is_one_message_with_its_indentation(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    """Regression: a pasted code block became one turn per line, its indentation stripped."""
    ollama.script(Text("Looks fine."))
    code = "    def f(x):\n        if x:\n            return 1\n        return 0"

    terminal.type(PASTE_START + code + PASTE_END + ENTER)

    await terminal.shows("Looks fine.")
    (request,) = ollama.requests
    assert request["messages"][-1]["content"] == code


async def test_stop_typed_mid_reply_stops_it_at_once(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    ollama.script(Text("Working on it"), Pause("long"), Text(" never"))
    terminal.type("a long task" + ENTER)
    await ollama.reached("long")
    await terminal.shows("Working on it")

    terminal.type("/stop" + ENTER)

    await terminal.shows("(stopped)")
    await terminal.shows("Stopped.")
    assert "never" not in terminal.text


async def test_the_spinner_says_what_the_reply_waits_for_then_gives_way_to_text(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    """Regression: the screen stayed blank while a model loaded."""
    ollama.script(Pause("loading"), Text("Ready now."))
    terminal.type("hello" + ENTER)

    await terminal.shows("loading test-model…")
    ollama.release("loading")
    await terminal.shows("Ready now.")
    await terminal.shows(lambda: "loading test-model…" not in terminal.text)


async def test_a_fast_tool_leaves_a_line(terminal: Terminal, ollama: FakeOllama) -> None:
    """Regression: a tool that took no time never showed."""
    ollama.script(ToolCall("current_time", {}))
    ollama.script(Text("It is noon."))
    terminal.type("what time is it?" + ENTER)

    await terminal.shows("It is noon.")
    lines = terminal.text.splitlines()
    tool = lines.index("· current_time")
    assert lines.index("It is noon.") > tool


async def test_a_finished_reply_is_rendered_as_markdown(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    ollama.script(Text("# Steps\n\nRun this:\n\n```python\nprint('hi')\n```\n\nThen **rest**.\n"))
    terminal.type("how?" + ENTER)

    await terminal.shows("Then rest.")
    assert "# Steps" not in terminal.text and "Steps" in terminal.text
    assert "```" not in terminal.text and "print('hi')" in terminal.text
    assert "**" not in terminal.text


async def test_model_output_cannot_drive_the_terminal(
    terminal: Terminal, ollama: FakeOllama
) -> None:
    """An escape sequence in the model's text is shown, not obeyed (here: clear the screen)."""
    ollama.script(Text("before \x1b[2J\x1b[H after"))
    terminal.type("say something odd" + ENTER)

    await terminal.shows("after")
    assert "you> say something odd" in terminal.text, "nothing was cleared"
    assert "^[[2J" in terminal.text
