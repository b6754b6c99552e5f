"""The web chat's board: bubbles kept across a restart, and streams that resume exactly once."""

import asyncio
import sqlite3
from pathlib import Path

from channels.presses import STOP
from channels.web.board import MIGRATIONS, SCHEMA, UNTITLED, Board
from channels.web.uploads import FileUpload
from core.channel import Button, Card


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

    events = board.since("operator", seen, entry.id)

    bubbles = [data for kind, _, data in events if kind == "bubble"]
    assert [(b["text"], b["streaming"]) for b in bubbles] == [("Half and whole.", False)]
    assert [seq for _, seq, _ in events] == sorted(seq for _, seq, _ in events)
    assert board.since("operator", board.latest) == []
    board.close()


async def test_a_subscriber_hears_each_change_and_another_persons_none(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    mine, theirs = board.new_conversation("operator"), board.new_conversation("ann")
    with board.streams.subscribe("operator", mine.id) as stream:
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
    with board.streams.subscribe("operator", entry.id) as stream:
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
    with board.streams.subscribe("operator") as stream:
        board.close()
        assert await asyncio.wait_for(stream.get(), 5) is None


async def test_a_stream_carries_its_own_conversations_bubbles_and_the_lists_moves_only(
    tmp_path: Path,
) -> None:
    """Regression: every stream of a person carried every conversation's every edit, so one
    operator with 200 tabs open made each change 200 times 200 events."""
    board = Board(tmp_path / "web.db")
    open_here, elsewhere = board.new_conversation("operator"), board.new_conversation("operator")
    with board.streams.subscribe("operator", open_here.id) as stream:
        reply = board.post(elsewhere.id, "kaiwa", "Half", (STOP,), streaming=True)
        board.edit(reply.id, "Half and", (STOP,), streaming=True)
        board.edit(reply.id, "Half and whole.")
        heard = [stream.get_nowait() for _ in range(stream.qsize())]
    assert [(kind, data["id"], data["writing"]) for kind, _, data in heard] == [
        ("conversation", elsewhere.id, True),  # it moved to the top, being written
        ("conversation", elsewhere.id, False),  # and was done: the edit between told nothing
    ]
    assert [kind for kind, _, _ in board.since("operator", 0)] == ["conversation"] * 2, (
        "with no conversation open, the list alone"
    )
    board.close()


async def test_a_replys_activity_is_the_conversations_and_a_new_board_clears_a_dead_ones(
    tmp_path: Path,
) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    with board.streams.subscribe("operator", entry.id) as stream:
        board.set_activity(entry.id, "thinking…", "The person wants")
        board.set_activity(entry.id, "thinking…", "The person wants")  # the same: no event
        heard = [stream.get_nowait() for _ in range(stream.qsize())]
    assert [(kind, data.get("status")) for kind, _, data in heard] == [
        ("activity", "thinking…"),
        ("conversation", None),
    ]
    assert board.conversations("operator")[0].writing, "written before its first word"
    seen = board.latest
    board.close()

    again = Board(tmp_path / "web.db")
    assert again.activity(entry.id).status == ""
    after = again.since("operator", seen, entry.id)
    (cleared,) = [data for kind, _, data in after if kind == "activity"]
    assert (cleared["status"], cleared["thinking"]) == ("", ""), "a reconnecting page is told"
    assert not again.conversations("operator")[0].writing
    again.close()


def test_cards_are_kept_with_their_bubble(tmp_path: Path) -> None:
    board = Board(tmp_path / "web.db")
    entry = board.new_conversation("operator")
    status = board.post(entry.id, "kaiwa", "Sub-agents:", (STOP,), streaming=True)
    card = Card("a1", "find-apples", "running", "thinking", 2.0, "qwen3", 1, (STOP,))
    changed = board.set_cards(status.id, (card,))
    assert board.set_cards(status.id, (card,)) == changed, "the same cards: no change"
    board.close()
    assert Board(tmp_path / "web.db").bubbles(entry.id)[0].cards == (card,)


def test_a_board_from_before_cards_and_activity_opens_with_its_bubbles(tmp_path: Path) -> None:
    path = tmp_path / "web.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA)
    old.execute("INSERT INTO conversations VALUES ('c1', 'operator', 'Hi', 't', 't', 1)")
    old.execute("INSERT INTO bubbles VALUES ('b1', 'c1', 'person', 'Hi', '[]', 0, 0, 't', 2)")
    old.commit()
    old.close()

    board = Board(path)
    (bubble,) = board.bubbles("c1")
    assert (bubble.text, bubble.cards) == ("Hi", ())
    assert board.latest == 2
    board.set_cards("b1", (Card("a1", "x", "done", "done", 1.0, "m", 1, (Button("X", "/x"),)),))
    board.close()


def test_a_board_from_before_files_opens_with_its_bubbles_and_pictures_and_takes_files(
    tmp_path: Path,
) -> None:
    path = tmp_path / "web.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA)
    old.executescript(f"{MIGRATIONS[0]} PRAGMA user_version = 1;")
    old.execute("INSERT INTO conversations VALUES ('c1', 'operator', 'Hi', 't', 't', 1, '', '', 0)")
    old.execute("INSERT INTO bubbles VALUES ('b1', 'c1', 'person', 'Hi', '[]', 0, 0, 't', 2, '[]')")
    old.execute("INSERT INTO images VALUES ('i1', 'b1', 'image/png', x'89504e47')")
    old.commit()
    old.close()

    board = Board(path)
    (bubble,) = board.bubbles("c1")
    assert (bubble.text, bubble.images, bubble.files) == ("Hi", ("i1",), ())
    upload = FileUpload("notes.txt", "text/plain", b"hello")
    posted = board.post("c1", "person", "", bubble_id="b2", files=(upload,))
    board.close()

    again = Board(path)
    stored = again.bubble("b2")
    assert stored is not None
    (kept,) = stored.files
    assert kept == posted.files[0] and (kept.name, kept.size) == ("notes.txt", 5)
    assert again.uploads.data(kept.id) == b"hello"
    again.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
