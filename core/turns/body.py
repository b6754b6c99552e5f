"""Turn bodies: what runs inside a turn, between the runner opening it and ending it.

The runner holds the invariants around every turn (ARCHITECTURE.md, "Turn bodies"): the gate,
the pin, the stop, the recording and the notices. A body only works: chat (`ChatBody`, the agent
loop on the conversation) or a workflow a command starts (`/plan <task>`, registered with the
runner under its command). A body sees its turn as a `BodyTurn`: the conversation, the agent and
the tools it may use this turn, and the means to run agent loops recorded as the turn. A stop
arrives in the body as a cancellation and a failure is raised; a body that keeps state of its
own stores it (awaited, through the cancellation) before letting either go on.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.context import Compactor
from core.agent.loop import AgentLoop, ChatModel, LoopResult, LoopSettings
from core.agent.messages import Instruction
from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.channel import Channel, Outcome
from core.text import plural
from core.turns.parts import OpenTurn
from core.turns.recording import AsideSink, TurnRecorder
from core.turns.turn import TurnRequest, TurnSettings


@dataclass(frozen=True)
class BodyEnding:
    """How a body's work ended when it ended by itself (a stop or a failure is raised instead,
    and the runner ends the turn the same way for every body)."""

    outcome: Outcome = Outcome.DONE
    note: str | None = None
    """Said with the reply's ending ("answered at the limit of 10 model calls")."""
    wrapped_up: bool = False


def ending_of(result: LoopResult) -> BodyEnding:
    """The ending an agent loop's result gives its turn."""
    outcome = Outcome.CUT if result.cut else Outcome.DONE
    if result.wrapped_up:
        calls = result.model_calls
        note = f"answered at the limit of {calls} model {plural(calls, 'call')}"
        return BodyEnding(outcome, note, wrapped_up=True)
    return BodyEnding(outcome)


@dataclass
class BodyTurn:
    """A running turn as its body sees it: the conversation (the person's message last), the
    agent with the tools it may use this turn, and the means to run the agent loop on them,
    recorded as the turn. The runner has opened the turn and will end it; a body only works."""

    request: TurnRequest
    agent: AgentProfile
    messages: list[dict[str, Any]]
    tools: Mapping[str, Tool]
    """Everything the agent may use this turn (guarded where `[approvals].ask` says)."""
    channel: Channel
    _opened: OpenTurn
    _recorder: TurnRecorder
    _model: ChatModel
    _compactor: Compactor
    _settings: TurnSettings
    _opening: dict[str, Any]
    """The person's message in `messages` (the last one when the turn opens)."""

    async def ids(self) -> tuple[int, int]:
        """The turn's conversation and row, once stored (a body's own records point at them)."""
        return await self._opened.ids()

    async def turn_id(self) -> int:
        return (await self._opened.ids())[1]

    def loop(
        self, tools: Mapping[str, Tool] | None = None, *, max_iterations: int | None = None
    ) -> AgentLoop:
        """The agent loop on the conversation, recorded as this turn and streamed into its
        reply: with the turn's tools unless given others, and the agent's cap unless given. Every
        loop on the conversation shares the turn's compactor."""
        return AgentLoop(
            self._model,
            self.tools if tools is None else tools,
            self._recorder,
            LoopSettings(
                agent=self.agent.name,
                model=self.agent.model,
                think=self.agent.think,
                max_iterations=max_iterations or self.agent.max_iterations,
                tool_timeout=self._settings.tool_timeout,
                tool_grace=self._settings.tool_grace,
            ),
            self._compactor,
        )

    def aside(
        self, model: str, tools: Mapping[str, Tool], *, max_iterations: int, doing: str
    ) -> AgentLoop:
        """A loop beside the conversation (it reads only the messages it is given): nothing it
        says is stored or shown, its calls count as the turn's, and the reply shows `doing`."""
        return AgentLoop(
            self._model,
            tools,
            AsideSink(self._recorder, doing),
            LoopSettings(
                agent=self.agent.name,
                model=model,
                max_iterations=max_iterations,
                tool_timeout=self._settings.tool_timeout,
                tool_grace=self._settings.tool_grace,
            ),
        )

    def instruct(self, text: str) -> None:
        """Tell the agent something before its next model call (a workflow's next step); it is
        stored with the turn, so the conversation reads the same afterwards."""
        self.messages.append(Instruction(text).to_wire())
        self._recorder.instruct(Instruction(text))

    def shown(self) -> str:
        """The reply's text so far."""
        return self._recorder.display_text()

    def status(self, text: str) -> None:
        """What the reply's status line says the turn is doing now (until its next step)."""
        self._recorder.status(text)

    # -- what a part does as it reads the person's attachments (`core.turns.parts.Reading`) --

    @property
    def said(self) -> str:
        """The person's message as the model reads it now."""
        return str(self._opening.get("content", ""))

    def reword(self, text: str) -> None:
        """The person's message reads `text` from now on, for the model and in the store."""
        self._opening["content"] = text
        self._recorder.reword(text)

    def preface(self, text: str) -> None:
        """Show `text` above the answer in the reply; the model does not read it as its own."""
        self._recorder.preface(text)

    def room(self) -> int:
        """Characters the person's message may take (`Compactor.opening_room`)."""
        schemas = [each.schema() for each in self.tools.values()]
        return self._compactor.opening_room(self.messages[0], schemas)


class TurnBody(Protocol):
    """What runs inside a turn. A stop arrives as a cancellation and a failure is raised; a body
    that keeps state of its own stores it (awaited, through the cancellation) before letting
    either go on."""

    async def run(self, turn: BodyTurn) -> BodyEnding: ...


class ChatBody:
    """The agent loop on the conversation: what an ordinary message runs."""

    async def run(self, turn: BodyTurn) -> BodyEnding:
        return ending_of(await turn.loop().run(turn.messages))


CHAT = ChatBody()
