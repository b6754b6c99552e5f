"""How a reply appears on a chat platform, shared by every adapter that edits messages in place.

An adapter supplies a `Transport` (send a message, edit one, show "typing", each in the
platform's own markup, with the platform's errors mapped to `RateLimited` and `PlatformError`);
`StreamingReply` does the rest, the same way everywhere:
- The reply is one message that grows: the first frame with something to show sends it, later
  frames edit it. The turn's frame pump paces frames (the channel's `frame_interval`, about one
  a second for Telegram), and the reply itself keeps `min_interval` between two changes, the
  final one included: a stream that ends just after an edit waits out the interval first.
- Past the platform's length limit the text continues in follow-up messages (`split_message`:
  paragraph or line boundaries, code fences closed and reopened). Pieces are recomputed from the
  whole text each time; a piece only changes while it is the last one, so earlier messages are
  not edited again.
- A rate limit (`RateLimited`) delays the next call by what the platform asked. Frames that
  arrive meanwhile are skipped, not queued: the first call after the wait shows the newest state,
  so edits coalesce. `finish` waits out every limit and tries again until the final text shows,
  for up to `final_edit_seconds`; only past that does the platform keep an older text.
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
- "Typing…" shows from the moment the reply opens until the first text is visible. It stops by
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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from channels.formatting import split_message
from channels.presses import STOP
from channels.settings import PlatformSettings
from core.channel import Button, Card, Delivery, Frame, OnPost, Outcome, platform_of
from core.metrics import PLATFORM_API_ERRORS, PLATFORM_RATE_LIMITS

logger = logging.getLogger(__name__)

MARKS = {
    Outcome.STOPPED: "(stopped)",
    Outcome.INTERRUPTED: "(interrupted by a restart)",
    Outcome.CUT: "(cut at the length limit)",
}
"""How a reply that did not end as the model meant shows it, after its text."""


def ending_mark(outcome: Outcome, note: str | None) -> str | None:
    """The mark after a reply's text: the outcome's, with the note of a reply that did not fail
    ("answered at the limit of 10 model calls"); None for a plain answer. A failure shows its
    reason instead, on a line of its own."""
    if outcome is Outcome.FAILED:
        return None
    parts = [MARKS[outcome][1:-1]] if outcome in MARKS else []
    parts += [note] if note else []
    return f"({'; '.join(parts)})" if parts else None


TYPING_REFRESH_SECONDS = 4.0
TYPING_GIVE_UP_SECONDS = 300.0
FINAL_EDIT_SECONDS = 300.0


class RateLimited(Exception):
    """The platform asked us to wait `retry_after` seconds before the next call."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after:g} s")
        self.retry_after = retry_after


class PlatformError(Exception):
    """The platform refused a call, could not be reached, or answered in a way we cannot use;
    the message says which, in words for the log."""


FindLost = Callable[[], Awaitable[str | None]]
"""How a platform looks again for a lost post: its message's id, None if it did not land;
`LostMessage` while that still cannot be told."""


class LostMessage(PlatformError):
    """A post went through, or may have (its answer never came), but nothing says which message
    it made: it is never sent again. `find`, on a platform that lets a bot read its messages
    back (Slack), looks for it again later."""

    def __init__(self, why: str, find: FindLost | None = None) -> None:
        super().__init__(why)
        self.find = find


@contextlib.contextmanager
def counted_refusals(platform: str, *, rate_limits: bool = True) -> Iterator[None]:
    """Each refusal raised through the block counted for the operators (`core.metrics`): a rate
    limit (unless `rate_limits` is off: the library counts them where it meets them), or any
    other failed call of `platform`'s API. A transport's error mapping runs in it."""
    try:
        yield
    except RateLimited:
        if rate_limits:
            PLATFORM_RATE_LIMITS.labels(platform).inc()
        raise
    except PlatformError:
        PLATFORM_API_ERRORS.labels(platform).inc()
        raise


LOST_NOTICE = (
    "(Part of this reply may be missing: a message was sent but the platform did not say it "
    "arrived, and it is not sent twice. The whole reply is kept; ask me to repeat it.)"
)


