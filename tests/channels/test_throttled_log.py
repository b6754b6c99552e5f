"""ThrottledLog: the first line at once, then at most one per interval, counting the rest."""

import logging

import pytest

from channels.throttled_log import ThrottledLog

logger = logging.getLogger("tests.throttled")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == logger.name]


def test_one_line_per_interval_saying_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = ThrottledLog(logger, interval=10, clock=clock)
    for number in range(5):
        log.warning("update %s could not be read", number)
        clock.now += 1
    clock.now += 10
    log.warning("update %s could not be read", 99)

    assert lines(caplog) == [
        "update 0 could not be read",
        "update 99 could not be read (4 more like it since the last such line)",
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_after_a_quiet_interval_a_line_has_nothing_to_add(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = ThrottledLog(logger, interval=10, clock=clock)
    log.warning("first")
    clock.now += 10
    log.warning("second")
    assert lines(caplog) == ["first", "second"]
