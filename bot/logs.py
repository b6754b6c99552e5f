"""Logging: stderr and a rotating file in the data directory, with secrets redacted.

Redaction happens on the fully formatted line (message, arguments and traceback together), so a
secret cannot slip through an exception's text or a library's log call.
"""

import logging
import logging.handlers
import sys
from collections.abc import Iterable
from pathlib import Path

from bot.config import LoggingConfig
from core.errors import ConfigError

REDACTED = "[redacted]"
PRINTED = {"printed": True}
"""`extra=` of a record the command also prints in its own words: kept off stderr, so a person
reads it once."""
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET_LIBRARIES = ("httpx", "httpcore", "alembic", "asyncio", "markdown_it")


class RedactingFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str], worker: str = "") -> None:
        super().__init__(FORMAT.replace("%(name)s", f"[{worker}] %(name)s") if worker else FORMAT)
        self._secrets = sorted({secret for secret in secrets if secret}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        for secret in self._secrets:
            line = line.replace(secret, REDACTED)
        return line


def setup_logging(
    config: LoggingConfig,
    data_dir: Path,
    secrets: Iterable[str],
    *,
    debug: bool = False,
    worker: str = "",
) -> None:
    """The file log in `data_dir` and stderr; `debug` sends DEBUG lines to stderr too; a
    cluster's `worker` names itself on every line. A folder Kaiwa may not write is a
    `ConfigError` naming the setting."""
    formatter = RedactingFormatter(secrets, worker)
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
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel("DEBUG" if debug else config.stderr_level.upper())
    to_stderr.addFilter(lambda record: not getattr(record, "printed", False))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in (to_file, to_stderr):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(min(to_file.level, to_stderr.level))
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
