"""Configuration: a TOML file checked strictly against typed dataclasses.

The dataclasses below (with `core.agent.model.ModelSettings` for [ollama] and `channels.settings`
for [channels.*]) are the embedded defaults; `config.toml` at the top of the repository spells out
the same defaults with a comment on every key (a test keeps the two equal). Every key is checked
at start-up: an unknown key or a value of the wrong type fails naming the key and the expected
type, before anything starts. Secrets never live in the file: a `*_env` key names the
environment variable that holds one.

Reading a table into its dataclass, strictly, is `bot.tables`' (a settings class may inherit its
fields, also from a generic base: `channels.settings`'s `PlatformSettings[int]`).

Which file: `--config PATH`, else `$KAIWA_CONFIG`, else `./config.toml` if present, else the
embedded defaults. Relative paths in the file are relative to the file's folder.

`$KAIWA_WORKER_ID` and `$KAIWA_METRICS_PORT`, where set and not empty, replace [cluster].worker_id
and [metrics].port (they differ between workers sharing one file), before the checks.

An agent profile may also be a Markdown file in `[assistant].profiles_dir`: a YAML front matter
(`name`, `description`, `model`, `tools`, `max_iterations`, `delegates_to`) between `---` lines,
then the system prompt as the body, which reads better there than in a TOML string. The front
matter is read with PyYAML's safe loader (plain data only) and checked as strictly as the file.
A profile file named like a table under `[agents]` replaces it, with a warning in the log.
`delegates_to` must name defined agents (or the built-in `general`, every agent's default) and
never lead back to where it started (a delegation could go on for ever): a cycle is refused with
its path.
"""

import dataclasses
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.tables import build_table
from channels.settings import (
    DiscordSettings,
    PlatformSettings,
    SlackSettings,
    TelegramSettings,
    TerminalSettings,
    WebSettings,
)
from core.agent.context import ContextPolicy
from core.agent.model import ModelSettings
from core.cluster.settings import ClusterSettings
from core.errors import ConfigError
from core.features.approvals.questions import ApprovalSettings
from core.features.attachments.formats import DocumentLimits
from core.features.attachments.transcription import TranscriptionSettings
from core.features.fetch import FetchSettings
from core.features.mcp.servers import McpServerSettings
from core.features.memory import SCOPES, MemorySettings
from core.features.schedule.timing import ScheduleSettings
from core.features.subagents.delegation import GENERAL
from core.features.subagents.runs import SubagentSettings
from core.store import StoreSettings
from workflows.plan.settings import PlanSettings

logger = logging.getLogger(__name__)

CONFIG_ENV = "KAIWA_CONFIG"
WORKER_ID_ENV = "KAIWA_WORKER_ID"
METRICS_PORT_ENV = "KAIWA_METRICS_PORT"
FRONT_MATTER = "---"
PROFILE_KEYS = ("name", "description", "model", "tools", "max_iterations", "delegates_to")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
PROBE_PATHS = {"/metrics", "/healthz", "/readyz"}
"""What `[metrics]` answers (`bot.health.routes`)."""
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")
SLACK_MODES = ("socket", "http")
THREAD_ARCHIVE_MINUTES = (60, 1440, 4320, 10080)  # the durations Discord accepts
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_SYSTEM_PROMPT = (
    "You are Kaiwa, a helpful assistant in a chat. Answer plainly and briefly unless asked for "
    "detail. Use a tool when it gives a better answer than guessing."
)


@dataclass(frozen=True)
class AssistantConfig:
    agent: str = "assistant"
    timezone: str = ""
    profiles_dir: str = ""


@dataclass(frozen=True)
class AgentConfig:
    model: str = "qwen3:4b"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    think: bool = False
    images: bool = False
    tools: list[str] = field(
        default_factory=lambda: [
            "current_time",
            "fetch_url",
            "search_conversations",
            "read_conversation",
        ]
    )
    max_iterations: int = 0
    """Most model calls: 0 means 10 for a conversation's turn, 30 for a sub-agent's run (which
    `[subagents].max_iterations` caps either way)."""
    context_window: int = 0
    description: str = ""
    delegates_to: list[str] = field(default_factory=lambda: [GENERAL])
    """Whom it may hand work to: defined agents, and `general` (built in: the agent itself with
    a generalist's prompt); [] turns delegation off."""


@dataclass(frozen=True)
class LimitsConfig:
    max_message_chars: int = 16_000
    tool_timeout: float = 60.0
    tool_grace: float = 2.0
    max_cached_conversations: int = 1000


