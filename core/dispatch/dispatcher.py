"""The dispatcher: the one door every inbound message goes through, in a fixed order.

1. Decide what the message is (refused by the access rules, a command, too large, or a turn), and
   record it in the inbox with that decision. The inbox's unique index on the platform's message
   id deduplicates, persisted, so a redelivery after a restart is still a duplicate and never a
   second reply. A channel acknowledges a message to its platform only once `handle` returns; a
   message that cannot be recorded is not acknowledged where the platform will deliver it again
   (`ChannelMessage.redeliverable`), and otherwise the person is told to send it again. While
   the database refuses writes (`core.store.outage`: a full disk, a read-only database), a
   place whose message is left for redelivery is told so once per outage, never at each
   redelivery; the messages are answered, each once, when writes are taken again. The
   text is cleaned first (`core.text.clean`), so the model and the store see the same text.
2. A refused person is told so, at most once an hour (so a stranger cannot make the bot spam a
   channel by mentioning it), and no model is called.
3. Commands are matched before anything queues: a command is never sent to the model and never
   waits behind a running turn. It runs before `handle` returns, so a message that arrives after
   it is handled after it (a `/new` then a question: the question opens the new conversation).
   A workflow's command with its task (`/plan <task>`) is no command: it is a turn like any
   message, which the turn runner gives that workflow's body.
4. Messages with nothing to read (a bare mention, a sticker), images the agent's model cannot
   read, oversized messages, and attachments a feature screens out before anything is
   downloaded (`screens`: voice notes with transcription off, a file type Kaiwa cannot read)
   are answered with the reason, and no model is called. Nothing is downloaded here: a
   channel's reading loop must not wait on a file, so attachments are read in their turn.
5. Anything else starts a turn as a background task, so the channel keeps reading. While Kaiwa
   shuts down, such a message is recorded but not started; the next start answers it
   (`core.dispatch.recovery`).
"""

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from core.channel import Channel, ChannelMessage
from core.dispatch.commands import Commands
from core.errors import StoreError, WriteRefused
from core.store import Inbound, Store
from core.text import Command, clean, parse_command
from core.turns.runner import TurnRunner
from core.turns.turn import TurnRequest

logger = logging.getLogger(__name__)

REFUSE_AGAIN_SECONDS = 3600.0

Screen = Callable[[ChannelMessage], str | None]
"""A feature's look at a message's attachments before it is recorded as a turn: why it cannot
be taken, in words for the person, or None."""


@dataclass(frozen=True)
class Allowed:
    """One platform's allow-lists, as ids in text. A person may talk to the bot when their id is
    in `users` or they hold one of `roles` (`users` None: anyone). An empty `spaces` (servers)
    or `rooms` (channels) list means any; a direct conversation has neither and is governed by
    the person alone."""

    users: frozenset[str] | None = frozenset()
    roles: frozenset[str] = frozenset()
    spaces: frozenset[str] = frozenset()
    rooms: frozenset[str] = frozenset()


@dataclass(frozen=True)
class AccessRules:
    """Who may talk to the bot, and where, per platform; a platform not named is closed."""

    platforms: Mapping[str, Allowed] = field(default_factory=dict)

    def refusal(self, message: ChannelMessage) -> str | None:
        """Why `message` is refused, in words for the person, or None if it is allowed."""
        key = f"[channels.{message.platform}]"
        allowed = self.platforms.get(message.platform, Allowed())
        if not _person_allowed(allowed, message):
            roles = f" (or one of your roles to {key}.allowed_roles)" if allowed.roles else ""
            who = f", {message.author_name}" if message.author_name else ""
            return (
                f"Sorry{who}, you are not allowed to use this bot. Ask its operator to add your "
                f"user id {message.author_id} to {key}.allowed_users{roles}."
            )
        if allowed.spaces and message.space and message.space not in allowed.spaces:
            return (
                f"Sorry, this bot does not answer on this server. Its operator can add it "
                f"({message.space}) to {key}.allowed_guilds."
            )
        if allowed.rooms and message.room and message.room not in allowed.rooms:
            return (
                f"Sorry, this bot does not answer here. Its operator can add this channel "
                f"({message.room}) to {key}.allowed_channels."
            )
        return None


