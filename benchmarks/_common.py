"""What every benchmark shares: the fake Ollama process, the database Kaiwa stores in (a SQLite
file, or a throwaway schema on PostgreSQL, optionally behind a proxy that adds a round trip), a
minimal channel, a Kaiwa turn path, the bare-client baseline, the event loop's lag, statistics and
the printed table.

Importing this module clears the proxy variables and sets NO_PROXY: httpx would otherwise send
127.0.0.1 traffic through a configured proxy. Every script imports it before anything connects,
and child processes inherit the cleaned environment.

Core modules and SQLAlchemy are imported lazily inside the functions that need them, so a child
process that measures only the bare client does not carry them in its peak RSS.
"""

import argparse
import asyncio
import bisect
import cProfile
import itertools
import math
import os
import pstats
import resource
import select
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ollama

from core.channel import (
    Button,
    Card,
    ChannelMessage,
    ChannelTraits,
    Deliver,
    Delivery,
    Frame,
    Outcome,
)

for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
    os.environ.pop(_name, None)
    os.environ.pop(_name.lower(), None)
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

ROOT = Path(__file__).resolve().parent.parent
MODEL = "test-model"
SYSTEM_PROMPT = "You are a benchmark assistant."
PLATFORM = "bench"
FRAME_INTERVAL = 0.05  # the terminal channel's
POSTGRES_URL_ENV = "KAIWA_BENCH_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DATABASES = ("sqlite", "postgres")
LAG_PERIOD = 0.005
_MESSAGE_IDS = itertools.count(1)


# -- helper processes: the fake Ollama, the TCP proxy --------------------------------------------


@contextmanager
def fake_ollama(chunks: int, delay_ms: float, *, start_timeout: float = 30.0) -> Iterator[str]:
    """Run `python -m tests.fakes.ollama` in its own process; yield its URL; kill it after."""
    command = ["tests.fakes.ollama", "--port", "0", "--chunks", str(chunks)]
    command += ["--delay-ms", str(delay_ms)]
    with ready_process(command, start_timeout) as url:
        yield url


@contextmanager
def ready_process(module_and_args: list[str], start_timeout: float = 30.0) -> Iterator[str]:
    """Run `python -m <module> <args>` from the repository root; yield what follows `READY ` on
    the first line that has it; kill the process after."""
    command = [sys.executable, "-m", *module_and_args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        line = read_line_containing(process, b"READY ", start_timeout)
        yield line.split(b"READY ", 1)[1].strip().decode()
    finally:
        process.kill()
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


def read_line_containing(process: subprocess.Popen[bytes], marker: bytes, timeout: float) -> bytes:
    """Read the child's stdout until a line contains `marker`; fail after `timeout` seconds."""
    assert process.stdout is not None
    fd, buffer = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while True:
        for line in buffer.splitlines(keepends=True):
            if marker in line and line.endswith(b"\n"):
                return line
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no line with {marker!r} within {timeout:g} s: {buffer[-500:]!r}")
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"process ended before printing {marker!r}: {buffer[-500:]!r}")
            buffer += data


# -- the database Kaiwa stores in ---------------------------------------------------------------


def add_database_arguments(parser: argparse.ArgumentParser) -> None:
    """`--db sqlite|postgres` and `--db-rtt-ms X`; check them with `check_database_arguments`."""
    parser.add_argument(
        "--db",
        choices=DATABASES,
        default="sqlite",
        help=f"where Kaiwa stores: a SQLite file (default) or PostgreSQL at ${POSTGRES_URL_ENV} "
        f"(default {DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument(
        "--db-rtt-ms",
        type=float,
        default=0.0,
        help="PostgreSQL only: a round trip in ms added by a TCP proxy (tests.fakes.tcp_proxy) "
        "between Kaiwa and the server (default 0: no proxy)",
    )


def check_database_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.db_rtt_ms < 0:
        parser.error("--db-rtt-ms cannot be negative")
    if args.db == "sqlite" and args.db_rtt_ms > 0:
        parser.error("--db-rtt-ms needs --db postgres (SQLite is a file: no round trip to add)")


