"""The MCP servers an agent may use, as a turn part; the SDK only where a server is configured.

`McpServers` is what the rest of Kaiwa holds: the part that gives each agent the tools its `mcp`
names, and what `kaiwa check` describes.

A stdio server is somebody else's program, so it never sees Kaiwa's environment (channel tokens,
the database URL, whatever the operator exported): it starts with `INHERITED_VARIABLES` (the
`mcp` SDK's own default set, with the locale and the time zone) and exactly what its table names,
`env` (values written in the file, never secrets) and `env_from` (variables copied from Kaiwa's
environment, for its secrets). `McpServerSettings.environment` is the one place that builds it.

The `mcp` SDK and what it brings (its transports, a web stack, JSON Schema) cost about 15 MiB
and a third of a second to import, so they load with the first configured server
(`core.features.mcp.session`), never for a Kaiwa that has none.
"""

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.errors import KaiwaError
from core.turns.parts import Part

if TYPE_CHECKING:
    from core.features.mcp.session import McpServer

logger = logging.getLogger(__name__)

START_SECONDS = 10.0
"""How long start-up waits for a server's first tool list before going on without it."""
Pause = Callable[[float], Awaitable[None]]
"""How a server's supervisor waits out its backoff before starting it again."""
INHERITED_VARIABLES = (
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
)
"""What every stdio server gets of Kaiwa's environment, where it is set: what a program needs
to run, find its tools and files, and read text in the operator's locale; nothing secret."""


class McpError(KaiwaError):
    """An MCP server that is down or whose call failed, in words for the model."""


@dataclass(frozen=True)
class McpServerSettings:
    command: str = ""
    """A program to run, speaking MCP on its stdin and stdout."""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Variables set for a stdio server, with their values: {"LOG_LEVEL": "info"}."""
    env_from: list[str] = field(default_factory=list)
    """Variables a stdio server gets from Kaiwa's environment, as they are there (its tokens)."""
    url: str = ""
    """Or: a streamable-HTTP endpoint."""
    headers_env: dict[str, str] = field(default_factory=dict)
    """HTTP headers whose values come from environment variables: {"Authorization": "MY_TOKEN"}."""
    prefix: str = ""
    """What its tools' names start with (the server's name if empty)."""

    def environment(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """A stdio server's whole environment: `INHERITED_VARIABLES` that are set, then those
        `env_from` names that are set, then `env`."""
        passed = [*INHERITED_VARIABLES, *self.env_from]
        return {name: environ[name] for name in passed if name in environ} | self.env

    def unset(self, environ: Mapping[str, str] = os.environ) -> list[str]:
        """The variables `env_from` names that Kaiwa's environment does not have."""
        return [name for name in self.env_from if name not in environ]


class McpServers(Part):
    """Every configured server; a turn part that gives an agent the tools its `mcp` names
    among theirs, wherever it runs (its conversation's turns and its runs as a sub-agent)."""

    def __init__(
        self,
        settings: Mapping[str, McpServerSettings],
        pause: Pause = asyncio.sleep,
        *,
        once: bool = False,
    ) -> None:
        """`once`: each server is tried once and never restarted (`kaiwa check`, which only
        asks whether they start)."""
        self.servers: list[McpServer] = []
        if settings:
            from core.features.mcp import session

            self.servers = [
                session.McpServer(name, each, pause, once=once) for name, each in settings.items()
            ]

    async def start(self) -> None:
        for line in self.unset_variables():
            logger.warning("%s", line)
        await asyncio.gather(*(server.start() for server in self.servers))

    async def close(self) -> None:
        await asyncio.gather(*(server.close() for server in self.servers))

    def names(self) -> set[str]:
        return {server.prefix for server in self.servers}

    def tools_for(self, agent: AgentProfile) -> dict[str, Tool]:
        """The tools named (`server.tool`) or of servers named (`server`) in the agent's
        `mcp`."""
        chosen: dict[str, Tool] = {}
        for name in agent.mcp:
            for server in self.servers:
                for tool in server.tools.values():
                    if name in (server.name, server.prefix, tool.name):
                        chosen[tool.name] = tool
        return chosen

    def describe(self) -> list[str]:
        """A line per server, for `kaiwa check`: a running one's tools, and the names of the
        variables a stdio server is started with (never their values)."""
        lines = []
        for server in self.servers:
            said = []
            if server.connected.is_set():
                names = ", ".join(sorted(tool.name for tool in server.tools.values()))
                said.append(f"{len(server.tools)} tools ({names})")
            if server.settings.command:
                variables = ", ".join(sorted(server.settings.environment()))
                said.append(f"gets the variables {variables or '(none)'}")
            if said:
                lines.append(f"{server.name}: {'; '.join(said)}")
        return lines

    def problems(self) -> list[str]:
        """What keeps each server that is not running from starting, and each variable a
        server's `env_from` names that is not set, with where to fix it, for `kaiwa check`."""
        down = [_problem(server) for server in self.servers if not server.connected.is_set()]
        return self.unset_variables() + down

    def unset_variables(self) -> list[str]:
        """Each variable a server's `env_from` names that Kaiwa's environment does not have:
        the server starts without it."""
        return [
            f"[mcp.{server.name}].env_from names {name}, which is not set in Kaiwa's "
            f"environment, so the server starts without it: export {name} before starting "
            "Kaiwa, or take it out of env_from"
            for server in self.servers
            for name in server.settings.unset()
        ]


def _problem(server: "McpServer") -> str:
    table = f"[mcp.{server.name}]"
    if server.settings.command:
        where = f"check {table}.command and args (run the command by hand to see its error)"
        what = f"MCP server {server.name} does not start"
    else:
        where = f"check {table}.url, and the variables its headers_env names"
        what = f"MCP server {server.name} does not answer"
    if server.problem is None:
        return f"{what}: no tool list within {START_SECONDS:g} s; {where}"
    return f"{what}: {server.problem}; {where}"
