"""Start-up: whatever a dead process left half done is resolved in its place, once.

A process can die at any instruction (kill -9, an out-of-memory kill, a power loss), and a
shutdown may leave messages queued. Nobody may be left with a reply that looks alive forever, or
with a message that is never answered. So before the channels start, the store is asked what an
earlier process left (`leftovers`); once a place's channel is connected, each is resolved there
(`Recovery.resolve`):

- A turn left `running` is closed in the store first (`interrupted`; a tool call without a
  result gets one, so the stored history is well-formed), then:
  - if its reply had posted messages, the reply is taken up again and ends with "(interrupted by
    a restart)" (one that showed only its status line says which message to send again: a
    voice note or a document being read when the process died, named as the person knows it);
  - else, if it ran no tool and was a first attempt, its message is run again, once (a second
    attempt is never run again: a message that crashes Kaiwa cannot make it crash forever);
  - else the person is told, in their own words, that the message was not finished and should
    be sent again (a scheduled run: that it was cut short; a turn that carried sub-agents'
    reports says nothing, as the reports are carried again by a turn of their own).
  Whatever was said is marked in the store at once, so no later start, and no worker taking the
  place over, says it again.
- A message recorded for a turn that never started (a crash between the two, or a shutdown with
  messages queued) is answered, oldest first. It is taken over by its claim first, so a
  redelivery of the same message racing it is answered once (`core.dispatch.dispatcher`).

- What a turn part left (`core.turns.parts.Leftover`: sub-agent runs lost and reports not yet
  delivered, questions left unanswered, plans cut short, scheduled runs under way) is read with
  the rest, before anything of this process runs, and shown once the channels are connected:
  each part says what is left of it, so recovery names none of them.

Records before notices (invariant 5 in `core.turns.runner`): a turn is closed in the store before
its place hears of it. With several workers, the same happens place by place, when a worker
takes a place over (`core.cluster.owners`).
"""

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field

from core.channel import (
    Attachment,
    AttachmentKind,
    Channel,
    Delivery,
    OnPost,
    Outcome,
    platform_of,
)
from core.store import UNSURE_DELIVERY, Store, Unfinished, attachments_of, not_awaited
from core.store.tables import InboundEvent
from core.turns.parts import Leftover, TurnParts
from core.turns.runner import TurnRunner
from core.turns.turn import CUT_FIRING, Provenance, TurnRequest

logger = logging.getLogger(__name__)

INTERRUPTED = "Kaiwa stopped before this turn finished (the process ended without a shutdown)"
EXCERPT_CHARS = 60
CONNECT_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Leftovers:
    """What an earlier process left: turns still `running`, messages no turn took up, endings
    never shown, and what each turn part left."""

    turns: list[Unfinished] = field(default_factory=list)
    messages: list[InboundEvent] = field(default_factory=list)
    undelivered: list[Unfinished] = field(default_factory=list)
    """Turns stored as ended whose last edit was never made."""
    parts: list[Leftover] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.turns or self.messages or self.undelivered or self.parts)


async def leftovers(store: Store, parts: TurnParts, place: str | None = None) -> Leftovers:
    """Read before anything of this process runs (in `place` only, when a worker takes it
    over): all that is running then is left over. A place taken over has no unanswered messages
    of its own to read: its new owner picks its queued messages up."""
    return Leftovers(
        await store.unfinished_turns(place),
        await store.unanswered_messages() if place is None else [],
        await store.undelivered_turns(place),
        await parts.left_over(place),
    )


