"""The web chat's board: bubbles kept across a restart, and streams that resume exactly once."""

import asyncio
from pathlib import Path

from channels.presses import STOP
from channels.web.board import UNTITLED, Board


def test_a_restart_keeps_every_bubble_and_the_numbers_go_on_growing(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    asked = board.post(entry.id, "person", "What is the weather?", bubble_id="p-1")
    reply = board.post(entry.id, "kaiwa", "Sunny", (STOP,), streaming=True)
    board.close()

    again = Board(tmp_path / "web.db")
    assert [(b.role, b.text, b.streaming) for b in again.bubbles(entry.id)] == [
        ("person", "What is the weather?", False),
        ("kaiwa", "Sunny", True),
    ]
    (listed,) = again.conversations("operator")
    assert (listed.title, listed.writing) == ("What is the weather?", True)
    edited = again.edit(reply.id, "Sunny all day.")
    assert edited.seq > max(asked.seq, reply.seq, listed.seq)
    assert again.conversations("operator")[0].writing is False
    again.close()


def test_a_stream_resumed_from_a_number_gets_each_bubbles_latest_state_once(
    tmp_path: Path,
) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    first = board.post(entry.id, "kaiwa", "Half", (STOP,), streaming=True)
    seen = board.latest
    board.edit(first.id, "Half and", (STOP,), streaming=True)
    board.edit(first.id, "Half and whole.")

    events = board.since("operator", seen)

    bubbles = [data for kind, _, data in events if kind == "bubble"]
    assert [(b["text"], b["streaming"]) for b in bubbles] == [("Half and whole.", False)]
    assert [seq for _, seq, _ in events] == sorted(seq for _, seq, _ in events)
    assert board.since("operator", board.latest) == []
    board.close()


async def test_a_subscriber_hears_each_change_and_another_persons_none(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    mine, theirs = board.new_conversation("operator"), board.new_conversation("ann")
    with board.subscribe("operator") as stream:
        board.post(theirs.id, "person", "not for you")
        board.post(mine.id, "person", "hello")
        kinds = [(await stream.get()) for _ in range(2)]
    assert [(kind, data.get("text", data.get("title"))) for kind, _, data in kinds] == [
        ("bubble", "hello"),
        ("conversation", "hello"),
    ]
    assert stream.empty()
    board.close()


async def test_a_stream_that_falls_too_far_behind_is_ended_not_left_growing(
    tmp_path: Path,
) -> None:
    """A page that stops reading (a frozen tab) must not hold every change in memory: its
    stream is told to end, and the page catches up from the board when it reconnects."""
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    with board.subscribe("operator") as stream:
        bubble = board.post(entry.id, "kaiwa", "0", (STOP,), streaming=True)
        for number in range(stream.maxsize):
            board.edit(bubble.id, str(number), (STOP,), streaming=True)
        items = [stream.get_nowait() for _ in range(stream.qsize())]
    assert items[-1] is None
    assert len(items) <= stream.maxsize
    board.close()


def test_a_new_conversation_is_untitled_until_its_first_message(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    assert entry.title == UNTITLED
    board.post(entry.id, "notice", "Started.")
    assert board.conversations("operator")[0].title == UNTITLED
    board.post(entry.id, "person", "  Plan   my\ntrip " + "to Kyoto " * 20)
    assert board.conversations("operator")[0].title == ("Plan my trip " + "to Kyoto " * 6)[:60]
    board.close()


async def test_streams_end_when_the_board_closes(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    with board.subscribe("operator") as stream:
        board.close()
        assert await asyncio.wait_for(stream.get(), 5) is None
