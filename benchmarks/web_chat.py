"""Web chat: N people on the web chat each send one message at once to a real `kaiwa run --web`
process, then one operator with N tabs does, beside the same N as Telegram chats in the same
run; then what an open page costs the process, what the page weighs, and how soon chromium
paints it.

Kaiwa runs with its shipped defaults but for what the bench must change and what N people need.
The config names the fake Ollama's URL, a data folder in a temporary directory and
`[channels.web].port = 0` (the port is read from the `web chat: <link>` line Kaiwa prints); and,
since out of the box the web chat signs in one person, the operator, by a link, N people need
team sign-in, so it also sets `user_header = "X-Forwarded-User"`, `trusted_proxies =
["127.0.0.1"]` and `anyone = true` (README's "A team behind a proxy"). The clients play the
proxy: a request from 127.0.0.1 naming someone in that header is that person
(`channels.web.security.People`). The fake Ollama (its own process) serves Kaiwa's default
model with the stream `platform_burst.py` uses (20 chunks, no delay). Kaiwa's stdin is a pipe
that stays open, so the terminal channel, on by default, waits on it; closing it stops Kaiwa.
Every client is an aiohttp session with a cookie jar of its own, a conversation of its own and
an open `GET /api/events?conversation=<its own>` stream, as a page with that conversation open
has.

1. **Burst**: one warm-up message first, then the N messages posted at once (`POST
   /api/messages`), in two ways, each on a fresh Kaiwa:
   - "web, N people": client i is the person `person-i`, named in the header of each of its
     requests; a person's stream carries only their own conversation's changes.
   - "web, 1 operator, N tabs": every client signed in by a one-time link of its own
     (`channels.web.security.Links` on Kaiwa's data folder: the file `kaiwa web-link` writes),
     so all N are the operator, and each of the operator's streams carries its own
     conversation's changes and the list entries of all N (a conversation's entry changes when
     a reply starts and when it ends): what the fan-out of one person's many tabs costs.
   Per client, from its own stream, timed from the moment the posts start: first text (the first
   sign of the reply: its activity, a status line such as "waiting for the model: …" while it queues
   for the model, or its first bubble), first word (the first bubble showing the reply's own text)
   and complete (the reply's bubble with its final text and `streaming` false). Printed: wall (the
   last complete), handed over (the last post answered), first word p50 and p95, CPU per message
   (user + system time of the Kaiwa process over the burst, from /proc, divided by N), Kaiwa's peak
   RSS (VmHWM), and the events each stream carried. The stream is short, and a reply keeps
   `edit_interval` between two changes of its bubble, so its first words come with its final text:
   first word is about complete. Then the same N as a Telegram burst, with `platform_burst.py`'s
   machinery (`bot_process`: its `kaiwa run` with its own config, i.e. its model name and system
   prompt, `tools = []`, edit_interval 1 s, the store's counting hook loaded; the fake Bot API in
   this process), timed the same way from the fake's records (first word: the first post or edit
   showing the reply's text), so the three sit side by side with ratios to Telegram.
2. **Memory per open stream**: a fresh Kaiwa, warmed up by one message whose page is then
   closed; its RSS (VmRSS) with no stream open and with `--streams` idle streams of the
   operator's open (each has received its first event, so the server holds it), and the
   difference per stream in KiB.
3. **The page's weight**: the bytes of `/`, `/static/app.js`, `/static/app.css` and
   `/static/code.css` as served, and gzip -9 of each for reference.
4. **First paint**: chromium (`/usr/bin/chromium` through Playwright, headless), in a fresh
   context each round: sign in by a link, navigate to `/` and read the first-contentful-paint
   entry of `performance.getEntriesByType('paint')`; median of `--paints` rounds. Without
   chromium or Playwright the figure reads "not measured".

Nothing here asserts on time; every figure is printed for information.

Run from the repository root:
    .venv/bin/python benchmarks/web_chat.py [--clients 200] [--streams 500] [--paints 5]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import contextlib
import gzip
import itertools
import json
import math
import os
import resource
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks import _common as bench  # clears the proxy variables
from benchmarks import platform_burst as telegram_burst
from bot.config import AgentConfig
from channels.web.security import Links
from tests.fakes.ollama import BENCHMARK_REPLY
from tests.fakes.telegram import FakeTelegram, visible_text

MESSAGE = "Hello there"
FIRST_WORD = BENCHMARK_REPLY.split()[0]
START_SECONDS = 60.0
SETUP_AT_ONCE = 20
"""Clients signing in, or streams opening, at the same time while the bench sets up."""
PAGE = ("/", "/static/app.js", "/static/app.css", "/static/code.css")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIRST_PAINT = (
    "() => performance.getEntriesByType('paint')"
    ".find((entry) => entry.name === 'first-contentful-paint')?.startTime"
)
USER_HEADER = "X-Forwarded-User"
"""The header the clients, playing a team's proxy, name their person in."""
CONFIG = """\
[ollama]
url = "{url}"

[storage]
data_dir = "{data_dir}"

[channels.web]
port = 0
user_header = "{header}"
trusted_proxies = ["127.0.0.1"]
anyone = true
"""
_CHATS = itertools.count(900_001)


