"""Several workers: replies per second and latency with 1, 2 and 3 workers, and failover times.

Real `kaiwa run` processes (`python -m bot`) on a PostgreSQL database of their own (created at
the start, dropped at the end; `KAIWA_BENCH_POSTGRES_URL`, default the local test server), with
the fake Telegram (long polling: one worker receives, every worker posts) and the fake Ollama,
both in this process. The fake streams `--chunks` chunks `--delay-ms` apart; each worker sends
at most `--per-worker` requests at once, as if each had an Ollama host of its own.

(1) Scale. For 1, 2 and 3 workers (a fresh database each): `--chats` chats send one message
each to warm up (each conversation gets its owner), then `--messages` messages each, all pushed
at once. A message's latency runs from its update being queued on the fake to its reply's final
text being visible there; throughput is replies / (last reply − first push). The baseline is one
worker, measured in the same run: the ratios are against it.

(2) Failover, `--kills` times with 3 workers: the worker holding Telegram is killed with
SIGKILL, and right after it a message goes to a chat that worker owned. "Connection back": kill
→ another worker holds the Telegram lease (what `kaiwa status` reads). "First reply": kill → the
reply to that message visible (a new owner took the chat, after a new poller fetched the
message). The killed worker is started again before the next kill. `[cluster].failover_seconds`
is `--failover`; target: connection back within it (max), first reply within it plus the
claim grace (`core.cluster.owners.CLAIM_GRACE_SECONDS`).

(3) Takeover, with 3 workers: `--waiting` chats that worker w1 is preferred for each get a
message whose reply is posted and then held (the model pauses), so w1 owns that many places with
a turn running; then w1 is killed with SIGKILL. A place is taken over when its reply shows
"(interrupted by a restart)", edited there by the worker that took it. The fake Telegram answers
each call `--api-ms` late, as a real round trip does. Figures: kill → the first, the median and
the last place taken over; target: the last within `--failover` + 5 s.

Run from the repository root:
    .venv/bin/python benchmarks/workers.py [--chats 30] [--messages 5] [--kills 10] [--waiting 50]
"""

import argparse
import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy.engine import make_url

from benchmarks._common import median, percentile, print_table, verdict
from core.cluster.leases import ClusterSettings, cluster_view, conninfo
from core.cluster.owners import CLAIM_GRACE_SECONDS, preferred
from tests.fakes.ollama import ChunkDelay, FakeOllama, Pause, Text
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram

REPLY = "a reply of a few words from the model"
CUT = "(interrupted by a restart)"
FIRST_CHAT = 5000
WAIT = 120.0


class Workers:
    """`count` worker processes on one database, and what is needed to read and kill them."""

    def __init__(
        self, url: str, folder: Path, ollama: FakeOllama, telegram: FakeTelegram, args: Any
    ) -> None:
        self.url = url
        self.name = f"b{uuid.uuid4().hex[:8]}"
        self._folder = folder
        self._ollama = ollama
        self._telegram = telegram
        self._args = args
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    def _config(self, worker: str) -> Path:
        path = self._folder / f"{worker}.toml"
        path.write_text(
            f'[ollama]\nurl = "{self._ollama.url}"\n'
            f"max_concurrent_requests = {self._args.per_worker}\n"
            '[agents.assistant]\nmodel = "test-model"\n'
            f'[storage]\ndata_dir = "{self._folder / worker}"\n'
            '[logging]\nlevel = "WARNING"\n'
            "[channels.terminal]\nenabled = false\n"
            f'[channels.telegram]\nbase_url = "{self._telegram.base_url}"\n'
            f'base_file_url = "{self._telegram.base_file_url}"\nanyone = true\n'
            "poll_timeout = 1\nedit_interval = 0.2\n"
            f'[cluster]\nenabled = true\nname = "{self.name}"\nworker_id = "{worker}"\n'
            f"failover_seconds = {self._args.failover}\n"
        )
        return path

    async def start(self, worker: str) -> None:
        env = {
            **os.environ,
            "KAIWA_CONFIG": "",
            "KAIWA_DATABASE_URL": self.url,
            "KAIWA_TELEGRAM_TOKEN": BOT_TOKEN,
        }
        self.processes[worker] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "--config",
            str(self._config(worker)),
            "run",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )

    async def view(self, *leases: str) -> tuple[list[str], dict[str, str]]:
        return await cluster_view(self.url, ClusterSettings(True, name=self.name), list(leases))

    async def joined(self, count: int) -> None:
        async def ready() -> bool:
            workers, holders = await self.view("channel:telegram")
            return len(workers) == count and "channel:telegram" in holders

        await until(ready, f"{count} workers joined")

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            await process.wait()


