"""Channel settings: fields shared through base classes are defined once and still load from
`[channels.<name>]` with their platform's own types."""

import dataclasses
import re
from pathlib import Path

import pytest

from bot.config import ChannelsConfig, load_config
from channels.settings import (
    ChannelSettings,
    DiscordSettings,
    PlatformSettings,
    ServerSettings,
    SlackSettings,
    TelegramSettings,
    TerminalSettings,
)
from core.errors import ConfigError

PLATFORMS = (TelegramSettings, SlackSettings, DiscordSettings)


def loaded(tmp_path: Path, text: str) -> ChannelsConfig:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path).channels


def test_each_shared_field_is_defined_once() -> None:
    defined: dict[str, list[str]] = {}
    for kind in (ChannelSettings, PlatformSettings, ServerSettings, *PLATFORMS, TerminalSettings):
        for name in vars(kind).get("__annotations__", {}):
            defined.setdefault(name, []).append(kind.__name__)
    assert {name: kinds for name, kinds in defined.items() if len(kinds) > 1} == {
        "token_env": ["TelegramSettings", "DiscordSettings"],  # each with its own variable
        "mode": ["TelegramSettings", "SlackSettings"],  # each its own ways of receiving
    }


def test_inherited_fields_load_with_the_platforms_id_type(tmp_path: Path) -> None:
    channels = loaded(
        tmp_path,
        "[channels.telegram]\nallowed_users = [1001]\nedit_interval = 2\n"
        "[channels.slack]\nallowed_users = ['U1']\nallowed_channels = ['C1']\nanswer_bots = true\n"
        "[channels.discord]\nallowed_channels = [42]\nshow_tools = false\n"
        "[channels.terminal]\nshow_thinking = false\n",
    )
    assert channels.telegram.allowed_users == [1001] and channels.telegram.edit_interval == 2.0
    assert channels.slack.allowed_users == ["U1"] and channels.slack.allowed_channels == ["C1"]
    assert channels.slack.answer_bots is True
    assert channels.discord.allowed_channels == [42] and channels.discord.show_tools is False
    assert channels.terminal.show_thinking is False


@pytest.mark.parametrize(
    ("table", "line", "error"),
    [
        (
            "telegram",
            "allowed_users = ['U1']",
            "'channels.telegram.allowed_users[0]' must be an integer",
        ),
        (
            "slack",
            "allowed_channels = [42]",
            "'channels.slack.allowed_channels[0]' must be a string",
        ),
        (
            "discord",
            "final_edit_seconds = 0",
            "'channels.discord.final_edit_seconds' must be greater",
        ),
        ("slack", "edit_interval = -1", "'channels.slack.edit_interval' must be greater"),
        ("terminal", "anyone = true", "unknown key 'channels.terminal.anyone'"),
    ],
)
def test_a_mistake_in_an_inherited_field_names_its_key(
    tmp_path: Path, table: str, line: str, error: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        loaded(tmp_path, f"[channels.{table}]\n{line}\n")


def test_every_platform_is_a_platform_and_the_terminal_is_not() -> None:
    assert all(issubclass(kind, PlatformSettings) for kind in PLATFORMS)
    assert not issubclass(TerminalSettings, PlatformSettings)
    assert {f.name for f in dataclasses.fields(TerminalSettings)} == {
        "enabled",
        "show_thinking",
        "show_tools",
        "agent",
        "session",
        "frame_interval",
    }
