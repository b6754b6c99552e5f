"""A real `kaiwa` process killed with SIGKILL mid-reply, then started again, on SQLite and on
PostgreSQL: the person's reply is marked interrupted where it stands, and the conversation goes
on with a request the model can take.

The platform is the fake Telegram (the real python-telegram-bot in the process talks to it);
the model is the fake Ollama. Nothing is timed: each step waits on what the fakes saw.
"""

import asyncio
import signal
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.fakes.ollama import FakeOllama, Pause, Text
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.processes import WAIT_SECONDS, finish, kaiwa, write_config

ANN = 4242


async def reply_recorded(url: str) -> None:
    """Wait until the store holds the id of the message the reply posted (it is written just
    after the platform accepted the message; a kill before that leaves nothing to mark)."""
    engine = create_engine(url)

    def recorded() -> bool:
        with engine.connect() as connection:
            ids = connection.execute(text("SELECT reply_ids FROM turns")).scalars().all()
        return any(ids)

    try:
        async with asyncio.timeout(WAIT_SECONDS):
            while not await asyncio.to_thread(recorded):  # noqa: ASYNC110  (another process's
                await asyncio.sleep(0.02)  # database: there is nothing to be woken by)
    finally:
        engine.dispose()


def telegram_config(tmp_path: Path, ollama: FakeOllama, telegram: FakeTelegram) -> Path:
    config = write_config(tmp_path, ollama.url)
    config.write_text(
        config.read_text().replace(
            "[channels.terminal]\n", "[channels.terminal]\nenabled = false\n"
        )
        + "\n[channels.telegram]\n"
        + f'base_url = "{telegram.base_url}"\nbase_file_url = "{telegram.base_file_url}"\n'
        + f"allowed_users = [{ANN}]\npoll_timeout = 1\nedit_interval = 0.05\n"
    )
    return config


async def test_a_reply_cut_by_sigkill_is_marked_interrupted_after_the_restart(
    ollama: FakeOllama, tmp_path: Path, database_url: str
) -> None:
    env = {"KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_DATABASE_URL": database_url}
    async with FakeTelegram() as telegram:
        config = telegram_config(tmp_path, ollama, telegram)
        ollama.script(Text("Half an answer"), Pause("forever"), Text(" never sent"))
        first = await kaiwa("--config", str(config), "run", env=env)
        telegram.user_message(ANN, "tell me everything", user_id=ANN)
        await telegram.wait_until(
            lambda: [m.visible for m in telegram.sent(ANN)] == ["Half an answer"],
            what="the reply streaming",
        )
        await reply_recorded(database_url)
        first.send_signal(signal.SIGKILL)
        await first.wait()

        ollama.script(Text("Where were we?"))
        second = await kaiwa("--config", str(config), "run", env=env)
        await telegram.wait_until(
            lambda: (
                [m.visible for m in telegram.sent(ANN)]
                == ["Half an answer (interrupted by a restart)"]
            ),
            what="the reply marked interrupted",
        )
        telegram.user_message(ANN, "go on", user_id=ANN)
        await telegram.wait_until(
            lambda: len(telegram.sent(ANN)) == 2 and telegram.sent(ANN)[1].visible != "",
            what="the next reply",
        )
        second.send_signal(signal.SIGTERM)
        code, _, err = await finish(second)

    assert code == 0, err
    sent = [(m["role"], m["content"]) for m in ollama.requests[-1]["messages"][1:]]
    assert sent == [
        ("user", "tell me everything"),
        ("assistant", "Half an answer\n\n[This reply was cut off here: Kaiwa restarted.]"),
        ("user", "go on"),
    ]
    assert [m.visible for m in telegram.sent(ANN)][1] == "Where were we?"
