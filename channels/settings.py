"""Each channel's settings, in a module that imports no platform library.

The configuration loader reads `[channels.<name>]` straight into these dataclasses, so every
setting has one definition; keeping them apart from the adapters means loading the config (and
starting a terminal-only bot) never pays for importing python-telegram-bot and friends.

What channels share is defined once, in the base a channel's class inherits (the loader reads an
inherited field like any other, and fills in the base's type parameter):
- `ChannelSettings`, every channel: whether it is on, and what a reply shows while it streams.
- `PlatformSettings[Id]`, the chat platforms: who may talk to the bot, and how fast a reply's
  message is edited. `Id` is how the platform writes its ids: numbers on Telegram and Discord,
  strings (`U0123ABCD`) on Slack.
- `ServerSettings[Id]`, the platforms where the bot sits in channels among other bots (Slack,
  Discord): which channels it answers in, and whether it answers bots.
"""

from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

Id = TypeVar("Id", int, str)


@dataclass(frozen=True)
class ChannelSettings:
    enabled: bool = True
    show_thinking: bool = True
    """Show "thinking…" (the terminal: the thinking itself) while the model thinks."""
    show_tools: bool = True
    """Show a line for each tool the model uses."""
    agent: str = ""
    """The agent a new conversation here gets; empty: `[assistant].agent`."""


@dataclass(frozen=True)
class PlatformSettings(ChannelSettings, Generic[Id]):
    allowed_users: list[Id] = field(default_factory=list)
    anyone: bool = False
    """Anyone may talk to the bot (`allowed_users` is then ignored)."""
    edit_interval: float = 1.0
    """Least seconds between two edits of a streaming reply (fewer when the platform's limits
    are short); the final text never waits for it."""
    post_grace: float = 0.3
    """Seconds a reply's first words wait before they are posted: a reply complete by then goes
    out as one message, not a post and then an edit."""
    final_edit_seconds: float = 300.0
    """How long a reply's last edit keeps trying through rate limits."""
    paced: bool = True
    """Keep the bot's calls within the platform's published rate limits, answers first
    (`channels.budget`); off, every call goes at once and each 429 is waited out."""


@dataclass(frozen=True)
class ServerSettings(PlatformSettings[Id]):
    allowed_channels: list[Id] = field(default_factory=list)
    """Channels the bot answers in; empty means every one. DMs follow `allowed_users` alone."""
    answer_bots: bool = False
    """Answer messages other bots post (never the bot's own)."""


@dataclass(frozen=True)
class TerminalSettings(ChannelSettings):
    session: str = "local"
    frame_interval: float = 0.05


@dataclass(frozen=True)
class TelegramSettings(PlatformSettings[int]):
    token_env: str = "KAIWA_TELEGRAM_TOKEN"
    groups: bool = False
    poll_timeout: int = 30
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"
    mode: str = "polling"
    """`polling` (one process asks Telegram), or `webhook` (Telegram posts to `webhook_url`;
    every worker of a cluster may serve it, behind any load balancer)."""
    webhook_url: str = ""
    webhook_host: str = "127.0.0.1"
    webhook_port: int = 8443
    webhook_path: str = "/telegram"
    webhook_secret_env: str = "KAIWA_TELEGRAM_WEBHOOK_SECRET"


@dataclass(frozen=True)
class SlackSettings(ServerSettings[str]):
    mode: str = "socket"
    bot_token_env: str = "KAIWA_SLACK_BOT_TOKEN"
    app_token_env: str = "KAIWA_SLACK_APP_TOKEN"
    signing_secret_env: str = "KAIWA_SLACK_SIGNING_SECRET"
    working_reaction: str = "hourglass_flowing_sand"
    http_host: str = "127.0.0.1"
    http_port: int = 3000
    http_path: str = "/slack/events"
    api_url: str = "https://slack.com/api/"


@dataclass(frozen=True)
class DiscordSettings(ServerSettings[int]):
    token_env: str = "KAIWA_DISCORD_TOKEN"
    allowed_roles: list[int] = field(default_factory=list)
    allowed_guilds: list[int] = field(default_factory=list)
    slash_commands: bool = True
    thread_archive_minutes: int = 1440
    api_base: str = "https://discord.com/api/v10"
    gateway_url: str = "wss://gateway.discord.gg/"


@dataclass(frozen=True)
class WebSettings(ChannelSettings):
    """The web chat: off unless `kaiwa run --web` or `enabled = true`; served on `host:port` (0
    picks a free port), signed in by the operator's one-time link, and, for a team, by a reverse
    proxy that names the person in `user_header`."""

    OPERATOR: ClassVar[str] = "operator"
    """The person the operator's one-time link signs in (no proxy may name one so)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8765
    edit_interval: float = 0.25
    """Seconds between two changes of a streaming reply's bubble."""
    allowed_hosts: list[str] = field(default_factory=list)
    """Host names (with their port) the page may be reached by besides the served address and
    localhost: a reverse proxy's or a tunnel's."""
    user_header: str = ""
    """The header a trusted proxy names the signed-in person in (`X-Forwarded-User`); empty:
    the operator's link is the only sign-in."""
    trusted_proxies: list[str] = field(default_factory=list)
    """Addresses or networks (`10.0.0.5`, `10.0.0.0/24`) the proxy connects from: the only ones
    whose `user_header` counts."""
    allowed_users: list[str] = field(default_factory=list)
    """The people the proxy names who may use the web chat (the operator always may)."""
    anyone: bool = False
    """Anyone the proxy names may use it (`allowed_users` is then ignored)."""
