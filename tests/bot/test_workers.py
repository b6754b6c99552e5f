"""Three real `kaiwa` workers on one PostgreSQL database (a database of their own), with the
fake Telegram (long polling: one worker holds it) and the fake Slack in HTTP Events mode (every
worker serves it; the test is the load balancer, and skips a worker that does not answer).
300 messages across 50 conversations; the worker holding Telegram is killed with SIGKILL half-way.

Nothing is timed: each step waits on what the fakes or the database show, within generous
deadlines (the failover setting is 3 s here).
"""

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.cluster.leases import ClusterSettings, cluster_view, conninfo
from core.features.schedule.timing import ScheduleSettings, When
from core.store import Store
from core.store.tables import utc_now
from tests.databases import postgres_database
from tests.fakes.ollama import ChunkDelay, FakeOllama, Pause, Text
from tests.fakes.patience import scaled
from tests.fakes.slack import BOT_TOKEN as SLACK_TOKEN
from tests.fakes.slack import SIGNING_SECRET, TEAM, FakeSlack
from tests.fakes.telegram import BOT_TOKEN as TELEGRAM_TOKEN
from tests.fakes.telegram import FakeTelegram
from tests.ports import free_port
from tests.processes import kaiwa

pytestmark = pytest.mark.postgres
WORKERS = ("w1", "w2", "w3")
CHATS = 25  # Telegram chats, and as many Slack DMs: 50 conversations
ROUNDS = 6  # messages per conversation: 300 in all
FAILOVER = 3.0
RESTARTED = "I was restarted before I could finish answering"
"""The notice of a turn a dead worker left after it may have shown something (not an answer)."""
DEADLINE = scaled(60.0)  # three processes, a kill and a takeover
CUT = "(interrupted by a restart)"
TASK_CHAT = 999
FIRING_AFTER = 4.0


@dataclass
class Cluster:
    url: str
    name: str
    processes: dict[str, asyncio.subprocess.Process]
    events_urls: dict[str, str]

    async def view(self, *leases: str) -> tuple[list[str], dict[str, str]]:
        return await cluster_view(self.url, ClusterSettings(True, name=self.name), list(leases))

    def alive(self) -> list[str]:
        return [w for w, p in self.processes.items() if p.returncode is None]


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with postgres_database("kaiwa_workers", "the cluster tests") as url:
        yield url


def worker_config(
    tmp_path: Path,
    worker: str,
    name: str,
    port: int,
    ollama: FakeOllama,
    telegram: FakeTelegram,
    slack: FakeSlack,
) -> Path:
    path = tmp_path / f"{worker}.toml"
    path.write_text(
        f'[ollama]\nurl = "{ollama.url}"\nconnect_timeout = 2.0\nmax_concurrent_requests = 16\n'
        '[agents.assistant]\nmodel = "test-model"\n'
        f'[storage]\ndata_dir = "state-{worker}"\n'
        "[channels.terminal]\nenabled = false\n"
        f'[channels.telegram]\nbase_url = "{telegram.base_url}"\n'
        f'base_file_url = "{telegram.base_file_url}"\nanyone = true\npoll_timeout = 1\n'
        "edit_interval = 0.05\n"
        f'[channels.slack]\nmode = "http"\napi_url = "{slack.api_url}"\nhttp_port = {port}\n'
        "anyone = true\nedit_interval = 0.05\n"
        f'[cluster]\nenabled = true\nname = "{name}"\nworker_id = "{worker}"\n'
        f"failover_seconds = {FAILOVER}\n"
    )
    return path


async def wait_for(condition: Any, what: str) -> None:
    """Poll another process's work (nothing here can be woken by it) until `condition()`."""
    try:
        async with asyncio.timeout(DEADLINE):
            while not await condition():  # noqa: ASYNC110  (other processes' database)
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True) as c:
        cursor = await c.execute(sql)
        return await cursor.fetchall()


