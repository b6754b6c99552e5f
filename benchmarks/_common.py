"""What every benchmark shares: the fake Ollama process, a minimal channel, a Kaiwa turn path, the
bare-client baseline, statistics and the printed table.

Importing this module clears the proxy variables and sets NO_PROXY: httpx would otherwise send
127.0.0.1 traffic through a configured proxy. Every script imports it before anything connects,
and child processes inherit the cleaned environment.

Core modules are imported lazily inside `build_kaiwa`, so a child process that measures only the
bare client does not carry SQLAlchemy and the rest in its peak RSS.
"""

import asyncio
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ollama

from core.channel import ChannelMessage, ChannelTraits, Deliver, Frame, Outcome

for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
    os.environ.pop(_name, None)
    os.environ.pop(_name.lower(), None)
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

ROOT = Path(__file__).resolve().parent.parent
MODEL = "test-model"
SYSTEM_PROMPT = "You are a benchmark assistant."
PLATFORM = "bench"
FRAME_INTERVAL = 0.05  # the terminal channel's
_MESSAGE_IDS = itertools.count(1)


# -- the fake Ollama, in its own process --------------------------------------------------------


@contextmanager
def fake_ollama(chunks: int, delay_ms: float, *, start_timeout: float = 30.0) -> Iterator[str]:
    """Run `python -m tests.fakes.ollama` in its own process; yield its URL; kill it after."""
    command = [sys.executable, "-m", "tests.fakes.ollama", "--port", "0"]
    command += ["--chunks", str(chunks), "--delay-ms", str(delay_ms)]
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

    async def update(self, frame: Frame) -> None:
        self.frames += 1
        self.shown = frame.text
        if frame.text:
            self.has_text.set()

    async def finish(self, text: str, outcome: Outcome, note: str | None) -> None:
        self.finished_at = time.perf_counter()
        self.text, self.outcome, self.note = text, outcome, note
        self.finished.set()


class BenchChannel:
    """The smallest `core.channel.Channel`: replies are looked up by the message they answer."""

    platform = PLATFORM

    def __init__(self) -> None:
        self.traits = ChannelTraits(frame_interval=FRAME_INTERVAL)
        self.notices: list[tuple[str, str]] = []
        self._expected: dict[str, BenchReply] = {}

    async def run(self, deliver: Deliver) -> None:
        await asyncio.Event().wait()

    async def stop_receiving(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def expect(self, message_id: str, place: str) -> BenchReply:
        reply = self._expected[message_id] = BenchReply(place)
        return reply

    def open_reply(self, place: str, reply_to: str | None) -> BenchReply:
        reply = self._expected.pop(reply_to, None) if reply_to else None
        return reply or BenchReply(place)

    async def notify(self, place: str, text: str) -> None:
        self.notices.append((place, text))


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
        self.store.close()


def build_kaiwa(
    url: str,
    data_dir: Path,
    max_concurrent: int,
    *,
    connect_timeout: float = 5.0,
    channel: Any = None,
) -> Kaiwa:
    """The real turn path, wired as tests/core/conftest.py does, on `channel` (a `BenchChannel`
    unless given), open to anyone; no tools, so Kaiwa sends the same request body as the bare
    client (plus keep_alive)."""
    from core.dispatcher import AccessRules, Allowed, Dispatcher
    from core.model import ModelClient, ModelSettings
    from core.store import Store
    from core.turns import AgentProfile, TurnRunner, TurnSettings

    store = Store(f"sqlite:///{data_dir / 'bench.db'}")
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
    agent = AgentProfile(name="assistant", model=MODEL, system_prompt=SYSTEM_PROMPT, tools={})
    settings = TurnSettings(agent=agent, max_cached_conversations=max(1000, 2 * max_concurrent))
    runner = TurnRunner(store, model, channels, settings)
    access = AccessRules({channel.platform: Allowed(users=None)})
    dispatcher = Dispatcher(store, runner, channels, access, max_message_chars=16_000)
    return Kaiwa(store, model, channel, runner, dispatcher)


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