class Recovery:
    """Resolves leftovers; as `core.turns.parts.Places`, it is how a part's leftovers reach
    their places once connected."""

    def __init__(self, store: Store, runner: TurnRunner, channels: Mapping[str, Channel]) -> None:
        self._store = store
        self._runner = runner
        self._channels = channels

    async def resolve(self, left: Leftovers) -> None:
        """Resolve every leftover, each platform's once its channel is connected (a platform
        that is no longer configured gets its turns closed in the store, and a line in the log).
        Never raises: a leftover that cannot be resolved is logged and the rest go on."""
        why = {turn: reason for part in left.parts for turn, reason in part.why.items()}
        for unfinished in left.turns:
            reason = why.get(unfinished.turn.id or 0, INTERRUPTED)
            closing = self._store.close_interrupted(unfinished, reason)
            await self._guarded(closing, f"closing turn {unfinished.turn.id}")
        platforms = {platform_of(each.place) for each in [*left.turns, *left.undelivered]} | {
            each.platform for each in left.messages
        }
        await asyncio.gather(*(self._resolve_on(platform, left) for platform in platforms))
        for part in left.parts:
            await self._guarded(part.resume(self), "what a part left at a restart")

    async def ready(self, place: str) -> Channel | None:
        """The channel of `place` once connected; None if its platform is not running or does
        not connect in time."""
        return await self._connected(platform_of(place))

    async def _connected(self, platform: str) -> Channel | None:
        channel = self._channels.get(platform)
        if channel is None:
            return None
        try:
            await asyncio.wait_for(channel.connected.wait(), CONNECT_WAIT_SECONDS)
        except TimeoutError:
            return None
        return channel

    async def say(self, place: str, text: str) -> None:
        """A line in `place`, once its channel is connected."""
        channel = await self.ready(place)
        if channel is None:
            logger.warning("%s: %s (its platform is not running or did not connect)", place, text)
            return
        await channel.notify(place, text)

    async def _resolve_on(self, platform: str, left: Leftovers) -> None:
        turns = [each for each in left.turns if platform_of(each.place) == platform]
        undelivered = [each for each in left.undelivered if platform_of(each.place) == platform]
        messages = [each for each in left.messages if each.platform == platform]
        channel = await self._connected(platform)
        if channel is None:
            logger.warning(
                "%d interrupted turns and %d unanswered messages on %s, which is not running or "
                "did not connect; they stay as they are",
                len(turns),
                len(messages),
                platform,
            )
            return
        for unfinished in turns:
            await self._guarded(self._tell(channel, unfinished), f"turn {unfinished.turn.id}")
        for ended in undelivered:
            await self._guarded(self._show_ending(channel, ended), f"turn {ended.turn.id}")
        for message in messages:
            await self._guarded(self._answer(message), f"message {message.id}")

    async def _show_ending(self, channel: Channel, ended: Unfinished) -> None:
        """A turn that ended and was stored, whose process died before its last edit: the
        edit is made now (on the reply it posted, if it posted one), so the person sees it."""
        turn = ended.turn
        assert turn.id is not None
        if turn.delivery == UNSURE_DELIVERY and not turn.reply_ids:
            await self._unknown_post(channel, ended)  # an answer may be out already
            return
        outcome = Outcome(turn.status)
        note = turn.error if outcome is Outcome.FAILED else None
        reply = channel.open_reply(
            ended.place, ended.reply_to, turn.reply_ids or (), on_post=self._recorder(turn.id)
        )
        await reply.finish(_said(ended), outcome, note)
        await self._store.mark_delivered(turn.id, reply.delivery.value)
        logger.info("turn %s in %s: its ending is shown now", turn.id, ended.place)

    async def _tell(self, channel: Channel, unfinished: Unfinished) -> None:
        """Show the person what became of the turn: the reply marked, the message run again,
        or what they can do. What was said is marked in the store (`mark_delivered`), so the
        next start, or the next worker taking the place over, does not say it again."""
        turn, place = unfinished.turn, unfinished.place
        assert turn.id is not None
        if turn.reply_ids:
            reply = channel.open_reply(place, None, turn.reply_ids, on_post=self._recorder(turn.id))
            said = _said(unfinished)  # a reply that showed only its status line says what to do
            if not said and turn.provenance == Provenance.PERSON:
                said = _resend(unfinished)
            await reply.finish(said, Outcome.INTERRUPTED, None)
            await self._store.mark_delivered(turn.id, reply.delivery.value)
            logger.info("turn %s in %s: its reply is marked interrupted", turn.id, place)
        elif _may_run_again(unfinished):
            self._runner.submit(_again(unfinished))
            logger.info("turn %s in %s: its message is run again", turn.id, place)
        else:
            await self._unknown_post(channel, unfinished)

    async def _unknown_post(self, channel: Channel, unfinished: Unfinished) -> None:
        """A turn that may have posted without its post known, or that cannot run again: said
        in its place in the person's terms (a sub-agents' report turn says nothing: the reports
        it carried are carried again, by a turn of their own), then marked as told."""
        turn, place = unfinished.turn, unfinished.place
        assert turn.id is not None
        if turn.provenance == Provenance.SCHEDULE:
            await channel.notify(place, CUT_FIRING)
            logger.info("turn %s in %s: a scheduled run, said to be cut short", turn.id, place)
        elif turn.provenance == Provenance.PERSON:
            await channel.notify(place, _resend(unfinished))
            logger.info("turn %s in %s: the person is asked to send it again", turn.id, place)
        else:
            logger.info(
                "turn %s in %s: cut short; what it carried is carried again", turn.id, place
            )
        await self._store.mark_delivered(turn.id, Delivery.STALE.value)

    def _recorder(self, turn_id: int) -> OnPost:
        """Records the posts a reply taken up adds, as a turn does (a kill before the ending is
        marked finds them, and edits them instead of posting again)."""

        def record(posted: tuple[str, ...]) -> None:
            not_awaited(self._store.record_posts(turn_id, posted), "recording a reply's posts")

        return record

    async def _answer(self, message: InboundEvent) -> None:
        assert message.id is not None
        if not await self._store.take_over(message.id, message.claim or ""):
            return  # a redelivery of it came first and is being answered
        self._runner.submit(turn_of(message))
        logger.info("a message recorded before the restart is answered now (%s)", message.place)

    async def _guarded(self, step: Awaitable[None], what: str) -> None:
        try:
            await step
        except Exception:
            logger.exception("recovering after a restart: %s failed", what)


