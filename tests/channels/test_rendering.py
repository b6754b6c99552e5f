"""StreamingReply on a recording transport: growth by edits, overflow, rate limits, refusals,
marks, "typing…", and replies taken up after a restart."""

import asyncio
from collections.abc import Sequence

import pytest

from channels.budget import UNLIMITED, Action, Budget, Limit, Pace, Urgency
from channels.calls import LostMessage, PlatformError, RateLimited
from channels.marks import final_text
from channels.notices import send_notice
from channels.presses import STOP
from channels.rendering import LOST_NOTICE, RenderSettings, StreamingReply
from core.channel import Button, Delivery, Frame, Outcome
from tests.fakes.patience import deadline

PLACE = "test:board"
DELETED = "<deleted>"
GUARD_SECONDS = deadline()  # no test here waits this long unless something is wrong


class Board:
    """A platform as a list of messages. `limited` makes the next calls raise RateLimited,
    `refusals` raise what they hold; `answers_lost` names posts (by their place in order) that
    land but raise `LostMessage`, as a post whose answer never came; `typing_gate`, once set to
    an event, keeps each "typing…" call in flight until it is set. `posted` is set by each post,
    `edited` by each edit."""

    limit = 50
    pace: Pace = UNLIMITED

    def __init__(self, *, controls: bool = False, buttons_after_post: bool = False) -> None:
        self.controls = controls
        self.buttons_after_post = buttons_after_post
        self.answers_lost: set[int] = set()
        self.edited = asyncio.Event()
        self.posted = asyncio.Event()
        self.messages: list[str] = []
        self.live: list[bool] = []
        """Whether each message shows the Stop button."""
        self.calls: list[str] = []
        self.typing_shown = asyncio.Event()
        self.typing_gate: asyncio.Event | None = None
        self.typings_completed = 0
        self.limited: list[float] = []
        self.refusals: list[PlatformError] = []

    @staticmethod
    def measure(text: str) -> int:
        return len(text)

    async def send(self, text: str, *, buttons: Sequence[Button] = ()) -> str:
        self._maybe_limit("send")
        self.messages.append(text)
        self.live.append(buttons == (STOP,))
        self.posted.set()
        if len(self.messages) - 1 in self.answers_lost:
            raise LostMessage("the answer never came")
        return str(len(self.messages) - 1)

    async def edit(self, message_id: str, text: str, *, buttons: Sequence[Button] = ()) -> None:
        self._maybe_limit("edit")
        self.messages[int(message_id)] = text
        self.live[int(message_id)] = buttons == (STOP,)
        self.edited.set()

    async def delete(self, message_id: str) -> None:
        self._maybe_limit("delete")
        self.messages[int(message_id)] = DELETED
        self.live[int(message_id)] = False

    async def typing(self) -> None:
        self.calls.append("typing")
        self.typing_shown.set()
        if self.typing_gate is not None:
            await self.typing_gate.wait()
        self.typings_completed += 1

    def _maybe_limit(self, call: str) -> None:
        self.calls.append(call)
        if self.refusals:
            raise self.refusals.pop(0)
        if self.limited:
            raise RateLimited(self.limited.pop(0))


@pytest.fixture
def board() -> Board:
    return Board()


async def test_a_reply_grows_in_one_message(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("Hello"))
    await reply.update(Frame("Hello there"))
    await reply.finish("Hello there.", Outcome.DONE, None)

    assert board.messages == ["Hello there."]
    assert [c for c in board.calls if c != "typing"] == ["send", "edit", "edit"]


async def test_typing_shows_until_the_first_text(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await board.typing_shown.wait()
    await reply.update(Frame("Hi"))
    await reply.finish("Hi", Outcome.DONE, None)
    assert board.calls[0] == "typing"


async def test_overflow_continues_in_a_new_message_and_keeps_fences(board: Board) -> None:
    text = "First paragraph here.\n\n```py\nprint(1)\nprint(2)\nprint(3)\nprint(4)\n```"
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame(text[:30]))
    await reply.finish(text, Outcome.DONE, None)

    assert len(board.messages) >= 2
    assert all(len(message) <= Board.limit for message in board.messages)
    assert all(message.count("```") % 2 == 0 for message in board.messages)


async def test_status_line_shows_while_streaming_but_not_at_the_end(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("", thinking="hmm"))
    assert board.messages == ["_thinking…_"]
    await reply.update(Frame("Answer", activity="using current_time…"))
    assert board.messages == ["Answer\n\n_using current_time…_"]
    await reply.finish("Answer", Outcome.DONE, None)
    assert board.messages == ["Answer"]


