"""The limit on a whole test, and what a test that hit it was waiting for.

A test that hangs (a handshake never answered, a child process that never exits) would stop the
whole run; pytest-timeout ends it after `timeout` seconds (`pyproject.toml`), times
`KAIWA_TEST_TIMEOUT_SCALE` (`tests.fakes.patience`), and fails it. Its own dump shows each
thread's stack, which for an asyncio test is only the event loop waiting in `select`; what hung
is a task, so before the failure every task of the running loop is written out with the line it
waits at (`dump_tasks`).
"""

import asyncio
import io
import signal
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

from tests.fakes.patience import scale


def scale_the_limit(config: pytest.Config) -> None:
    """The ini's `timeout` scaled, unless one was given on the command line; called before
    pytest-timeout reads it."""
    if config.getoption("timeout", None) is None and config.getini("timeout"):
        config.option.timeout = float(config.getini("timeout")) * scale()


@pytest.hookimpl(wrapper=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Generator[None, object, object]:
    """pytest-timeout's alarm, with the running loop's tasks written out before it fails the
    test."""
    armed = yield
    theirs = signal.getsignal(signal.SIGALRM)
    if settings.method == "signal" and callable(theirs):

        def dump_then_fail(signum: int, frame: FrameType | None) -> None:
            __tracebackhide__ = True
            dump_tasks(item.config.get_terminal_writer())
            theirs(signum, frame)

        signal.signal(signal.SIGALRM, dump_then_fail)
    return armed


def dump_tasks(terminal: Any) -> None:
    """Each task of the loop running in this thread, with its stack (nothing without a loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    tasks = sorted(asyncio.all_tasks(loop), key=lambda task: task.get_name())
    terminal.sep("+", title=f"Timeout: {len(tasks)} asyncio tasks")
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(file=stack)
        terminal.write(stack.getvalue() + "\n")
