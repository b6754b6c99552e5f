"""StreamingReply on a recording transport: growth by edits, overflow, rate limits, marks."""

import asyncio

import pytest

from channels.rendering import (
    RateLimited,
    RenderSettings,
    StreamingReply,
    final_text,
    send_notice,
)
from core.channel import Frame, Outcome


class Board:
    """A platform as a list of messages; `limited` makes the next calls raise RateLimited."""

    limit = 50

    def __init__(self, *, controls: bool = False) -> None:
        self.controls = controls
        self.messages: list[str] = []
        self.live: list[bool] = []
        self.calls: list[str] = []
        self.typing_shown = asyncio.Event()
        self.limited: list[float] = []

    @staticmethod
    def measure(text: str) -> int:
        return len(text)

    async def send(self, text: str, *, live: bool) -> str:
        self._maybe_limit("send")
        self.messages.append(text)
        self.live.append(live)
        return str(len(self.messages) - 1)

    async def edit(self, message_id: str, text: str, *, live: bool) -> None:
        self._maybe_limit("edit")
        self.messages[int(message_id)] = text
        self.live[int(message_id)] = live

    async def typing(self) -> None:
        self.calls.append("typing")
        self.typing_shown.set()

    def _maybe_limit(self, call: str) -> None:
        self.calls.append(call)
        if self.limited:
            raise RateLimited(self.limited.pop(0))


@pytest.fixture
def board() -> Board:
    return Board()


async def test_a_reply_grows_in_one_message(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("Hello"))
    await reply.update(Frame("Hello there"))
    await reply.finish("Hello there.", Outcome.DONE, None)

    assert board.messages == ["Hello there."]
    assert [c for c in board.calls if c != "typing"] == ["send", "edit", "edit"]


async def test_typing_shows_until_the_first_text(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await board.typing_shown.wait()
    await reply.update(Frame("Hi"))
    await reply.finish("Hi", Outcome.DONE, None)
    assert board.calls[0] == "typing"


async def test_overflow_continues_in_a_new_message_and_keeps_fences(board: Board) -> None:
    text = "First paragraph here.\n\n```py\nprint(1)\nprint(2)\nprint(3)\nprint(4)\n```"
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame(text[:30]))
    await reply.finish(text, Outcome.DONE, None)

    assert len(board.messages) >= 2
    assert all(len(message) <= Board.limit for message in board.messages)
    assert all(message.count("```") % 2 == 0 for message in board.messages)


async def test_status_line_shows_while_streaming_but_not_at_the_end(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("", thinking="hmm"))
    assert board.messages == ["_thinking…_"]
    await reply.update(Frame("Answer", activity="using current_time…"))
    assert board.messages == ["Answer\n\n_using current_time…_"]
    await reply.finish("Answer", Outcome.DONE, None)
    assert board.messages == ["Answer"]


async def test_status_line_can_be_switched_off(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(show_thinking=False, show_tools=False))
    await reply.update(Frame("", thinking="hmm"))
    await reply.update(Frame("Answer", activity="using current_time…"))
    await reply.finish("Answer", Outcome.DONE, None)
    assert board.messages == ["Answer"]


async def test_a_rate_limit_skips_frames_until_it_ends(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("one"))
    board.limited = [60]
    await reply.update(Frame("one two"))
    await reply.update(Frame("one two three"))
    assert board.messages == ["one"]
    assert board.calls.count("edit") == 1, "no call while the platform asked us to wait"


async def test_finish_waits_out_a_rate_limit_then_shows_everything(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("one"))
    board.limited = [0.05]
    await reply.update(Frame("one two"))
    started = asyncio.get_running_loop().time()
    await reply.finish("one two three", Outcome.DONE, None)
    assert asyncio.get_running_loop().time() - started >= 0.05
    assert board.messages == ["one two three"]


async def test_finish_retries_until_the_final_text_is_shown(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("partial"))
    board.limited = [0.01, 0.01]
    await reply.finish("partial and final", Outcome.DONE, None)
    assert board.messages == ["partial and final"]


def test_final_marks() -> None:
    assert final_text("Half", Outcome.STOPPED, None) == "Half (stopped)"
    assert final_text("", Outcome.STOPPED, None) == "(stopped)"
    assert final_text("Half", Outcome.FAILED, "model gone") == "Half\n\n⚠️ model gone"
    assert final_text("Done.", Outcome.DONE, None) == "Done."


async def test_a_notice_is_sent_in_full_through_a_rate_limit(board: Board) -> None:
    board.limited = [0.01]
    await send_notice(board, "word " * 20)
    assert len(board.messages) >= 2
    assert all(len(message) <= Board.limit for message in board.messages)
    assert "".join(board.messages).count("word") == 20


async def test_the_final_edit_keeps_the_interval_too(board: Board) -> None:
    """Regression: the last edit of a stream used to come as soon as the stream ended, sooner
    than the platform's edit interval after the previous edit."""
    reply = StreamingReply(board, RenderSettings(min_interval=0.05))
    loop = asyncio.get_running_loop()
    await reply.update(Frame("one"))
    shown_at = loop.time()
    await reply.update(Frame("one two"))
    assert board.messages == ["one"], "a frame inside the interval is skipped"
    await reply.finish("one two three", Outcome.DONE, None)
    assert loop.time() - shown_at >= 0.05
    assert board.messages == ["one two three"]


async def test_finish_with_nothing_new_makes_no_call(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(min_interval=60))
    await reply.update(Frame("all of it"))
    await reply.finish("all of it", Outcome.DONE, None)
    assert board.calls.count("edit") == 0
    assert board.live == [False], "no controls on this platform, so nothing is ever live"


async def test_controls_show_while_streaming_and_go_with_the_final_form() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("Half of it"))
    assert board.live == [True]
    await reply.finish("Half of it, and the rest.", Outcome.DONE, None)
    assert board.messages == ["Half of it, and the rest."]
    assert board.live == [False]


async def test_controls_are_taken_away_even_when_the_text_is_already_final() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings(min_interval=0.05))
    loop = asyncio.get_running_loop()
    await reply.update(Frame("all of it"))
    shown_at = loop.time()
    await reply.finish("all of it", Outcome.DONE, None)
    assert board.live == [False]
    assert board.calls.count("edit") == 1
    assert loop.time() - shown_at >= 0.05, "taking the control away is a change like any other"


async def test_every_overflow_message_loses_its_control_at_the_end() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings())
    await reply.update(Frame("word " * 8))
    await reply.update(Frame("word " * 16))
    assert board.live == [True, True]
    await reply.finish("word " * 16, Outcome.DONE, None)
    assert board.live == [False, False]
