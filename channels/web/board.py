"""The web chat's own side of every conversation: each bubble a page shows, kept in a file.

For the other channels the platform keeps the messages (Telegram's servers hold what the bot
posted, and an edit names the message by its id); for the web chat Kaiwa is the platform, so the
board keeps them: every bubble (a person's message, a reply's message, a notice) of every
browser conversation, with its text, its buttons and whether its reply is still being written.
It lives in `<data_dir>/web.db` (SQLite, WAL), so a page opened after a restart shows what was
said, and a restart's recovery edits the bubbles of a reply that was cut ("interrupted by a
restart") by their ids, as on any platform.

Every change is an event with a number from one counter that only grows (`seq`, kept with the
rows, so it goes on growing across restarts). A bubble's event is its whole current state, not
a difference, so a page upserts by the bubble's id and an event seen twice changes nothing.
A page's stream (`channels.web.api`) resumes from the last number it saw (`since`): the latest
state of each bubble changed after it, in order, then what changes next (`subscribe`).

Writes are a row each on the event loop: SQLite in WAL mode with `synchronous=NORMAL` commits
in some tens of microseconds without waiting for the disk, and a reply changes its bubble a few
times a second at most. Readers (pages) never block the writer.
"""

import asyncio
import json
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.channel import Button

TITLE_CHARS = 60
UNTITLED = "New conversation"
STREAM_BACKLOG = 1000
"""Events a page's stream may fall behind by; past it the stream ends and the page, reconnecting
with the last number it saw, reads the rest from the board."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, person TEXT NOT NULL, title TEXT NOT NULL, created TEXT NOT NULL,
    updated TEXT NOT NULL, seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bubbles (
    id TEXT PRIMARY KEY, conversation TEXT NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL, text TEXT NOT NULL, buttons TEXT NOT NULL, streaming INTEGER NOT NULL,
    deleted INTEGER NOT NULL, at TEXT NOT NULL, seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS images (
    id TEXT PRIMARY KEY, bubble TEXT NOT NULL REFERENCES bubbles(id), type TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS images_by_bubble ON images (bubble);
CREATE INDEX IF NOT EXISTS bubbles_by_seq ON bubbles (seq);
CREATE INDEX IF NOT EXISTS bubbles_by_conversation ON bubbles (conversation, at);
CREATE INDEX IF NOT EXISTS conversations_by_person ON conversations (person, updated);
"""


@dataclass(frozen=True)
class Bubble:
    """One message on a page: `role` is `person`, `kaiwa` (a reply's message) or `notice`."""

    id: str
    conversation: str
    role: str
    text: str
    buttons: tuple[Button, ...] = ()
    streaming: bool = False
    deleted: bool = False
    at: str = ""
    seq: int = 0
    images: tuple[str, ...] = ()
    """The ids of the pictures a person's message came with (`Board.image`)."""


@dataclass(frozen=True)
class Entry:
    """A conversation in a person's list."""

    id: str
    person: str
    title: str
    updated: str
    seq: int
    writing: bool = False


@dataclass(frozen=True)
class Picture:
    """A picture a person sent: its media type (`image/png`, ...) and its bytes."""

    type: str
    data: bytes


Event = tuple[str, int, dict[str, Any]]
"""What a page's stream carries: its kind (`bubble`, `conversation`), its number, its data."""


class UnknownBubble(KeyError):
    """An edit of a bubble the board does not have."""


