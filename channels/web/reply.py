"""A reply on the web chat: its words as on every platform, and beside them what it is doing.

The words go through `channels.rendering.StreamingReply` over `WebTransport`, as on the
platforms (a post, then edits at the channel's interval, the Stop button while it streams, the
final text marked stopped or failed). What a platform can only fold into the message's text, a
page shows apart, so the text is the answer alone:
- the status line ("thinking…", "using current_time…", the queue position) and the model's
  thinking are the conversation's activity on the board, which the page shows under the
  conversation, the thinking folded away; it is there before the first word, and cleared when
  the reply ends. A conversation may have two replies open at once (a turn's, and the status
  message of sub-agents, which says nothing but its text): a reply touches the activity only
  while it has something to say there, and then clears only what it said;
- the cards a frame carries (a status message's sub-agents) are kept with the reply's last
  bubble, for the page to show as live cards; `finish` leaves their final states.
"""

import contextlib
from collections.abc import Sequence

from channels.rendering import RenderSettings, StreamingReply, status_line
from channels.web.board import Board, UnknownBubble
from channels.web.transport import WebTransport
from core.channel import Card, Delivery, Frame, OnPost, Outcome


class WebReply:
    def __init__(
        self,
        board: Board,
        conversation: str,
        settings: RenderSettings,
        place: str,
        posted: Sequence[str] = (),
        on_post: OnPost | None = None,
    ) -> None:
        self._board = board
        self._conversation = conversation
        self._settings = settings
        self._words = StreamingReply(
            WebTransport(board, conversation), settings, place, posted, on_post
        )
        self._said = ("", "")
        """The status line and thinking this reply last gave the conversation's activity."""
        self._shown_cards: tuple[str, tuple[Card, ...]] | None = None
        """The bubble and the cards last kept on it: a frame that changes neither reads and
        writes nothing (most frames, which carry no cards at all)."""

    @property
    def posted(self) -> tuple[str, ...]:
        return self._words.posted

    @property
    def delivery(self) -> Delivery:
        return self._words.delivery

    async def update(self, frame: Frame) -> None:
        thinking = frame.thinking if self._settings.show_thinking else ""
        self._say_activity(status_line(frame, self._settings), thinking)
        await self._words.update(Frame(frame.text, tools=frame.tools))
        self._show_cards(frame.cards)

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        try:
            await self._words.finish(text, outcome, note, tools=tools)
            self._show_cards(cards)
        finally:
            self._say_activity("", "")

    def _say_activity(self, status: str, thinking: str) -> None:
        if (status, thinking) != self._said:
            self._board.set_activity(self._conversation, status, thinking)
            self._said = (status, thinking)

    def _show_cards(self, cards: tuple[Card, ...]) -> None:
        if not self.posted:
            return
        shown = (self.posted[-1], cards)
        if shown == self._shown_cards or (self._shown_cards is None and not cards):
            return
        with contextlib.suppress(UnknownBubble):  # the conversation is gone: no place for them
            self._board.set_cards(*shown)
        self._shown_cards = shown
