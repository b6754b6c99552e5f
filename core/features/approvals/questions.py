"""Approvals: a risky tool runs only once a person in the conversation says yes.

A tool named in `[approvals].ask` is wrapped (`Approvals.guard`) so that, in a person's turn,
calling it first posts a question in the conversation: the call in short (`fetch_url(https://…)`)
with three buttons, each a command that also works typed: Allow once (`/approve 7`), Allow here
(`/approve 7 here`: the tool needs no more asking in this conversation; the grant is stored, so
it holds across restarts, until `/grants revoke`; `/new` starts without it) and Deny (`/deny 7`).
The turn waits on a future; nothing else does: the wait holds no lock other conversations need, and
commands (`/approve`, `/stop`) never wait behind a turn.

Only the person whose message started the turn, or one of `[approvals].approvers`, may answer;
anyone else is told why, and nothing changes. The first valid answer wins, in the store too
(`Store.decide_approval` settles a row only while it is `pending`), so a second click is told
what was decided. The question is then edited to say who decided what, its buttons gone.

A question nobody answers in `timeout_seconds` is a denial. `/stop` cancels the turn, and with it
the wait: the approval ends `cancelled`, at once. A question still waiting when Kaiwa stops ends
`expired`, edited to say Kaiwa stopped before anyone answered, and its turn's record names it;
each question is a stored row, so after a kill the next start finds the ones left `pending` and
does the same.

Unattended turns (scheduled firings, sub-agents, wake turns) never ask: the call is refused at
once with a result that tells the model a person must approve it.
"""

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from core.agent.tools import Tool, ToolContext, calling
from core.channel import Button, Channel, platform_of
from core.errors import KaiwaError
from core.metrics import APPROVALS_ANSWERED, APPROVALS_ASKED
from core.store import Store
from core.store.tables import Approval, utc_now
from core.text import plural
from core.turns.parts import Leftover, Part, Places

logger = logging.getLogger(__name__)

WAITED = "Kaiwa stopped while this turn waited for a person to approve {call}"
CALL_CHARS = 120
"""Characters of a call shown in its question."""
DECISIONS = {
    "allowed": "allowed it once",
    "allowed_here": "allowed it for this conversation",
    "denied": "denied it",
}
REVIEW_DECISIONS = {
    "allowed": "approved it",
    "edited": "asked for changes",
    "denied": "rejected it",
}


class ApprovalDenied(KaiwaError):
    """A call that did not get its approval, in words for the model."""


@dataclass(frozen=True)
class ApprovalSettings:
    ask: list[str] = field(default_factory=list)
    """Tools that run only once a person approves each call."""
    approvers: list[str] = field(default_factory=list)
    """People (platform ids) who may answer any question, besides the person who asked."""
    timeout_seconds: float = 300.0


@dataclass(frozen=True)
class Answer:
    """What a person decided: `allowed`, `allowed_here`, `edited` (with `text`: what to change),
    `denied`, `timed_out` or `cancelled`; `by` names who."""

    decision: str
    text: str = ""
    by: str = ""


@dataclass
class _Question:
    approval: Approval
    words: Mapping[str, str] = field(default_factory=lambda: DECISIONS)
    """What each decision is called when it is shown ("allowed it once")."""
    personal: bool = False
    """Only the person asked may answer, not the approvers (a plan is theirs to judge)."""
    decided: "asyncio.Future[Answer]" = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def summarize(tool: str, arguments: Mapping[str, Any]) -> str:
    """`fetch_url(https://example.com/…)`: the call as a person reads it, in one short line."""
    shown = ", ".join(str(value) for value in arguments.values())
    if len(shown) > CALL_CHARS:
        shown = shown[: CALL_CHARS - 1] + "…"
    return f"{tool}({shown})"


