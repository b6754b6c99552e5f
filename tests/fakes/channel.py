"""A channel that records what a turn shows, for tests of the core through its public seam.

This is not a fake of a remote service (those speak wire protocols); it is the smallest real
implementation of our own `Channel` interface. `wait_until` gives handshakes on what is visible,
so tests never sleep to order events. `hold_finish` makes every reply's last call wait for
`release_finish()`, to test what a cancellation during the closing notice does; `hold_update`
does the same for frames (`updating`, `release_update()`). `calls` is the order of it all.
Attached files are served from `files` by their `Attachment.source` (`attach` adds one), each
download recorded in `downloads`.
"""

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.channel import (
    Attachment,
    AttachmentKind,
    Button,
    Card,
    ChannelTraits,
    Deliver,
    Delivery,
    Frame,
    OnPost,
    Outcome,
)
from core.errors import DownloadError
from tests.fakes.changes import Changes
from tests.fakes.patience import deadline

WAIT_SECONDS = deadline()


@dataclass
class RecordedReply:
    place: str
    reply_to: str | None
    frames: list[Frame] = field(default_factory=list)
    text: str | None = None
    outcome: Outcome | None = None
    note: str | None = None
    tools: tuple[str, ...] = ()
    """Every tool the turn used, as `finish` named them."""
    cards: tuple[Card, ...] = ()
    """The final state of the cards its frames carried, as `finish` gave it."""
    taken_up: tuple[str, ...] = ()
    """Ids of messages an earlier process posted, which this reply took up again."""

    @property
    def shown(self) -> str:
        """The text a person sees now: the final text once finished, else the last frame."""
        if self.text is not None:
            return self.text
        return self.frames[-1].text if self.frames else ""


class RecordingChannel:
    def __init__(
        self,
        platform: str = "test",
        *,
        frame_interval: float = 0.0,
        hold_finish: bool = False,
        hold_update: bool = False,
        shows: Delivery = Delivery.SHOWN,
    ) -> None:
        self.platform = platform
        self.traits = ChannelTraits(frame_interval=frame_interval)
        self.replies: list[RecordedReply] = []
        self.notices: list[tuple[str, str]] = []
        self.buttons: list[tuple[Button, ...]] = []
        """The buttons under each notice, in step with `notices`."""
        self.finishing = asyncio.Event()
        self._hold_finish = hold_finish
        self._finish_gate = asyncio.Event()
        self._hold_update = hold_update
        self.updating = asyncio.Event()
        self._update_gate = asyncio.Event()
        self.calls: list[str] = []
        self.shows = shows
        """What every finished reply reports the platform shows (`Reply.delivery`)."""
        self._changes = Changes()
        self.connected = asyncio.Event()
        self.connected.set()
        self.problem: str | None = None
        self.files: dict[str, bytes] = {}
        self.downloads: list[str] = []

    def attach(
        self,
        name: str,
        data: bytes,
        media_type: str = "",
        *,
        kind: AttachmentKind = AttachmentKind.FILE,
        seconds: float | None = None,
        size: int | None = None,
    ) -> Attachment:
        """A file a message comes with, served by `download` until removed from `files`."""
        source = f"file-{len(self.files)}"
        self.files[source] = data
        declared = len(data) if size is None else size
        return Attachment(name, media_type, source, kind, declared, seconds)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        self.downloads.append(attachment.source)
        self.changed()
        data = self.files.get(attachment.source)
        if data is None:
            raise DownloadError(f"{attachment.name} is gone: send it again")
        if len(data) > limit:
            raise DownloadError(f"{attachment.name} is larger than the {limit} bytes asked for")
        return data

    async def run(self, deliver: Deliver) -> None:
        await asyncio.Event().wait()

    async def stop_receiving(self) -> None:
        pass

    async def open_for_sending(self) -> None:
        self.connected.set()

    async def close(self) -> None:
        pass

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> "_Reply":
        recorded = RecordedReply(place, reply_to, taken_up=tuple(posted))
        self.replies.append(recorded)
        return _Reply(self, recorded, on_post)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        self.notices.append((place, text))
        self.buttons.append(tuple(buttons))
        self.changed()
        return (f"notice-{len(self.notices) - 1}",)

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        """The notice `message_id` now reads `text`, without buttons."""
        index = int(message_id.removeprefix("notice-"))
        self.notices[index] = (place, text)
        self.buttons[index] = ()
        self.changed()

    def release_finish(self) -> None:
        self._finish_gate.set()

    def release_update(self) -> None:
        self._update_gate.set()

    def changed(self) -> None:
        self._changes.notify()

    async def wait_until(self, condition: Callable[[], object], what: str = "condition") -> None:
        """Wait (at most WAIT_SECONDS) until `condition()` holds, re-checking on every change."""
        await self._changes.until(condition, WAIT_SECONDS, what, lambda: f"{self.calls[-5:]}")

    async def finished(self, count: int = 1) -> list[RecordedReply]:
        """Wait until `count` replies are finished; return the finished ones."""
        done = lambda: [r for r in self.replies if r.outcome is not None]  # noqa: E731
        await self.wait_until(lambda: len(done()) >= count, f"{count} finished replies")
        return done()

    def notices_in(self, place: str) -> list[str]:
        return [text for where, text in self.notices if where == place]


class _Reply:
    def __init__(
        self, channel: RecordingChannel, recorded: RecordedReply, on_post: OnPost | None
    ) -> None:
        self._channel = channel
        self._on_post = on_post
        self.recorded = recorded
        self.posted: tuple[str, ...] = recorded.taken_up
        self.delivery = Delivery.NOTHING

    async def update(self, frame: Frame) -> None:
        self._channel.calls.append("update started")
        if self._channel._hold_update:
            self._channel.updating.set()
            await self._channel._update_gate.wait()
        self.recorded.frames.append(frame)
        if not self.posted:
            self.posted = (f"{self.recorded.place}/{len(self._channel.replies)}",)
            if self._on_post is not None:
                self._on_post(self.posted)
        self._channel.calls.append("update done")
        self._channel.changed()

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        if self._channel._hold_finish:
            self._channel.finishing.set()
            await self._channel._finish_gate.wait()
        self.recorded.text, self.recorded.outcome, self.recorded.note = text, outcome, note
        self.recorded.tools, self.recorded.cards = tools, cards
        self.delivery = self._channel.shows
        if not self.posted and self.delivery is not Delivery.NOTHING:  # as a platform posts it
            self.posted = (f"{self.recorded.place}/{len(self._channel.replies)}",)
            if self._on_post is not None:
                self._on_post(self.posted)
        self._channel.calls.append("finish")
        self._channel.changed()
