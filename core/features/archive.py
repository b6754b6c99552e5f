"""`search_conversations` and `read_conversation`: "what did we decide last week?"

Read-only access to stored conversations, limited to those the person could see: the calling
conversation's space (`space_of`, given by the channels: a Discord server, a Slack channel, a
DM on its own). The space comes from the turn's `ToolContext`, never from the model, so no
argument reaches another server's or person's conversations. Only what people said and the
answers are shown (no tool results, no thinking), each message clipped.
"""

from collections.abc import Callable
from typing import Annotated

from core.agent.tools import Tool, calling, tool
from core.errors import KaiwaError
from core.store import INSTRUCTION_AUTHOR, Store
from core.store.tables import Message

FOUND = 10
"""Messages a search returns at most, newest first."""
CLIPPED = 300
"""Characters of one message shown."""


class ArchiveError(KaiwaError):
    """A conversation that cannot be read from here, in words for the model."""


def archive_tools(store: Callable[[], Store], space_of: Callable[[str], str]) -> list[Tool]:
    """The two tools; `store()` gives the open store, `space_of(place)` what a place sees."""

    def space() -> str:
        context = calling()
        if context is None:
            raise ArchiveError("conversations can only be read from a conversation")
        return space_of(context.place)

    @tool(read_only=True)
    async def search_conversations(
        query: Annotated[str, "words that must all appear in a message"],
    ) -> str:
        """Search earlier conversations here (this server, channel or chat) for messages
        containing all the words; newest first, with each conversation's number."""
        words = query.split()
        if not words:
            raise ArchiveError("give words to search for")
        found = await store().search_messages(space(), words, FOUND)
        if not found:
            return f"No message here contains {' '.join(words)!r}."
        return "\n".join(
            f"conversation {m.conversation_id} · {m.created_at:%Y-%m-%d %H:%M} · {m.role}: "
            f"{_clip(m.text)}"
            for m, _ in found
        )

    @tool(read_only=True)
    async def read_conversation(
        conversation: Annotated[int, "its number, as search_conversations shows it"],
        last: Annotated[int, "how many of its latest messages"] = 20,
    ) -> str:
        """Read the latest messages of an earlier conversation here."""
        allowed = space()
        stored = await store().conversation(conversation)
        if stored is None or not _within(stored.place, allowed):
            raise ArchiveError(f"there is no conversation {conversation} here")
        messages = await store().history(conversation)
        said = [m for m in messages if m.role in ("user", "assistant") and m.text]
        shown = said[-max(1, min(last, 100)) :]
        lines = [f"{m.created_at:%Y-%m-%d %H:%M} {_speaker(m)}: {_clip(m.text)}" for m in shown]
        return f"Conversation {conversation} ({len(said)} messages):\n" + "\n".join(lines)

    return [search_conversations, read_conversation]


def _speaker(message: Message) -> str:
    """`user`, `assistant`, or `kaiwa` for what Kaiwa told the model (a workflow's steps)."""
    return "kaiwa" if message.author == INSTRUCTION_AUTHOR else message.role


def _within(place: str, space: str) -> bool:
    return place.startswith(space) if space.endswith(":") else place == space


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= CLIPPED else flat[: CLIPPED - 1] + "…"
