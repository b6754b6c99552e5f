"""What a start loads: only the libraries of what is configured.

A library a configuration does not use costs every process its memory for nothing (the MCP SDK
with its web stack, psycopg, aiohttp's web server: about 30 MiB together), and a burst's peak
memory is that plus the work. Each is imported where it is first needed instead.
"""

import subprocess
import sys

UNUSED_BY_A_TELEGRAM_BOT_ON_SQLITE = ("mcp", "psycopg", "aiohttp", "html2text", "prompt_toolkit")


def test_a_telegram_bot_on_sqlite_loads_no_library_it_does_not_use() -> None:
    """Regression: every start imported the MCP SDK, psycopg (for the cluster) and aiohttp's web
    server (for webhooks), configured or not: 152 MiB peak in a 300-chat burst, 122 without."""
    probe = (
        "import sys\n"
        "import bot.cli, bot.app, bot.reports, channels.telegram.channel\n"
        f"print(sorted(set({UNUSED_BY_A_TELEGRAM_BOT_ON_SQLITE!r}) & set(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()

    assert loaded == "[]"