class Transport(Protocol):
    """One place on one platform (a chat, a thread), in the platform's own terms.

    `buttons` go under the message on a transport with `controls` (each press is its command,
    `channels.presses`); others ignore them. A transport with `buttons_after_post` cannot learn
    which message a lost post made, so a reply posts each message without buttons and adds them
    by an edit. Every call may raise `RateLimited` or `PlatformError`.
    """

    limit: int
    measure: Callable[[str], int]
    controls: bool
    buttons_after_post: bool

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
    """Shortest time between two calls that change the reply (the platform's edit rate)."""
    final_edit_seconds: float = FINAL_EDIT_SECONDS
    """How long `finish` keeps trying to show the final text through rate limits."""

    @classmethod
    def of(cls, settings: PlatformSettings) -> "RenderSettings":
        """A platform's settings, as its replies use them."""
        return cls(
            settings.show_thinking,
            settings.show_tools,
            min_interval=settings.edit_interval,
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
        this reply (taken up again, their text unknown, so the final text replaces them);
        `on_post` hears `posted` after each new post (`core.channel.Channel.open_reply`)."""
        self._transport = transport
        self._on_post = on_post
        self._settings = settings
        self._place = place
        self._shown: list[_Shown] = [_Shown.unknown(message_id) for message_id in posted]
        self._quiet_until = 0.0
        self._refused = False
        self._lost: LostMessage | None = None
        self._newest = ""
        """The text (with its status line) of the newest frame."""
        self._changing = asyncio.Lock()
        """One change at a time: a frame's, or the buttons added after a post (`_add_buttons`)."""
        self._finishing = asyncio.Event()
        self._adding: asyncio.Task[None] | None = None
        self.delivery = Delivery.NOTHING
        self._text_shows = asyncio.Event()
        if self._shown:
            self._text_shows.set()
        self._typing = asyncio.create_task(self._keep_typing(), name=f"typing in {place}")

    @property
    def posted(self) -> tuple[str, ...]:
        return tuple(shown.message_id for shown in self._shown)

    async def update(self, frame: Frame) -> None:
        body = _with_status(frame.text, status_line(frame, self._settings))
        if not body or self._lost is not None:
            return
        self._text_shows.set()
        self._newest = body
        await self._show_live()

    async def _show_live(self) -> bool:
        """The newest frame, with the Stop button, unless it is too soon (an interval or a rate
        limit: a later frame, `_add_buttons` or `finish` shows it); False if it was refused."""
        async with self._changing:
            if self._lost is not None or self._finishing.is_set():
                return True
            if asyncio.get_running_loop().time() < self._quiet_until:
                return True
            try:
                await self._show(self._pieces(self._newest), live=True)
            except RateLimited as limited:
                self._keep_quiet(limited.retry_after)
            except PlatformError as exc:
                self._frame_refused(exc)
                return False
        self._owe_buttons()
        return True

    def _owe_buttons(self) -> None:
        if self._buttons_owed() and (self._adding is None or self._adding.done()):
            self._adding = asyncio.create_task(self._add_buttons(), name=f"Stop in {self._place}")

    def _buttons_owed(self) -> bool:
        """Whether a live message lacks its Stop button (posted without: `buttons_after_post`)."""
        live = self._lost is None and not self._finishing.is_set() and self._transport.controls
        return live and any(not shown.buttons for shown in self._shown)

    async def _add_buttons(self) -> None:
        """The Stop button under each message posted without it, by an edit one interval after
        the next change is allowed, so that a frame coming meanwhile carries it instead: a reply
        whose model stalls after its first words can be stopped all the same. Ends by an event
        (`finish`), never by cancelling."""
        loop = asyncio.get_running_loop()
        while self._buttons_owed():
            wait = self._quiet_until + self._settings.min_interval - loop.time()
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
        if self._adding is not None:
            await asyncio.shield(self._adding)  # a change on its way is let through first
        pieces = self._pieces(final_text(text, outcome, note))
        try:
            await self._show_finally(pieces)
            self.delivery = Delivery.SHOWN
        except (RateLimited, PlatformError) as exc:
            self._not_shown(exc)
            if isinstance(exc, LostMessage):
                await self._tell_lost()
        except Exception:  # not the platform's answer: a bug, for the caller's log
            self.delivery = Delivery.STALE if self._shown else Delivery.NOTHING
            raise
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
            first_wait=self._quiet_until - asyncio.get_running_loop().time(),
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

    def _not_shown(self, error: Exception) -> None:
        self.delivery = Delivery.STALE if self._shown else Delivery.NOTHING
        if isinstance(error, RateLimited):
            platform = platform_of(self._place)
            error = PlatformError(
                f"rate limited past [channels.{platform}].final_edit_seconds = "
                f"{self._settings.final_edit_seconds:g} s"
            )
        shows = "an older text" if self._shown else "nothing of it"
        logger.error(
            "the final text of the reply in %s could not be shown (%s); the platform shows %s",
            self._place,
            error,
            shows,
        )

    async def _tell_lost(self) -> None:
        """One notice, never tried again, where a post may be out unseen by Kaiwa."""
        try:
            await self._transport.send(LOST_NOTICE)
        except (RateLimited, PlatformError) as exc:
            logger.warning("the reply in %s: its notice could not be posted: %s", self._place, exc)

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

    def _keep_quiet(self, seconds: float) -> None:
        until = asyncio.get_running_loop().time() + seconds
        self._quiet_until = max(self._quiet_until, until)

    def _pieces(self, text: str) -> list[str]:
        return split_message(text, self._transport.limit, self._transport.measure)

    async def _show_all(self, pieces: list[str]) -> None:
        """The final text, and no message beyond it."""
        await self._show(pieces, live=False)
        while len(self._shown) > len(pieces):
            extra = self._shown[-1]
            try:
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

    async def _show(self, pieces: list[str], *, live: bool) -> None:
        """Make the platform show `pieces`: edit what changed, send what is new."""
        called = False
        buttons = (STOP,) if live and self._transport.controls else ()
        try:
            for index, piece in enumerate(pieces):
                if index < len(self._shown):
                    shown = self._shown[index]
                    if shown.text != piece or shown.buttons != buttons:
                        called = True
                        await self._transport.edit(shown.message_id, piece, buttons=buttons)
                        shown.text, shown.buttons = piece, buttons
                else:
                    called = True
                    posted_with = () if self._transport.buttons_after_post else buttons
                    message_id = await self._transport.send(piece, buttons=posted_with)
                    self._shown.append(_Shown(message_id, piece, posted_with))
                    self._posts_changed()
        finally:
            if called:
                self._keep_quiet(self._settings.min_interval)

    def _posts_changed(self) -> None:
        if self._on_post is not None:
            self._on_post(self.posted)

    async def _keep_typing(self) -> None:
        """Until the first text shows: the platform's indicator, refreshed before it lapses.
        Ends between two requests, never during one."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TYPING_GIVE_UP_SECONDS
        while not self._text_shows.is_set() and loop.time() < give_up:
            try:
                await self._transport.typing()
            except Exception as exc:  # a missing indicator is not worth a failed reply
                logger.debug("typing indicator in %s failed: %s", self._place, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TYPING_REFRESH_SECONDS):
                    await self._text_shows.wait()


async def keep_trying(
    attempt: Callable[[], Awaitable[object]],
    seconds: float,
    *,
    first_wait: float = 0.0,
    done: Callable[[], bool] = lambda: False,
) -> None:
    """Call `attempt` until it is not rate limited (or `done()` says nothing is left to do),
    waiting before each try as long as the platform asked. Raises the last `RateLimited` once
    the next try would come later than `seconds` from now."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    wait = max(0.0, first_wait)
    while not done():
        if loop.time() + wait > deadline:
            raise RateLimited(wait)
        await asyncio.sleep(wait)
        try:
            await attempt()
            return
        except RateLimited as limited:
            logger.info("rate limited: trying again in %g s", limited.retry_after)
            wait = limited.retry_after


async def send_notice(
    transport: Transport,
    text: str,
    seconds: float = FINAL_EDIT_SECONDS,
    buttons: Sequence[Button] = (),
) -> tuple[str, ...]:
    """A standalone message (a command's answer, a refusal), split at the limit, sent in full
    through rate limits for up to `seconds` a piece, `buttons` under its last piece; the ids of
    the messages posted. Raises `PlatformError` (or `RateLimited` past the deadline) when a
    piece cannot be sent."""
    pieces = split_message(text, transport.limit, transport.measure)
    under = [()] * (len(pieces) - 1) + [tuple(buttons) if transport.controls else ()]
    posted: list[str] = []

    async def send(piece: str, its_buttons: tuple[Button, ...]) -> None:
        posted.append(await transport.send(piece, buttons=its_buttons))

    for piece, its_buttons in zip(pieces, under, strict=True):
        await keep_trying(lambda piece=piece, b=its_buttons: send(piece, b), seconds)
    return tuple(posted)


async def replace_notice(
    transport: Transport, message_id: str, text: str, seconds: float = FINAL_EDIT_SECONDS
) -> None:
    """Replace a notice's text (cut to one message) and take its buttons away."""
    piece = split_message(text, transport.limit, transport.measure)[0]
    await keep_trying(lambda: transport.edit(message_id, piece), seconds)


def status_line(frame: Frame, settings: RenderSettings) -> str:
    """What the reply is doing, in a few words ("using current_time…", "thinking…"), or ""."""
    if frame.activity and settings.show_tools:
        return frame.activity
    if frame.thinking and settings.show_thinking and not frame.text:
        return "thinking…"
    return ""


def final_text(text: str, outcome: Outcome, note: str | None) -> str:
    """The reply's last form: the answer, then the stop mark or the failure reason."""
    mark = ending_mark(outcome, note)
    if mark:
        return _marked(text, mark)
    if outcome is Outcome.FAILED:
        reason = f"⚠️ {note}" if note else "⚠️ the reply failed"
        return f"{text}\n\n{reason}" if text else reason
    return text


def _marked(text: str, mark: str) -> str:
    """The text, then one space and the mark (however the text ended)."""
    text = text.rstrip()
    return f"{text} {mark}" if text else mark


def _with_status(text: str, status: str) -> str:
    if not status:
        return text
    line = f"_{status}_"
    return f"{text}\n\n{line}" if text else line
