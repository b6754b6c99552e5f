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

A stream follows one conversation, the one its page has open, and the person's list
(`channels.web.streams`): it carries that conversation's bubbles and activity, and every
conversation's list entry, which changes only when the list would show it differently (a new
bubble moves it to the top, a reply starts or stops being written, its title), so an edit of a
reply is one event for the pages that show it, not one for every tab.

What a reply is doing (its status line, the model's thinking) is the conversation's
`activity`, kept beside its bubbles rather than in a bubble's text: it changes without the text
changing, and it exists before the reply's first word. It is only ever true of a running reply,
so a board opened by a new process clears what a dead one left. A bubble may carry `cards`
(`core.channel.Card`: a status message's sub-agents), shown by the page as live cards. A
person's bubble keeps the pictures and files its message came with (`channels.web.uploads`).

Writes are a row each on the event loop: SQLite in WAL mode with `synchronous=NORMAL` commits
in some tens of microseconds without waiting for the disk, and a reply changes its bubble a few
times a second at most. Readers (pages) never block the writer.
"""

import json
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from channels.web.streams import Event, Streams
from channels.web.uploads import TABLE as FILES_TABLE
from channels.web.uploads import FileUpload, KeptFile, Picture, Uploads
from core.channel import Button, Card

TITLE_CHARS = 60
UNTITLED = "New conversation"

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
MIGRATIONS = (
    """
    ALTER TABLE bubbles ADD COLUMN cards TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE conversations ADD COLUMN status TEXT NOT NULL DEFAULT '';
    ALTER TABLE conversations ADD COLUMN thinking TEXT NOT NULL DEFAULT '';
    ALTER TABLE conversations ADD COLUMN activity_seq INTEGER NOT NULL DEFAULT 0;
    """,
    FILES_TABLE,
)
"""What a board of each earlier version (`PRAGMA user_version`, the index here) lacks."""


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
    """The ids of the pictures a person's message came with (`Uploads.image`)."""
    cards: tuple[Card, ...] = ()
    files: tuple[KeptFile, ...] = ()
    """The files a person's message came with (`Uploads.file`)."""


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
class Activity:
    """What the reply being written in a conversation is doing: its status line and the
    model's thinking so far (both empty when no reply is being written)."""

    conversation: str
    status: str = ""
    thinking: str = ""
    seq: int = 0


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
        self._migrate()
        self.uploads = Uploads(self._db)
        """The pictures and files of people's bubbles."""
        self._seq = max(
            self._db.execute("SELECT coalesce(max(seq), 0) FROM bubbles").fetchone()[0],
            self._db.execute(
                "SELECT coalesce(max(max(seq, activity_seq)), 0) FROM conversations"
            ).fetchone()[0],
        )
        self.streams = Streams()
        """The open pages' streams, told each change once it is stored."""
        self._clear_activity()

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
            self._db.executescript(f"BEGIN; {migration} PRAGMA user_version = {number}; COMMIT;")

    def _clear_activity(self) -> None:
        """No reply is being written when a board opens: what a dead process left is cleared,
        by a change a page that reconnects is told."""
        left = self._db.execute(
            "SELECT id FROM conversations WHERE status != '' OR thinking != ''"
        ).fetchall()
        for (conversation,) in left:
            self.set_activity(conversation, "", "")

    def close(self) -> None:
        self.streams.end()
        self._db.close()

    # -- conversations ---------------------------------------------------------------------------

    def new_conversation(self, person: str) -> Entry:
        now = _now()
        entry = Entry(secrets.token_hex(6), person, UNTITLED, now, self._next())
        self._db.execute(
            "INSERT INTO conversations (id, person, title, created, updated, seq) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (entry.id, person, entry.title, now, now, entry.seq),
        )
        self.streams.publish(person, _entry_event(entry))
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
        images: tuple[Picture, ...] = (),
        files: tuple[FileUpload, ...] = (),
    ) -> Bubble:
        """A new bubble at the end of `conversation` (which must exist), with its own id
        unless `bubble_id` gives one (a person's message: the page's id for it), and the
        pictures and files it came with (a message of files alone is titled by their names)."""
        entry = self.entry(conversation)
        if entry is None:
            raise UnknownBubble(conversation)
        made = bubble_id or secrets.token_hex(8)
        bubble = Bubble(made, conversation, role, text, buttons, streaming, False, _now())

        def write(seq: int) -> Bubble:
            self._db.execute(
                "INSERT INTO bubbles VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _bubble_row(replace(bubble, seq=seq)),
            )
            kept_images, kept_files = self.uploads.keep(bubble.id, images, files)
            if role == "person" and entry.title == UNTITLED:
                words = text or " ".join(each.name for each in files)
                title = " ".join(words.split())[:TITLE_CHARS] or UNTITLED
                self._db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation)
                )
            return replace(bubble, seq=seq, images=kept_images, files=kept_files)

        return self._change(entry.person, conversation, write, moved=True)

    def edit(
        self,
        bubble_id: str,
        text: str,
        buttons: tuple[Button, ...] = (),
        *,
        streaming: bool = False,
        deleted: bool = False,
    ) -> Bubble:
        old = self._known(bubble_id)
        new = replace(old, text=text, buttons=buttons, streaming=streaming, deleted=deleted)
        return self._rewrite(old, new)

    def set_cards(self, bubble_id: str, cards: tuple[Card, ...]) -> Bubble:
        """The cards `bubble_id` shows (a status message's sub-agents), unless they are so."""
        old = self._known(bubble_id)
        return old if old.cards == cards else self._rewrite(old, replace(old, cards=cards))

    def activity(self, conversation: str) -> Activity:
        found = self._db.execute(
            "SELECT status, thinking, activity_seq FROM conversations WHERE id = ?",
            (conversation,),
        ).fetchone()
        return Activity(conversation, *found) if found else Activity(conversation)

    def set_activity(self, conversation: str, status: str, thinking: str) -> None:
        """What the reply being written in `conversation` is doing ("", "" once it is done);
        nothing changes if it is so already."""
        old = self.activity(conversation)
        if (old.status, old.thinking) == (status, thinking):
            return
        entry = self.entry(conversation)
        if entry is None:
            return
        activity = Activity(conversation, status, thinking, self._next())
        self._db.execute(
            "UPDATE conversations SET status = ?, thinking = ?, activity_seq = ? WHERE id = ?",
            (status, thinking, activity.seq, conversation),
        )
        self.streams.publish(entry.person, _activity_event(activity), conversation)
        if bool(old.status) != bool(status):  # its list entry starts or stops showing it
            self._touch(conversation, moved=False)
            self._publish_entry(entry.person, conversation)

    def bubble(self, bubble_id: str) -> Bubble | None:
        found = self._db.execute("SELECT * FROM bubbles WHERE id = ?", (bubble_id,)).fetchone()
        return self._bubble(found) if found else None

    def bubbles(self, conversation: str) -> list[Bubble]:
        rows = self._db.execute(
            "SELECT * FROM bubbles WHERE conversation = ? AND NOT deleted ORDER BY at, seq",
            (conversation,),
        )
        return [self._bubble(row) for row in rows]

    # -- streams ---------------------------------------------------------------------------------

    def since(self, person: str, seq: int, conversation: str | None = None) -> list[Event]:
        """What changed after `seq` for a stream following `conversation` (one of `person`'s)
        and `person`'s list: the latest state of each list entry, and of the conversation's
        bubbles and activity, in the order they last changed."""
        entries = self._db.execute(
            "SELECT * FROM conversations WHERE person = ? AND seq > ?", (person, seq)
        )
        events = [_entry_event(self._entry(row)) for row in entries]
        if conversation is not None:
            bubbles = self._db.execute(
                "SELECT * FROM bubbles WHERE conversation = ? AND seq > ?", (conversation, seq)
            )
            events += [_bubble_event(self._bubble(row)) for row in bubbles]
            activity = self.activity(conversation)
            if activity.seq > seq:
                events.append(_activity_event(activity))
        return sorted(events, key=lambda event: event[1])

    @property
    def latest(self) -> int:
        return self._seq

    # -- inside ----------------------------------------------------------------------------------

    def _known(self, bubble_id: str) -> Bubble:
        bubble = self.bubble(bubble_id)
        if bubble is None:
            raise UnknownBubble(bubble_id)
        return bubble

    def _rewrite(self, old: Bubble, bubble: Bubble) -> Bubble:
        """`bubble`'s new state in place of its `old` one."""
        person = self._person_of(bubble.conversation)
        flags_changed = (old.streaming, old.deleted) != (bubble.streaming, bubble.deleted)

        def write(seq: int) -> Bubble:
            written = replace(bubble, seq=seq)
            self._db.execute(UPDATE_BUBBLE, _changed_row(written))
            return written

        return self._change(
            person, bubble.conversation, write, moved=False, may_start_or_stop=flags_changed
        )

    def _change(
        self,
        person: str,
        conversation: str,
        write: Callable[[int], Bubble],
        *,
        moved: bool,
        may_start_or_stop: bool = False,
    ) -> Bubble:
        """One change of a bubble in `conversation` (`write`, given the change's number, returns
        the bubble as written), in one transaction with its list entry's where the list shows
        it differently (`moved`: a new bubble takes it to the top; a reply starts or stops
        being written, which only a change of a bubble's `streaming` or `deleted` can make,
        `may_start_or_stop`); published once stored. An edit of a reply's text alone reads
        nothing more than it writes."""
        watch = may_start_or_stop and not moved
        writing = self._writing(conversation) if watch else False
        seq = self._next()
        self._db.execute("BEGIN")
        try:
            bubble = write(seq)
            entry_changed = moved or (watch and self._writing(conversation) != writing)
            if entry_changed:
                self._touch(conversation, moved=moved)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self.streams.publish(person, _bubble_event(bubble), conversation)
        if entry_changed:
            self._publish_entry(person, conversation)
        return bubble

    def _touch(self, conversation: str, *, moved: bool) -> None:
        """A new number for the conversation's list entry (and, `moved`, a new time)."""
        if moved:
            self._db.execute(
                "UPDATE conversations SET updated = ?, seq = ? WHERE id = ?",
                (_now(), self._next(), conversation),
            )
        else:
            self._db.execute(
                "UPDATE conversations SET seq = ? WHERE id = ?", (self._next(), conversation)
            )

    def _publish_entry(self, person: str, conversation: str) -> None:
        entry = self.entry(conversation)
        assert entry is not None
        self.streams.publish(person, _entry_event(entry))

    def _person_of(self, conversation: str) -> str:
        entry = self.entry(conversation)
        if entry is None:
            raise UnknownBubble(conversation)
        return entry.person

    def _writing(self, conversation: str) -> bool:
        """Whether a reply is being written there: a bubble still streaming, or an activity."""
        found = self._db.execute(
            "SELECT status != '' OR EXISTS (SELECT 1 FROM bubbles WHERE conversation = ? AND "
            "streaming AND NOT deleted) FROM conversations WHERE id = ?",
            (conversation, conversation),
        ).fetchone()
        return bool(found and found[0])

    def _bubble(self, row: sqlite3.Row) -> Bubble:
        images, files = self.uploads.of(row["id"])
        return replace(_bubble(row), images=images, files=files)

    def _entry(self, row: sqlite3.Row) -> Entry:
        writing = self._writing(row["id"])
        return Entry(row["id"], row["person"], row["title"], row["updated"], row["seq"], writing)

    def _next(self) -> int:
        self._seq += 1
        return self._seq


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _buttons_json(buttons: tuple[Button, ...]) -> str:
    return json.dumps([asdict(button) for button in buttons])


