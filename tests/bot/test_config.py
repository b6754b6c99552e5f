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


def test_a_negative_post_grace_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "[channels.slack]\npost_grace = -1\n")
    with pytest.raises(
        ConfigError, match=r"'channels.slack.post_grace' must be 0 \(post at once\)"
    ):
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


def test_an_mcp_servers_env_from_and_header_variables_are_secrets_kept_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FILES_TOKEN", "files-secret")
    monkeypatch.setenv("TICKETS_TOKEN", "tickets-secret")
    config = load_config(
        write(
            tmp_path,
            '[mcp.files]\ncommand = "files-server"\nenv = { LOG_LEVEL = "debug" }\n'
            'env_from = ["FILES_TOKEN"]\n'
            '[mcp.tickets]\nurl = "http://127.0.0.1:9/mcp"\n'
            'headers_env = { Authorization = "TICKETS_TOKEN" }\n',
        )
    )
    assert sorted(config.secrets()) == ["files-secret", "tickets-secret"]


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (
            'url = "http://127.0.0.1:9/mcp"\nenv_from = ["TOKEN"]\n',
            "'mcp.x' is reached at a url, so env and env_from do not apply (they are a "
            "command's environment): pass what it needs in headers_env",
        ),
        (
            'command = "x"\nenv_from = ["MY TOKEN"]\n',
            "'mcp.x.env_from' names 'MY TOKEN', which is not an environment variable's name "
            "(letters, digits and _, not starting with a digit)",
        ),
        (
            'command = "x"\nenv = { TOKEN = "a" }\nenv_from = ["TOKEN"]\n',
            "'mcp.x' sets TOKEN in both env and env_from: keep it in one of them",
        ),
    ],
)
def test_an_mcp_servers_environment_mistakes_are_named(
    tmp_path: Path, table: str, error: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, f"[mcp.x]\n{table}"))
    assert str(raised.value) == error


# -- agent profiles --------------------------------------------------------------------------

RESEARCHER = """---
description: Finds things out and cites where.
model: qwen3:8b
tools: [current_time]
max_iterations: 30
---
You research one question and report what you found.
"""


def with_profiles(tmp_path: Path, table: str = "", **files: str) -> Path:
    folder = tmp_path / "agents"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.md").write_text(text)
    return write(tmp_path, f'[assistant]\nprofiles_dir = "agents"\n{table}')


def test_a_profile_file_is_an_agent_with_its_body_as_the_prompt(tmp_path: Path) -> None:
    config = load_config(with_profiles(tmp_path, researcher=RESEARCHER))

    researcher = config.agents["researcher"]
    assert researcher.system_prompt == "You research one question and report what you found."
    assert (researcher.model, researcher.max_iterations) == ("qwen3:8b", 30)
    assert researcher.description == "Finds things out and cites where."
    assert "assistant" in config.agents


def test_a_profile_file_that_replaces_a_table_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = '[agents.assistant]\n[agents.researcher]\nmodel = "old"\n'
    config = load_config(with_profiles(tmp_path, table, researcher=RESEARCHER))

    assert config.agents["researcher"].model == "qwen3:8b"
    assert "replaces the table [agents.researcher]" in caplog.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no front matter\n", "starts with a front matter between '---' lines"),
        ("---\nmodel: [unclosed\n---\nPrompt.\n", "the front matter is not valid YAML"),
        ("---\ncolour: blue\n---\nPrompt.\n", "unknown key 'colour'; valid keys: name,"),
        ("---\nmax_iterations: many\n---\nPrompt.\n", "max_iterations' must be an integer"),
    ],
    ids=["no-front-matter", "bad-yaml", "unknown-key", "wrong-type"],
)
def test_a_broken_profile_file_is_refused_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=r"broken\.md") as refused:
        load_config(with_profiles(tmp_path, broken=text))
    assert problem in str(refused.value)


