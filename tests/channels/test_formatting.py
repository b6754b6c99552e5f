"""Splitting replies at a platform's limit, and the model's Markdown as platform markup."""

import random
import re
from html.parser import HTMLParser

import pytest

from channels.formatting import (
    slack_mrkdwn,
    split_message,
    telegram_html,
    utf16_len,
    visible_text,
)

TELEGRAM_LIMIT = 4096
FENCE_LINE = re.compile(r"^[ \t]*```.*$", re.MULTILINE)


def squashed(text: str) -> str:
    """The text without fence lines or whitespace: what a split must keep, repairs aside.

    Join pieces with newlines before squashing them, so each fence line stays on its own."""
    return re.sub(r"\s", "", FENCE_LINE.sub("", text))


def fences_balanced(piece: str) -> bool:
    return len(FENCE_LINE.findall(piece)) % 2 == 0


# --- utf16_len ----------------------------------------------------------------------------------


def test_utf16_len_counts_astral_characters_twice() -> None:
    assert utf16_len("") == 0
    assert utf16_len("héllo") == 5
    assert utf16_len("hi 😀") == 5
    assert utf16_len("👍🏽") == 4, "an emoji with a skin tone is two astral characters"
    assert utf16_len("\ud800") == 1, "a lone surrogate is one code unit, not an error"


# --- split_message -------------------------------------------------------------------------------


def test_empty_and_fitting_texts() -> None:
    assert split_message("", 10) == []
    assert split_message("hello", 10) == ["hello"]
    assert split_message(" hello\n", 10) == [" hello\n"]


def test_no_piece_is_blank() -> None:
    assert split_message(" \n ", 10) == []
    assert split_message("\n" * 25 + "hi", 10) == ["\n" * 5 + "hi"]
    assert split_message("hi" + " " * 25, 10) == ["hi"]


def test_splits_at_a_paragraph_break_before_a_later_line_break() -> None:
    text = "first paragraph here\n\nsecond\nthird line"
    assert split_message(text, 30) == ["first paragraph here", "second\nthird line"]


def test_an_early_paragraph_break_loses_to_a_fuller_piece() -> None:
    text = "short\n\nline one\nline two\nline three"
    assert split_message(text, 26) == ["short\n\nline one\nline two", "line three"]
    assert split_message("short\n\n" + "word " * 10, 30)[0] == "short\n\nword word word word"


def test_blank_lines_with_spaces_are_a_paragraph_break() -> None:
    assert split_message("one two\n  \t\nthree", 10) == ["one two", "three"]


def test_splits_at_the_last_line_break_that_fits() -> None:
    text = "line one\nline two\nline three"
    assert split_message(text, 20) == ["line one\nline two", "line three"]


def test_splits_at_the_last_space_that_fits() -> None:
    assert split_message("alpha beta gamma delta", 12) == ["alpha beta", "gamma delta"]


def test_cuts_inside_a_word_only_when_the_word_alone_is_too_long() -> None:
    assert split_message("short " + "x" * 12, 10) == ["short", "x" * 10, "xx"]
    assert split_message("a" * 12, 5) == ["aaaaa", "aaaaa", "aa"]


def test_exact_limit_edges() -> None:
    assert split_message("abcde", 5) == ["abcde"]
    assert split_message("abcdef", 5) == ["abcde", "f"]
    assert split_message("abcde fghij", 5) == ["abcde", "fghij"]
    assert split_message("abcde\n\n", 5) == ["abcde"], "nothing but whitespace after a split"
    # Each piece with its closer or reopener is exactly 12 long.
    assert split_message("```\naaaa\nbbbb\n```", 12) == ["```\naaaa\n```", "```\nbbbb\n```"]


def test_indentation_after_a_line_break_is_kept() -> None:
    text = "```python\ndef f():\n    return 1\n```"
    assert split_message(text, 30) == [
        "```python\ndef f():\n```",
        "```python\n    return 1\n```",
    ]


def test_a_long_reply_with_code_across_the_telegram_limit() -> None:
    paragraph = " ".join(["Lorem ipsum dolor sit amet."] * 20)
    code = "\n".join(f"print({n})  # line {n} of the example" for n in range(90))
    head = "\n\n".join([paragraph] * 4) + "\n\n```python\n" + code + "\n```\n\n"
    text = head + ("More words here. " * 600)[: 9000 - len(head)]
    assert len(text) == 9000
    assert len(head) > TELEGRAM_LIMIT > head.index("```python"), "the block spans the limit"

    pieces = split_message(text, TELEGRAM_LIMIT, measure=utf16_len)

    assert len(pieces) == 3
    assert all(utf16_len(piece) <= TELEGRAM_LIMIT for piece in pieces)
    assert all(fences_balanced(piece) for piece in pieces)
    assert pieces[0].endswith("\n```")
    assert pieces[1].startswith("```python\n")
    assert squashed("\n".join(pieces)) == squashed(text)


