"""A real `kaiwa` process whose SQLite file is on a disk that fills for a while, under two chats.

The platform is the fake Telegram (the real python-telegram-bot in the process talks to it), the
model the fake Ollama, the disk a tmpfs of 1 MiB (`tests.databases.SmallDisk`). Each step waits
on what the fakes saw or on what the process's /readyz and /metrics answer, never on time.
"""

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp

from bot.figures import Scrape, read
from tests.databases import SmallDisk
from tests.fakes.ollama import FakeOllama, Text
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.ports import free_port
from tests.processes import WAIT_SECONDS, finish, kaiwa, write_config

ANN, BOB = 4242, 4343
NOTICE = (
    "I cannot save messages right now: the server's disk is full. Your message will be "
    "answered when that is fixed; nothing is lost."
)


def config_for(tmp_path: Path, ollama: FakeOllama, telegram: FakeTelegram, port: int) -> Path:
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            "[channels.terminal]\n", "[channels.terminal]\nenabled = false\n"
        )
        + f"\n[metrics]\nenabled = true\nport = {port}\n"
        + "\n[channels.telegram]\n"
        + f'base_url = "{telegram.base_url}"\nbase_file_url = "{telegram.base_file_url}"\n'
        + f"allowed_users = [{ANN}, {BOB}]\npoll_timeout = 1\nedit_interval = 0.05\n"
    )
    return config


async def answered(url: str, holds: Callable[[int, str, Scrape], bool], what: str) -> None:
    """Ask /readyz and /metrics again (every 20 ms) until `holds` for their answers."""
    try:
        await asyncio.wait_for(_until(url, holds), WAIT_SECONDS)
    except TimeoutError:
        raise AssertionError(f"Kaiwa's /readyz and /metrics never showed {what}") from None


async def _until(url: str, holds: Callable[[int, str, Scrape], bool]) -> None:
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/readyz") as ready:
                    status, body = ready.status, await ready.text()
                async with session.get(f"{url}/metrics") as metrics:
                    scrape = read(await metrics.text())
            except aiohttp.ClientError:  # not serving yet
                status, body, scrape = 0, "", Scrape()
            if holds(status, body, scrape):
                return
            await asyncio.sleep(0.02)  # another process: nothing to wake us by


async def test_a_full_disk_under_two_chats_tells_each_once_and_answers_each_once_after(
    ollama: FakeOllama, tmp_path: Path, small_disk: SmallDisk
) -> None:
    """Issue 38: while the disk was full nobody heard anything for hours. Now each chat is told
    once, /readyz says why meanwhile, and every message is answered once when space is back."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "KAIWA_TELEGRAM_TOKEN": BOT_TOKEN,
        "KAIWA_DATABASE_URL": f"sqlite:///{small_disk.root}/kaiwa.db",
    }
    async with FakeTelegram() as telegram:
        config = config_for(tmp_path, ollama, telegram, port)
        process = await kaiwa("--config", str(config), "run", env=env)
        await answered(url, lambda status, _, __: status == 200, "ready")

        small_disk.fill()
        telegram.user_message(ANN, "are you there?", user_id=ANN)
        telegram.user_message(BOB, "hello?", user_id=BOB)
        await answered(
            url,
            lambda status, body, scrape: (
                status == 503
                and "the database refuses writes since" in body
                and scrape.total("kaiwa_store_refused_writes_total", cause="disk_full") >= 6
            ),
            "several redeliveries refused",
        )
        assert [m.visible for m in telegram.sent(ANN)] == [NOTICE]
        assert [m.visible for m in telegram.sent(BOB)] == [NOTICE]
        assert ollama.requests == []

        ollama.script(Text("Yes, here."))
        ollama.script(Text("Yes, here."))
        small_disk.empty()
        await telegram.wait_until(
            lambda: all(len(telegram.sent(chat)) == 2 for chat in (ANN, BOB)),
            WAIT_SECONDS,
            what="both answered",
        )
        await answered(url, lambda status, _, __: status == 200, "ready again")
        process.terminate()
        code, _, err = await finish(process)

    assert code == 0, err
    for chat in (ANN, BOB):
        assert [m.visible for m in telegram.sent(chat)] == [NOTICE, "Yes, here."]
    assert len(ollama.requests) == 2
    log = (tmp_path / "state" / "kaiwa.log").read_text()
    assert log.count("the database refuses writes (the server's disk is full)") == 1
    assert log.count("the database takes writes again after") == 1
