"""The dispatcher: the one door every inbound message goes through, in a fixed order.

0. While shutting down, leave the message unrecorded and unanswered.
1. Deduplicate by the platform's message id, against a persisted unique index, so a redelivery
   after a restart is still a duplicate and never a second reply.
2. Apply the access rules; a refused person is told so once per message, and no model is called.
3. Match commands before anything queues: a command is never sent to the model and never waits
   behind a running turn.
4. Refuse images the agent's model cannot read, and oversized messages with their size and the
   limit.
5. Start a turn as a background task and return at once, so the channel keeps reading.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.channel import Channel, ChannelMessage
from core.commands import Command, Commands, parse_command
from core.store import Store
from core.turns import TurnRequest, TurnRunner

logger = logging.getLogger(__name__)


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
            return (
                "Sorry, you are not allowed to use this bot. Ask its operator to add your user "
                f"id {message.author_id} to {key}.allowed_users{roles}."
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


class Dispatcher:
    def __init__(
        self,
        store: Store,
        runner: TurnRunner,
        channels: Mapping[str, Channel],
        access: AccessRules,
        *,
        max_message_chars: int,
    ) -> None:
        self._store = store
        self._runner = runner
        self._channels = channels
        self._access = access
        self._max_chars = max_message_chars
        self._commands = Commands(store, runner)

    async def handle(self, message: ChannelMessage) -> None:
        if self._runner.closing:
            # Not recorded, so a platform that redelivers it after the restart gets an answer.
            logger.warning("shutting down: %s message %s left unanswered", *_origin(message))
            return
        event_id = self._store.record_inbound(message.platform, message.message_id, message.place)
        if event_id is None:
            logger.info("duplicate %s message %s ignored", *_origin(message))
            return
        channel = self._channels[message.platform]
        refusal = self._access.refusal(message)
        if refusal is not None:
            logger.warning(
                "refused a message from %s user %s in %s (not on the allow-lists)",
                message.platform,
                message.author_id,
                message.place,
            )
            await self._refuse(event_id, channel, message, refusal)
            return
        command = parse_command(message.text)
        if command is not None:
            self._store.mark_inbound(event_id, "command")
            await self._run_command(message, channel, command)
            return
        refusal = self._content_refusal(message)
        if refusal is not None:
            await self._refuse(event_id, channel, message, refusal)
            return
        self._runner.submit(
            TurnRequest(
                platform=message.platform,
                place=message.place,
                text=message.text,
                author=message.author_name or message.author_id,
                reply_to=message.message_id,
                inbound_event_id=event_id,
                images=message.images,
            )
        )

    def _content_refusal(self, message: ChannelMessage) -> str | None:
        """Why the model cannot take this message, in words for the person, or None."""
        agent = self._runner.settings.agent
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
        return None

    async def _refuse(
        self, event_id: int, channel: Channel, message: ChannelMessage, refusal: str
    ) -> None:
        self._store.mark_inbound(event_id, "refused")
        await channel.notify(message.place, refusal)

    async def _run_command(
        self, message: ChannelMessage, channel: Channel, command: Command
    ) -> None:
        try:
            await self._commands.run(message, channel, command)
        except Exception:
            logger.exception("command /%s in %s failed", command.name, message.place)
            await channel.notify(message.place, f"/{command.name} failed; see the log for why.")


def _origin(message: ChannelMessage) -> tuple[str, str]:
    return message.platform, message.message_id
