"""A least-recently-used map whose pinned entries are never evicted.

Per-conversation state (the gate, the queue, the cached history) lives in one of these so memory
stays bounded however many conversations a bot has seen. Evicting the entry of a conversation
whose turn is running would hand the next message a fresh gate and let two turns run at once, so
the turn path pins an entry for as long as any turn of that conversation is alive (invariant 2 in
core/turns/runner.py).
"""

from collections import OrderedDict
from collections.abc import Callable
from itertools import islice
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class PinnedLRU(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._pins: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        value = self.get(key)
        if value is None:
            value = self._entries[key] = create()
            self._evict(keep=key)
        return value

    def pin(self, key: K) -> None:
        if key not in self._entries:
            raise KeyError(key)
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: K) -> None:
        remaining = self._pins[key] - 1
        if remaining:
            self._pins[key] = remaining
        else:
            del self._pins[key]
            self._evict()

    def is_pinned(self, key: K) -> bool:
        return key in self._pins

    def _evict(self, keep: K | None = None) -> None:
        """Drop the least recently used unpinned entries (never `keep`) until within capacity."""
        excess = len(self._entries) - self.capacity
        if excess <= 0:
            return
        # Only the oldest `excess` entries, plus one per pin or kept key skipped, need a look.
        oldest = list(islice(self._entries, excess + len(self._pins) + 1))
        for key in oldest:
            if excess <= 0:
                return
            if key not in self._pins and key != keep:
                del self._entries[key]
                excess -= 1
