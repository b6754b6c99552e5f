"""The `kaiwa` command as a person runs it: a real process, the fake Ollama on 127.0.0.1."""

import asyncio
import json
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from bot.cli import NOTHING_TO_SERVE
from core.features.mcp.servers import McpServerSettings
from core.store import Store
from core.store.history import CUT_OFF, SHUTDOWN
from tests.fakes.discord import BOT_TOKEN as DISCORD_TOKEN
from tests.fakes.discord import FakeDiscord
from tests.fakes.ollama import FakeOllama, HttpError, Pause, Text, ToolCall
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.fakes.transcription import FakeTranscription
from tests.ports import free_port
from tests.processes import WAIT_SECONDS, finish, kaiwa, write_config

READY = "Kaiwa is ready"
VOICE_OFF = "voice notes: off (set [transcription].url to hear them)"
MCP_TOOLS = (
    "fake.add, fake.crash, fake.environment, fake.fail, fake.file_ticket, fake.hang, fake.log, "
    "fake.picture, fake.pid, fake.resources, fake.shout"
)
"""What `kaiwa check` lists for the fake MCP server (tests/fakes/mcp_server.py)."""
BASICS = ", ".join(sorted(McpServerSettings(command="fake").environment()))
"""The variables a stdio server gets of Kaiwa's basics set here (a `kaiwa` the tests start has
their environment)."""
MCP_LINE = f"mcp: fake: 11 tools ({MCP_TOOLS}); gets the variables {BASICS}"
"""Its whole line: the tools, then the variables it is started with."""


async def read_until(process: asyncio.subprocess.Process, text: str) -> str:
    assert process.stdout is not None
    seen = ""
    async with asyncio.timeout(WAIT_SECONDS):
        while text not in seen:
            chunk = await process.stdout.read(256)
            if not chunk:
                raise AssertionError(f"output ended before {text!r}: {seen!r}")
            seen += chunk.decode()
    return seen


def all_fine(ollama: FakeOllama) -> str:
    """What `kaiwa check` says of `write_config`'s setup when every part of it is fine."""
    return (
        f"ok: Ollama at {ollama.url} is reachable and has test-model\n"
        "ok: channels ready: terminal\n"
        "context window: assistant: 16,384 tokens (test-model takes up to 40,960; "
        "context.max_window is 16,384)\n"
        "tasks: no scheduled task\n"
        f"{VOICE_OFF}\n"
    )


async def test_check_passes_when_the_model_is_there(ollama: FakeOllama, tmp_path: Path) -> None:
    code, out, _ = await finish(
        await kaiwa("--config", str(write_config(tmp_path, ollama.url)), "check")
    )
    assert code == 0
    assert out == all_fine(ollama)


async def test_check_names_the_model_to_pull(ollama: FakeOllama, tmp_path: Path) -> None:
    config = write_config(tmp_path, ollama.url, model="qwen3:4b")
    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 1
    assert out == (
        f"ok: Ollama at {ollama.url} is reachable\n"
        "ok: channels ready: terminal\n"
        "tasks: no scheduled task\n"
        f"{VOICE_OFF}\n"
        "problem: model qwen3:4b not found: run `ollama pull qwen3:4b`\n"
    )


