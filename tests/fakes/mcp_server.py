"""An MCP server for tests, written with the `mcp` SDK's server side, over stdio or streamable
HTTP: `python -m tests.fakes.mcp_server stdio`, or `... http --port N`, which prints
`READY <url>` once it listens.

Its tools: `add(a, b)`, `shout(text)`, `picture()` (an image, for results that are not text),
`fail()` (a tool error), `hang()` (never answers) and `crash()` (the process exits at once, as a
crashing server does).
`crash` first writes a file named by `KAIWA_FAKE_MCP_CRASHED` if set, so a test knows it ran.
"""

import argparse
import asyncio
import base64
import os
import sys

from mcp.server.fastmcp import FastMCP, Image

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


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

    return fake


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a fake MCP server.")
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    if args.transport == "stdio":
        server().run("stdio")
        return
    print(f"READY http://127.0.0.1:{args.port}/mcp", flush=True, file=sys.stdout)
    server(args.port).run("streamable-http")


if __name__ == "__main__":
    main()
