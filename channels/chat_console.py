"""A chat in a real terminal: what `kaiwa` shows when a person runs it at a prompt.

prompt_toolkit owns the screen: the input line is always the bottom line, with line editing,
history (Up, Ctrl-R; kept in the data folder), and multi-line messages (a paste is one message,
by bracketed paste; Alt-Enter or Esc then Enter starts a new line). Everything printed goes
above it (`patch_stdout`), so a reply streaming in never garbles what is being typed, and a
`/stop` typed meanwhile is sent at once.

A reply is shown in two layers:
- live, above the input line (part of the prompt, redrawn in place, so streaming never
  flickers): the text still being written, dimmed thinking, and a spinner with what the reply
  waits for ("loading qwen3:4b…", "waiting for the model: 2 requests ahead", "thinking…");
- committed, printed into the scrollback for good: each block of the answer once it is complete
  (a paragraph, a list, a closed code fence), rendered as Markdown with highlighted code by
  rich; a dim `· tool` line for every tool the reply used, however fast; the stop or failure
  mark at the end, then a blank line.

Model output is shown as text (`channels.terminal.printable`); rich renders Markdown from it, and
escape sequences in it never reach the terminal.
"""

import contextlib
import io
import itertools
import logging
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from prompt_toolkit import PromptSession, print_formatted_text
from prompt_toolkit.formatted_text import ANSI, FormattedText
from prompt_toolkit.history import FileHistory
from prompt_toolkit.input.vt100 import Vt100Input
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import patch_stdout
from prompt_toolkit.styles import Style
from rich.console import Console as RichConsole
from rich.markdown import Markdown

from channels.marks import ending_mark
from channels.settings import TerminalSettings
from channels.terminal import printable
from core.channel import Card, Delivery, Frame, OnPost, Outcome

logger = logging.getLogger(__name__)

PROMPT = "you> "
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
REFRESH_SECONDS = 0.1
STYLE = Style.from_dict({"dim": "#888888", "spinner": "#888888 bold", "prompt": "bold"})
FENCE = re.compile(r"^\s*(```|~~~)")


class ChatConsole:
    edits_in_place = True
    """A reply lives above the input line until it ends: its frames replace each other."""

    def __init__(self, settings: TerminalSettings, history: Path) -> None:
        self._settings = settings
        history.parent.mkdir(parents=True, exist_ok=True)
        self._session: PromptSession[str] = PromptSession(
            message=self._message,
            input=RawInput(sys.stdin),
            history=FileHistory(str(history)),
            key_bindings=_keys(),
            style=STYLE,
            refresh_interval=REFRESH_SECONDS,
            erase_when_done=True,  # `_echo` prints what was sent, where it belongs
        )
        self._live: list[ChatReply] = []
        """Replies being written (a turn's, and the sub-agents' status), oldest first."""
        self._sent_meanwhile: list[str] = []
        """Messages sent while a reply is written: shown under it, printed after it."""
        self._spinner = itertools.cycle(SPINNER)

    async def lines(self) -> AsyncIterator[str]:
        """Messages as typed; ends with Ctrl-D on an empty line, or Ctrl-C. The terminal stays
        raw from the first prompt to the last, between prompts too (see `RawInput`)."""
        with patch_stdout(raw=True), self._session.input.raw_mode():
            while True:
                try:
                    text = await self._session.prompt_async()
                except (EOFError, KeyboardInterrupt):
                    return
                except OSError as exc:  # the terminal is gone: a closed window, a lost SSH link
                    logger.warning("the terminal went away (%s); ending the terminal chat", exc)
                    return
                self._echo(text)
                yield text

    def reply(self, on_post: OnPost | None = None) -> "ChatReply":
        reply = ChatReply(self._settings, self._invalidate, self._width, self._reply_ended, on_post)
        self._live.append(reply)
        return reply

    def say(self, text: str) -> None:
        _commit(FormattedText([("class:dim", printable(text) + "\n")]))

    def _echo(self, text: str) -> None:
        """Print a sent message in the conversation: at once, or, while a reply is written,
        after it (the reply stays in one piece; the message waits for it anyway)."""
        if self._live:
            self._sent_meanwhile.append(text)
            self._invalidate()
        else:
            _commit(_said(text))

    def _reply_ended(self) -> None:
        self._live = [reply for reply in self._live if not reply.done]
        if self._live:
            return
        for text in self._sent_meanwhile:
            _commit(_said(text))
        self._sent_meanwhile.clear()

    def _message(self) -> FormattedText:
        """The prompt: the reply still being written, if any, and what was sent meanwhile,
        above the input line."""
        spinner = next(self._spinner)
        live = [line for reply in self._live for line in reply.live_lines(spinner)]
        sent = [("class:dim", f"{PROMPT}{_indented(text)}\n") for text in self._sent_meanwhile]
        return FormattedText([*live, *sent, ("class:prompt", PROMPT)])

    def _invalidate(self) -> None:
        app = self._session.app
        if app.is_running:
            app.invalidate()

    def _width(self) -> int:
        return shutil.get_terminal_size().columns