def test_measure_in_utf16_when_emoji_push_a_piece_over() -> None:
    text = "😀😀😀 😀😀😀"
    assert split_message(text, 8) == [text], "7 characters fit in 8"
    assert split_message(text, 8, measure=utf16_len) == ["😀😀😀", "😀😀😀"], "13 code units do not"
    assert split_message("😀" * 5, 4, measure=utf16_len) == ["😀😀", "😀😀", "😀"]


def test_a_block_still_open_at_the_end_stays_open() -> None:
    pieces = split_message("```sh\nls\npwd\nwho", 15)
    assert pieces == ["```sh\nls\n```", "```sh\npwd\nwho"]


def test_a_fence_line_longer_than_the_limit_is_cut_without_repairs() -> None:
    text = "```" + "x" * 20 + "\ncode here\n```"
    pieces = split_message(text, 12)
    assert all(len(piece) <= 12 for piece in pieces)
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)


def test_a_limit_that_cannot_hold_one_character() -> None:
    with pytest.raises(ValueError):
        split_message("hello", 0)
    with pytest.raises(ValueError):
        split_message("a😀", 1, measure=utf16_len)


def random_markdown(rng: random.Random) -> str:
    blocks = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.3:
            lines = [" " * rng.randint(0, 4) + random_words(rng) for _ in range(rng.randint(0, 5))]
            blocks.append("\n".join(["```py", *lines, "```"]))
        else:
            blocks.append("\n".join(random_words(rng) for _ in range(rng.randint(1, 4))))
    return rng.choice(["\n\n", "\n"]).join(blocks)


def random_words(rng: random.Random) -> str:
    words = ["a", "tiny", "word", "😀", "ok", "longerword", "x" * 45, "é"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))


def test_random_splits_fit_keep_everything_and_balance_their_fences() -> None:
    rng = random.Random(20240611)
    for _ in range(500):
        text = random_markdown(rng)
        limit = rng.randint(16, 90)
        measure = rng.choice([len, utf16_len])

        pieces = split_message(text, limit, measure)

        assert all(measure(piece) <= limit for piece in pieces), (text, limit)
        assert all(fences_balanced(piece) for piece in pieces), (text, limit)
        assert squashed("\n".join(pieces)) == squashed(text), (text, limit)


def test_a_growing_text_changes_only_its_last_piece() -> None:
    """What streaming relies on to leave messages already sent alone. A text that ends in
    whitespace cannot know yet whether its last line break is a paragraph break, so the check
    takes the texts that do not."""
    rng = random.Random(5)
    for _ in range(12):
        text = random_markdown(rng)
        limit = rng.randint(16, 90)
        final = split_message(text, limit, utf16_len)
        for end in range(0, len(text), 7):
            if not text[:end].endswith((" ", "\n")):
                growing = split_message(text[:end], limit, utf16_len)
                sent = growing[:-1]
                assert sent == final[: len(sent)], (text[:end], limit)


# --- telegram_html -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
        ("*italic* and _italic_", "<i>italic</i> and <i>italic</i>"),
        ("~~gone~~", "<s>gone</s>"),
        ("***both***", "<b><i>both</i></b>"),
        ("use `x < y`", "use <code>x &lt; y</code>"),
        ("``a`b``", "<code>a`b</code>"),
        ("[docs](https://x.io/a_(b))", '<a href="https://x.io/a_(b)">docs</a>'),
        ("## Plan ##\nthen", "<b>Plan</b>\nthen"),
        ("#hashtag", "#hashtag"),
        ("> one\n> two\nafter", "<blockquote>one\ntwo</blockquote>\nafter"),
        ("* one *it*\n- two\n1. three", "* one <i>it</i>\n- two\n1. three"),
        ("a * b * c", "a * b * c"),
        ("snake_case_name and _x_", "snake_case_name and <i>x</i>"),
        ("see https://x.io/__init__.py", "see https://x.io/__init__.py"),
    ],
)
def test_each_construct(markdown: str, html: str) -> None:
    assert telegram_html(markdown) == html


