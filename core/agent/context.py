"""A conversation's context: how big a request is, and keeping every request inside the window.

Why it is shaped this way:
- Ollama silently drops the oldest tokens once a request passes its `num_ctx`, and its default
  window is a few thousand tokens. So Kaiwa always sends `num_ctx` (the window it plans for) and
  never sends a request that does not fit it with room left for the answer.
- Only the model's tokenizer knows a request's real size, and the model says it after each call
  (`prompt_eval_count`). Before a call, the size is estimated from characters and corrected by how
  far the last estimate was off for this conversation (`Calibration`).
- Past a threshold of the window, older messages are replaced by a summary the model writes
  (`Compactor`), only at a safe point: before a model call, when every tool call has its result.
  The cut never falls on a tool result, so a call and its result stay together. If the summary
  cannot be written, the oldest messages are dropped instead: never an overflow.
- This module imports no turn path, store or channel, so any agent loop can use it; the
  `on_compacted` callback is where a caller stores what was replaced.

The model-facing list is `[system message, messages...]`; after a compaction the system message
is the system prompt, then `SUMMARY_HEADER` and the summary. One system message, first: every
chat template renders that one, while some drop a system message found later in the list.
"""

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.messages import Usage
from core.agent.model import ModelReply, StatusCallback
from core.agent.profile import AgentProfile
from core.errors import KaiwaError, ModelError
from core.text import plural

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MESSAGE_TOKENS = 4
"""What a chat template adds around each message (role markers, separators)."""
KEEP_SHARE = 0.5
"""After a compaction, the most recent messages kept whole fill up to this share of the size that
sets one off: enough to carry the conversation on, little enough that the next compaction is
many turns away."""
SUMMARY_SHARE = 0.125
"""The longest summary asked for, as a share of the window."""
CALIBRATION_LIMITS = (0.25, 4.0)
CACHED_COUNT_SHARE = 0.5
"""A reported size under this share of the estimate is taken for a count Ollama cut short by its
prompt cache, and not learnt from."""
SUMMARY_HEADER = "[Summary of the earlier conversation, which no longer fits the context window]"
SUMMARIZE = (
    "You keep a long conversation within a context window. Summarize the transcript below for "
    "your own later use: the summary replaces it. Keep every fact, name, number, decision, "
    "preference, open question and promise; say which tools were used and what they found "
    "when it still matters. Write short plain paragraphs or bullet points, at most about "
    "{words} words, and nothing else."
)
TRANSCRIPT_MESSAGE_SHARE = 0.25
"""A single message longer than this share of a summary request is shortened in the transcript
(its start and end kept)."""


class ContextOverflow(KaiwaError):
    """What must be sent cannot fit the window even after compaction."""


class SummaryModel(Protocol):
    async def chat(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        reply: ModelReply,
        on_chunk: Callable[[str, str], None],
        *,
        tools: Sequence[dict[str, Any]] = (),
        think: bool | None = None,
        on_status: StatusCallback = ...,
        options: dict[str, Any] | None = None,
    ) -> ModelReply: ...


@dataclass(frozen=True)
class ContextPolicy:
    """How windows are chosen and when to compact ([context] in config)."""

    max_window: int = 16384
    """The largest window chosen for an agent that sets none: a model's own context length can
    be far larger than the memory of the machine it runs on allows."""
    compact_at: float = 0.75
    answer_reserve: int = 1024

    def window(self, configured: int, model_length: int | None) -> int:
        """An agent's window: its own setting if it has one (not 0), else the smaller of
        `max_window` and the model's context length (when Ollama says it)."""
        if configured:
            return configured
        return min(self.max_window, model_length) if model_length else self.max_window

    def settings(self, window: int, setting: str) -> "ContextSettings":
        return ContextSettings(window, self.compact_at, self.answer_reserve, setting)


@dataclass(frozen=True)
class ContextSettings:
    window: int
    """Tokens; sent to Ollama as `num_ctx`."""
    compact_at: float = 0.75
    """Compact when a request would pass this share of the window."""
    answer_reserve: int = 1024
    """Tokens always left free for the answer."""
    setting: str = "context_window"
    """The config key that sets the window, named in errors."""


class LengthModel(Protocol):
    async def context_length(self, model: str) -> int | None: ...


class ContextWindows:
    """Each agent's window: its own setting, or chosen for its model. Ollama is asked a model's
    context length once (the model client keeps the answer); while it cannot say, `max_window`
    is planned for, with a line in the log. The turn runner and sub-agents' runs ask here alike."""

    def __init__(self, model: LengthModel, policy: ContextPolicy) -> None:
        self._model = model
        self.policy = policy

    async def of(self, agent: AgentProfile) -> ContextSettings:
        setting = f"[agents.{agent.name}].context_window"
        if agent.context_window:
            return self.policy.settings(agent.context_window, setting)
        try:
            length = await self._model.context_length(agent.model)
        except ModelError as exc:
            logger.warning(
                "the context length of %s is unknown (%s); planning for %d tokens",
                agent.model,
                exc,
                self.policy.max_window,
            )
            length = None
        return self.policy.settings(self.policy.window(0, length), setting)