class RawInput(Vt100Input):
    """The terminal, never handed back to its own line editing while the chat runs.

    prompt_toolkit prints above a running prompt by switching the terminal to cooked mode for
    the moment of printing, and a reply prints many times. Keys typed in such a moment went to
    the terminal's line discipline: echoed into the reply, and a Ctrl-D taken as end-of-file and
    lost (the chat did not quit). Staying raw, they wait as bytes for the prompt to read."""

    def cooked_mode(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class ChatReply:
    """One reply: its complete blocks committed as Markdown, the rest live above the prompt."""

    posted: tuple[str, ...] = ()

    def __init__(
        self,
        settings: TerminalSettings,
        changed: Callable[[], None],
        width: Callable[[], int],
        ended: Callable[[], None],
        on_post: OnPost | None = None,
    ) -> None:
        """`on_post` hears no ids, once, when the reply first shows (printed lines have none)."""
        self._settings = settings
        self._first_shown = on_post
        self._changed = changed
        self._width = width
        self._ended = ended
        self._text = ""
        self._committed = 0
        """How much of the text is committed (printed for good)."""
        self._thinking = ""
        self._status: str | None = None
        self._tools = 0
        self.delivery = Delivery.NOTHING
        self.done = False

    async def update(self, frame: Frame) -> None:
        self._shown()
        self._commit_tools(frame.tools)
        if frame.text.startswith(self._text):
            self._text = frame.text
        self._thinking = frame.thinking if not frame.text else ""
        self._status = frame.activity or (
            "thinking…" if frame.thinking and not frame.text else None
        )
        self._commit_blocks(final=False)
        self._changed()

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        self._shown()
        self._commit_tools(tools)
        self._text = text
        self._status = None
        self._thinking = ""
        self._commit_blocks(final=True)
        mark = ending_mark(outcome, note)
        if outcome is Outcome.FAILED:
            _commit(FormattedText([("class:dim", f"[failed] {printable(note or '')}\n")]))
        elif mark:
            _commit(FormattedText([("class:dim", f"{mark}\n")]))
        _commit(FormattedText([("", "\n")]))
        self.done = True
        self.delivery = Delivery.SHOWN
        self._ended()
        self._changed()

    def live_lines(self, spinner: str) -> list[tuple[str, str]]:
        """What is shown above the prompt while the reply is written: the uncommitted text (its
        last screenful), dimmed thinking, and the spinner with the status."""
        if self.done:
            return []
        shown: list[tuple[str, str]] = []
        if self._thinking and self._settings.show_thinking:
            shown.append(("class:dim", _tail(printable(self._thinking), self._rows()) + "\n"))
        rest = self._text[self._committed :]
        if rest:
            shown.append(("", _tail(printable(rest), self._rows()) + "\n"))
        if self._status and (self._settings.show_tools or not self._status.startswith("using")):
            shown.append(("class:spinner", f"{spinner} "))
            shown.append(("class:dim", f"{printable(self._status)}\n"))
        elif not rest and not shown:
            shown.append(("class:spinner", f"{spinner}\n"))
        return shown

    def _shown(self) -> None:
        if self._first_shown is not None:
            told, self._first_shown = self._first_shown, None
            told(())

    def _commit_tools(self, tools: tuple[str, ...]) -> None:
        """A dim line for each tool the reply has used since the last frame, after the text
        it followed."""
        if len(tools) <= self._tools:
            return
        self._commit_blocks(final=True)
        if self._settings.show_tools:
            lines = "".join(f"· {printable(name)}\n" for name in tools[self._tools :])
            _commit(FormattedText([("class:dim", lines)]))
        self._tools = len(tools)

    def _commit_blocks(self, *, final: bool) -> None:
        """Print, rendered, the text's complete blocks (all of it when `final`)."""
        end = len(self._text) if final else _complete_until(self._text, self._committed)
        block = self._text[self._committed : end]
        if block.strip():
            _commit(ANSI(_rendered(printable(block), self._width())))
        self._committed = max(self._committed, end)

    def _rows(self) -> int:
        return max(3, shutil.get_terminal_size().lines - 6)


def _complete_until(text: str, start: int) -> int:
    """Where the complete blocks of `text` after `start` end: just after the last blank line
    that is outside a code fence (a block is complete once the next one has begun)."""
    end, fenced, position = start, False, start
    for line in text[start:].splitlines(keepends=True):
        position += len(line)
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and not line.strip() and line.endswith("\n"):
            end = position
    return end


def _rendered(markdown: str, width: int) -> str:
    """`markdown` rendered by rich for a terminal `width` wide, as text with ANSI colours."""
    buffer = io.StringIO()
    console = RichConsole(file=buffer, force_terminal=True, width=width, color_system="256")
    console.print(Markdown(markdown, code_theme="monokai"))
    return buffer.getvalue()


def _said(text: str) -> FormattedText:
    return FormattedText([("class:prompt", PROMPT), ("", _indented(text) + "\n")])


def _indented(text: str) -> str:
    """A message of several lines, its later lines under its first."""
    return printable(text).replace("\n", "\n" + " " * len(PROMPT))


def _tail(text: str, rows: int) -> str:
    lines = text.rstrip("\n").split("\n")
    return "\n".join(lines[-rows:])


def _commit(text: ANSI | FormattedText) -> None:
    """Print above the prompt, for good (the prompt is redrawn below it)."""
    print_formatted_text(text, end="", style=STYLE)


def _keys() -> KeyBindings:
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def new_line(event: KeyPressEvent) -> None:
        """Alt-Enter (Esc then Enter) starts a new line; Enter sends."""
        event.current_buffer.insert_text("\n")

    return keys
