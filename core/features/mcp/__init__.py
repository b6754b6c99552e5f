"""MCP servers: their tools join Kaiwa's as `<prefix>.<tool>`, and their failures stay theirs.

Each server in `[mcp.<name>]` (a command run over stdio, or a streamable-HTTP URL with headers
taken from environment variables) is held open by a supervisor task of its own, started with
Kaiwa (`McpServers.start`): connect with the `mcp` SDK's client, list the tools, serve calls;
when the connection fails or a call does, connect again after a backoff (1 s, doubling to 30 s).
The SDK's transports are anyio context managers that must be entered and left in one task,
which is why a supervisor owns each session and calls only borrow it.

A call that fails, or that the agent loop gives up on (its tool timeout, a `/stop`), restarts
the server: a server that hung on one call may hang on the next. Every failure becomes the
tool's result (`McpError`), never a crashed turn. A result that is not text is described by its
kind and size. An agent reaches a server's tools only when its `tools` names the server
(`files`) or the tool (`files.read_file`).
"""