@dataclass(frozen=True)
class Compaction:
    """What one compaction did. Indexes are those of the list before it changed."""

    first_kept: int
    """The first message kept whole; `[1:first_kept]` went into the summary (or was dropped)."""
    summary: str
    """The summary the system message now carries ('' if there is none)."""
    method: str
    """`summary`, or `dropped` when the summary could not be written."""
    tokens_before: int
    tokens_after: int
    calls: tuple[Usage, ...] = ()
    """What each summary call cost."""


@dataclass
class Calibration:
    """How far the character estimate is off for one conversation, learnt from what the model
    reported it read."""

    ratio: float = 1.0
    last_estimate: int = 0
    """The raw estimate of the request last sent."""

    def size(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
        return self.scaled(raw_estimate(messages, tools))

    def scaled(self, raw: int) -> int:
        """A raw estimate (`raw_estimate`), corrected."""
        return math.ceil(raw * self.ratio)

    def sent(self, raw: int) -> None:
        """A request of this raw estimate went out; its reported size is compared with it."""
        self.last_estimate = raw

    def reported(self, prompt_tokens: int) -> None:
        if prompt_tokens <= 0 or self.last_estimate <= 0:
            return
        if prompt_tokens < self.last_estimate * self.ratio * CACHED_COUNT_SHARE:
            return
        low, high = CALIBRATION_LIMITS
        self.ratio = min(high, max(low, prompt_tokens / self.last_estimate))


def raw_estimate(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
    """Tokens in `messages` and `tools` by characters alone (about four a token)."""
    chars = sum(_message_chars(message) for message in messages)
    if tools:
        chars += len(json.dumps(list(tools), sort_keys=True))
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_TOKENS * len(messages)


def _message_chars(message: dict[str, Any]) -> int:
    chars = len(str(message.get("content") or ""))
    for call in message.get("tool_calls") or ():
        chars += len(json.dumps(call.get("function", call), sort_keys=True))
    return chars


SUMMARY_SEPARATOR = f"\n\n{SUMMARY_HEADER}\n"


def system_message(prompt: str, summary: str = "") -> dict[str, Any]:
    """The first message: the system prompt, then the summary of what came before, if any."""
    return {
        "role": "system",
        "content": f"{prompt}{SUMMARY_SEPARATOR}{summary}" if summary else prompt,
    }


def prompt_and_summary(message: dict[str, Any]) -> tuple[str, str]:
    """The system prompt and the summary (or '') a system message carries."""
    prompt, _, summary = str(message.get("content", "")).partition(SUMMARY_SEPARATOR)
    return prompt, summary


class Compactor:
    """Keeps one conversation's requests inside its window; one per loop run."""

    def __init__(
        self,
        model: SummaryModel,
        model_name: str,
        settings: ContextSettings,
        calibration: Calibration,
        on_compacted: Callable[[Compaction], None],
    ) -> None:
        self._model = model
        self._model_name = model_name
        self.settings = settings
        self.calibration = calibration
        self._on_compacted = on_compacted

    @property
    def options(self) -> dict[str, Any]:
        """What every request of this conversation carries: the window."""
        return {"num_ctx": self.settings.window}

    async def fit(
        self,
        messages: list[dict[str, Any]],
        extra: Sequence[dict[str, Any]] = (),
        tools: Sequence[dict[str, Any]] = (),
        on_status: StatusCallback = lambda _: None,
    ) -> None:
        """Before a model call (a safe point): compact `messages` in place if the request
        (`messages` + `extra`, with `tools`) would pass the threshold; raise `ContextOverflow`
        if it cannot fit even then. Then remember the request's size for calibration."""
        raw = raw_estimate([*messages, *extra], tools)
        if self.calibration.scaled(raw) > self._limit():
            await self.compact(messages, extra, tools, on_status=on_status)
            raw = raw_estimate([*messages, *extra], tools)
            if self.calibration.scaled(raw) + self.settings.answer_reserve > self.settings.window:
                raise self._overflow(messages, extra, tools)
        self.calibration.sent(raw)

    def reported(self, prompt_tokens: int) -> None:
        """A model call returned: what the model said it read."""
        self.calibration.reported(prompt_tokens)

    async def compact(
        self,
        messages: list[dict[str, Any]],
        extra: Sequence[dict[str, Any]] = (),
        tools: Sequence[dict[str, Any]] = (),
        *,
        on_status: StatusCallback = lambda _: None,
        keep_tokens: float | None = None,
    ) -> Compaction | None:
        """Replace the older messages by a summary, keeping the most recent ones that fit in
        `keep_tokens` (by default a share of the window; at least the latest message); None if
        there is nothing older to replace. `on_compacted` hears of it before `messages` changes
        (its indexes are still those of the list it was given)."""
        start = 1
        if keep_tokens is None:
            keep_tokens = self._limit() * KEEP_SHARE - self._size([messages[0]], extra, tools)
        first_kept = self._first_kept(messages, start, keep_tokens)
        if first_kept <= start:
            return None
        prompt, earlier = prompt_and_summary(messages[0])
        older = messages[start:first_kept]
        on_status("compacting the conversation…")
        try:
            summary, calls = await self._summarize(earlier, older)
            method = "summary"
        except ModelError as exc:
            logger.warning(
                "the summary of %d older %s could not be written (%s); they are dropped instead",
                len(older),
                plural(len(older), "message"),
                exc,
            )
            summary, calls, method = earlier, (), "dropped"
        compacted = [system_message(prompt, summary), *messages[first_kept:]]
        compaction = Compaction(
            first_kept,
            summary,
            method,
            self._size(messages, extra, tools),
            self._size(compacted, extra, tools),
            tuple(calls),
        )
        self._on_compacted(compaction)
        messages[:] = compacted
        return compaction

    def _limit(self) -> float:
        """The size past which a request is compacted first: `compact_at` of the window, or
        less if the answer's reserve would not fit beside it."""
        window = self.settings.window
        return min(window * self.settings.compact_at, window - self.settings.answer_reserve)

    def _first_kept(self, messages: Sequence[dict[str, Any]], start: int, budget: float) -> int:
        """The earliest message from which the rest fits `budget` tokens; the cut never falls
        on a tool result. The last possible cut if even the rest is too big."""
        kept = 0.0
        first_kept = len(messages)
        for index in range(len(messages) - 1, start - 1, -1):
            kept += self.calibration.size([messages[index]])
            if messages[index].get("role") == "tool":
                continue
            if kept > budget and first_kept < len(messages):
                break
            first_kept = index
        return first_kept

    async def _summarize(
        self, earlier: str, older: Sequence[dict[str, Any]]
    ) -> tuple[str, list[Usage]]:
        """The summary of `earlier` (a summary already made) and `older`, written piece by piece
        so that no summary request passes the window; with what each call cost."""
        longest = math.ceil(self.settings.window * SUMMARY_SHARE)
        instructions = {"role": "system", "content": SUMMARIZE.format(words=longest * 3 // 4)}
        room = self.settings.window - self.settings.answer_reserve - longest
        room -= self._size([instructions]) + self._text_size(earlier)
        calls: list[Usage] = []
        summary = earlier
        for lines in self._pieces(older, room):
            head = f"Summary so far:\n{summary}\n\nTranscript:\n" if summary else "Transcript:\n"
            reply = await self._model.chat(
                self._model_name,
                [instructions, {"role": "user", "content": head + "\n".join(lines)}],
                ModelReply(),
                lambda _text, _thinking: None,
                think=False,
                options={**self.options, "num_predict": longest},
            )
            calls.append(reply.usage)
            summary = reply.text.strip()
            if not summary:
                raise EmptySummary(f"{self._model_name} wrote an empty summary")
        return summary, calls

    def _pieces(self, older: Sequence[dict[str, Any]], room: int) -> list[list[str]]:
        """`older` as transcript lines, in consecutive pieces of at most `room` tokens each (a
        message too long for a piece is shortened, its start and end kept)."""
        limit = max(200, int(room * TRANSCRIPT_MESSAGE_SHARE * CHARS_PER_TOKEN))
        pieces: list[list[str]] = [[]]
        filled = 0
        for message in older:
            line = _line(message, limit)
            size = self._text_size(line)
            if pieces[-1] and filled + size > room:
                pieces.append([])
                filled = 0
            pieces[-1].append(line)
            filled += size
        return pieces

    def _size(
        self,
        messages: Sequence[dict[str, Any]],
        extra: Sequence[dict[str, Any]] = (),
        tools: Sequence[dict[str, Any]] = (),
    ) -> int:
        return self.calibration.size([*messages, *extra], tools)

    def _text_size(self, text: str) -> int:
        return self.calibration.size([{"content": text}])

    def _overflow(
        self,
        messages: Sequence[dict[str, Any]],
        extra: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
    ) -> ContextOverflow:
        last = self._size([messages[-1]])
        return ContextOverflow(
            f"the latest message is about {last:,} tokens and, with the rest, the request needs "
            f"about {self._size(messages, extra, tools) + self.settings.answer_reserve:,} of the "
            f"model's {self.settings.window:,}-token context window; send something shorter, or "
            f"raise {self.settings.setting}"
        )


class EmptySummary(ModelError):
    """The model answered a summary request with nothing."""


def _line(message: dict[str, Any], limit: int) -> str:
    role = message.get("role", "")
    content = str(message.get("content") or "")
    if len(content) > limit:
        half = limit // 2
        content = f"{content[:half]} […] {content[-half:]}"
    if role == "tool":
        return f"Tool {message.get('tool_name', '')} returned: {content}"
    calls = [
        f"{call['function']['name']}({json.dumps(call['function'].get('arguments', {}))})"
        for call in message.get("tool_calls") or ()
    ]
    said = f"{role.capitalize()}: {content}" if content else f"{role.capitalize()}:"
    return f"{said} [called {', '.join(calls)}]" if calls else said
