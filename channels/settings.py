"""Each channel's settings, in a module that imports no platform library.

The configuration loader reads `[channels.<name>]` straight into these dataclasses, so every
setting has one definition; keeping them apart from the adapters means loading the config (and
starting a terminal-only bot) never pays for importing python-telegram-bot and friends.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TerminalSettings:
    enabled: bool = True
    session: str = "local"
    show_thinking: bool = True
    show_tools: bool = True
    frame_interval: float = 0.05


@dataclass(frozen=True)
class TelegramSettings:
    enabled: bool = True
    token_env: str = "KAIWA_TELEGRAM_TOKEN"
    allowed_users: list[int] = field(default_factory=list)
    anyone: bool = False
    groups: bool = False
    show_thinking: bool = True
    show_tools: bool = True
    edit_interval: float = 1.0
    final_edit_seconds: float = 300.0
    poll_timeout: int = 30
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"


@dataclass(frozen=True)
class SlackSettings:
    enabled: bool = True
    mode: str = "socket"
    bot_token_env: str = "KAIWA_SLACK_BOT_TOKEN"
    app_token_env: str = "KAIWA_SLACK_APP_TOKEN"
    signing_secret_env: str = "KAIWA_SLACK_SIGNING_SECRET"
    allowed_users: list[str] = field(default_factory=list)
    allowed_channels: list[str] = field(default_factory=list)
    anyone: bool = False
    answer_bots: bool = False
    working_reaction: str = "hourglass_flowing_sand"
    show_thinking: bool = True
    show_tools: bool = True
    edit_interval: float = 1.0
    final_edit_seconds: float = 300.0
    http_host: str = "127.0.0.1"
    http_port: int = 3000
    http_path: str = "/slack/events"
    api_url: str = "https://slack.com/api/"


@dataclass(frozen=True)
class DiscordSettings:
    enabled: bool = True
    token_env: str = "KAIWA_DISCORD_TOKEN"
    allowed_users: list[int] = field(default_factory=list)
    allowed_roles: list[int] = field(default_factory=list)
    allowed_channels: list[int] = field(default_factory=list)
    allowed_guilds: list[int] = field(default_factory=list)
    anyone: bool = False
    answer_bots: bool = False
    slash_commands: bool = True
    thread_archive_minutes: int = 1440
    show_thinking: bool = True
    show_tools: bool = True
    edit_interval: float = 1.0
    final_edit_seconds: float = 300.0
    api_base: str = "https://discord.com/api/v10"
    gateway_url: str = "wss://gateway.discord.gg/"
