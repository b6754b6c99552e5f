"""Notes: what the agent was asked to remember, each kept for its owner (a person or a place, as
`[memory].scope` says; `core.features.memory`).

Writes are durable (a note the model was told is kept must not be lost to an outage), and
forgetting one matches its owner as well as its id, so no note of someone else's can go. Both
stay true when replayed after a lost COMMIT answer: a note is inserted once (`_inserting`), and a
forgetting replayed finds the note gone and still says it went (`_counting`).
"""

from collections.abc import Awaitable
from functools import cache
from typing import Any

from sqlalchemy import Executable, bindparam, delete, select

from core.store.base import StoreBase
from core.store.tables import Note
from core.store.units import _counting, _inserting, _reading


class NoteStore(StoreBase):
    def add_note(self, values: dict[str, Any]) -> Awaitable[Note]:
        return self._call(_inserting(Note, values), durable=True)

    def notes(self, owner: str) -> Awaitable[list[Note]]:
        """An owner's notes, oldest first."""
        return self._call(_reading(Note, _notes_statement(), owner=owner), autocommit=True)

    def forget_note(self, owner: str, note_id: int) -> Awaitable[bool]:
        """Delete one of `owner`'s notes; False when it has none with that id."""
        table = Note.__table__  # type: ignore[attr-defined]
        statement = delete(table).where(table.c.id == note_id, table.c.owner == owner)
        deleting = _counting(statement)
        return self._call(lambda connection: deleting(connection) == 1, durable=True)


@cache
def _notes_statement() -> Executable:
    table = Note.__table__  # type: ignore[attr-defined]
    return select(table).where(table.c.owner == bindparam("owner")).order_by(table.c.id)
