"""What a turn uses besides its agent's own tools, each feature a package or module of its own.

`subagents/` (delegation, runs reported back once, `/agents`), `approvals/` (a person's yes
before a risky tool, `/approve`), `schedule/` (tasks that fire as turns, their tools, `/tasks`),
`memory.py` (notes, `/memory`), `archive.py` (searching past conversations), `fetch.py` (a web
page as text, safely), `mcp/` (MCP servers' tools) and `attachments/` (documents and voice notes
people attach, as text).

A feature plugs in beside the turn path (`core.turns.parts.Part`, its commands added to the
dispatcher's); bot/wiring.py hands each in. Features may import `core.turns`, `core.store`,
`core.agent` and the shared types, never each other, the dispatcher or the cluster.
"""
