"""Shortening what does not fit a request: older messages to a summary, a tool's result or a
call's arguments to their start and end.

Why it is shaped this way:
- A summary is written piece by piece (`Summarizer`): each request carries the instructions, the
  summary so far and as much of the transcript as fits, and is checked against the window with
  its answer before it is sent; one that would not fit is not sent (`NoSummary`). The transcript
  shortens every message, a tool call's arguments as any text (`_transcript_line`), so one long
  message or call never fills a request on its own.
- Whatever is cut keeps its start and its end: the start says what a text is (a file's head, a
  listing's first lines), the end how it finished (a total, an error, the last line).
- What the model reads of a cut says what was left out and what it can do about it
  (`RESULT_CUT`: ask for a smaller part; `ARGUMENT_CUT`: nothing, the tool had the call whole),
  so it never takes a shortened text for the whole one.
- A call's arguments are cut string by string, so they stay the JSON object the chat template
  renders (a call the model reads as malformed is one it may repeat malformed).
- How much is kept is `core.agent.context`'s to decide: this module measures with what it is
  given, and knows no conversation.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.agent.messages import Usage
from core.agent.model import ModelReply, StatusCallback
from core.errors import KaiwaError, ModelError

SHORTEST_SUMMARY = 64
"""Tokens: with less room than this beside the messages kept, no summary is asked for."""
SUMMARIZE = (
    "You keep a long conversation within a context window. Summarize the transcript below for "
    "your own later use: the summary replaces it. Keep every fact, name, number, decision, "
    "preference, open question and promise; say which tools were used and what they found "
    "when it still matters. Write short plain paragraphs or bullet points, at most about "
    "{words} words, and nothing else."
)
TRANSCRIPT_MESSAGE_SHARE = 0.25
"""A single message longer than this share of a summary request is shortened in the transcript
(its start and end kept); so are a tool call's arguments."""
SHORTEST_PIECE = 400
"""Characters: a tool result, or a string in a call's arguments, shortened to fit the window
keeps at least this much of its start and end."""
RESULT_CUT = (
    "\n\n[Kaiwa: {tool} returned about {tokens:,} tokens, more than the {window:,}-token context "
    "window holds beside the rest of this request, so {left_out:,} characters from its middle "
    "are left out here. If you need them, ask for a smaller part.]\n\n"
)
ARGUMENT_CUT = (
    " [Kaiwa: {left_out:,} characters are left out of this copy of the call to fit the context "
    "window; the tool received them all.] "
)


class NoSummary(KaiwaError):
    """A summary cannot be asked for within the window (the older messages are dropped)."""