@dataclass(frozen=True)
class StorageConfig:
    data_dir: str = "data"
    database_url_env: str = "KAIWA_DATABASE_URL"
    sqlite_synchronous: str = "NORMAL"
    write_retry_seconds: float = 30.0
    connections: int = 4

    def store_settings(self) -> StoreSettings:
        return StoreSettings(
            sqlite_synchronous=self.sqlite_synchronous.upper(),
            write_retry_seconds=self.write_retry_seconds,
            connections=self.connections,
        )


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics, /healthz and /readyz over HTTP (`bot.health`); off by default."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9464


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "INFO"
    stderr_level: str = "WARNING"
    format: str = "text"
    """"text" (a line a person reads) or "json" (one object per line, for a log shipper)."""
    file: str = "kaiwa.log"
    """In the data folder; "" writes no file (stderr only)."""
    max_bytes: int = 5_000_000
    backups: int = 3


@dataclass(frozen=True)
class ChannelsConfig:
    terminal: TerminalSettings = field(default_factory=TerminalSettings)
    telegram: TelegramSettings = field(default_factory=TelegramSettings)
    slack: SlackSettings = field(default_factory=SlackSettings)
    discord: DiscordSettings = field(default_factory=DiscordSettings)
    web: WebSettings = field(default_factory=WebSettings)


@dataclass(frozen=True)
class WorkflowsConfig:
    plan: PlanSettings = field(default_factory=PlanSettings)


