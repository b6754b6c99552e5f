"""The rate limits a fake platform enforces when asked to (``limits=True``), and what it refused.

A platform publishes its limits as "at most N calls in T seconds", counted per bot, per chat,
per method; what it does past them is a 429 and a wait. Each fake (telegram.py, slack.py,
discord.py) names the windows one call counts against; `Limiter.admit` lets the call through
when every one of them has room, counting it in each, or refuses it with the wait until they
all do, recorded in `Limiter.refused`. A refused call counts in no window: it was turned away
before it reached the platform's counters, so a client that waits out its 429 is not punished
twice. The fakes share this module so that the three count alike, and a test reads the same
records from each (`admitted`: when every counted call came in; `refused`).

A window has one of two shapes, whichever the platform runs:
- **sliding**: a call fits while fewer than N came in the last T seconds. The strictest reading
  of a published "N per T", for a platform that says no more (Telegram, Slack): calls that fit
  it fit any bucket or fixed window of the same N and T too.
- **fixed**: the first call opens a window of T seconds, N calls fit in it, and then it is
  over. Discord's buckets are this: their ``X-RateLimit-Remaining`` counts down within the
  window and ``X-RateLimit-Reset-After`` to its end, when the whole allowance is back (which is
  how discord.py reads them).

The clock is a `Clock`: the monotonic clock, which a test may stop and move by hand, so a case
about a window's edge waits on nothing and holds on the slowest machine.
"""

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """At most `calls` calls in `seconds` seconds, counted under `key` ("bot", "chat 42")."""

    key: str
    calls: int
    seconds: float
    fixed: bool = False


@dataclass(frozen=True)
class Refusal:
    """A call answered 429: when it came (`Clock`), what it was, the window it found full and
    the seconds it was told to wait."""

    at: float
    what: str
    window: Window
    retry_after: float


class Clock:
    """The monotonic clock, unless a test stopped it (`stop`, until `resume`) or moved it ahead
    (`advance`)."""

    def __init__(self) -> None:
        self._ahead = 0.0
        self._stopped_at: float | None = None

    def __call__(self) -> float:
        if self._stopped_at is not None:
            return self._stopped_at
        return time.monotonic() + self._ahead

    def stop(self) -> None:
        """From now on the clock moves only by `advance`."""
        self._stopped_at = self()

    def resume(self) -> None:
        """Run on, at the monotonic clock's pace, from where it stands."""
        if self._stopped_at is not None:
            self._ahead = self._stopped_at - time.monotonic()
            self._stopped_at = None

    def advance(self, seconds: float) -> None:
        if self._stopped_at is not None:
            self._stopped_at += seconds
        else:
            self._ahead += seconds


class _Sliding:
    def __init__(self, window: Window) -> None:
        self.window = window
        self._times: deque[float] = deque()

    def remaining(self, now: float) -> int:
        while self._times and self._times[0] <= now - self.window.seconds:
            self._times.popleft()
        return self.window.calls - len(self._times)

    def reset_after(self, now: float) -> float:
        """Seconds until one more call fits (the oldest counted one leaves)."""
        self.remaining(now)
        return self._times[0] + self.window.seconds - now if self._times else 0.0

    def spend(self, now: float) -> None:
        self._times.append(now)


class _Fixed:
    def __init__(self, window: Window) -> None:
        self.window = window
        self._opened = 0.0
        self._used = 0

    def remaining(self, now: float) -> int:
        if now >= self._opened + self.window.seconds:
            self._used = 0
        return self.window.calls - self._used

    def reset_after(self, now: float) -> float:
        """Seconds until the window is over and its whole allowance back."""
        if self.remaining(now) == self.window.calls:
            return 0.0
        return self._opened + self.window.seconds - now

    def spend(self, now: float) -> None:
        if self.remaining(now) == self.window.calls:
            self._opened = now
        self._used += 1


class Limiter:
    """One fake's windows; with `enabled` off it admits everything and records nothing."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.clock = Clock()
        self.refused: list[Refusal] = []
        """Every call answered 429 for a full window, in order."""
        self.admitted: list[float] = []
        """When each call that counted against a window came in (`clock`), in order."""
        self._counts: dict[str, _Sliding | _Fixed] = {}

    def admit(self, what: str, windows: Sequence[Window], arrived: float) -> Refusal | None:
        """None, the call counted in each of `windows`, if all have room when it `arrived`
        (`clock`, as its request came in, before its body was read); else its refusal: the
        first full window (in the order given) and the wait until every one has room."""
        if not self.enabled or not windows:
            return None
        now = arrived
        counts = [self._count(window) for window in windows]
        full = [count for count in counts if count.remaining(now) <= 0]
        if full:
            wait = max(count.reset_after(now) for count in full)
            refusal = Refusal(now, what, full[0].window, wait)
            self.refused.append(refusal)
            return refusal
        for count in counts:
            count.spend(now)
        self.admitted.append(now)
        return None

    def state(self, window: Window) -> tuple[int, float]:
        """The calls `window` has left now, and the seconds until it resets (`_Fixed`) or
        gives one back (`_Sliding`)."""
        count, now = self._count(window), self.clock()
        return count.remaining(now), count.reset_after(now)

    def _count(self, window: Window) -> "_Sliding | _Fixed":
        count = self._counts.get(window.key)
        if count is None:
            count = _Fixed(window) if window.fixed else _Sliding(window)
            self._counts[window.key] = count
        return count


def whole_seconds(wait: float) -> int:
    """A wait as Telegram and Slack state one: whole seconds, rounded up, at least one (to the
    millisecond first, so a window's exact end is not a second later for a float's error)."""
    return max(1, math.ceil(round(wait, 3)))
