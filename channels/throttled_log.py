"""One log line per kind of trouble per interval, however often the trouble comes.

A platform that keeps sending something an adapter cannot read (an update Telegram would fetch
again and again, an event discord.py cannot parse, a body no one signed properly) would
otherwise write a line, or a whole traceback, per occurrence: thousands a second, enough to
rotate the log away. `ThrottledLog.warning` writes the first line at once, then at most one per
`interval`, each saying how many like it were left out since the one before.
"""

import logging
import time
from collections.abc import Callable

INTERVAL_SECONDS = 10.0


class ThrottledLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: float | None = None
        self._left_out = 0

    def warning(self, message: str, *args: object) -> None:
        """Log `message % args` as a warning, unless one was logged less than `interval` ago."""
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self._left_out += 1
            return
        left_out, self._left_out, self._last = self._left_out, 0, now
        if left_out:
            message += f" ({left_out} more like it since the last such line)"
        self._logger.warning(message, *args)