@dataclass(frozen=True)
class Config:
    assistant: AssistantConfig = field(default_factory=AssistantConfig)
    ollama: ModelSettings = field(default_factory=ModelSettings)
    agents: dict[str, AgentConfig] = field(default_factory=lambda: {"assistant": AgentConfig()})
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    context: ContextPolicy = field(default_factory=ContextPolicy)
    subagents: SubagentSettings = field(default_factory=SubagentSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    transcription: TranscriptionSettings = field(default_factory=TranscriptionSettings)
    documents: DocumentLimits = field(default_factory=DocumentLimits)
    approvals: ApprovalSettings = field(default_factory=ApprovalSettings)
    workflows: WorkflowsConfig = field(default_factory=WorkflowsConfig)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    mcp: dict[str, McpServerSettings] = field(default_factory=dict)
    storage: StorageConfig = field(default_factory=StorageConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    channels: ChannelsConfig = field(default_factory=ChannelsConfig)
    base_dir: Path = field(default_factory=Path.cwd, compare=False)

    @property
    def data_dir(self) -> Path:
        return (self.base_dir / self.storage.data_dir).resolve()

    def database_url(self) -> str:
        """The URL from the environment variable named in config, else SQLite in the data dir."""
        return os.environ.get(self.storage.database_url_env) or (
            f"sqlite:///{self.data_dir / 'kaiwa.db'}"
        )

    def secrets(self) -> list[str]:
        """Values of every environment variable the config names as holding a secret (an MCP
        server's `env_from` and `headers_env` among them), kept out of the log."""
        slack = self.channels.slack
        names = [
            self.storage.database_url_env,
            self.channels.telegram.token_env,
            self.channels.telegram.webhook_secret_env,
            slack.bot_token_env,
            slack.app_token_env,
            slack.signing_secret_env,
            self.channels.discord.token_env,
        ]
        for server in self.mcp.values():
            names += [*server.env_from, *server.headers_env.values()]
        return [os.environ[name] for name in names if os.environ.get(name)]


def config_path(cli_path: str | None) -> Path | None:
    if cli_path:
        return Path(cli_path)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    local = Path("config.toml")
    return local if local.is_file() else None


def with_web(config: Config) -> Config:
    """`config` with the web chat on (`kaiwa run --web`)."""
    web = dataclasses.replace(config.channels.web, enabled=True)
    return dataclasses.replace(config, channels=dataclasses.replace(config.channels, web=web))


def load_config(path: Path | None) -> Config:
    if path is None:
        return _checked(_with_environment(Config()))
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    config = dataclasses.replace(build_table(Config, data, ""), base_dir=path.resolve().parent)
    return _checked(_with_environment(_with_profile_files(config)))


def _with_environment(config: Config) -> Config:
    """`config` with what `$KAIWA_WORKER_ID` and `$KAIWA_METRICS_PORT` say, where set."""
    if os.environ.get(WORKER_ID_ENV):
        cluster = dataclasses.replace(config.cluster, worker_id=os.environ[WORKER_ID_ENV])
        config = dataclasses.replace(config, cluster=cluster)
    port = os.environ.get(METRICS_PORT_ENV, "")
    if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ConfigError(
            f"${METRICS_PORT_ENV} must be a port number from 1 to 65535, got {port!r}"
        )
    if port:
        metrics = dataclasses.replace(config.metrics, port=int(port))
        config = dataclasses.replace(config, metrics=metrics)
    return config


def _with_profile_files(config: Config) -> Config:
    """`config` with the profiles of `[assistant].profiles_dir` among its agents."""
    if not config.assistant.profiles_dir:
        return config
    folder = config.base_dir / config.assistant.profiles_dir
    if not folder.is_dir():
        raise ConfigError(
            f"'assistant.profiles_dir' is {config.assistant.profiles_dir!r}, but {folder} is not "
            "a folder"
        )
    agents = dict(config.agents)
    for path in sorted(folder.glob("*.md")):
        name, profile = _read_profile(path)
        if name in agents:
            logger.warning("the profile in %s replaces the table [agents.%s]", path, name)
        agents[name] = profile
    return dataclasses.replace(config, agents=agents)


def _read_profile(path: Path) -> tuple[str, AgentConfig]:
    """A Markdown profile: its name (the front matter's, else the file's) and its settings."""
    opening, _, rest = path.read_text(encoding="utf-8").partition("\n")
    front, found, body = rest.partition(f"\n{FRONT_MATTER}\n")
    if opening.strip() != FRONT_MATTER or not found:
        raise ConfigError(f"{path}: a profile starts with a front matter between '---' lines")
    try:
        fields = yaml.safe_load(front) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: the front matter is not valid YAML ({exc})") from exc
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: the front matter must be keys and values")
    unknown = sorted(set(fields) - set(PROFILE_KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key '{unknown[0]}'; valid keys: {', '.join(PROFILE_KEYS)}"
        )
    name = fields.pop("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: 'name' must be a string")
    prompt = {"system_prompt": body.strip()} if body.strip() else {}
    return name, build_table(AgentConfig, {**fields, **prompt}, f"{path}: ")


def _check_telegram_webhook(telegram: TelegramSettings) -> None:
    if telegram.mode not in ("polling", "webhook"):
        raise ConfigError(
            f"'channels.telegram.mode' must be polling or webhook, got {telegram.mode!r}"
        )
    if telegram.mode == "webhook" and not telegram.webhook_url.startswith("https://"):
        raise ConfigError(
            "'channels.telegram.webhook_url' must be the https:// address Telegram posts "
            'updates to (mode = "webhook")'
        )


def _check_listeners(config: Config) -> None:
    """Listeners at one port share one server (`channels.http_server`) only on the same host,
    each with paths of its own; anything else would fail at start with a bare "address in use"
    naming only one of them."""
    telegram, slack, metrics = config.channels.telegram, config.channels.slack, config.metrics
    listeners = [
        ("metrics.port", metrics.enabled, metrics.host, metrics.port, PROBE_PATHS),
        (
            "channels.telegram.webhook_port",
            telegram.mode == "webhook",
            telegram.webhook_host,
            telegram.webhook_port,
            {telegram.webhook_path},
        ),
        (
            "channels.slack.http_port",
            slack.mode == "http",
            slack.http_host,
            slack.http_port,
            {slack.http_path},
        ),
    ]
    serving = [each for each in listeners if each[1] and each[3]]
    for index, (key, _, host, port, paths) in enumerate(serving):
        for other, _, other_host, other_port, other_paths in serving[index + 1 :]:
            if port == other_port and host != other_host:
                raise ConfigError(
                    f"'{key}' and '{other}' are both {port}, on different hosts ({host}, "
                    f"{other_host}): give them the same host to share one server, or another port"
                )
            if port == other_port and paths & other_paths:
                both = ", ".join(sorted(paths & other_paths))
                raise ConfigError(f"'{key}' and '{other}' both answer {both} on port {port}")


def _check_delegation(agents: dict[str, AgentConfig]) -> None:
    """Every `delegates_to` names a defined agent, and none leads back to where it started."""
    for name, agent in agents.items():
        for target in agent.delegates_to:
            if target not in agents and target != GENERAL:
                raise ConfigError(
                    f"'agents.{name}.delegates_to' names '{target}', which is not defined; "
                    f"defined agents: {', '.join(agents)} (and the built-in {GENERAL})"
                )
    for start in agents:
        cycle = _cycle_from(start, agents, [start])
        if cycle:
            raise ConfigError(
                f"agents delegate in a circle: {' → '.join(cycle)}; remove one of these names "
                "from the delegates_to of the agent before it"
            )


def _cycle_from(name: str, agents: dict[str, AgentConfig], path: list[str]) -> list[str]:
    """The first path from `path[0]` back to itself through `name`'s delegates, or [] (the
    built-in `general` delegates as the agent that hands it work, so it closes no circle)."""
    for target in agents[name].delegates_to:
        if target not in agents:
            continue
        if target == path[0]:
            return [*path, target]
        if target not in path:
            found = _cycle_from(target, agents, [*path, target])
            if found:
                return found
    return []


def _check_context(config: Config) -> None:
    policy = config.context
    if not 0 < policy.compact_at < 1:
        raise ConfigError(
            f"'context.compact_at' must be a share of the window between 0 and 1 (0.75 for "
            f"75 %), got {policy.compact_at}"
        )
    if policy.answer_reserve * 2 > policy.max_window:
        raise ConfigError(
            f"'context.answer_reserve' ({policy.answer_reserve}) must be at most half of "
            f"'context.max_window' ({policy.max_window})"
        )
    for name, agent in config.agents.items():
        window = agent.context_window
        if window < 0:
            raise ConfigError(f"'agents.{name}.context_window' must be 0 or more, got {window}")
        if window and window < policy.answer_reserve * 2:
            raise ConfigError(
                f"'agents.{name}.context_window' must be 0 (chosen for the model) or at least "
                f"twice 'context.answer_reserve' ({policy.answer_reserve * 2} tokens), got {window}"
            )


def _check_mcp_server(name: str, server: McpServerSettings) -> None:
    if bool(server.command) == bool(server.url):
        raise ConfigError(
            f"'mcp.{name}' needs either command (a program speaking MCP on stdio) or url "
            "(a streamable-HTTP endpoint), not both"
        )
    if server.url and (server.env or server.env_from):
        raise ConfigError(
            f"'mcp.{name}' is reached at a url, so env and env_from do not apply (they are a "
            "command's environment): pass what it needs in headers_env"
        )
    for key, names in (("env", list(server.env)), ("env_from", server.env_from)):
        for variable in names:
            if not ENV_NAME.fullmatch(variable):
                raise ConfigError(
                    f"'mcp.{name}.{key}' names {variable!r}, which is not an environment "
                    "variable's name (letters, digits and _, not starting with a digit)"
                )
    both = sorted(set(server.env) & set(server.env_from))
    if both:
        raise ConfigError(
            f"'mcp.{name}' sets {both[0]} in both env and env_from: keep it in one of them"
        )


def _checked(config: Config) -> Config:
    """Rules that span keys or bound values; each failure names the key."""
    named = {"assistant.agent": config.assistant.agent}
    for platform, settings in vars(config.channels).items():
        if settings.agent:
            named[f"channels.{platform}.agent"] = settings.agent
    for key, name in named.items():
        if name not in config.agents:
            raise ConfigError(
                f"'{key}' names '{name}', which is not defined; defined agents: "
                f"{', '.join(config.agents) or 'none'} (add [agents.<name>])"
            )
    positive = {
        "ollama.connect_timeout": config.ollama.connect_timeout,
        "ollama.first_chunk_timeout": config.ollama.first_chunk_timeout,
        "ollama.idle_timeout": config.ollama.idle_timeout,
        "ollama.max_concurrent_requests": config.ollama.max_concurrent_requests,
        "ollama.retry_backoff": config.ollama.retry_backoff,
        "ollama.host_skip_seconds": config.ollama.host_skip_seconds,
        **{
            f"ollama.hosts.{name}.max_concurrent_requests": host.max_concurrent_requests
            for name, host in config.ollama.hosts.items()
        },
        "limits.max_message_chars": config.limits.max_message_chars,
        "limits.tool_timeout": config.limits.tool_timeout,
        "limits.tool_grace": config.limits.tool_grace,
        "limits.max_cached_conversations": config.limits.max_cached_conversations,
        "context.max_window": config.context.max_window,
        "context.answer_reserve": config.context.answer_reserve,
        "subagents.max_total": config.subagents.max_total,
        "subagents.max_batch": config.subagents.max_batch,
        "subagents.max_concurrent": config.subagents.max_concurrent,
        "subagents.max_running": config.subagents.max_running,
        "subagents.max_iterations": config.subagents.max_iterations,
        "subagents.max_depth": config.subagents.max_depth,
        "subagents.stop_grace": config.subagents.stop_grace,
        "schedule.misfire_grace_seconds": config.schedule.misfire_grace_seconds,
        "schedule.max_failures": config.schedule.max_failures,
        "schedule.min_interval_seconds": config.schedule.min_interval_seconds,
        "schedule.max_tasks_per_place": config.schedule.max_tasks_per_place,
        "memory.max_notes": config.memory.max_notes,
        "memory.max_chars": config.memory.max_chars,
        "fetch.timeout": config.fetch.timeout,
        "fetch.max_bytes": config.fetch.max_bytes,
        "fetch.max_chars": config.fetch.max_chars,
        "approvals.timeout_seconds": config.approvals.timeout_seconds,
        "workflows.plan.review_rounds": config.workflows.plan.review_rounds,
        "workflows.plan.person_wait_seconds": config.workflows.plan.person_wait_seconds,
        "workflows.plan.max_steps": config.workflows.plan.max_steps,
        "cluster.failover_seconds": config.cluster.failover_seconds,
        "cluster.idle_seconds": config.cluster.idle_seconds,
        "storage.write_retry_seconds": config.storage.write_retry_seconds,
        "storage.connections": config.storage.connections,
        "logging.max_bytes": config.logging.max_bytes,
        "channels.terminal.frame_interval": config.channels.terminal.frame_interval,
        "channels.telegram.poll_timeout": config.channels.telegram.poll_timeout,
        "channels.web.edit_interval": config.channels.web.edit_interval,
    }
    for name, platform in vars(config.channels).items():
        if isinstance(platform, PlatformSettings):
            positive[f"channels.{name}.edit_interval"] = platform.edit_interval
            positive[f"channels.{name}.final_edit_seconds"] = platform.final_edit_seconds
            if platform.post_grace < 0:
                raise ConfigError(
                    f"'channels.{name}.post_grace' must be 0 (post at once) or more, got "
                    f"{platform.post_grace}"
                )
    _check_delegation(config.agents)
    for name, agent in config.agents.items():
        if agent.max_iterations < 0:
            raise ConfigError(
                f"'agents.{name}.max_iterations' must be 0 (the default) or more, got "
                f"{agent.max_iterations}"
            )
        if not agent.model:
            raise ConfigError(f"'agents.{name}.model' must name an Ollama model")
    for key, number in positive.items():
        if number <= 0:
            raise ConfigError(f"'{key}' must be greater than 0, got {number}")
    for name, server in config.mcp.items():
        _check_mcp_server(name, server)
    if not 0 <= config.channels.web.port <= 65535:
        raise ConfigError(
            f"'channels.web.port' must be a port from 1 to 65535, or 0 to pick a free one, got "
            f"{config.channels.web.port}"
        )
    _check_telegram_webhook(config.channels.telegram)
    _check_listeners(config)
    if config.memory.scope not in SCOPES:
        raise ConfigError(
            f"'memory.scope' must be one of {', '.join(SCOPES)}, got {config.memory.scope!r}"
        )
    if config.ollama.retries < 0:
        raise ConfigError(f"'ollama.retries' must be 0 or more, got {config.ollama.retries}")
    _check_context(config)
    if config.channels.slack.mode not in SLACK_MODES:
        raise ConfigError(
            f"'channels.slack.mode' must be one of {', '.join(SLACK_MODES)}, "
            f"got {config.channels.slack.mode!r}"
        )
    archive = config.channels.discord.thread_archive_minutes
    if archive not in THREAD_ARCHIVE_MINUTES:
        raise ConfigError(
            f"'channels.discord.thread_archive_minutes' must be one of "
            f"{', '.join(map(str, THREAD_ARCHIVE_MINUTES))} (Discord's choices), got {archive}"
        )
    if config.storage.sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
        raise ConfigError(
            f"'storage.sqlite_synchronous' must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
            f"got {config.storage.sqlite_synchronous!r}"
        )
    for key, level in (
        ("logging.level", config.logging.level),
        ("logging.stderr_level", config.logging.stderr_level),
    ):
        if level.upper() not in LOG_LEVELS:
            raise ConfigError(f"'{key}' must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if config.logging.format not in LOG_FORMATS:
        raise ConfigError(
            f"'logging.format' must be one of {', '.join(LOG_FORMATS)}, got "
            f"{config.logging.format!r}"
        )
    return config