async def test_status_line_can_be_switched_off(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(show_thinking=False, show_tools=False), PLACE)
    await reply.update(Frame("", thinking="hmm"))
    await reply.update(Frame("Answer", activity="using current_time…"))
    await reply.finish("Answer", Outcome.DONE, None)
    assert board.messages == ["Answer"]


async def test_a_rate_limit_skips_frames_until_it_ends(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("one"))
    board.limited = [60]
    await reply.update(Frame("one two"))
    await reply.update(Frame("one two three"))
    assert board.messages == ["one"]
    assert board.calls.count("edit") == 1, "no call while the platform asked us to wait"


async def test_finish_waits_out_a_rate_limit_then_shows_everything(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("one"))
    board.limited = [0.05]
    await reply.update(Frame("one two"))
    started = asyncio.get_running_loop().time()
    await reply.finish("one two three", Outcome.DONE, None)
    assert asyncio.get_running_loop().time() - started >= 0.05
    assert board.messages == ["one two three"]


async def test_finish_retries_until_the_final_text_is_shown(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("partial"))
    board.limited = [0.01, 0.01]
    await reply.finish("partial and final", Outcome.DONE, None)
    assert board.messages == ["partial and final"]


def test_final_marks() -> None:
    assert final_text("Half", Outcome.STOPPED, None) == "Half (stopped)"
    assert final_text("", Outcome.STOPPED, None) == "(stopped)"
    assert final_text("Half", Outcome.FAILED, "model gone") == "Half\n\n⚠️ model gone"
    assert final_text("Done.", Outcome.DONE, None) == "Done."
    assert final_text("A long", Outcome.CUT, None) == "A long (cut at the length limit)"


async def test_a_notice_is_sent_in_full_through_a_rate_limit(board: Board) -> None:
    board.limited = [0.01]
    await send_notice(board, "word " * 20)
    assert len(board.messages) >= 2
    assert all(len(message) <= Board.limit for message in board.messages)
    assert "".join(board.messages).count("word") == 20


async def test_the_final_text_does_not_wait_out_the_edit_interval(board: Board) -> None:
    """Regression (issue 36): the last edit of a stream waited until the edit interval had passed
    since the previous change, so a person alone waited a second for every reply's end."""
    reply = StreamingReply(board, RenderSettings(min_interval=3600), PLACE)
    await reply.update(Frame("one"))
    await reply.update(Frame("one two"))
    assert board.messages == ["one"], "a frame inside the interval is skipped"
    await asyncio.wait_for(reply.finish("one two three", Outcome.DONE, None), GUARD_SECONDS)
    assert board.messages == ["one two three"]


async def test_a_reply_complete_within_the_grace_is_one_message(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(min_interval=1, post_grace=3600), PLACE)
    await reply.update(Frame("Hel"))
    await reply.update(Frame("Hello", activity="using current_time…"))
    await reply.finish("Hello.", Outcome.DONE, None)
    assert board.messages == ["Hello."]
    assert [c for c in board.calls if c != "typing"] == ["send"], "no post followed by an edit"


async def test_a_reply_longer_than_the_grace_shows_its_first_words_then_its_end() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings(min_interval=3600, post_grace=0.01), PLACE)
    await reply.update(Frame("The first words"))
    await asyncio.wait_for(board.posted.wait(), GUARD_SECONDS)
    assert board.messages == ["The first words"] and board.live == [True]
    await reply.update(Frame("The first words, and more"))
    await reply.finish("The first words, and more.", Outcome.DONE, None)
    assert board.messages == ["The first words, and more."] and board.live == [False]
    assert [c for c in board.calls if c != "typing"] == ["send", "edit"]


async def test_a_reply_whose_final_edit_would_wait_is_posted_whole() -> None:
    """Regression (issue 36): in a burst every reply posted its first words into a budget its
    edits had already spent, so each final text then waited its turn behind the others."""
    board = Board()
    edits = Limit("edits", 3, 3600)
    board.pace = Budget().pace(lambda action: (edits,) if action is Action.EDIT else ())
    for _ in range(2):  # other replies' edits: one call of the window left
        await board.pace.wait(Action.EDIT, Urgency.FINAL)
    reply = StreamingReply(board, RenderSettings(min_interval=0, post_grace=0), PLACE)
    await reply.update(Frame("The first words"))
    assert board.messages == [], "no post whose end would have to wait"
    ending = reply.finish("The first words, and more.", Outcome.DONE, None)
    await asyncio.wait_for(ending, GUARD_SECONDS)
    assert board.messages == ["The first words, and more."], "the reply, whole, never lost"
    assert [c for c in board.calls if c != "typing"] == ["send"]


