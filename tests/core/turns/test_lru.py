"""The pinned LRU that holds per-conversation state."""

import pytest

from core.turns.lru import PinnedLRU


def test_least_recently_used_goes_first() -> None:
    cache: PinnedLRU[str, int] = PinnedLRU(2)
    cache.get_or_create("a", lambda: 1)
    cache.get_or_create("b", lambda: 2)
    cache.get("a")
    cache.get_or_create("c", lambda: 3)
    assert "a" in cache and "c" in cache and "b" not in cache


def test_pinned_entries_are_never_evicted() -> None:
    cache: PinnedLRU[str, int] = PinnedLRU(1)
    cache.get_or_create("a", lambda: 1)
    cache.pin("a")
    cache.get_or_create("b", lambda: 2)
    assert "a" in cache and "b" in cache, "over capacity rather than evict a pinned entry"
    cache.pin("b")
    cache.unpin("a")
    assert "a" not in cache and len(cache) == 1


def test_pins_nest() -> None:
    cache: PinnedLRU[str, int] = PinnedLRU(1)
    cache.get_or_create("a", lambda: 1)
    cache.pin("a")
    cache.pin("a")
    cache.unpin("a")
    cache.get_or_create("b", lambda: 2)
    assert "a" in cache
    assert cache.is_pinned("a")


def test_pinning_a_missing_key_is_an_error() -> None:
    with pytest.raises(KeyError):
        PinnedLRU[str, int](1).pin("nope")
