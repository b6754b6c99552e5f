"""Notes the agent keeps across conversations: `remember`, `recall`, `forget`, and `/memory`.

A note belongs to an owner, decided by `[memory].scope`: the person who asked (the default: what
Ann told the bot in one thread, it knows in her next one on that platform) or the conversation
(notes stay in the thread they were made in). The owner comes from the turn's `ToolContext`,
never from the model's arguments, so a model cannot read or delete someone else's notes. A turn
with no person in it (a scheduled firing) uses its conversation's notes.

Notes are rows in the store, so they survive restarts; they are plain text the model reads back
when it calls `recall`, never added to every request on their own (a person's hundred notes
would crowd a small model's window).
"""

from dataclasses import dataclass
from typing import Annotated

from core.agent.tools import Tool, ToolContext, calling, tool
from core.channel import Channel, ChannelMessage
from core.errors import KaiwaError
from core.store import Store
from core.store.tables import Note, utc_now
from core.text import Command

MEMORY_TOOLS = ("remember", "recall", "forget")
MEMORY_OFF = "Notes are off ([memory].enabled = false in config.toml)."
"""The names of `memory_tools`, known before a store exists (to check config against)."""
RECALLED = 20
"""Notes `recall` returns at most, newest first."""


class NoteError(KaiwaError):
    """A note that cannot be kept, found or forgotten, in words for the model."""


@dataclass(frozen=True)
class MemorySettings:
    enabled: bool = True
    scope: str = "person"
    """Whose notes: "person" (each person's own, across their conversations on a platform) or
    "conversation" (each conversation's own)."""
    max_notes: int = 200
    """Notes one owner may keep."""
    max_chars: int = 2000
    """Characters in one note."""


SCOPES = ("person", "conversation")


def owner_of(scope: str, platform: str, place: str, person: str | None) -> str:
    """Whose notes a turn in `place` by `person` reads and writes."""
    if scope == "person" and person:
        return f"{platform}:person:{person}"
    return place


class Memory:
    def __init__(self, store: Store, settings: MemorySettings) -> None:
        self._store = store
        self.settings = settings

    def owner(self, platform: str, place: str, person: str | None) -> str:
        return owner_of(self.settings.scope, platform, place, person)

    async def remember(self, owner: str, text: str, place: str, by: str) -> Note:
        text = text.strip()
        if not text:
            raise NoteError("nothing to remember: give the note's text")
        if len(text) > self.settings.max_chars:
            raise NoteError(
                f"a note holds at most {self.settings.max_chars} characters; shorten it"
            )
        if len(await self._store.notes(owner)) >= self.settings.max_notes:
            raise NoteError(
                f"{self.settings.max_notes} notes are kept already; forget one first "
                "(recall lists them)"
            )
        values = {"owner": owner, "text": text, "place": place, "created_by": by}
        return await self._store.add_note({**values, "created_at": utc_now()})

    async def recall(self, owner: str, query: str = "") -> list[Note]:
        """The newest notes matching any word of `query` (all of them without one)."""
        words = [word.lower() for word in query.split()]
        notes = await self._store.notes(owner)
        found = [n for n in notes if not words or any(w in n.text.lower() for w in words)]
        return found[-RECALLED:][::-1]

    async def forget(self, owner: str, note_id: int) -> bool:
        return await self._store.forget_note(owner, note_id)


def describe_note(note: Note) -> str:
    return f"#{note.id} ({note.created_at:%Y-%m-%d}) {note.text}"


def memory_tools(memory: Memory) -> list[Tool]:
    def owner() -> tuple[ToolContext, str]:
        context = calling()
        if context is None:
            raise NoteError("notes can only be kept from a conversation")
        return context, memory.owner(context.platform, context.place, context.person)

    @tool()
    async def remember(text: Annotated[str, "the fact or preference to keep, in one line"]) -> str:
        """Keep a note for later conversations (a preference, a fact the person told you)."""
        context, whose = owner()
        note = await memory.remember(whose, text, context.place, context.person or "")
        return f"Remembered as note #{note.id}."

    @tool(read_only=True)
    async def recall(query: Annotated[str, "words to look for; empty for the newest"] = "") -> str:
        """Read back kept notes, newest first, matching any of the query's words."""
        _, whose = owner()
        notes = await memory.recall(whose, query)
        if not notes:
            return "No notes match." if query.strip() else "No notes are kept."
        return "\n".join(describe_note(note) for note in notes)

    @tool()
    async def forget(note: Annotated[int, "the note's number, as recall shows it"]) -> str:
        """Delete a kept note."""
        _, whose = owner()
        if not await memory.forget(whose, note):
            raise NoteError(f"there is no note #{note}; recall lists them")
        return f"Forgot note #{note}."

    return [remember, recall, forget]


class MemoryCommand:
    """`/memory` (the notes kept for the person, or the conversation) and `/memory forget ID`."""

    def __init__(self, memory: Memory) -> None:
        self._memory = memory

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, target = command.argument.partition(" ")
        number = target.strip().removeprefix("#")
        owner = self._memory.owner(message.platform, message.place, message.author_id)
        if not verb:
            answer = await self._listing(owner)
        elif verb == "forget" and number.isdigit():
            note = int(number)
            forgotten = await self._memory.forget(owner, note)
            answer = f"Forgot note #{note}." if forgotten else f"No note #{note}; see /memory."
        else:
            answer = "Usage: /memory, or /memory forget ID (the numbers /memory shows)."
        await channel.notify(message.place, answer)

    async def _listing(self, owner: str) -> str:
        notes = await self._memory.recall(owner)
        whose = "for you" if self._memory.settings.scope == "person" else "in this conversation"
        if not notes:
            return f"No notes kept {whose}. Ask me to remember something."
        return f"Notes kept {whose}, newest first:\n" + "\n".join(map(describe_note, notes))
