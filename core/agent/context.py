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
- The message that opened a loop's run (the person's, a scheduled task's, a sub-agent's task, a
  plan step's instruction: `fit`'s `opening`) and everything after it are never summarized: a
  summary sits in the system message, before every kept message, so folding in the question
  would leave the model a request with no question in it. They are shortened instead (below),
  or the turn ends with a refusal that says so.
- No request of any kind (a chat call, a nudged one, the wrap-up call without tools, a summary
  call) goes out larger than the window with its answer's room. When one would, whose message
  is too large decides, before any summary is asked for (a compaction cannot shorten the
  messages from the last possible cut on): the message that opened the turn (a person's, a
  scheduled task's) is refused at once, naming whose it is (`Author`), since shortening what
  someone asked would answer something else; a tool's result, or a call's arguments, is
  shortened in the request (`core.agent.shortening`: the model is told what was left out) and
  the turn goes on, the log naming the tool, while the store keeps both whole (`on_shortened`);
  a system prompt with tools' schemas that leave no room for a message is refused, naming the
  largest schemas (`schema_share`). A summary request shortens every message of its transcript,
  a tool call's arguments too; one that would still not fit is not sent, and the older messages
  are dropped.
- This module imports no turn path, store or channel, so any agent loop can use it; the
  `on_compacted` callback is where a caller stores what was replaced.

The model-facing list is `[system message, messages...]`; after a compaction the system message
is the system prompt, then `SUMMARY_HEADER` and the summary. One system message, first: every
chat template renders that one, while some drop a system message found later in the list.
"""

import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.messages import Usage
from core.agent.model import StatusCallback
from core.agent.profile import AgentProfile
from core.agent.shortening import (
    NoSummary,
    Summarizer,
    SummaryModel,
    at_shortest,
    cut_to_fit,
    named,
)
from core.agent.tools import Tool
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
SCHEMA_SHARE_WARNING = 0.25
"""Tools' schemas that take more than this share of a window leave too little for the
conversation: `kaiwa check` says which to drop (`SchemaShare.to_drop`)."""


class ContextOverflow(KaiwaError):
    """What must be sent cannot fit the window: the message says whose part is too large."""


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


@dataclass(frozen=True)
class Author:
    """Whose message opens a turn's requests, as a refusal names it, and what they can do."""

    whose: str = "the latest message"
    remedy: str = "shorten it"


@dataclass(frozen=True)
class SchemaShare:
    """How much of a window the schemas of the tools an agent is offered take: every request that
    offers tools carries them all, before any message."""

    window: int
    tokens: int
    """Every schema together, estimated as a request's (`raw_estimate`)."""
    by_tool: tuple[tuple[str, int], ...]
    """Each tool's name and its own schema's tokens, the largest first."""

    @property
    def share(self) -> float:
        return self.tokens / self.window

    def to_drop(self, share: float = SCHEMA_SHARE_WARNING) -> tuple[str, ...]:
        """The fewest tools, the largest first, without which the rest take at most `share` of
        the window; none if they already do."""
        over = self.tokens - share * self.window
        dropped: list[str] = []
        for name, tokens in self.by_tool:
            if over <= 0:
                break
            dropped.append(name)
            over -= tokens
        return tuple(dropped)


def schema_share(tools: Iterable[Tool], window: int) -> SchemaShare:
    """The tokens the schemas of `tools` (all an agent is offered) take in a `window`-token
    context window, and which take the most."""
    return _schema_share([tool.schema() for tool in tools], window)


def _schema_share(schemas: Sequence[dict[str, Any]], window: int) -> SchemaShare:
    sizes = [(schema["function"]["name"], raw_estimate([], [schema])) for schema in schemas]
    sizes.sort(key=lambda size: (-size[1], size[0]))
    return SchemaShare(window, raw_estimate([], schemas), tuple(sizes))


class Compactor:
    """Keeps one conversation's requests inside its window; one per loop run. `author` names the
    message that opens the requests when it is refused; `on_shortened` hears that a tool result
    or call in the messages was shortened in place (the caller's stored copy keeps it whole)."""

    def __init__(
        self,
        model: SummaryModel,
        model_name: str,
        settings: ContextSettings,
        calibration: Calibration,
        on_compacted: Callable[[Compaction], None],
        *,
        author: Author = Author(),
        on_shortened: Callable[[], None] = lambda: None,
    ) -> None:
        self._model_name = model_name
        self.settings = settings
        self.calibration = calibration
        self._on_compacted = on_compacted
        self._author = author
        self._on_shortened = on_shortened
        self._summarizer = Summarizer(
            model, model_name, settings.window, settings.answer_reserve, self._size, CHARS_PER_TOKEN
        )

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
        *,
        opening: dict[str, Any] | None = None,
    ) -> None:
        """Before a model call (a safe point): make the request (`messages` + `extra`, with
        `tools`) fit the window with the answer's room. Past the threshold, first the messages
        no compaction can remove (from `opening`, the message that opened the run, on; at least
        the latest) are made to fit (tool results and calls shortened) or refused
        (`ContextOverflow`, before any summary is asked for), then older messages are compacted
        in place. Then the request's size is remembered for calibration."""
        if self._size(messages, extra, tools) > self._limit():
            kept_from = _index_of(messages, opening)
            self._make_room(messages, extra, tools, kept_from)
            if self._size(messages, extra, tools) > self._limit():
                await self.compact(messages, extra, tools, on_status=on_status, kept_from=kept_from)
                needed = self._size(messages, extra, tools) + self.settings.answer_reserve
                if needed > self.settings.window:
                    raise self._overflow(needed)
        self.calibration.sent(raw_estimate([*messages, *extra], tools))

    def opening_room(self, system: dict[str, Any], tools: Sequence[dict[str, Any]]) -> int:
        """Characters a message opening a run may take (a person's with a document in it), so
        that it is never what makes a request too large: beside the system message, the tools'
        schemas, the longest summary of what came before and the answer's reserve, it may
        take `KEEP_SHARE` of what is left, the rest staying for the run's own calls and
        results. In characters as the estimate counts them for this conversation."""
        beside = self._size([system], (), tools) + self._summary_cap() + MESSAGE_TOKENS
        left = self.settings.window - self.settings.answer_reserve - beside
        tokens = max(0.0, left * KEEP_SHARE)
        return math.floor(tokens * CHARS_PER_TOKEN / self.calibration.ratio)

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
        kept_from: int | None = None,
    ) -> Compaction | None:
        """Replace the older messages by a summary, keeping the most recent ones that fit in
        `keep_tokens` (by default a share of the window; at least the latest message, and every
        message from `kept_from` on); None if there is nothing older to replace. The summary is
        at most `SUMMARY_SHARE` of the window, less if the kept messages leave less room.
        `on_compacted` hears of it before `messages` changes (its indexes are still those of
        the list it was given)."""
        start = 1
        if keep_tokens is None:
            keep_tokens = self._limit() * KEEP_SHARE - self._size([messages[0]], extra, tools)
        first_kept = self._first_kept(messages, start, keep_tokens, kept_from)
        if first_kept <= start:
            return None
        prompt, earlier = prompt_and_summary(messages[0])
        older = messages[start:first_kept]
        room = self._room_beside(prompt, messages[first_kept:], extra, tools)
        longest = min(self._summary_cap(), room)
        on_status("compacting the conversation…")
        try:
            summary, calls = await self._summarizer.write(earlier, older, longest)
            method = "summary"
        except (ModelError, NoSummary) as exc:
            logger.warning(
                "the summary of %d older %s could not be written (%s); they are dropped instead",
                len(older),
                plural(len(older), "message"),
                exc,
            )
            summary = earlier if self._text_size(earlier) <= room else ""
            calls, method = [], "dropped"
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

    def _first_kept(
        self,
        messages: Sequence[dict[str, Any]],
        start: int,
        budget: float,
        kept_from: int | None = None,
    ) -> int:
        """The earliest message from which the rest fits `budget` tokens, and never later than
        `kept_from`; the cut never falls on a tool result. The last possible cut if even the
        rest is too big."""
        kept = 0.0
        first_kept = len(messages)
        for index in range(len(messages) - 1, start - 1, -1):
            kept += self.calibration.size([messages[index]])
            if messages[index].get("role") == "tool":
                continue
            if kept > budget and first_kept < len(messages):
                break
            first_kept = index
        return first_kept if kept_from is None else min(first_kept, kept_from)

    def _make_room(
        self,
        messages: list[dict[str, Any]],
        extra: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        kept_from: int | None,
    ) -> None:
        """Make the messages from the last possible cut on (which every compaction keeps: the
        latest, and all from `kept_from`) fit beside the system prompt, `extra`, the tools and
        the answer's reserve, with room left for a summary of any older ones: tool results and
        calls there are shortened in place; messages that cannot fit otherwise are refused."""
        start = self._first_kept(messages, 1, 0, kept_from)
        prompt, earlier = prompt_and_summary(messages[0])
        fixed = self._size([system_message(prompt)], extra, tools)
        room = self.settings.window - self.settings.answer_reserve - fixed
        summary = self._summary_cap() if start > 1 or earlier else 0
        kept = self._size(messages[start:])
        if kept <= room - summary or self._shorten(messages, start, room - summary):
            return
        if kept > room:  # else it fits beside a shorter summary, or none
            raise self._refusal(messages[start:], fixed, tools)

    def _shorten(self, messages: list[dict[str, Any]], start: int, budget: float) -> bool:
        """Cut the tool results and call arguments of `messages[start:]` (`cut_to_fit`) so that
        they fit `budget` tokens; False (nothing changed) if they cannot."""
        kept = messages[start:]
        shorter = cut_to_fit(
            kept, lambda cut: self._size(cut) <= budget, self._text_size, self.settings.window
        )
        if shorter is None:
            return False
        for index, (message, cut) in enumerate(zip(kept, shorter, strict=True), start):
            if cut is not message:
                messages[index] = cut
                logger.warning(
                    "%s is about %d tokens, more than the %d-token context window of %s holds "
                    "beside the rest; the model is shown its start and end (raise %s to give "
                    "it whole)",
                    named(message),
                    self._size([message]),
                    self.settings.window,
                    self._model_name,
                    self.settings.setting,
                )
        self._on_shortened()
        return True

    def _summary_cap(self) -> int:
        return math.ceil(self.settings.window * SUMMARY_SHARE)

    def _room_beside(
        self,
        prompt: str,
        kept: Sequence[dict[str, Any]],
        extra: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
    ) -> int:
        """The tokens a summary may take beside the prompt and the `kept` messages."""
        beside = self._size([system_message(prompt, SUMMARY_HEADER), *kept], extra, tools)
        return self.settings.window - self.settings.answer_reserve - beside

    def _size(
        self,
        messages: Sequence[dict[str, Any]],
        extra: Sequence[dict[str, Any]] = (),
        tools: Sequence[dict[str, Any]] = (),
    ) -> int:
        return self.calibration.size([*messages, *extra], tools)

    def _text_size(self, text: str) -> int:
        return self.calibration.size([{"content": text}])

    def _refusal(
        self, kept: Sequence[dict[str, Any]], fixed: int, tools: Sequence[dict[str, Any]]
    ) -> ContextOverflow:
        """Why the messages every compaction keeps (`kept`) cannot fit, naming whose they are:
        the largest's if, as short as it can be made, it takes more than half of what the window
        leaves beside the answer's reserve; the system prompt's and the tools' if they do; else
        the run's messages together (a question and the many tool calls after it)."""
        window, reserve = self.settings.window, self.settings.answer_reserve
        setting = self.settings.setting
        schemas = _schemas_hint(_schema_share(tools, window))
        shortest = at_shortest(kept, self._text_size, window)
        index = max(range(len(kept)), key=lambda each: self._size([shortest[each]]), default=0)
        largest = kept[index] if kept else {}
        if self._size(shortest[index : index + 1]) * 2 > window - reserve:
            return self._too_large(largest, fixed + self._size(kept) + reserve, schemas)
        if fixed * 2 > window - reserve or len(kept) < 2:
            return ContextOverflow(
                f"the system prompt and the tools' schemas take about {fixed:,} tokens, and with "
                f"{reserve:,} kept for the answer they leave too little room for the messages "
                f"of this request in the model's {window:,}-token context window: raise "
                f"{setting}{schemas}"
            )
        calls = sum(len(message.get("tool_calls") or ()) for message in kept)
        return ContextOverflow(
            f"{self._author.whose} and the {calls:,} tool {plural(calls, 'call')} since, with "
            f"their results, need about {self._size(shortest):,} tokens even with each result "
            f"shortened, more than the model's {window:,}-token context window holds beside "
            f"the system prompt, the tools and {reserve:,} kept for the answer: ask for less "
            f"at once, or raise {setting}{schemas}"
        )

    def _too_large(self, largest: dict[str, Any], needed: int, schemas: str) -> ContextOverflow:
        """One message too large for the window, even as short as it can be made."""
        window, reserve = self.settings.window, self.settings.answer_reserve
        setting = self.settings.setting
        if largest.get("role") == "user":
            return ContextOverflow(
                f"{self._author.whose} is about {self._size([largest]):,} tokens, and with the "
                f"system prompt, the tools and {reserve:,} kept for the answer the request "
                f"needs about {needed:,} of the model's {window:,}-token context window: "
                f"{self._author.remedy}, or raise {setting}{schemas}"
            )
        return ContextOverflow(
            f"{named(largest)} is about {self._size([largest]):,} tokens, more than the "
            f"model's {window:,}-token context window holds beside the system prompt, the "
            f"tools and {reserve:,} kept for the answer: raise {setting}{schemas}"
        )

    def _overflow(self, needed: int) -> ContextOverflow:
        return ContextOverflow(
            f"even with the earlier conversation summarized, the request needs about "
            f"{needed:,} tokens of the model's {self.settings.window:,}-token context window "
            f"({self.settings.answer_reserve:,} of them kept for the answer): raise "
            f"{self.settings.setting}"
        )


def _index_of(messages: Sequence[dict[str, Any]], message: dict[str, Any] | None) -> int | None:
    """Where `message` itself (not an equal one) is in `messages`; None if it is not there."""
    return next((index for index, each in enumerate(messages) if each is message), None)


def _schemas_hint(share: SchemaShare) -> str:
    """What a refusal adds when the tools' schemas take too much of the window."""
    drop = share.to_drop()
    if not drop:
        return ""
    return (
        f" (the tools' schemas alone take about {share.tokens:,} tokens; offering fewer "
        f"would help, the largest first: {', '.join(drop)})"
    )
