"""The terminal channel: the embedded default, so a fresh clone can chat before any token exists.

The channel turns what a person types into messages, one at a time (delivery only queues a
turn, so `/stop` typed while a reply streams is read and handled at once); end of input ends the
channel, which shuts the bot down. Where the lines come from and how replies look is a
`Console`'s business, and there are two:
- `PlainConsole` (here): lines from a stream, replies printed as they stream, thinking and tool
  activity dimmed. For pipes and files, which scripts and tests rely on, and for any terminal
  that is not interactive.
- `channels.chat_console.ChatConsole`: a chat in a real terminal, with line editing, history,
  multi-line input, a live reply above the input line and Markdown once it is done.

Frames are cumulative (the whole answer so far), so printing one means printing what is new since
the last. Model output is shown as text: control characters in it are made visible
(`printable`), never sent to the terminal to act on.
"""

import asyncio
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, TextIO

from channels.marks import ending_mark
from channels.places import TerminalPlace
from channels.settings import TerminalSettings
from core.channel import (
    Button,
    Card,
    ChannelMessage,
    ChannelTraits,
    Deliver,
    Delivery,
    Frame,
    OnPost,
    Outcome,
    Reply,
)

DIM, RESET = "\x1b[2m", "\x1b[0m"
REPLY_LABEL = "kaiwa> "
KEPT_CONTROLS = "\n\t"


class Console(Protocol):
    """A terminal as the channel sees it: where messages come from and where replies go."""

    def lines(self) -> AsyncIterator[str]:
        """What the person sends, one message at a time; ends at the end of input."""
        ...

    def reply(self, on_post: OnPost | None = None) -> Reply:
        """A reply to show as it streams; `on_post` hears no ids, once, when it first shows."""
        ...

    def say(self, text: str) -> None:
        """A line from the bot itself (a banner, a command's answer, a notice)."""
        ...

    @property
    def edits_in_place(self) -> bool:
        """Whether a reply's later frames replace what it showed (a live area) rather than
        print below it."""
        ...


