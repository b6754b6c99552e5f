"""An MCP server for tests, written with the `mcp` SDK's server side, over stdio or streamable
HTTP: `python -m tests.fakes.mcp_server stdio`, or `... http --port N`, which prints
`READY <url>` once it listens.

Its tools: `add(a, b)`, `shout(text)`, `picture()` (an image, for results that are not text),
`resources()` (an embedded text resource, an embedded binary one and a link to a resource),
`fail()` (a tool error), `hang()` (never answers), `crash()` (the process exits at once, as a
crashing server does) and `pid()` (its process id, for a test to end it between calls: on
SIGTERM it says `STOPPED` on stderr and exits). Two tools have the arguments Python servers
give: `log(max_count, start_timestamp, since)`, optional and constrained ones (`anyOf`,
`default`, `minimum`, `maximum`, `format`), and `file_ticket(ticket, place)`, objects nested
through `$defs` and written inline.
`crash` first writes a file named by `KAIWA_FAKE_MCP_CRASHED` if set (a variable its server's
`env_from` must name), so a test knows it ran. `environment()` returns the server's whole
environment as JSON, as a server that reports or logs it would.
"""

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import sys
from datetime import datetime
from types import FrameType
from typing import Annotated, Any

import uvicorn
from mcp.server.fastmcp import FastMCP, Image
from mcp.types import (
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ResourceLink,
    TextResourceContents,
)
from pydantic import AnyUrl, BaseModel, Field, WithJsonSchema

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
ARCHIVE = bytes(range(256)) * 4
"""The embedded binary resource's content: 1,024 bytes."""
STOPPED = "the fake MCP server was told to stop"
PLACE = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "where"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["city"],
}
"""An object argument written inline, as a TypeScript server's schema has it."""


class Person(BaseModel):
    name: str
    email: str | None = None


class Ticket(BaseModel):
    title: str
    owner: Person = Field(description="who looks after it")
    priority: int = Field(default=3, ge=1, le=5)


def server(port: int = 0) -> FastMCP:
    fake = FastMCP("fake", host="127.0.0.1", port=port, log_level="WARNING")

    @fake.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @fake.tool()
    def shout(text: str) -> str:
        """Say it louder."""
        return text.upper() + "!"

    @fake.tool()
    def picture() -> Image:
        """A one-pixel picture."""
        return Image(data=PIXEL, format="png")

    @fake.tool(structured_output=False)
    def resources() -> list[ContentBlock]:
        """A note, an archive and a link to a report."""
        note = TextResourceContents(
            uri=AnyUrl("file:///notes/today.txt"), mimeType="text/plain", text="Buy milk."
        )
        archive = BlobResourceContents(
            uri=AnyUrl("file:///backups/notes.zip"),
            mimeType="application/zip",
            blob=base64.b64encode(ARCHIVE).decode(),
        )
        report = ResourceLink(
            type="resource_link",
            name="q3-report",
            title="Q3 report",
            uri=AnyUrl("file:///reports/q3.pdf"),
            description="Sales by region",
            mimeType="application/pdf",
            size=52_000,
        )
        return [
            EmbeddedResource(type="resource", resource=note),
            EmbeddedResource(type="resource", resource=archive),
            report,
        ]

    @fake.tool()
    def log(
        max_count: Annotated[int, Field(ge=1, le=100)] = 10,
        start_timestamp: str | None = None,
        since: datetime | None = None,
    ) -> str:
        """The commit log."""
        return f"{max_count} commits from {start_timestamp or since or 'the start'}"

    @fake.tool()
    def file_ticket(ticket: Ticket, place: Annotated[dict[str, Any], WithJsonSchema(PLACE)]) -> str:
        """File a ticket."""
        return f"filed {ticket.title!r} for {ticket.owner.name} in {place['city']}"

    @fake.tool()
    def fail() -> str:
        """Always fails."""
        raise ValueError("the fake was told to fail")

    @fake.tool()
    async def hang() -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "never"

    @fake.tool()
    def crash() -> str:
        """The server process dies."""
        marker = os.environ.get("KAIWA_FAKE_MCP_CRASHED")
        if marker:
            with open(marker, "w") as written:
                written.write("crashed")
        os._exit(1)

    @fake.tool()
    def environment() -> str:
        """The server's environment variables and their values."""
        return json.dumps(dict(os.environ), sort_keys=True)

    @fake.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    return fake


def stop(signal_number: int, frame: FrameType | None) -> None:
    """SIGTERM: last words on stderr, then the process ends."""
    print(STOPPED, file=sys.stderr, flush=True)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a fake MCP server.")
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop)
    if args.transport == "stdio":
        server().run("stdio")
        return
    serve_http(args.port)


def serve_http(port: int) -> None:
    """Over streamable HTTP: `READY` once the port takes connections (they wait in its backlog
    until the server accepts them), so a client never finds it closed."""
    listening = socket.create_server(("127.0.0.1", port))
    print(f"READY http://127.0.0.1:{port}/mcp", flush=True, file=sys.stdout)
    app = server(port).streamable_http_app()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])


if __name__ == "__main__":
    main()
