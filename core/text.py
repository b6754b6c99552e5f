"""Text as it enters Kaiwa: what no database refuses and no platform chokes on.

Undecodable input (bytes a terminal could not decode become lone surrogates) turns into U+FFFD,
and NUL, which PostgreSQL refuses in text, is dropped. Applied where text enters: a person's
message in the dispatcher, the model's words in the model client, and every value the store
writes (the last line of defence, so that no input can fail a record).
"""

import re
from typing import Any

SURROGATE = re.compile("[\ud800-\udfff]")


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