def _person_allowed(allowed: Allowed, message: ChannelMessage) -> bool:
    if allowed.users is None or message.author_id in allowed.users:
        return True
    return not allowed.roles.isdisjoint(message.author_roles)


class Placement(Protocol):
    """Where a conversation's turns and commands run, with several workers: on the worker that
    owns it (`core.cluster.owners`). A single process has none: everything runs here."""

    run_command: Callable[[ChannelMessage], Awaitable[None]] | None

    async def runs_here(self, place: str) -> bool: ...

    async def forward_command(self, message: ChannelMessage) -> None: ...

    async def arrived(self, request: TurnRequest) -> None: ...


class Dispatcher:
    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        channels: Mapping[str, Channel],
        access: AccessRules,
        *,
        max_message_chars: int,
        owners: Placement | None = None,
    ) -> None:
        self._store = store
        self._runner = runner
        self._channels = channels
        self._access = access
        self._max_chars = max_message_chars
        self.commands = Commands(store, runner)
        """The turn path's commands, and those features add (`Commands.add`)."""
        self._owners = owners
        if owners is not None:
            owners.run_command = self._run_forwarded
        self.screens: list[Screen] = []
        """Features' looks at a message's attachments (`Screen`), added where Kaiwa is wired."""
        self._refused: dict[tuple[str, str], float] = {}
        """When each stranger (platform, person) was last told they are refused."""
        self._told_outage: tuple[int, set[str]] = (0, set())
        """The write outage (its serial) and the places told of it (`_tell_refused_once`)."""

    async def handle(self, message: ChannelMessage) -> None:
        """Record `message` and act on it: answer a refusal or a command, or queue a turn.
        Raises `StoreError` when a redeliverable message cannot be recorded, so its channel does
        not acknowledge it."""
        message = replace(message, text=clean(message.text))
        stranger = self._access.refusal(message)
        starts_workflow = self._runner.workflow_of(message.text) is not None
        command = None if stranger or starts_workflow else parse_command(message.text)
        refusal = stranger or (None if command else self._content_refusal(message))
        status = "refused" if refusal else "command" if command else "turn"
        try:
            event_id = await self._recorded(message, status)
        except StoreError as exc:
            await self._not_recorded(message, exc)
            return
        if event_id is None:
            logger.info("duplicate %s message %s ignored", *_origin(message))
            return
        channel = self._channels[message.platform]
        if stranger is not None and not self._refusing_again(message):
            return
        if refusal is not None:
            await channel.notify(message.place, refusal)
        elif command is not None:
            if self._owners is not None and not await self._owners.runs_here(message.place):
                await self._owners.forward_command(message)  # its conversation's owner runs it
                return
            await self._run_command(message, channel, command)
        elif self._runner.closing:
            logger.warning(
                "shutting down: %s message %s is recorded and will be answered at the next start",
                *_origin(message),
            )
        else:
            request = TurnRequest(
                platform=message.platform,
                place=message.place,
                text=message.text,
                author=message.author_name or message.author_id,
                person=message.author_id,
                reply_to=message.message_id,
                inbound_event_id=event_id,
                images=message.images,
                attachments=message.attachments,
            )
            if self._owners is not None:
                await self._owners.arrived(request)  # the conversation's owner runs it
            else:
                self._runner.submit(request)

    def _refusing_again(self, message: ChannelMessage) -> bool:
        """Log a stranger's message; whether to tell them (not if they were within the hour)."""
        now, key = time.monotonic(), (message.platform, message.author_id)
        self._refused = {
            k: at for k, at in self._refused.items() if now - at < REFUSE_AGAIN_SECONDS
        }
        told = key in self._refused
        logger.warning(
            "refused a message from %s user %s in %s (not on the allow-lists)%s",
            message.platform,
            message.author_id,
            message.place,
            "; told within the hour, not again" if told else "",
        )
        if not told:
            self._refused[key] = now
        return not told

    async def _recorded(self, message: ChannelMessage, status: str) -> int | None:
        """The message's inbox id, or None for a duplicate. A redelivery is a duplicate unless
        no turn ever took its message up (recorded, then a crash or a shutdown): then it is
        taken over and answered, once (`take_over` lets one taker win)."""
        claim = await self._store.claim_inbound(_inbound(message, status))
        if claim.fresh:
            return claim.event_id
        if claim.answered or self._runner.handles(claim.event_id):
            return None
        if not await self._store.take_over(claim.event_id, claim.token):
            return None
        logger.info(
            "%s message %s was recorded but never answered: answering it", *_origin(message)
        )
        return claim.event_id

    def _content_refusal(self, message: ChannelMessage) -> str | None:
        """Why the model cannot take this message, in words for the person, or None."""
        agent = self._runner.conversations.agent_for(message.place, message.platform)
        if not message.text.strip() and not message.images and not message.attachments:
            pictures = " and pictures" if agent.images else ""
            return f"Ask me something: I read text{pictures}, so write your question as a message."
        if message.images and not agent.images:
            return (
                f"I can't see images: {agent.model} does not read them. Send your question as "
                f"text, or set [agents.{agent.name}].images = true for a vision model."
            )
        if len(message.text) > self._max_chars:
            return (
                f"Your message is {len(message.text):,} characters; the limit is "
                f"{self._max_chars:,} ([limits].max_message_chars). Shorten or split it."
            )
        if message.attachments:
            return self._screened(message)
        return None

    def _screened(self, message: ChannelMessage) -> str | None:
        if not self.screens:  # nothing wired reads them: say so rather than drop them
            names = ", ".join(each.name for each in message.attachments)
            return f"I can't open attached files here ({names}): send what matters as text."
        for screen in self.screens:
            if (why := screen(message)) is not None:
                return why
        return None

    async def _not_recorded(self, message: ChannelMessage, error: StoreError) -> None:
        if message.redeliverable and isinstance(error, WriteRefused):
            logger.debug("%s message %s left for redelivery: %s", *_origin(message), error)
            await self._tell_refused_once(message, error)
            raise error
        if message.redeliverable:
            logger.warning(
                "%s message %s not recorded, left for the platform to deliver again: %s",
                *_origin(message),
                error,
            )
            raise error
        logger.warning("%s message %s could not be recorded: %s", *_origin(message), error)
        await self._channels[message.platform].notify(
            message.place,
            f"I could not save your message: {error.plainly}. Please send it again in a minute.",
        )

    async def _tell_refused_once(self, message: ChannelMessage, error: WriteRefused) -> None:
        """Tell the place why its message waits, unless it was told during this outage."""
        refusal = self._store.writes.current
        serial = refusal.serial if refusal is not None else -1  # ended since: tell, once more
        known, told = self._told_outage
        if serial != known:
            told = set()
            self._told_outage = (serial, told)
        if message.place in told:
            return
        notice = (
            f"I cannot save messages right now: {error.plainly}. Your message will be answered "
            "when that is fixed; nothing is lost."
        )
        try:
            await self._channels[message.platform].notify(message.place, notice)
        except Exception as exc:  # the message stays the platform's: tell it at a redelivery
            logger.warning("could not tell %s why its message waits: %s", message.place, exc)
            return
        told.add(message.place)

    async def _run_forwarded(self, message: ChannelMessage) -> None:
        """A command another worker received for a conversation this one owns."""
        command = parse_command(message.text)
        if command is not None:
            await self._run_command(message, self._channels[message.platform], command)

    async def _run_command(
        self, message: ChannelMessage, channel: Channel, command: Command
    ) -> None:
        try:
            await self.commands.run(message, channel, command)
        except Exception:
            logger.exception("command /%s in %s failed", command.name, message.place)
            await channel.notify(message.place, f"/{command.name} failed; see the log for why.")


def _inbound(message: ChannelMessage, status: str) -> Inbound:
    return Inbound(
        platform=message.platform,
        platform_message_id=message.message_id,
        place=message.place,
        text=message.text,
        author=message.author_name or message.author_id,
        author_id=message.author_id,
        status=status,
        attachments=message.attachments,
    )


def _origin(message: ChannelMessage) -> tuple[str, str]:
    return message.platform, message.message_id
