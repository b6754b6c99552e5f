"""Presses: the first notice in a pressed place, from the task delivering the press, goes to
the presser alone; every other notice goes out as usual. A button's payload is its command."""

import asyncio
from collections.abc import Sequence

from channels.presses import (
    STOP,
    Press,
    answered_privately,
    fitting,
    payload,
    pressed_command,
    pressing,
)
from core.channel import Button


def recording(place: str) -> tuple[Press, list[str]]:
    said: list[str] = []

    async def answer(text: str, buttons: Sequence[Button]) -> None:
        said.append(text + "".join(f" [{button.label}]" for button in buttons))

    return Press(place, answer), said


async def test_the_first_notice_in_the_pressed_place_answers_the_press() -> None:
    press, said = recording("slack:T1:C1:1.2")
    with pressing(press):
        assert not await answered_privately("slack:T1:C2:3.4", "another place")
        assert await answered_privately("slack:T1:C1:1.2", "Stopped.")
        assert not await answered_privately("slack:T1:C1:1.2", "a second notice")
    assert said == ["Stopped."] and press.answered


async def test_no_press_outside_the_block_or_in_another_task() -> None:
    press, said = recording("telegram:7")
    with pressing(press):
        elsewhere = asyncio.create_task(answered_privately("telegram:7", "for someone else"))
        assert not await elsewhere
    assert not await answered_privately("telegram:7", "after the press")
    assert said == [] and not press.answered


async def test_the_answer_carries_its_buttons() -> None:
    press, said = recording("discord:dm:5")
    with pressing(press):
        stop_a2 = Button("Stop port-scan", "/agents stop a2")
        assert await answered_privately("discord:dm:5", "Sub-agents here: …", [stop_a2])
    assert said == ["Sub-agents here: … [Stop port-scan]"]


def test_a_payload_is_its_command_and_reads_back() -> None:
    """The Stop button's payload is the one replies carried before buttons were commands, so a
    press on a message an older process posted still stops."""
    assert payload(STOP) == "kaiwa:stop"
    assert pressed_command(payload(STOP)) == "/stop"
    assert pressed_command(payload(Button("Stop x", "/agents stop a12"))) == "/agents stop a12"
    assert pressed_command("kaiwa:") is None
    assert pressed_command("someone-elses:stop") is None
    assert pressed_command(None) is None


def test_a_button_whose_payload_is_too_long_is_left_out() -> None:
    short, long = Button("Stop", "/agents stop a1"), Button("Stop", "/agents stop " + "x" * 60)
    assert fitting([short, long], 64) == [short]
