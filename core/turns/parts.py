"""What a turn uses besides its agent's own tools: the interface features plug into.

The turn runner names no feature. Sub-agents, approvals, MCP servers, notes, the scheduled-task
tools and workflows that keep rows of their own are *parts*, added to the runner's `TurnParts`
where Kaiwa is wired (bot/wiring.py). The runner asks every part at the same fixed points, so a
feature is read in its own package and the runner without any of them:

- **Tools.** `Part.tools_for(agent)`: tools a part gives an agent wherever it runs, a
  conversation's turn or a sub-agent's run (an MCP server's). As a turn opens, `Part.joined` may
  return the part's `Share` of that turn: tools for this turn alone (a `delegate` that knows the
  turn) and texts the turn carries above the person's message (a sub-agent's report).
- **Reading.** Before the turn's body runs, each part may read what the person's message came
  with (`Part.read`: a voice note transcribed, a document's text), showing what it does on the
  reply's status line, rewording the message as the model reads and the store keeps it, and
  showing a preface above the answer (what was heard). A failure it raises ends the turn as
  any failure does, with its words; a stop reaches it as a cancellation.
- **Guard.** Every tool offered, in a turn or a run, passes through the one `ToolGuard`
  (approvals), which may make a call wait for a person's yes.
- **Ending.** Once the turn's records are stored, or could not be, each share is told which
  (`Share.ended`), so what a turn carried counts as delivered exactly once.
- **Conversations.** `/stop`, `/new` and shutdown reach every part (`stop`, `forget`,
  `shutdown`), so what a part runs for a conversation ends with it; at shutdown a part may say
  why the turns it holds stop, as after a kill (`Leftover.why`).
- **Restarts.** Before anything of a process runs (or when a worker takes a place over), each
  part reads what a dead process left of it (`left_over`): why turns it held stopped, and what
  to show once the place's channel is connected. `core.dispatch.recovery` runs them.

A part may ask for a turn of its own (`TurnParts.carry`): a report that finished while its
conversation was idle is carried by a turn started for it.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.channel import Channel
from core.store import StartedTurn
from core.turns.turn import Provenance, TurnRequest

logger = logging.getLogger(__name__)


class OpenTurn:
    """A turn as its parts see it while it opens: the request, its agent, and its row's ids
    once the row is stored (it is written while the model call begins)."""

    def __init__(self, request: TurnRequest, agent: AgentProfile) -> None:
        self.request = request
        self.agent = agent
        self.row: asyncio.Future[StartedTurn] = asyncio.get_running_loop().create_future()
        """Resolved with the turn's row once it is stored (or with why it could not be)."""

    def stored_by(self, writing: Awaitable[StartedTurn]) -> "asyncio.Future[StartedTurn]":
        """The store call that writes the row: its outcome is the row's. Returns that call's
        own future, for whoever must act the moment it is done (the recorder's held writes)."""
        starting = asyncio.ensure_future(writing)
        starting.add_done_callback(self._settle)
        return starting

    async def ids(self) -> tuple[int, int]:
        """The turn's conversation and turn ids, once its row is stored."""
        stored = await asyncio.shield(self.row)
        return stored.conversation_id, stored.turn_id

    def _settle(self, writing: "asyncio.Future[StartedTurn]") -> None:
        if self.row.done():
            return
        if writing.cancelled():
            self.row.cancel()
        elif (error := writing.exception()) is not None:
            self.row.set_exception(error)
        else:
            self.row.set_result(writing.result())


def _nothing(stored: bool) -> None:
    """A share that carried nothing has nothing to settle."""


@dataclass(frozen=True)
class Share:
    """A part's share of one turn."""

    tools: Mapping[str, Tool] = field(default_factory=dict)
    carried: Sequence[str] = ()
    """Texts the turn carries above the person's message (each a paragraph)."""
    ended: Callable[[bool], None] = _nothing
    """Told, once, whether the turn's records are stored (False: failed, or not saved)."""


class Reading(Protocol):
    """A turn as a part sees it while reading what the person's message came with, before the
    turn's body runs (`core.turns.body.BodyTurn` is one)."""

    request: TurnRequest
    agent: AgentProfile
    channel: Channel

    @property
    def said(self) -> str:
        """The person's message as the model reads it now."""
        ...

    def status(self, text: str) -> None:
        """What the reply's status line says the turn is doing ("transcribing…")."""
        ...

    def reword(self, text: str) -> None:
        """The person's message reads `text` from now on, for the model and in the store."""
        ...

    def preface(self, text: str) -> None:
        """Show `text` above the answer in the reply (not the model's words)."""
        ...

    def room(self) -> int:
        """Characters the person's message may take without making a request too large."""
        ...


class Places(Protocol):
    """How a part's leftovers reach their places, once the places' channels are connected."""

    async def ready(self, place: str) -> Channel | None:
        """The place's channel once connected; None if its platform is not running."""
        ...

    async def say(self, place: str, text: str) -> None: ...


