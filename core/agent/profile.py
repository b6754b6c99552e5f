"""An agent as configured: who it is, which model it runs on, what it may use.

A profile is plain data, read by everything that runs an agent: the turn runner (a conversation's
agent), sub-agents (the profiles a delegation may choose) and the context windows (its own window
or its model's). It lives beside the agent loop because nothing in it depends on where the agent
runs; the fields a feature reads (`delegates_to`, `mcp`, `run_iterations`) are configuration of
the agent, named here so that `[agents.<name>]` has one home in code.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from core.agent.tools import Tool


@dataclass(frozen=True)
class AgentProfile:
    name: str
    model: str
    system_prompt: str
    tools: Mapping[str, Tool]
    think: bool | None = None
    max_iterations: int = 10
    images: bool = False
    """Whether the model reads images (a vision model)."""
    context_window: int = 0
    """Tokens; 0 chooses one for the model (`ContextPolicy.window`)."""
    description: str = ""
    """What the agent is for, as an agent choosing whom to hand work to reads it."""
    delegates_to: tuple[str, ...] = ()
    """The agents this one may hand work to (`core.features.subagents`)."""
    run_iterations: int = 30
    """Most model calls in one of its runs as a sub-agent (`[subagents].max_iterations` caps it)."""
    mcp: tuple[str, ...] = ()
    """MCP servers (`files`) or their tools (`files.read_file`) it may use."""
