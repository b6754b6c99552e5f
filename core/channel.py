"""What the core needs from a channel, and what a channel hands the core.

Channels import these types; the core never imports a channel. The core never asks which platform
it is talking to: whatever differs between platforms is either inside the adapter or a named trait
in `ChannelTraits`, read the same way for all.

A reply is pushed as whole frames (the answer so far, the current thinking, the current activity),
not as deltas, so an adapter may drop or coalesce frames freely (rate limits) and still show the
right text at the end.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

COMMANDS: tuple[tuple[str, str], ...] = (
    ("stop", "stop the reply being written and drop queued messages"),
    ("new", "start a fresh conversation here"),
    ("usage", "model calls, tokens, seconds and context of this conversation"),
    ("compact", "summarize this conversation's older messages now, to free its context"),
    ("agents", "sub-agents here; /agents <name>, /agents stop <name>, /agents tell <name> <text>"),
    ("tasks", "scheduled tasks here; /tasks pause|resume|cancel|run <id>"),
    ("memory", "the notes kept for you; /memory forget <id>"),
    ("plan", "plan a task, have the plan reviewed, then carry it out: /plan <task>"),
    ("plans", "the plans of this conversation and where each stands"),
    ("approve", "say yes to a question: /approve <id> (a tool call: /approve <id> here too)"),
    ("edit", "ask for changes to a plan you are asked to approve: /edit <id> <what to change>"),
    ("deny", "say no to a question: /deny <id>"),
    ("grants", "tools allowed here without asking; /grants revoke <tool|all>"),
    ("help", "list the commands"),
)
"""Every command and its one-line summary, for /help and for platforms' command menus."""


def platform_of(place: str) -> str:
    """The platform a place (a conversation key) belongs to: `slack` for `slack:T1:C1:top`."""
    return place.partition(":")[0]


class AttachmentKind(StrEnum):
    VOICE = "voice"
    """A note recorded in the app to be heard (Telegram's voice and round video notes,
    Discord's voice messages)."""
    AUDIO = "audio"
    """An audio file sent as a file; heard like a voice note."""
    FILE = "file"
    """Anything else: read as a document when it is one Kaiwa reads, named when it is not."""


@dataclass(frozen=True)
class Attachment:
    """A file attached to a message (pictures aside: they arrive as bytes in `images`), as its
    channel describes it before anything is downloaded. It is plain data, recorded with the
    message in the inbox, so a restart or another worker can fetch it again: `source` is what
    the channel finds the file by (a Telegram file id, a Discord or Slack URL, a web upload's
    id), never a secret; the channel's `Files.download` turns it into bytes. `size` and
    `seconds` are the platform's figures (None where it gives none); `unavailable` is why the
    channel cannot fetch it at all, in words for the person (a Telegram file past the Bot API's
    20 MB), said before anything else is tried."""

    name: str
    media_type: str
    source: str
    kind: AttachmentKind = AttachmentKind.FILE
    size: int | None = None
    seconds: float | None = None
    unavailable: str = ""

    @property
    def heard(self) -> bool:
        """Transcribed, not read: a voice note or an audio file."""
        return self.kind is not AttachmentKind.FILE


@dataclass(frozen=True)
class ChannelMessage:
    """One inbound message, normalized by its adapter.

        `place` is the conversation key (`terminal:<session>`, `telegram:<chat>`, ...); `message_id`
        is the platform's own id for the message, the basis of deduplication. `images` are the bytes
        of attached pictures (a photo's caption is `text`), `attachments` every other file (a voice
    note, a document), described for `Files.download`. For access rules: `room` is the platform's
        channel id and `space` the server it belongs to (a Discord guild), both empty for a direct
        conversation with the bot; `author_roles` are the author's role ids where a platform has
        roles. `redeliverable`: the platform delivers the message again unless the channel
        acknowledges it (Telegram's offset, Slack's ack), so when it cannot be recorded the channel
        holds the acknowledgement instead of the person being asked to send it again.
    """

    platform: str
    place: str
    message_id: str
    author_id: str
    text: str
    author_name: str = ""
    images: tuple[bytes, ...] = ()
    room: str = ""
    space: str = ""
    author_roles: tuple[str, ...] = ()
    redeliverable: bool = False
    attachments: tuple[Attachment, ...] = ()


class Outcome(StrEnum):
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    """Kaiwa restarted in the middle of it: shown ending with "(interrupted by a restart)"."""
    CUT = "cut"
    """The answer reached the model's output limit: shown ending with "(cut at the length
    limit)"."""


class Delivery(StrEnum):
    """What the platform shows of a finished reply."""

    SHOWN = "shown"
    """The final text, in full (and no Stop control)."""
    STALE = "stale"
    """An older text: the last edit could not be made (rate limits past the deadline)."""
    NOTHING = "nothing"
    """Nothing at all: not one message could be posted."""


