"""Log lines never carry a secret, wherever in the line it would have appeared."""

import logging
import sys

from bot.logs import RedactingFormatter


def test_secrets_are_redacted_from_every_log_line() -> None:
    formatter = RedactingFormatter(["hunter2-token"])
    try:
        raise RuntimeError("login failed with hunter2-token")
    except RuntimeError:
        record = logging.LogRecord(
            "kaiwa", logging.ERROR, __file__, 1, "token %s", ("hunter2-token",), sys.exc_info()
        )
    line = formatter.format(record)
    assert "hunter2-token" not in line
    assert "token [redacted]" in line
    assert "RuntimeError: login failed with [redacted]" in line