@dataclass
class Burst:
    """One burst's figures, each client's times in seconds from the burst's start."""

    first_texts: list[float] = field(default_factory=list)
    first_words: list[float] = field(default_factory=list)
    complete: list[float] = field(default_factory=list)
    handed_over: float = float("nan")
    cpu_per_message: float = 0.0
    rss_mib: float = 0.0
    incomplete: int = 0
    events: list[int] = field(default_factory=list)
    bench_cpu: float = 0.0


# -- the Kaiwa process --------------------------------------------------------------------------


@dataclass
class WebKaiwa:
    process: subprocess.Popen[bytes]
    url: str
    """`http://127.0.0.1:<port>`, from the link Kaiwa printed."""
    links: Links

    def link(self) -> str:
        """A fresh one-time sign-in link, made as `kaiwa web-link` makes one."""
        return f"{self.url}/login?key={self.links.make()}"


@contextlib.contextmanager
def web_kaiwa(ollama_url: str) -> Iterator[WebKaiwa]:
    """`kaiwa run --web` in its own process on `CONFIG` (only what must change, and team
    sign-in), in a temporary folder of its own; stopped by closing its stdin (killed if it
    lingers)."""
    with tempfile.TemporaryDirectory(prefix="kaiwa-web-") as tmp:
        yield from _serving(ollama_url, Path(tmp))