def test_a_delegation_cycle_is_refused_with_its_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[agents.assistant]\ndelegates_to = ['planner']\n"
        "[agents.planner]\ndelegates_to = ['coder']\n"
        "[agents.coder]\ndelegates_to = ['planner']\n",
    )
    with pytest.raises(ConfigError, match="agents delegate in a circle: planner → coder → planner"):
        load_config(path)


def test_a_delegate_that_is_not_defined_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[agents.assistant]\ndelegates_to = ['ghost']\n")
    with pytest.raises(ConfigError, match=r"'agents\.assistant\.delegates_to' names 'ghost'"):
        load_config(path)


def test_a_channels_agent_must_be_defined(tmp_path: Path) -> None:
    path = write(tmp_path, "[channels.telegram]\nagent = 'ghost'\n")
    with pytest.raises(ConfigError, match=r"'channels\.telegram\.agent' names 'ghost'"):
        load_config(path)


def test_the_log_format_is_text_or_json(tmp_path: Path) -> None:
    path = write(tmp_path, "[logging]\nformat = 'logfmt'\n")
    with pytest.raises(ConfigError, match=r"'logging.format' must be one of text, json"):
        load_config(path)
    assert load_config(write(tmp_path, "[logging]\nformat = 'json'\n")).logging.format == "json"


WEBHOOK = (
    "[channels.telegram]\nmode = 'webhook'\nwebhook_url = 'https://kaiwa.example/telegram'\n"
    "webhook_host = '0.0.0.0'\nwebhook_port = 8443\n"
)


def test_the_probes_may_share_the_webhooks_port_on_its_host_only(tmp_path: Path) -> None:
    shared = WEBHOOK + "[metrics]\nenabled = true\nhost = '0.0.0.0'\nport = 8443\n"
    assert load_config(write(tmp_path, shared)).metrics.port == 8443

    elsewhere = WEBHOOK + "[metrics]\nenabled = true\nport = 8443\n"
    with pytest.raises(
        ConfigError,
        match=r"'metrics.port' and 'channels.telegram.webhook_port' are both 8443, on different "
        r"hosts \(127.0.0.1, 0.0.0.0\): give them the same host",
    ):
        load_config(write(tmp_path, elsewhere))


def test_two_listeners_at_one_port_need_paths_of_their_own(tmp_path: Path) -> None:
    clash = WEBHOOK.replace("0.0.0.0", "127.0.0.1") + "webhook_path = '/healthz'\n"
    clash += "[metrics]\nenabled = true\nport = 8443\n"
    with pytest.raises(ConfigError, match=r"both answer /healthz on port 8443"):
        load_config(write(tmp_path, clash))


# -- environment overrides --------------------------------------------------------------------


def test_two_workers_on_one_host_share_one_file_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 33): `worker_id` and `[metrics].port` had no environment override, so
    two workers on one host needed two config files."""
    path = write(tmp_path, "[cluster]\nworker_id = 'from-file'\n[metrics]\nport = 9464\n")
    monkeypatch.setenv("KAIWA_WORKER_ID", "box-2")
    monkeypatch.setenv("KAIWA_METRICS_PORT", "9465")

    config = load_config(path)

    assert (config.cluster.worker_id, config.metrics.port) == ("box-2", 9465)
    monkeypatch.setenv("KAIWA_WORKER_ID", "")  # empty is unset, as an empty line of a .env
    monkeypatch.setenv("KAIWA_METRICS_PORT", "")
    assert (load_config(path).cluster.worker_id, load_config(path).metrics.port) == (
        "from-file",
        9464,
    )


@pytest.mark.parametrize("value", ["http", "0", "65536", "94.64"])
def test_a_metrics_port_variable_that_is_not_a_port_names_the_variable(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAIWA_METRICS_PORT", value)
    with pytest.raises(
        ConfigError,
        match=rf"\$KAIWA_METRICS_PORT must be a port number from 1 to 65535, got '{value}'",
    ):
        load_config(None)
