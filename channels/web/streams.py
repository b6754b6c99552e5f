"""Who hears a change on the web chat's board: the open pages' streams, each following one
person's list and the one conversation its page has open.

Kept apart from the board (`channels.web.board`), which decides what changed and numbers it;
this decides which streams are told. A list entry's change goes to every stream of its person;
a bubble's or an activity's only to the streams following its conversation, so one person with
many tabs open costs each stream its own conversation's changes, not everyone's.

A stream is a bounded queue: a page that stops reading (a frozen tab) is told to end once it
falls `STREAM_BACKLOG` events behind, rather than holding every change in memory, and catches
up from the board when it reconnects.
"""

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

STREAM_BACKLOG = 1000
"""Events a page's stream may fall behind by; past it the stream ends and the page, reconnecting
with the last number it saw, reads the rest from the board."""

Event = tuple[str, int, dict[str, Any]]
"""What a page's stream carries: its kind (`bubble`, `activity`, `conversation`), its number,
its data."""

Queue = asyncio.Queue[Event | None]
"""A stream as its reader sees it; None in it means the stream must end."""


@dataclass(eq=False)
class _Stream:
    queue: Queue
    conversation: str | None


class Streams:
    def __init__(self) -> None:
        self._streams: dict[str, set[_Stream]] = {}

    @contextmanager
    def subscribe(self, person: str, conversation: str | None = None) -> Iterator[Queue]:
        """A queue of the changes from now on of `person`'s list and of `conversation` (none:
        the list alone)."""
        stream = _Stream(asyncio.Queue(STREAM_BACKLOG), conversation)
        self._streams.setdefault(person, set()).add(stream)
        try:
            yield stream.queue
        finally:
            self._streams[person].discard(stream)

    def publish(self, person: str, event: Event, conversation: str | None = None) -> None:
        """`event` to each of `person`'s streams that follows it: all of them for a list
        entry's (no `conversation`), those following `conversation` for the rest."""
        for stream in list(self._streams.get(person, ())):
            if conversation is not None and stream.conversation != conversation:
                continue
            if stream.queue.full():
                self._streams[person].discard(stream)
                _end(stream.queue)
            else:
                stream.queue.put_nowait(event)

    def end(self) -> None:
        """Tell every stream to end (Kaiwa is stopping: a page reconnects by itself once it is
        back, from the last number it saw)."""
        for streams in self._streams.values():
            for stream in streams:
                _end(stream.queue)


def _end(queue: Queue) -> None:
    """Tell a stream to end, even a full one."""
    while queue.full():
        queue.get_nowait()
    queue.put_nowait(None)
