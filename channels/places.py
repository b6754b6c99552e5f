"""Conversation keys ("places"), written and read here for every platform.

A place is the key the core files a conversation under, `<platform>:<part>:...`; the core keeps
it as an opaque string. Each adapter builds one from a platform event and reads its own back when
it opens a reply or sends a notice. Doing both here keeps the two halves in agreement and gives
each part a name and a type, instead of string formatting in one file and splitting in another.

| class | key | parts |
|---|---|---|
| `TelegramPlace` | `telegram:<chat>` | the chat id |
| `SlackPlace` | `slack:<team>:<channel>:<thread>` | the thread's ts, `top` for a DM's top level |
| `DiscordPlace` | `discord:<guild>:<channel>` | `dm` as the guild of a direct message channel |
| `TerminalPlace` | `terminal:<session>` | the session's name |
| `WebPlace` | `web:<person>:<conversation>` | who is signed in, and the conversation's id |

Keys are stored (conversations, turns, scheduled tasks), so their shape never changes: a key an
older version wrote reads the same. The last part takes the rest of the key, colons and all; an
earlier part cannot hold a colon. A part may be empty (a Slack event without its team), as such
a key still reads back. Reading another platform's key, or a malformed one, raises
`PlaceError`, which names the form expected.
"""

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar, Self

from core.channel import platform_of

SEPARATOR = ":"


class PlaceError(ValueError):
    """A key that is not a place of the platform asked for."""


def space_of(key: str) -> str:
    """The conversations a person in `key` can see, for the tools that read stored ones: a
    prefix of places ending in ':' (a Discord server's threads, a Slack channel's threads, the
    terminal's sessions), or the place itself (a DM, a Telegram chat)."""
    platform = platform_of(key)
    if platform == DiscordPlace.platform:
        guild = DiscordPlace.of(key).guild
        return key if guild == DiscordPlace.DM else SEPARATOR.join([platform, guild, ""])
    if platform == SlackPlace.platform:
        where = SlackPlace.of(key)
        return SEPARATOR.join([platform, where.team, where.channel, ""])
    if platform == TerminalPlace.platform:
        return platform + SEPARATOR
    if platform == WebPlace.platform:
        return SEPARATOR.join([platform, WebPlace.of(key).person, ""])
    return key


@dataclass(frozen=True)
class Place:
    """A place's parts, as the fields of a subclass (each `int` or `str`), in key order."""

    platform: ClassVar[str]

    def __post_init__(self) -> None:
        parts = self._parts()
        if any(SEPARATOR in part for part in parts[:-1]):
            raise PlaceError(f"{parts} cannot make a {self.platform} place ({self.form()})")

    @property
    def key(self) -> str:
        return SEPARATOR.join([self.platform, *self._parts()])

    @classmethod
    def of(cls, key: str) -> Self:
        names = cls._names()
        platform, *parts = key.split(SEPARATOR, len(names))
        refusal = PlaceError(f"{key!r} is not a {cls.platform} place ({cls.form()})")
        if platform != cls.platform or len(parts) != len(names):
            raise refusal
        kinds = typing.get_type_hints(cls)
        try:
            return cls(*(kinds[name](part) for name, part in zip(names, parts, strict=True)))
        except ValueError as exc:  # a part that is not a number where one belongs
            raise refusal from exc

    @classmethod
    def form(cls) -> str:
        """The key's form, for messages: `slack:<team>:<channel>:<thread>`."""
        return SEPARATOR.join([cls.platform, *(f"<{name}>" for name in cls._names())])

    def _parts(self) -> list[str]:
        return [str(getattr(self, name)) for name in self._names()]

    @classmethod
    def _names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]


@dataclass(frozen=True)
class TelegramPlace(Place):
    """A chat: a private chat with one person, or a group."""

    platform: ClassVar[str] = "telegram"
    chat: int


@dataclass(frozen=True)
class SlackPlace(Place):
    """A thread in a channel or DM, or a DM's top level (`thread` is `TOP`)."""

    platform: ClassVar[str] = "slack"
    TOP: ClassVar[str] = "top"
    team: str
    channel: str
    thread: str

    @property
    def thread_ts(self) -> str | None:
        """The `thread_ts` a post here carries (None at a DM's top level)."""
        return None if self.thread == self.TOP else self.thread


@dataclass(frozen=True)
class DiscordPlace(Place):
    """A thread in a guild (`channel` is the thread's id), or a DM channel (`guild` is `DM`)."""

    platform: ClassVar[str] = "discord"
    DM: ClassVar[str] = "dm"
    guild: str
    channel: int

    @classmethod
    def direct(cls, channel: int) -> Self:
        return cls(cls.DM, channel)


@dataclass(frozen=True)
class TerminalPlace(Place):
    """The terminal session, named in `[channels.terminal].session`."""

    platform: ClassVar[str] = "terminal"
    session: str


@dataclass(frozen=True)
class WebPlace(Place):
    """A browser conversation of one person (`operator` for the one-operator sign-in)."""

    platform: ClassVar[str] = "web"
    person: str
    conversation: str