def test_fenced_code_is_escaped_and_left_alone() -> None:
    markdown = "Run:\n```python\nif a < b and **c**:\n    print('&')\n```\ndone"
    assert telegram_html(markdown) == (
        "Run:\n"
        '<pre><code class="language-python">if a &lt; b and **c**:\n'
        "    print('&amp;')</code></pre>\n"
        "done"
    )
    assert telegram_html("```\nplain\n```") == "<pre><code>plain</code></pre>"


def test_nesting() -> None:
    assert telegram_html("[**bold** link](https://x.io)") == (
        '<a href="https://x.io"><b>bold</b> link</a>'
    )
    assert telegram_html("**see [x](https://x.io)**") == '<b>see <a href="https://x.io">x</a></b>'
    assert telegram_html("**run `a**b` now**") == "<b>run <code>a**b</code> now</b>"
    assert telegram_html("[`code` link](https://x.io)") == (
        '<a href="https://x.io">code link</a>'
    ), "Telegram does not allow code inside a link"
    assert telegram_html("*a **b* c**") == "<i>a **b</i> c**", "crossed spans do not cross"


def test_escaping() -> None:
    assert telegram_html('<script>alert("x") & more</script>') == (
        '&lt;script&gt;alert("x") &amp; more&lt;/script&gt;'
    )
    assert telegram_html('[q](https://x.io/?a=1&b="2")') == (
        '<a href="https://x.io/?a=1&amp;b=&quot;2&quot;">q</a>'
    )


def test_a_streaming_prefix_stays_literal_until_it_closes() -> None:
    assert telegram_html("The **answer is `4") == "The **answer is `4"
    assert telegram_html("Run:\n```bash\nls -la <dir>") == (
        'Run:\n<pre><code class="language-bash">ls -la &lt;dir&gt;</code></pre>'
    )
    assert telegram_html("**wait\n```") == "**wait\n<pre><code></code></pre>"


def test_visible_text_round_trip() -> None:
    plain = 'if a < b && c > "d": print(1)\n\n- item'
    assert visible_text(telegram_html(plain)) == plain
    assert visible_text(telegram_html("**a** &lt; `<b>`")) == "a &lt; <b>"


ALLOWED_TAGS = {"b", "i", "s", "code", "pre", "a", "blockquote"}
ENTITIES = {"lt", "gt", "amp", "quot"}