async def schedule_a_firing(url: str) -> None:
    """An hourly task in Telegram chat `TASK_CHAT` whose first slot comes a few seconds after
    the workers start (about when one is killed): every worker's scheduler has it."""
    store = await Store.open(url)
    try:
        now = utc_now()
        columns = When(every_minutes=60).columns("UTC", now, ScheduleSettings())
        await store.create_task(
            {
                "platform": "telegram",
                "place": f"telegram:{TASK_CHAT}",
                "agent": "assistant",
                "name": "hourly",
                "prompt": "say the hour",
                "timezone": "UTC",
                "misfire": "once",
                "enabled": True,
                "consecutive_failures": 0,
                "created_by": "",
                "created_at": now,
                **columns,
                "next_run": now + timedelta(seconds=FIRING_AFTER),
            }
        )
    finally:
        await store.close()


@pytest.fixture
async def cluster(
    database: str, tmp_path: Path, ollama: FakeOllama
) -> AsyncIterator[tuple[Cluster, FakeTelegram, FakeSlack]]:
    async with FakeTelegram() as telegram, FakeSlack() as slack:
        await schedule_a_firing(database)
        name = f"w{uuid.uuid4().hex[:8]}"
        env = {
            "KAIWA_DATABASE_URL": database,
            "KAIWA_TELEGRAM_TOKEN": TELEGRAM_TOKEN,
            "KAIWA_SLACK_BOT_TOKEN": SLACK_TOKEN,
            "KAIWA_SLACK_SIGNING_SECRET": SIGNING_SECRET,
        }
        processes, urls = {}, {}
        for worker in WORKERS:
            port = free_port()
            config = worker_config(tmp_path, worker, name, port, ollama, telegram, slack)
            processes[worker] = await kaiwa("--config", str(config), "run", env=env)
            urls[worker] = f"http://127.0.0.1:{port}/slack/events"
        running = Cluster(database, name, processes, urls)

        async def joined() -> bool:
            workers, holders = await running.view("channel:telegram")
            return len(workers) == 3 and "channel:telegram" in holders

        await wait_for(joined, "three workers, one holding Telegram")
        yield running, telegram, slack
        for process in processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            await process.wait()


async def post_to_any(cluster: Cluster, slack: FakeSlack, body: dict[str, Any], start: int) -> None:
    """What a load balancer does: the next worker, and the one after if it does not answer."""
    order = [*WORKERS[start % 3 :], *WORKERS[: start % 3]]
    for worker in order:
        if cluster.processes[worker].returncode is not None:
            continue
        try:
            status, _ = await slack.post_event(cluster.events_urls[worker], body)
        except OSError:
            continue
        if status == 200:
            return
    raise AssertionError("no worker took the Slack event")


def dm_event(slack: FakeSlack, channel: str, text: str, user: str, ts: str) -> dict[str, Any]:
    event = {
        "type": "message",
        "channel": channel,
        "channel_type": "im",
        "user": user,
        "text": text,
        "ts": ts,
        "team": TEAM,
    }
    return slack.event_body(event)


