"""Presses: the first notice in a pressed place, from the task delivering the press, goes to
the presser alone; every other notice goes out as usual."""

import asyncio

from channels.presses import Press, answered_privately, pressing


def recording(place: str) -> tuple[Press, list[str]]:
    said: list[str] = []

    async def answer(text: str) -> None:
        said.append(text)

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
