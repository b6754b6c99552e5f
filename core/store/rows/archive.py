"""Archive searches: finding what was said in past conversations, for the archive tool.

A search reads messages across conversations, so it is neither a turn's nor one conversation's:
it selects a person's messages and the answers (never the instructions Kaiwa adds to a turn),
each with its conversation's place, newest first. Words are matched literally (`_escaped`), and
a search covers one place or every place under a prefix (`_in_space`).
"""

from collections.abc import Awaitable, Sequence
from typing import Any

from sqlalchemy import Connection, select

from core.store.base import StoreBase
from core.store.rows.turns import INSTRUCTION_AUTHOR
from core.store.tables import Conversation, Message


class ArchiveStore(StoreBase):
    def search_messages(
        self, space: str, words: Sequence[str], limit: int
    ) -> Awaitable[list[tuple[Message, str]]]:
        """The newest messages (a person's or an answer, not Kaiwa's instructions) of
        conversations in `space` holding every one of `words`, case-insensitively, each with its
        conversation's place. `space` is a place, or a prefix of places ending in ':'."""
        messages = Message.__table__  # type: ignore[attr-defined]
        conversations = Conversation.__table__  # type: ignore[attr-defined]
        statement = (
            select(messages, conversations.c.place.label("conversation_place"))
            .join(conversations, conversations.c.id == messages.c.conversation_id)
            .where(_in_space(conversations.c.place, space))
            .where(messages.c.role.in_(("user", "assistant")))
            .where(messages.c.author.is_distinct_from(INSTRUCTION_AUTHOR))
            .where(*(messages.c.text.ilike(f"%{_escaped(word)}%", escape="\\") for word in words))
            .order_by(messages.c.id.desc())
            .limit(limit)
        )

        def run(connection: Connection) -> list[tuple[Message, str]]:
            found = []
            for row in connection.execute(statement):
                values = dict(row._mapping)
                place = values.pop("conversation_place")
                found.append((Message.model_construct(**values), place))
            return found

        return self._call(run, autocommit=True)


def _in_space(place: Any, space: str) -> Any:
    """`place` is `space` (a place), or begins with it (a prefix ending in ':')."""
    if space.endswith(":"):
        return place.startswith(space, autoescape=True)
    return place == space


def _escaped(word: str) -> str:
    """`word` for a LIKE pattern, its wildcards taken literally."""
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
