"""MCP servers through the whole turn path: an SDK-written server (tests/fakes/mcp_server.py)
over stdio and over streamable HTTP, its tools offered only as the agent's `tools` name them and
with their whole schemas (what the fake Ollama received), a result that is not text described,
a tool error and a crash that become results, a server that exits between calls noticed at once,
and the server started again. Handshakes: the server's `connected` event, a pause the test holds
(`HeldPause`: the supervisor reached it once it noticed an exit), the fake model's script."""

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from core.agent.profile import AgentProfile
from core.features.mcp.servers import INHERITED_VARIABLES, McpServers, McpServerSettings
from core.features.subagents.runs import SubagentSettings
from tests.fakes.mcp_server import STOPPED
from tests.fakes.ollama import Text, ToolCall
from tests.harness import PLACE, Bot, BotFactory

STDIO = McpServerSettings(command=sys.executable, args=["-m", "tests.fakes.mcp_server", "stdio"])


class HeldPause:
    """A supervisor's backoff that lasts until the test releases it; `reached` once a
    supervisor waits in it (it has noticed its server is gone)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self._released = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.reached.set()
        await self._released.wait()

    def release(self) -> None:
        self._released.set()


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


def sent(bot: Bot, name: str, request: int = 0) -> dict[str, Any]:
    """The tool `name` as the request's body carried it to Ollama."""
    tools = bot.ollama.requests[request]["tools"]
    return next(each["function"] for each in tools if each["function"]["name"] == name)


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
    assert crashed == (
        "'fake.crash' failed: McpError: fake.crash failed: fake stopped during the call (it "
        "exited without a word on stderr); restarting, try again shortly"
    )
    assert results(bot, 4)[-1] == "2"
    assert [reply.outcome.value for reply in bot.channel.replies] == ["done", "done"]  # type: ignore[union-attr]
    assert bot.channel.notices_in(PLACE) == []


async def test_a_server_that_cannot_start_says_why_and_its_tools_are_absent(
    make_bot: BotFactory,
) -> None:
    servers = McpServers({"gone": McpServerSettings(command="/nonexistent/mcp-server")})
    await servers.start()
    try:
        described, (problem,) = servers.describe(), servers.problems()
        bot = served(make_bot, servers, "gone")
        bot.ollama.script(Text("No such tools."))
        await bot.send("hi")
        await bot.channel.finished()
    finally:
        await servers.close()

    (line,) = described
    assert line.startswith("gone: gets the variables ") and "tools" not in line
    assert problem == (
        "MCP server gone does not start: FileNotFoundError: [Errno 2] No such file or "
        "directory: '/nonexistent/mcp-server'; check [mcp.gone].command and args (run the "
        "command by hand to see its error)"
    )
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


async def test_optional_and_constrained_arguments_reach_the_model_with_their_type(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    """Regression (issue 26): the ollama client's typed tools kept of a property only its type,
    items, description and enum, so every optional argument (`anyOf`, as `mcp-server-git`'s
    `git_log.start_timestamp`) reached the model with no type at all, and a default, a range
    or a format never reached it."""
    bot = served(make_bot, stdio_servers, "fake.log")
    bot.ollama.script(ToolCall("fake.log", {"max_count": 5, "start_timestamp": "2024-01-01"}))
    bot.ollama.script(Text("Five commits."))
    await bot.send("the last five commits since new year")
    await bot.channel.finished()

    assert sent(bot, "fake.log")["parameters"] == {
        "type": "object",
        "properties": {
            "max_count": {
                "type": "integer",
                "description": "default: 10; maximum: 100; minimum: 1",
            },
            "start_timestamp": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "default: null",
            },
            "since": {
                "anyOf": [{"type": "string", "description": "format: date-time"}, {"type": "null"}],
                "description": "default: null",
            },
        },
        "required": [],
    }
    assert bot.ollama.dropped[0] == []  # Ollama reads every key it was sent
    assert results(bot) == ["5 commits from 2024-01-01"]


async def test_an_object_arguments_properties_reach_the_model(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    """Regression (issue 26): an object argument reached the model without its properties and
    their `required`, whether written inline or through `$defs` (which Ollama cannot follow
    from a property: they are inlined)."""
    bot = served(make_bot, stdio_servers, "fake.file_ticket")
    ticket = {"title": "Printer jam", "owner": {"name": "Ann"}}
    bot.ollama.script(ToolCall("fake.file_ticket", {"ticket": ticket, "place": {"city": "Lyon"}}))
    bot.ollama.script(Text("Filed."))
    await bot.send("file a ticket for the printer")
    await bot.channel.finished()

    parameters = sent(bot, "fake.file_ticket")["parameters"]
    assert parameters["required"] == ["ticket", "place"]
    assert parameters["properties"]["ticket"] == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "owner": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "email": {
                        "anyOf": [{"type": "string"}, {"type": "null"}],
                        "description": "default: null",
                    },
                },
                "required": ["name"],
                "description": "who looks after it",
            },
            "priority": {"type": "integer", "description": "default: 3; maximum: 5; minimum: 1"},
        },
        "required": ["title", "owner"],
    }
    assert parameters["properties"]["place"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "where"},
            "zip": {"type": "string", "description": "pattern: ^[0-9]{5}$"},
        },
        "required": ["city"],
    }
    assert bot.ollama.dropped[0] == []
    assert results(bot) == ["filed 'Printer jam' for Ann in Lyon"]