def turn_of(message: InboundEvent) -> TurnRequest:
    """The turn that answers a recorded message (after a restart, or on the worker that owns
    its conversation); what the inbox does not keep (its pictures) stays behind."""
    return TurnRequest(
        platform=message.platform,
        place=message.place,
        text=message.text or "",
        author=message.author,
        person=message.author_id,
        reply_to=message.platform_message_id,
        inbound_event_id=message.id,
        attachments=attachments_of(message.attachments),
    )


def _resend(unfinished: Unfinished) -> str:
    asked = unfinished.asked
    if asked is None:
        asked = unfinished.messages[0].text if unfinished.messages else ""
    what = _excerpt(asked) if asked.strip() else _attached(unfinished.attachments)
    return f"I was restarted before I could finish answering {what}. Please send it again."


def _attached(attachments: Sequence[Attachment]) -> str:
    """A message of files alone, as the person knows it: "your voice note", "plan.pdf"."""
    names = [
        "your voice note" if each.kind is AttachmentKind.VOICE else each.name
        for each in attachments
    ]
    return ", ".join(names) or "your message"


def _may_run_again(unfinished: Unfinished) -> bool:
    """Nothing shown, no tool asked for (so running it again repeats no side effect), a
    person's message, and not itself a second attempt. "Nothing shown" is read from the store:
    a frame is saved before it is shown (`core.turns.pump`), and the first one marks the turn
    `unsure` (a status line is a frame too), so a turn without that mark and with no text or
    thinking stored showed nothing. One with it but no reply id may have posted in the instant
    before the id was written (a kill lands anywhere): running it again could answer twice, so
    the person is asked instead."""
    said_something = any(
        message.role == "assistant" and (message.text or message.thinking)
        for message in unfinished.messages
    )
    asked_for_tools = any(
        message.role == "assistant" and message.tool_calls for message in unfinished.messages
    )
    return (
        unfinished.turn.attempt == 1
        and unfinished.reply_to is not None
        and unfinished.turn.delivery != UNSURE_DELIVERY
        and not asked_for_tools
        and not said_something
    )


def _again(unfinished: Unfinished) -> TurnRequest:
    """The person's message once more: their own words (reports it carried are carried again
    by themselves)."""
    first = unfinished.messages[0]
    return TurnRequest(
        platform=platform_of(unfinished.place),
        place=unfinished.place,
        text=unfinished.asked if unfinished.asked is not None else first.text,
        provenance=Provenance(unfinished.turn.provenance),
        author=first.author,
        person=unfinished.person,
        reply_to=unfinished.reply_to,
        inbound_event_id=unfinished.turn.inbound_event_id,
        attachments=unfinished.attachments,
        attempt=2,
    )


def _said(unfinished: Unfinished) -> str:
    """The reply's text as it was displayed: its assistant messages' text, joined."""
    texts = [m.text for m in unfinished.messages if m.role == "assistant" and m.text]
    return "\n\n".join(texts)


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return f"“{flat[:EXCERPT_CHARS]}…”" if len(flat) > EXCERPT_CHARS else f"“{flat}”"
