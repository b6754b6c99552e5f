"""How the web chat shows a reply: `WebTransport`, one browser conversation as
`channels.rendering.StreamingReply` sees it.

A post is a new bubble on the board (`channels.web.board`), an edit replaces its text and
buttons, a delete hides it; every change reaches the conversation's open pages as one event. A
bubble carrying the Stop button is one whose reply is still being written (`streaming`), which
the page and the conversation list mark. The board is this process's own, so a post never goes
missing (no `LostMessage`) and the Stop button goes with the post itself.
"""

from collections.abc import Sequence

from channels.budget import UNLIMITED
from channels.calls import PlatformError
from channels.presses import STOP
from channels.web.board import Board, UnknownBubble
from core.channel import Button

MESSAGE_LIMIT = 100_000
"""Characters in one bubble: a browser has no limit of its own, but a page stays quick."""


class WebTransport:
    limit = MESSAGE_LIMIT
    measure = staticmethod(len)
    controls = True
    buttons_after_post = False
    pace = UNLIMITED  # the board is Kaiwa's own: nothing to keep under

    def __init__(self, board: Board, conversation: str, role: str = "kaiwa") -> None:
        self._board = board
        self._conversation = conversation
        self._role = role

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        try:
            bubble = self._board.post(
                self._conversation, self._role, text, tuple(buttons), streaming=STOP in buttons
            )
        except UnknownBubble as exc:
            raise PlatformError(f"the web conversation {self._conversation} is gone") from exc
        return bubble.id

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        try:
            self._board.edit(message_id, text, tuple(buttons), streaming=STOP in buttons)
        except UnknownBubble as exc:
            raise PlatformError(f"no web chat message {message_id} to edit") from exc

    async def delete(self, message_id: str) -> None:
        try:
            self._board.edit(message_id, "", deleted=True)
        except UnknownBubble as exc:
            raise PlatformError(f"no web chat message {message_id} to delete") from exc

    async def typing(self) -> None:
        """Nothing: a page marks a conversation whose reply is being written by its bubble."""
