"""The model's Markdown as HTML for the web page: rendered here, on the server, and sanitized.

The page never parses Markdown and never sees raw model HTML: a bubble carries the text as
written and this module's HTML, which the page inserts as it is. Doing it here keeps the page
free of third-party files and keeps the one dangerous step in one place, tested in Python:

1. markdown-it-py renders CommonMark (plus tables and strikethrough) with raw HTML disabled, so
   `<script>` in a reply is text, never a tag, and with linkify off. Only http, https and mailto
   links become links (`_linkable`), relative ones too are left as text, since a reply has no page
   of its own to be relative to. An image becomes a link to it: the page loads nothing a reply
   names. A newline is a line break, as in every other channel of Kaiwa.
2. Pygments highlights code blocks, with CSS classes only (`code_css` is their style sheet,
   served as a file); an unknown language, or none, is plain text in the same frame.
3. nh3 (bindings to ammonia, a maintained Rust sanitizer) then keeps only an allow-list of tags
   and attributes, whatever the first two steps produced: a bug in either cannot hand the page a
   script, an event handler, a style or a `javascript:` link. Links open in a new tab with
   rel="noopener noreferrer nofollow".

The page's Content-Security-Policy (`channels.web.security`) forbids inline script as a second
wall behind the sanitizer.
"""

import re
from collections.abc import Sequence

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

CODE_CLASS = "code"
"""The class of the block around highlighted code; `code_css` scopes its rules under it."""

_FORMATTER = HtmlFormatter(nowrap=False, cssclass=CODE_CLASS)
_LINKABLE = re.compile(r"(?:https?|mailto):", re.IGNORECASE)

_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "code", "pre", "div", "span", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td", "a",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href"}, "ol": {"start"}}
_VALUES = {
    "div": {"class": {CODE_CLASS}},
    "span": {"class": {name for name in STANDARD_TYPES.values() if name}},
}
"""Classes are Pygments' alone: the block's, and one token class per span (a span of a token
type Pygments has no short name for keeps its text and loses its colour)."""


def to_html(markdown: str) -> str:
    """`markdown` as sanitized HTML, ready to insert into the page as it is."""
    return nh3.clean(
        _MARKDOWN.render(markdown),
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        tag_attribute_values=_VALUES,
        set_tag_attribute_values={"a": {"target": "_blank"}},
        link_rel="noopener noreferrer nofollow",
        url_schemes={"http", "https", "mailto"},
    )


def code_css() -> str:
    """The style sheet of highlighted code, every rule scoped under `.code`."""
    scope = f".{CODE_CLASS}"
    rules = _FORMATTER.get_background_style_defs(scope) + _FORMATTER.get_token_style_defs(scope)
    return "\n".join(rules) + "\n"


def _linkable(url: str) -> bool:
    """Whether a link's destination (normalized, entities decoded) may become a link."""
    return _LINKABLE.match(url) is not None


def _lexer(info: str) -> Lexer:
    language = info.split(maxsplit=1)[0] if info.strip() else ""
    try:
        return get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


def _code(
    _renderer: RendererHTML, tokens: Sequence[Token], idx: int, _options: OptionsDict, _env: EnvType
) -> str:
    token = tokens[idx]
    return highlight(token.content, _lexer(token.info), _FORMATTER)


def _image(
    renderer: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    source = str(token.attrGet("src") or "")
    text = escapeHtml(renderer.renderInlineAsText(token.children or [], options, env) or source)
    return f'<a href="{escapeHtml(source)}">{text}</a>' if source else text


def _markdown() -> MarkdownIt:
    markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
    markdown.enable(["table", "strikethrough"])
    markdown.validateLink = _linkable  # type: ignore[method-assign]
    markdown.add_render_rule("fence", _code)
    markdown.add_render_rule("code_block", _code)
    markdown.add_render_rule("image", _image)
    markdown.add_render_rule("s_open", lambda *_: "<del>")
    markdown.add_render_rule("s_close", lambda *_: "</del>")
    return markdown


_MARKDOWN = _markdown()
