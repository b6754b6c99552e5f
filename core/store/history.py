"""The model-facing history, built from stored messages: always a request the model can take.

A process can die at any instruction, so the store may hold an assistant message whose tool calls
have no results (killed while a tool ran), or a reply cut off mid-sentence. Sent as is, the first
is a malformed request (every tool call needs its result) and the second reads as a complete
answer. So whenever history is built, each tool call without a stored result gets one that says
it was interrupted, in the order the model asked for the calls, and an assistant message cut
short ends with a short marker saying why it ended: the person stopped it, Kaiwa was shut down
(a SIGTERM stops every reply, and nobody should read that as the person's wish), an error, a kill
(Kaiwa restarted), the output limit. What is stored is not changed here; start-up recovery
(`core.dispatch.recovery`) stores the same repairs for turns it resolves.

The texts are a contract with the model: they say what happened and what not to do next.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from core.store.tables import Message

SHUTDOWN = "shutdown"
"""The stop reason of a turn stopped because Kaiwa was shut down, and its ending's name."""
CUT_OFF = {
    "stopped": "[This reply was cut off here: the person stopped it.]",
    SHUTDOWN: (
        "[This reply was cut off here: Kaiwa shut down while writing it (the whole program was "
        "stopped or restarted; nobody asked to stop this reply).]"
    ),
    "failed": "[This reply was cut off here by an error.]",
    "interrupted": "[This reply was cut off here: Kaiwa restarted.]",
    "cut": "[This reply was cut off here: it reached the output length limit.]",
}
INTERRUPTED_TOOL = (
    "Kaiwa restarted while '{name}' was running, so its result is unknown. Do not assume it "
    "succeeded or failed; run it again only if the person asks."
)


MessageKey = tuple[int | None, int]
"""Where a model-facing message is stored: its turn and its place in the turn (`seq`)."""


def history_wire(
    rows: Sequence[Message], endings: Mapping[int, str] | None = None
) -> list[dict[str, Any]]:
    """`rows` (a conversation's messages, in order) in the shape Ollama's chat endpoint takes.
    `endings` maps a turn to how it ended (`ending_of`: `done`, `stopped`, `shutdown`, `failed`,
    `interrupted`, `cut`, or `running` while it runs); a partial message of a turn not known to
    have stopped, failed or been cut counts as interrupted."""
    return [wire for wire, _ in history_entries(rows, endings)]


def history_entries(
    rows: Sequence[Message], endings: Mapping[int, str] | None = None
) -> list[tuple[dict[str, Any], MessageKey]]:
    """`history_wire`, each message with where it is stored (a result added for a call left
    without one is keyed as its call's message)."""
    endings = endings or {}
    entries: list[tuple[dict[str, Any], MessageKey]] = []
    asked: list[dict[str, Any]] = []  # the tool calls of the last assistant message
    asked_by: MessageKey = (None, 0)
    answered: dict[str, tuple[dict[str, Any], MessageKey]] = {}  # their results, by call id
    for row in rows:
        key = (row.turn_id, row.seq or 0)
        if row.role == "tool" and row.tool_call_id in {call["id"] for call in asked}:
            answered[row.tool_call_id] = (message_wire(row), key)
            continue
        entries += _results(asked, answered, asked_by)
        asked, answered = [], {}
        entries.append((message_wire(row, endings.get(row.turn_id or 0)), key))
        if row.role == "assistant" and row.tool_calls:
            asked, asked_by = row.tool_calls, key
    return entries + _results(asked, answered, asked_by)


def _results(
    asked: list[dict[str, Any]],
    answered: dict[str, tuple[dict[str, Any], MessageKey]],
    asked_by: MessageKey,
) -> list[tuple[dict[str, Any], MessageKey]]:
    """One result for each call, in the order the model asked for them."""
    return [
        answered.get(call["id"]) or (interrupted_result(call["name"]), asked_by) for call in asked
    ]


def message_wire(row: Message, ending: str | None = None) -> dict[str, Any]:
    """One stored message in the wire shape; a partial one carries its cut-off marker."""
    content = row.text
    if row.role == "assistant" and row.partial:
        if row.stopped:
            how = SHUTDOWN if ending == SHUTDOWN else "stopped"
        else:
            how = ending if ending in CUT_OFF else "interrupted"
        content = f"{content}\n\n{CUT_OFF[how]}" if content else CUT_OFF[how]
    wire: dict[str, Any] = {"role": row.role, "content": content}
    if row.tool_calls:
        wire["tool_calls"] = [
            {"function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in row.tool_calls
        ]
    if row.role == "tool" and row.tool_name:
        wire["tool_name"] = row.tool_name
    return wire


def ending_of(status: str, stop_reason: str | None) -> str:
    """How a turn ended, as its replies' markers tell it: its status, but `shutdown` for a turn
    stopped by a shutdown rather than by a person."""
    return SHUTDOWN if status == "stopped" and stop_reason == SHUTDOWN else status


def interrupted_result(name: str) -> dict[str, Any]:
    return {"role": "tool", "content": INTERRUPTED_TOOL.format(name=name), "tool_name": name}


def unanswered_calls(rows: Sequence[Message]) -> list[dict[str, Any]]:
    """The tool calls in `rows` (one turn's messages) that have no result among them, in the
    order they were asked for."""
    answered = {row.tool_call_id for row in rows if row.role == "tool"}
    return [
        call
        for row in rows
        if row.role == "assistant" and row.tool_calls
        for call in row.tool_calls
        if call["id"] not in answered
    ]