def _cards_json(cards: tuple[Card, ...]) -> str:
    return json.dumps([asdict(card) for card in cards])


def _card(data: dict[str, Any]) -> Card:
    buttons = tuple(Button(**each) for each in data.pop("buttons", ()))
    return Card(**data, buttons=buttons)


UPDATE_BUBBLE = (
    "UPDATE bubbles SET text = ?, buttons = ?, streaming = ?, deleted = ?, seq = ?, cards = ? "
    "WHERE id = ?"
)


def _changed_row(bubble: Bubble) -> tuple[Any, ...]:
    """What `UPDATE_BUBBLE` writes of `bubble`."""
    return (
        bubble.text,
        _buttons_json(bubble.buttons),
        bubble.streaming,
        bubble.deleted,
        bubble.seq,
        _cards_json(bubble.cards),
        bubble.id,
    )


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
        _cards_json(bubble.cards),
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
        cards=tuple(_card(each) for each in json.loads(row["cards"])),
    )


def _bubble_event(bubble: Bubble) -> Event:
    data = asdict(bubble)
    data["buttons"] = [asdict(button) for button in bubble.buttons]
    return ("bubble", bubble.seq, data)


def _activity_event(activity: Activity) -> Event:
    return ("activity", activity.seq, asdict(activity))


def _entry_event(entry: Entry) -> Event:
    data = {key: value for key, value in asdict(entry).items() if key != "person"}
    return ("conversation", entry.seq, data)