async def test_embedded_resources_and_links_reach_the_model_in_words(
    make_bot: BotFactory, stdio_servers: McpServers
) -> None:
    """Regression (issue 26): an embedded resource was reduced to its URI, its text lost."""
    bot = served(make_bot, stdio_servers, "fake.resources")
    bot.ollama.script(ToolCall("fake.resources", {}))
    bot.ollama.script(Text("A note, an archive and a report."))
    await bot.send("what is there?")
    await bot.channel.finished()

    (result,) = results(bot)
    assert result == (
        "[resource file:///notes/today.txt (text/plain)]\n"
        "Buy milk.\n"
        "[resource file:///backups/notes.zip: application/zip, 1,024 bytes, not shown]\n"
        "[link to a resource: q3-report (Q3 report); Sales by region; file:///reports/q3.pdf; "
        "application/pdf; 52,000 bytes]"
    )


async def test_a_server_tried_once_is_never_started_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: `kaiwa check` restarted a server that could not start, with backoff, for as
    long as the check ran; under load the restarts piled up and the check outlived its test's
    deadline. Tried once, the supervisor ends with the server's problem and never backs off."""
    held = HeldPause()
    gone = McpServerSettings(command="/nonexistent/mcp-server")
    servers = McpServers({"gone": gone}, pause=held, once=True)
    with caplog.at_level(logging.WARNING, logger="core.features.mcp.session"):
        await servers.start()  # returns once the failure is known: a retry's backoff, in the
    reached = held.reached.is_set()  # same step as the failure, would already have begun
    await servers.close()

    assert not reached, "no backoff, no second try"
    assert servers.problems()[0].startswith("MCP server gone does not start: FileNotFoundError")
    assert not [r for r in caplog.records if "trying again" in r.getMessage()]


async def test_a_server_that_exits_between_calls_is_answered_not_running_until_it_is_back(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 26): a server that exited was noticed only by the next call, which
    failed with ClosedResourceError. Now the exit is noticed as it happens, logged once with
    the server's last words on stderr, a call meanwhile is answered at once that it is not
    running, and once it is started again its tools work."""
    held = HeldPause()
    servers = McpServers({"fake": STDIO}, pause=held)
    await servers.start()
    (server,) = servers.servers
    try:
        bot = served(make_bot, servers, "fake")
        os.kill(int(await server.call("pid", {})), signal.SIGTERM)
        with caplog.at_level(logging.WARNING, logger="core.features.mcp.session"):
            await held.reached.wait()  # noticed, with no call made
            bot.ollama.script(ToolCall("fake.add", {"a": 1, "b": 2}))
            bot.ollama.script(Text("It is restarting."))
            await bot.send("add 1 and 2")
            await bot.channel.finished()
        held.release()
        await server.connected.wait()
        bot.ollama.script(ToolCall("fake.add", {"a": 1, "b": 2}))
        bot.ollama.script(Text("3."))
        await bot.send("add 1 and 2 again")
        await bot.channel.finished(2)
    finally:
        await servers.close()

    assert results(bot) == [
        f"'fake.add' failed: McpError: fake is not running (it exited: {STOPPED}); "
        "restarting, try again shortly"
    ]
    assert results(bot, 3)[-1] == "3"
    logged = [
        record.getMessage()
        for record in caplog.records
        if record.name == "core.features.mcp.session" and record.levelno >= logging.WARNING
    ]
    assert logged == [f"MCP fake stopped (it exited: {STOPPED}); starting it again in 1 s"]


async def test_a_server_that_cannot_start_says_its_own_last_words() -> None:
    """A stdio server that exits as it starts: why, in the last line of its stderr."""
    gone = McpServerSettings(
        command=sys.executable, args=["-c", "import sys; sys.exit('no API key: set FAKE_KEY')"]
    )
    servers = McpServers({"gone": gone})
    await servers.start()
    try:
        problems = servers.problems()
    finally:
        await servers.close()

    assert problems == [
        "MCP server gone does not start: it exited: no API key: set FAKE_KEY; check "
        "[mcp.gone].command and args (run the command by hand to see its error)"
    ]


async def test_a_stdio_server_gets_none_of_kaiwas_environment_but_what_its_table_names(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 33): every stdio server was started with Kaiwa's whole environment
    (`env=dict(os.environ)`), so a server that reports or logs it had the channel tokens and
    the database's password. It gets the inherited basics, `env` and `env_from`, and no more;
    a name `env_from` gives that is not set is said in the log."""
    monkeypatch.setenv("KAIWA_TELEGRAM_TOKEN", "123:telegram-secret")
    monkeypatch.setenv("KAIWA_DATABASE_URL", "postgresql://kaiwa:hunter2@db/kaiwa")
    monkeypatch.setenv("TICKETS_TOKEN", "tickets-42")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.delenv("NOT_EXPORTED", raising=False)
    settings = dataclasses.replace(
        STDIO, env={"LOG_LEVEL": "debug"}, env_from=["TICKETS_TOKEN", "NOT_EXPORTED"]
    )
    servers = McpServers({"fake": settings})
    with caplog.at_level(logging.WARNING, logger="core.features.mcp.servers"):
        await servers.start()
    try:
        seen = json.loads(await servers.servers[0].call("environment", {}))
    finally:
        await servers.close()

    assert set(seen) <= {*INHERITED_VARIABLES, "LOG_LEVEL", "TICKETS_TOKEN"}, sorted(seen)
    assert (seen["LOG_LEVEL"], seen["TICKETS_TOKEN"]) == ("debug", "tickets-42")
    assert (seen["PATH"], seen["LANG"]) == (os.environ["PATH"], "C.UTF-8")
    assert "telegram-secret" not in json.dumps(seen) and "hunter2" not in json.dumps(seen)
    assert caplog.messages == [
        "[mcp.fake].env_from names NOT_EXPORTED, which is not set in Kaiwa's environment, so "
        "the server starts without it: export NOT_EXPORTED before starting Kaiwa, or take it "
        "out of env_from"
    ]