class Approvals(Part):
    """The turn parts' tool guard (`core.turns.parts.ToolGuard`), and a part whose questions
    outlive a process."""

    def __init__(
        self, store: Store, channels: Mapping[str, Channel], settings: ApprovalSettings
    ) -> None:
        self._store = store
        self._channels = channels
        self.settings = settings
        self._questions: dict[int, _Question] = {}
        self._closing = False
        """The process is stopping: a question left unanswered expires, as after a kill."""

    def guard(self, tools: Mapping[str, Tool], tool_timeout: float) -> dict[str, Tool]:
        """`tools`, those needing approval wrapped so that each call asks first (its time limit
        the tool's own, `tool_timeout` unless it has one, plus the wait for an answer)."""
        return {
            name: self._guarded(each, tool_timeout) if self.asks(name) else each
            for name, each in tools.items()
        }

    def asks(self, tool: str) -> bool:
        """Whether `tool` needs a yes: named in `ask`, or its MCP server is (`files.write`)."""
        return tool in self.settings.ask or tool.partition(".")[0] in self.settings.ask

    def _guarded(self, inner: Tool, tool_timeout: float) -> Tool:
        async def asked_first(**arguments: Any) -> str:
            await self.approve(inner.name, arguments)
            return await inner.invoke(arguments)

        limit = (inner.timeout or tool_timeout) + self.settings.timeout_seconds
        return replace(inner, function=asked_first, read_only=False, timeout=limit)

    async def approve(self, tool: str, arguments: Mapping[str, Any]) -> None:
        """Return once a person allowed this call; `ApprovalDenied` otherwise. A sub-agent's
        run has its delegation's grant (`ToolContext.granted`) and is never asked."""
        context = calling()
        call = summarize(tool, arguments)
        if context is not None and tool in context.granted:
            return
        if context is None or not context.attended:
            raise ApprovalDenied(
                f"{call} needs a person's approval, and nobody is here to give it (this is an "
                "unattended run); tell the person what you would do instead"
            )
        await self._allowed(context, tool, call, f"May I run {call}?")

    async def grant(self, what: str) -> None:
        """Ask once for a delegation (`what`: "find-apples (researcher) to use fetch_url"),
        before its sub-agents start; `ApprovalDenied` unless a person allows it."""
        context = calling()
        if context is None or not context.attended:
            raise ApprovalDenied(f"letting {what} needs a person's approval, and nobody is here")
        await self._allowed(context, "delegate", what, f"May I let {what}?")

    async def review(self, what: str, asking: str, wait_seconds: float) -> Answer:
        """Ask the person whose message started the turn (only them) to approve `what` (a plan),
        ask for changes, or reject it; `asking` is the question as shown. An unattended turn
        has nobody to ask: it must not call this."""
        context = calling()
        assert context is not None and context.attended, "nobody is here to review"
        buttons = [
            Button("Approve", "/approve {key}"),
            Button("Edit", "/edit {key}"),
            Button("Reject", "/deny {key}"),
        ]
        hint = "/approve {key}, /edit {key} followed by what to change, or /deny {key}"
        question = await self._ask(
            context, "review", what, asking, hint, buttons, REVIEW_DECISIONS, True
        )
        return await self._answer_of(question, wait_seconds)

    async def _allowed(self, context: ToolContext, tool: str, call: str, asking: str) -> None:
        if any(grant.tool == tool for grant in await self._store.grants(context.place)):
            return
        buttons = [
            Button("Allow once", "/approve {key}"),
            Button("Allow here", "/approve {key} here"),
            Button("Deny", "/deny {key}"),
        ]
        hint = "/approve {key}, /approve {key} here for this conversation, or /deny {key}"
        question = await self._ask(context, tool, call, asking, hint, buttons, DECISIONS, False)
        answer = await self._answer_of(question, self.settings.timeout_seconds)
        if answer.decision == "allowed_here":
            grant = {
                "tool": tool,
                "granted_by": answer.by,
                "approval_id": question.approval.id,
                "created_at": utc_now(),
            }
            await self._store.add_grant(context.place, grant)
        if answer.decision not in ("allowed", "allowed_here"):
            why = (
                "nobody answered in time"
                if answer.decision == "timed_out"
                else "the person denied it"
            )
            raise ApprovalDenied(f"{call} was not allowed: {why}")

    async def _answer_of(self, question: _Question, wait_seconds: float) -> Answer:
        """Wait for the question's answer; after `wait_seconds` it is `timed_out`, and a
        stop of the turn settles it `cancelled` before the stop goes on."""
        assert question.approval.id is not None
        try:
            async with asyncio.timeout(wait_seconds):
                return await question.decided
        except TimeoutError:
            await self._settle(question, Answer("timed_out"))
            return Answer("timed_out")
        except asyncio.CancelledError:
            await asyncio.shield(self._settle(question, self._stopped()))
            raise
        finally:
            self._questions.pop(question.approval.id, None)

    async def _ask(
        self,
        context: ToolContext,
        tool: str,
        call: str,
        asking: str,
        hint: str,
        buttons: list[Button],
        words: Mapping[str, str],
        personal: bool,
    ) -> _Question:
        """Store the question, then post it: `asking`, then `hint` in brackets; `{key}` in the
        hint and the buttons' commands becomes its number (never in `asking`, which quotes the
        model's arguments)."""
        turn_id = await context.turn() if context.turn is not None else None
        approval = await self._store.add_approval(
            {
                "turn_id": turn_id,
                "place": context.place,
                "tool": tool,
                "call": call,
                "asked_of": context.person or "",
                "asked_of_name": context.person_name or context.person or "",
                "status": "pending",
                "created_at": utc_now(),
            }
        )
        key = approval.id
        assert key is not None
        question = _Question(approval, words, personal)
        self._questions[key] = question
        APPROVALS_ASKED.inc()
        shown = [Button(b.label, b.command.format(key=key)) for b in buttons]
        text = f"{asking} ({hint.format(key=key)})"
        try:
            posted = await self._channels[context.platform].notify(context.place, text, shown)
            if posted:
                question.approval = approval.model_copy(update={"message_id": posted[-1]})
                await self._store.update_approval(key, {"message_id": posted[-1]})
        except asyncio.CancelledError:  # stopped while it was being asked: settled all the same
            self._questions.pop(key, None)
            await asyncio.shield(self._settle(question, self._stopped()))
            raise
        logger.info("approval %d asked in %s: %s", key, context.place, call)
        return question

    def _stopped(self) -> Answer:
        """How a question ends when its turn is stopped: `cancelled` by a stop, `expired` when
        Kaiwa is stopping."""
        return Answer("expired" if self._closing else "cancelled")

    async def answer(
        self, approval_id: int, person: str, name: str, decision: str, text: str = ""
    ) -> str:
        """An answer (`allowed`, `allowed_here`, `edited` with `text`, or `denied`) from
        `person`, shown as `name`; what to tell them."""
        question = self._questions.get(approval_id)
        stored = question.approval if question else await self._store.approval(approval_id)
        if stored is None:
            return f"There is no question {approval_id}."
        approvers = () if question is not None and question.personal else self.settings.approvers
        if person != stored.asked_of and person not in approvers:
            others = "" if question is not None and question.personal else " or an approver"
            return (
                f"Only the person who asked ({stored.asked_of_name}){others} can answer "
                f"question {approval_id}."
            )
        if question is None or question.decided.done():
            return f"Question {approval_id} is already settled ({stored.status})."
        if decision not in question.words:
            return f"Question {approval_id} takes /approve or /deny."
        if decision == "edited" and not text.strip():
            return f"Say what to change: /edit {approval_id} followed by the change."
        answer = Answer(decision, text.strip(), name)
        if not await self._settle(question, answer, person):
            return f"Question {approval_id} is already settled."
        question.decided.set_result(answer)
        return f"You {question.words[decision]}: {stored.call}."

    async def _settle(self, question: _Question, answer: Answer, person: str | None = None) -> bool:
        """Store the decision (the first one wins) and edit the question to show it, naming
        who decided."""
        approval = question.approval
        assert approval.id is not None
        values = {"status": answer.decision, "decided_by": person, "decided_at": utc_now()}
        if not await self._store.decide_approval(approval.id, values):
            return False
        question.approval = approval.model_copy(update=values)
        APPROVALS_ANSWERED.labels(answer.decision).inc()
        logger.info(
            "approval %d in %s: %s by %s", approval.id, approval.place, answer.decision, person
        )
        await self._show(approval, _outcome(approval.call, answer, question.words))
        return True

    async def _show(self, approval: Approval, text: str) -> None:
        channel = self._channels.get(platform_of(approval.place))
        if channel is None or approval.message_id is None:
            return
        try:
            await channel.edit_notice(approval.place, approval.message_id, text)
        except Exception as exc:
            logger.warning("approval %s: the question could not be edited: %s", approval.id, exc)

    async def shutdown(self) -> dict[int, str]:
        """The process is stopping: each question still waiting expires as its turn is stopped
        (edited to say Kaiwa stopped before anyone answered), and the turn's record names it,
        as the next start does for a question a killed process left."""
        self._closing = True
        return {
            question.approval.turn_id: WAITED.format(call=question.approval.call)
            for question in self._questions.values()
            if question.approval.turn_id is not None
        }

    async def left_over(self, place: str | None) -> Leftover | None:
        """Questions a dead process left pending (in `place`, when given: a cluster's dead
        worker): the turns that waited on them stopped for that reason, and each is marked
        expired, and edited to say so, once its channel is connected."""
        left = await self._store.pending_approvals(place)
        if not left:
            return None
        waited = {a.turn_id: WAITED.format(call=a.call) for a in left if a.turn_id is not None}
        return Leftover(partial(self._expire, left), waited)

    async def _expire(self, left: list[Approval], places: Places) -> None:
        expired = 0
        for approval in left:
            assert approval.id is not None
            if await self._store.decide_approval(
                approval.id, {"status": "expired", "decided_at": utc_now()}
            ):
                expired += 1
                APPROVALS_ANSWERED.labels("expired").inc()
                await places.ready(approval.place)
                await self._show(approval, _outcome(approval.call, Answer("expired"), DECISIONS))
        if expired:
            logger.info("%d unanswered %s marked expired", expired, plural(expired, "question"))


def _outcome(call: str, answer: Answer, words: Mapping[str, str]) -> str:
    if answer.decision in words:
        asked = f" ({answer.text})" if answer.text else ""
        return f"{call}: {answer.by} {words[answer.decision]}{asked}."
    if answer.decision == "timed_out":
        return f"{call}: not run; nobody answered in time."
    if answer.decision == "cancelled":
        return f"{call}: not run; the reply was stopped."
    return f"{call}: not run; Kaiwa stopped before anyone answered."
