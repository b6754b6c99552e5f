"""Splitting a reply into platform messages, and the model's Markdown as platform markup.

Every adapter needs both: a platform caps a message's length (Telegram at 4,096 UTF-16 code
units), and the reply streams in as Markdown the platform cannot show as it is. Both are pure
functions of the text, so an adapter only chooses its limit, its measure and its converter.

Splitting fills each message at least two thirds where it can, ending it at the break a reader
expects (a paragraph, a line, a space, and only then inside a word), and keeps code readable: a
piece that ends inside a ``` fence is closed, and the next piece reopens it, so every message
renders on its own. A candidate piece is measured whole, repairs included, with the platform's
own measure, so the limit holds by construction. A piece is decided by the text it could hold
and nothing after, so a growing reply only ever changes its last piece (give or take a trailing
newline that may yet turn out to be a paragraph break).

The converters (Telegram HTML, Slack mrkdwn) share their passes and differ only in what they
write: they read lines first (fences, headings, quotes), then each line's inline markup
through a stack of open emphasis spans. A delimiter that never meets its partner is folded back
into literal text, which is what makes a half-streamed reply safe: whatever the input, the output
is escaped text inside properly nested tags of the kinds Telegram allows (or, for Slack, escaped
text with no markup but its own). Inline markup never crosses a line, so one stray `*` cannot
restyle the rest of a reply. The splitter and the converters find fences with the same code, so
they never disagree about what is code.
"""

import html
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, groupby, takewhile
from typing import Protocol


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (how Telegram counts): characters outside the BMP count 2."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# Fences: a line of three or more backticks opens a code block (an info string may follow, but
# no backtick: "```x```" is inline code); a line of at least as many backticks closes it.
_FENCE_OPEN = re.compile(r"[ \t]*(`{3,})([^`]*)")
_FENCE_CLOSE = re.compile(r"[ \t]*(`{3,})\s*")


def _closes(line: str, ticks: str) -> bool:
    closer = _FENCE_CLOSE.fullmatch(line)
    return closer is not None and len(closer[1]) >= len(ticks)


def _code_blocks(lines: list[str]) -> Iterator[tuple[int, int, re.Match[str]]]:
    """(opening line, closing line, opener) of each fenced code block, in order.

    A block still open at the end (the reply is streaming) closes at len(lines).
    """
    first = 0
    while first < len(lines):
        if opener := _FENCE_OPEN.fullmatch(lines[first]):
            rest = range(first + 1, len(lines))
            last = next((i for i in rest if _closes(lines[i], opener[1])), len(lines))
            yield first, last, opener
            first = last
        first += 1


# --- Splitting ---------------------------------------------------------------------------------

# Where a piece may end, best first; the text a break matches is dropped at the split.
_BREAKS = (
    re.compile(r"\n(?:[ \t]*\n)+"),  # a paragraph break: one or more blank lines
    re.compile(r"\n"),
    re.compile(r"[ \t]+"),
)


@dataclass(frozen=True)
class _Fence:
    """A fenced code block of the text being split, as offsets into that text."""

    reopen: str  # what a piece starting inside the block begins with: "```python\n"
    closer: str  # what a piece ending inside the block ends with: "\n```"
    start: int  # the opening line
    body: int  # the end of the opening line
    close: int  # the closing line; the end of the text when the block is unclosed
    end: int  # the end of the closing line

    def holds(self, at: int) -> bool:
        """Whether a piece ending at `at` ends inside this block."""
        return self.body <= at <= self.close

    def forbids(self, at: int) -> bool:
        """Whether `at` is no place for a cut: inside a fence line, or right after the opening
        one, which would leave an empty block behind."""
        return self.start < at <= self.body + 1 or self.close < at < self.end