class TelegramHTMLChecker(HTMLParser):
    """Fails on anything Telegram's parse_mode="HTML" would reject, or nest in a way its entities
    cannot: unknown tags or attributes, bad nesting, unclosed tags, unescaped text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in ALLOWED_TAGS, tag
        assert "code" not in self.open, "nothing inside code"
        assert tag == "code" or "pre" not in self.open, "pre holds only code"
        assert tag not in ("pre", "blockquote") or not self.open, f"{tag} only at the top"
        assert tag not in ("a", "code") or "a" not in self.open, "a link holds no link or code"
        names = [name for name, _ in attrs]
        if tag == "a":
            assert names == ["href"]
        elif tag == "code" and self.open[-1:] == ["pre"]:
            assert names in ([], ["class"])
        else:
            assert names == [], (tag, attrs)
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, (tag, self.open)
        self.open.pop()

    def handle_data(self, data: str) -> None:
        assert not set(data) & set("<>&"), data

    def handle_entityref(self, name: str) -> None:
        assert name in ENTITIES, name

    def unknown_decl(self, data: str) -> None:
        raise AssertionError(data)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raise AssertionError(tag)

    def handle_charref(self, name: str) -> None:
        raise AssertionError(name)

    def handle_comment(self, data: str) -> None:
        raise AssertionError(data)

    def handle_decl(self, decl: str) -> None:
        raise AssertionError(decl)

    def handle_pi(self, data: str) -> None:
        raise AssertionError(data)

    def check(self, html: str) -> None:
        self.feed(html)
        self.close()
        assert not self.open, self.open


FUZZ_TOKENS = [
    *("a", "b", "7", " ", " ", "\n", "\n"),
    *("*", "**", "* ", "_", "__", "`", "```", "~", "~~"),
    *("[", "]", "(", ")", "](https://x.io)", "<", ">", "> ", "&", '"', "#", "# "),
]
FUZZ_LETTERS = "ab7"  # absent from the link's URL, which only the href shows


def test_any_input_gives_valid_html_that_shows_every_letter() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        markdown = "".join(rng.choice(FUZZ_TOKENS) for _ in range(rng.randint(0, 40)))

        html = telegram_html(markdown)

        TelegramHTMLChecker().check(html)
        # A fence line's info string becomes the language class, out of sight.
        expected = [c for c in FENCE_LINE.sub("", markdown) if c in FUZZ_LETTERS]
        shown = visible_text(html)
        remaining = iter(shown)
        assert all(c in remaining for c in expected), (markdown, html)
        # Markup only ever hides characters, so measuring the Markdown bounds the message.
        assert utf16_len(shown) <= utf16_len(markdown), (markdown, html)


# --- slack_mrkdwn --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __bold__", "*bold* and *bold*"),
        ("*italic* and _italic_", "_italic_ and _italic_"),
        ("~~gone~~", "~gone~"),
        ("***both***", "*_both_*"),
        ("use `x < y`", "use `x &lt; y`"),
        ("``a `b` c``", "`a `b` c`"),
        ("[docs](https://x.io/a_(b))", "<https://x.io/a_(b)|docs>"),
        ("[](https://x.io)", "<https://x.io>"),
        ("[no](ftp://x.io)", "[no](ftp://x.io)"),
        ("a * b * c", "a * b * c"),
        ("snake_case_name and _x_", "snake_case_name and _x_"),
        ("2*3*4 and foo**bar**baz", "2*3*4 and foo**bar**baz"),  # Slack styles no part of a word
        ("#hashtag", "#hashtag"),
    ],
)
def test_slack_each_construct(markdown: str, mrkdwn: str) -> None:
    assert slack_mrkdwn(markdown) == mrkdwn


def test_slack_bare_urls_are_left_for_slack_to_link() -> None:
    assert slack_mrkdwn("see https://x.io/__init__.py and https://x.io/a_b*c*") == (
        "see https://x.io/__init__.py and https://x.io/a_b*c*"
    )
    assert slack_mrkdwn("https://x.io/?a=1&b=2.") == "https://x.io/?a=1&amp;b=2."
    assert slack_mrkdwn("**at https://x.io/a_b**") == "*at https://x.io/a_b*"


def test_slack_nesting() -> None:
    assert slack_mrkdwn("[**bold** link](https://x.io)") == "<https://x.io|*bold* link>"
    assert slack_mrkdwn("**see [x](https://x.io)**") == "*see <https://x.io|x>*"
    assert slack_mrkdwn("**run `a**b` now**") == "*run `a**b` now*", "code inside bold stays code"
    assert slack_mrkdwn("*a **b** c*") == "_a *b* c_"
    assert slack_mrkdwn("__a **b** c__") == "*a b c*", "Slack cannot nest bold in bold"
    assert slack_mrkdwn("**[__x__](https://x.io)**") == "*<https://x.io|x>*"
    assert slack_mrkdwn("[`code` link](https://x.io)") == "<https://x.io|code link>"
    assert slack_mrkdwn("*a **b* c**") == "_a **b_ c**", "crossed spans do not cross"


def test_slack_escaping() -> None:
    assert slack_mrkdwn("a < b & c > d") == "a &lt; b &amp; c &gt; d"
    assert slack_mrkdwn('<script>alert("x") & more</script>') == (
        '&lt;script&gt;alert("x") &amp; more&lt;/script&gt;'
    )
    assert slack_mrkdwn("<!here> <@U123> &lt;") == "&lt;!here&gt; &lt;@U123&gt; &amp;lt;"
    assert slack_mrkdwn("[a > b](https://x.io/?q=1&r=a|b)") == (
        "<https://x.io/?q=1&amp;r=a%7Cb|a &gt; b>"
    ), "a | in the URL would end it early"


def test_slack_headings() -> None:
    assert slack_mrkdwn("# Title\ntext") == "*Title*\ntext"
    assert slack_mrkdwn("## Plan ##") == "*Plan*"
    assert slack_mrkdwn("### **Bold** and _it_") == "*Bold and _it_*"
    assert slack_mrkdwn("> # Quoted") == "> *Quoted*"
    assert slack_mrkdwn("####### seven") == "####### seven"
    assert slack_mrkdwn("#  ") == "#  "


def test_slack_lists() -> None:
    markdown = "- one\n* two *it*\n1. three **b**\n  - nested\n10. ten\n-not\n**b** x"
    assert slack_mrkdwn(markdown) == (
        "• one\n• two _it_\n1. three *b*\n  • nested\n10. ten\n-not\n*b* x"
    )


def test_slack_quotes() -> None:
    assert slack_mrkdwn("> one **b**\n> two\n>\nafter") == "> one *b*\n> two\n> \nafter"
    assert slack_mrkdwn(">not a quote\n> > inner") == "&gt;not a quote\n> &gt; inner"


def test_slack_fenced_code_drops_the_language_and_is_only_escaped() -> None:
    markdown = "Run:\n```python\nif a < b and **c**:\n    print('&')\n```\ndone"
    assert slack_mrkdwn(markdown) == (
        "Run:\n```\nif a &lt; b and **c**:\n    print('&amp;')\n```\ndone"
    )
    assert slack_mrkdwn("  ```sh title\n_x_\n````") == "```\n_x_\n```"
    assert slack_mrkdwn("```\n\n```") == "```\n\n```"
    # Slack cannot nest blocks: the inner fence would end this one early there.
    assert slack_mrkdwn("````md\n```py\nx\n```\n````") == "```\n```py\nx\n```\n```"


def test_slack_a_streaming_prefix_stays_literal_and_its_code_block_closed() -> None:
    assert slack_mrkdwn("The **answer is `4") == "The **answer is `4"
    assert slack_mrkdwn("Run:\n```bash\nls -la <dir>") == "Run:\n```\nls -la &lt;dir&gt;\n```"
    assert slack_mrkdwn("**wait\n```") == "**wait\n```\n```"
    assert slack_mrkdwn("**so [x](https://x.io") == "**so [x](https://x.io"


def slack_fences(mrkdwn: str) -> list[str]:
    return [line for line in mrkdwn.split("\n") if line == "```"]


def test_slack_pieces_of_a_split_reply_are_whole_code_blocks() -> None:
    code = "\n".join(f"if n < {n}: print(n)  # line {n}" for n in range(200))
    text = "Intro **text**.\n\n```python\n" + code + "\n```\n\nAfter _that_."
    assert len(text) > 4000

    pieces = [slack_mrkdwn(piece) for piece in split_message(text, 4000)]

    assert len(pieces) == 2
    assert pieces[0].startswith("Intro *text*.\n\n```\nif n &lt; 0: print(n)")
    assert pieces[0].endswith("\n```")
    assert pieces[1].startswith("```\nif n &lt; ")
    assert pieces[1].endswith("```\n\nAfter _that_.")
    assert all(len(slack_fences(piece)) == 2 for piece in pieces)


SLACK_LINK = re.compile(r"<(https?://[^\s<>|]+)(?:\|([^<>\n]*))?>")
SLACK_QUOTE = re.compile(r"^> ", re.MULTILINE)
SLACK_ENTITY = re.compile(r"&(?:lt|gt|amp);")
FENCE_OPENER = re.compile(r"^[ \t]*`{3,}[^`\n]*$", re.MULTILINE)


def slack_visible(mrkdwn: str) -> str:
    """Roughly what Slack shows: a link as its text, entities unescaped."""
    text = SLACK_LINK.sub(lambda link: link[2] if link[2] is not None else link[1], mrkdwn)
    for entity, character in (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&")):
        text = text.replace(entity, character)
    return text


SLACK_FUZZ_TOKENS = [
    *("a", "b", "c", "7", " ", " ", "\n", "\n", "- ", "1. "),
    *("*", "**", "* ", "_", "__", "`", "```", "~", "~~"),
    *("[", "]", "(", ")", "](https://x.io)", "https://x.io/_x_/", "<", ">", "> ", "&", "#", "# "),
]
SLACK_FUZZ_LETTERS = "abc7"  # absent from the URLs: a link shows its text, not its URL


def test_slack_any_input_is_escaped_and_shows_every_letter() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        markdown = "".join(rng.choice(SLACK_FUZZ_TOKENS) for _ in range(rng.randint(0, 40)))

        mrkdwn = slack_mrkdwn(markdown)

        # A quote's leading ">" and links are the only markup made of &, < or >.
        unquoted = SLACK_QUOTE.sub("", mrkdwn)
        bare = SLACK_ENTITY.sub("", SLACK_LINK.sub(r"\1 \2", unquoted))
        assert not set(bare) & set("<>&"), (markdown, mrkdwn)
        expected = [c for c in FENCE_OPENER.sub("", markdown) if c in SLACK_FUZZ_LETTERS]
        remaining = iter(slack_visible(mrkdwn))
        assert all(c in remaining for c in expected), (markdown, mrkdwn)