async def test_finish_with_nothing_new_makes_no_call(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(min_interval=60), PLACE)
    await reply.update(Frame("all of it"))
    await reply.finish("all of it", Outcome.DONE, None)
    assert board.calls.count("edit") == 0
    assert board.live == [False], "no controls on this platform, so nothing is ever live"


async def test_controls_show_while_streaming_and_go_with_the_final_form() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("Half of it"))
    assert board.live == [True]
    await reply.finish("Half of it, and the rest.", Outcome.DONE, None)
    assert board.messages == ["Half of it, and the rest."]
    assert board.live == [False]


async def test_controls_are_taken_away_even_when_the_text_is_already_final() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings(min_interval=3600), PLACE)
    await reply.update(Frame("all of it"))
    await asyncio.wait_for(reply.finish("all of it", Outcome.DONE, None), GUARD_SECONDS)
    assert board.live == [False]
    assert board.calls.count("edit") == 1


async def test_a_message_posted_bare_gets_its_stop_button_once_the_interval_allows() -> None:
    """On a platform that cannot learn a lost post's id (Telegram), a message goes out without
    its Stop button, and the reply adds it by an edit, though no frame comes after (a model that
    stalls after its first words is stoppable), no sooner than the interval allows."""
    board = Board(controls=True, buttons_after_post=True)
    reply = StreamingReply(board, RenderSettings(min_interval=0.05), PLACE)
    loop = asyncio.get_running_loop()
    await reply.update(Frame("The first words"))
    posted_at = loop.time()
    assert board.live == [False], "posted without the button"
    await asyncio.wait_for(board.edited.wait(), GUARD_SECONDS)
    assert loop.time() - posted_at >= 0.05, "adding the button is a change like any other"
    assert board.messages == ["The first words"] and board.live == [True]
    await reply.finish("The first words, and the rest.", Outcome.DONE, None)
    assert board.live == [False] and board.calls.count("edit") == 2


async def test_a_lost_follow_up_post_takes_the_stop_button_off_the_messages_before_it() -> None:
    """The bug of issue 33: when a reply's second message was posted and its answer lost, the
    reply made no more calls, and its first message kept its Stop button for ever. Now the
    messages it knows show their final text without it, and the lost one, posted without the
    button, shows none either; the person is told part of the reply may be missing."""
    board = Board(controls=True, buttons_after_post=True)
    board.answers_lost = {1}
    reply = StreamingReply(board, RenderSettings(), PLACE)
    words = ("word " * 16).strip()
    await reply.update(Frame(words))
    await reply.finish(f"{words}, and the end.", Outcome.DONE, None)
    assert board.messages == [("word " * 10).strip(), ("word " * 6).strip(), LOST_NOTICE]
    assert board.live == [False, False, False]
    assert reply.delivery is Delivery.STALE


async def test_every_overflow_message_loses_its_control_at_the_end() -> None:
    board = Board(controls=True)
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("word " * 8))
    await reply.update(Frame("word " * 16))
    assert board.live == [True, True]
    await reply.finish("word " * 16, Outcome.DONE, None)
    assert board.live == [False, False]


async def test_finish_keeps_trying_through_a_long_storm_of_rate_limits(board: Board) -> None:
    """Regression: finishing gave up after ten rate limits and the platform kept an older text."""
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("partial"))
    board.limited = [0.001] * 30
    await reply.finish("partial and final", Outcome.DONE, None)
    assert board.messages == ["partial and final"]
    assert reply.delivery is Delivery.SHOWN and board.limited == []


async def test_finish_gives_up_when_the_wait_would_pass_its_deadline(
    board: Board, caplog: pytest.LogCaptureFixture
) -> None:
    reply = StreamingReply(board, RenderSettings(final_edit_seconds=1), "telegram:7")
    await reply.update(Frame("partial"))
    board.limited = [60]
    async with asyncio.timeout(GUARD_SECONDS):  # gives up at once, without waiting a minute
        await reply.finish("partial and final", Outcome.DONE, None)
    assert board.messages == ["partial"]
    assert reply.delivery is Delivery.STALE and reply.posted == ("0",)
    assert "the platform shows an older text" in caplog.text
    assert "[channels.telegram].final_edit_seconds" in caplog.text