def postgres_url() -> str:
    return os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL


def database_label(db: str, rtt_ms: float) -> str:
    """The database as the tables' headers name it."""
    if db == "sqlite":
        return "SQLite (a file in a temporary folder)"
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url())
    where = f"{url.host or '127.0.0.1'}:{url.port or 5432}"
    if rtt_ms > 0:
        return f"PostgreSQL at {where} through a proxy adding a {rtt_ms:g} ms round trip"
    return f"PostgreSQL at {where}, direct (rtt 0)"


@contextmanager
def database_server(db: str, rtt_ms: float) -> Iterator[str | None]:
    """The server Kaiwa's databases live on, for one run. SQLite: None (each Kaiwa gets a file,
    see `fresh_database`). PostgreSQL: the URL of the server (`$KAIWA_BENCH_POSTGRES_URL`), or,
    when `rtt_ms` > 0, the same URL pointed at a `tests.fakes.tcp_proxy` started here in its own
    process (forwarding to the server and adding the round trip) and killed at the end."""
    if db == "sqlite":
        yield None
        return
    base = postgres_url()
    if rtt_ms <= 0:
        yield base
        return
    from sqlalchemy.engine import make_url

    url = make_url(base)
    target = f"{url.host or '127.0.0.1'}:{url.port or 5432}"
    with ready_process(
        ["tests.fakes.tcp_proxy", "--target", target, "--rtt-ms", f"{rtt_ms:g}"]
    ) as port:
        yield url.set(host="127.0.0.1", port=int(port)).render_as_string(hide_password=False)


