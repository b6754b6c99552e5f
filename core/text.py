"""Text as it enters Kaiwa, and a few words as it leaves.

Entering: what no database refuses and no platform chokes on.
Undecodable input (bytes a terminal could not decode become lone surrogates) turns into U+FFFD,
and NUL, which PostgreSQL refuses in text, is dropped. Applied where text enters: a person's
message in the dispatcher, the model's words in the model client, and every value the store
writes (the last line of defence, so that no input can fail a record). Leaving: `plural`, so
a count reads right ("1 model call"). And `parse_command`, which both the dispatcher and the turn
runner (a workflow is started by its command) read a message with.
"""

import re
from dataclasses import dataclass
from typing import Any

SURROGATE = re.compile("[\ud800-\udfff]")
COMMAND_PREFIXES = ("/", "!")


def clean(text: str) -> str:
    """`text` without NUL and with every character that cannot be encoded replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: one per byte a decoder could not read
        text = SURROGATE.sub("\ufffd", text)
    return text


def clean_all(value: Any) -> Any:
    """`clean` applied to every string inside `value` (JSON-like: dicts, lists, tuples)."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean_all(key): clean_all(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean_all(item) for item in value]
    return value


def size_in_words(count: int) -> str:
    """A size as people say it: 31 MB, 203.5 KB, 900 bytes (MB and KB of 1,024)."""
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


def plural(count: int, one: str, many: str | None = None) -> str:
    """`one` or `many` (`one` + "s" unless given) as `count` asks: 1 reply, 2 replies."""
    return one if count == 1 else many or f"{one}s"


@dataclass(frozen=True)
class Command:
    """`/name argument` (or `!name argument`): everything after the name's first blank."""

    name: str
    argument: str


def parse_command(text: str) -> Command | None:
    """`/usage` → Command("usage", ""); plain text → None."""
    stripped = text.strip()
    if len(stripped) < 2 or stripped[0] not in COMMAND_PREFIXES or not stripped[1].isalpha():
        return None
    word, *rest = stripped[1:].split(maxsplit=1)
    return Command(word.split("@", 1)[0].lower(), rest[0].strip() if rest else "")
