"""The MCP servers an agent may use, as a turn part; the SDK only where a server is configured.

`McpServers` is what the rest of Kaiwa holds: the part that gives each agent the tools its `mcp`
names, and what `kaiwa check` describes. The `mcp` SDK and what it brings (its transports, a web
stack, JSON Schema) cost about 15 MiB and a third of a second to import, so they load with the
first configured server (`core.features.mcp.session`), never for a Kaiwa that has none.
"""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.errors import KaiwaError
from core.turns.parts import Part

if TYPE_CHECKING:
    from core.features.mcp.session import McpServer


START_SECONDS = 10.0
"""How long start-up waits for a server's first tool list before going on without it."""
Pause = Callable[[float], Awaitable[None]]
"""How a server's supervisor waits out its backoff before starting it again."""


class McpError(KaiwaError):
    """An MCP server that is down or whose call failed, in words for the model."""


@dataclass(frozen=True)
class McpServerSettings:
    command: str = ""
    """A program to run, speaking MCP on its stdin and stdout."""
    args: list[str] = field(default_factory=list)
    url: str = ""
    """Or: a streamable-HTTP endpoint."""
    headers_env: dict[str, str] = field(default_factory=dict)
    """HTTP headers whose values come from environment variables: {"Authorization": "MY_TOKEN"}."""
    prefix: str = ""
    """What its tools' names start with (the server's name if empty)."""


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
        """A line per running server, for `kaiwa check`: its tools."""
        lines = []
        for server in self.servers:
            if server.connected.is_set():
                names = ", ".join(sorted(tool.name for tool in server.tools.values()))
                lines.append(f"{server.name}: {len(server.tools)} tools ({names})")
        return lines

    def problems(self) -> list[str]:
        """What keeps each server that is not running from starting, with where to fix it, for
        `kaiwa check`."""
        return [_problem(server) for server in self.servers if not server.connected.is_set()]


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
