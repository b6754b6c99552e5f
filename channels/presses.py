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
"""

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Press:
    """A press being delivered in `place`; `answer` shows a text to the presser alone."""

    place: str
    answer: Callable[[str], Awaitable[None]]
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


async def answered_privately(place: str, text: str) -> bool:
    """Show `text` to the presser if it answers the press this task delivers in `place`; False
    when there is no such press (or it was answered already), and the caller sends it as usual."""
    press = _pressed.get()
    if press is None or press.task is not asyncio.current_task():
        return False  # no press, or one this task did not deliver
    if press.place != place or press.answered:
        return False
    await press.answer(text)
    press.answered = True
    return True