class EmptySummary(ModelError):
    """The model answered a summary request with nothing."""


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
class Summarizer:
    """Writes one conversation's summaries; `size` is its estimate of messages' tokens, made
    from characters at about `chars_per_token`."""

    model: SummaryModel
    model_name: str
    window: int
    answer_reserve: int
    size: Callable[[Sequence[dict[str, Any]]], int]
    chars_per_token: int

    async def write(
        self, earlier: str, older: Sequence[dict[str, Any]], longest: int
    ) -> tuple[str, list[Usage]]:
        """The summary (at most `longest` tokens) of `earlier` (a summary already made) and
        `older`, written piece by piece: each request is the instructions, the summary so far
        and as many transcript lines as fit the window beside its answer and `answer_reserve`
        (left free as a chat request leaves it: a margin for the estimate). With what each call
        cost. Raises `NoSummary` rather than send a request that would not fit."""
        if longest < SHORTEST_SUMMARY:
            raise NoSummary(f"the messages kept leave room for {max(longest, 0)} tokens of it")
        instructions = {"role": "system", "content": SUMMARIZE.format(words=longest * 3 // 4)}
        room = self.window - self.answer_reserve - longest - self.size([instructions])
        limit = room - max(self._text_size(earlier), longest) - self._text_size(_head("."))
        lines = [_transcript_line(message, self._chars(limit)) for message in older]
        calls: list[Usage] = []
        summary = earlier
        while lines:
            piece = self._piece(lines, room - self._text_size(_head(summary)))
            request = [instructions, {"role": "user", "content": _head(summary) + piece}]
            needed = self.size(request) + longest + self.answer_reserve
            if needed > self.window:
                raise NoSummary(
                    f"a summary request would need about {needed:,} tokens of the "
                    f"{self.window:,}-token context window, its answer and the reserve included"
                )
            reply = await self.model.chat(
                self.model_name,
                request,
                ModelReply(),
                lambda _text, _thinking: None,
                think=False,
                options={"num_ctx": self.window, "num_predict": longest},
            )
            calls.append(reply.usage)
            summary = reply.text.strip()
            if not summary:
                raise EmptySummary(f"{self.model_name} wrote an empty summary")
        return summary, calls

    def _piece(self, lines: list[str], room: int) -> str:
        """The next lines (taken from `lines`) that fit `room` tokens; at least one."""
        taken, filled = 0, 0
        while taken < len(lines) and (not taken or filled + self._text_size(lines[taken]) <= room):
            filled += self._text_size(lines[taken])
            taken += 1
        piece = "\n".join(lines[:taken])
        del lines[:taken]
        return piece

    def _chars(self, tokens: int) -> int:
        """The longest line of a transcript, in characters, for pieces of `tokens`."""
        return max(200, int(tokens * TRANSCRIPT_MESSAGE_SHARE * self.chars_per_token))

    def _text_size(self, text: str) -> int:
        return self.size([{"content": text}])


def _head(summary: str) -> str:
    """What heads a piece of a summary's transcript: the summary so far, if any."""
    return f"Summary so far:\n{summary}\n\nTranscript:\n" if summary else "Transcript:\n"


def _transcript_line(message: dict[str, Any], limit: int) -> str:
    """A message as a line of a summary's transcript: its text, and the arguments of its calls
    (as JSON, shared among them), each shortened to `limit` characters, start and end kept."""
    role = message.get("role", "")
    content = _shortened(str(message.get("content") or ""), limit, _elided)
    if role == "tool":
        return f"Tool {message.get('tool_name', '')} returned: {content}"
    calls = message.get("tool_calls") or ()
    each = limit // max(1, len(calls))
    called = [
        f"{call['function']['name']}({_shortened(_arguments_json(call), each, _elided)})"
        for call in calls
    ]
    said = f"{role.capitalize()}: {content}" if content else f"{role.capitalize()}:"
    return f"{said} [called {', '.join(called)}]" if called else said


def _arguments_json(call: dict[str, Any]) -> str:
    return json.dumps(call["function"].get("arguments", {}), ensure_ascii=False)


def _elided(_left_out: int) -> str:
    return " […] "


def cut_to_fit(
    messages: Sequence[dict[str, Any]],
    fits: Callable[[list[dict[str, Any]]], bool],
    tokens: Callable[[str], int],
    window: int,
) -> list[dict[str, Any]] | None:
    """`messages` cut (`_cut`) to one length, the longest with which they `fit`; None if even
    `SHORTEST_PIECE` characters would not (or nothing is longer)."""
    longest = max(map(_longest_piece, messages), default=0)
    if longest <= SHORTEST_PIECE or not fits(_cut(messages, SHORTEST_PIECE, tokens, window)):
        return None
    low, high = SHORTEST_PIECE, longest
    while low < high:
        middle = (low + high + 1) // 2
        if fits(_cut(messages, middle, tokens, window)):
            low = middle
        else:
            high = middle - 1
    return _cut(messages, low, tokens, window)


def at_shortest(
    messages: Sequence[dict[str, Any]], tokens: Callable[[str], int], window: int
) -> list[dict[str, Any]]:
    """`messages` as short as `cut_to_fit` ever makes them (`SHORTEST_PIECE`)."""
    return _cut(messages, SHORTEST_PIECE, tokens, window)


def _cut(
    messages: Sequence[dict[str, Any]], chars: int, tokens: Callable[[str], int], window: int
) -> list[dict[str, Any]]:
    """`messages` with each tool result, and each string in a call's arguments, cut to `chars`
    characters (the note to a result gives its size, `tokens` of it, and the `window`); a message
    with nothing to cut is the same object."""
    return [_cut_one(message, chars, tokens, window) for message in messages]


def _cut_one(
    message: dict[str, Any], chars: int, tokens: Callable[[str], int], window: int
) -> dict[str, Any]:
    if message.get("role") == "tool":
        content = str(message.get("content") or "")
        tool = message.get("tool_name") or "a tool"

        def note(left_out: int) -> str:
            size = tokens(content)
            return RESULT_CUT.format(tool=tool, tokens=size, window=window, left_out=left_out)

        shorter = _shortened(content, chars, note)
        return message if shorter == content else {**message, "content": shorter}
    calls = message.get("tool_calls") or []
    cut_calls = [_call_cut(call, chars) for call in calls]
    if all(new is old for new, old in zip(cut_calls, calls, strict=True)):
        return message
    return {**message, "tool_calls": cut_calls}


def _call_cut(call: dict[str, Any], chars: int) -> dict[str, Any]:
    """A call (wire shape) with each string in its arguments cut to `chars` characters; the same
    object if none is longer."""
    function = call["function"]
    arguments = function.get("arguments") or {}
    if _longest_string(arguments) <= chars:
        return call
    return {**call, "function": {**function, "arguments": _cut_strings(arguments, chars)}}


def _cut_strings(value: Any, chars: int) -> Any:
    if isinstance(value, str):
        return _shortened(value, chars, lambda left_out: ARGUMENT_CUT.format(left_out=left_out))
    if isinstance(value, dict):
        return {key: _cut_strings(item, chars) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_strings(item, chars) for item in value]
    return value


def _longest_string(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max(map(_longest_string, items), default=0)


def _longest_piece(message: dict[str, Any]) -> int:
    """The longest text of `message` that `_cut` may shorten: a tool result, or a string in the
    arguments of one of its calls (0 for any other message)."""
    if message.get("role") == "tool":
        return len(str(message.get("content") or ""))
    calls = message.get("tool_calls") or ()
    return max((_longest_string(call["function"].get("arguments")) for call in calls), default=0)


def named(message: dict[str, Any]) -> str:
    """A tool result or call as the log and a refusal name it."""
    if message.get("role") == "tool":
        return f"the result of {message.get('tool_name') or 'a tool'}"
    names = [call["function"]["name"] for call in message.get("tool_calls") or ()]
    if names:
        return f"the model's call to {', '.join(names)}"
    return f"the {message.get('role', '')} message"


def _shortened(text: str, chars: int, note: Callable[[int], str]) -> str:
    """`text`, or if it is longer than `chars` characters (and shortening saves any), its start
    and end (`chars` in all) around `note(characters left out)`."""
    left_out = len(text) - chars
    if left_out <= 0 or len(note(left_out)) >= left_out:
        return text
    head = chars // 2
    return f"{text[:head]}{note(left_out)}{text[len(text) - (chars - head) :]}"
