"""A button press (or a slash command) is answered to the person who used it, not to everyone.

The Stop button on a streaming reply sits in a conversation several people may see: a Discord or
Slack thread, a Telegram group. Pressing it hands `/stop` to the dispatcher as if it were typed,
so the access rules apply, and the dispatcher answers through the channel's `notify`
("Stopped.", or a stranger's refusal). The reply itself shows "(stopped)" to everyone, so that
answer is for the presser alone, in the platform's private form: a Discord ephemeral response,
a Telegram callback answer, a Slack ephemeral message.

An adapter marks the press while it delivers it (`pressing`), and its `notify` first offers the
text to `answered_privately`: the first notice in that place from the task delivering the press
is the press's answer. A context variable carries the mark, and the mark names its task, so a
notice for another message in the same place cannot take it: not from a task of its own (Discord's
test_a_private_answer_and_a_public_one_in_one_thread_do_not_swap), and not from a task started
during the press, which inherits the variable but is not the press's task.

Every button is a command (`core.channel.Button`): the Stop button on a reply is `/stop`, a
running sub-agent's in `/agents` is `/agents stop a2`. A button carries its command in the
platform's payload (Discord's custom id, Telegram's callback data, Slack's action id) as
`kaiwa:` and the command without its slash, so a press on a message posted by an earlier process
still works, and a payload too long for the platform (`fits`) is never sent.

A command can also be said to the bot where a person addresses it by mentioning it (Slack,
Discord): a mention followed by a bare command word ("@kaiwa stop") is that command, typed
(`!stop`). `without_mention` reads it the same way for both.
"""

import asyncio
import contextlib
import contextvars
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from core.channel import COMMANDS, Button

PAYLOAD_PREFIX = "kaiwa:"
STOP = Button("Stop", "/stop")
"""The Stop button on a reply being written."""
COMMAND_WORDS = frozenset(name for name, _ in COMMANDS)


def payload(button: Button) -> str:
    """What a press of `button` sends back to the bot."""
    return PAYLOAD_PREFIX + button.command.removeprefix("/")


def pressed_command(data: str | None) -> str | None:
    """The command a press's payload carries; None for a payload that is not Kaiwa's."""
    if not data or not data.startswith(PAYLOAD_PREFIX) or len(data) == len(PAYLOAD_PREFIX):
        return None
    return "/" + data.removeprefix(PAYLOAD_PREFIX)


def fitting(buttons: Sequence[Button], limit: int) -> list[Button]:
    """The buttons whose payload fits the platform's `limit` in bytes (the others are left
    out: each one's command can still be typed)."""
    return [button for button in buttons if len(payload(button).encode()) <= limit]


@dataclass
class Press:
    """A press being delivered in `place`; `answer` shows a text (and buttons, where the
    platform can show them to one person) to the presser alone."""

    place: str
    answer: Callable[[str, Sequence[Button]], Awaitable[None]]
    answered: bool = False
    task: asyncio.Task[object] | None = field(default=None, init=False)
    """The task delivering it (set by `pressing`)."""


_pressed: contextvars.ContextVar[Press | None] = contextvars.ContextVar(
    "the press being delivered", default=None
)


@contextlib.contextmanager
def pressing(press: Press) -> Iterator[Press]:
    """Mark `press` as the one this task is delivering, for the duration of the block."""
    press.task = asyncio.current_task()
    token = _pressed.set(press)
    try:
        yield press
    finally:
        _pressed.reset(token)


async def answered_privately(place: str, text: str, buttons: Sequence[Button] = ()) -> bool:
    """Show `text` to the presser if it answers the press this task delivers in `place`; False
    when there is no such press (or it was answered already), and the caller sends it as usual."""
    press = _pressed.get()
    if press is None or press.task is not asyncio.current_task():
        return False  # no press, or one this task did not deliver
    if press.place != place or press.answered:
        return False
    await press.answer(text, buttons)
    press.answered = True
    return True


def without_mention(text: str, mention: re.Pattern[str]) -> tuple[str, bool]:
    """`text` with the bot's `mention` (the pattern takes the blanks around it) replaced by one
    space, line breaks kept, and whether there was one. What is left, if it is a bare command
    word, is that command typed: "@kaiwa stop" is `!stop`."""
    if not mention.search(text):
        return text, False
    rest = mention.sub(" ", text).strip()
    return (f"!{rest}" if rest.lower() in COMMAND_WORDS else rest), True
