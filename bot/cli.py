"""The `kaiwa` command. Only argparse is imported before the arguments are parsed, so
`kaiwa --help` is instant; configuration and the application load once a command runs.

Its exit statuses are named here, once, and listed by `kaiwa --help` (`EXIT_STATUSES`); the
README and deploy/'s service files rely on them. `NOTHING_TO_SERVE` differs from a configuration
error so that a service manager can leave a worker started without any platform token stopped
instead of restarting it in a loop.
"""

import argparse
import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING

from bot import kaiwa_version

if TYPE_CHECKING:
    from bot.config import Config

FAILED = 1
CONFIG_ERROR = 2
NOTHING_TO_SERVE = 3
INTERRUPTED = 130
EXIT_STATUSES = {
    0: "stopped properly (end of input, Ctrl-C, SIGTERM); `kaiwa check` found no problem",
    FAILED: "could not start, or stopped by a problem; `kaiwa check` found one",
    CONFIG_ERROR: "a configuration error (the line names the key or variable)",
    NOTHING_TO_SERVE: "no channel to serve: no platform's token variable is set",
    INTERRUPTED: "interrupted at once (a second Ctrl-C)",
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from bot.config import config_path, load_config, with_web
    from core.errors import ConfigError, KaiwaError

    try:
        config = load_config(config_path(args.config))
    except ConfigError as exc:
        print(f"kaiwa: configuration error: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    from bot import reports
    from bot.checks import NothingToServe

    try:
        if args.command == "check":
            return asyncio.run(reports.check(config))
        if args.command == "status":
            return asyncio.run(reports.status(config))
        if args.command == "web-link":
            print(f"web chat: {reports.web_link(config)}")
            return 0
        if args.web:
            config = with_web(config)
        return asyncio.run(_run(config, debug=args.debug))
    except ConfigError as exc:
        print(f"kaiwa: configuration error: {exc}", file=sys.stderr)
        return NOTHING_TO_SERVE if isinstance(exc, NothingToServe) else CONFIG_ERROR
    except KaiwaError as exc:
        print(f"kaiwa: cannot start: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as exc:  # one line for a person; the traceback with --debug
        if args.debug:
            raise
        print(
            f"kaiwa: stopped by an unexpected error ({type(exc).__name__}: {exc}); run with "
            "--debug to see where",
            file=sys.stderr,
        )
        return FAILED


async def _run(config: "Config", *, debug: bool) -> int:
    from bot import app

    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop_requested.is_set():
            os._exit(INTERRUPTED)  # the second Ctrl-C: leave at once
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: a closed terminal
        loop.add_signal_handler(signum, on_signal)
    code = await app.run(config, stop_requested, app.TerminalIO(), debug=debug)
    _leave_abandoned_tools(code)
    return code


def _leave_abandoned_tools(code: int) -> None:
    """Everything is stored and closed; a tool that ignored its cancellation may still run, and
    asyncio.run would wait for it for ever. Leave without it."""
    import logging

    from core.agent.tools import abandoned_tools

    left = abandoned_tools()
    if left:
        logging.getLogger(__name__).warning(
            "leaving %d abandoned tool(s) still running (they ignored cancellation)", left
        )
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kaiwa",
        description="Kaiwa: a multi-channel agent chat bot on Ollama.",
        epilog="The config file is --config, else $KAIWA_CONFIG, else ./config.toml,\nelse "
        "the embedded defaults.\n\nexit status:\n"
        + "".join(f"  {code:<4} {meaning}\n" for code, meaning in EXIT_STATUSES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kaiwa {kaiwa_version()}")
    _add_options(parser, command=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, about in (
        ("run", "start the configured channels (the default)"),
        ("check", "check everything a start needs: what is fine, then each problem"),
        ("status", "conversations, today's turns and tokens, the last errors, the live figures"),
        ("web-link", "a fresh one-time link that signs the operator in to the web chat"),
    ):
        # the options work after the command too (`kaiwa run --debug`); given there, they win
        _add_options(commands.add_parser(name, help=about), command=True)
    return parser


def _add_options(parser: argparse.ArgumentParser, *, command: bool) -> None:
    """A command's copy of an option leaves the value alone unless it is given there."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=argparse.SUPPRESS if command else None,
        help="the configuration file to use",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if command else False,
        help="DEBUG lines on stderr, and the traceback of an unexpected error",
    )
    parser.add_argument(
        "--web",
        action="store_true",
        default=argparse.SUPPRESS if command else False,
        help="also serve the web chat ([channels.web]); it prints the link to open",
    )
