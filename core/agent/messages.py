"""The records a turn produces, shared by the agent loop, the turn path and the store.

They are plain frozen dataclasses with no behaviour beyond conversion to the model's wire shape,
so every layer can pass them around without importing the layer that made them.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ToolStatus(StrEnum):
    """How a tool call ended; every call gets exactly one result with one of these."""

    OK = "ok"
    ERROR = "error"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"
    """Kaiwa restarted while it ran (the result is stored at start-up)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. `call_id` is ours (`c1`, `c2`, ... within a turn)."""

    call_id: str
    name: str
    arguments: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str
    status: ToolStatus = ToolStatus.OK

    def to_wire(self) -> dict[str, Any]:
        return {"role": "tool", "content": self.content, "tool_name": self.call.name}


@dataclass(frozen=True)
class AssistantMessage:
    """What one model call said. `partial`: cut short (by a stop when `stopped`, else an error)."""

    text: str
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    partial: bool = False
    stopped: bool = False

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            wire["tool_calls"] = [call.to_wire() for call in self.tool_calls]
        return wire


@dataclass(frozen=True)
class PersonMessage:
    """The person's message that opened a turn, as it reads once what it came with is read
    (a voice note's transcript, a document's text): stored again in the turn's first place."""

    text: str

    def to_wire(self) -> dict[str, Any]:
        return {"role": "user", "content": self.text}


@dataclass(frozen=True)
class Instruction:
    """What Kaiwa tells the model in the middle of a turn (a workflow's next step). The model
    reads it as a user message; it is stored with the turn so the next request is the same."""

    text: str

    def to_wire(self) -> dict[str, Any]:
        return {"role": "user", "content": self.text}


@dataclass(frozen=True)
class Usage:
    """The cost of one model call, recorded as soon as the call returns. Tokens are None when
    unknown: a call cut short never hears its counts, and zero would be a claim."""

    prompt_tokens: int | None = 0
    output_tokens: int | None = 0
    seconds: float = 0.0


@dataclass
class UsageTotals:
    """Running totals over many model calls (a turn, a conversation). Token totals count what is
    known; `unknown_calls` says how many calls' tokens are not in them."""

    model_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    unknown_calls: int = 0

    def add(self, usage: Usage) -> None:
        self.model_calls += 1
        if usage.prompt_tokens is None or usage.output_tokens is None:
            self.unknown_calls += 1
        self.prompt_tokens += usage.prompt_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.seconds += usage.seconds
