"""MCP servers through the whole turn path: an SDK-written server (tests/fakes/mcp_server.py)
over stdio and over streamable HTTP, its tools offered only as the agent's `tools` name them, a
result that is not text described, a tool error and a crash that become results, and the crashed
server started again. Handshakes: the server's `connected` event, the fake model's script."""

import asyncio
import socket
import sys
from collections.abc import AsyncIterator

import pytest

from core.agent.profile import AgentProfile
from core.features.mcp.servers import McpServers, McpServerSettings
from core.features.subagents.runs import SubagentSettings
from tests.fakes.ollama import Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory

STDIO = McpServerSettings(command=sys.executable, args=["-m", "tests.fakes.mcp_server", "stdio"])


@pytest.fixture
async def stdio_servers() -> AsyncIterator[McpServers]:
    servers = McpServers({"fake": STDIO})
    await servers.start()
    yield servers
    await servers.close()


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    """The fake MCP server over streamable HTTP, in its own process; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.mcp_server",
        "http",
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    ready = (await process.stdout.readline()).decode().split()
    yield ready[1]
    process.kill()
    await process.wait()


def served(make_bot: BotFactory, servers: McpServers, *names: str) -> Bot:
    bot = make_bot(mcp=names, servers=servers)
    return bot


def results(bot: Bot, request: int = 1) -> list[str]:
    messages = bot.ollama.requests[request]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


def offered(bot: Bot, request: int = 0) -> list[str]:
    return sorted(t["function"]["name"] for t in bot.ollama.requests[request].get("tools", []))


async def test_a_stdio_servers_tool_runs_and_only_the_named_ones_are_offered(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    bot = served(make_bot, stdio_servers, "fake.add", "fake.picture")
    bot.ollama.script(ToolCall("fake.add", {"a": 2, "b": 3}), ToolCall("fake.picture", {}))
    bot.ollama.script(Text("5, and a picture."))
    await bot.send("add 2 and 3, and show a picture")
    await bot.channel.finished()

    assert [name for name in offered(bot) if name.startswith("fake.")] == [
        "fake.add",
        "fake.picture",
    ]
    added, picture = results(bot)
    assert added == "5"
    assert picture.startswith("[image: image/png, ") and picture.endswith(" bytes, not shown]")


async def test_a_streamable_http_server_by_its_name(make_bot: BotFactory, http_server: str) -> None:
    servers = McpServers({"web": McpServerSettings(url=http_server)})
    await servers.start()
    try:
        await servers.servers[0].connected.wait()  # it may still have been starting up
        bot = served(make_bot, servers, "web")
        bot.ollama.script(ToolCall("web.shout", {"text": "hello"}))
        bot.ollama.script(Text("HELLO!"))
        await bot.send("shout hello")
        await bot.channel.finished()
    finally:
        await servers.close()

    assert {"web.add", "web.shout", "web.crash"} <= set(offered(bot))
    assert results(bot) == ["HELLO!"]


async def test_a_tool_error_and_a_crash_are_results_and_the_server_comes_back(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    (server,) = stdio_servers.servers
    bot = served(make_bot, stdio_servers, "fake")
    bot.ollama.script(ToolCall("fake.fail", {}))
    bot.ollama.script(ToolCall("fake.crash", {}))
    bot.ollama.script(Text("The server crashed."))
    await bot.send("try the fake")
    await bot.channel.finished()
    await server.connected.wait()  # started again
    bot.ollama.script(ToolCall("fake.add", {"a": 1, "b": 1}))
    bot.ollama.script(Text("2."))
    await bot.send("add 1 and 1")
    await bot.channel.finished(2)

    failed = results(bot, 1)[0]
    assert "fake.fail: Error executing tool fail: the fake was told to fail" in failed
    crashed = results(bot, 2)[-1]
    assert crashed.startswith("'fake.crash' failed: McpError: fake.crash failed:")
    assert results(bot, 4)[-1] == "2"
    assert [reply.outcome.value for reply in bot.channel.replies] == ["done", "done"]  # type: ignore[union-attr]
    assert bot.channel.notices_in(PLACE) == []


async def test_a_server_that_cannot_start_says_why_and_its_tools_are_absent(
    make_bot: BotFactory,
) -> None:
    servers = McpServers({"gone": McpServerSettings(command="/nonexistent/mcp-server")})
    await servers.start()
    try:
        (line,) = servers.describe()
        bot = served(make_bot, servers, "gone")
        bot.ollama.script(Text("No such tools."))
        await bot.send("hi")
        await bot.channel.finished()
    finally:
        await servers.close()

    assert line.startswith("gone: not running: ")
    assert not [name for name in offered(bot) if name.startswith("gone.")]


async def test_a_sub_agents_profile_may_name_a_servers_tools(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    adder = AgentProfile(
        name="adder", model="test-model", system_prompt="You add.", tools={}, mcp=("fake.add",)
    )
    bot = make_bot(
        agents={"adder": adder},
        delegates_to=("adder",),
        subagents=SubagentSettings(status_message=False),
        servers=stdio_servers,
    )
    task = {"profile": "adder", "instruction": "sum two and three", "name": "sum"}
    bot.ollama.script(ToolCall("delegate", {"tasks": [task]}))
    bot.ollama.script(Text("Summing."))
    bot.ollama.script_for("two and three", ToolCall("fake.add", {"a": 2, "b": 3}))
    bot.ollama.script_for("two and three", ToolCall("report", {"summary": "5"}))
    bot.ollama.default = [Text("It is 5.")]
    await bot.send("what is 2 + 3? ask a helper")
    await bot.channel.finished()
    run = bot.subagents.find(PLACE, "a1")
    assert run is not None
    await run.finished.wait()

    assert (run.status, run.report) == ("done", "5")
    transcript = await bot.store.transcript(run.row_id)
    assert next(m.text for m in transcript if m.role == "tool") == "5"


async def test_a_call_that_hangs_is_given_up_at_the_tool_timeout_and_the_server_restarted(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    (server,) = stdio_servers.servers
    bot = make_bot(mcp=("fake",), tool_timeout=0.5, tool_grace=0.2, servers=stdio_servers)
    bot.ollama.script(ToolCall("fake.hang", {}))
    bot.ollama.script(Text("It did not answer."))
    await bot.send("call the slow one")
    (reply,) = await bot.channel.finished()
    await server.connected.wait()  # a fresh server

    assert reply.text == "It did not answer."
    (given_up,) = results(bot)
    assert "fake.hang" in given_up and "0.5" in given_up
