"""A real `kaiwa` process killed with SIGKILL at chosen moments, then started again, on SQLite
and on PostgreSQL: what the person sees after each restart is said once, in their own terms, and
the conversation goes on with a request the model can take.

The platform is the fake Telegram (the real python-telegram-bot in the process talks to it);
the model is the fake Ollama. Nothing is timed: each step waits on what the fakes saw, on a row
of the database, or on a line of the process's log.
"""

import asyncio
import signal
from pathlib import Path

from tests.fakes.ollama import FakeOllama, Pause, Text, ToolCall
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.processes import WAIT_SECONDS, finish, ids, kaiwa, reply_recorded, stored, write_config

ANN = 4242
RESEND = "Please send it again."


async def logged(tmp_path: Path, phrase: str) -> None:
    """Wait until the process's log file holds `phrase` (read again every 20 ms)."""
    log = tmp_path / "state" / "kaiwa.log"
    async with asyncio.timeout(WAIT_SECONDS):
        while not (log.exists() and phrase in log.read_text()):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def visible(telegram: FakeTelegram) -> list[str]:
    return [message.visible for message in telegram.sent(ANN)]


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
            WAIT_SECONDS,
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
            WAIT_SECONDS,
            what="the reply marked interrupted",
        )
        telegram.user_message(ANN, "go on", user_id=ANN)
        await telegram.wait_until(
            lambda: len(telegram.sent(ANN)) == 2 and telegram.sent(ANN)[1].visible != "",
            WAIT_SECONDS,
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


async def test_a_please_send_it_again_notice_is_not_repeated_at_every_later_start(
    ollama: FakeOllama, tmp_path: Path, database_url: str
) -> None:
    """The bug: the turn stayed `unsure` after its notice, so each later start (or worker taking
    the place over) found it again and asked the person once more."""
    env = {"KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_DATABASE_URL": database_url}
    async with FakeTelegram() as telegram:
        config = telegram_config(tmp_path, ollama, telegram)
        ollama.script(Text("Half an answer"), Pause("forever"), Text(" never sent"))
        telegram.holds.hold("sendmessage", lambda params: lambda: False)
        first = await kaiwa("--config", str(config), "run", env=env)
        telegram.user_message(ANN, "tell me everything", user_id=ANN)
        await telegram.wait_until(
            lambda: telegram.holds.in_flight("sendmessage") > 0,
            WAIT_SECONDS,
            what="the reply's first post on its way, its id not back",
        )
        first.send_signal(signal.SIGKILL)
        await first.wait()
        telegram.holds.release("sendmessage")

        second = await kaiwa("--config", str(config), "run", env=env)
        await telegram.wait_until(
            lambda: any(RESEND in each for each in visible(telegram)),
            WAIT_SECONDS,
            what="the person asked to send it again",
        )
        second.send_signal(signal.SIGTERM)
        assert (await finish(second))[0] == 0
        third = await kaiwa("--config", str(config), "run", env=env)
        ollama.script(Text("Here is everything."))
        telegram.user_message(ANN, "tell me everything", user_id=ANN)
        await telegram.wait_until(
            lambda: "Here is everything." in visible(telegram),
            WAIT_SECONDS,
            what="the message sent again, answered",
        )
        third.send_signal(signal.SIGTERM)
        code, _, err = await finish(third)

    assert code == 0, err
    asked = [each for each in visible(telegram) if RESEND in each]
    assert asked == [
        "I was restarted before I could finish answering “tell me everything”. " + RESEND
    ]
    await stored(
        database_url,
        "SELECT delivery FROM turns ORDER BY id",
        lambda rows: [r[0] for r in rows] == ["stale", "shown"],
    )


async def test_a_kill_after_the_answer_was_posted_shows_it_rather_than_asking_again(
    ollama: FakeOllama, tmp_path: Path, database_url: str
) -> None:
    """The bug: a post's id was stored only with the final delivery mark, after the last edit,
    so a kill once the whole answer was out asked the person to send their message again. Now
    each id is stored as the platform returns it: the restart finds both posts and ends the
    reply on them. The last edit is held back by a typing request the fake never answers."""
    env = {"KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_DATABASE_URL": database_url}
    answer = " ".join(f"word{n}" for n in range(900))  # past Telegram's 4096: two messages
    async with FakeTelegram() as telegram:
        config = telegram_config(tmp_path, ollama, telegram)
        ollama.script(Text(answer))
        telegram.holds.hold("sendchataction", lambda params: lambda: False)
        first = await kaiwa("--config", str(config), "run", env=env)
        telegram.user_message(ANN, "tell me everything", user_id=ANN)
        await stored(
            database_url,
            "SELECT status, delivery, reply_ids FROM turns",
            lambda rows: [(r[0], r[1], len(ids(r[2]))) for r in rows] == [("done", "pending", 2)],
        )
        first.send_signal(signal.SIGKILL)
        await first.wait()
        telegram.holds.release("sendchataction")

        second = await kaiwa("--config", str(config), "run", env=env)
        await logged(tmp_path, "its ending is shown now")
        second.send_signal(signal.SIGTERM)
        code, _, err = await finish(second)

    assert code == 0, err
    assert " ".join(visible(telegram)).split() == answer.split()
    assert not any(RESEND in each for each in visible(telegram))


def delegating_config(tmp_path: Path, ollama: FakeOllama, telegram: FakeTelegram) -> Path:
    config = telegram_config(tmp_path, ollama, telegram)
    config.write_text(
        config.read_text().replace(
            "[agents.assistant]\n", '[agents.assistant]\ndelegates_to = ["helper"]\n'
        )
        + '\n[agents.helper]\nmodel = "test-model"\ndescription = "Looks one thing up."\n'
        + "\n[subagents]\nstatus_message = false\n"
    )
    return config


async def test_a_report_turn_cut_by_a_kill_is_carried_again_without_quoting_it_as_the_person(
    ollama: FakeOllama, tmp_path: Path, database_url: str
) -> None:
    """The bug: recovery asked the person to send again “[Sub-agent report] …”, a message they
    never wrote, while the report was carried again anyway."""
    env = {"KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_DATABASE_URL": database_url}
    task = {"profile": "helper", "instruction": "find the xrays"}
    async with FakeTelegram() as telegram:
        config = delegating_config(tmp_path, ollama, telegram)
        ollama.script(ToolCall("delegate", {"tasks": [task]}))
        ollama.script(Text("A helper is on it."))
        ollama.script_for("xrays", ToolCall("report", {"summary": "Three xrays."}))
        ollama.script(Text("Reading the report"), Pause("report turn"), Text(" never sent"))
        first = await kaiwa("--config", str(config), "run", env=env)
        telegram.user_message(ANN, "ask a helper", user_id=ANN)
        await ollama.reached("report turn")
        await stored(
            database_url,
            "SELECT provenance FROM turns WHERE status = 'running'",
            lambda rows: [r[0] for r in rows] == ["subagent"],
        )
        first.send_signal(signal.SIGKILL)
        await first.wait()

        ollama.script(Text("The helper found three xrays."))
        second = await kaiwa("--config", str(config), "run", env=env)
        await telegram.wait_until(
            lambda: "The helper found three xrays." in visible(telegram),
            WAIT_SECONDS,
            what="the report carried again",
        )
        second.send_signal(signal.SIGTERM)
        code, _, err = await finish(second)

    assert code == 0, err
    assert not any("Sub-agent report" in each or RESEND in each for each in visible(telegram))
    carried = ollama.requests[-1]["messages"][-1]["content"]
    assert carried.startswith("[Sub-agent report] find-the-xrays (a1, helper) reported:")
