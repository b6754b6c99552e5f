"""How a reply appears on a chat platform, shared by every adapter that edits messages in place.

An adapter supplies a `Transport` (send a message, edit one, show "typing", each in the
platform's own markup, with the platform's errors mapped to `RateLimited` and `PlatformError`);
`StreamingReply` does the rest, the same way everywhere:
- The reply is one message that grows. Its first post waits `post_grace` after the first frame
  with something to show, so a reply complete by then goes out as one message, its final text,
  with no post followed by an edit; later frames edit it. The turn's frame pump paces frames (the
  channel's `frame_interval`, about one a second for Telegram), and the reply keeps
  `min_interval` between two changes while it streams, but never before its final text.
- The first post and the final text never both go out: `finish` lets a first post on its way
  land first, and a first post still waiting for room stands aside when the final text comes, so
  a reply complete within the grace is one message (test_rendering.py,
  `test_a_reply_complete_within_the_grace_is_one_message`; test_pacing.py per platform).
- Every call asks the place's `Pace` first (`channels.budget`: the platform's limits, shared by
  every reply of the bot): the final text and the first words wait for room, most urgent first;
  edits of partial text, status lines and "typing…" go only if room is left, and are skipped
  otherwise. A first post goes only while the edit that would end it finds room too (a third of
  its windows left), and that edit's room is then reserved in the bot's shared windows until the
  reply ends (`_ReplyPace.final_room_kept`, claimed before the post is awaited, so replies
  posting at once count each other's): in a burst that has spent the edits, a reply is posted
  whole when it ends, one call instead of a post and an edit that waits (test_rendering.py,
  `test_a_reply_whose_final_edit_would_wait_is_posted_whole`; test_limits.py per platform).
  A frame held back (by the interval, a rate limit or the budget) is not queued: the next
  change shows the newest state, and when no frame comes (a model that stalls after its
  first words), the reply shows it itself as soon as a change is allowed again.
- Past the platform's length limit the text continues in follow-up messages (`split_message`:
  paragraph or line boundaries, code fences closed and reopened). Pieces are recomputed from the
  whole text each time; a piece only changes while it is the last one, so earlier messages are
  not edited again.
- A rate limit the platform answers anyway (`RateLimited`) delays the place's next call by what
  the platform asked. Frames that arrive meanwhile are skipped, not queued: the first call after
  the wait shows the newest state, so edits coalesce. `finish` waits out every limit and tries
  again until the final text shows, for up to `final_edit_seconds`; only past that does the
  platform keep an older text.
- A refused call (`PlatformError`) costs a frame, logged once per reply; `finish` tries the final
  text once more and then gives up. A post whose answer lacks the message's id, or never came
  (`LostMessage`: the post may be out), ends the reply's calls: the message cannot be edited,
  and posting it again might show it twice. `finish` looks for it once more where the platform
  lets a bot read its messages back (`LostMessage.find`, Slack's): found, it shows the final
  text, without its Stop button, and the reply ends as any other. Otherwise the messages before
  it take their final form, and one short notice is posted instead of the rest, so the person
  knows part of the reply may be missing and that it was kept.
- `delivery` says what the platform shows once `finish` returns: the final text (`SHOWN`), an
  older one (`STALE`), or nothing (`NOTHING`, not one message posted).
- Thinking and tool activity appear as one status line under the text while the reply streams,
  and never in the final text. A stopped reply ends with "(stopped)"; a failed one with its reason.
- "Typing…" shows from the moment the reply opens until its first message is posted. It stops by
  an event, never by cancelling: a request cancelled in flight can leave its pooled connection
  taken for good (httpx/httpcore), and enough of those starve every later call.
- A platform whose messages can carry buttons (`Transport.controls`) shows a Stop button
  (`channels.presses.STOP`) under every message of the reply while it streams; `finish` shows
  each one's final form without it, editing a message whose text is already final just to take
  the button away. Where a lost post can never be found (`Transport.buttons_after_post`:
  Telegram), a message is posted without the button, which comes with the reply's next edit:
  the next frame's, or, when none comes within an interval, one the reply makes itself (so a
  model that stalls after its first words can still be stopped). A lost post then shows no
  button that nothing could take away.
- A reply taken up after a restart (`posted`) starts from those messages, text unknown, so the
  final text replaces them; it shows no "typing…", since text is already there.
- The final text may need fewer messages than were shown (a status line that spilled into a
  message of its own, or a reply taken up with more messages than its final text): the extra
  ones are deleted, so none is left with stale text or a Stop control. One the platform will not
  delete is logged and left.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from channels.budget import FREE, NOTHING_RESERVED, Action, Pace, Slot, Urgency
from channels.calls import LostMessage, PlatformError, RateLimited, keep_trying, paced
from channels.formatting import split_message
from channels.marks import final_text
from channels.presses import STOP
from channels.settings import PlatformSettings
from core.channel import Button, Card, Delivery, Frame, OnPost, Outcome, platform_of

logger = logging.getLogger(__name__)

TYPING_REFRESH_SECONDS = 4.0
SKIPPED_PAUSE_SECONDS = 0.1
"""The least a reply waits before it tries again a change the budget had no room for."""
TYPING_GIVE_UP_SECONDS = 300.0
FINAL_EDIT_SECONDS = 300.0


LOST_NOTICE = (
    "(Part of this reply may be missing: a message was sent but the platform did not say it "
    "arrived, and it is not sent twice. The whole reply is kept; ask me to repeat it.)"
)


class Transport(Protocol):
    """One place on one platform (a chat, a thread), in the platform's own terms.

    `buttons` go under the message on a transport with `controls` (each press is its command,
    `channels.presses`); others ignore them. A transport with `buttons_after_post` cannot learn
    which message a lost post made, so a reply posts each message without buttons and adds them
    by an edit. `pace` is the place's share of the platform's limits, asked before every call
    (`channels.budget.UNLIMITED` where there are none). Every call may raise `RateLimited` or
    `PlatformError`.
    """

    limit: int
    measure: Callable[[str], int]
    controls: bool
    buttons_after_post: bool
    pace: Pace

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        """Post a new message with `text` (Markdown); return its id (`LostMessage` if the
        platform's answer does not say it)."""
        ...

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        """Replace a message's text (Markdown) and buttons."""
        ...

    async def delete(self, message_id: str) -> None:
        """Remove a message the reply no longer needs."""
        ...

    async def typing(self) -> None:
        """Show that the bot is working (a platform may let this lapse after a few seconds)."""
        ...


@dataclass(frozen=True)
class RenderSettings:
    show_thinking: bool = True
    show_tools: bool = True
    min_interval: float = 0.0
    """Shortest time between two changes of a streaming reply (its final text does not wait)."""
    post_grace: float = 0.0
    """How long the first post waits, so that a reply complete by then is one message."""
    final_edit_seconds: float = FINAL_EDIT_SECONDS
    """How long `finish` keeps trying to show the final text through rate limits."""

    @classmethod
    def of(cls, settings: PlatformSettings) -> "RenderSettings":
        """A platform's settings, as its replies use them."""
        return cls(
            settings.show_thinking,
            settings.show_tools,
            min_interval=settings.edit_interval,
            post_grace=settings.post_grace,
            final_edit_seconds=settings.final_edit_seconds,
        )


@dataclass
class _Shown:
    message_id: str
    text: str
    buttons: tuple[Button, ...]
    """Shown under it (a Stop button, which the final form must take away)."""

    @classmethod
    def unknown(cls, message_id: str) -> "_Shown":
        """A message of the reply whose text is not known here (posted by an earlier process,
        or a lost post found later), so the final text replaces it, and its Stop button goes."""
        return cls(message_id, "", (STOP,))


class _ReplyPace:
    """When one reply may call its platform: its place's budget (`channels.budget.Pace`), the
    platform's own 429s, the interval between two live changes, and the room the reply keeps in
    the bot's shared windows for its final text once it is live."""

    def __init__(self, pace: Pace, min_interval: float, finishing: asyncio.Event) -> None:
        self._pace = pace
        self._min_interval = min_interval
        self._finishing = finishing
        self.retry_at = 0.0
        """No call before this (the platform's own 429)."""
        self._next_change_at = 0.0
        """No change of the streaming reply before this (`min_interval`)."""
        self._reservation = NOTHING_RESERVED

    def change_allowed_at(self) -> float:
        return max(self.retry_at, self._next_change_at)

    def release(self) -> None:
        """The reply has ended: the room kept for its final text is the others' again."""
        self._reservation.release()

    def final_room_kept(self) -> bool:
        """Whether the first words may go live: only with room for the edit that will end them,
        which is then kept for it, before the post is awaited (replies posting at once each
        count the others' claims)."""
        if self._reservation is NOTHING_RESERVED:
            if not self._pace.has_room(Action.EDIT, Urgency.PARTIAL):
                return False
            self._reservation = self._pace.reserve(Action.EDIT)
        return True

    async def room(self, action: Action, urgency: Urgency) -> Slot | None:
        """Room for the call, if it may go now: the final text waits for it, the first words
        too (unless the final text comes first), the rest only take what is left."""
        if urgency is Urgency.FINAL:
            return await self._pace.wait(action, urgency)
        if urgency is Urgency.FIRST:
            return await self._pace.wait(action, urgency, unless=self._finishing)
        return self._pace.take(action, urgency)

    @contextlib.contextmanager
    def calling(self, action: Action, slot: Slot, live: bool = False) -> Iterator[None]:
        """One call in its `slot`: a 429 is waited out by the place; a live change, made or
        not, keeps the next one `min_interval` away."""
        try:
            yield
        except RateLimited as limited:
            self._limited(action, limited)
            raise
        finally:
            slot.landed()
            if live:
                self.pause_changes()

    def _limited(self, action: Action, limited: RateLimited) -> None:
        """The platform's own 429: this reply, and every call of its place, wait it out."""
        until = asyncio.get_running_loop().time() + limited.retry_after
        self.retry_at = max(self.retry_at, until)
        self._pace.hold(action, limited.retry_after)

    def pause_changes(self, seconds: float = 0.0) -> None:
        """No live change for `seconds`, nor within `min_interval`."""
        until = asyncio.get_running_loop().time() + max(seconds, self._min_interval)
        self._next_change_at = max(self._next_change_at, until)


class StreamingReply:
    def __init__(
        self,
        transport: Transport,
        settings: RenderSettings,
        place: str,
        posted: Sequence[str] = (),
        on_post: OnPost | None = None,
    ) -> None:
        """`place` names the reply in the log; `posted`: messages an earlier process posted for
        this reply (their text unknown: the final text replaces them); `on_post` hears `posted`
        after each new post (`core.channel.Channel.open_reply`)."""
        self._transport = transport
        self._on_post = on_post
        self._settings = settings
        self._place = place
        self._shown: list[_Shown] = [_Shown.unknown(message_id) for message_id in posted]
        self._refused = False
        self._lost: LostMessage | None = None
        self._newest = ""
        """The text (with its status line) of the newest frame."""
        self._newest_words = ""
        self._words_shown: str | None = None
        """The words (without the status line) of the last frame shown whole."""
        self._changing = asyncio.Lock()
        """One change at a time: a frame's, the first post's, or one the reply catches up on."""
        self._finishing = asyncio.Event()
        self._timing = _ReplyPace(transport.pace, settings.min_interval, self._finishing)
        self._posting: asyncio.Task[None] | None = None
        self._grace_over = bool(self._shown)
        self._behind = False
        """The newest frame is not shown whole yet."""
        self._catching: asyncio.Task[None] | None = None
        self.delivery = Delivery.NOTHING
        self._text_shows = asyncio.Event()
        if self._shown:
            self._text_shows.set()
        typing = _keep_typing(transport, self._text_shows, place)
        self._typing = asyncio.create_task(typing, name=f"typing in {place}")

    @property
    def posted(self) -> tuple[str, ...]:
        return tuple(shown.message_id for shown in self._shown)

    async def update(self, frame: Frame) -> None:
        body = _with_status(frame.text, status_line(frame, self._settings))
        if not body or self._lost is not None:
            return
        self._newest, self._newest_words = body, frame.text
        if self._grace_over or self._settings.post_grace <= 0:
            await self._show_live()
        elif self._posting is None:
            self._posting = asyncio.create_task(self._post_first(), name=f"post in {self._place}")

    async def _post_first(self) -> None:
        """The first message, once `post_grace` has passed without the final text (which is
        then posted instead). Ends by an event (`finish`), never by cancelling."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._settings.post_grace):
                await self._finishing.wait()
        self._grace_over = True
        await self._show_live()

    async def _show_live(self) -> bool:
        """The newest frame, with the Stop button, unless it is too soon (an interval, a rate
        limit, no room in the budget: a later frame, `_catch_up` or `finish` shows it); False
        if it was refused."""
        async with self._changing:
            if self._lost is not None or self._finishing.is_set():
                return True
            self._behind = True
            if asyncio.get_running_loop().time() < self._timing.change_allowed_at():
                return self._owe_changes()
            words = self._newest_words
            try:
                if await self._show(self._pieces(self._newest), self._live_urgency(words)):
                    self._words_shown, self._behind = words, False
                else:
                    self._timing.pause_changes(SKIPPED_PAUSE_SECONDS)
            except RateLimited:
                pass  # the place waits it out (`_show`)
            except PlatformError as exc:
                self._frame_refused(exc)
                return False
        return self._owe_changes()

    def _live_urgency(self, words: str) -> Urgency:
        """How much a streaming frame matters: the first words most, new words next, a change
        of the status line alone least."""
        if not self._shown:
            return Urgency.FIRST if words else Urgency.STATUS
        return Urgency.STATUS if words == self._words_shown else Urgency.PARTIAL

    def _owe_changes(self) -> bool:
        if self._changes_owed() and (self._catching is None or self._catching.done()):
            name = f"catching up in {self._place}"
            self._catching = asyncio.create_task(self._catch_up(), name=name)
        return True

    def _changes_owed(self) -> bool:
        """Whether the streaming reply shows less than it should: a frame held back, or a
        message posted without its Stop button (`buttons_after_post`)."""
        if self._lost is not None or self._finishing.is_set():
            return False
        buttons = self._transport.controls and any(not shown.buttons for shown in self._shown)
        return self._behind or buttons

    async def _catch_up(self) -> None:
        """What the reply owes, shown by the reply itself: a held-back frame as soon as a change
        is allowed again, and the Stop button of a message posted without it one interval after
        that (a frame coming meanwhile carries it instead). So a reply whose model stalls after
        its first words shows them and can be stopped. Ends by an event (`finish`), never by
        cancelling."""
        loop = asyncio.get_running_loop()
        while self._changes_owed():
            allowed = self._timing.change_allowed_at()
            wait = allowed - loop.time() + (0.0 if self._behind else self._settings.min_interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wait)):
                    await self._finishing.wait()
            if not await self._show_live():
                return

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        """Show the final text, through rate limits for up to `final_edit_seconds`; set
        `delivery`. A platform that will not show it is logged, never raised."""
        self._text_shows.set()
        self._finishing.set()
        for change in (self._posting, self._catching):  # a change on its way goes first
            if change is not None:
                await asyncio.shield(change)
        pieces = self._pieces(final_text(text, outcome, note))
        try:
            await self._show_finally(pieces)
            self.delivery = Delivery.SHOWN
        except (RateLimited, PlatformError) as exc:
            self.delivery = Delivery.STALE if self._shown else Delivery.NOTHING
            _log_not_shown(self._place, exc, bool(self._shown), self._settings)
            if isinstance(exc, LostMessage):
                await _tell_lost(self._transport, self._place)
        except Exception:  # not the platform's answer: a bug, for the caller's log
            self.delivery = Delivery.STALE if self._shown else Delivery.NOTHING
            raise
        finally:
            self._timing.release()
        await asyncio.shield(self._typing)  # ends at its next turn; a request in flight goes on

    async def _show_finally(self, pieces: list[str]) -> None:
        await self._find_lost()
        if self._lost is not None:
            await self._final_form_before_the_lost(pieces)
            raise self._lost
        await self._keep_showing(pieces)

    async def _keep_showing(self, pieces: list[str]) -> None:
        """`pieces` and no message beyond them, through rate limits (`final_edit_seconds`)."""
        await keep_trying(
            lambda: self._show_all(pieces),
            self._settings.final_edit_seconds,
            first_wait=self._timing.retry_at - asyncio.get_running_loop().time(),
            done=lambda: self._shows_finally(pieces),
        )

    async def _find_lost(self) -> None:
        """A lost post, looked for once more where the platform lets a bot read its messages
        (`LostMessage.find`): found, the reply goes on with it; known not to have landed, the
        reply posts the rest. Never posted again while it may be out."""
        lost = self._lost
        if lost is None or lost.find is None:
            return
        try:
            message_id = await lost.find()
        except (RateLimited, PlatformError) as exc:
            logger.warning("the reply in %s: its lost post is not found: %s", self._place, exc)
            return
        self._lost = None
        if message_id is not None:
            self._shown.append(_Shown.unknown(message_id))
            self._posts_changed()

    async def _final_form_before_the_lost(self, pieces: list[str]) -> None:
        """The messages before a lost post, in their final form, without the Stop button (the
        rest of the text has no message it can go in)."""
        try:
            await self._keep_showing(pieces[: len(self._shown)])
        except (RateLimited, PlatformError) as exc:
            logger.warning(
                "the reply in %s: the messages before its lost post keep an older form: %s",
                self._place,
                exc,
            )

    def _shows_finally(self, pieces: list[str]) -> bool:
        shown = self._shown
        return pieces == [s.text for s in shown] and not any(s.buttons for s in shown)

    def _frame_refused(self, exc: PlatformError) -> None:
        if isinstance(exc, LostMessage):
            self._lost = exc
            logger.error("the reply in %s stops here: %s", self._place, exc)
        elif not self._refused:
            self._refused = True
            logger.warning("a frame of the reply in %s was not shown: %s", self._place, exc)

    def _pieces(self, text: str) -> list[str]:
        return split_message(text, self._transport.limit, self._transport.measure)

    async def _show_all(self, pieces: list[str]) -> None:
        """The final text, and no message beyond it."""
        await self._show(pieces, Urgency.FINAL)
        while len(self._shown) > len(pieces):
            extra, slot = self._shown[-1], await self._timing.room(Action.DELETE, Urgency.FINAL)
            try:
                with self._timing.calling(Action.DELETE, slot or FREE):
                    await self._transport.delete(extra.message_id)
            except RateLimited:
                raise  # tried again, after the wait
            except PlatformError as exc:
                logger.warning(
                    "a message the reply in %s no longer needs could not be deleted: %s",
                    self._place,
                    exc,
                )
            self._shown.pop()
            self._posts_changed()

    async def _show(self, pieces: list[str], urgency: Urgency) -> bool:
        """Make the platform show `pieces` (live, with the Stop button, unless `urgency` is the
        final text's): edit what changed, send what is new, each call once the budget has room;
        False if it had none for one of them (the rest is left to a later frame)."""
        live = urgency is not Urgency.FINAL
        buttons = (STOP,) if live and self._transport.controls else ()
        for index, piece in enumerate(pieces):
            if index < len(self._shown):
                shown = self._shown[index]
                if shown.text == piece and shown.buttons == buttons:
                    continue
                if not (slot := await self._timing.room(Action.EDIT, urgency)):
                    return False
                with self._timing.calling(Action.EDIT, slot, live):
                    await self._transport.edit(shown.message_id, piece, buttons=buttons)
                shown.text, shown.buttons = piece, buttons
            else:
                if live and index == 0 and not self._timing.final_room_kept():
                    return False  # no room for the edit that would end it: posted whole later
                if not (slot := await self._timing.room(Action.POST, urgency)):
                    return False
                posted_with = () if self._transport.buttons_after_post else buttons
                with self._timing.calling(Action.POST, slot, live):
                    message_id = await self._transport.send(piece, buttons=posted_with)
                self._shown.append(_Shown(message_id, piece, posted_with))
                self._text_shows.set()
                self._posts_changed()
        return True

    def _posts_changed(self) -> None:
        if self._on_post is not None:
            self._on_post(self.posted)


def _log_not_shown(place: str, error: Exception, shown: bool, settings: RenderSettings) -> None:
    if isinstance(error, RateLimited):
        error = PlatformError(
            f"rate limited past [channels.{platform_of(place)}].final_edit_seconds = "
            f"{settings.final_edit_seconds:g} s"
        )
    logger.error(
        "the final text of the reply in %s could not be shown (%s); the platform shows %s",
        place,
        error,
        "an older text" if shown else "nothing of it",
    )


async def _tell_lost(transport: Transport, place: str) -> None:
    """One notice, never tried again, where a post may be out unseen by Kaiwa."""
    try:
        async with paced(transport.pace, Action.POST):
            await transport.send(LOST_NOTICE)
    except (RateLimited, PlatformError) as exc:
        logger.warning("the reply in %s: its notice could not be posted: %s", place, exc)


async def _keep_typing(transport: Transport, shows: asyncio.Event, place: str) -> None:
    """Until `shows` (the reply's first message is posted): the platform's indicator,
    refreshed before it lapses, when the budget has room for it. Ends between two requests,
    never during one."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + TYPING_GIVE_UP_SECONDS
    while not shows.is_set() and loop.time() < give_up:
        try:
            if slot := transport.pace.take(Action.TYPING, Urgency.TYPING):
                try:
                    await transport.typing()
                finally:
                    slot.landed()
        except Exception as exc:  # a missing indicator is not worth a failed reply
            logger.debug("typing indicator in %s failed: %s", place, exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TYPING_REFRESH_SECONDS):
                await shows.wait()


def status_line(frame: Frame, settings: RenderSettings) -> str:
    """What the reply is doing, in a few words ("using current_time…", "thinking…"), or ""."""
    if frame.activity and settings.show_tools:
        return frame.activity
    if frame.thinking and settings.show_thinking and not frame.text:
        return "thinking…"
    return ""


def _with_status(text: str, status: str) -> str:
    if not status:
        return text
    line = f"_{status}_"
    return f"{text}\n\n{line}" if text else line