async def until(condition: Callable[[], Any], what: str) -> None:
    """Poll other processes' state (nothing here is woken by it)."""
    async with asyncio.timeout(WAIT):
        while not await condition():  # noqa: ASYNC110  (other processes: nothing to wait on)
            await asyncio.sleep(0.01)


@asynccontextmanager
async def database() -> AsyncIterator[str]:
    base = os.environ.get(
        "KAIWA_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    name = f"kaiwa_bench_{uuid.uuid4().hex[:8]}"
    admin = conninfo(base)
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as connection:
        await connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as connection:
            await connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


class Replies:
    """When each message's reply became visible in full on the fake Telegram."""

    def __init__(self, telegram: FakeTelegram) -> None:
        self._telegram = telegram
        self.pushed: dict[tuple[int, int], float] = {}
        self.answered: dict[tuple[int, int], float] = {}

    def push(self, chat: int, text: str) -> tuple[int, int]:
        update = self._telegram.user_message(chat, text, user_id=chat)
        key = (chat, update["message"]["message_id"])
        self.pushed[key] = time.monotonic()
        return key

    def _seen(self) -> bool:
        now = time.monotonic()
        for chat in {chat for chat, _ in self.pushed}:
            for message in self._telegram.sent(chat):
                key = (chat, message.reply_to or 0)
                if key in self.pushed and key not in self.answered and message.visible == REPLY:
                    self.answered[key] = now
        return len(self.answered) >= len(self.pushed)

    async def all_answered(self) -> None:
        await self._telegram.wait_until(self._seen, timeout=WAIT, what="every reply")

    async def answered_to(self, key: tuple[int, int]) -> float:
        await self._telegram.wait_until(
            lambda: self._seen() or key in self.answered, timeout=WAIT, what="the reply"
        )
        return self.answered[key]


async def scale(count: int, args: Any, ollama: FakeOllama, folder: Path) -> dict[str, float]:
    async with database() as url, FakeTelegram() as telegram:
        workers = Workers(url, folder / f"scale{count}", ollama, telegram, args)
        (folder / f"scale{count}").mkdir()
        for index in range(1, count + 1):
            await workers.start(f"w{index}")
        try:
            await workers.joined(count)
            chats = range(FIRST_CHAT, FIRST_CHAT + args.chats)
            warm = Replies(telegram)
            for chat in chats:
                warm.push(chat, "warm up")
            await warm.all_answered()
            measured = Replies(telegram)
            started = time.monotonic()
            for round_number in range(args.messages):
                for chat in chats:
                    measured.push(chat, f"message {round_number}")
            await measured.all_answered()
            finished = max(measured.answered.values())
        finally:
            await workers.stop()
    latencies = [measured.answered[key] - measured.pushed[key] for key in measured.pushed]
    return {
        "rate": len(latencies) / (finished - started),
        "median": median(latencies),
        "p99": percentile(latencies, 99),
    }


async def failover(args: Any, ollama: FakeOllama, folder: Path) -> tuple[list[float], list[float]]:
    back, first = [], []
    async with database() as url, FakeTelegram() as telegram:
        (folder / "failover").mkdir()
        workers = Workers(url, folder / "failover", ollama, telegram, args)
        for index in (1, 2, 3):
            await workers.start(f"w{index}")
        try:
            await workers.joined(3)
            chats = list(range(FIRST_CHAT, FIRST_CHAT + 30))
            warm = Replies(telegram)
            for chat in chats:
                warm.push(chat, "warm up")
            await warm.all_answered()
            for _ in range(args.kills):
                leases = [f"place:telegram:{chat}" for chat in chats]
                _, holders = await workers.view("channel:telegram", *leases)
                victim = holders["channel:telegram"]
                owned = [c for c in chats if holders.get(f"place:telegram:{c}") == victim]
                probe = Replies(telegram)
                killed = time.monotonic()
                workers.processes[victim].send_signal(signal.SIGKILL)
                await workers.processes[victim].wait()
                key = probe.push(owned[0] if owned else chats[0], "after the kill")

                async def moved(victim: str = victim) -> bool:
                    _, now = await workers.view("channel:telegram")
                    return now.get("channel:telegram") not in (None, victim)

                await until(moved, "the Telegram connection moved")
                back.append(time.monotonic() - killed)
                first.append(await probe.answered_to(key) - killed)
                await workers.start(victim)
                await workers.joined(3)
        finally:
            await workers.stop()
    return back, first


async def takeover(args: Any, ollama: FakeOllama, folder: Path) -> list[float]:
    """Seconds from the kill of w1 to each of its waiting places taken over."""
    chats = preferred_chats("w1", ["w1", "w2", "w3"], args.waiting)
    for _ in chats:
        ollama.script_for("a long job", Text("Working on it"), Pause("held"))
    async with database() as url, FakeTelegram() as telegram:
        telegram.answer_after(args.api_ms / 1000)
        (folder / "takeover").mkdir()
        workers = Workers(url, folder / "takeover", ollama, telegram, args)
        for index in (1, 2, 3):
            await workers.start(f"w{index}")
        try:
            await workers.joined(3)
            for chat in chats:
                telegram.user_message(chat, "a long job", user_id=chat)

            async def all_posted() -> bool:
                async with await psycopg.AsyncConnection.connect(conninfo(url)) as connection:
                    cursor = await connection.execute(
                        "SELECT reply_ids FROM turns WHERE status = 'running'"
                    )
                    found = await cursor.fetchall()
                return len(found) == len(chats) and all(ids for (ids,) in found)

            await until(all_posted, f"{len(chats)} replies posted and held")
            killed = time.monotonic()
            workers.processes["w1"].send_signal(signal.SIGKILL)
            await workers.processes["w1"].wait()
            moved: dict[int, float] = {}

            def taken_over() -> bool:
                for chat in chats:
                    shown = [m.visible for m in telegram.sent(chat)]
                    if chat not in moved and any(text.endswith(CUT) for text in shown):
                        moved[chat] = time.monotonic() - killed
                return len(moved) == len(chats)

            await telegram.wait_until(taken_over, timeout=WAIT, what="every place taken over")
        finally:
            ollama.release("held")
            await workers.stop()
    return sorted(moved.values())


def preferred_chats(worker: str, workers: list[str], count: int) -> list[int]:
    """`count` Telegram chats whose conversations `worker` is preferred for."""
    chats, chat = [], FIRST_CHAT + 1000
    while len(chats) < count:
        if preferred(f"telegram:{chat}", workers) == worker:
            chats.append(chat)
        chat += 1
    return chats


async def main(args: Any) -> None:
    steps = [ChunkDelay(args.delay_ms / 1000), Text(REPLY, args.chunks)]
    async with FakeOllama() as ollama:
        ollama.default = steps
        with TemporaryDirectory() as temporary:
            folder = Path(temporary)
            figures = {count: await scale(count, args, ollama, folder) for count in (1, 2, 3)}
            back, first = await failover(args, ollama, folder) if args.kills else ([], [])
            moved = await takeover(args, ollama, folder) if args.waiting else []
    base = figures[1]
    print_table(
        f"Scale: {args.chats} chats × {args.messages} messages, {args.chunks} chunks "
        f"{args.delay_ms:g} ms apart, {args.per_worker} requests at once per worker",
        ["workers", "replies/s", "× 1 worker", "median ms", "p99 ms"],
        [
            [
                count,
                f"{f['rate']:.1f}",
                f"{f['rate'] / base['rate']:.2f}×",
                f"{f['median'] * 1000:.0f}",
                f"{f['p99'] * 1000:.0f}",
            ]
            for count, f in figures.items()
        ],
    )
    if back:
        print_table(
            f"Failover over {len(back)} kills (failover_seconds = {args.failover:g})",
            ["", "median s", "max s", "target s", "verdict"],
            [
                [
                    "kill → connection back",
                    f"{median(back):.2f}",
                    f"{max(back):.2f}",
                    f"{args.failover:g}",
                    verdict(max(back), args.failover),
                ],
                [
                    "kill → first reply",
                    f"{median(first):.2f}",
                    f"{max(first):.2f}",
                    f"{args.failover + CLAIM_GRACE_SECONDS:g}",
                    verdict(max(first), args.failover + CLAIM_GRACE_SECONDS),
                ],
            ],
        )

    if moved:
        target = args.failover + 5
        print_table(
            f"Takeover of {len(moved)} places waiting on a killed worker "
            f"(failover_seconds = {args.failover:g}, Telegram answering in {args.api_ms:g} ms)",
            ["kill → place taken over", "first s", "median s", "last s", "target s", "verdict"],
            [
                [
                    f"{len(moved)} places",
                    f"{moved[0]:.2f}",
                    f"{median(moved):.2f}",
                    f"{moved[-1]:.2f}",
                    f"{target:g}",
                    verdict(moved[-1], target),
                ]
            ],
        )


def arguments() -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chats", type=int, default=30)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--per-worker", type=int, default=4)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--failover", type=float, default=15.0)
    parser.add_argument("--waiting", type=int, default=50)
    parser.add_argument("--api-ms", type=float, default=150.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(arguments()))
