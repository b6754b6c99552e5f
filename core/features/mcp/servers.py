"""The MCP servers an agent may use, as a turn part; the SDK only where a server is configured.

`McpServers` is what the rest of Kaiwa holds: the part that gives each agent the tools its `mcp`
names, and what `kaiwa check` describes. The `mcp` SDK and what it brings (its transports, a web
stack, JSON Schema) cost about 15 MiB and a third of a second to import, so they load with the
first configured server (`core.features.mcp.session`), never for a Kaiwa that has none.
"""

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.agent.profile import AgentProfile
from core.agent.tools import Tool
from core.errors import KaiwaError
from core.turns.parts import Part

if TYPE_CHECKING:
    from core.features.mcp.session import McpServer


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

    def __init__(self, settings: Mapping[str, McpServerSettings]) -> None:
        self.servers: list[McpServer] = []
        if settings:
            from core.features.mcp import session

            self.servers = [session.McpServer(name, each) for name, each in settings.items()]

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
        """A line per server, for `kaiwa check`: its tools, or why it is not running."""
        lines = []
        for server in self.servers:
            if server.tools and server.problem is None:
                names = ", ".join(sorted(tool.name for tool in server.tools.values()))
                lines.append(f"{server.name}: {len(server.tools)} tools ({names})")
            else:
                lines.append(f"{server.name}: not running: {server.problem or 'no answer yet'}")
        return lines