@dataclass(frozen=True)
class Leftover:
    """What a dead process left of one part."""

    resume: Callable[[Places], Awaitable[None]]
    """Shows it (or carries it on) once the places' channels are connected."""
    why: Mapping[int, str] = field(default_factory=dict)
    """Why turns left running stopped, by turn id, where the part knows better than "a
    restart" (the question a turn was waiting on)."""


class Part:
    """Something turns use. Every method does nothing by default: a part overrides the points it
    takes part in."""

    def tools_for(self, agent: AgentProfile) -> Mapping[str, Tool]:
        """Tools for `agent` wherever it runs: a conversation's turns and sub-agents' runs."""
        return {}

    def joined(self, turn: OpenTurn) -> Share | None:
        """The part's share of a turn that opens; None to take no part in it."""
        return None

    async def read(self, turn: Reading) -> None:
        """Read what the person's message came with, before the turn's body runs; raise a
        `core.errors.KaiwaError` with why, for the person, when it cannot be read."""

    async def stop(self, place: str) -> str:
        """`/stop` in `place`: stop what the part runs there; a sentence for the answer, or ''."""
        return ""

    async def forget(self, place: str) -> None:
        """`/new` in `place`: the conversation there is closed."""

    async def shutdown(self) -> Mapping[int, str]:
        """The process is stopping (before its turns are stopped and the store closes); why
        turns the part holds stop, by turn id, where it knows better than "a shutdown" (the
        question a turn waits on), as `Leftover.why` says it after a kill."""
        return {}

    async def left_over(self, place: str | None) -> Leftover | None:
        """What a dead process left of this part, in `place` or everywhere (None); read before
        anything of this process runs there."""
        return None


class ToolGuard(Protocol):
    """Asks a person before some tools run (`core.features.approvals`)."""

    def guard(self, tools: Mapping[str, Tool], tool_timeout: float) -> dict[str, Tool]:
        """`tools`, those that need a yes wrapped so that each call asks first."""
        ...

    def asks(self, tool: str) -> bool:
        """Whether a call of `tool` needs a person's yes."""
        ...

    async def grant(self, what: str) -> None:
        """Ask once, ahead, for work that will call such tools with nobody to ask (a
        delegation); raises unless a person allows it."""
        ...


class TurnTools(Part):
    """Tools every conversation's turns get besides their agent's own (the notes, the
    scheduled-task tools); sub-agents' runs do not get them."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._share = Share(tools={each.name: each for each in tools})

    def joined(self, turn: OpenTurn) -> Share:
        return self._share


@dataclass(frozen=True)
class Joined:
    """Every part's share of one turn."""

    shares: tuple[Share, ...]

    @property
    def tools(self) -> dict[str, Tool]:
        return {name: each for share in self.shares for name, each in share.tools.items()}

    @property
    def carried(self) -> list[str]:
        return [text for share in self.shares for text in share.carried]

    def ended(self, stored: bool) -> None:
        for share in self.shares:
            share.ended(stored)


class TurnParts:
    """The parts a runner's turns use, asked in the order they were added; and what a part may
    ask of the runner (`carry`)."""

    def __init__(self, carry: Callable[[TurnRequest], None]) -> None:
        self._parts: list[Part] = []
        self._carry = carry
        self.guard: ToolGuard | None = None
        """The one guard every tool passes through (approvals), if any."""

    def add(self, part: Part) -> None:
        self._parts.append(part)

    def tools_for(self, agent: AgentProfile) -> dict[str, Tool]:
        """`agent`'s own tools and those parts give it wherever it runs."""
        given = (part.tools_for(agent) for part in self._parts)
        return {**agent.tools, **{name: each for tools in given for name, each in tools.items()}}

    def guarded(self, tools: Mapping[str, Tool], tool_timeout: float) -> dict[str, Tool]:
        return dict(tools) if self.guard is None else self.guard.guard(tools, tool_timeout)

    def join(self, turn: OpenTurn) -> Joined:
        shares = (part.joined(turn) for part in self._parts)
        return Joined(tuple(share for share in shares if share is not None))

    def offered(self, agent: AgentProfile, joined: Joined) -> dict[str, Tool]:
        """Every tool a turn of `agent` is offered: its own, what parts give it wherever it
        runs, and the turn's shares (before the guard wraps them)."""
        return {**self.tools_for(agent), **joined.tools}

    async def read(self, turn: Reading) -> None:
        for part in self._parts:
            await part.read(turn)

    async def stop(self, place: str) -> list[str]:
        said = [await part.stop(place) for part in self._parts]
        return [sentence for sentence in said if sentence]

    async def forget(self, place: str) -> None:
        for part in self._parts:
            await part.forget(place)

    async def shutdown(self) -> dict[int, str]:
        why: dict[int, str] = {}
        for part in self._parts:
            why.update(await part.shutdown())
        return why

    async def left_over(self, place: str | None) -> list[Leftover]:
        found = [await part.left_over(place) for part in self._parts]
        return [leftover for leftover in found if leftover is not None]

    def carry(self, platform: str, place: str, provenance: Provenance, author: str) -> None:
        """A part holds something for the conversation in `place`: a turn there carries it,
        after the one running now (nothing while the runner shuts down)."""
        self._carry(TurnRequest(platform, place, "", provenance=provenance, author=author))