@contextmanager
def fresh_database(server: str | None, data_dir: Path) -> Iterator[str]:
    """An empty database for one Kaiwa; yields the URL it opens. SQLite (`server` None): a file
    in `data_dir`. PostgreSQL: a schema `kaiwa_bench_<random hex>` created on `server` for it
    and dropped (CASCADE) at the end, each by a short-lived engine of its own; Kaiwa's URL names
    it as its connections' search_path, so its migrations and rows all land there."""
    if server is None:
        yield sqlite_url(data_dir)
        return
    schema = f"kaiwa_bench_{uuid.uuid4().hex[:12]}"
    _execute_once(server, f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in server else "?"
    try:
        yield f"{server}{separator}options=-csearch_path%3D{schema}"
    finally:
        _execute_once(server, f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def kaiwa_database(db: str, rtt_ms: float, data_dir: Path) -> Iterator[str]:
    """`database_server` and `fresh_database` in one: the URL of an empty database on it."""
    with database_server(db, rtt_ms) as server, fresh_database(server, data_dir) as url:
        yield url


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'bench.db'}"


def _execute_once(url: str, statement: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


# -- a minimal channel ----------------------------------------------------------------------


@dataclass(eq=False)
class BenchReply:
    """One reply: the last frame shown, the final text, and when `finish` was called."""

    place: str
    frames: int = 0
    shown: str = ""
    text: str | None = None
    outcome: Outcome | None = None
    note: str | None = None
    finished_at: float = 0.0
    has_text: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    posted: tuple[str, ...] = ()
    delivery: Delivery = Delivery.NOTHING

    async def update(self, frame: Frame) -> None:
        self.frames += 1
        self.shown = frame.text
        if frame.text:
            self.has_text.set()

    async def finish(
        self,
        text: str,
        outcome: Outcome,
        note: str | None,
        *,
        tools: tuple[str, ...] = (),
        cards: tuple[Card, ...] = (),
    ) -> None:
        self.finished_at = time.perf_counter()
        self.text, self.outcome, self.note = text, outcome, note
        self.delivery = Delivery.SHOWN
        self.finished.set()


class BenchChannel:
    """The smallest `core.channel.Channel`: replies are looked up by the message they answer."""

    platform = PLATFORM

    def __init__(self) -> None:
        self.traits = ChannelTraits(frame_interval=FRAME_INTERVAL)
        self.notices: list[tuple[str, str]] = []
        self._expected: dict[str, BenchReply] = {}
        self.connected = asyncio.Event()
        self.connected.set()
        self.problem: str | None = None

    async def run(self, deliver: Deliver) -> None:
        await asyncio.Event().wait()

    async def stop_receiving(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def expect(self, message_id: str, place: str) -> BenchReply:
        reply = self._expected[message_id] = BenchReply(place)
        return reply

    def open_reply(
        self,
        place: str,
        reply_to: str | None,
        posted: Sequence[str] = (),
        *,
        on_post: Any = None,
    ) -> BenchReply:
        reply = self._expected.pop(reply_to, None) if reply_to else None
        return reply or BenchReply(place)

    async def notify(
        self, place: str, text: str, buttons: Sequence[Button] = ()
    ) -> tuple[str, ...]:
        self.notices.append((place, text))
        return ()

    async def edit_notice(self, place: str, message_id: str, text: str) -> None:
        """Nothing to edit: `notify` gives no ids."""


# -- the Kaiwa turn path, in process ----------------------------------------------------------


@dataclass
class Kaiwa:
    """Store, real model client, runner and dispatcher on a `BenchChannel`."""

    store: Any
    model: Any
    channel: Any
    runner: Any
    dispatcher: Any

    def message(self, place: str, text: str) -> ChannelMessage:
        """A message with an id never used before (the dispatcher drops redeliveries)."""
        return ChannelMessage(PLATFORM, place, f"m{next(_MESSAGE_IDS)}", "bench-user", text)

    async def send(self, place: str, text: str) -> BenchReply:
        """Message in; returns the reply to wait on (`finished` is set once the reply is stored)."""
        message = self.message(place, text)
        reply = self.channel.expect(message.message_id, place)
        await self.dispatcher.handle(message)
        return reply

    async def close(self) -> None:
        await self.runner.shutdown()
        await self.model.close()
        await self.store.close()


async def build_kaiwa(
    url: str,
    data_dir: Path | None,
    max_concurrent: int,
    *,
    database_url: str | None = None,
    connect_timeout: float = 5.0,
    channel: Any = None,
    context_window: int = 0,
    agents: dict[str, Any] | None = None,
) -> Kaiwa:
    """The real turn path, assembled as `kaiwa run` does (`bot.wiring.assemble`), on `channel`
    (a `BenchChannel` unless given), open to anyone; no tools (the task tools and notes off), so
    Kaiwa sends the same request body as the bare client (plus keep_alive). `url` is the (fake)
    Ollama's; the store opens `database_url`, by default a SQLite file in `data_dir`, with the
    default `StoreSettings` (as `[storage]` has them); `context_window` 0 chooses the window as
    `[context]` does; `agents`, profiles the assistant may delegate to. Close it with
    `Kaiwa.close`."""
    from bot.wiring import Features, assemble
    from core.agent.model import ModelClient, ModelSettings
    from core.agent.profile import AgentProfile
    from core.dispatch.dispatcher import AccessRules, Allowed
    from core.features.memory import MemorySettings
    from core.features.schedule.timing import ScheduleSettings
    from core.store import Store, StoreSettings
    from core.turns.turn import TurnSettings

    if database_url is None:
        if data_dir is None:
            raise ValueError("build_kaiwa needs a data_dir or a database_url")
        database_url = sqlite_url(data_dir)
    store = await Store.open(database_url, StoreSettings())
    model = ModelClient(
        ModelSettings(
            url=url,
            connect_timeout=connect_timeout,
            first_chunk_timeout=60,
            idle_timeout=60,
            max_concurrent_requests=max_concurrent,
        )
    )
    channel = channel or BenchChannel()
    channels = {channel.platform: channel}
    agent = AgentProfile(
        name="assistant",
        model=MODEL,
        system_prompt=SYSTEM_PROMPT,
        tools={},
        context_window=context_window,
        delegates_to=tuple(agents or ()),
    )
    settings = TurnSettings(
        agent=agent, agents=agents or {}, max_cached_conversations=max(1000, 2 * max_concurrent)
    )
    access = AccessRules({channel.platform: Allowed(users=None)})
    untooled = Features(
        schedule=ScheduleSettings(enabled=False), memory=MemorySettings(enabled=False)
    )
    kaiwa = assemble(store, model, channels, settings, access, untooled, max_message_chars=16_000)
    return Kaiwa(store, model, channel, kaiwa.runner, kaiwa.dispatcher)


# -- the baseline: a bare ollama.AsyncClient --------------------------------------------------


def bare_client(url: str, connections: int, timeout: float = 60.0) -> ollama.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return ollama.AsyncClient(host=url, timeout=timeout, limits=limits)


async def bare_turn(client: ollama.AsyncClient, text: str) -> str:
    """The same request a fresh Kaiwa conversation sends; consume every chunk."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    stream = await client.chat(model=MODEL, messages=messages, stream=True)
    pieces = [part.message.content or "" async for part in stream]
    return "".join(pieces)


# -- the event loop's lag ------------------------------------------------------------------


class LoopLag:
    """How late the event loop wakes a timer: a task sleeps `period` over and over and records,
    for every wake, when it was due and how late it came (actual - requested). Figures are read
    for windows of loop time (`lateness`): a wake counts in the window its due time falls in, so
    a wake held up by one side's work counts for that side even if it lands after the window."""

    def __init__(self, period: float = LAG_PERIOD) -> None:
        self.period = period
        self._due: list[float] = []
        self._late: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> "LoopLag":
        self._task = asyncio.create_task(self._watch(), name="loop lag")
        return self

    async def stop(self) -> None:
        """Let the wake due last land, then end the monitor."""
        if self._task is None:
            return
        await asyncio.sleep(2 * self.period)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    @staticmethod
    def now() -> float:
        """The loop's clock, which windows are in."""
        return asyncio.get_running_loop().time()

    def lateness(self, windows: Iterable[tuple[float, float]] | None = None) -> list[float]:
        """Seconds late of every wake due within one of `windows` ((start, end) by `now`), or of
        every wake when None."""
        if windows is None:
            return list(self._late)
        late: list[float] = []
        for start, end in windows:
            first, last = bisect.bisect_left(self._due, start), bisect.bisect_left(self._due, end)
            late += self._late[first:last]
        return late

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period
            await asyncio.sleep(self.period)
            self._due.append(due)
            self._late.append(loop.time() - due)


def lag_summary(lateness: Sequence[float]) -> dict[str, float]:
    """Median, p99 and max in seconds (NaN when there is no sample), and the sample count."""
    if not lateness:
        nan = float("nan")
        return {"p50": nan, "p99": nan, "max": nan, "n": 0}
    return {
        "p50": median(lateness),
        "p99": percentile(lateness, 99),
        "max": max(lateness),
        "n": len(lateness),
    }


def lag_cell(summary: dict[str, float]) -> str:
    """`median / p99 / max` in ms, as the tables print it."""
    if not summary["n"]:
        return "-"
    return (
        f"{summary['p50'] * 1000:.2f} / {summary['p99'] * 1000:.2f} / {summary['max'] * 1000:.2f}"
    )


# -- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): p99 of 100 samples is the second largest."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM), in MiB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def verdict(value: float, target: float) -> str:
    """Information only: no script exits non-zero on a miss."""
    return "PASS" if value <= target else "MISS"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(f"  {line}".rstrip())
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))


class Profile:
    """cProfile switched on only around the Kaiwa side's work; `report` prints the top costs."""

    def __init__(self, enabled: bool) -> None:
        self._profiler = cProfile.Profile() if enabled else None

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._profiler is None:
            yield
            return
        self._profiler.enable()
        try:
            yield
        finally:
            self._profiler.disable()

    def report(self, title: str, top: int = 25) -> None:
        if self._profiler is None:
            return
        print(f"\n--- profile of the Kaiwa side: {title} ---", file=sys.stderr)
        stats = pstats.Stats(self._profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
