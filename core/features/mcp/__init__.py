"""MCP servers: their tools join Kaiwa's as `<prefix>.<tool>`, and their failures stay theirs.

Each server in `[mcp.<name>]` (a command run over stdio, or a streamable-HTTP URL with headers
taken from environment variables) is held open by a supervisor task of its own, started with
Kaiwa (`McpServers.start`): connect with the `mcp` SDK's client, list the tools, serve calls;
when the connection fails, a call does, or the server exits, connect again after a backoff (1 s,
doubling to 30 s). The SDK's transports are anyio context managers that must be entered and left
in one task, which is why a supervisor owns each session and calls only borrow it.

A call that fails, or that the agent loop gives up on (its tool timeout, a `/stop`), restarts
the server: a server that hung on one call may hang on the next. A server that exits is noticed
the moment its messages stop, not by the next call: until it is back, a call of its tools is
answered at once that it is not running, and why. Every failure becomes the tool's result
(`McpError`), never a crashed turn. A result's text reaches the model as it is, an embedded text
resource with its URI, and what is not text (an image, audio, a binary resource) by its type and
size; a link to a resource by its name, description, URI and type. An agent reaches a server's
tools only when its `tools` names the server (`files`) or the tool (`files.read_file`).
"""
