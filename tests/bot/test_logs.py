"""Log lines never carry a secret, wherever in the line it would have appeared; as JSON, each is
one object a log shipper reads, naming the place and turn it belongs to."""

import json
import logging
import sys
from collections.abc import Iterator

import pytest

from bot.logs import JsonFormatter, RedactingFormatter
from tests.fakes.ollama import Text
from tests.harness import PLACE, Bot

SECRET = 'hunter2-"token\\'
"""A secret with characters JSON escapes: redacted before encoding, or the escape would hide it."""


def failed_login() -> logging.LogRecord:
    try:
        raise RuntimeError(f"login failed with {SECRET}")
    except RuntimeError:
        return logging.LogRecord(
            "kaiwa", logging.ERROR, __file__, 1, "token %s", (SECRET,), sys.exc_info()
        )


def test_secrets_are_redacted_from_every_log_line() -> None:
    line = RedactingFormatter([SECRET]).format(failed_login())
    assert SECRET not in line
    assert "token [redacted]" in line
    assert "RuntimeError: login failed with [redacted]" in line


def test_a_json_line_is_one_object_with_every_field_and_no_secret() -> None:
    line = JsonFormatter([SECRET], worker="w1").format(failed_login())

    assert "\n" not in line and "hunter2" not in line
    logged = json.loads(line)
    assert logged["time"].endswith("+00:00") and logged["time"][10] == "T"
    assert {key: logged[key] for key in ("level", "logger", "worker", "place", "turn")} == {
        "level": "ERROR",
        "logger": "kaiwa",
        "worker": "w1",
        "place": None,
        "turn": None,
    }
    assert logged["message"] == "token [redacted]"
    assert logged["exception"].endswith("RuntimeError: login failed with [redacted]")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter([]))
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    lines, root = Lines(), logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)  # not `root.level =`: loggers cache what they let through
    root.addHandler(lines)
    yield lines
    root.removeHandler(lines)
    root.setLevel(level)


async def test_a_turns_lines_name_its_place_and_turn(bot: Bot, json_lines: Lines) -> None:
    bot.ollama.script(Text("Hello."))
    await bot.send("hi, my secret plan")
    await bot.channel.finished()
    (turn,) = await bot.turns()

    said = f"turn {turn.id} place={PLACE} "
    (ended,) = [line for line in json_lines.lines if str(line["message"]).startswith(said)]
    assert (ended["place"], ended["turn"], ended["logger"]) == (
        PLACE,
        turn.id,
        "core.turns.endings",
    )
    assert not [line for line in json_lines.lines if "secret plan" in json.dumps(line)], (
        "a message's text stays out of the log"
    )