async def test_check_names_a_database_it_cannot_open_without_its_password(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression: a database that could not be opened ended `kaiwa check` with "cannot start",
    as if it had been starting, and only when nothing else was wrong."""
    config = write_config(tmp_path, ollama.url, model="qwen3:4b")
    url = f"postgresql+psycopg://kaiwa:hunter2@127.0.0.1:{free_port()}/kaiwa"
    code, out, _ = await finish(
        await kaiwa("--config", str(config), "check", env={"KAIWA_DATABASE_URL": url})
    )

    assert code == 1
    reachable, channels, voice, database, model = out.splitlines()
    assert voice == VOICE_OFF
    assert (reachable, channels) == (
        f"ok: Ollama at {ollama.url} is reachable",
        "ok: channels ready: terminal",
    )
    assert database.startswith(
        "problem: cannot open the database postgresql+psycopg://kaiwa:***@127.0.0.1:"
    )
    assert database.endswith(
        "check that it is reachable and that [storage].database_url_env names the right variable"
    )
    assert model == "problem: model qwen3:4b not found: run `ollama pull qwen3:4b`"
    assert "hunter2" not in out


async def test_check_names_a_telegram_token_that_is_wrong(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    async with FakeTelegram() as telegram:
        config = write_config(tmp_path, ollama.url)
        config.write_text(
            config.read_text()
            + f'\n[channels.telegram]\nbase_url = "{telegram.base_url}"\n'
            + f'base_file_url = "{telegram.base_file_url}"\n'
        )
        process = await kaiwa(
            "--config", str(config), "check", env={"KAIWA_TELEGRAM_TOKEN": "999:wrong-token"}
        )
        code, out, _ = await finish(process)
    assert code == 1
    assert out == all_fine(ollama) + (
        "problem: Telegram rejected the bot token in $KAIWA_TELEGRAM_TOKEN (401 Unauthorized): "
        "copy the token @BotFather gave you into that variable\n"
    )
    assert "wrong-token" not in out


async def test_check_names_a_slack_token_that_is_wrong(ollama: FakeOllama, tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        config = write_config(tmp_path, ollama.url)
        config.write_text(config.read_text() + f'\n[channels.slack]\napi_url = "{slack.api_url}"\n')
        process = await kaiwa(
            "--config",
            str(config),
            "check",
            env={"KAIWA_SLACK_BOT_TOKEN": "xoxb-wrong", "KAIWA_SLACK_APP_TOKEN": "xapp-test"},
        )
        code, out, _ = await finish(process)
    assert code == 1
    assert out == all_fine(ollama) + (
        "problem: Slack rejected the bot token in $KAIWA_SLACK_BOT_TOKEN (invalid_auth): copy it "
        "again from your app's settings\n"
    )


async def test_run_refuses_to_start_without_ollama(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9")
    code, out, err = await finish(await kaiwa("run", "--config", str(config)))
    assert code == 1
    (line,) = err.splitlines()  # once (regression: the same line came from the log first)
    assert line.startswith("kaiwa: cannot start: cannot reach Ollama at http://127.0.0.1:9")
    assert READY not in out
    log = (tmp_path / "state" / "kaiwa.log").read_text()
    assert "ERROR bot.app: cannot start: cannot reach Ollama" in log


async def test_a_config_mistake_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[ollama]\ntimeout = 3\n")
    code, _, err = await finish(await kaiwa("--config", str(config)))
    assert code == 2
    assert err.startswith("kaiwa: configuration error: unknown key 'ollama.timeout'")
    assert "Traceback" not in err


async def test_an_unknown_tool_in_config_lists_the_valid_ones(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            'model = "test-model"', 'model = "test-model"\ntools = ["web_search"]'
        )
    )
    code, _, err = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 2
    assert err == (
        "kaiwa: configuration error: agents.assistant.tools: unknown tool 'web_search'; "
        "valid tools: current_time, fetch_url, read_conversation, search_conversations\n"
    )


async def test_a_chat_then_end_of_input(ollama: FakeOllama, tmp_path: Path) -> None:
    ollama.script(Text("Hello from the process.", chunks=3))
    config = write_config(tmp_path, ollama.url)
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None

    await read_until(process, READY)
    process.stdin.write(b"hi there\n")
    await read_until(process, "Hello from the process.")
    process.stdin.close()
    code, _, err = await finish(process)

    assert code == 0, err
    log = (tmp_path / "state" / "kaiwa.log").read_text()
    assert "ready: kaiwa 0.1.0; assistant on test-model; store: SQLite " in log
    assert "; channels connected: terminal\n" in log
    assert re.search(
        r"turn 1 place=terminal:local conversation=1 provenance=person outcome=done "
        r"model_calls=1 tokens_in=\d+ tokens_out=\d+ seconds=",
        log,
    )
    assert "stopped: 0 replies stopped, 0 queued messages kept for the next start" in log
    store = await Store.open(f"sqlite:///{tmp_path / 'state' / 'kaiwa.db'}")
    try:
        conversation = await store.active_conversation("terminal:local")
        assert conversation is not None and conversation.id is not None
        assert [m.text for m in await store.history(conversation.id)] == [
            "hi there",
            "Hello from the process.",
        ]
    finally:
        await store.close()


async def test_ctrl_c_stops_the_live_turn_and_keeps_its_text(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    ollama.script(Text("Half an answer"), Pause("forever"), Text(" never"))
    config = write_config(tmp_path, ollama.url)
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None

    await read_until(process, READY)
    process.stdin.write(b"talk\n")
    await read_until(process, "Half an answer")
    process.send_signal(signal.SIGINT)
    code, out, err = await finish(process)

    assert code == 0, err
    assert "(stopped)" in out
    store = await Store.open(f"sqlite:///{tmp_path / 'state' / 'kaiwa.db'}")
    try:
        conversation = await store.active_conversation("terminal:local")
        assert conversation is not None and conversation.id is not None
        last = (await store.history(conversation.id))[-1]
        assert (last.text, last.stopped) == ("Half an answer", True)
        (turn,) = await store.turns(conversation.id)
        assert (turn.status, turn.stop_reason) == ("stopped", "shutdown")
    finally:
        await store.close()


async def test_a_reply_cut_by_sigterm_reads_to_the_model_as_a_shutdown_not_a_stop(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression (issue 33): after SIGTERM the partial reply is stored `stopped`, and the next
    start's request told the model that the person had stopped it. The person's view is the
    same either way: the reply shows "(stopped)"."""
    ollama.script(Text("Half an answer"), Pause("forever"), Text(" never"))
    ollama.script(Text("Here is the whole answer."))
    config = write_config(tmp_path, ollama.url)
    first = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert first.stdin is not None
    await read_until(first, READY)
    first.stdin.write(b"talk\n")
    await read_until(first, "Half an answer")
    first.send_signal(signal.SIGTERM)
    code, out, err = await finish(first)
    assert code == 0, err
    assert "(stopped)" in out

    second = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert second.stdin is not None
    await read_until(second, READY)
    second.stdin.write(b"go on\n")
    await read_until(second, "Here is the whole answer.")
    second.stdin.close()
    code, _, err = await finish(second)

    assert code == 0, err
    told = [m["content"] for m in ollama.requests[-1]["messages"] if m["role"] == "assistant"]
    assert told == [f"Half an answer\n\n{CUT_OFF[SHUTDOWN]}"]


async def test_run_web_prints_the_one_time_link_that_signs_in(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """`kaiwa run --web` serves the web chat beside the terminal and prints one line with the
    link to open; the link signs in once, and its key is in no log line."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text() + "\n[channels.web]\nport = 0\n")
    process = await kaiwa("--config", str(config), "run", "--web", stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None
    seen = await read_until(process, "/login?key=")
    while "\n" not in seen.partition("web chat: ")[2]:
        seen += await read_until(process, "\n")
    link = seen.partition("web chat: ")[2].partition("\n")[0]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/login\?key=[\w-]{20,}", link), link
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        async with browser.get(link) as page:
            assert page.status == 200 and "/static/app.js" in await page.text()
        async with browser.get(link) as again:
            assert again.status == 403, "a link signs in once"
    process.stdin.close()
    code, _, err = await finish(process)

    assert code == 0, err
    key = link.partition("key=")[2]
    assert key not in (tmp_path / "state" / "kaiwa.log").read_text() and key not in err


@pytest.mark.parametrize("flag", ["--help", "-h"])
async def test_help(flag: str) -> None:
    code, out, _ = await finish(await kaiwa(flag))
    assert code == 0
    assert "usage: kaiwa" in out and "check" in out
    assert f"\n  {NOTHING_TO_SERVE}    no channel to serve: no platform's token variable" in out


async def test_a_missing_discord_intent_stops_the_start_with_the_fix(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    async with FakeDiscord() as discord:
        discord.message_content_intent_enabled = False
        config = write_config(tmp_path, ollama.url)
        config.write_text(
            config.read_text()
            + f'\n[channels.discord]\napi_base = "{discord.api_base}"\n'
            + f'gateway_url = "{discord.gateway_url}"\n'
        )
        process = await kaiwa(
            "--config", str(config), "run", env={"KAIWA_DISCORD_TOKEN": DISCORD_TOKEN}
        )
        code, out, err = await finish(process)
    assert code == 1
    assert (
        "kaiwa: cannot start: Discord would send every message without its text: turn on the "
        "Message Content intent: Discord Developer Portal → your application → Bot → Privileged "
        "Gateway Intents → Message Content Intent"
    ) in err.splitlines()
    assert "Traceback" not in err and "PyNaCl" not in err
    assert DISCORD_TOKEN not in out + err


async def test_a_data_folder_kaiwa_cannot_write_is_one_line(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text().replace('data_dir = "state"', 'data_dir = "a-file/state"'))

    code, _, err = await finish(await kaiwa("--config", str(config), "run"))

    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith(f"kaiwa: configuration error: cannot write the log {tmp_path}")
    assert line.endswith("set [storage].data_dir to a folder Kaiwa may write")


async def test_the_log_file_can_be_turned_off(ollama: FakeOllama, tmp_path: Path) -> None:
    """Regression (issue 33): the log file could not be turned off, so each container wrote one
    of its own beside its stderr; `[logging].file = ""` now logs to stderr only."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text() + '\n[logging]\nfile = ""\nstderr_level = "INFO"\n')

    code, _, err = await finish(await kaiwa("--config", str(config), "run"))

    assert code == 0, err
    assert "INFO bot.app: stopped: 0 replies stopped, 0 queued messages kept" in err
    assert (tmp_path / "state" / "kaiwa.db").is_file()
    assert not list((tmp_path / "state").glob("kaiwa.log*"))


async def test_a_mistyped_database_port_is_one_line(ollama: FakeOllama, tmp_path: Path) -> None:
    url = "postgresql+psycopg://kaiwa:hunter2@127.0.0.1:54x2/kaiwa"
    config = write_config(tmp_path, ollama.url)

    code, _, err = await finish(
        await kaiwa("--config", str(config), "run", env={"KAIWA_DATABASE_URL": url})
    )

    assert code == 1
    (line,) = [line for line in err.splitlines() if line.startswith("kaiwa:")]
    assert line.startswith("kaiwa: cannot start: the database URL is not valid (")
    assert "Traceback" not in err and "hunter2" not in err


async def test_version() -> None:
    code, out, _ = await finish(await kaiwa("--version"))
    assert (code, out) == (0, "kaiwa 0.1.0\n")


async def test_status_reads_the_store_without_starting_anything(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    ollama.script(Text("Fine."))
    ollama.script(HttpError(500, "model runner crashed"))
    config = write_config(tmp_path, ollama.url)
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None
    await read_until(process, READY)
    process.stdin.write(b"hello\n")
    await read_until(process, "Fine.")
    process.stdin.write(b"again\n")
    await read_until(process, "model runner crashed")
    process.stdin.close()
    await finish(process)

    code, out, err = await finish(
        await kaiwa("--config", str(config), "status", env={"KAIWA_CONFIG": ""})
    )

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("store: SQLite ")
    assert lines[1:4] == [
        "conversations: 1",
        "turns today: 2 (1 done, 1 failed)",
        "tokens today: 10 in, 5 out",
    ]
    assert lines[4] == "last errors:"
    assert lines[5].endswith(
        "terminal:local: Ollama answered HTTP 500: model runner crashed; "
        "check the Ollama server log"
    )
    assert lines[6] == (
        "live figures: off; set [metrics].enabled = true to see them here and in Prometheus"
    )


async def test_status_shows_the_running_workers_live_figures(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    ollama.script(Text("Fine."))
    config = write_config(tmp_path, ollama.url)
    port = free_port()
    with config.open("a") as more:
        more.write(f"\n[metrics]\nenabled = true\nport = {port}\n")
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None
    await read_until(process, READY)
    process.stdin.write(b"hello\n")
    await read_until(process, "Fine.")  # the turn is counted as its reply ends, well before
    code, out, err = await finish(await kaiwa("--config", str(config), "status"))  # this starts
    process.stdin.close()
    await finish(process)

    assert code == 0, err
    live = out[out.index("live figures") :].splitlines()
    assert (
        live[0]
        == f"live figures (from http://127.0.0.1:{port}/metrics, since that process started):"
    )
    assert "turns: 1 (1 done)" in live
    assert any(line.startswith("first shown text: half within ") for line in live), out
    assert "tokens: 10 in, 5 out" in live
    assert "queued messages: 0; model requests: 0 in flight, 0 waiting for a slot" in live


async def test_status_says_where_no_worker_answers(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9")
    port = free_port()
    with config.open("a") as more:
        more.write(f"\n[metrics]\nenabled = true\nport = {port}\n")
    code, out, err = await finish(await kaiwa("--config", str(config), "status"))

    assert code == 0, err
    assert f"live figures: no Kaiwa answered at http://127.0.0.1:{port}/metrics (" in out
    assert out.endswith("is it running?\n")


async def test_the_end_of_a_pipe_waits_for_its_answer(ollama: FakeOllama, tmp_path: Path) -> None:
    """`echo hi | kaiwa run` used to stop the reply at the end of input and leave it unanswered."""
    ollama.script(Pause("slow"), Text("Answered before leaving."))
    config = write_config(tmp_path, ollama.url)
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None

    process.stdin.write(b"hi there\n")
    process.stdin.close()
    await ollama.reached("slow")
    ollama.release("slow")
    code, out, err = await finish(process)

    assert code == 0, err
    assert "Answered before leaving." in out and "(stopped)" not in out


async def test_an_unknown_tool_to_ask_about_is_refused_not_silently_unguarded(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """A typo in [approvals].ask would leave the risky tool running without asking."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text() + '\n[approvals]\nask = ["fetch_ur1"]\n')
    code, _, err = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 2
    assert err.startswith("kaiwa: configuration error: approvals.ask: unknown tool 'fetch_ur1';")
    assert "fetch_url" in err and "remember" in err and "schedule_task" in err


def without_terminal(config: Path) -> Path:
    config.write_text(
        config.read_text().replace(
            "[channels.terminal]\n", "[channels.terminal]\nenabled = false\n"
        )
    )
    return config


NO_TOKEN = {"KAIWA_TELEGRAM_TOKEN": "", "KAIWA_SLACK_BOT_TOKEN": "", "KAIWA_DISCORD_TOKEN": ""}
"""An empty .env: every platform's token variable set, to nothing."""


async def test_a_worker_with_no_channel_to_serve_says_so(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression: a cluster worker (the terminal is off there) with no platform token crashed
    with "Set of Tasks/Futures is empty" instead of saying what was missing."""
    config = without_terminal(write_config(tmp_path, ollama.url))
    code, _, err = await finish(await kaiwa("--config", str(config), "run", env=NO_TOKEN))
    assert code == NOTHING_TO_SERVE
    assert err.startswith("kaiwa: configuration error: no channel to serve: set a platform's")


async def test_no_channel_token_exits_with_its_own_code_naming_the_variables(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression (issue 33): a worker started with an empty .env exited 2 like any config
    error, so Docker Compose restarted it in a loop; its own exit status lets a service manager
    leave it stopped, and the line names the variables to set."""
    config = without_terminal(write_config(tmp_path, ollama.url))
    config.write_text(config.read_text() + "\n[channels.slack]\nenabled = false\n")

    code, _, err = await finish(await kaiwa("--config", str(config), "run", env=NO_TOKEN))

    assert code == NOTHING_TO_SERVE not in (1, 2)
    (line,) = err.splitlines()
    assert "$KAIWA_TELEGRAM_TOKEN ([channels.telegram].token_env)" in line
    assert "$KAIWA_DISCORD_TOKEN ([channels.discord].token_env)" in line
    assert "SLACK" not in line, "Slack is off: its variable is not missing"
    assert line.endswith("or keep [channels.terminal].enabled = true")


async def test_check_fails_when_no_channel_would_start(ollama: FakeOllama, tmp_path: Path) -> None:
    """Regression (issue 33): `kaiwa check` said "channels ready: none" and exited 0 where
    `kaiwa run` refuses to start, so it could not stand in front of the workers."""
    config = without_terminal(write_config(tmp_path, ollama.url))
    code, out, _ = await finish(await kaiwa("--config", str(config), "check", env=NO_TOKEN))
    assert code == 1
    assert out.splitlines()[-1].startswith(
        "problem: no channel to serve: set a platform's token variable: $KAIWA_TELEGRAM_TOKEN"
    )


async def test_an_unknown_critic_tool_is_a_configuration_error(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, ollama.url)
    config.write_text(config.read_text() + '\n[workflows.plan]\ncritic_tools = ["web"]\n')
    code, _, err = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 2
    assert err.startswith("kaiwa: configuration error: workflows.plan.critic_tools: unknown tool")
    assert "'web'" in err and "fetch_url" in err


def with_fake_mcp_server(config: Path, table: str = "") -> Path:
    """`config` with the fake MCP server as `[mcp.fake]`, `table`'s lines added to its table."""
    config.write_text(
        config.read_text()
        + f'\n[mcp.fake]\ncommand = "{sys.executable}"\n'
        + 'args = ["-m", "tests.fakes.mcp_server", "stdio"]\n'
        + table
    )
    return config


async def test_check_lists_each_mcp_server_with_its_tools_and_the_variables_it_gets(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """The names of the variables a server starts with are listed, never their values."""
    table = 'env = { LOG_LEVEL = "debug" }\nenv_from = ["TICKETS_TOKEN"]\n'
    config = with_fake_mcp_server(write_config(tmp_path, ollama.url), table)
    process = await kaiwa("--config", str(config), "check", env={"TICKETS_TOKEN": "t-42"})
    code, out, _ = await finish(process)
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("mcp: fake: ")]
    tools, _, variables = line.partition("; gets the variables ")
    assert tools == f"mcp: fake: 11 tools ({MCP_TOOLS})"
    assert {"LOG_LEVEL", "TICKETS_TOKEN", "PATH"} <= set(variables.split(", "))
    assert "t-42" not in out and "debug" not in out


async def test_check_names_a_variable_env_from_wants_that_is_not_set(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    config = with_fake_mcp_server(
        write_config(tmp_path, ollama.url), 'env_from = ["TICKETS_TOKEN"]\n'
    )
    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 1
    assert (
        "problem: [mcp.fake].env_from names TICKETS_TOKEN, which is not set in Kaiwa's "
        "environment, so the server starts without it: export TICKETS_TOKEN before starting "
        "Kaiwa, or take it out of env_from\n"
    ) in out


async def test_an_mcp_server_kaiwa_starts_sees_none_of_the_operators_variables(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression (issue 33): the real process handed every stdio MCP server its whole
    environment. The fake server's `environment` tool returns what it was given, and the
    model's next request carries that result."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            "[agents.assistant]\n", '[agents.assistant]\ntools = ["fake.environment"]\n'
        )
    )
    with_fake_mcp_server(config, 'env_from = ["TICKETS_TOKEN"]\n')
    ollama.script(ToolCall("fake.environment", {}))
    ollama.script(Text("It has what it needs."))
    operator = {
        "KAIWA_SLACK_SIGNING_SECRET": "slack-secret",
        "OPERATOR_PASSWORD": "hunter2",
        "TICKETS_TOKEN": "t-42",
    }
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE, env=operator)
    assert process.stdin is not None
    await read_until(process, READY)
    process.stdin.write(b"what does the server see?\n")
    await read_until(process, "It has what it needs.")
    process.stdin.close()
    code, _, err = await finish(process)

    assert code == 0, err
    (result,) = [m for m in ollama.requests[1]["messages"] if m["role"] == "tool"]
    seen = json.loads(result["content"])
    assert seen["TICKETS_TOKEN"] == "t-42" and "PATH" in seen
    assert not {"KAIWA_SLACK_SIGNING_SECRET", "OPERATOR_PASSWORD", "KAIWA_CONFIG"} & set(seen)
    assert not [name for name in seen if name.startswith(("KAIWA_", "PYTEST", "VIRTUAL_ENV"))]


async def test_check_fails_naming_each_mcp_server_that_cannot_start_and_why(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression (issue 26): `kaiwa check` exited 0 while a configured MCP server could not
    start. A stdio server that exits as it starts is known by its last line on stderr."""
    config = write_config(tmp_path, ollama.url)
    exits = "import sys; sys.exit('no API key: set FAKE_KEY')"
    config.write_text(
        config.read_text()
        + f'\n[mcp.fake]\ncommand = "{sys.executable}"\n'
        + 'args = ["-m", "tests.fakes.mcp_server", "stdio"]\n'
        + '\n[mcp.gone]\ncommand = "/nonexistent/mcp-server"\n'
        + f'\n[mcp.keyless]\ncommand = "{sys.executable}"\nargs = ["-c", "{exits}"]\n'
    )
    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 1
    fix = "and args (run the command by hand to see its error)"
    assert out == all_fine(ollama) + (
        f"{MCP_LINE}\n"
        f"mcp: gone: gets the variables {BASICS}\n"
        f"mcp: keyless: gets the variables {BASICS}\n"
        "problem: MCP server gone does not start: FileNotFoundError: [Errno 2] No such file or "
        f"directory: '/nonexistent/mcp-server'; check [mcp.gone].command {fix}\n"
        "problem: MCP server keyless does not start: it exited: no API key: set FAKE_KEY; "
        f"check [mcp.keyless].command {fix}\n"
    )


async def test_check_shows_what_is_fine_beside_a_problem(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression (issue 33): with one problem, `kaiwa check` printed only the problem, hiding
    which MCP servers, tools and windows were fine."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text()
        + f'\n[mcp.fake]\ncommand = "{sys.executable}"\n'
        + 'args = ["-m", "tests.fakes.mcp_server", "stdio"]\n'
        + '\n[mcp.gone]\ncommand = "/nonexistent/mcp-server"\n'
    )

    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))

    assert code == 1
    *fine, problem = out.splitlines()
    assert fine[:2] == [
        f"ok: Ollama at {ollama.url} is reachable and has test-model",
        "ok: channels ready: terminal",
    ]
    assert fine[2].startswith("context window: assistant: 16,384 tokens")
    assert fine[3:] == [
        "tasks: no scheduled task",
        VOICE_OFF,
        MCP_LINE,
        f"mcp: gone: gets the variables {BASICS}",
    ]
    assert problem.startswith("problem: MCP server gone does not start: FileNotFoundError")


async def test_check_warns_when_the_tools_schemas_crowd_a_small_window(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Regression: at 2,048 tokens the default tools' schemas alone took about half the window,
    and nothing said so."""
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            'model = "test-model"', 'model = "test-model"\ncontext_window = 2048'
        )
    )
    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))

    assert code == 0, "a warning fails nothing"
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert "warning: assistant: its tools' schemas take about " in warning
    assert "of its 2,048-token window, before any message; offer fewer (without " in warning
    assert "schedule_task" in warning and "raise [agents.assistant].context_window" in warning


async def test_check_says_whether_the_transcription_server_answers_with_its_model(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, ollama.url)
    async with FakeTranscription(models=["small-en"]) as server:
        with config.open("a") as more:
            more.write(f'\n[transcription]\nurl = "{server.url}"\nmodel = "small-en"\n')
        code, out, _ = await finish(await kaiwa("--config", str(config), "check"))
    assert code == 0, out
    assert f"ok: the transcription server at {server.url} has small-en\n" in out

    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))  # now it is gone
    assert code == 1
    (problem,) = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert server.url in problem and "[transcription].url" in problem


def with_routing(config: Path, small: str, medium: str, large: str) -> Path:
    tiers = f'small = "{small}"\nmedium = "{medium}"\nlarge = "{large}"\n'
    config.write_text(config.read_text() + f"\n[subagents.routing]\nenabled = true\n{tiers}")
    return config


async def test_check_names_each_unusable_routing_tier(ollama: FakeOllama, tmp_path: Path) -> None:
    """Issue 37: an empty tier stopped the start, while a tier naming a model Ollama lacks, or
    one shared by two tiers, went unnoticed until a run failed on it."""
    config = with_routing(write_config(tmp_path, ollama.url), "", "gone-m", "gone-m")

    code, out, _ = await finish(await kaiwa("--config", str(config), "check"))

    assert code == 1
    assert out == all_fine(ollama) + (
        "problem: [subagents.routing].small is empty: name a model, or set enabled = false\n"
        "problem: [subagents.routing].medium names gone-m, which Ollama does not have: run "
        "`ollama pull gone-m`\n"
        "problem: [subagents.routing].medium and large both name gone-m: give each tier its "
        "own model\n"
    )


async def test_run_with_a_missing_tier_warns_once_and_sub_agents_use_their_profiles_model(
    ollama: FakeOllama, tmp_path: Path
) -> None:
    """Issue 37: routing with a tier naming a model Ollama does not have would send a run to a
    model that 404s; Kaiwa starts with routing off instead, and says so once."""
    ollama.models += ["m-medium", "m-large"]
    config = with_routing(write_config(tmp_path, ollama.url), "gone-m", "m-medium", "m-large")
    dates = {
        "profile": "general",
        "instruction": "extract the dates",
        "kind": "extract",
        "criteria": "each date as YYYY-MM-DD",
    }
    ollama.script(ToolCall("delegate", {"tasks": [dates]}))
    ollama.script(Text("A helper is on it."))
    ollama.script_for("extract the dates", Pause("dates"), ToolCall("report", {"summary": "May 1"}))
    ollama.script(Text("The date is May 1."))
    process = await kaiwa("--config", str(config), stdin=asyncio.subprocess.PIPE)
    assert process.stdin is not None

    await read_until(process, READY)
    process.stdin.write(b"when is it?\n")
    await ollama.reached("dates")
    (held,) = [r for r in ollama.requests if "extract the dates" in r["messages"][1]["content"]]
    ollama.release("dates")
    await read_until(process, "The date is May 1.")
    process.stdin.close()
    code, _, err = await finish(process)

    assert code == 0, err
    assert held["model"] == "test-model", "the profile's own model, not a tier's"
    warning = (
        "sub-agent routing is off, each sub-agent runs its profile's model: "
        "[subagents.routing].small names gone-m, which Ollama does not have: run "
        "`ollama pull gone-m`"
    )
    assert (tmp_path / "state" / "kaiwa.log").read_text().count(warning) == 1
    assert err.count(warning) == 1