def _serving(ollama_url: str, folder: Path) -> Iterator[WebKaiwa]:
    data_dir = folder / "state"
    config = folder / "kaiwa.toml"
    config.write_text(CONFIG.format(url=ollama_url, data_dir=data_dir, header=USER_HEADER))
    env = {name: value for name, value in os.environ.items() if not name.startswith("KAIWA_")}
    command = [sys.executable, "-m", "bot", "--config", str(config), "run", "--web"]
    log = (folder / "kaiwa.log").open("wb")
    process = subprocess.Popen(
        command, cwd=bench.ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
    )
    try:
        try:
            line = bench.read_line_containing(process, b"web chat: ", START_SECONDS)
        except (TimeoutError, RuntimeError) as exc:
            log.flush()
            tail = (folder / "kaiwa.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"kaiwa did not serve the web chat: {exc}\n{tail}") from exc
        threading.Thread(target=_drain, args=(process,), daemon=True).start()
        link = line.split(b"web chat: ", 1)[1].strip().decode()
        yield WebKaiwa(process, link.split("/login", 1)[0], Links(data_dir / "web.links"))
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _drain(process: subprocess.Popen[bytes]) -> None:
    """Read Kaiwa's stdout to its end, so its writes never block on a full pipe."""
    assert process.stdout is not None
    while process.stdout.read(65536):
        pass


def rss_kib(pid: int) -> int:
    """The process's resident set now (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- one browser's worth of client ------------------------------------------------------------


class WebClient:
    """A page's traffic without the page: a session (own cookie jar), a conversation, a stream;
    of `person`, named in `USER_HEADER` of every request as a team's proxy names them, or, with
    none, of the operator once a link signs it in."""

    def __init__(self, url: str, person: str | None = None) -> None:
        self._url = url
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            headers={USER_HEADER: person} if person else None,
        )
        self._posting = {"Origin": url, "X-Kaiwa": "1"}
        self.conversation = ""
        self.subscribed = asyncio.Event()
        self.done = asyncio.Event()
        self.first_text: float | None = None
        self.first_word: float | None = None
        self.complete: float | None = None
        self.events = 0
        self._reader: asyncio.Task[None] | None = None
        self._stream: aiohttp.ClientResponse | None = None

    async def sign_in(self, link: str) -> None:
        """Open `link` (the operator's, which redirects to the page: it needs the cookie) or the
        page itself (a person the header names): the page, not the sign-in page's 401."""
        async with self.session.get(link) as response:
            if response.status != 200:
                raise RuntimeError(f"signing in at {link.split('?')[0]} answered {response.status}")

    async def new_conversation(self) -> None:
        async with self.session.post(
            f"{self._url}/api/conversations", json={}, headers=self._posting
        ) as response:
            response.raise_for_status()
            self.conversation = (await response.json())["id"]

    async def open_stream(self) -> None:
        """The page's stream; `subscribed` is set by its first event (every stream opened with
        a conversation of its person's on the board starts with one)."""
        query = {"conversation": self.conversation}
        self._stream = await self.session.get(f"{self._url}/api/events", params=query)
        self._stream.raise_for_status()
        self._reader = asyncio.create_task(self._read(self._stream))

    async def send(self, text: str) -> None:
        self.done.clear()
        self.first_text = self.first_word = self.complete = None
        body = {"conversation": self.conversation, "text": text, "client_id": uuid.uuid4().hex}
        async with self.session.post(
            f"{self._url}/api/messages", json=body, headers=self._posting
        ) as response:
            if response.status != 202:
                raise RuntimeError(f"POST /api/messages answered {response.status}")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._stream is not None:
            self._stream.close()
        await self.session.close()

    async def _read(self, stream: aiohttp.ClientResponse) -> None:
        while block := await stream.content.readuntil(b"\n\n"):
            self.subscribed.set()
            self.events += 1
            if b"event: bubble" in block:
                self._seen(event_data(block), time.perf_counter())
            elif b"event: activity" in block and self.first_text is None:
                self.first_text = time.perf_counter() if event_data(block)["status"] else None

    def _seen(self, bubble: dict[str, Any], now: float) -> None:
        text = str(bubble["text"])
        if bubble["role"] != "kaiwa" or bubble["deleted"] or not text:
            return
        self.first_text = self.first_text or now
        if text.startswith(FIRST_WORD):
            self.first_word = self.first_word or now
        if not bubble["streaming"] and text.strip() == BENCHMARK_REPLY and self.complete is None:
            self.complete = now
            self.done.set()


def event_data(block: bytes) -> dict[str, Any]:
    """The JSON of one Server-Sent Event's `data:` line."""
    data = next(line for line in block.split(b"\n") if line.startswith(b"data: "))
    return dict(json.loads(data[len(b"data: ") :]))


async def at_most(limit: int, *jobs: Awaitable[object]) -> None:
    """Await `jobs` (coroutines, started only when their turn comes), `limit` at a time."""
    gate = asyncio.Semaphore(limit)

    async def gated(job: Awaitable[object]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(gated(job) for job in jobs))


@contextlib.asynccontextmanager
async def clients(
    kaiwa: WebKaiwa, count: int, *, people: bool = False
) -> AsyncIterator[list[WebClient]]:
    """`count` clients, each a person of its own (`person-1` on) when `people`, else each the
    operator's by a link of its own, with a conversation of its own and a stream open
    (subscribed); closed after."""
    made = [WebClient(kaiwa.url, f"person-{n}" if people else None) for n in range(1, count + 1)]
    try:
        page = f"{kaiwa.url}/"
        await at_most(SETUP_AT_ONCE, *(c.sign_in(page if people else kaiwa.link()) for c in made))
        await at_most(SETUP_AT_ONCE, *(client.new_conversation() for client in made))
        await at_most(SETUP_AT_ONCE, *(client.open_stream() for client in made))
        async with asyncio.timeout(START_SECONDS):
            await asyncio.gather(*(client.subscribed.wait() for client in made))
        yield made
    finally:
        await asyncio.gather(*(client.close() for client in made))


async def warm_up(kaiwa: WebKaiwa) -> None:
    """One message answered on a page of its own, which is then closed."""
    async with clients(kaiwa, 1) as (client,):
        await client.send(MESSAGE)
        async with asyncio.timeout(START_SECONDS):
            await client.done.wait()


# -- 1. the burst ---------------------------------------------------------------------------


async def web_burst(ollama_url: str, count: int, limit: float, *, people: bool) -> Burst:
    """The burst on a fresh Kaiwa, from `count` `people`, or from the operator's `count` tabs."""
    figures = Burst()
    with web_kaiwa(ollama_url) as kaiwa:
        pid = kaiwa.process.pid
        await warm_up(kaiwa)
        async with clients(kaiwa, count, people=people) as burst:
            for client in burst:
                client.events = 0
            cpu, own = telegram_burst.cpu_seconds(pid), own_cpu_seconds()
            start = time.perf_counter()
            await asyncio.gather(*(client.send(MESSAGE) for client in burst))
            figures.handed_over = time.perf_counter() - start
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await asyncio.gather(*(client.done.wait() for client in burst))
            figures.cpu_per_message = (telegram_burst.cpu_seconds(pid) - cpu) / count
            figures.bench_cpu = own_cpu_seconds() - own
            figures.rss_mib = telegram_burst.peak_rss_mib(pid)
            figures.incomplete = sum(client.complete is None for client in burst)
            figures.first_texts = since(start, (c.first_text for c in burst))
            figures.first_words = since(start, (c.first_word for c in burst))
            figures.complete = since(start, (c.complete for c in burst))
            figures.events = [client.events for client in burst]
    return figures


def since(start: float, moments: Iterable[float | None]) -> list[float]:
    """The moments that came, as seconds after `start`."""
    return [moment - start for moment in moments if moment is not None]


async def telegram(ollama_url: str, count: int, limit: float) -> Burst:
    """The same burst as Telegram chats: `platform_burst.py`'s kaiwa process and fake Bot API."""
    figures = Burst()
    async with FakeTelegram() as fake:
        with tempfile.TemporaryDirectory(prefix="kaiwa-web-tg-") as tmp:
            running = telegram_burst.bot_process("kaiwa", fake, ollama_url, Path(tmp), "", 1, None)
            with running as process:
                warm = next(_CHATS)
                fake.user_message(warm, MESSAGE)
                await telegram_burst.answered(fake, [warm], START_SECONDS)
                chats = [next(_CHATS) for _ in range(count)]
                cpu, own = telegram_burst.cpu_seconds(process.pid), own_cpu_seconds()
                queued = time.time()
                for chat in chats:
                    fake.user_message(chat, MESSAGE)
                with contextlib.suppress(AssertionError):
                    await telegram_burst.answered(fake, chats, limit)
                figures.cpu_per_message = (telegram_burst.cpu_seconds(process.pid) - cpu) / count
                figures.bench_cpu = own_cpu_seconds() - own
                figures.rss_mib = telegram_burst.peak_rss_mib(process.pid)
        ends = [telegram_burst.complete_at(fake, chat) for chat in chats]
        figures.incomplete = sum(end is None for end in ends)
        figures.complete = since(queued, ends)
        figures.first_texts = since(queued, (telegram_burst.first_text_at(fake, c) for c in chats))
        figures.first_words = since(queued, (first_word_at(fake, chat) for chat in chats))
    return figures


def first_word_at(fake: FakeTelegram, chat: int) -> float | None:
    """When the chat first showed the reply's own text (a post or an edit of it)."""
    for call in fake.calls:
        if call.method.lower() not in telegram_burst.SHOWN or call.error is not None:
            continue
        if str(call.params.get("chat_id")) != str(chat):
            continue
        shown = visible_text(str(call.params.get("text", "")), call.params.get("parse_mode"))
        if shown.startswith(FIRST_WORD):
            return call.at
    return None


# -- 2. to 4. one page ------------------------------------------------------------------------


async def stream_memory(kaiwa: WebKaiwa, streams: int) -> tuple[int, int]:
    """Kaiwa's VmRSS (KiB) with no stream open, and with `streams` idle ones."""
    await warm_up(kaiwa)
    await asyncio.sleep(0.5)
    before = rss_kib(kaiwa.process.pid)
    jar = aiohttp.CookieJar(unsafe=True)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(cookie_jar=jar, connector=connector, timeout=timeout) as one:
        async with one.get(kaiwa.link()) as signed_in:
            signed_in.raise_for_status()
        opened: list[aiohttp.ClientResponse] = []

        async def hold() -> None:
            response = await one.get(f"{kaiwa.url}/api/events")
            response.raise_for_status()
            opened.append(response)
            await response.content.readuntil(b"\n\n")  # the warm-up conversation: subscribed

        try:
            async with asyncio.timeout(START_SECONDS):
                await at_most(SETUP_AT_ONCE, *(hold() for _ in range(streams)))
            await asyncio.sleep(0.5)
            return before, rss_kib(kaiwa.process.pid)
        finally:
            for response in opened:
                response.close()


async def page_weight(kaiwa: WebKaiwa) -> list[tuple[str, int, int]]:
    """(path, bytes, gzip -9 bytes) of each of the page's files, signed in."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar, auto_decompress=False) as session:
        async with session.get(kaiwa.link()) as signed_in:
            signed_in.raise_for_status()
        weights = []
        for path in PAGE:
            headers = {"Accept-Encoding": "identity"}
            async with session.get(f"{kaiwa.url}{path}", headers=headers) as response:
                response.raise_for_status()
                body = await response.read()
            weights.append((path, len(body), len(gzip.compress(body, compresslevel=9))))
    return weights


async def first_paints(kaiwa: WebKaiwa, rounds: int) -> list[float] | str:
    """First-contentful-paint of `/` in ms, per fresh context; or why it was not measured."""
    if not await asyncio.to_thread(CHROMIUM.is_file):
        return "not measured (install chromium)"
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return "not measured (install playwright: pip install -e '.[test]')"
    paints = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            for _ in range(rounds):
                context = await browser.new_context()
                try:
                    page = await context.new_page()
                    await page.goto(kaiwa.link())  # signs in, and lands on the page
                    await page.goto(f"{kaiwa.url}/")
                    painted = await page.wait_for_function(FIRST_PAINT, timeout=30_000)
                    paints.append(float(await painted.json_value()))
                finally:
                    await context.close()
        finally:
            await browser.close()
    return paints


# -- the report ---------------------------------------------------------------------------------


NAN = float("nan")


def burst_rows(people: Burst, operator: Burst, tg: Burst) -> list[list[str]]:
    """Per figure: the web burst of N people, of one operator's N tabs, Telegram's, and the
    ratios of the two web bursts to Telegram's."""

    def pct(values: list[float], q: float) -> float:
        return bench.percentile(values, q) if values else NAN

    def ratio(value: float, base: float) -> str:
        return f"{value / base:.2f}x" if base > 0 and not math.isnan(value) else "-"

    def row(
        name: str, figure: Callable[[Burst], float], shown: Callable[[float], str]
    ) -> list[str]:
        values = [figure(side) for side in (people, operator, tg)]
        return [name, *map(shown, values), ratio(values[0], values[2]), ratio(values[1], values[2])]

    def seconds(value: float) -> str:
        return f"{value:.2f} s"

    def mib(value: float) -> str:
        return f"{value:.0f} MiB"

    def count(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.0f}"

    handed = ["handed over (last POST answered)", bench.ms(people.handed_over)]
    return [
        row("wall (last reply complete)", lambda b: max(b.complete, default=NAN), seconds),
        [*handed, bench.ms(operator.handed_over), "-", "-", "-"],
        row("first text p50", lambda b: pct(b.first_texts, 50), seconds),
        row("first word p50", lambda b: pct(b.first_words, 50), seconds),
        row("first word p95", lambda b: pct(b.first_words, 95), seconds),
        row("CPU per message (Kaiwa)", lambda b: b.cpu_per_message, bench.ms),
        row("peak RSS (Kaiwa)", lambda b: b.rss_mib, mib),
        row("CPU of this process (clients, fakes)", lambda b: b.bench_cpu, seconds),
        row("events per open stream (median)", lambda b: bench.median(b.events or [NAN]), count),
        ["not complete", *(str(b.incomplete) for b in (people, operator, tg)), "-", "-"],
    ]


def report(
    args: argparse.Namespace,
    bursts: tuple[Burst, Burst, Burst],
    memory: tuple[int, int],
    weights: list[tuple[str, int, int]],
    paints: list[float] | str,
) -> None:
    n = args.clients
    bench.print_table(
        f"1. {n} at once: web clients (a stream each) against {n} Telegram chats (Kaiwa's "
        "defaults and team sign-in, SQLite; times from the burst's start)",
        [
            "figure",
            f"web, {n} people",
            f"web, 1 operator, {n} tabs",
            "telegram",
            "people/tg",
            "operator/tg",
        ],
        burst_rows(*bursts),
    )
    print(
        "  a person's stream carries their own conversation's changes; each of the operator's "
        f"streams carries its own conversation's and the list entries of all {n} (the fan-out)"
    )
    before, after = memory
    per_stream = (after - before) / args.streams
    bench.print_table(
        "2. Memory per open stream (Kaiwa's VmRSS)",
        ["streams", "RSS", "per stream"],
        [
            ["0", f"{before / 1024:.1f} MiB", "-"],
            [str(args.streams), f"{after / 1024:.1f} MiB", f"{per_stream:.1f} KiB"],
        ],
    )
    rows = [
        [path, f"{size / 1000:.1f} kB", f"{packed / 1000:.1f} kB"] for path, size, packed in weights
    ]
    rows.append(
        [
            "total",
            f"{sum(w[1] for w in weights) / 1000:.1f} kB",
            f"{sum(w[2] for w in weights) / 1000:.1f} kB",
        ]
    )
    bench.print_table("3. The page's weight", ["file", "as served", "gzip -9"], rows)
    if isinstance(paints, str):
        shown = paints
    else:
        listed = " / ".join(f"{paint:.0f}" for paint in paints)
        shown = f"median {bench.median(paints):.0f} ms ({listed} ms)"
    print(f"\n4. First contentful paint of / in chromium, {args.paints} fresh contexts: {shown}")


async def main(args: argparse.Namespace) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # and Kaiwa's, which inherits it
    print(
        f"web chat: {args.clients} people at once, then one operator's {args.clients} tabs, "
        f"then {args.clients} Telegram chats; "
        f"stream of {telegram_burst.CHUNKS} chunks {telegram_burst.DELAY_MS:g} ms apart"
    )
    fake = ["tests.fakes.ollama", "--port", "0", "--chunks", str(telegram_burst.CHUNKS)]
    fake += ["--delay-ms", str(telegram_burst.DELAY_MS), "--model", AgentConfig().model]
    with bench.ready_process(fake) as ollama_url:
        people = await web_burst(ollama_url, args.clients, args.limit, people=True)
        operator = await web_burst(ollama_url, args.clients, args.limit, people=False)
        with web_kaiwa(ollama_url) as kaiwa:
            memory = await stream_memory(kaiwa, args.streams)
            weights = await page_weight(kaiwa)
            paints = await first_paints(kaiwa, args.paints)
    with bench.fake_ollama(telegram_burst.CHUNKS, telegram_burst.DELAY_MS) as ollama_url:
        tg = await telegram(ollama_url, args.clients, args.limit)
    report(args, (people, operator, tg), memory, weights, paints)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="clients (and chats) at once")
    parser.add_argument("--streams", type=int, default=500, help="idle streams for the memory")
    parser.add_argument("--paints", type=int, default=5, help="fresh contexts for first paint")
    parser.add_argument("--limit", type=float, default=90.0, help="seconds a burst may take")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
