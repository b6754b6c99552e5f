"""The model's Markdown as the page's HTML: what a reply may hold comes out as text or as an
allowed tag, never as a script, an event handler, a style or a link to anything but http, https
or mailto; code is highlighted with classes only; tables and links render."""

import re
from html.parser import HTMLParser

import pytest

from channels.web.markup import code_css, to_html

ALLOWED_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "code", "pre", "div", "span", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td", "a",
}  # fmt: skip
LINK_SCHEMES = re.compile(r"(?:https?|mailto):")


class Parsed(HTMLParser):
    """The elements of a piece of HTML, as a browser's parser sees them, and its text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text += data

    def tags(self, name: str) -> list[dict[str, str | None]]:
        return [attributes for tag, attributes in self.elements if tag == name]


def inert(html: str) -> Parsed:
    """`html` parsed, once it is shown to hold nothing that runs, styles or leads elsewhere."""
    parsed = Parsed(html)
    for tag, attributes in parsed.elements:
        assert tag in ALLOWED_TAGS, html
        for name, value in attributes.items():
            assert not name.startswith("on") and name != "style", html
            if name == "href":
                assert LINK_SCHEMES.match(value or ""), html
    return parsed


@pytest.mark.parametrize(
    "attack",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        '<a href="data:text/html,<script>alert(1)</script>">x</a>',
        '<iframe src="https://evil.example/"></iframe>',
        "<svg onload=alert(1)>",
        '<p style="background:url(javascript:alert(1))">x</p>',
        '<b onclick="alert(1)">bold</b>',
        "<div>\n<script>alert(1)</script>\n</div>",
        "| a |\n|---|\n| <img src=x onerror=alert(1)> |",
        "> <svg onload=alert(1)>",
    ],
)
def test_raw_html_in_a_reply_is_shown_as_text(attack: str) -> None:
    parsed = inert(to_html(attack))
    assert "<" in parsed.text, "the tag is there, to read"
    assert not parsed.tags("script") and not parsed.tags("img") and not parsed.tags("svg")


@pytest.mark.parametrize(
    "attack",
    [
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x]( javascript:alert(1))",
        "[x](jav&#x09;ascript:alert(1))",
        "[x](&#106;avascript:alert(1))",
        "[x](java\\\nscript:alert(1))",
        "<javascript:alert(1)>",
        "[x][ref]\n\n[ref]: javascript:alert(1)",
        "[x](vbscript:msgbox(1))",
        "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        "![x](javascript:alert(1))",
        "![x](data:image/svg+xml,<svg onload=alert(1)>)",
        "[x](file:///etc/passwd)",
    ],
)
def test_a_link_to_anything_but_http_https_or_mailto_is_no_link(attack: str) -> None:
    parsed = inert(to_html(attack))
    assert not any(attributes.get("href") for attributes in parsed.tags("a"))


def test_a_link_opens_in_a_new_tab_without_the_page_behind_it() -> None:
    parsed = inert(to_html("See [Kaiwa](https://example.com/a?b=1&c=2) or <mailto:op@example.com>"))

    opens_apart = {"target": "_blank", "rel": "noopener noreferrer nofollow"}
    assert parsed.tags("a") == [
        {"href": "https://example.com/a?b=1&c=2", **opens_apart},
        {"href": "mailto:op@example.com", **opens_apart},
    ]


def test_a_relative_link_is_text_since_a_reply_has_no_page_of_its_own() -> None:
    parsed = inert(to_html("[the API](/api/conversations)"))
    assert not parsed.tags("a")
    assert parsed.text.strip() == "[the API](/api/conversations)"


def test_an_image_is_a_link_to_it_and_never_loaded() -> None:
    parsed = inert(to_html("![a diagram](https://example.com/d.png)"))
    assert [a["href"] for a in parsed.tags("a")] == ["https://example.com/d.png"]
    assert parsed.text.strip() == "a diagram"


def test_a_python_block_is_highlighted_with_classes_only() -> None:
    html = to_html("```python\ndef greet(name):\n    return f'<b>{name}</b>'\n```")
    parsed = inert(html)

    assert parsed.tags("div") == [{"class": "code"}]
    classes = {attributes.get("class") for attributes in parsed.tags("span")}
    assert {"k", "nf"} <= classes, "a keyword, a function's name"
    assert parsed.text.strip() == "def greet(name):\n    return f'<b>{name}</b>'"


@pytest.mark.parametrize("fence", ["```nosuchlanguage", "```", "    "])
def test_code_in_no_language_known_is_plain_text_in_the_same_frame(fence: str) -> None:
    source = "x = '<script>'"
    markdown = f"{fence}{source}" if fence == "    " else f"{fence}\n{source}\n```"
    parsed = inert(to_html(markdown))
    assert parsed.tags("div") == [{"class": "code"}]
    assert parsed.text.strip() == source


def test_a_reply_in_markdown_keeps_its_structure() -> None:
    markdown = "\n".join(
        [
            "# Plan",
            "",
            "First line",
            "second line, ~~gone~~ **bold** *slanted* `code`",
            "",
            "3. three",
            "4. four",
            "",
            "> quoted",
            "",
            "---",
            "",
            "| name | size |",
            "|:-----|-----:|",
            "| a    | 1    |",
        ]
    )
    parsed = inert(to_html(markdown))

    tags = [tag for tag, _ in parsed.elements]
    for tag in ["h1", "br", "del", "strong", "em", "code", "li", "blockquote", "hr"]:
        assert tag in tags, tag
    assert parsed.tags("ol") == [{"start": "3"}], "the list goes on at three"
    table = ["table", "thead", "tr", "th", "th", "tbody", "tr", "td", "td"]
    assert tags[tags.index("table") :] == table


def test_a_long_reply_renders_whole() -> None:
    section = (
        "## Step {n}\n\nSome *text* with `code` and [a link](https://example.com/{n}).\n\n"
        "- one\n- two\n\n```python\nfor i in range({n}):\n    print(i)\n```\n\n"
        "| a | b |\n|---|---|\n| {n} | x |\n\n"
    )
    markdown = "".join(section.format(n=n) for n in range(700))
    assert len(markdown) > 100_000

    parsed = inert(to_html(markdown))

    assert len(parsed.tags("table")) == len(parsed.tags("div")) == 700
    assert parsed.tags("a")[-1]["href"] == "https://example.com/699"


def test_the_code_style_sheet_styles_only_highlighted_code() -> None:
    rules = code_css().splitlines()
    assert rules and all(rule.startswith(".code") for rule in rules)
    assert any(rule.startswith(".code .k ") for rule in rules), "keywords have a style"
