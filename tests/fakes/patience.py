"""How long a test waits for something that should happen: one deadline, scaled by one setting.

A test waits for a condition (a post shown, a log line written, a process ready), never for a
time. Waiting costs nothing when the condition comes, so the deadline is set for the slowest
machine a test may meet (a shared CI runner with every core taken), not for this one: a test
fails by its deadline only when what it waits for never comes. `KAIWA_TEST_TIMEOUT_SCALE`
multiplies every deadline (and pytest-timeout's limit on a whole test, in `tests/conftest.py`)
for a machine slower still. The fakes read it here too, so they stand alone.
"""

import os

SCALE_VARIABLE = "KAIWA_TEST_TIMEOUT_SCALE"
WAIT_SECONDS = 30.0
"""How long a test waits for one condition before it says the condition never came."""


def scale() -> float:
    """The factor `KAIWA_TEST_TIMEOUT_SCALE` gives (1 when unset)."""
    raw = os.environ.get(SCALE_VARIABLE, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE} must be a number, not {raw!r}") from None
    if factor <= 0:
        raise ValueError(f"{SCALE_VARIABLE} must be above 0, not {raw!r}")
    return factor


def scaled(seconds: float) -> float:
    """`seconds` on this machine: a deadline written for the slowest machine, times the scale."""
    return seconds * scale()


def deadline() -> float:
    """The seconds a wait for one condition may take (`WAIT_SECONDS`, scaled)."""
    return scaled(WAIT_SECONDS)
