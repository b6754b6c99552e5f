"""Logging: stderr and a rotating file in the data directory, with secrets redacted.

`[logging].file = ""` leaves the file out (stderr only): a container's log is its stderr, and
workers sharing a data folder must not share one file.

Redaction happens on the fully formatted line (message, arguments and traceback together), so a
secret cannot slip through an exception's text or a library's log call.

Lines are text for a person by default. With `[logging].format = "json"` each is one JSON
object (`JsonFormatter`) for a log shipper: time (UTC, ISO 8601), level, logger, worker, place,
turn, message, and the traceback as `exception`. Place and turn come from the turn the code
runs for (`core.turns.turn.LOGGED_TURN`), null outside one; a message's text never appears,
as in the text lines.
"""

import json
import logging
import logging.handlers
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from bot.config import LoggingConfig
from core.errors import ConfigError
from core.turns.turn import LOGGED_TURN

REDACTED = "[redacted]"
PRINTED = {"printed": True}
"""`extra=` of a record the command also prints in its own words: kept off stderr, so a person
reads it once."""
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET_LIBRARIES = ("httpx", "httpcore", "alembic", "asyncio", "markdown_it")


class Redaction:
    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({secret for secret in secrets if secret}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


class RedactingFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str], worker: str = "") -> None:
        super().__init__(FORMAT.replace("%(name)s", f"[{worker}] %(name)s") if worker else FORMAT)
        self._redact = Redaction(secrets)

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line; every text in it redacted before it is encoded, so an escape
    cannot hide a secret."""

    def __init__(self, secrets: Iterable[str], worker: str = "") -> None:
        super().__init__()
        self._redact = Redaction(secrets)
        self._worker = worker or None

    def format(self, record: logging.LogRecord) -> str:
        turn = LOGGED_TURN.get()
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "worker": self._worker,
            "place": turn.place if turn else None,
            "turn": turn.turn_id if turn else None,
            "message": self._redact(record.getMessage()),
        }
        if record.exc_info:
            line["exception"] = self._redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


def setup_logging(
    config: LoggingConfig,
    data_dir: Path,
    secrets: Iterable[str],
    *,
    debug: bool = False,
    worker: str = "",
) -> None:
    """The file log in `data_dir` (unless `[logging].file` is "") and stderr; `debug` sends
    DEBUG lines to stderr too; a cluster's `worker` names itself on every line. A folder Kaiwa
    may not write is a `ConfigError` naming the setting."""
    shape = JsonFormatter if config.format == "json" else RedactingFormatter
    formatter = shape(secrets, worker)
    handlers: list[logging.Handler] = [_file_handler(config, data_dir)] if config.file else []
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel("DEBUG" if debug else config.stderr_level.upper())
    to_stderr.addFilter(lambda record: not getattr(record, "printed", False))
    handlers.append(to_stderr)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(min(handler.level for handler in handlers))
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


def _file_handler(config: LoggingConfig, data_dir: Path) -> logging.Handler:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        to_file = logging.handlers.RotatingFileHandler(
            data_dir / config.file, maxBytes=config.max_bytes, backupCount=config.backups
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot write the log {data_dir / config.file} ({exc.strerror or exc}); set "
            "[storage].data_dir to a folder Kaiwa may write"
        ) from exc
    to_file.setLevel(config.level.upper())
    return to_file
