"""Places: every platform's conversation key is written and read by one module, and a key
reads back as the place that wrote it."""

import re

import pytest

from channels.places import (
    DiscordPlace,
    Place,
    PlaceError,
    SlackPlace,
    TelegramPlace,
    TerminalPlace,
    platform_of,
    space_of,
)


@pytest.mark.parametrize(
    ("place", "key"),
    [
        (TelegramPlace(777), "telegram:777"),
        (TelegramPlace(-1001234), "telegram:-1001234"),
        (SlackPlace("T1", "C1", "1700000000.000100"), "slack:T1:C1:1700000000.000100"),
        (SlackPlace("T1", "D7", SlackPlace.TOP), "slack:T1:D7:top"),
        (DiscordPlace("42", 9001), "discord:42:9001"),
        (DiscordPlace.direct(9002), "discord:dm:9002"),
        (TerminalPlace("local"), "terminal:local"),
        (SlackPlace("", "C1", "top"), "slack::C1:top"),
    ],
)
def test_a_place_is_its_key_and_back(place: Place, key: str) -> None:
    assert place.key == key
    assert type(place).of(key) == place
    assert platform_of(key) == place.platform


def test_the_last_part_takes_the_rest_of_the_key() -> None:
    assert TerminalPlace.of("terminal:work:monday") == TerminalPlace("work:monday")
    assert TerminalPlace("work:monday").key == "terminal:work:monday"


def test_a_dms_top_level_posts_outside_any_thread() -> None:
    assert SlackPlace("T1", "D7", SlackPlace.TOP).thread_ts is None
    assert SlackPlace("T1", "C1", "1700000000.000100").thread_ts == "1700000000.000100"


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        (TelegramPlace, "slack:T1:C1:top"),
        (TelegramPlace, "telegram:not-a-number"),
        (SlackPlace, "slack:T1:C1"),
        (DiscordPlace, "discord:dm:"),
        (TerminalPlace, "terminal"),
    ],
)
def test_a_key_of_another_shape_is_refused_naming_the_form(kind: type[Place], key: str) -> None:
    expected = f"{key!r} is not a {kind.platform} place ({kind.form()})"
    with pytest.raises(PlaceError, match=re.escape(expected)):
        kind.of(key)


def test_a_place_whose_key_would_not_read_back_cannot_be_made() -> None:
    with pytest.raises(PlaceError, match="cannot make a slack place"):
        SlackPlace("T:1", "C1", "top")


def test_a_space_is_what_a_person_in_a_place_can_see() -> None:
    assert space_of("discord:77:123") == "discord:77:"
    assert space_of("discord:dm:555") == "discord:dm:555"
    assert space_of("slack:T1:C1:1700000000.000100") == "slack:T1:C1:"
    assert space_of("telegram:42") == "telegram:42"
    assert space_of("terminal:local") == "terminal:"