class TerminalChannel:
    platform = TerminalPlace.platform

    def __init__(self, console: Console, settings: TerminalSettings) -> None:
        self.console = console
        self.traits = ChannelTraits(
            frame_interval=settings.frame_interval, edits_in_place=console.edits_in_place
        )
        self.place = TerminalPlace(settings.session).key
        self._run_id = uuid.uuid4().hex[:12]
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()
        self.connected.set()  # a terminal is there from the start
        self.problem: str | None = None

    @classmethod
    def plain(
        cls,
        lines: AsyncIterator[str],
        output: TextIO,
        settings: TerminalSettings,
        *,
        color: bool | None = None,
    ) -> "TerminalChannel":
        return cls(PlainConsole(lines, output, settings, color=color), settings)

    async def run(self, deliver: Deliver) -> None:
        self._reader = asyncio.current_task()
        try:
            await self._read(deliver)
        except asyncio.CancelledError:
            if not self._stopping or self._reader.uncancel() > 0:  # someone else's cancellation
                raise

    async def _read(self, deliver: Deliver) -> None:
        count = 0
        async for line in self.console.lines():
            if not line.strip():
                continue
            text = line.lstrip("\r\n").rstrip()  # a pasted block keeps its first indentation
            count += 1
            await deliver(
                ChannelMessage(
                    platform=self.platform,
                    place=self.place,
                    message_id=f"{self._run_id}-{count}",
                    author_id="local",
                    text=text,
                    author_name="you",
                )
            )

    async def problems(self) -> list[str]:
        """Nothing can be wrong with a terminal that `kaiwa check` could find."""
        return []

    async def stop_receiving(self) -> None:
        """Interrupt the read of the next line (a blocked read of stdin cannot be woken)."""
        self._stopping = True
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()

    async def open_for_sending(self) -> None:
        """The terminal is one process's: there is nothing to share."""
        self.connected.set()

    async def close(self) -> None:
        """Nothing to release: the reader thread is a daemon and ends with the process."""

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        """A terminal cannot change what it printed: a reply taken up after a restart starts
        anew below it. Printed lines have no ids: `on_post` hears none, once, when the reply
        first prints."""
        return self.console.reply(on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        """A terminal has no buttons: every button's command is one a person can type."""
        self.console.say(text)
        return ()

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        """A terminal cannot change what it printed (and gives no ids to edit)."""

    def say(self, text: str) -> None:
        """A line from the bot itself (the ready banner), outside any conversation."""
        self.console.say(text)


class PlainConsole:
    """Lines from a stream; replies printed as they stream (dimmed parts only on a terminal)."""

    edits_in_place = False

    def __init__(
        self,
        lines: AsyncIterator[str],
        output: TextIO,
        settings: TerminalSettings,
        *,
        color: bool | None = None,
    ) -> None:
        self._lines = lines
        self._output = output
        self._settings = settings
        self._color = output.isatty() if color is None else color
        self._streaming = 0
        """Replies printing now: a notice meanwhile would land inside their text."""
        self._held: list[str] = []
        """Notices that came while a reply printed, printed once it ends."""

    def lines(self) -> AsyncIterator[str]:
        return self._lines

    def reply(self, on_post: OnPost | None = None) -> Reply:
        return TerminalReply(self._write, self._dim, self._settings, self._reply_streams, on_post)

    def say(self, text: str) -> None:
        """A notice, on its own lines: between replies, never inside one."""
        line = self._dim(printable(text)) + "\n"
        if self._streaming:
            self._held.append(line)
        else:
            self._write(line)

    def _reply_streams(self, streaming: bool) -> None:
        self._streaming += 1 if streaming else -1
        if not self._streaming:
            held, self._held = self._held, []
            for line in held:
                self._write(line)

    def _write(self, text: str) -> None:
        self._output.write(text)
        self._output.flush()

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self._color else text


class TerminalReply:
    posted: tuple[str, ...] = ()  # printed lines have no ids

    def __init__(
        self,
        write: Callable[[str], None],
        dim: Callable[[str], str],
        settings: TerminalSettings,
        streams: Callable[[bool], None] = lambda streaming: None,
        on_post: OnPost | None = None,
    ) -> None:
        """`streams` hears True when the reply starts printing and False once it has ended
        (its console holds notices meanwhile); `on_post`, when it starts printing."""
        self.delivery = Delivery.NOTHING
        self._write_raw = write
        self._dimmed = dim
        self._settings = settings
        self._streams = streams
        self._on_post = on_post
        self._text = ""
        self._thinking = ""
        self._activity: str | None = None
        self._section: str | None = None

    async def update(self, frame: Frame) -> None:
        self._show(frame)

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        self._show(Frame(text))
        if self._section is None:
            self._start("text")
        mark = ending_mark(outcome, note)
        if mark:
            self._write_raw(self._dimmed(f" {mark}"))
        elif outcome is Outcome.FAILED:
            self._write_raw(("\n" if self._text else "") + f"[failed] {printable(note or '')}")
        self._write_raw("\n")
        self.delivery = Delivery.SHOWN
        self._streams(False)

    def _show(self, frame: Frame) -> None:
        if self._settings.show_thinking and frame.thinking and frame.thinking != self._thinking:
            new = _new_part(self._thinking, frame.thinking)
            self._start("thinking", fresh=not frame.thinking.startswith(self._thinking))
            self._write_raw(self._dimmed(printable(new)))
            self._thinking = frame.thinking
        if self._settings.show_tools and frame.activity and frame.activity != self._activity:
            self._start("activity", fresh=True)
            self._write_raw(self._dimmed(frame.activity))
        self._activity = frame.activity
        if frame.text != self._text:
            self._start("text", fresh=not frame.text.startswith(self._text))
            self._write_raw(printable(_new_part(self._text, frame.text)))
            self._text = frame.text

    def _start(self, section: str, *, fresh: bool = False) -> None:
        """Open a section (thinking, activity, text) on its own line when the kind changes."""
        if self._section is None:
            self._streams(True)
            self._write_raw(REPLY_LABEL)
            if self._on_post is not None:
                self._on_post(())
        elif section != self._section or fresh:
            self._write_raw("\n")
        self._section = section


def _new_part(shown: str, whole: str) -> str:
    return whole[len(shown) :] if whole.startswith(shown) else whole


def printable(text: str) -> str:
    """`text` with every control character but newline and tab shown as ^X (ESC as ^[), so
    model output cannot move the cursor, recolour the terminal or rename its window."""
    return "".join(
        f"^{chr((ord(char) + 64) % 128)}"
        if (ord(char) < 32 and char not in KEPT_CONTROLS) or 127 <= ord(char) < 160
        else char
        for char in text
    )


async def stdin_lines(stream: TextIO = sys.stdin) -> AsyncIterator[str]:
    """Lines of `stream` as an async iterator, read by a daemon thread so the loop never blocks.

    A thread (not `connect_read_pipe`) because stdin may be a file, a pipe or a terminal, and only
    a blocking read handles all three; daemon, because a read blocked at exit must not hold the
    process open. Bytes are decoded here, with undecodable ones replaced (U+FFFD): a stray byte
    from a terminal must not end the reader.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    encoding = getattr(stream, "encoding", None) or "utf-8"
    binary = getattr(stream, "buffer", None)

    def read() -> None:
        if binary is not None:
            for raw in iter(binary.readline, b""):
                loop.call_soon_threadsafe(queue.put_nowait, raw.decode(encoding, "replace"))
        else:
            for line in iter(stream.readline, ""):
                loop.call_soon_threadsafe(queue.put_nowait, line)
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="kaiwa-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line