def split_message(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    """Split Markdown `text` into pieces with measure(piece) <= limit, in order, losing nothing.

    A piece ends at the last paragraph break that leaves it at least two thirds full, else at
    the last such line break, else space; failing those, at the best break anywhere, and inside a
    word only when one word alone is too long. A piece that ends inside a ``` fence is closed
    with "\\n```" and the next one reopens it with the same opener ("```python\\n"); both count
    toward the limit. Joining the pieces without those repairs gives back the text, less the
    whitespace at each split. A block still open at the very end stays open, as in the text.

    No piece is blank, since a platform would refuse to send it: an empty or blank text gives [],
    and a stretch of nothing but whitespace (a model stuck repeating newlines) is dropped.

    Raises ValueError when the limit cannot hold even a single character of the text.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    fences = _fences(text)
    pieces: list[str] = []
    start = 0
    while start < len(text) and not text[start:].isspace():
        begin = start
        piece, start = _next_piece(text, begin, limit, measure, fences)
        if not text[begin:start].isspace():
            pieces.append(piece)
    return pieces


def _fences(text: str) -> list[_Fence]:
    lines = text.split("\n")
    starts = list(accumulate((len(line) + 1 for line in lines), initial=0))

    def line_end(index: int) -> int:
        return starts[index] + len(lines[index]) if index < len(lines) else len(text)

    return [
        _Fence(
            reopen=lines[first].lstrip(" \t") + "\n",
            closer="\n" + opener[1],
            start=starts[first],
            body=line_end(first),
            close=min(starts[last], len(text)),
            end=line_end(last),
        )
        for first, last, opener in _code_blocks(lines)
    ]


def _next_piece(
    text: str, start: int, limit: int, measure: Callable[[str], int], fences: list[_Fence]
) -> tuple[str, int]:
    """The piece that starts at `start`, and where the one after it starts.

    Only a fence line longer than the limit defeats the repairs; that piece goes without them.
    """
    cut = _cut(text, start, limit, measure, fences) or _cut(text, start, limit, measure, [])
    if cut is None:
        raise ValueError(f"limit {limit} cannot hold {text[start]!r}")
    return cut


def _cut(
    text: str, start: int, limit: int, measure: Callable[[str], int], fences: list[_Fence]
) -> tuple[str, int] | None:
    """The best piece from `start` and where the next begins, repairing the given fences; None
    when not even one character fits."""
    opened = _fence_at(fences, start)
    head = opened.reopen if opened else ""
    reach = _longest_fit(
        lambda at: measure(head + text[start:at]) <= limit, start, len(text), limit
    )
    if reach == len(text):
        return head + text[start:], reach

    def piece(at: int) -> str:
        inside = _fence_at(fences, at)
        return head + text[start:at] + (inside.closer if inside else "")

    for at, resume in _cut_points(text, start, reach):
        if any(fence.forbids(at) for fence in fences):
            continue
        candidate = piece(at)
        if measure(candidate) <= limit:
            return candidate, resume
    return None


def _fence_at(fences: list[_Fence], at: int) -> _Fence | None:
    return next((fence for fence in fences if fence.holds(at)), None)


def _cut_points(text: str, start: int, reach: int) -> Iterator[tuple[int, int]]:
    """Where a piece from `start` may end, and the next begin: best first, none past `reach`.

    Each kind of break, best kind first, that leaves the piece at least two thirds full; then
    each kind anywhere; then inside a word. An early paragraph break alone would send a short
    message and push a long code block across the next split anyway.
    """
    full_enough = start + (reach - start) * 2 // 3
    kinds = [
        list(takewhile(lambda found: found.start() <= reach, pattern.finditer(text, start)))
        for pattern in _BREAKS
    ]
    for far in (True, False):
        for breaks in kinds:
            for found in reversed(breaks):
                if (found.start() >= full_enough) == far and text[start : found.start()].strip():
                    yield found.start(), found.end()
    for at in range(reach, start, -1):
        yield at, at


def _longest_fit(fits: Callable[[int], bool], start: int, stop: int, step: int) -> int:
    """The largest end in (start, stop] that fits, or start if none does.

    Assumes a longer piece never fits better. Gallops out from `start` in growing steps, so a
    long text is never measured whole just to find its first piece.
    """
    low, high = start, min(stop, start + step)
    while fits(high):
        if high == stop:
            return stop
        low, high = high, min(stop, 2 * high - start)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


# --- Markdown to platform markup ---------------------------------------------------------------

_HEADING = re.compile(r"#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*")
_QUOTE = re.compile(r"^>(?: |$)")
_BULLET = re.compile(r"[ \t]*\*[ \t]+")  # "* item": the star is a list marker, not emphasis
_LIST_ITEM = re.compile(r"([ \t]*)[-*][ \t]+")  # "- item" or "* item", and its indentation
_LINK = re.compile(
    r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"  # the text, which may hold one level of brackets
    r"\((https?://(?:[^\s()<>]|\([^\s()<>]*\))+)\)"  # the URL, which may hold (parentheses)
)
_INLINE = re.compile(
    r"(?P<code>`+)"
    # A bare URL is left alone (the platform links it itself), so a `_` or `*` in it styles
    # nothing.
    r"|(?P<url>https?://[^\s<>]*[^\s<>*_~.,;:!?'\")\]])"
    r"|(?P<link>\[)"
    r"|(?P<delimiter>\*+|_+|~+)"
)
_TAGS = {"*": "i", "_": "i", "**": "b", "__": "b", "~~": "s"}
# The spans a delimiter run opens, outermost first: "***" is bold around italic.
_OPENS = {
    "*": ("*",),
    "**": ("**",),
    "***": ("**", "*"),
    "_": ("_",),
    "__": ("__",),
    "___": ("__", "_"),
    "~~": ("~~",),
}


def _convert(
    markdown: str,
    code_block: Callable[[str, list[str]], str],
    text_lines: Callable[[list[str]], Iterable[str]],
) -> str:
    """The line pass both converters share: each fenced code block (`code_block` of its info
    string and body lines, even while its fence is still open) and the lines between them."""
    lines = markdown.split("\n")
    parts: list[str] = []
    done = 0
    for first, last, opener in _code_blocks(lines):
        parts.extend(text_lines(lines[done:first]))
        parts.append(code_block(opener[2], lines[first + 1 : last]))
        done = last + 1
    parts.extend(text_lines(lines[done:]))
    return "\n".join(parts)


def _escape(text: str) -> str:
    """&, < and > as entities: all that Telegram HTML text and Slack mrkdwn text both need."""
    return html.escape(text, quote=False)


@dataclass
class _Span:
    marker: str
    before: str = " "  # the character before the run that opened it
    parts: list[str] = field(default_factory=list)


class _Markup(Protocol):
    """What one platform makes of inline Markdown. Text is escaped the same way for both."""

    def span(self, span: _Span, inner: str, enclosing: frozenset[str], after: str) -> str:
        """A closed emphasis span, around its converted `inner` text; `enclosing` holds the tags
        of the spans around it, and `after` is the character after its closing run."""
        ...

    def code(self, code: str) -> str:
        """An inline code span, its text already escaped."""
        ...

    def link(self, label: str, url: str) -> str:
        """A link, its text already converted; the URL as written."""
        ...


class _HTML:
    def span(self, span: _Span, inner: str, enclosing: frozenset[str], after: str) -> str:
        tag = _TAGS[span.marker]
        return f"<{tag}>{inner}</{tag}>"

    def code(self, code: str) -> str:
        return f"<code>{code}</code>"

    def link(self, label: str, url: str) -> str:
        return f'<a href="{html.escape(url)}">{label or _escape(url)}</a>'


_MRKDWN_MARKS = {"b": "*", "i": "_", "s": "~"}


class _Mrkdwn:
    def span(self, span: _Span, inner: str, enclosing: frozenset[str], after: str) -> str:
        tag = _TAGS[span.marker]
        if tag in enclosing:
            return inner  # "*a *b* c*" would end the outer span early; it is bold already
        if span.before.isalnum() or after.isalnum():
            # Slack styles no part of a word: "2*3*4" as "2_3_4" would show the wrong marks.
            return f"{span.marker}{inner}{span.marker}"
        mark = _MRKDWN_MARKS[tag]
        return f"{mark}{inner}{mark}"

    def code(self, code: str) -> str:
        return f"`{code}`"

    def link(self, label: str, url: str) -> str:
        target = _escape(url).replace("|", "%7C")  # a "|" would end the URL early
        return f"<{target}|{label}>" if label else f"<{target}>"


_TO_HTML = _HTML()
_TO_MRKDWN = _Mrkdwn()


# --- Telegram HTML -----------------------------------------------------------------------------


def telegram_html(markdown: str) -> str:
    """The Markdown a model writes, as Telegram HTML (parse_mode="HTML").

    Fenced code becomes <pre><code class="language-x">, even while its fence is still open;
    inline code <code>; **bold** and __bold__ <b>; *italic* and _italic_ <i> (snake_case is not);
    ~~strike~~ <s>; [text](http…) <a>; a heading its text in <b>; "> " lines one <blockquote>.
    List markers stay text. Whatever does not pair up (a lone ** mid-stream) stays literal, so
    the output is always escaped text in well-nested b, i, s, code, pre, a and blockquote tags.
    """
    return _convert(markdown, _code_block_html, _text_html)


def visible_text(html_text: str) -> str:
    """What a person sees for `telegram_html` output: tags removed, &lt; &gt; &amp; &quot;
    unescaped."""
    text = re.sub(r"<[^>]*>", "", html_text)
    for entity, character in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&amp;", "&")):
        text = text.replace(entity, character)
    return text


def _code_block_html(info: str, body: list[str]) -> str:
    words = info.split()
    language = f' class="language-{html.escape(words[0])}"' if words else ""
    code = _escape("\n".join(body))
    return f"<pre><code{language}>{code}</code></pre>"


def _text_html(lines: list[str]) -> Iterator[str]:
    """Lines outside code blocks: a run of quoted lines as one blockquote, the rest one by one."""
    for quoted, run in groupby(lines, key=lambda line: _QUOTE.match(line) is not None):
        if quoted:
            inner = "\n".join(_line_html(_QUOTE.sub("", line, count=1)) for line in run)
            yield f"<blockquote>{inner}</blockquote>"
        else:
            yield from map(_line_html, run)


def _line_html(line: str) -> str:
    if heading := _HEADING.fullmatch(line):
        return f"<b>{_inline(heading[1], _TO_HTML)}</b>"
    bullet = _BULLET.match(line)
    marker = bullet.group() if bullet else ""
    return marker + _inline(line[len(marker) :], _TO_HTML)


# --- Slack mrkdwn ------------------------------------------------------------------------------


def slack_mrkdwn(markdown: str) -> str:
    """The Markdown a model writes, as Slack mrkdwn (the `text` of chat.postMessage / chat.update).

    Only &, < and > are escaped, in code too. **bold** and __bold__ become *bold*; *italic* and
    _italic_ _italic_; ~~strike~~ ~strike~; [text](http…) <http…|text>. A bare URL and inline
    `code` stay as they are. A fenced block is a ``` block without its language line (Slack
    would show it as code), even while its fence is still open; a heading is its text in *…* on
    its own line; "> " lines stay quotes; "- " and "* " list markers become "• ", numbers stay.
    Whatever does not pair up stays literal, and so does emphasis inside a word, which Slack
    would not show; a span inside one of its own kind loses its marks, which Slack cannot nest.
    Outside the links and a quote's leading ">", the output has no bare &, < or >.
    """
    return _convert(markdown, _code_block_mrkdwn, _text_mrkdwn)


def _code_block_mrkdwn(info: str, body: list[str]) -> str:
    return "\n".join(["```", *map(_escape, body), "```"])


def _text_mrkdwn(lines: list[str]) -> Iterator[str]:
    for line in lines:
        if _QUOTE.match(line):
            yield "> " + _line_mrkdwn(_QUOTE.sub("", line, count=1))
        else:
            yield _line_mrkdwn(line)


def _line_mrkdwn(line: str) -> str:
    heading = _HEADING.fullmatch(line)
    if heading and heading[1].strip():
        return f"*{_inline(heading[1], _TO_MRKDWN, outer=frozenset('b'))}*"
    if item := _LIST_ITEM.match(line):
        return f"{item[1]}• {_inline(line[item.end() :], _TO_MRKDWN)}"
    return _inline(line, _TO_MRKDWN)


# --- Inline Markdown ---------------------------------------------------------------------------


def _inline(
    text: str, markup: _Markup, in_link: bool = False, outer: frozenset[str] = frozenset()
) -> str:
    """One line's inline Markdown in `markup`. In a link's text (`in_link`) neither another link
    nor code is allowed (Telegram refuses them), so those stay plain text there. `outer` holds
    the tags of spans around the text (a heading's bold)."""
    spans = _Spans(markup, outer)
    position = 0
    while token := _INLINE.search(text, position):
        spans.add_text(text[position : token.start()])
        position = token.end()
        kind, run = token.lastgroup, token.group()
        if kind == "code" and (closing := _closing_backticks(text, run, position)):
            code = _code_span_text(text[position : closing.start()])
            spans.add(code if in_link else markup.code(code))
            position = closing.end()
        elif kind == "link" and not in_link and (link := _LINK.match(text, token.start())):
            label = _inline(link[1], markup, in_link=True, outer=spans.tags())
            spans.add(markup.link(label, link[2]))
            position = link.end()
        elif kind == "delimiter":
            before = text[token.start() - 1] if token.start() else " "
            after = text[position] if position < len(text) else " "
            spans.delimiter(run, before, after)
        else:
            spans.add_text(run)
    spans.add_text(text[position:])
    return spans.render()


def _closing_backticks(text: str, run: str, position: int) -> re.Match[str] | None:
    """The next run of exactly as many backticks as `run`, which ends a code span."""
    return re.compile(f"(?<!`){run}(?!`)").search(text, position)


def _code_span_text(code: str) -> str:
    """A code span's text, escaped."""
    if code.startswith(" ") and code.endswith(" ") and code.strip():
        code = code[1:-1]  # "`` `x` ``": one space each side only makes room for backticks
    return _escape(code)


def _flanking(char: str, before: str, after: str) -> tuple[bool, bool]:
    """Whether a delimiter run between these two characters may open, and may close, a span.

    A run opens only before text and closes only after it; an underscore run inside a word
    (snake_case_name) does neither.
    """
    opens, closes = not after.isspace(), not before.isspace()
    if char == "_":
        return opens and not before.isalnum(), closes and not after.isalnum()
    return opens, closes


class _Spans:
    """The emphasis spans open so far on a line, innermost last, above a root that never closes.

    A closing run closes the nearest open span it can; spans opened inside that one and never
    closed are folded back into literal text first, so spans always nest properly.
    """

    def __init__(self, markup: _Markup, outer: frozenset[str] = frozenset()) -> None:
        self._markup = markup
        self._outer = outer
        self._open = [_Span("")]

    def add(self, converted: str) -> None:
        self._open[-1].parts.append(converted)

    def add_text(self, text: str) -> None:
        self.add(_escape(text))

    def tags(self) -> frozenset[str]:
        """The tags of the spans open here, and of those around the text."""
        return self._outer | {_TAGS[span.marker] for span in self._open[1:]}

    def delimiter(self, run: str, before: str, after: str) -> None:
        opens, closes = _flanking(run[0], before, after)
        if closes:
            run = self._close(run, after)
        if opens and run in _OPENS:
            self._open.extend(_Span(marker, before) for marker in _OPENS[run])
        else:
            self.add(run)  # whatever did not pair up, if anything, stays literal

    def render(self) -> str:
        while len(self._open) > 1:
            self._fold()
        return "".join(self._open[0].parts)

    def _close(self, run: str, after: str) -> str:
        """Close what open spans `run` can, innermost first; returns what is left of the run."""
        while run and (depth := self._closable(run)):
            while len(self._open) > depth + 1:
                self._fold()
            span = self._open.pop()
            enclosing = self.tags()
            self.add(self._markup.span(span, "".join(span.parts), enclosing, after))
            run = run[len(span.marker) :]
        return run

    def _closable(self, run: str) -> int:
        """The depth of the nearest open span `run` can close; 0 (the root) for none."""
        for depth in range(len(self._open) - 1, 0, -1):
            marker = self._open[depth].marker
            if marker[0] == run[0] and len(marker) <= len(run):
                return depth
        return 0

    def _fold(self) -> None:
        """Give up on the innermost span: its marker becomes text in the span around it."""
        span = self._open.pop()
        self.add(span.marker)
        self._open[-1].parts.extend(span.parts)