class Board:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._seq = max(
            self._db.execute("SELECT coalesce(max(seq), 0) FROM bubbles").fetchone()[0],
            self._db.execute("SELECT coalesce(max(seq), 0) FROM conversations").fetchone()[0],
        )
        self._streams: dict[str, set[asyncio.Queue[Event | None]]] = {}

    def end_streams(self) -> None:
        """Tell every page's stream to end (Kaiwa is stopping: a page reconnects by itself
        once it is back, from the last number it saw)."""
        for streams in self._streams.values():
            for stream in streams:
                _end(stream)

    def close(self) -> None:
        self.end_streams()
        self._db.close()

    # -- conversations ---------------------------------------------------------------------------

    def new_conversation(self, person: str) -> Entry:
        now = _now()
        entry = Entry(secrets.token_hex(6), person, UNTITLED, now, self._next())
        self._db.execute(
            "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)",
            (entry.id, person, entry.title, now, now, entry.seq),
        )
        self._publish(person, _entry_event(entry))
        return entry

    def entry(self, conversation: str) -> Entry | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation,))
        found = row.fetchone()
        return self._entry(found) if found else None

    def conversations(self, person: str) -> list[Entry]:
        """The person's conversations, the most recently changed first."""
        rows = self._db.execute(
            "SELECT * FROM conversations WHERE person = ? ORDER BY updated DESC, seq DESC",
            (person,),
        )
        return [self._entry(row) for row in rows]

    # -- bubbles ---------------------------------------------------------------------------------

    def post(
        self,
        conversation: str,
        role: str,
        text: str,
        buttons: tuple[Button, ...] = (),
        *,
        streaming: bool = False,
        bubble_id: str | None = None,
        images: Sequence[Picture] = (),
    ) -> Bubble:
        """A new bubble at the end of `conversation` (which must exist), with its own id
        unless `bubble_id` gives one (a person's message: the page's id for it), and the
        pictures it came with."""
        entry = self.entry(conversation)
        if entry is None:
            raise UnknownBubble(conversation)
        made = bubble_id or secrets.token_hex(8)
        image_ids = tuple(secrets.token_hex(8) for _ in images)
        bubble = Bubble(
            made, conversation, role, text, buttons, streaming, False, _now(), images=image_ids
        )

        def write(seq: int) -> Bubble:
            written = replace(bubble, seq=seq)
            self._db.execute(
                "INSERT INTO bubbles VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", _bubble_row(written)
            )
            self._db.executemany(
                "INSERT INTO images VALUES (?, ?, ?, ?)",
                [
                    (image, made, each.type, each.data)
                    for image, each in zip(image_ids, images, strict=True)
                ],
            )
            if role == "person" and entry.title == UNTITLED:
                title = " ".join(text.split())[:TITLE_CHARS] or UNTITLED
                self._db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation)
                )
            return written

        return self._change(entry.person, conversation, write)

    def edit(
        self,
        bubble_id: str,
        text: str,
        buttons: tuple[Button, ...] = (),
        *,
        streaming: bool = False,
        deleted: bool = False,
    ) -> Bubble:
        old = self.bubble(bubble_id)
        if old is None:
            raise UnknownBubble(bubble_id)
        entry = self.entry(old.conversation)
        assert entry is not None

        def write(seq: int) -> Bubble:
            self._db.execute(
                "UPDATE bubbles SET text = ?, buttons = ?, streaming = ?, deleted = ?, seq = ? "
                "WHERE id = ?",
                (text, _buttons_json(buttons), streaming, deleted, seq, bubble_id),
            )
            return replace(
                old, text=text, buttons=buttons, streaming=streaming, deleted=deleted, seq=seq
            )

        return self._change(entry.person, old.conversation, write)

    def bubble(self, bubble_id: str) -> Bubble | None:
        found = self._db.execute("SELECT * FROM bubbles WHERE id = ?", (bubble_id,)).fetchone()
        return self._bubble(found) if found else None

    def image(self, image_id: str) -> tuple[str, Picture] | None:
        """A picture and the conversation its message is in; None if there is no such one."""
        found = self._db.execute(
            "SELECT conversation, type, data FROM images JOIN bubbles ON bubbles.id = bubble "
            "WHERE images.id = ?",
            (image_id,),
        ).fetchone()
        return (found[0], Picture(found[1], bytes(found[2]))) if found else None

    def bubbles(self, conversation: str) -> list[Bubble]:
        rows = self._db.execute(
            "SELECT * FROM bubbles WHERE conversation = ? AND NOT deleted ORDER BY at, seq",
            (conversation,),
        )
        return [self._bubble(row) for row in rows]

    # -- streams ---------------------------------------------------------------------------------

    def since(self, person: str, seq: int) -> list[Event]:
        """Every change of `person`'s conversations after `seq`: each bubble's and each list
        entry's latest state, in the order they last changed."""
        entries = self._db.execute(
            "SELECT * FROM conversations WHERE person = ? AND seq > ?", (person, seq)
        )
        bubbles = self._db.execute(
            "SELECT bubbles.* FROM bubbles JOIN conversations ON conversations.id = conversation "
            "WHERE person = ? AND bubbles.seq > ?",
            (person, seq),
        )
        events = [_entry_event(self._entry(row)) for row in entries]
        events += [_bubble_event(self._bubble(row)) for row in bubbles]
        return sorted(events, key=lambda event: event[1])

    @contextmanager
    def subscribe(self, person: str) -> Iterator["asyncio.Queue[Event | None]"]:
        """A queue of `person`'s changes from now on; None in it means the stream fell too far
        behind and must end (the page catches up from `since`)."""
        stream: asyncio.Queue[Event | None] = asyncio.Queue(STREAM_BACKLOG)
        self._streams.setdefault(person, set()).add(stream)
        try:
            yield stream
        finally:
            self._streams[person].discard(stream)

    @property
    def latest(self) -> int:
        return self._seq

    # -- inside ----------------------------------------------------------------------------------

    def _change(self, person: str, conversation: str, write: Callable[[int], Bubble]) -> Bubble:
        """One change of a bubble in `conversation` (`write`, given the change's number, returns
        the bubble as written), in one transaction with its list entry's (updated, writing);
        both published once stored."""
        seq = self._next()
        self._db.execute("BEGIN")
        try:
            bubble = write(seq)
            entry_seq = self._next()
            self._db.execute(
                "UPDATE conversations SET updated = ?, seq = ? WHERE id = ?",
                (_now(), entry_seq, conversation),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._publish(person, _bubble_event(bubble))
        entry = self.entry(conversation)
        assert entry is not None
        self._publish(person, _entry_event(entry))
        return bubble

    def _bubble(self, row: sqlite3.Row) -> Bubble:
        images = self._db.execute(
            "SELECT id FROM images WHERE bubble = ? ORDER BY rowid", (row["id"],)
        )
        return replace(_bubble(row), images=tuple(image for (image,) in images))

    def _entry(self, row: sqlite3.Row) -> Entry:
        writing = self._db.execute(
            "SELECT 1 FROM bubbles WHERE conversation = ? AND streaming AND NOT deleted LIMIT 1",
            (row["id"],),
        ).fetchone()
        return Entry(
            row["id"], row["person"], row["title"], row["updated"], row["seq"], bool(writing)
        )

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _publish(self, person: str, event: Event) -> None:
        for stream in list(self._streams.get(person, ())):
            if stream.full():
                self._streams[person].discard(stream)
                _end(stream)
            else:
                stream.put_nowait(event)


def _end(stream: "asyncio.Queue[Event | None]") -> None:
    """Tell a stream to end, even a full one."""
    while stream.full():
        stream.get_nowait()
    stream.put_nowait(None)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _buttons_json(buttons: tuple[Button, ...]) -> str:
    return json.dumps([asdict(button) for button in buttons])


def _bubble_row(bubble: Bubble) -> tuple[Any, ...]:
    return (
        bubble.id,
        bubble.conversation,
        bubble.role,
        bubble.text,
        _buttons_json(bubble.buttons),
        bubble.streaming,
        bubble.deleted,
        bubble.at,
        bubble.seq,
    )


def _bubble(row: sqlite3.Row) -> Bubble:
    buttons = tuple(Button(**each) for each in json.loads(row["buttons"]))
    return Bubble(
        row["id"],
        row["conversation"],
        row["role"],
        row["text"],
        buttons,
        bool(row["streaming"]),
        bool(row["deleted"]),
        row["at"],
        row["seq"],
    )


def _bubble_event(bubble: Bubble) -> Event:
    data = asdict(bubble)
    data["buttons"] = [asdict(button) for button in bubble.buttons]
    return ("bubble", bubble.seq, data)


def _entry_event(entry: Entry) -> Event:
    data = {key: value for key, value in asdict(entry).items() if key != "person"}
    return ("conversation", entry.seq, data)
