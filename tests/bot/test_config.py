"""Configuration: the shipped config.toml equals the defaults, and mistakes name their key."""

from pathlib import Path

import pytest

from bot.config import Config, config_path, load_config
from core.errors import ConfigError

REPOSITORY = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_the_shipped_config_is_the_embedded_defaults() -> None:
    assert load_config(REPOSITORY / "config.toml") == Config()


def test_no_file_means_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAIWA_CONFIG", raising=False)
    assert config_path(None) is None
    assert load_config(None) == Config()


def test_the_file_is_chosen_by_flag_then_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAIWA_CONFIG", "/from/env.toml")
    assert config_path("/from/flag.toml") == Path("/from/flag.toml")
    assert config_path(None) == Path("/from/env.toml")


def test_an_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[ollama]\nurll = 'http://x'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'ollama.urll'; valid keys here: url,"):
        load_config(path)


def test_a_wrong_type_names_the_key_and_the_type(tmp_path: Path) -> None:
    path = write(tmp_path, "[ollama]\nidle_timeout = 'soon'\n")
    with pytest.raises(ConfigError, match=r"'ollama.idle_timeout' must be a number, got a string"):
        load_config(path)


def test_a_boolean_is_not_an_integer(tmp_path: Path) -> None:
    path = write(tmp_path, "[agents.assistant]\nmax_iterations = true\n")
    with pytest.raises(ConfigError, match=r"'agents.assistant.max_iterations' must be an integer"):
        load_config(path)


def test_an_agent_that_is_not_defined(tmp_path: Path) -> None:
    path = write(tmp_path, "[assistant]\nagent = 'helper'\n")
    with pytest.raises(ConfigError, match=r"'assistant.agent' names 'helper'.*assistant"):
        load_config(path)


def test_a_bound_is_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "[ollama]\nmax_concurrent_requests = 0\n")
    with pytest.raises(ConfigError, match=r"'ollama.max_concurrent_requests' must be greater"):
        load_config(path)


def test_a_thread_archive_duration_discord_does_not_offer(tmp_path: Path) -> None:
    path = write(tmp_path, "[channels.discord]\nthread_archive_minutes = 30\n")
    with pytest.raises(ConfigError, match=r"thread_archive_minutes' must be one of 60, 1440"):
        load_config(path)


def test_sqlite_durability_is_one_of_two_words(tmp_path: Path) -> None:
    path = write(tmp_path, "[storage]\nsqlite_synchronous = 'OFF'\n")
    with pytest.raises(
        ConfigError, match=r"'storage.sqlite_synchronous' must be one of NORMAL, FULL"
    ):
        load_config(path)
    full = load_config(write(tmp_path, "[storage]\nsqlite_synchronous = 'full'\n"))
    assert full.storage.store_settings().sqlite_synchronous == "FULL"


def test_invalid_toml_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[ollama\n"))


def test_relative_data_dir_is_relative_to_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[storage]\ndata_dir = 'state'\n"))
    assert config.data_dir == (tmp_path / "state").resolve()
    assert config.database_url() == f"sqlite:///{(tmp_path / 'state').resolve()}/kaiwa.db"


def test_database_url_comes_from_the_named_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_DB", "postgresql+psycopg://kaiwa:hunter2@db/kaiwa")
    config = load_config(write(tmp_path, "[storage]\ndatabase_url_env = 'MY_DB'\n"))
    assert config.database_url() == "postgresql+psycopg://kaiwa:hunter2@db/kaiwa"
    assert config.secrets() == ["postgresql+psycopg://kaiwa:hunter2@db/kaiwa"]
