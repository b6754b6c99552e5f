"""The turn's loop sink: stores every message the moment it exists and keeps the display state.

The agent loop reports synchronously; this class writes through the synchronous store, so by the
time a stop can land, whatever the loop reported is already a row. Streaming text is the one thing
not written on every chunk: `save_partial` writes it, and the frame pump calls that right before
each frame it shows, so the stored text is never behind what a person has seen.

The text a person sees and the stored text are built from the same strings: the answers of the
turn's assistant messages joined by blank lines (`display_text`).
"""

from collections.abc import Callable

from core.channel import Frame
from core.loop import LoopSink
from core.messages import AssistantMessage, ToolCall, ToolResult, Usage, UsageTotals
from core.store import Store

PARAGRAPH = "\n\n"


class TurnRecorder(LoopSink):
    def __init__(self, store: Store, conversation_id: int, turn_id: int) -> None:
        self._store = store
        self._conversation_id = conversation_id
        self.turn_id = turn_id
        self.usage = UsageTotals()
        self._said: list[str] = []
        self._text = ""
        self._thinking = ""
        self._activity: str | None = None
        self._partial_id: int | None = None
        self._saved = ("", "")
        self.on_change: Callable[[], None] = _nothing

    # -- LoopSink ------------------------------------------------------------------------------

    def thinking(self, delta: str) -> None:
        self._thinking += delta
        self._activity = None
        self.on_change()

    def text(self, delta: str) -> None:
        self._text += delta
        self._activity = None
        self.on_change()

    def model_call_finished(self, usage: Usage, message: AssistantMessage | None) -> None:
        self.usage.add(usage)
        if message is None:
            self._store.record_usage(self.turn_id, self.usage)
            return
        self._store.save_assistant_message(
            self._conversation_id, self.turn_id, message, self._partial_id, usage=self.usage
        )
        if message.text:
            self._said.append(message.text)
        self._text, self._thinking, self._partial_id = "", "", None
        self._saved = ("", "")
        self.on_change()

    def tool_started(self, call: ToolCall) -> None:
        self._activity = f"using {call.name}…"
        self.on_change()

    def tool_finished(self, result: ToolResult) -> None:
        self._store.add_tool_result(self._conversation_id, self.turn_id, result)

    # -- display and partial text --------------------------------------------------------------

    def display_text(self) -> str:
        return PARAGRAPH.join([*self._said, self._text] if self._text else self._said)

    def frame(self) -> Frame:
        return Frame(self.display_text(), self._thinking, self._activity)

    def save_partial(self) -> None:
        """Store the message being streamed, if it changed since the last save."""
        if (self._text, self._thinking) == self._saved:
            return
        partial = AssistantMessage(self._text, self._thinking, partial=True)
        self._partial_id = self._store.save_assistant_message(
            self._conversation_id, self.turn_id, partial, self._partial_id
        )
        self._saved = (self._text, self._thinking)


def _nothing() -> None:
    pass