@dataclass(frozen=True)
class Button:
    """A button under a message. Pressing it sends `command` into the message's conversation as
    if the presser had typed it: the same access rules, and the answer goes to the presser
    alone. Every button's command can also be typed, so a platform without buttons loses none."""

    label: str
    command: str


@dataclass(frozen=True)
class Card:
    """One piece of work a message follows (a sub-agent run), as data for a channel that can
    show it as more than a line of its text (the web chat's live cards); the message's text
    says the same for every other channel. `key` is what commands name it by (`a1`), `doing`
    its current step, `buttons` what a person may do with it now (Stop it, read its
    transcript), each a command that can also be typed, and `route` why it runs on `model`
    (`tier: reason`; '' when it runs its profile's)."""

    key: str
    name: str
    status: str
    doing: str
    seconds: float
    model: str
    model_calls: int
    buttons: tuple[Button, ...] = ()
    route: str = ""


@dataclass(frozen=True)
class Frame:
    """The reply as it should look now: its text, the thinking under way, what it is doing (a
    status line: "using current_time…", "loading qwen3:4b…"), the tools it has used so far
    this turn, in order (so a channel can show each, however fast it was), and the work it
    follows as cards (a status message's sub-agents)."""

    text: str
    thinking: str = ""
    activity: str | None = None
    tools: tuple[str, ...] = ()
    cards: tuple[Card, ...] = ()


@dataclass(frozen=True)
class ChannelTraits:
    """Named facts about a channel that the core reads; decided once, at construction."""

    frame_interval: float = 1.0
    """Shortest time between two frames the turn pushes (and between two saves of partial text)."""
    edits_in_place: bool = True
    """A message's edits replace it where it stands. Where they cannot (a pipe, which prints each
    change below the last), a status message that is edited as it goes is said once, at its end."""


class Reply(Protocol):
    """One reply being written. `finish` is always the last call and carries the final text,
    every tool the turn used (a fast one may have come and gone between two frames), and the
    final state of the cards its frames carried.

    `posted` are the platform's ids of the messages the reply has posted so far, in order (the
    turn records them, so a restart can find the reply again); `delivery` is what the platform
    shows once `finish` has returned.
    """

    posted: tuple[str, ...]
    delivery: Delivery

    async def update(self, frame: Frame) -> None: ...
    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None: ...


class Files(Protocol):
    """A channel whose messages carry `attachments`: it fetches them for the core."""

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The attachment's bytes, at most `limit` of them. Raises `core.errors.DownloadError`,
        in words for the person, when it is larger, gone, or the platform refuses."""
        ...


OnPost = Callable[[tuple[str, ...]], None]
"""Told a reply's posted messages' ids, each time a post adds one (`Channel.open_reply`); a
channel whose messages have no ids tells it once, with none, when the reply first shows."""

Deliver = Callable[[ChannelMessage], Awaitable[None]]
"""Hand a message to the core; returns once it is recorded (and a command in it has answered).
Raises `core.errors.StoreError` when a `redeliverable` message could not be recorded."""


class Channel(Protocol):
    """A platform. `connected` is set while the channel can receive (cleared while it is
    reconnecting); `problem` is why it last could not connect, in words with the fix (None when
    nothing went wrong)."""

    platform: str
    traits: ChannelTraits
    connected: asyncio.Event
    problem: str | None

    async def run(self, deliver: Deliver) -> None:
        """Receive messages and hand each to `deliver`; return when the channel ends by itself
        (end of input) or soon after `stop_receiving`. Replies still work after it returns."""
        ...

    async def stop_receiving(self) -> None:
        """Take no more messages: the first step of shutting down."""
        ...

    async def open_for_sending(self) -> None:
        """Be ready to post and edit without receiving, and set `connected` (a worker of a
        cluster whose platform connection another worker holds). Raises as `run` would for a
        token the platform refuses."""
        ...

    async def close(self) -> None:
        """Release the platform connection; called once every turn has sent its last edit."""
        ...

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: OnPost | None = None,
    ) -> Reply:
        """Start a reply in `place`; nothing need be visible until the first frame. `posted`:
        the ids of messages an earlier process posted for this reply (after a restart), which
        the reply takes up again instead of posting anew. `on_post` hears the reply's `posted`
        each time a post adds to it, the moment the platform has answered, so the turn records
        it before anything else happens (a channel whose messages have no ids calls it once,
        with none, when the reply first shows: the wait for a first word is measured there)."""
        ...

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        """Send a short standalone message (command answers, refusals, notices), with `buttons`
        under it where the platform has them; the ids of the messages posted (none when it went
        to one person privately, or the platform has no ids)."""
        ...

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        """Replace a posted notice's text and take its buttons away (an answered question)."""
        ...