async def test_three_workers_answer_every_message_once_in_order_through_a_kill(
    cluster: tuple[Cluster, FakeTelegram, FakeSlack], ollama: FakeOllama
) -> None:
    running, telegram, slack = cluster
    ollama.default = [ChunkDelay(0.1), Text("a reply of a few words", chunks=4)]  # 0.4 s
    sent_ids: dict[int, list[int]] = {chat: [] for chat in range(1, CHATS + 1)}
    posted = 0

    async def send_round(round_number: int) -> None:
        nonlocal posted
        for chat in range(1, CHATS + 1):
            update = telegram.user_message(
                1000 + chat, f"message {round_number}", user_id=1000 + chat
            )
            sent_ids[chat].append(update["message"]["message_id"])
            ts = f"17000{round_number:02d}{chat:03d}.000100"
            body = dm_event(slack, f"D{chat}", f"message {round_number}", f"U{chat}", ts)
            await post_to_any(running, slack, body, posted)
            posted += 1

    for round_number in range(ROUNDS // 2):
        await send_round(round_number)
    victims: list[str] = []

    async def a_worker_runs_a_turn() -> bool:
        """The worker to kill: one running a turn now, the Telegram connection's if it does.
        Regression (of this test): it killed the Telegram connection's worker once any turn
        ran, and under load that turn could be on another worker, so the kill cut nothing."""
        places = await rows(
            running.url,
            "SELECT c.place FROM turns t JOIN conversations c ON c.id = t.conversation_id "
            "WHERE t.status = 'running'",
        )
        leases = [f"place:{place}" for (place,) in places]
        _, holders = await running.view("channel:telegram", *leases)
        busy = {holders[lease] for lease in leases if lease in holders}
        telegram_holder = holders.get("channel:telegram")
        victims.extend([telegram_holder] if telegram_holder in busy else sorted(busy)[:1])
        return bool(victims)

    await wait_for(a_worker_runs_a_turn, "a turn in flight")
    victim = victims[0]
    running.processes[victim].send_signal(signal.SIGKILL)
    await running.processes[victim].wait()

    async def moved() -> bool:
        _, now = await running.view("channel:telegram")
        return now.get("channel:telegram") not in (None, victim)

    await wait_for(moved, "the Telegram connection on another worker")
    for round_number in range(ROUNDS // 2, ROUNDS):
        await send_round(round_number)

    async def all_answered() -> bool:
        unanswered = await rows(
            running.url,
            "SELECT count(*) FROM inbound_events e WHERE e.status = 'turn' AND NOT EXISTS "
            "(SELECT 1 FROM turns t WHERE t.inbound_event_id = e.id AND t.status IN "
            "('done', 'interrupted'))",
        )
        live = await rows(running.url, "SELECT count(*) FROM turns WHERE status = 'running'")
        return unanswered[0][0] == 0 and live[0][0] == 0

    await wait_for(all_answered, "every message answered")

    def replied(chat: int) -> bool:
        telegram_chat = telegram.sent(1000 + chat)
        answers = [
            m for m in telegram_chat if m.reply_to is not None or m.visible.startswith(RESTARTED)
        ]
        return len(answers) >= ROUNDS and len(slack.posted(f"D{chat}")) >= ROUNDS

    async def all_shown() -> bool:
        """A turn is recorded done before its last text goes out, and that text may wait for
        the platform's budget (channels.budget). Regression (of this test): it read the fakes
        the moment the database said done, and missed a final text still on its way."""
        return all(replied(chat) for chat in range(1, CHATS + 1))

    await wait_for(all_shown, "every reply shown")
    told_again = 0

    for chat in range(1, CHATS + 1):  # a reply each, in order, never two; or a notice
        telegram_chat = telegram.sent(1000 + chat)
        replies = [m.reply_to for m in telegram_chat if m.reply_to is not None]
        notices = sum(m.visible.startswith(RESTARTED) for m in telegram_chat)
        assert replies == [m for m in sent_ids[chat] if m in replies], f"Telegram chat {chat}"
        assert ROUNDS - len(replies) <= notices, f"Telegram chat {chat}: a message unanswered"
        dm = [p.text for p in slack.posted(f"D{chat}")]
        dm_notices = sum(text.startswith(RESTARTED) for text in dm)
        assert len(dm) - dm_notices <= ROUNDS, f"Slack DM {chat}: a message answered twice"
        assert len(dm) >= ROUNDS, f"Slack DM {chat}: a message unanswered"
        told_again += notices + dm_notices
    doubled = await rows(
        running.url,
        "SELECT inbound_event_id FROM turns WHERE status = 'done' AND inbound_event_id IS NOT "
        "NULL GROUP BY inbound_event_id HAVING count(*) > 1",
    )
    assert doubled == []
    out_of_order = await rows(
        running.url,
        "SELECT a.id FROM turns a JOIN turns b ON a.conversation_id = b.conversation_id "
        "AND a.id < b.id AND a.inbound_event_id > b.inbound_event_id AND b.attempt = 1",
    )
    assert out_of_order == []

    async def fired() -> bool:
        found = await rows(running.url, "SELECT outcome FROM task_runs")
        return bool(found) and found[0][0] != "running"

    await wait_for(fired, "the scheduled firing")
    await telegram.wait_until(lambda: telegram.sent(TASK_CHAT), timeout=DEADLINE, what="its post")
    assert len(await rows(running.url, "SELECT id FROM task_runs")) == 1, "one slot, one run"
    posts = [m.visible for m in telegram.sent(TASK_CHAT)]
    cut = [post for post in posts if post.startswith("A scheduled run here was cut short")]
    assert len(posts) - len(cut) <= 1 and len(cut) <= 1, "its answer or that it was cut, once"
    cut = await rows(
        running.url,
        "SELECT count(*) FROM turns WHERE status = 'interrupted' OR attempt = 2 "
        "OR delivery = 'stale'",
    )
    assert cut[0][0] >= 1, "the killed worker's turns in flight are resolved in their place"
    assert told_again <= cut[0][0], "a notice only where a turn was cut"


async def test_stop_through_a_worker_that_does_not_own_the_turn_stops_it(
    cluster: tuple[Cluster, FakeTelegram, FakeSlack], ollama: FakeOllama
) -> None:
    running, _, slack = cluster
    ollama.script_for("a long job", Text("Working on it"), Pause("long"), Text(" never said"))
    place = f"slack:{TEAM}:D77:top"
    await post_to_any(running, slack, dm_event(slack, "D77", "a long job", "U77", "1.1"), 0)
    await slack.wait_until(
        lambda: [p.text for p in slack.posted("D77")] == ["Working on it"], what="the reply"
    )
    _, holders = await running.view(f"place:{place}")
    owner = holders[f"place:{place}"]
    other = next(worker for worker in WORKERS if worker != owner)

    status, _ = await slack.post_event(
        running.events_urls[other], dm_event(slack, "D77", "!stop", "U77", "1.2")
    )

    assert status == 200
    await slack.wait_until(
        lambda: "Working on it (stopped)" in [p.text for p in slack.posted("D77")],
        what="the reply stopped",
    )
    ollama.release("long")


async def test_a_dead_workers_places_are_taken_over_side_by_side_not_in_line(
    database: str, tmp_path: Path, ollama: FakeOllama
) -> None:
    """The bug: a sweep took a dead worker's places over one after the other, each waiting on
    the platform and the store, so under load its last conversations moved 10–36 s after the
    kill. Here the edit marking the first place's reply is held until the second place's reply
    is marked: taken over in line, the second would wait for the first, and the first's edit
    would go out only when the fake stops holding it (`tests.fakes.holds.HOLD_SECONDS`)."""
    first, second = 3001, 3002  # "telegram:3001" sorts first: a sweep in line starts there
    ollama.default = [Text("Working on it"), Pause("held")]
    async with FakeTelegram() as telegram, FakeSlack() as slack:
        name = f"w{uuid.uuid4().hex[:8]}"
        env = {
            "KAIWA_DATABASE_URL": database,
            "KAIWA_TELEGRAM_TOKEN": TELEGRAM_TOKEN,
            "KAIWA_SLACK_BOT_TOKEN": SLACK_TOKEN,
            "KAIWA_SLACK_SIGNING_SECRET": SIGNING_SECRET,
        }

        async def start(worker: str) -> asyncio.subprocess.Process:
            config = worker_config(tmp_path, worker, name, free_port(), ollama, telegram, slack)
            return await kaiwa("--config", str(config), "run", env=env)

        victim = await start("w1")
        for chat in (first, second):
            telegram.user_message(chat, "a long job", user_id=chat)

        async def posted() -> bool:
            try:
                found = await rows(database, "SELECT reply_ids FROM turns WHERE status = 'running'")
            except psycopg.errors.UndefinedTable:  # the worker has not made its tables yet
                return False
            return len(found) == 2 and all(reply_ids for (reply_ids,) in found)

        await wait_for(posted, "both replies posted, their ids stored")
        heir = await start("w2")

        async def joined() -> bool:
            workers, _ = await cluster_view(database, ClusterSettings(True, name=name), [])
            return workers == ["w1", "w2"]

        await wait_for(joined, "the second worker joined")

        def marked(chat: int) -> bool:
            return any(m.visible.endswith(CUT) for m in telegram.sent(chat))

        released: list[str] = []

        def after_the_second(params: Any) -> Any:
            if int(params["chat_id"]) != first:
                return lambda: True

            def ready() -> bool:
                if marked(second):
                    released.append("the second place was marked first")
                return bool(released)

            return ready

        telegram.holds.hold("editmessagetext", after_the_second)
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        await telegram.wait_until(
            lambda: marked(first) and marked(second), DEADLINE, what="both replies marked"
        )
        heir.send_signal(signal.SIGTERM)
        await heir.wait()

    assert released == ["the second place was marked first"]