async def test_a_reply_never_posted_ends_with_nothing_shown(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(final_edit_seconds=1), PLACE)
    board.limited = [60, 60]
    await reply.update(Frame("partial"))
    async with asyncio.timeout(GUARD_SECONDS):
        await reply.finish("all of it", Outcome.DONE, None)
    assert board.messages == [] and reply.posted == ()
    assert reply.delivery is Delivery.NOTHING


async def test_a_refused_frame_is_logged_once_and_the_final_text_still_tried(
    board: Board, caplog: pytest.LogCaptureFixture
) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("one"))
    board.refusals = [PlatformError("refused an edit"), PlatformError("refused an edit")]
    await reply.update(Frame("one two"))
    await reply.update(Frame("one two three"))
    await reply.finish("one two three four", Outcome.DONE, None)
    assert board.messages == ["one two three four"]
    assert reply.delivery is Delivery.SHOWN
    assert caplog.text.count("refused an edit") == 1


async def test_a_refused_final_text_is_not_retried(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await reply.update(Frame("one"))
    board.refusals = [PlatformError("refused an edit")]
    await reply.finish("one two", Outcome.DONE, None)
    assert board.messages == ["one"] and reply.delivery is Delivery.STALE
    assert board.calls.count("edit") == 1


async def test_a_post_whose_answer_lacks_its_id_ends_the_replys_calls(board: Board) -> None:
    reply = StreamingReply(board, RenderSettings(), PLACE)
    board.refusals = [LostMessage("answered without the message's id")]
    await reply.update(Frame("one"))
    await reply.update(Frame("one two"))
    await reply.finish("one two three", Outcome.DONE, None)
    assert [call for call in board.calls if call != "typing"] == ["send", "send"]
    assert board.messages == [LOST_NOTICE], "the lost post never reached the board; the notice"
    assert reply.posted == () and reply.delivery is Delivery.NOTHING


async def test_typing_in_flight_is_let_finish_when_the_text_appears(board: Board) -> None:
    """Regression: the first text cancelled the typing indicator's task, cutting off its
    request in flight (which with httpx can keep a pooled connection taken for good)."""
    board.typing_gate = asyncio.Event()
    reply = StreamingReply(board, RenderSettings(), PLACE)
    await board.typing_shown.wait()
    await reply.update(Frame("Hi"))
    board.typing_gate.set()
    await reply.finish("Hi.", Outcome.DONE, None)
    assert board.typings_completed == 1
    assert board.calls.count("typing") == 1, "and no other once the text shows"


async def test_a_reply_taken_up_after_a_restart_replaces_its_message() -> None:
    board = Board(controls=True)
    board.messages, board.live = ["Half an answer"], [True]
    reply = StreamingReply(board, RenderSettings(), PLACE, posted=("0",))
    await reply.finish("Half an answer", Outcome.INTERRUPTED, None)
    assert board.messages == ["Half an answer (interrupted by a restart)"]
    assert board.live == [False], "its Stop control is gone"
    assert "typing" not in board.calls, "its text is already there"
    assert reply.posted == ("0",) and reply.delivery is Delivery.SHOWN


async def test_a_notice_past_its_deadline_is_an_error(board: Board) -> None:
    board.limited = [60]
    with pytest.raises(RateLimited):
        async with asyncio.timeout(GUARD_SECONDS):
            await send_notice(board, "hello", seconds=1)
    assert board.messages == []


async def test_a_message_the_final_text_no_longer_needs_is_deleted(board: Board) -> None:
    """A status line that spilled into a message of its own used to stay there, Stop and all."""
    board.controls = True
    reply = StreamingReply(board, RenderSettings(), PLACE)
    text = "x" * 45
    await reply.update(Frame(text, activity="using current_time…"))
    assert board.messages == [text, "_using current_time…_"]

    await reply.finish(text, Outcome.DONE, None)

    assert board.messages == [text, DELETED]
    assert board.live == [False, False]
    assert reply.delivery is Delivery.SHOWN


async def test_a_reply_taken_up_with_more_messages_than_it_needs_deletes_the_rest(
    board: Board,
) -> None:
    board.messages, board.live = ["old one", "old two", "old three"], [True, True, True]
    reply = StreamingReply(board, RenderSettings(), PLACE, posted=("0", "1", "2"))

    await reply.finish("Short now.", Outcome.INTERRUPTED, None)

    assert board.messages == ["Short now. (interrupted by a restart)", DELETED, DELETED]
    assert reply.posted == ("0",)
